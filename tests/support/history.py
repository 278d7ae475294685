"""The history endpoint's test set-up: a real broker, an in-process sidecar that tiers, the endpoint on top.

:func:`served_history` (the ``history`` fixture of tests/rlm/listener, module-scoped: each module gets one)
produces the topics below on the session broker, tiers them with an in-process :class:`~rlm.sidecar.Sidecar`,
starts :func:`rlm.listener.start_listener` on a free port of 127.0.0.1, and waits until the endpoint serves every
produced offset. Then the broker gives up its own copy of the
static topics: ``retention.bytes=1`` (its retention task deletes the segments, every second from the broker's start:
the ``kafka`` fixture's ``LOG_TASKS_FROM_START``) and, at once, DeleteRecords to the tier's end; the broker's log start
offset is asserted past every offset tiered: what the tests read can only come from the remote tier.

Topics (names ``hist-<tag>-<what>``), with what was produced kept as :class:`~tests.support.clients.Rec` (offset,
timestamp, key, value, headers as the producer's delivery reports give them):

- ``main``: 5 partitions, partition ``p`` produced with codec ``CODECS[p]``; two segments of 60 records each (rounds
  60 s apart in CreateTime, records 2 ms apart: a timestamp between two records exists); null keys, null and empty
  values, binary values, headers (duplicate keys, a null header value) on some records; batches of at most 20.
- ``big``: a small record, one of ``BIG_BYTES`` (random, incompressible), another small one.
- ``txn``: two rounds of a committed transaction, an aborted one and plain records.
- ``open``: plain records, then a transaction whose records end the segment; the segment rolls and is tiered, its
  COMMIT marker is in the active segment: at the tier's end the transaction is still undecided (the producer snapshot
  uploaded with the segment says it is open).
- ``lat``: LogAppendTime, three segments produced 0.4 s apart.
- ``tail``: like ``open``, but kept for the test that extends it (a waiting consumer gets what is tiered next); the
  broker keeps its local log (no retention change), since that test rolls and tiers more of it.
- ``trim``: three segments, the first two older than the sidecar's remote retention for it: the tier starts at
  the third (offsets below it are out of range).
- ``empty``: served (the topic selection tiers it) but never produced to: nothing remote.
- ``excluded`` (``topics.exclude``) and ``compacted`` (``cleanup.policy=compact``): never tiered, never served.
"""
from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from devtools.devkafka import KafkaCluster
from rlm.listener import Listener, start_listener
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.support.clients import Rec, producer, send
from tests.support.kafka import CODECS, broker_watermarks, set_topic_config
from tests.support.sidecar import make_settings, wait_for
from tests.support.txn import TxnProducer

__all__ = ["BIG_BYTES", "SEGMENT_MS", "HistorySetup", "served_history"]

BIG_BYTES = 4 * 1024 * 1024 + 123
MAIN_ROUNDS, MAIN_PER_ROUND = 2, 60
SEGMENT_MS = 300


@dataclass
class HistorySetup:
    kafka: KafkaCluster
    sidecar: Sidecar
    history: Listener
    tag: str
    ids: dict[str, uuid.UUID]  # topic name -> topic id
    produced: dict[tuple[str, int], list[Rec]]  # what the tier holds, per (topic, partition)
    aborted: set[int]  # offsets of txn's aborted records
    open_txn: dict[str, tuple[int, int]]  # open/tail: (first offset of the undecided transaction, tier's end + 1)
    base_ts: int  # main's first CreateTime timestamp
    tail_after: list[Rec]  # tail's records after its transaction (in the broker's active segment: not tiered)
    consumers: list[Consumer] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.history.port}"

    def topic(self, what: str) -> str:
        return f"hist-{self.tag}-{what}"

    def tp(self, what: str, partition: int = 0) -> TopicIdPartition:
        name = self.topic(what)
        return TopicIdPartition(self.ids[name], name, partition)

    def recs(self, what: str, partition: int = 0) -> list[Rec]:
        return self.produced[(self.topic(what), partition)]

    def consumer(self, **conf: Any) -> Consumer:
        """A confluent-kafka consumer of the endpoint (closed at teardown); ``assign()`` it."""
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": f"unused-{uuid.uuid4().hex[:6]}",
                      "enable.auto.commit": False, "enable.auto.offset.store": False, "check.crcs": True,
                      "fetch.wait.max.ms": 100, "topic.metadata.refresh.interval.ms": 5000,
                      "api.version.request.timeout.ms": 5000, **conf})
        self.consumers.append(c)
        return c

    def tier_bounds(self, what: str, partition: int = 0) -> tuple[int, int, int]:
        """(log start offset, high watermark, last stable offset) as the endpoint sees them now."""
        tier = self.history.server.router.ctx.tier
        tp = self.tp(what, partition)
        tier.refresh([tp])
        t = tier.partition(tp)
        assert t is not None, f"{tp}: nothing remote"
        return t.log_start_offset, t.high_watermark, t.last_stable_offset


