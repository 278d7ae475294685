"""Epochs a broker forgot, behind the proxy: the set-up of the OffsetForLeaderEpoch tests through the proxy
(``tests/rlm/listener/test_proxy_epochs.py`` and ``test_proxy_epochs_moved.py``; each has a module fixture of its
own calling :func:`forgotten_epochs`), and the raw OffsetForLeaderEpoch ask they make (:func:`end_offset`).

Three brokers, one topic of 3 replicas: a first leader writes epoch E0's records, leadership moves (reassignment and
a preferred election: epoch E1) and the new leader writes more; a sidecar next to the new leader tiers it all, and
each broker has a proxy listener in front of it, told the others. DeleteRecords then puts the broker's log start
``INTO_E1`` offsets inside E1: the broker's leader-epoch checkpoint no longer holds E0, and Kafka answers a request
for E0 with its log start offset, not where E0 ended. A second topic (:class:`Pending`) is set up alike, its E1 left
in the new leader's active segment.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from devtools.devkafka import KafkaCluster, free_port
from rlm.config import SidecarSettings
from rlm.listener import Listener, start_listener
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.rlm.listener.raw_wire import call
from tests.support.kafka import produce
from tests.support.sidecar import PartitionStates, make_settings, reassign, wait_for

__all__ = ["INTO_E1", "NODES", "Epochs", "Pending", "end_offset", "forgotten_epochs"]

NODES = (1, 2, 3)
PER_EPOCH = 40
SEGMENT_MS = 300
INTO_E1 = 10  # the broker's log start: this many offsets into the new leader's epoch


@dataclass
class Pending:
    """The second topic: E1 still in the new leader's active segment, the broker's log start inside it (``INTO_E1``
    offsets in), so the tier ends at E1's start, below the broker's log start, until E1's segment rolls."""

    topic: str
    tp: TopicIdPartition
    e0: int
    e1_start: int
    sent: dict[int, tuple[bytes, bytes]]


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
    settings_of: Callable[[int, dict[int, int]], SidecarSettings]  # broker, every broker's proxy port -> settings
    rsm: Any
    pending: Pending


def _produce(kafka: KafkaCluster, topic: str, tag: str, sent: dict[int, tuple[bytes, bytes]], batch: int = 10
             ) -> list[int]:
    recs = [(f"{tag}-{i}".encode(), f"{tag}-value-{i}".encode() * 3) for i in range(PER_EPOCH)]
    offsets = [off for _p, off in produce(kafka, topic, recs, acks="all", **{"batch.num.messages": batch})]
    sent.update(zip(offsets, recs, strict=True))
    return offsets


@contextmanager
def forgotten_epochs(kafka: KafkaCluster, tmp: Path) -> Iterator[Epochs]:
    """The set-up above on ``kafka`` (three brokers, ``NODES``), its files under ``tmp``; the sidecar and the proxies
    stopped at exit."""
    tag = uuid.uuid4().hex[:6]
    topic, pending_topic = f"proxy-epochs-{tag}", f"proxy-epochs-pending-{tag}"
    tid = kafka.create_topic(topic, 1, replication_factor=3, config={"segment.ms": str(SEGMENT_MS)})
    tid2 = kafka.create_topic(pending_topic, 1, replication_factor=3, config={"segment.ms": str(SEGMENT_MS)})
    states = PartitionStates(kafka)
    firsts = {states.leader(topic), states.leader(pending_topic)}
    sent: dict[int, tuple[bytes, bytes]] = {}
    sent2: dict[int, tuple[bytes, bytes]] = {}
    _produce(kafka, topic, "e0", sent)
    _produce(kafka, pending_topic, "e0", sent2)
    time.sleep(SEGMENT_MS / 1000 + 0.05)
    new = next(n for n in NODES if n not in firsts)
    reassign(kafka, {(t, 0): [new, *(n for n in NODES if n != new)] for t in (topic, pending_topic)}, tmp)
    wait_for(lambda: all(states.elect(t, [0]) and states.leader(t) == new for t in (topic, pending_topic)), 60,
             f"node {new} to lead")
    e1_start = _produce(kafka, topic, "e1", sent)[0]
    e1_start2 = _produce(kafka, pending_topic, "e1", sent2, batch=PER_EPOCH)[0]  # one append: no roll inside E1
    time.sleep(SEGMENT_MS / 1000 + 0.05)
    (end,) = _produce(kafka, topic, "roll", sent)[-1:]  # rolls E1's segment: the tier ends before these
    end += 1
    ports = {n: free_port() for n in NODES}
    metadata: dict[str, str] = {}

    # one store and metadata topic; each proxy (on ``ports``, by broker) told the others
    def settings_of(n: int, ports: dict[int, int] = ports) -> SidecarSettings:
        proxy = {"host": "127.0.0.1", "port": ports[n], "proxy": True,
                 "authorization": {"allow_if_no_authorizer": True},
                 "peers": {m: f"127.0.0.1:{ports[m]}" for m in NODES if m != n},
                 "hole_confirm_ms": 3_600_000}  # the pending topic's range below the log start stays pending
        return make_settings(kafka, tmp, node_id=n, topics={"include": [topic, pending_topic]}, metadata=metadata,
                             history_listener=proxy)
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
        tp2 = TopicIdPartition(tid2, pending_topic, 0)

        def e0_tiered() -> Any:
            tier.refresh([tp2])
            t = tier.partition(tp2)
            return t if t is not None and t.high_watermark >= e1_start2 else None
        t2 = wait_for(e0_tiered, 60, f"{tp2}'s E0 tiered")
        assert t2.high_watermark == e1_start2, t2.high_watermark  # E1's segment is the broker's active one
        admin = AdminClient(kafka.admin_config())
        for fut in admin.delete_records([TopicPartition(topic, 0, e1_start + INTO_E1),
                                         TopicPartition(pending_topic, 0, e1_start2 + INTO_E1)]).values():
            fut.result(30)
        yield Epochs(kafka, listener, ports, topic, new, pairs, e1_start, end, sent, settings_of, sidecar.rsm,
                     Pending(pending_topic, tp2, t2.epoch_of(0), e1_start2, sent2))
    finally:
        for li in listeners:
            li.stop()
        sidecar.stop()


def end_offset(address: tuple[str, int], topic: str, epoch: int, current: int) -> tuple[int, int, int]:
    """OffsetForLeaderEpoch v3 (a consumer's: replica id -1) for partition 0: (error code, leader epoch, end
    offset)."""
    with socket.create_connection(address, timeout=30) as sock:
        resp = call(sock, 23, 3, {"replica_id": -1, "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "current_leader_epoch": current, "leader_epoch": epoch}]}]})
    (t,) = resp.topics
    (p,) = t.partitions
    return p.error_code, p.leader_epoch, p.end_offset
