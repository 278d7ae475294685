"""The listener as a tier-aware proxy of its broker (``history_listener.proxy: true``), black box, real broker.

One tiered topic for the module (2 partitions, three segments each, tiered by an in-process sidecar); then the broker
gives up the start of each partition (DeleteRecords to an offset inside the tier, as local retention would, at a
known offset: the boundary falls inside a segment): offsets below it exist only remotely. Clients connect to the
listener alone: a ``subscribe()`` consumer group reads from offset 0 across the boundary and commits on the broker;
raw Fetches show the crossing is exact and the answers keep the client's order.

Two more topics in the same set-up: ``hole``, whose tier ends below the broker's log start (the records past the
tier's end stay in the broker's active segment, never rolled, and DeleteRecords moves the log start past some of
them); and ``txn``, where a committed and an aborted transaction begin in a tiered segment and end (their markers) in
the broker's active segment, never tiered, with the broker's log start between.
"""

from __future__ import annotations

import gc
import logging
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import REGISTRY
from pydantic import ValidationError

from devtools.devkafka import KafkaCluster
from rlm.config import HistoryListenerSettings, SidecarSettings
from rlm.listener import Listener, start_listener
from rlm.listener.authz import READ
from rlm.listener.protocol.codec import ErrorCode
from rlm.listener.tier import boundary
from rlm.listener.upstream import bounds, proxy
from rlm.listener.upstream.rewrite import PeerAddresses
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from rsm.log.batch import header_from_bytes
from rsm.log.records import decode_records
from tests.rlm.listener.raw_wire import EARLIEST, call, fetch, list_offsets, only_partition
from tests.support.clients import Rec, consume_until
from tests.support.held_metadata import Held, held_listener
from tests.support.kafka import broker_watermarks, produce
from tests.support.sidecar import make_settings, wait_for
from tests.support.txn import TxnProducer

PARTITIONS = 2
ROUNDS, PER_ROUND = 3, 40  # per partition: three segments of 40 records (batches of up to 10), then a roll
SEGMENT_MS = 300
LOG_START = {0: 2 * PER_ROUND - 7, 1: PER_ROUND + 3}  # the broker's log start after DeleteRecords: inside segments
TIERED = ROUNDS * PER_ROUND  # the tier's high watermark (main and hole)
HOLE_AFTER, HOLE = 10, 5  # hole: records after the tier's end, in the active segment; the first HOLE deleted
FUTURE_MS = 600_000  # explicit timestamps this far ahead: segments roll only where the test's timestamps say
HOLE_CONFIRM_MS = 1000  # history_listener.hole_confirm_ms: hole's range is a hole once met for this long


@dataclass
class Txns:
    """The txn topic: what a read_committed consumer must see, the aborted offsets, and where things are."""

    committed: dict[int, tuple[bytes, bytes]]  # offset -> (key, value): plain records and the committed transaction
    aborted: dict[int, tuple[bytes, bytes]]
    tiered: int  # the tier's high watermark: the first offset of the active segment
    log_start: int  # the broker's, after DeleteRecords: inside both transactions' tiered records


@dataclass
class Proxied:
    kafka: KafkaCluster
    listener: Listener
    topic: str
    sent: dict[tuple[int, int], tuple[bytes, bytes]]  # (partition, offset) -> (key, value)
    hole_topic: str = ""
    hole_sent: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    txn_topic: str = ""
    txns: Txns | None = None
    settings: SidecarSettings | None = None  # the sidecar's, its listener's
    rsm: Any = None  # the sidecar's storage manager

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.listener.port}"

    def produce(self, n: int, tag: str) -> None:
        for p in range(PARTITIONS):
            recs = [(f"{tag}-{p}-{i}".encode(), f"{tag}-value-{p}-{i}".encode() * 3) for i in range(n)]
            for (_part, off), rec in zip(produce(self.kafka, self.topic, recs, partition=p, **{
                    "batch.num.messages": 10}), recs, strict=True):
                self.sent[(p, off)] = rec

    def produce_hole(self, n: int, tag: str, timestamp_ms: int = 0) -> None:
        recs = [(f"{tag}-{i}".encode(), f"{tag}-hole-{i}".encode() * 3, None, timestamp_ms) for i in range(n)]
        for (_part, off), rec in zip(produce(self.kafka, self.hole_topic, recs, **{"batch.num.messages": 10}), recs,
                                     strict=True):
            self.hole_sent[off] = (rec[0], rec[1])

    def end(self, partition: int) -> int:
        return broker_watermarks(self.kafka, self.topic, partition)[1]

    def consumer(self, group: str) -> Consumer:
        return Consumer({"bootstrap.servers": self.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "check.crcs": True, "fetch.wait.max.ms": 100,
                         "topic.metadata.refresh.interval.ms": 5000, "session.timeout.ms": 6000})