def main_record(p: int, r: int, i: int, base_ts: int
                ) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None, int]:
    """Record ``i`` of round ``r`` of main-``p``: some null keys, null and empty values, headers."""
    key = None if i % 9 == 4 else f"k{p}-{r}-{i}".encode()
    value: bytes | None = (f"v{p}.{r}.{i}|".encode() * (3 + i % 30)
                           + bytes((i * 7 + j * 13 + p) % 256 for j in range(i % 50)))
    if i % 13 == 6:
        value = None
    elif i % 13 == 7:
        value = b""
    headers: list[tuple[str, bytes | None]] | None = None
    if i % 5 == 2:
        headers = [("h", bytes([i % 256, 0, 0xFF])), ("dup", b"a"), ("dup", b"b"), ("null", None), ("empty", b"")]
    return key, value, headers, base_ts + r * 60_000 + 2 * i


def _open_at_end(kafka: KafkaCluster, topic: str, tag: str) -> tuple[list[Rec], int, list[Rec]]:
    """Plain records, a transaction's records, a roll (plain records), the COMMIT marker: the segment ending with
    the transaction is rolled (and tiered: below the broker's last stable offset once committed), the marker stays
    in the active segment. Returns (the records that get tiered, the transaction's first offset, the records after
    the roll: not tiered while that segment is active)."""
    plain = producer(kafka)
    first = send(plain, topic, 0, [(f"{tag}-p{i}".encode(), f"{tag}-plain-{i}".encode(), None, 0)
                                   for i in range(10)])
    tx = TxnProducer(kafka, topic)
    tx.p.begin_transaction()
    txn = send(tx.p, topic, 0, [(f"{tag}-t{i}".encode(), f"{tag}-txn-{i}".encode() * 3, None, 0)
                                for i in range(10)])
    time.sleep(SEGMENT_MS / 1000 + 0.1)
    after = send(plain, topic, 0, [(f"{tag}-q{i}".encode(), f"{tag}-after-{i}".encode(), None, 0)
                                   for i in range(5)])
    tx.p.commit_transaction(30)
    assert after[0].offset == txn[-1].offset + 1
    return first + txn, txn[0].offset, after


