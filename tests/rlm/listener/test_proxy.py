"""The listener as a tier-aware proxy of its broker (``history_listener.proxy: true``), black box, real broker.

One tiered topic for the module (2 partitions, three segments each, tiered by an in-process sidecar); then the broker
gives up the start of each partition (DeleteRecords to an offset inside the tier, as local retention would, at a
known offset: the boundary falls inside a segment): offsets below it exist only remotely. Clients connect to the
listener alone: a ``subscribe()`` consumer group reads from offset 0 across the boundary and commits on the broker;
raw Fetches show the crossing is exact and the answers keep the client's order.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient
from pydantic import ValidationError

from devtools.devkafka import KafkaCluster
from rlm.config import HistoryListenerSettings
from rlm.listener import Listener, start_listener
from rlm.listener.upstream.rewrite import PeerAddresses
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from rsm.log.batch import header_from_bytes
from tests.kafka_util import produce
from tests.rlm.listener.conftest import Rec, broker_watermarks, consume_until
from tests.rlm.listener.raw_wire import call
from tests.rlm.sidecar_util import make_settings, wait_for

PARTITIONS = 2
ROUNDS, PER_ROUND = 3, 40  # per partition: three segments of 40 records (batches of up to 10), then a roll
SEGMENT_MS = 300
LOG_START = {0: 2 * PER_ROUND - 7, 1: PER_ROUND + 3}  # the broker's log start after DeleteRecords: inside segments
EARLIEST = -2


@dataclass
class Proxied:
    kafka: KafkaCluster
    listener: Listener
    topic: str
    sent: dict[tuple[int, int], tuple[bytes, bytes]]  # (partition, offset) -> (key, value)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.listener.port}"

    def produce(self, n: int, tag: str) -> None:
        for p in range(PARTITIONS):
            recs = [(f"{tag}-{p}-{i}".encode(), f"{tag}-value-{p}-{i}".encode() * 3) for i in range(n)]
            for (_part, off), rec in zip(produce(self.kafka, self.topic, recs, partition=p, **{
                    "batch.num.messages": 10}), recs, strict=True):
                self.sent[(p, off)] = rec

    def end(self, partition: int) -> int:
        return broker_watermarks(self.kafka, self.topic, partition)[1]

    def consumer(self, group: str) -> Consumer:
        return Consumer({"bootstrap.servers": self.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "check.crcs": True, "fetch.wait.max.ms": 100,
                         "topic.metadata.refresh.interval.ms": 5000, "session.timeout.ms": 6000})


@pytest.fixture(scope="module")
def proxied(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    tmp: Path = tmp_path_factory.mktemp("proxy")
    topic = f"proxy-{uuid.uuid4().hex[:6]}"
    tid = kafka.create_topic(topic, PARTITIONS, config={"segment.ms": str(SEGMENT_MS)})
    setup = Proxied(kafka, None, topic, {})  # type: ignore[arg-type]
    for r in range(ROUNDS):
        setup.produce(PER_ROUND, f"r{r}")
        time.sleep(SEGMENT_MS / 1000 + 0.05)
    for p in range(PARTITIONS):  # rolls the segment of the last round: the tier ends at ROUNDS * PER_ROUND
        produce(kafka, topic, [(b"__roll__", b"r")], partition=p)
        setup.sent[(p, ROUNDS * PER_ROUND)] = (b"__roll__", b"r")
    settings = make_settings(kafka, tmp, topics={"include": [topic]}, history_listener={
        "host": "127.0.0.1", "port": 0, "proxy": True, "authorization": {"allow_if_no_authorizer": True}})
    sidecar = Sidecar(settings).start()
    listener: Listener | None = None
    try:
        listener = setup.listener = start_listener(settings, sidecar.rsm)
        tier = listener.server.router.ctx.tier
        for p in range(PARTITIONS):
            tp = TopicIdPartition(tid, topic, p)

            def tiered(tp: TopicIdPartition = tp) -> bool:
                tier.refresh([tp])
                t = tier.partition(tp)
                return t is not None and (t.log_start_offset, t.high_watermark) == (0, ROUNDS * PER_ROUND)
            wait_for(tiered, 60, f"{tp} tiered up to {ROUNDS * PER_ROUND}")
        admin = AdminClient(kafka.admin_config())
        for fut in admin.delete_records([TopicPartition(topic, p, o) for p, o in LOG_START.items()]).values():
            fut.result(30)
        for p, o in LOG_START.items():
            assert broker_watermarks(kafka, topic, p)[0] == o
        yield setup
    finally:
        if listener is not None:
            listener.stop()
        sidecar.stop()


def committed(kafka: KafkaCluster, group: str, topic: str) -> dict[int, int]:
    """The group's offsets as the broker's own admin API gives them."""
    admin = AdminClient(kafka.admin_config())
    futs = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    res = futs[group].result(30)
    return {tp.partition: tp.offset for tp in res.topic_partitions if tp.topic == topic}


def test_a_consumer_group_reads_from_0_across_the_boundary_commits_on_the_broker_and_resumes(
        proxied: Proxied) -> None:
    """A subscribe() consumer (group, auto.offset.reset=earliest) whose only bootstrap server is the listener reads
    each partition from offset 0, held by the tier alone, in order and each once; its commit() of a position still
    below the broker's log start lands on the broker. A second consumer of the group resumes from that commit,
    crosses into the broker's log and on into records produced while it reads, each once, in order; its commit lands
    too."""
    group = f"g-{uuid.uuid4().hex[:6]}"
    first = {p: LOG_START[p] - 5 for p in range(PARTITIONS)}  # where the first consumer stops: below the boundary
    c1 = proxied.consumer(group)
    try:
        c1.subscribe([proxied.topic])
        got = consume_until(c1, {(proxied.topic, p): first[p] for p in range(PARTITIONS)})
        for p in range(PARTITIONS):
            offsets = [r.offset for r in got[(proxied.topic, p)]]
            assert offsets[:first[p]] == list(range(first[p])), p  # from 0, in order, each once
            assert offsets == sorted(set(offsets)), p
            for r in got[(proxied.topic, p)]:
                assert (r.key, r.value) == proxied.sent[(p, r.offset)]
        c1.commit(offsets=[TopicPartition(proxied.topic, p, first[p]) for p in range(PARTITIONS)],
                  asynchronous=False)
    finally:
        c1.close()
    assert committed(proxied.kafka, group, proxied.topic) == first

    c2 = proxied.consumer(group)
    try:
        c2.subscribe([proxied.topic])
        early: dict[int, list[Rec]] = {p: [] for p in range(PARTITIONS)}
        deadline = time.monotonic() + 30
        while not all(early.values()):  # reading history from the commit on...
            assert time.monotonic() < deadline, "the second consumer read nothing"
            for msg in c2.consume(100, 0.5):
                assert msg.error() is None, msg.error()
                early[msg.partition()].append(Rec.of(msg))
        proxied.produce(15, f"live-{group}")  # ...when these are produced
        ends = {p: proxied.end(p) for p in range(PARTITIONS)}
        late = consume_until(c2, {(proxied.topic, p): ends[p] for p in range(PARTITIONS)}, settle_s=0.5)
        for p in range(PARTITIONS):
            recs = early[p] + late[(proxied.topic, p)]
            assert [r.offset for r in recs] == list(range(first[p], ends[p])), p  # from the commit, each once
            for r in recs:
                assert (r.key, r.value) == proxied.sent[(p, r.offset)]
        c2.commit(asynchronous=False)
    finally:
        c2.close()
    assert committed(proxied.kafka, group, proxied.topic) == ends


def _offsets(records: bytes | None, position: int) -> list[int]:
    """The offsets at or past ``position`` of the record batches ``records`` (no control or compacted batches)."""
    out: list[int] = []
    data = memoryview(records or b"")
    pos = 0
    while pos + 12 <= len(data):
        size = 12 + int.from_bytes(data[pos + 8:pos + 12], "big")  # baseOffset int64, batchLength int32
        if pos + size > len(data):
            break  # a partial batch at the end of an answer (a broker may cut one): the next fetch has it whole
        h = header_from_bytes(data[pos:pos + size])
        out += [o for o in range(h.base_offset, h.last_offset + 1) if o >= position]
        pos += size
    return out


def _fetch(sock: socket.socket, topic: str, parts: list[tuple[int, int]], max_bytes: int = 1 << 20) -> Any:
    """A Fetch v11 (no session, no wait) of ``(partition, offset)`` in that order."""
    return call(sock, 1, 11, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "topics": [{"topic": topic, "partitions": [
            {"partition": p, "fetch_offset": o, "current_leader_epoch": -1, "log_start_offset": -1,
             "partition_max_bytes": max_bytes} for p, o in parts]}]})


def test_a_fetch_straddling_the_boundary_is_exact_and_answers_keep_the_clients_order(proxied: Proxied) -> None:
    """One Fetch names a partition above the broker's log start (the broker answers) and one below it (the tier
    answers), in that order: the answer keeps it, with the broker's high watermark on both and the tier's log start
    on the second, whose batches run from the fetch offset past the boundary. Fetching on from each answer's end,
    two batches at a time, crosses from the tier to the broker: every offset from just below the boundary to the end,
    once, in order."""
    topic = proxied.topic
    with socket.create_connection(("127.0.0.1", proxied.listener.port), timeout=30) as sock:
        ends = {p: proxied.end(p) for p in range(PARTITIONS)}
        resp = _fetch(sock, topic, [(1, LOG_START[1] + 2), (0, LOG_START[0] - 1)])
        assert resp.error_code == 0 and resp.session_id == 0
        (t,) = resp.responses
        assert [p.partition_index for p in t.partitions] == [1, 0]
        broker, tier = t.partitions
        assert broker.error_code == 0 and broker.log_start_offset == LOG_START[1]
        assert _offsets(broker.records, LOG_START[1] + 2)[0] == LOG_START[1] + 2
        assert tier.error_code == 0 and tier.log_start_offset == 0 and tier.high_watermark == ends[0]
        from_tier = _offsets(tier.records, LOG_START[0] - 1)
        assert from_tier[0] == LOG_START[0] - 1 and from_tier[-1] >= LOG_START[0]  # one answer across the boundary

        seen: list[int] = []
        sources = set()
        position = LOG_START[0] - 1
        while position < ends[0]:
            (t,) = _fetch(sock, topic, [(0, position)], max_bytes=400).responses  # about two batches at a time
            (part,) = t.partitions
            assert part.error_code == 0, (position, part.error_code)
            sources.add("tier" if part.log_start_offset == 0 else "broker")
            got = _offsets(part.records, position)
            assert got, position
            seen += got
            position = got[-1] + 1
        assert seen == list(range(LOG_START[0] - 1, ends[0]))
        assert sources == {"tier", "broker"}


def test_addresses_are_the_listeners_and_earliest_is_the_tiers(proxied: Proxied) -> None:
    """Metadata and FindCoordinator name the listener for the broker behind it; ListOffsets EARLIEST is the tier's
    first offset (below the broker's log start), LATEST the broker's end."""
    port = proxied.listener.port
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        md = call(sock, 3, 8, {"topics": [{"name": proxied.topic}], "allow_auto_topic_creation": False,
                               "include_cluster_authorized_operations": False,
                               "include_topic_authorized_operations": False})
        assert [(b.host, b.port) for b in md.brokers] == [("127.0.0.1", port)]
        fc = call(sock, 10, 2, {"key": "any-group", "key_type": 0})
        assert fc.error_code == 0 and (fc.host, fc.port) == ("127.0.0.1", port)
        for ts, want in ((EARLIEST, {p: 0 for p in range(PARTITIONS)}),
                         (-1, {p: proxied.end(p) for p in range(PARTITIONS)})):
            asked = [{"partition_index": p, "current_leader_epoch": -1, "timestamp": ts} for p in range(PARTITIONS)]
            lo = call(sock, 2, 5, {"replica_id": -1, "isolation_level": 0,
                                   "topics": [{"name": proxied.topic, "partitions": asked}]})
            assert {p.partition_index: (p.error_code, p.offset) for p in lo.topics[0].partitions} == {
                p: (0, o) for p, o in want.items()}, ts


# ------------------------------------------------------------------------------------------------ config (no broker)
def test_proxy_is_off_by_default_and_refused_with_sasl() -> None:
    assert HistoryListenerSettings().proxy is False
    with pytest.raises(ValidationError, match="SASL pass-through to the broker is not built yet"):
        HistoryListenerSettings(proxy=True, sasl={"users": {"a": "secret"}})
    HistoryListenerSettings(sasl={"users": {"a": "secret"}})  # the endpoint alone still takes SASL
    for bad in ({"peer_address": "sidecar:9095"}, {"peer_address": "{node}:9095"}, {"peer_address": "{host}"},
                {"peers": {2: "no-port"}}, {"upstream": "broker"}):
        with pytest.raises(ValidationError):
            HistoryListenerSettings(proxy=True, **bad)


def test_peer_addresses() -> None:
    """This broker -> this listener; a mapped peer -> its address; else the template; else the broker's own."""
    own = PeerAddresses(1, lambda: ("me", 9095), {2: "sidecar-2:9095"})
    assert own.of(1, "b1", 9092) == ("me", 9095)
    assert own.of(2, "b2", 9092) == ("sidecar-2", 9095)
    assert own.of(3, "b3", 9092) == ("b3", 9092)
    templated = PeerAddresses(1, lambda: ("me", 9095), {}, template="{host}:19095")
    assert templated.of(3, "b3", 9092) == ("b3", 19095)
    assert PeerAddresses(1, lambda: ("me", 9095), {}, template="rlm-{node_id}.svc:9095").of(7, "b7", 9092) == (
        "rlm-7.svc", 9095)
