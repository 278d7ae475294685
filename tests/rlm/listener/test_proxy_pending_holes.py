"""A range below the broker's log start that the sidecar is still tiering is no hole (``history_listener.proxy``,
:class:`rlm.listener.tier.boundary.Holes`): the broker's local retention may delete a rolled segment before its copy
(the sidecar staged it, :mod:`rlm.tasks.staging`), and until the copy lands, and the listener has read it, a Fetch
there and ListOffsets EARLIEST are OFFSET_NOT_AVAILABLE (clients ask again), not the broker's OFFSET_OUT_OF_RANGE and
log start (a consumer reset there skips what is tiered seconds later). Against the real broker, with the copy of the
staged segment held back while retention deletes it; the rules themselves (staged ranges, the grace, a range that
changes) with a clock of the test's."""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from prometheus_client import REGISTRY
from pydantic import ValidationError

from devtools.devkafka import KafkaCluster
from rlm.config import HistoryListenerSettings
from rlm.listener import start_listener
from rlm.listener.protocol.codec import ErrorCode
from rlm.listener.tier.boundary import Hole, Holes
from rlm.sidecar import Sidecar
from rlm.tasks.staging import staged_ranges, staging_roots
from rlmm.api import TopicIdPartition
from rsm.manager import RemoteStorageManager
from tests.rlm.listener.raw_wire import EARLIEST, fetch, list_offsets, only_partition
from tests.support.clients import consume_until, librdkafka_log
from tests.support.kafka import broker_watermarks, produce
from tests.support.sidecar import copy_state, latest_remote, make_settings, only, produce_segments, wait_for

TP = TopicIdPartition(uuid.uuid4(), "t", 0)
FUTURE_MS = 600_000
CONFIRM_MS = 3000  # the test's hole_confirm_ms: the consumer waits past it while the copy is held; after the copy
# lands, the listener's own lag (its metadata manager, its tier view's 0.5 s) must stay within it


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _parse_failures(lines: list[str]) -> list[str]:
    """librdkafka's lines (:func:`tests.support.clients.librdkafka_log`) of answers it could not parse: a null where
    it wants empty records makes it drop the whole answer."""
    return [line for line in lines if "parse failure" in line or "MessageSetSize" in line]


def _tier(high_watermark: int) -> Any:
    return SimpleNamespace(tp=TP, high_watermark=high_watermark)


def _sample(name: str) -> float:
    return REGISTRY.get_sample_value(name, {"topic": TP.topic}) or 0.0


def test_a_range_is_a_hole_once_nothing_staged_covers_it_for_the_grace() -> None:
    staged: list[tuple[int, int]] = [(40, 59), (60, 79)]
    clock = Clock()
    holes = Holes(5.0, lambda tp: list(staged), clock=clock)
    before = (_sample("rlm_history_tier_holes_pending_total"), _sample("rlm_history_tier_holes_total"))
    assert holes.check(_tier(90), 90, "fetch") is Hole.NONE  # the tier reaches the log start
    assert holes.check(_tier(40), 80, "fetch") is Hole.PENDING  # 40..79, staged
    clock.now += 60
    assert holes.check(_tier(40), 80, "fetch") is Hole.PENDING  # staged still: no grace runs meanwhile
    staged.clear()  # the copy landed and the staging was released; the listener has not read the copy yet
    assert holes.check(_tier(40), 80, "fetch") is Hole.PENDING  # the grace starts now
    clock.now += 4.9
    assert holes.check(_tier(40), 80, "list_offsets") is Hole.PENDING
    clock.now += 0.1
    assert holes.check(_tier(40), 80, "fetch") is Hole.CONFIRMED
    assert holes.check(_tier(40), 80, "fetch") is Hole.CONFIRMED
    # one pending range, one hole: each counted once
    assert (_sample("rlm_history_tier_holes_pending_total"), _sample("rlm_history_tier_holes_total")) == (
        before[0] + 1, before[1] + 1)
    # the broker's log start moved on: the same hole, grown at its end (not counted again)
    assert holes.check(_tier(40), 100, "fetch") is Hole.CONFIRMED
    staged.append((30, 45))  # a staged segment overlapping the range (from its first offset) holds it again
    assert holes.check(_tier(40), 100, "fetch") is Hole.PENDING
    staged[:] = [(10, 39), (100, 120)]  # none overlapping 40..99: the grace starts again
    assert holes.check(_tier(40), 100, "fetch") is Hole.PENDING
    clock.now += 5
    assert holes.check(_tier(40), 100, "fetch") is Hole.CONFIRMED
    # the same range all along (partition and first offset 40): counted once, pending and as a hole
    assert (_sample("rlm_history_tier_holes_pending_total"), _sample("rlm_history_tier_holes_total")) == (
        before[0] + 1, before[1] + 1)