def served_history(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HistorySetup]:
    """The topics of this module's docstring, tiered, served by the endpoint, gone from the broker (see above); the
    generator of the ``history`` fixture (tests/rlm/listener/conftest.py)."""
    tmp: Path = tmp_path_factory.mktemp("history")
    tag = uuid.uuid4().hex[:6]

    def name(what: str) -> str:
        return f"hist-{tag}-{what}"

    seg = {"segment.ms": str(SEGMENT_MS)}
    ids = {
        name("main"): kafka.create_topic(name("main"), len(CODECS), config=seg),
        name("big"): kafka.create_topic(name("big"), 1, config={
            **seg, "max.message.bytes": str(16 << 20), "segment.bytes": str(32 << 20)}),
        name("txn"): kafka.create_topic(name("txn"), 1, config=seg),
        name("open"): kafka.create_topic(name("open"), 1, config=seg),
        name("lat"): kafka.create_topic(name("lat"), 1, config={**seg, "message.timestamp.type": "LogAppendTime"}),
        name("trim"): kafka.create_topic(name("trim"), 1, config=seg),
        name("tail"): kafka.create_topic(name("tail"), 1, config=seg),
        name("empty"): kafka.create_topic(name("empty"), 1, config=seg),
        name("excluded"): kafka.create_topic(name("excluded"), 1, config=seg),
        name("compacted"): kafka.create_topic(name("compacted"), 1, config={**seg, "cleanup.policy": "compact"}),
    }
    produced: dict[tuple[str, int], list[Rec]] = {}
    plain = producer(kafka)

    # main: one codec per partition, two segments each (rounds 60 s apart in CreateTime roll by themselves).
    base_ts = (int(time.time() * 1000) - 3_600_000) // 1000 * 1000
    for p, codec in enumerate(CODECS):
        prod = producer(kafka, **{"compression.type": codec, "batch.num.messages": 20})
        produced[(name("main"), p)] = send(prod, name("main"), p, [
            main_record(p, r, i, base_ts) for r in range(MAIN_ROUNDS) for i in range(MAIN_PER_ROUND)])

    # big: one record of several MiB between two small ones.
    prod = producer(kafka, **{"message.max.bytes": 32 << 20})
    produced[(name("big"), 0)] = send(prod, name("big"), 0, [
        (b"before", b"small-1", [("h", b"1")], 0),
        (b"big", os.urandom(BIG_BYTES), [("size", str(BIG_BYTES).encode())], 0),
        (None, b"small-2", None, 0)])

    # txn: committed and aborted transactions, plain records in between, a segment per round.
    tx = TxnProducer(kafka, name("txn"))
    recs: list[Rec] = []
    aborted: set[int] = set()
    for r in range(2):
        for what, commit, n in (("c", True, 30), ("a", False, 20)):
            tx.p.begin_transaction()
            got = send(tx.p, name("txn"), 0, [(f"{what}{r}-{i}".encode(), f"{what}{r}-value-{i}".encode() * 4,
                                                [("txn", what.encode())], 0) for i in range(n)])
            (tx.p.commit_transaction if commit else tx.p.abort_transaction)(30)
            recs += got
            if not commit:
                aborted |= {x.offset for x in got}
        recs += send(plain, name("txn"), 0, [(f"p{r}-{i}".encode(), f"p{r}-plain-{i}".encode(), None, 0)
                                             for i in range(10)])
        time.sleep(SEGMENT_MS / 1000 + 0.1)
    produced[(name("txn"), 0)] = recs
    del tx

    # open / tail: a transaction undecided at the tier's end.
    ends: dict[tuple[str, int], int] = {}
    open_txn: dict[str, tuple[int, int]] = {}
    tail_after: list[Rec] = []
    for what in ("open", "tail"):  # tail last: tail_after is tail's
        recs, first, tail_after = _open_at_end(kafka, name(what), what)
        produced[(name(what), 0)] = recs
        open_txn[what] = (first, tail_after[0].offset)
        ends[(name(what), 0)] = tail_after[0].offset

    # lat: LogAppendTime, three segments.
    recs = []
    for r in range(3):
        recs += send(plain, name("lat"), 0, [(f"l{r}-{i}".encode(), f"lat-{r}-{i}".encode(), None, 0)
                                             for i in range(10)])
        time.sleep(SEGMENT_MS / 1000 + 0.1)
    produced[(name("lat"), 0)] = recs

    # trim: three segments, the first two older than the sidecar's remote retention for it (30 min): the tier
    # starts at the third.
    now = int(time.time() * 1000)
    recs = []
    for r, ts in enumerate((now - 50 * 60_000, now - 45 * 60_000, 0)):
        recs += send(plain, name("trim"), 0, [(f"t{r}-{i}".encode(), f"trim-{r}-{i}".encode(), None,
                                               ts and ts + i) for i in range(10)])
    produced[(name("trim"), 0)] = recs[20:]

    # never served: an excluded topic and a compacted one, with data and a rolled segment each.
    for what in ("excluded", "compacted"):
        send(plain, name(what), 0, [(f"x{i}".encode(), b"x", None, 0) for i in range(5)])
    # One record "now" per partition rolls the segment holding what came before (open / tail keep theirs); the
    # tier ends below it (the last record produced may be followed by a transaction marker).
    time.sleep(SEGMENT_MS / 1000 + 0.1)
    for what in ("main", "big", "txn", "lat", "trim", "excluded", "compacted"):
        for part in range(len(CODECS)) if what == "main" else (0,):
            (roll,) = send(plain, name(what), part, [(b"__roll__", b"r", None, 0)])
            ends[(name(what), part)] = roll.offset
    del plain

    settings = make_settings(
        kafka, tmp, topics={"include": [f"hist-{tag}-.*"], "exclude": [f"hist-{tag}-excluded"]},
        retention=[{"pattern": name("trim"), "retention_ms": 30 * 60_000, "retention_bytes": -1},
                   {"pattern": ".*", "retention_ms": -1, "retention_bytes": -1}],
        history_listener={"host": "127.0.0.1", "port": 0, "fetch_poll_ms": 100,
                          "authorization": {"allow_if_no_authorizer": True},  # the test cluster has no authorizer
                          "fetch_max_wait_ms": 30_000})  # the max_wait tests ask for more than the default cap
    sidecar = Sidecar(settings).start()
    history: Listener | None = None
    setup: HistorySetup | None = None
    try:
        history = start_listener(settings, sidecar.rsm)
        setup = HistorySetup(kafka, sidecar, history, tag, ids, produced, aborted, open_txn, base_ts, tail_after)
        tier = history.server.router.ctx.tier
        for (topic, part), recs in produced.items():
            tp = TopicIdPartition(ids[topic], topic, part)
            end, start = ends[(topic, part)], recs[0].offset

            def served(tp: TopicIdPartition = tp, start: int = start, end: int = end) -> bool:
                tier.refresh([tp])
                t = tier.partition(tp)
                return t is not None and (t.log_start_offset, t.high_watermark) == (start, end)
            wait_for(served, 60, f"the endpoint to serve {tp} from {start} to {end}")
        # The broker deletes its own copy of the static topics (retention.bytes) and, at once, moves its log start
        # offset past them (DeleteRecords): what the tests read can only come from the remote tier.
        static = [name(w) for w in ("main", "big", "txn", "open", "lat", "trim")]
        set_topic_config(kafka, static, retention_bytes="1")
        admin = AdminClient(kafka.admin_config())
        gone = [TopicPartition(t, p, ends[(t, p)]) for (t, p) in produced if t in static]
        for fut in admin.delete_records(gone).values():
            fut.result(30)
        for tp in gone:
            assert broker_watermarks(kafka, tp.topic, tp.partition)[0] == tp.offset, tp
        yield setup
    finally:
        if setup is not None:
            for c in setup.consumers:
                c.close()
        if history is not None:
            history.stop()
        sidecar.stop()
