"""The streaming offloader on crafted partition dirs (no broker; the real metadata cache, storage manager, staging
and reader): its byte and time bounds, the LSO, a batch the broker is still writing, segments spanning local files,
a failed copy. The capability itself is proven against the real broker in test_offload.py."""

from __future__ import annotations

import uuid

import pytest

from rlm.tasks.offload import STUCK_S, StreamingOffloader
from rlmm.api import TopicIdPartition
from rsm.errors import RemoteStorageError
from tests.support.batches import batch, one_per_batch, write_partition
from tests.support.world import World

BIG = 10**9


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def offloader(world: World, tp: TopicIdPartition, clock: Clock, *, max_bytes: int = 1 << 20,
              max_ms: int = 5000) -> StreamingOffloader:
    return StreamingOffloader(world.copier(1, tp), max_bytes=max_bytes, max_ms=max_ms, clock=clock)


def new_tp() -> TopicIdPartition:
    return TopicIdPartition(uuid.uuid4(), "t", 0)


def test_time_bound_and_lso(world: World) -> None:
    tp = new_tp()
    write_partition(world.pdir(1, tp), tp.topic_id, {0: one_per_batch(0, 20, b"v")})  # one active segment
    clock = Clock()
    off = offloader(world, tp, clock)
    assert not off.run_once(15).copied  # offsets 0..14 committed: the cut opens
    clock.now += 4.9
    assert not off.run_once(18).copied  # grows to 0..17, still within offload_max_ms
    clock.now += 0.2
    assert [(m.start_offset, m.end_offset_inclusive) for m in off.run_once(18).copied] == [(0, 17)]
    assert world.finished(tp) == [(0, 17)]
    clock.now += 10
    assert not off.run_once(18).copied  # nothing new committed: nothing opens
    assert not off.run_once(20).copied  # 18, 19 committed: a new cut opens now
    clock.now += 5.1
    assert [(m.start_offset, m.end_offset_inclusive) for m in off.run_once(20).copied] == [(18, 19)]
    assert [o for o, _v in world.values(tp)] == list(range(20))


def test_byte_bound_cuts_and_spans_local_segments(world: World) -> None:
    tp = new_tp()
    size = {o: len(b) for o, b in enumerate(one_per_batch(0, 30, b"v"))}  # "v-9" is one byte shorter than "v-10"
    # Local segments [0,9] and [10,24] rolled, [25,29] active; offload segments of 7 batches.
    write_partition(world.pdir(1, tp), tp.topic_id, {0: one_per_batch(0, 10, b"v"), 10: one_per_batch(10, 15, b"v"),
                                                     25: one_per_batch(25, 5, b"v")})
    clock = Clock()
    off = offloader(world, tp, clock, max_bytes=7 * size[10])
    for _ in range(6):
        off.run_once(BIG)
    clock.now += 6
    off.run_once(BIG)
    assert world.finished(tp) == [(0, 6), (7, 13), (14, 20), (21, 27), (28, 29)]
    assert [o for o, _v in world.values(tp)] == list(range(30))
    seg = world.rlmm.list_remote_log_segments(tp)[1]  # 7..13: the tail of one local segment and the head of the next
    assert seg.segment_size_bytes == sum(size[o] for o in range(7, 14))


def test_a_batch_larger_than_the_bound_is_a_segment_of_its_own(world: World) -> None:
    tp = new_tp()
    big = batch(1, [b"x" * 3000])
    write_partition(world.pdir(1, tp), tp.topic_id, {0: [batch(0, [b"a"]), big, batch(2, [b"b"])]})
    off = offloader(world, tp, Clock(), max_bytes=1024)
    for _ in range(4):
        off.run_once(BIG)
    assert world.finished(tp) == [(0, 0), (1, 1)]  # 2 waits for its time bound