def _lines(caplog: pytest.LogCaptureFixture, tp: TopicIdPartition) -> list[tuple[str, int, int]]:
    """The hole lines logged of ``tp``: (level, first offset, last offset)."""
    return [(r.levelname, r.first_offset, r.last_offset_inclusive) for r in caplog.records  # type: ignore[attr-defined]
            if r.name == "rlm.listener.tier.boundary" and getattr(r, "topic_partition", None) == str(tp)]


def test_a_growing_range_is_counted_and_logged_once_pending_and_once_a_hole(caplog: pytest.LogCaptureFixture) -> None:
    """The broker's log start moves on every second while the tier ends at 40, before and after the range is
    confirmed: one pending range and one hole (by partition and first offset), the pending line with the range as
    first met (40..79), the hole's with its range when confirmed (40..129). Keyed by both offsets, each end met was
    counted and logged again (5 pending, 3 holes here). The tier reading more (ending at 60) is another range."""
    caplog.set_level(logging.WARNING, logger="rlm.listener.tier.boundary")
    clock = Clock()
    holes = Holes(5.0, lambda tp: [], clock=clock)
    before = (_sample("rlm_history_tier_holes_pending_total"), _sample("rlm_history_tier_holes_total"))
    start = 80
    for _ in range(5):  # 100 .. 104 s, the log start 80 .. 120
        assert holes.check(_tier(40), start, "fetch") is Hole.PENDING
        clock.now, start = clock.now + 1, start + 10
    for _ in range(3):  # confirmed at 105 s (40..129), then it grows on
        assert holes.check(_tier(40), start, "fetch") is Hole.CONFIRMED
        clock.now, start = clock.now + 1, start + 10
    assert (_sample("rlm_history_tier_holes_pending_total"), _sample("rlm_history_tier_holes_total")) == (
        before[0] + 1, before[1] + 1)
    assert _lines(caplog, TP) == [("WARNING", 40, 79), ("ERROR", 40, 129)]
    assert holes.check(_tier(60), start, "fetch") is Hole.PENDING  # the tier read a copy: 60.., a new range
    clock.now += 5
    assert holes.check(_tier(60), start + 10, "fetch") is Hole.CONFIRMED
    assert (_sample("rlm_history_tier_holes_pending_total"), _sample("rlm_history_tier_holes_total")) == (
        before[0] + 2, before[1] + 2)
    assert _lines(caplog, TP)[2:] == [("WARNING", 60, start - 1), ("ERROR", 60, start + 9)]