@pytest.fixture(scope="module")
def proxied(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    tmp: Path = tmp_path_factory.mktemp("proxy")
    tag = uuid.uuid4().hex[:6]
    topic, hole_topic, txn_topic = f"proxy-{tag}", f"proxy-{tag}-hole", f"proxy-{tag}-txn"
    tid = kafka.create_topic(topic, PARTITIONS, config={"segment.ms": str(SEGMENT_MS)})
    hole_tid = kafka.create_topic(hole_topic, 1, config={"segment.ms": str(SEGMENT_MS)})
    txn_tid = kafka.create_topic(txn_topic, 1, config={"segment.ms": str(SEGMENT_MS)})
    setup = Proxied(kafka, None, topic, {}, hole_topic=hole_topic, txn_topic=txn_topic)  # type: ignore[arg-type]
    tiered_txns = _transactions(kafka, txn_topic)
    for r in range(ROUNDS):
        setup.produce(PER_ROUND, f"r{r}")
        setup.produce_hole(PER_ROUND, f"r{r}")
        time.sleep(SEGMENT_MS / 1000 + 0.05)
    for p in range(PARTITIONS):  # rolls the segment of the last round: the tier ends at ROUNDS * PER_ROUND
        produce(kafka, topic, [(b"__roll__", b"r")], partition=p)
        setup.sent[(p, ROUNDS * PER_ROUND)] = (b"__roll__", b"r")
    # hole: the same roll, by records timestamped ahead, so that the segment they start never rolls (nothing is
    # produced to it later): the tier ends at TIERED, the broker's log goes on to TIERED + HOLE_AFTER.
    setup.produce_hole(HOLE_AFTER, "after", int(time.time() * 1000) + FUTURE_MS)
    settings = make_settings(kafka, tmp, topics={"include": [topic, hole_topic, txn_topic]}, history_listener={
        "host": "127.0.0.1", "port": 0, "proxy": True, "authorization": {"allow_if_no_authorizer": True},
        "hole_confirm_ms": HOLE_CONFIRM_MS})
    sidecar = Sidecar(settings).start()
    listener: Listener | None = None
    try:
        listener = setup.listener = start_listener(settings, sidecar.rsm)
        tier = listener.server.router.ctx.tier
        want = {TopicIdPartition(tid, topic, p): TIERED for p in range(PARTITIONS)}
        want[TopicIdPartition(hole_tid, hole_topic, 0)] = TIERED
        want[TopicIdPartition(txn_tid, txn_topic, 0)] = tiered_txns.tiered
        for tp, end in want.items():
            def tiered(tp: TopicIdPartition = tp, end: int = end) -> bool:
                tier.refresh([tp])
                t = tier.partition(tp)
                return t is not None and (t.log_start_offset, t.high_watermark) == (0, end)
            wait_for(tiered, 60, f"{tp} tiered up to {end}")
        # The txn topic's tier sees both transactions open at its end (their markers are not tiered).
        t = tier.partition(TopicIdPartition(txn_tid, txn_topic, 0))
        assert t is not None and t.last_stable_offset < t.high_watermark, t
        starts = {(topic, p): o for p, o in LOG_START.items()}
        starts[(hole_topic, 0)] = TIERED + HOLE
        starts[(txn_topic, 0)] = tiered_txns.log_start
        admin = AdminClient(kafka.admin_config())
        for fut in admin.delete_records([TopicPartition(t, p, o) for (t, p), o in starts.items()]).values():
            fut.result(30)
        for (t, p), o in starts.items():
            assert broker_watermarks(kafka, t, p)[0] == o
        setup.txns = tiered_txns
        setup.settings, setup.rsm = settings, sidecar.rsm
        yield setup
    finally:
        if listener is not None:
            listener.stop()
        sidecar.stop()


def _transactions(kafka: KafkaCluster, topic: str) -> Txns:
    """The txn topic: 20 plain records (segment 1); a committed and an aborted transaction of 10 records each
    (segment 2); one plain record that rolls segment 3, 10 more records of each transaction, their markers and 5
    plain records (segment 3, never rolled). Timestamps are set ahead, a second per segment, so that segments roll
    exactly there (the markers, stamped now by the broker, roll nothing). The tier holds segments 1 and 2; the
    broker's log start is put inside the aborted transaction's first records."""
    base = int(time.time() * 1000) + FUTURE_MS
    committed: dict[int, tuple[bytes, bytes]] = {}
    aborted: dict[int, tuple[bytes, bytes]] = {}

    def send(p: Any, tag: str, n: int, ts: int, into: dict[int, tuple[bytes, bytes]]) -> list[int]:
        sent: dict[int, tuple[bytes, bytes]] = {}

        def cb(err: Any, msg: Any) -> None:
            assert err is None, err
            sent[msg.offset()] = (msg.key(), msg.value())

        for i in range(n):
            p.produce(topic, key=f"{tag}-{i}".encode(), value=f"{tag}-value-{i}".encode() * 5, partition=0,
                      timestamp=ts, on_delivery=cb)
        assert p.flush(30) == 0 and len(sent) == n
        into.update(sent)
        return sorted(sent)

    plain = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5})
    yes, no = TxnProducer(kafka, topic), TxnProducer(kafka, topic)
    send(plain, "plain-a", 20, base, committed)
    yes.p.begin_transaction()
    no.p.begin_transaction()
    send(yes.p, "yes-a", 10, base + 1000, committed)
    first_aborted = send(no.p, "no-a", 10, base + 1000, aborted)[0]
    (tiered,) = send(plain, "plain-b", 1, base + 2000, committed)
    send(yes.p, "yes-b", 10, base + 2000, committed)
    send(no.p, "no-b", 10, base + 2000, aborted)
    yes.p.commit_transaction(30)
    no.p.abort_transaction(30)
    send(plain, "plain-c", 5, base + 2000, committed)
    return Txns(committed, aborted, tiered, first_aborted + 5)


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