def test_a_batch_the_broker_is_writing_ends_the_scan_then_is_reported(world: World, caplog) -> None:
    tp = new_tp()
    write_partition(world.pdir(1, tp), tp.topic_id, {0: one_per_batch(0, 5, b"v")})
    log = world.pdir(1, tp) / f"{0:020d}.log"
    torn = batch(5, [b"being written"])
    with open(log, "ab") as f:
        f.write(torn[: len(torn) // 2])
    clock = Clock()
    off = offloader(world, tp, clock, max_ms=1000)
    off.run_once(5)  # the LSO is below the torn batch: it is not committed
    clock.now += 2
    assert [(m.start_offset, m.end_offset_inclusive) for m in off.run_once(5).copied] == [(0, 4)]
    # Still torn while the LSO says offset 5 is committed: waited for, then reported (never skipped).
    off.run_once(6)
    assert "local log unreadable" not in caplog.text
    clock.now += STUCK_S + 1
    off.run_once(6)
    assert off.cut is not None and off.cut.next_offset == 5 and not off.cut.pieces
    assert "local log unreadable where the offload segment continues" in caplog.text
    with open(log, "ab") as f:  # the broker finishes the write
        f.write(torn[len(torn) // 2:])
    off.run_once(6)
    clock.now += 2
    assert [(m.start_offset, m.end_offset_inclusive) for m in off.run_once(6).copied] == [(5, 5)]


def test_torn_batch_in_a_rolled_segment_is_an_error(world: World) -> None:
    tp = new_tp()
    bad = bytearray(batch(3, [b"v"]))
    bad[-1] ^= 0xFF  # not a torn tail: a rolled file does not change
    write_partition(world.pdir(1, tp), tp.topic_id, {0: [*one_per_batch(0, 3, b"v"), bytes(bad)],
                                                     4: one_per_batch(4, 2, b"v")})
    clock = Clock()
    off = offloader(world, tp, clock)
    off.run_once(BIG)
    clock.now += 6
    # The planning scan does not check CRCs; the copy does and refuses the whole offload segment.
    with pytest.raises(RemoteStorageError, match="CRC"):
        off.run_once(BIG)
    assert world.finished(tp) == []
    assert off.cut is None  # the next run starts again from the resume point


def test_failed_copy_is_redone_with_a_new_copy_id(world: World, monkeypatch) -> None:
    tp = new_tp()
    write_partition(world.pdir(1, tp), tp.topic_id, {0: one_per_batch(0, 4, b"v")})
    clock = Clock()
    off = offloader(world, tp, clock)
    real = world.rsm.copy_log_range
    ids: list[uuid.UUID] = []

    def failing(md, data, **kw):  # noqa: ANN001, ANN003, ANN202
        ids.append(md.remote_segment_id)
        if len(ids) == 1:
            raise RemoteStorageError("store down")
        return real(md, data, **kw)

    monkeypatch.setattr(world.rsm, "copy_log_range", failing)
    off.run_once(BIG)
    clock.now += 6
    with pytest.raises(RemoteStorageError):
        off.run_once(BIG)
    off.run_once(BIG)
    clock.now += 6
    off.run_once(BIG)
    assert world.finished(tp) == [(0, 3)] and len(set(ids)) == 2
    assert [m.state.name for m in world.rlmm.list_remote_log_segments(tp)] == ["COPY_SEGMENT_FINISHED"]


def test_copy_lag_gauges_in_streaming_mode(world: World) -> None:
    """rlm_copy_lag_bytes / _segments follow what is local only: the open offload segment and what comes after it,
    the active segment included; after everything is remote they are 0."""
    from prometheus_client import REGISTRY

    tp = new_tp()
    segs = {0: one_per_batch(0, 10, b"v"), 10: one_per_batch(10, 15, b"v"), 25: one_per_batch(25, 5, b"v")}
    size = {b: sum(len(x) for x in batches) for b, batches in segs.items()}
    one = {o: len(b) for o, b in enumerate(one_per_batch(0, 30, b"v"))}
    write_partition(world.pdir(1, tp), tp.topic_id, segs)
    clock = Clock()
    off = offloader(world, tp, clock, max_bytes=7 * one[10])

    def lag() -> tuple[float | None, float | None]:
        labels = {"topic": tp.topic, "partition": str(tp.partition)}
        return (REGISTRY.get_sample_value("rlm_copy_lag_bytes", labels),
                REGISTRY.get_sample_value("rlm_copy_lag_segments", labels))

    off.run_once(BIG)  # 0..6 copied (the bound reached); 7.. not cut yet: from offset 7's position on
    assert world.finished(tp) == [(0, 6)]
    assert lag() == (sum(size.values()) - sum(one[o] for o in range(7)), 3)
    off.run_once(BIG)  # 7..13 copied: the first local segment is remote
    assert world.finished(tp) == [(0, 6), (7, 13)]
    assert lag() == (sum(size.values()) - sum(one[o] for o in range(14)), 2)
    for _ in range(4):
        off.run_once(BIG)
    clock.now += 6
    off.run_once(BIG)
    off.run_once(BIG)
    assert world.finished(tp)[-1] == (28, 29)
    assert lag() == (0, 0)


def test_a_run_that_starts_after_leadership_was_lost_does_nothing(world: World) -> None:
    """As the copier's (test_copier_cases): a stale run neither cleans up, stages, reports a gap nor opens a cut."""
    import threading

    tp = new_tp()
    write_partition(world.pdir(2, tp), tp.topic_id, {0: one_per_batch(0, 100, b"v"), 100: one_per_batch(100, 1, b"v")})
    assert world.copier(2, tp).run_once(BIG).copied  # the leader tiered [0, 99]
    write_partition(world.pdir(1, tp), tp.topic_id, {150: one_per_batch(150, 50, b"v"),
                                                     200: one_per_batch(200, 1, b"v")})  # a follower from 150 on
    stop = threading.Event()
    stop.set()
    off = offloader(world, tp, Clock(), max_ms=0)
    result = off.run_once(BIG, stop)
    assert result.gaps == [] and not result.copied and result.cleaned_up == 0 and off.cut is None
    assert off.copier.staging.staged(tp) == []
    assert world.finished(tp) == [(0, 99)]