def test_an_empty_tiers_confirmed_range_is_logged_once_and_not_counted_as_a_hole(
        caplog: pytest.LogCaptureFixture) -> None:
    """Nothing of the partition remote, the broker's log start moving on every second: one pending line (0..19, as
    first met), then, once confirmed, one line with its range then (0..69), "nothing ... remote", at WARNING (not a
    hole's ERROR: tiering may have begun after the broker's retention ran), whatever it grows to later; one pending
    range counted, no hole. Until session 24 the pending line was its last. Another partition's is its own."""
    caplog.set_level(logging.WARNING, logger="rlm.listener.tier.boundary")
    clock = Clock()
    holes = Holes(5.0, lambda tp: [], clock=clock)
    before = (_sample("rlm_history_tier_holes_pending_total"), _sample("rlm_history_tier_holes_total"))
    start = 20
    for i in range(8):  # 100 .. 107 s, the log start 20 .. 90: confirmed at 105 s (0..69)
        assert holes.check(None, start, "fetch", tp=TP) is (Hole.CONFIRMED if i >= 5 else Hole.PENDING), i
        clock.now, start = clock.now + 1, start + 10
    assert (_sample("rlm_history_tier_holes_pending_total"), _sample("rlm_history_tier_holes_total")) == (
        before[0] + 1, before[1])
    assert _lines(caplog, TP) == [("WARNING", 0, 19), ("WARNING", 0, 69)]
    confirmed = [r for r in caplog.records if getattr(r, "topic_partition", None) == str(TP)][1]
    assert "nothing of this partition is remote" in confirmed.getMessage()
    assert confirmed.offsets == 70 and confirmed.api == "fetch"  # type: ignore[attr-defined]
    other = TopicIdPartition(uuid.uuid4(), "t", 1)
    assert holes.check(None, 30, "list_offsets", tp=other) is Hole.PENDING
    clock.now += 5
    assert holes.check(None, 30, "list_offsets", tp=other) is Hole.CONFIRMED
    assert _lines(caplog, other) == [("WARNING", 0, 29), ("WARNING", 0, 29)]


def test_a_range_that_grows_at_its_end_keeps_its_clock() -> None:
    """The broker's retention moves its log start every second (a segment deleted each time) while the tier ends at
    40: the range from 40 to the log start grows at its end at every check. It is a hole ``confirm_s`` after 40 was
    first met with nothing staged over the range, whatever its end: were its grace to start again at every move (the
    range keyed by both its offsets), it would stay pending for ever and a consumer at 40 be told to ask again without
    end. A staged segment over the new end holds it pending and starts its clock again once gone (fail closed: never a
    hole while a staged segment overlaps it); a stale, lower log start does not restart it; the tier reading more
    (ending at 60) makes a new range, with its own clock; so does a tier with nothing remote (from 0)."""
    staged: list[tuple[int, int]] = []
    clock = Clock()
    holes = Holes(5.0, lambda tp: list(staged), clock=clock)
    start = 80
    for _ in range(5):  # 100 .. 104 s, the log start 80 .. 120
        assert holes.check(_tier(40), start, "fetch") is Hole.PENDING, (clock.now, start)
        clock.now, start = clock.now + 1, start + 10
    assert holes.check(_tier(40), start, "list_offsets") is Hole.CONFIRMED  # 105 s, 40..129
    staged.append((130, 139))  # rolled and staged, then deleted by the broker before its copy
    start = 140
    assert holes.check(_tier(40), start, "fetch") is Hole.PENDING
    staged.clear()  # copied: the listener reads it within the grace
    assert holes.check(_tier(40), start, "fetch") is Hole.PENDING
    clock.now += 4.9
    assert holes.check(_tier(40), start + 10, "fetch") is Hole.PENDING
    clock.now += 0.1
    assert holes.check(_tier(40), start + 20, "fetch") is Hole.CONFIRMED
    assert holes.check(_tier(40), start, "fetch") is Hole.CONFIRMED  # a log start asked before the last move
    assert holes.check(_tier(60), start + 20, "fetch") is Hole.PENDING  # the tier read a copy: 60.., from now
    clock.now += 4.9
    assert holes.check(_tier(60), start + 30, "fetch") is Hole.PENDING
    clock.now += 0.1
    assert holes.check(_tier(60), start + 40, "fetch") is Hole.CONFIRMED
    empty = TopicIdPartition(uuid.uuid4(), "t", 1)
    for i in range(6):  # nothing remote: 0.., its log start moving every second
        want = Hole.CONFIRMED if i == 5 else Hole.PENDING
        assert holes.check(None, 20 + 10 * i, "fetch", tp=empty) is want, i
        clock.now += 1