def test_a_fetch_straddling_the_boundary_is_exact_and_answers_keep_the_clients_order(proxied: Proxied) -> None:
    """One Fetch names a partition above the broker's log start (the broker answers) and one below it (the tier
    answers), in that order: the answer keeps it, with the broker's high watermark on both and the tier's log start
    on the second, whose batches run from the fetch offset past the boundary. Fetching on from each answer's end,
    two batches at a time, crosses from the tier to the broker: every offset from just below the boundary to the end,
    once, in order."""
    topic = proxied.topic
    with socket.create_connection(("127.0.0.1", proxied.listener.port), timeout=30) as sock:
        ends = {p: proxied.end(p) for p in range(PARTITIONS)}
        resp = fetch(sock, topic, [(1, LOG_START[1] + 2), (0, LOG_START[0] - 1)])
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
            (t,) = fetch(sock, topic, [(0, position)], max_bytes=400).responses  # about two batches at a time
            (part,) = t.partitions
            assert part.error_code == 0, (position, part.error_code)
            sources.add("tier" if part.log_start_offset == 0 else "broker")
            got = _offsets(part.records, position)
            assert got, position
            seen += got
            position = got[-1] + 1
        assert seen == list(range(LOG_START[0] - 1, ends[0]))
        assert sources == {"tier", "broker"}


def _upstream_requests() -> dict[str, float]:
    return {api: REGISTRY.get_sample_value("rlm_history_upstream_requests_total", {"api": api}) or 0.0
            for api in ("fetch", "list_offsets")}


@pytest.mark.parametrize("isolation", [0, 1])
def test_history_fetches_below_a_known_log_start_ask_the_broker_nothing_and_stay_exact(
        proxied: Proxied, monkeypatch: pytest.MonkeyPatch, isolation: int) -> None:
    """Reading a partition from 0, two batches a Fetch: the first Fetch below the broker's log start asks the broker
    (the Fetch answered OFFSET_OUT_OF_RANGE, ListOffsets EARLIEST and LATEST, and LATEST read_committed for a
    read_committed Fetch); every later one below the log start it learned is answered from the tier alone
    (:class:`rlm.listener.upstream.bounds.KnownBounds`, kept fresh for the whole test here; read_committed too: the
    tier sees no transaction open at its end), the ones at or past it are forwarded, and no ListOffsets is asked
    again: every offset from 0 to the end, once, in order, with the broker's high watermark."""
    monkeypatch.setattr(bounds, "BOUNDS_FRESH_S", 3600.0)
    topic = proxied.topic
    end = proxied.end(0)
    used = REGISTRY.get_sample_value("rlm_history_proxy_prefetches_total", {"result": "used"}) or 0.0
    seen: list[int] = []
    asked: list[tuple[int, dict[str, float]]] = []  # (fetch offset, the broker's requests it took)
    with socket.create_connection(("127.0.0.1", proxied.listener.port), timeout=30) as sock:
        position = 0
        while position < end:
            before = _upstream_requests()
            # each its own correlation id: an answer read ahead is encoded before its request comes
            (t,) = fetch(sock, topic, [(0, position)], max_bytes=400, isolation=isolation,
                          correlation_id=len(asked) + 1).responses
            after = _upstream_requests()
            asked.append((position, {api: after[api] - before[api] for api in after}))
            (part,) = t.partitions
            assert part.error_code == 0 and part.high_watermark == part.last_stable_offset == end, (position, part)
            got = _offsets(part.records, position)
            assert got, position
            seen += got
            position = got[-1] + 1
    assert seen == list(range(end))
    assert asked[0] == (0, {"fetch": 1, "list_offsets": 2 + isolation}), asked[0]
    below = [d for o, d in asked[1:] if o < LOG_START[0]]
    above = [d for o, d in asked[1:] if o >= LOG_START[0]]
    assert below and all(d == {"fetch": 0, "list_offsets": 0} for d in below), asked
    assert above and all(d == {"fetch": 1, "list_offsets": 0} for d in above), asked
    # each answer from the tier had the next one read ahead, the one merged into the broker's answer too: every
    # Fetch below the log start after the first used it
    used = (REGISTRY.get_sample_value("rlm_history_proxy_prefetches_total", {"result": "used"}) or 0.0) - used
    assert used == len(below), (used, len(below))


