"""OffsetForLeaderEpoch through the proxy: epochs the broker forgot are answered from the tier's lineage.

Three brokers (the session's ``kafka_cluster3``), one topic of 3 replicas: a first leader writes epoch E0's records,
leadership moves (reassignment and a preferred election: epoch E1) and the new leader writes more; a sidecar next to
the new leader tiers it all and proxies it. DeleteRecords then puts the broker's log start inside E1: the broker's
leader-epoch checkpoint no longer holds E0, and Kafka answers a request for E0 with its log start offset, not where E0
ended. Through the proxy the answer is the tier's: E0 and the start offset of E1.

Each broker has a proxy listener in front of it, told the others (``history_listener.peers``; those of the other two
brokers need no sidecar: nothing of the topic is led there), so a client never learns a broker's own address. With
the new leader's proxy alone, the consumer reached the other brokers as they were named (its group coordinator, or
another broker a metadata refresh went to while its leader's connection was still down); their Metadata, not
rewritten, gave it the new leader's own address, and it read the broker directly: OFFSET_OUT_OF_RANGE at its first
Fetch, no request through the proxy (librdkafka's debug log; 3 of 16 consumers at load 10-14).
"""

from __future__ import annotations

import re
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from devtools.devkafka import KafkaCluster, free_port
from rlm.config import SidecarSettings
from rlm.listener import Listener, start_listener
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.rlm.listener.conftest import consume_until, librdkafka_log
from tests.rlm.listener.raw_wire import call
from tests.support.kafka import produce
from tests.support.sidecar import PartitionStates, make_settings, reassign, wait_for

NODES = (1, 2, 3)
PER_EPOCH = 40
SEGMENT_MS = 300
INTO_E1 = 10  # the broker's log start: this many offsets into the new leader's epoch


@dataclass
class Epochs:
    kafka: KafkaCluster
    listener: Listener  # the new leader's proxy
    proxies: dict[int, int]  # broker -> its proxy's port
    topic: str
    leader: int  # the new leader, the sidecar's broker
    epochs: tuple[int, int]  # (E0, E1)
    e1_start: int  # E1's first offset
    end: int  # the broker's high watermark
    sent: dict[int, tuple[bytes, bytes]]


def _produce(kafka: KafkaCluster, topic: str, tag: str, sent: dict[int, tuple[bytes, bytes]]) -> list[int]:
    recs = [(f"{tag}-{i}".encode(), f"{tag}-value-{i}".encode() * 3) for i in range(PER_EPOCH)]
    offsets = [off for _p, off in produce(kafka, topic, recs, acks="all", **{"batch.num.messages": 10})]
    sent.update(zip(offsets, recs, strict=True))
    return offsets


@pytest.fixture(scope="module")
def epochs(kafka_cluster3: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Epochs]:
    kafka = kafka_cluster3
    tmp: Path = tmp_path_factory.mktemp("proxy-epochs")
    topic = f"proxy-epochs-{uuid.uuid4().hex[:6]}"
    tid = kafka.create_topic(topic, 1, replication_factor=3, config={"segment.ms": str(SEGMENT_MS)})
    states = PartitionStates(kafka)
    first = states.leader(topic)
    sent: dict[int, tuple[bytes, bytes]] = {}
    _produce(kafka, topic, "e0", sent)
    time.sleep(SEGMENT_MS / 1000 + 0.05)
    new = next(n for n in NODES if n != first)
    reassign(kafka, {(topic, 0): [new, *(n for n in NODES if n != new)]}, tmp)
    wait_for(lambda: states.elect(topic, [0]) and states.leader(topic) == new, 60, f"node {new} to lead")
    e1_start = _produce(kafka, topic, "e1", sent)[0]
    time.sleep(SEGMENT_MS / 1000 + 0.05)
    (end,) = _produce(kafka, topic, "roll", sent)[-1:]  # rolls E1's segment: the tier ends before these
    end += 1
    ports = {n: free_port() for n in NODES}
    metadata: dict[str, str] = {}

    def settings_of(n: int) -> SidecarSettings:  # one store and metadata topic; each proxy told the others
        return make_settings(kafka, tmp, node_id=n, topics={"include": [topic]}, metadata=metadata, history_listener={
            "host": "127.0.0.1", "port": ports[n], "proxy": True, "authorization": {"allow_if_no_authorizer": True},
            "peers": {m: f"127.0.0.1:{ports[m]}" for m in NODES if m != n}})
    settings = settings_of(new)
    metadata.update(topic=settings.metadata.topic, to_be_deleted_topic=settings.metadata.to_be_deleted_topic)
    sidecar = Sidecar(settings).start()
    listeners: list[Listener] = []
    try:
        listener = start_listener(settings, sidecar.rsm)
        listeners.append(listener)
        listeners += [start_listener(settings_of(n), sidecar.rsm) for n in NODES if n != new]
        tier = listener.server.router.ctx.tier
        tp = TopicIdPartition(tid, topic, 0)

        def tiered() -> Any:
            tier.refresh([tp])
            t = tier.partition(tp)
            return t if t is not None and t.high_watermark > e1_start + INTO_E1 else None
        t = wait_for(tiered, 60, f"{tp} tiered past {e1_start + INTO_E1}")
        pairs = (t.epoch_of(0), t.epoch_of(e1_start))
        assert pairs[0] < pairs[1] and t.epoch_of(e1_start - 1) == pairs[0], pairs
        admin = AdminClient(kafka.admin_config())
        for fut in admin.delete_records([TopicPartition(topic, 0, e1_start + INTO_E1)]).values():
            fut.result(30)
        yield Epochs(kafka, listener, ports, topic, new, pairs, e1_start, end, sent)
    finally:
        for li in listeners:
            li.stop()
        sidecar.stop()