def test_without_grace_or_staging_a_range_is_a_hole_at_once() -> None:
    assert Holes().check(_tier(40), 80, "fetch") is Hole.CONFIRMED
    assert Holes(0.0, lambda tp: [(40, 79)]).check(_tier(40), 80, "fetch") is Hole.PENDING


def test_a_staging_dir_that_cannot_be_listed_confirms_nothing() -> None:
    def unreadable(tp: TopicIdPartition) -> list[tuple[int, int]]:
        raise PermissionError(13, "Permission denied")
    clock = Clock()
    holes = Holes(5.0, unreadable, clock=clock)
    assert holes.check(_tier(40), 80, "fetch") is Hole.PENDING
    clock.now += 60
    assert holes.check(_tier(40), 80, "fetch") is Hole.PENDING


def test_an_empty_tier_below_the_log_start_is_pending_and_then_no_hole_counted() -> None:
    """Nothing of the partition remote: everything below the broker's log start is pending while staged and for the
    grace; then the broker's answers stand, as for a partition whose tiering began after its retention ran: not
    counted as a hole (its line: test_an_empty_tiers_confirmed_range_is_logged_once_and_not_counted_as_a_hole)."""
    staged: list[tuple[int, int]] = [(0, 9)]
    clock = Clock()
    holes = Holes(5.0, lambda tp: list(staged), clock=clock)
    before = _sample("rlm_history_tier_holes_total")
    assert holes.check(None, 0, "list_offsets", tp=TP) is Hole.NONE  # the broker's log starts at 0
    assert holes.check(None, 20, "fetch", tp=TP) is Hole.PENDING
    staged.clear()
    assert holes.check(None, 20, "fetch", tp=TP) is Hole.PENDING
    clock.now += 5
    assert holes.check(None, 20, "list_offsets", tp=TP) is Hole.CONFIRMED
    assert _sample("rlm_history_tier_holes_total") == before


def test_hole_confirm_ms_defaults_to_30_s_and_is_validated() -> None:
    assert HistoryListenerSettings(proxy=True).hole_confirm_ms == 30_000
    assert HistoryListenerSettings(proxy=True, hole_confirm_ms=0).hole_confirm_ms == 0
    for bad in (-1, 3_600_001):
        with pytest.raises(ValidationError, match="hole_confirm_ms"):
            HistoryListenerSettings(proxy=True, hole_confirm_ms=bad)


class HeldRsm(RemoteStorageManager):
    """The real storage manager whose copies of segments from ``hold_from`` on wait for ``release``."""

    hold_from: int
    held: threading.Event
    release: threading.Event

    def copy_log_segment_data(self, segment_metadata, data, **kw):  # type: ignore[no-untyped-def]
        if segment_metadata.start_offset >= self.hold_from and not self.release.is_set():
            self.held.set()
            self.release.wait(120)
        return super().copy_log_segment_data(segment_metadata, data, **kw)