def test_an_answer_read_ahead_serves_the_next_fetch_naming_the_partitions_in_another_order(
        proxied: Proxied, monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka starts each Fetch's partition list one partition further on (fairness): two partitions read from 0,
    below the broker's log start, named in turns (0, 1) then (1, 0): from the second Fetch on each is answered with
    the answer read ahead for it (read for the other order), in the request's order, every offset once per
    partition, in order. (An ordered match never served such a consumer.)"""
    monkeypatch.setattr(bounds, "BOUNDS_FRESH_S", 3600.0)
    topic = proxied.topic
    used = REGISTRY.get_sample_value("rlm_history_proxy_prefetches_total", {"result": "used"}) or 0.0
    positions = {0: 0, 1: 0}
    seen: dict[int, list[int]] = {0: [], 1: []}
    fetches = 0
    with socket.create_connection(("127.0.0.1", proxied.listener.port), timeout=30) as sock:
        while all(positions[p] < LOG_START[p] - 10 for p in positions):  # both still below the log start
            order = [0, 1] if fetches % 2 == 0 else [1, 0]
            (t,) = call(sock, 1, 11, {  # about two batches a partition
                "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1, "rack_id": "", "topics": [{"topic": topic, "partitions": [
                    {"partition": p, "fetch_offset": positions[p], "current_leader_epoch": -1, "log_start_offset": -1,
                     "partition_max_bytes": 600} for p in order]}]}).responses
            assert [p.partition_index for p in t.partitions] == order
            for part in t.partitions:
                assert part.error_code == 0, part
                got = _offsets(part.records, positions[part.partition_index])
                assert got, (part.partition_index, positions)
                seen[part.partition_index] += got
                positions[part.partition_index] = got[-1] + 1
            fetches += 1
    assert fetches >= 4, fetches
    assert all(seen[p] == list(range(positions[p])) for p in seen)
    used = (REGISTRY.get_sample_value("rlm_history_proxy_prefetches_total", {"result": "used"}) or 0.0) - used
    assert used == fetches - 1, (used, fetches)  # the first asked the broker


def test_a_fetch_whose_bounds_went_stale_asks_the_broker_and_uses_the_answer_read_ahead(
        proxied: Proxied, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reading a partition from 0 below the broker's log start with the known bounds stale at every Fetch (a
    consumer slower than ``BOUNDS_FRESH_S``): each Fetch asks the broker (the Fetch, answered OFFSET_OUT_OF_RANGE,
    then ListOffsets EARLIEST and LATEST), and from the second on the answer is the one read ahead for it, in parts
    as from known bounds (before: the answer read ahead was dropped, the tier read again and the broker's answer
    decoded and encoded whole with the tier's records); every offset once, in order, with the broker's high
    watermark and log start."""
    monkeypatch.setattr(bounds, "BOUNDS_FRESH_S", 1.0)
    topic = proxied.topic
    end = proxied.end(0)
    used = REGISTRY.get_sample_value("rlm_history_proxy_prefetches_total", {"result": "used"}) or 0.0
    seen: list[int] = []
    fetches = 0
    with socket.create_connection(("127.0.0.1", proxied.listener.port), timeout=30) as sock:
        position = 0
        while position < LOG_START[0] - 20:
            if fetches:
                time.sleep(bounds.BOUNDS_FRESH_S + 0.2)  # the bounds learned by the last Fetch are stale now
            before = _upstream_requests()
            (t,) = fetch(sock, topic, [(0, position)], max_bytes=400).responses
            after = _upstream_requests()
            assert {api: after[api] - before[api] for api in after} == {"fetch": 1, "list_offsets": 2}, position
            (part,) = t.partitions
            assert part.error_code == 0 and part.high_watermark == end, (position, part)
            assert part.log_start_offset == 0, part  # the tier's: below the broker's
            got = _offsets(part.records, position)
            assert got, position
            seen += got
            position = got[-1] + 1
            fetches += 1
    assert fetches >= 3 and seen == list(range(position)), (fetches, seen)
    used = (REGISTRY.get_sample_value("rlm_history_proxy_prefetches_total", {"result": "used"}) or 0.0) - used
    assert used == fetches - 1, (used, fetches)


def test_an_answer_read_ahead_is_authorized_once_when_it_is_used(proxied: Proxied,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer from the tier read ahead for a client's next Fetch is read as if allowed and authorized when that
    Fetch uses it (:meth:`rlm.listener.upstream.proxy.Proxy._still_readable`): the cluster's ACLs are looked up once
    an answer (before: the worker reading ahead looked them up too, twice an answer). Once READ is taken away, the
    next Fetch gets TOPIC_AUTHORIZATION_FAILED and no records, though its answer was read ahead."""
    monkeypatch.setattr(bounds, "BOUNDS_FRESH_S", 3600.0)
    ctx = proxied.listener.server.router.ctx
    allowed = ctx.allowed
    lookups: list[set[str]] = []
    denied: set[str] = set()

    def counted(client: Any, operation: str, names: Any) -> set[str]:
        names = set(names)
        if operation == READ:
            lookups.append(names)
        return allowed(client, operation, names) - denied

    monkeypatch.setattr(ctx, "allowed", counted)
    used = REGISTRY.get_sample_value("rlm_history_proxy_prefetches_total", {"result": "used"}) or 0.0
    with socket.create_connection(("127.0.0.1", proxied.listener.port), timeout=30) as sock:
        position = 0
        for i in range(5):  # the first asks the broker (and reads the tier); the next four use answers read ahead
            if i == 1:
                lookups.clear()
            (t,) = fetch(sock, proxied.topic, [(0, position)], max_bytes=400, correlation_id=i + 1).responses
            (part,) = t.partitions
            assert part.error_code == 0, (position, part)
            got = _offsets(part.records, position)
            assert got and got[0] == position, (position, got)
            position = got[-1] + 1
        assert position < LOG_START[0], position  # every one below the broker's log start
        assert lookups == [{proxied.topic}] * 4, lookups  # one per answer, by the Fetch that used it
        denied.add(proxied.topic)
        (t,) = fetch(sock, proxied.topic, [(0, position)], max_bytes=400, correlation_id=9).responses
        (part,) = t.partitions
        assert part.error_code == ErrorCode.topic_authorization_failed.value and not part.records, part
    used = (REGISTRY.get_sample_value("rlm_history_proxy_prefetches_total", {"result": "used"}) or 0.0) - used
    assert used == 4, used


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


def test_a_hole_is_out_of_range_as_from_kafka_counted_and_logged_once(
        proxied: Proxied, caplog: pytest.LogCaptureFixture) -> None:
    """hole's tier ends at TIERED, the broker's log starts at TIERED + HOLE, nothing is staged: for
    ``hole_confirm_ms`` from the first time it is met, the range is pending (it may yet be tiered): a Fetch inside it
    and EARLIEST are OFFSET_NOT_AVAILABLE, not counted as a hole. Then it is one: a Fetch inside it gets the very
    partition answer the broker gives (OFFSET_OUT_OF_RANGE), the last tiered offset is still served; EARLIEST is the
    broker's log start (the tier's would send a resetting consumer back below the hole, forever); the hole is counted
    once and logged once with its range, however often it is met. A consumer positioned at 0 reads the tier, meets
    the hole, resets to earliest as Kafka makes it, and reads the broker's log: every offset but the hole's, once."""
    topic, start = proxied.hole_topic, TIERED + HOLE
    before = REGISTRY.get_sample_value("rlm_history_tier_holes_total", {"topic": topic}) or 0.0
    pending = REGISTRY.get_sample_value("rlm_history_tier_holes_pending_total", {"topic": topic}) or 0.0
    host, port = proxied.kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)
    with caplog.at_level(logging.ERROR, logger="rlm.listener.tier.boundary"), \
            socket.create_connection(("127.0.0.1", proxied.listener.port), timeout=30) as sock, \
            socket.create_connection((host, int(port)), timeout=30) as broker:
        assert only_partition(fetch(sock, topic, [(0, TIERED + 2)])).error_code == ErrorCode.offset_not_available
        earliest = list_offsets(sock, topic, EARLIEST)
        assert (earliest.error_code, earliest.offset) == (ErrorCode.offset_not_available, -1), earliest
        assert REGISTRY.get_sample_value("rlm_history_tier_holes_total", {"topic": topic}) in (None, before)
        assert REGISTRY.get_sample_value("rlm_history_tier_holes_pending_total", {"topic": topic}) == pending + 1
        wait_for(lambda: only_partition(fetch(sock, topic, [(0, TIERED)])).error_code != ErrorCode.offset_not_available,
                 30, "the hole confirmed")
        for offset in (TIERED, TIERED + 2, start - 1):
            ours = only_partition(fetch(sock, topic, [(0, offset)]))
            kafkas = only_partition(fetch(broker, topic, [(0, offset)]))
            assert ours.error_code == 1 and ours == kafkas, offset  # OFFSET_OUT_OF_RANGE, the broker's very answer
        last = only_partition(fetch(sock, topic, [(0, TIERED - 1)]))
        assert last.error_code == 0 and _offsets(last.records, TIERED - 1) == [TIERED - 1]
        earliest = list_offsets(sock, topic, EARLIEST)
        assert (earliest.error_code, earliest.offset) == (0, start)
    holes = [(r.topic_partition, r.first_offset, r.last_offset_inclusive) for r in caplog.records  # type: ignore[attr-defined]
             if hasattr(r, "first_offset")]
    assert len(holes) == 1 and topic in holes[0][0] and holes[0][1:] == (TIERED, start - 1), holes
    assert REGISTRY.get_sample_value("rlm_history_tier_holes_total", {"topic": topic}) == before + 1

    c = Consumer({"bootstrap.servers": proxied.bootstrap, "group.id": f"h-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        offsets: list[int] = []
        deadline = time.monotonic() + 60
        while not offsets or offsets[-1] < TIERED + HOLE_AFTER - 1:
            assert time.monotonic() < deadline, offsets[-3:]
            for msg in c.consume(100, 0.5):
                if msg.error() is not None:
                    assert msg.error().code() in (KafkaError.OFFSET_OUT_OF_RANGE, KafkaError._AUTO_OFFSET_RESET), \
                        msg.error()
                    continue
                offsets.append(msg.offset())
                assert (msg.key(), msg.value()) == proxied.hole_sent[msg.offset()]
    finally:
        c.close()
    assert offsets == [*range(TIERED), *range(start, TIERED + HOLE_AFTER)]


@pytest.fixture
def held_proxy(proxied: Proxied, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Held]:
    """A second proxy of the broker, its metadata manager not caught up (:func:`held_listener`: its consumer held back
    before it reads a record, as a listener just started reads a long metadata topic, or all of it into an empty
    cache, until ``released``): the tier it sees is empty."""
    assert proxied.settings is not None
    with held_listener([proxied.settings], proxied.rsm, tmp_path / "held-cache", monkeypatch) as held:
        yield held


def _until_asked(api: str, times: int, c: Consumer) -> None:
    """Poll ``c`` until the proxies asked the broker ``api`` ``times`` more times; nothing may come meanwhile."""
    asked, deadline = _upstream_requests()[api], time.monotonic() + 60
    while _upstream_requests()[api] < asked + times:
        assert time.monotonic() < deadline, f"the consumer stopped asking ({api})"
        for msg in c.consume(100, 0.2):
            pytest.fail(f"while the tier is not read: {msg.error() or msg.offset()}")


def test_a_proxy_whose_metadata_is_not_read_yet_has_the_client_fetch_again_not_reset(
        proxied: Proxied, held_proxy: Held) -> None:
    """Through a proxy whose tier is not read yet (:func:`held_proxy`), a consumer positioned below the broker's log
    start (``auto.offset.reset=error``) is answered OFFSET_NOT_AVAILABLE, not the broker's OFFSET_OUT_OF_RANGE (which
    would reset it), and fetches again, the broker asked each time; once the manager has read the metadata, it reads
    every offset from there to the end, once (the tier's chain is not the empty one read while held)."""
    topic, start, end = proxied.topic, 5, proxied.end(0)
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{held_proxy.listener.port}", "group.id": f"n-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "error", "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    try:
        c.assign([TopicPartition(topic, 0, start)])
        _until_asked("fetch", 3, c)  # the first Fetch, and two more after it
        assert not held_proxy.caught_up(topic)  # the premise: held back all along
        held_proxy.released.set()
        got = consume_until(c, {(topic, 0): end})[(topic, 0)]
    finally:
        c.close()
    assert [r.offset for r in got] == list(range(start, end))
    assert all((r.key, r.value) == proxied.sent[(0, r.offset)] for r in got)


def test_earliest_through_a_proxy_whose_metadata_is_not_read_yet_is_asked_again_not_the_brokers(
        proxied: Proxied, held_proxy: Held) -> None:
    """Through a proxy whose tier is not read yet (:func:`held_proxy`), ListOffsets EARLIEST is OFFSET_NOT_AVAILABLE,
    not the broker's log start (a consumer reset to it would never read the tier's history); a consumer with no
    position and ``auto.offset.reset=earliest`` asks again, and once the manager has read the metadata it starts at
    0, the tier's first offset."""
    topic = proxied.topic
    with socket.create_connection(("127.0.0.1", held_proxy.listener.port), timeout=30) as sock:
        p = list_offsets(sock, topic, EARLIEST)
        assert (p.error_code, p.offset) == (ErrorCode.offset_not_available, -1), p
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{held_proxy.listener.port}", "group.id": f"e-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.wait.max.ms": 100})
    try:
        c.assign([TopicPartition(topic, 0)])
        _until_asked("list_offsets", 2, c)  # the consumer's EARLIEST, and once more after it
        assert not held_proxy.caught_up(topic)  # the premise: held back all along
        held_proxy.released.set()
        got = consume_until(c, {(topic, 0): LOG_START[0] + 5})[(topic, 0)]
    finally:
        c.close()
    assert [r.offset for r in got[:LOG_START[0] + 5]] == list(range(LOG_START[0] + 5))
    with socket.create_connection(("127.0.0.1", held_proxy.listener.port), timeout=30) as sock:
        p = list_offsets(sock, topic, EARLIEST)
        assert (p.error_code, p.offset) == (0, 0), p


def test_list_offsets_by_timestamp_below_the_log_start_is_the_tiers(proxied: Proxied) -> None:
    """A timestamp whose first record lies below the broker's log start is answered from the remote time indexes:
    that record's offset, its timestamp and leader epoch (the broker alone would answer its own first record at or
    after it, past its log start); one inside the broker's log and LATEST are the broker's."""
    c = Consumer({"bootstrap.servers": proxied.bootstrap, "group.id": f"t-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(proxied.topic, 0, 0)])
        recs = consume_until(c, {(proxied.topic, 0): LOG_START[0] + 5})[(proxied.topic, 0)]
    finally:
        c.close()
    stamps = {r.offset: r.timestamp for r in recs}
    host, port = proxied.kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)
    with socket.create_connection(("127.0.0.1", proxied.listener.port), timeout=30) as sock, \
            socket.create_connection((host, int(port)), timeout=30) as broker:
        for offset in (PER_ROUND + 5, LOG_START[0] - 1, LOG_START[0] + 2):
            ts = stamps[offset]
            want = min(o for o, t in stamps.items() if t >= ts)
            got = list_offsets(sock, proxied.topic, ts)
            assert (got.error_code, got.offset, got.leader_epoch) == (0, want, 0), offset
            assert got.timestamp == stamps[want]
            kafkas = list_offsets(broker, proxied.topic, ts)
            if want < LOG_START[0]:
                assert kafkas.offset >= LOG_START[0]  # what the broker alone says
            else:
                assert kafkas == got
        latest = list_offsets(sock, proxied.topic, -1)
        assert latest == list_offsets(broker, proxied.topic, -1)


def test_read_committed_across_the_boundary_gets_the_committed_records_each_once(proxied: Proxied) -> None:
    """txn: a committed and an aborted transaction begin in the tier and end in the broker's log, their markers never
    tiered (the tier sees both open at its end), the broker's log start between. A read_committed consumer group
    through the proxy gets exactly the committed records (plain ones and the committed transaction's), each once, in
    order; none of the aborted transaction's, on either side of the boundary."""
    txns = proxied.txns
    assert txns is not None
    c = Consumer({"bootstrap.servers": proxied.bootstrap, "group.id": f"rc-{uuid.uuid4().hex[:6]}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False, "isolation.level": "read_committed",
                  "fetch.wait.max.ms": 100, "session.timeout.ms": 6000})
    last = max(txns.committed)
    try:
        c.subscribe([proxied.txn_topic])
        got = consume_until(c, {(proxied.txn_topic, 0): last + 1}, settle_s=0.5)[(proxied.txn_topic, 0)]
    finally:
        c.close()
    assert [r.offset for r in got] == sorted(txns.committed)
    assert {r.offset: (r.key, r.value) for r in got} == txns.committed
    assert min(txns.aborted) < txns.log_start <= max(txns.aborted)  # the aborted one straddles the boundary


def test_kafkas_console_consumer_with_a_group_reads_every_offset_from_0(
        proxied: Proxied, tmp_path: Path) -> None:
    """Kafka's own console consumer (the Java client, ``--group --from-beginning``) whose only bootstrap server is the
    listener reads each partition from 0, through the tier and across the boundary to the broker's end: every offset
    once, byte-exact; its group's commits land on the broker."""
    ends = {p: proxied.end(p) for p in range(PARTITIONS)}
    group = f"console-{uuid.uuid4().hex[:6]}"
    field_end, record_end = "\x1f", "\x1d\n"
    args = ["--bootstrap-server", proxied.bootstrap, "--topic", proxied.topic, "--group", group, "--from-beginning",
            "--max-messages", str(sum(ends.values())), "--timeout-ms", "60000"]
    for prop in ("print.partition=true", "print.offset=true", "print.key=true", f"key.separator={field_end}",
                 f"line.separator={record_end}"):
        args += ["--formatter-property", prop]
    proc = subprocess.run(proxied.kafka.java_cmd("org.apache.kafka.tools.consumer.ConsoleConsumer", args,
                                                 log_dir=tmp_path), capture_output=True, timeout=180,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    got: dict[int, list[int]] = {p: [] for p in range(PARTITIONS)}
    for line in proc.stdout.split(record_end.encode())[:-1]:
        part, off, key, value = line.split(field_end.encode())
        p, o = int(part.removeprefix(b"Partition:")), int(off.removeprefix(b"Offset:"))
        got[p].append(o)
        assert (key, value) == proxied.sent[(p, o)], (p, o)
    assert got == {p: list(range(end)) for p, end in ends.items()}
    assert committed(proxied.kafka, group, proxied.topic) == ends


# ------------------------------------------------------------------------------------------------ config (no broker)
def test_proxy_is_off_by_default_and_keeps_no_sasl_users() -> None:
    assert HistoryListenerSettings().proxy is False
    with pytest.raises(ValidationError, match="passes SASL through to its broker"):  # test_proxy_sasl.py: the rest
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


def test_history_answers_keep_within_the_listeners_room_for_queued_answers(
        proxied: Proxied, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tier's part of a proxied Fetch is bounded by what is left of the listener's ``queued_max_response_bytes``
    (as the endpoint's answers are), whichever path answers it: the first Fetch below the broker's log start (the
    broker asked, its answer split) and the next ones (the tier alone). With almost no room left, each answer
    carries one batch (a consumer always progresses), however much its ``max_bytes`` asks; exact all the same."""
    monkeypatch.setattr(bounds, "BOUNDS_FRESH_S", 3600.0)
    server = proxied.listener.server
    monkeypatch.setattr(server, "_fetch_room", lambda: 1)
    topic = proxied.topic
    seen: list[int] = []
    with socket.create_connection(("127.0.0.1", proxied.listener.port), timeout=30) as sock:
        position = 0
        for _ in range(4):
            (t,) = fetch(sock, topic, [(0, position)], max_bytes=50 << 20).responses
            (part,) = t.partitions
            assert part.error_code == 0, (position, part)
            got = _offsets(part.records, position)
            assert 0 < len(got) <= 10, (position, got)  # one batch (the topic's batches hold up to 10 records)
            seen += got
            position = got[-1] + 1
    assert seen == list(range(len(seen)))


def test_a_proxied_fetch_holds_its_room_while_the_tier_is_read(proxied: Proxied,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """While the tier is read for a proxied Fetch (the broker's answer split, then the tier alone), the room it reads
    with is held of ``queued_max_response_bytes``: what its partitions can bring (their ``partition_max_bytes``), so
    a Fetch read meanwhile sees that much less room. Not held, concurrent proxied Fetches each saw all of the room
    and together read past the bound (found reading the code after r11: the endpoint's own Fetches held theirs)."""
    monkeypatch.setattr(bounds, "BOUNDS_FRESH_S", 3600.0)
    # no read-ahead: its reads are for the next Fetch, held within the read-ahead budget (tests below), not this room
    monkeypatch.setattr(proxy, "PREFETCHES_HELD", 0)
    server = proxied.listener.server
    bound = server.limits.queued_max_response_bytes
    seen: list[int] = []
    read = boundary.fetch

    def watched(*args: Any, **kwargs: Any) -> Any:
        seen.append(server._fetch_room())  # (an int read from a worker: the event loop's value at that moment)
        return read(*args, **kwargs)

    monkeypatch.setattr(boundary, "fetch", watched)
    pmb = 500  # under a batch of the topic's: one batch (10 records) a Fetch, each below the broker's log start
    with socket.create_connection(("127.0.0.1", proxied.listener.port), timeout=30) as sock:
        position = 0
        for _ in range(3):
            (t,) = fetch(sock, proxied.topic, [(0, position)], max_bytes=pmb).responses
            (part,) = t.partitions
            assert part.error_code == 0, (position, part)
            position = _offsets(part.records, position)[-1] + 1
    assert position < LOG_START[0], position  # all three were below the broker's log start
    assert len(seen) >= 2 and all(room <= bound - pmb for room in seen), (bound, seen)
    # all given back: the last answer's bytes leave the queued count once the event loop sees its socket took them,
    # which a loaded machine may run after the client has read it (CI: 673 bytes still queued)
    wait_for(lambda: server._reserved == 0 and server.queued_response_bytes() == 0, 10, "the room given back")


def test_answers_read_ahead_are_capped_in_the_process(proxied: Proxied, monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers read ahead from the tier for a client's next Fetch are held per connection until it comes: at most
    ``PREFETCHES_HELD`` in the whole process (clients that stop fetching cannot make the sidecar hold more). With a
    cap of 1, a second connection reading history while the first holds its read-ahead gets none; the first uses
    its own at its second and third Fetches: two used in all (four without the cap), every answer exact."""
    monkeypatch.setattr(bounds, "BOUNDS_FRESH_S", 3600.0)
    monkeypatch.setattr(proxy, "PREFETCHES_HELD", 1)
    port = proxied.listener.port
    used = REGISTRY.get_sample_value("rlm_history_proxy_prefetches_total", {"result": "used"}) or 0.0
    with socket.create_connection(("127.0.0.1", port), timeout=30) as a, \
            socket.create_connection(("127.0.0.1", port), timeout=30) as b:
        positions = {a: 0, b: 0}
        seen: dict[socket.socket, list[int]] = {a: [], b: []}
        for sock in (a, a, b, b, b, a):  # a holds a read-ahead from its first Fetch on; b's are refused
            (t,) = fetch(sock, proxied.topic, [(0, positions[sock])], max_bytes=400).responses
            (part,) = t.partitions
            assert part.error_code == 0, part
            got = _offsets(part.records, positions[sock])
            assert got
            seen[sock] += got
            positions[sock] = got[-1] + 1
        assert seen[a] == list(range(len(seen[a]))) and seen[b] == list(range(len(seen[b])))
    used = (REGISTRY.get_sample_value("rlm_history_proxy_prefetches_total", {"result": "used"}) or 0.0) - used
    assert used == 2


def test_answers_read_ahead_hold_no_more_block_memory_than_the_budget(proxied: Proxied,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers read ahead hold their records as views of whole block buffers until the next Fetch comes; what they
    hold in all stays within the proxy's budget (:mod:`rlm.listener.tier.held`; the block cache's capacity). The
    budget set here to what the first connection's answer read ahead holds (its block) plus 2 KiB: the next
    connections, each reading another segment, get theirs copied out (a batch or two) or not held at all. The
    block buffers (and copies) the held answers' records keep alive, measured from the records, never pass it,
    and are what the gauge says; every answer, read ahead or again, is exact."""
    monkeypatch.setattr(bounds, "BOUNDS_FRESH_S", 3600.0)
    gc.collect()  # connections of earlier tests: their answers read ahead let go
    ahead = proxied.listener.server.router.proxy
    assert ahead is not None and ahead.held.total == 0
    copied = REGISTRY.get_sample_value("rlm_history_read_ahead_held_total", {"how": "copied"}) or 0.0
    port = proxied.listener.port
    starts = [(0, 0), (0, PER_ROUND + 2), (1, 0), (0, 3)]  # three segments (and the first again)
    socks = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in starts]
    try:
        positions = dict(zip(socks, starts, strict=True))
        for i, sock in enumerate(socks * 2):
            p, position = positions[sock]
            (t,) = fetch(sock, proxied.topic, [(p, position)], max_bytes=400).responses
            (part,) = t.partitions
            got = _records(part.records, position)
            assert part.error_code == 0 and got and list(got) == list(range(position, max(got) + 1)), (position, got)
            assert all(proxied.sent[(p, o)] == kv for o, kv in got.items()), position
            positions[sock] = (p, max(got) + 1)
            # the next answer is read ahead once this one is handed to the socket (ChunkedAnswer.then): an answer
            # to ApiVersions on the connection says it has been (a connection's requests are served in turn)
            assert call(sock, 18, 0, {}) is not None
            held = _held_by(ahead.prefetched)
            assert held == ahead.held.total == REGISTRY.get_sample_value("rlm_history_read_ahead_held_bytes")
            if i == 0:
                assert held > 0
                monkeypatch.setattr(ahead.held, "budget_bytes", held + 2048)
            assert held <= ahead.held.budget_bytes, (i, held)
    finally:
        for sock in socks:
            sock.close()
    assert (REGISTRY.get_sample_value("rlm_history_read_ahead_held_total", {"how": "copied"}) or 0.0) > copied


def _records(records: bytes | None, position: int) -> dict[int, tuple[bytes | None, bytes | None]]:
    """The records at or past ``position`` of the whole batches ``records``: offset -> (key, value)."""
    out = {}
    data = memoryview(records or b"")
    pos = 0
    while pos + 12 <= len(data):
        size = 12 + int.from_bytes(data[pos + 8:pos + 12], "big")
        if pos + size > len(data):
            break
        batch = data[pos:pos + size]
        out.update((r.offset, (r.key, r.value)) for r in decode_records(header_from_bytes(batch), batch)
                   if r.offset >= position)
        pos += size
    return out


def _held_by(prefetched: Any) -> int:
    """Bytes the answers read ahead keep alive, from their records: every distinct buffer their parts view, once
    (a copy is a buffer of its own); answers not held (their read raised) hold nothing."""
    bases: dict[int, int] = {}
    for pf in list(prefetched):
        try:
            values = pf.values.result(30).values
        except Exception:  # noqa: BLE001 - not held: read again when its Fetch comes
            continue
        for t in values["responses"] if values else ():
            for p in t["partitions"]:
                for part in getattr(p["records"], "parts", ()):
                    bases[id(part.obj)] = memoryview(part.obj).nbytes
    return sum(bases.values())