def _end_offset(address: tuple[str, int], topic: str, epoch: int, current: int) -> tuple[int, int, int]:
    """OffsetForLeaderEpoch v3 (a consumer's: replica id -1): (error code, leader epoch, end offset)."""
    with socket.create_connection(address, timeout=30) as sock:
        resp = call(sock, 23, 3, {"replica_id": -1, "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "current_leader_epoch": current, "leader_epoch": epoch}]}]})
    (t,) = resp.topics
    (p,) = t.partitions
    return p.error_code, p.leader_epoch, p.end_offset


def test_an_epoch_the_broker_forgot_is_answered_from_the_tiers_lineage(epochs: Epochs) -> None:
    """E0 ended where E1 began; the broker, whose log starts inside E1, says E0 ends at its log start; the proxy says
    where it ended. E1 (the broker's) is the broker's answer through the proxy too."""
    e0, e1 = epochs.epochs
    broker = ("127.0.0.1", epochs.kafka.node(epochs.leader).port)
    proxy = ("127.0.0.1", epochs.listener.port)
    assert _end_offset(broker, epochs.topic, e0, e1) == (0, e0, epochs.e1_start + INTO_E1)  # Kafka: its log start
    assert _end_offset(proxy, epochs.topic, e0, e1) == (0, e0, epochs.e1_start)  # the tier's lineage
    assert _end_offset(proxy, epochs.topic, e1, e1) == _end_offset(broker, epochs.topic, e1, e1)


def test_a_consumer_validating_an_old_position_reads_on_across_the_leader_change(epochs: Epochs) -> None:
    """A consumer assigned a position inside E0 with its epoch (as after a commit under the old leader) validates it
    against the proxy (OffsetForLeaderEpoch: the current leader epoch is newer) and reads on from it, through E1 and
    the broker's log start, each offset once: no truncation seen. Every connection it opened (librdkafka's
    ``broker`` debug lines) went to a proxy."""
    e0, _e1 = epochs.epochs
    start = epochs.e1_start - 5
    log, lines = librdkafka_log()
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{epochs.listener.port}", "group.id": f"v-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "auto.offset.reset": "error", "fetch.wait.max.ms": 100,
                  "debug": "broker", "log_level": 7}, logger=log)
    try:
        c.assign([TopicPartition(epochs.topic, 0, start, leader_epoch=e0)])
        got = consume_until(c, {(epochs.topic, 0): epochs.end})[(epochs.topic, 0)]
    finally:
        c.close()
    assert [r.offset for r in got] == list(range(start, epochs.end))
    assert all((r.key, r.value) == epochs.sent[r.offset] for r in got)
    connected = {int(m.group(1)) for line in lines for m in re.finditer(r"Connecting to ipv4#127\.0\.0\.1:(\d+)",
                                                                           line)}
    brokers = {epochs.kafka.node(n).port for n in NODES}
    assert connected and connected <= set(epochs.proxies.values()) and not connected & brokers, (
        connected, epochs.proxies, brokers)