@pytest.mark.parametrize("first_copied", [True, False], ids=["tier", "empty_tier"])
def test_a_segment_retention_deleted_while_staged_is_read_once_copied_no_reset(
        kafka: KafkaCluster, topic_name: str, tmp_path: Path, first_copied: bool) -> None:
    """The broker's retention deletes each rolled segment within ~1-2 s (retention 500 ms, checked every second from
    the broker's start: the ``kafka`` fixture's ``LOG_TASKS_FROM_START``); the sidecar stages it at its roll. The
    first segment is copied (``empty_tier``: none); the next ones' copy is held back, and retention deletes them:
    the tier ends below the broker's log start, and the staging covers the difference. Through the proxy a Fetch
    there and EARLIEST are OFFSET_NOT_AVAILABLE, past ``hole_confirm_ms`` too (staged), and a consumer with
    ``auto.offset.reset=error`` positioned at 0 reads the tier's records and then waits, never reset, and one with no
    position and ``earliest`` waits too (EARLIEST asked again); once the copy is let go both read every offset to the
    end, once. (Without the staging check: OFFSET_OUT_OF_RANGE, and the
    consumer's reset error.)"""
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300", "retention.ms": "500",
                                                          "file.delete.delay.ms": "1000"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name), history_listener={
        "host": "127.0.0.1", "port": 0, "proxy": True, "authorization": {"allow_if_no_authorizer": True},
        "hole_confirm_ms": CONFIRM_MS})
    rsm = HeldRsm(settings.store)
    rsm.held, rsm.release, rsm.hold_from = threading.Event(), threading.Event(), 1 << 62 if first_copied else 0
    with Sidecar(settings, rsm=rsm) as sidecar:
        listener = None
        try:
            wait_for(lambda: sidecar.health()[1]["leading"] == 1, 30, "the sidecar to lead the partition")
            sent: dict[int, tuple[bytes, bytes]] = {}
            if first_copied:
                sent = produce_segments(kafka, topic_name, 1, 20, segment_ms=300)
                wait_for(lambda: latest_remote(sidecar, tp) >= 19, 30, "the first segment copied",
                         detail=lambda: copy_state(sidecar, tp))
            tiered = latest_remote(sidecar, tp) + 1
            rsm.hold_from = tiered
            sent.update(produce_segments(kafka, topic_name, 2, 20, segment_ms=300, roll=False))
            # the roll, by a record timestamped ahead: the segment it starts neither rolls nor is deleted by retention
            roll = (b"ahead", b"a", None, int(time.time() * 1000) + FUTURE_MS)
            ((_p, active),) = produce(kafka, topic_name, [roll])
            sent[active] = roll[:2]
            led = sidecar.leadership.get(topic_name, 0)
            assert led is not None
            assert active == max(int(p.name[:20]) for p in led.path.glob("*.log")) > tiered
            roots = list(staging_roots(settings.log_dirs, settings.staging_dir).values())
            wait_for(lambda: staged_ranges(roots, tp) and staged_ranges(roots, tp)[-1][1] == active - 1, 30,
                     "the rolled segments staged", detail=lambda: copy_state(sidecar, tp))
            assert rsm.held.wait(30), "no copy held"
            wait_for(lambda: broker_watermarks(kafka, topic_name)[0] == active, 30, "retention to delete them",
                     detail=lambda: str(broker_watermarks(kafka, topic_name)))
            assert latest_remote(sidecar, tp) == tiered - 1  # the premise: the deleted segments are staged only
            listener = start_listener(settings, sidecar.rsm, staged=lambda tp: staged_ranges(roots, tp))
            tier = listener.server.router.ctx.tier

            def read() -> bool:
                tier.refresh([tp])
                t = tier.partition(tp)
                return tier.ready(tp) and (t.high_watermark if t is not None else 0) == tiered
            wait_for(read, 30, "the listener to read the tier")
            before = REGISTRY.get_sample_value("rlm_history_tier_holes_pending_total", {"topic": topic_name}) or 0.0
            host, port = kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)
            with socket.create_connection(("127.0.0.1", listener.port), timeout=30) as sock, \
                    socket.create_connection((host, int(port)), timeout=30) as broker:
                assert only_partition(fetch(broker, topic_name, [(0, tiered)])).error_code == \
                    ErrorCode.offset_out_of_range  # the broker's answer: deleted
                assert only_partition(fetch(sock, topic_name, [(0, tiered)])).error_code == \
                    ErrorCode.offset_not_available
                p = list_offsets(sock, topic_name, EARLIEST)
                assert (p.error_code, p.offset) == (ErrorCode.offset_not_available, -1), p
            assert REGISTRY.get_sample_value("rlm_history_tier_holes_pending_total", {"topic": topic_name}) == \
                before + 1
            log, lines = librdkafka_log()
            conf = {"bootstrap.servers": f"127.0.0.1:{listener.port}", "enable.auto.commit": False,
                    "fetch.wait.max.ms": 100, "logger": log}
            c = Consumer({**conf, "group.id": f"p-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "error"})
            # and one with no position that starts at EARLIEST: asked again while pending, not the broker's log start
            c2 = Consumer({**conf, "group.id": f"e-{uuid.uuid4().hex[:6]}", "auto.offset.reset": "earliest"})
            try:
                c.assign([TopicPartition(topic_name, 0, 0)])
                c2.assign([TopicPartition(topic_name, 0)])
                got = consume_until(c, {(topic_name, 0): tiered}, settle_s=CONFIRM_MS / 1000 + 1.5)[(topic_name, 0)]
                assert [r.offset for r in got] == list(range(tiered))  # nothing more, no error: it waits
                assert staged_ranges(roots, tp)[0][0] == tiered  # the premise: still staged, not copied
                rsm.release.set()
                end = broker_watermarks(kafka, topic_name)[1]
                got += consume_until(c, {(topic_name, 0): end})[(topic_name, 0)]
                got2 = consume_until(c2, {(topic_name, 0): end})[(topic_name, 0)]
            finally:
                c.close()
                c2.close()
            assert _parse_failures(lines) == []  # the pending answers were read as errors, not dropped
            for records in (got, got2):
                assert [r.offset for r in records] == list(range(end))
                assert all((r.key, r.value) == sent.get(r.offset, (b"__roll__", b"r")) for r in records)  # (rolls)
            with socket.create_connection(("127.0.0.1", listener.port), timeout=30) as sock:
                p = list_offsets(sock, topic_name, EARLIEST)
                assert (p.error_code, p.offset) == (0, 0), p
        finally:
            rsm.release.set()
            if listener is not None:
                listener.stop()



def test_a_hole_whose_end_retention_keeps_moving_is_confirmed_and_a_consumer_resets_past_it(
        kafka: KafkaCluster, topic_name: str, tmp_path: Path) -> None:
    """A real hole, its end moving: the first segment is copied, then the sidecar stops (nothing more is staged or
    copied) while a producer keeps the broker's retention deleting a segment about every second (segment.ms 300,
    retention 500 ms, checked every second from the broker's start: ``LOG_TASKS_FROM_START``). Through the proxy
    (``hole_confirm_ms`` 3 s) a Fetch at the tier's end is OFFSET_NOT_AVAILABLE at first; a consumer positioned at 0
    with ``auto.offset.reset=earliest`` reads the tier, waits out the grace, is told OFFSET_OUT_OF_RANGE, resets to
    the broker's log start and reads on: each offset it gets once, in order, as produced, up to the end. The broker's
    log start moved meanwhile (4 values seen in the grace's 3 s, one run): with the grace started again at each move,
    the range stayed pending and the consumer never got past the tier's end (60 s). The range is counted once
    pending and once a hole, however its end moved."""
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300", "retention.ms": "500",
                                                          "file.delete.delay.ms": "1000"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name), history_listener={
        "host": "127.0.0.1", "port": 0, "proxy": True, "authorization": {"allow_if_no_authorizer": True},
        "hole_confirm_ms": CONFIRM_MS})
    with Sidecar(settings) as sidecar:
        wait_for(lambda: sidecar.health()[1]["leading"] == 1, 30, "the sidecar to lead the partition")
        sent = produce_segments(kafka, topic_name, 1, 20, segment_ms=300)
        wait_for(lambda: latest_remote(sidecar, tp) >= 19, 30, "the first segment copied",
                 detail=lambda: copy_state(sidecar, tp))
        tiered = latest_remote(sidecar, tp) + 1
    roots = list(staging_roots(settings.log_dirs, settings.staging_dir).values())
    stop, lock = threading.Event(), threading.Lock()

    def keep_producing() -> None:  # a record every 100 ms: a segment rolls every ~300 ms, retention deletes it
        producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 0})

        def delivered(err: Any, msg: Any) -> None:
            assert err is None, err
            with lock:
                sent[msg.offset()] = (msg.key(), msg.value())
        i = 0
        while not stop.is_set():
            producer.produce(topic_name, key=f"k{i}".encode(), value=f"v{i}".encode() * 10, partition=0,
                             on_delivery=delivered)
            producer.poll(0)
            stop.wait(0.1)
            i += 1
        assert producer.flush(30) == 0

    producing = threading.Thread(target=keep_producing, name="keep-producing", daemon=True)
    producing.start()
    listener = None
    try:
        wait_for(lambda: broker_watermarks(kafka, topic_name)[0] > tiered, 30, "retention past the tier's end",
                 detail=lambda: str(broker_watermarks(kafka, topic_name)))
        assert staged_ranges(roots, tp) == []  # the premise: nothing staged, a real hole
        listener = start_listener(settings, RemoteStorageManager(settings.store),
                                  staged=lambda tp: staged_ranges(roots, tp))
        tier = listener.server.router.ctx.tier

        def read() -> bool:
            tier.refresh([tp])
            t = tier.partition(tp)
            return tier.ready(tp) and t is not None and t.high_watermark == tiered
        wait_for(read, 30, "the listener to read the tier")
        def counted() -> tuple[float, float]:  # (pending ranges, holes) of the topic
            return tuple(REGISTRY.get_sample_value(f"rlm_history_tier_holes{kind}_total", {"topic": topic_name})
                         or 0.0 for kind in ("_pending", ""))  # type: ignore[return-value]
        before = counted()
        host, port = kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)
        with socket.create_connection(("127.0.0.1", listener.port), timeout=30) as sock, \
                socket.create_connection((host, int(port)), timeout=30) as broker:
            assert only_partition(fetch(sock, topic_name, [(0, tiered)])).error_code == \
                ErrorCode.offset_not_available  # pending: met for less than hole_confirm_ms
            log, lines = librdkafka_log()
            c = Consumer({"bootstrap.servers": f"127.0.0.1:{listener.port}", "group.id": f"g-{uuid.uuid4().hex[:6]}",
                          "auto.offset.reset": "earliest", "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                          "logger": log})
            got: list[tuple[int, bytes, bytes]] = []
            starts: set[int] = set()
            try:
                c.assign([TopicPartition(topic_name, 0, 0)])
                deadline = time.monotonic() + 60
                while not got or got[-1][0] < tiered:  # past the hole
                    assert time.monotonic() < deadline, (f"the consumer never got past the tier's end {tiered}",
                                                         got[-1:], sorted(starts))
                    starts.add(list_offsets(broker, topic_name, EARLIEST).offset)
                    for msg in c.consume(100, 0.2):
                        if msg.error() is None:
                            got.append((msg.offset(), msg.key(), msg.value()))
                        else:  # the hole met: librdkafka's reset to earliest
                            assert msg.error().code() in (KafkaError.OFFSET_OUT_OF_RANGE,
                                                          KafkaError._AUTO_OFFSET_RESET), msg.error()
                stop.set()
                producing.join(30)
                end = broker_watermarks(kafka, topic_name)[1]
                while got[-1][0] < end - 1:
                    assert time.monotonic() < deadline + 30, (got[-1:], end)
                    for msg in c.consume(100, 0.2):
                        if msg.error() is None:
                            got.append((msg.offset(), msg.key(), msg.value()))
                        else:
                            assert msg.error().code() in (KafkaError.OFFSET_OUT_OF_RANGE,
                                                          KafkaError._AUTO_OFFSET_RESET), msg.error()
            finally:
                c.close()
            assert len(starts) >= 2, sorted(starts)  # the premise: the hole's end moved while it was pending
            assert _parse_failures(lines) == []  # OFFSET_NOT_AVAILABLE read as such (empty records, not null)
            assert only_partition(fetch(sock, topic_name, [(0, tiered)])).error_code == ErrorCode.offset_out_of_range
        offsets = [o for o, _k, _v in got]
        assert offsets[:tiered] == list(range(tiered)) and offsets == sorted(set(offsets)), offsets
        assert offsets[tiered] > tiered and offsets[-1] == end - 1
        with lock:
            assert all((k, v) == sent.get(o, (b"__roll__", b"r")) for o, k, v in got)
        # one range from the tier's end, its end moving all along: one pending range, one hole (a count for each end
        # met until session 24)
        assert counted() == (before[0] + 1, before[1] + 1)
    finally:
        stop.set()
        producing.join(30)
        if listener is not None:
            listener.stop()
