"""A copy run's segments go in batches (issue 26, the per-segment copy path): COPY_SEGMENT_STARTED of the batch in one
metadata write, the store's copies, one fencing check, COPY_SEGMENT_FINISHED of the batch in one metadata write. On
crafted partition dirs (no broker; the in-memory reference metadata manager, the storage manager on the filesystem);
each test fails on the copier that wrote and checked every segment on its own."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest

from rlm.tasks.copier import COPY_BATCH_SEGMENTS, PartitionCopier
from rlm.tier import remote_chain
from rlmm.api import RemoteLogSegmentState, TopicIdPartition, UnknownSegmentError
from rsm.log.partition import PartitionDir
from tests.support.batches import one_per_batch, write_partition
from tests.support.world import World

STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


def five_rolled(world: World, broker: int = 1, epochs: tuple[tuple[int, int], ...] = ((5, 0),)) -> TopicIdPartition:
    """A partition of five rolled segments of ten records ([0,9] ... [40,49]) and an active one at 50, written
    under the one epoch of ``epochs`` (the batches carry it, as the checkpoint says)."""
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    ((epoch, _start),) = epochs
    segments = {base: one_per_batch(base, 10, b"v", epoch) for base in range(0, 50, 10)}
    write_partition(world.pdir(broker, tp), tp.topic_id, {**segments, 50: one_per_batch(50, 1, b"v", epoch)},
                    epochs=epochs)
    return tp


def count_writes(copier: PartitionCopier) -> list[list[RemoteLogSegmentState]]:
    """The metadata writes the copier makes from now on, each as the states of its records."""
    writes: list[list[RemoteLogSegmentState]] = []
    inner = copier.rlmm.write_segment_metadata_many

    def counted(records):  # type: ignore[no-untyped-def]
        writes.append([r.state for r in records])
        return inner(records)

    copier.rlmm.write_segment_metadata_many = counted  # type: ignore[method-assign]
    return writes


def during_copy(world: World, copier: PartitionCopier, k: int, act: Callable[[], None]) -> None:
    """Run ``act`` once, right after the store's ``k``-th copy (from 1) of ``copier``."""
    inner = world.rsm
    n = [0]

    class After:
        def __getattr__(self, name: str) -> object:
            return getattr(inner, name)

        def copy_log_segment_data(self, md, data, **kw):  # type: ignore[no-untyped-def]
            out = inner.copy_log_segment_data(md, data, **kw)
            n[0] += 1
            if n[0] == k:
                act()
            return out

    copier.rsm = After()  # type: ignore[assignment]


def test_a_run_of_five_segments_makes_one_started_write_one_check_and_one_finished_write(world: World) -> None:
    tp = five_rolled(world)
    copier = world.copier(1, tp)
    writes = count_writes(copier)
    checks = []
    result = copier.run_once(51, leader_epoch=5, current_leader_epoch=lambda: checks.append(1) or 5)
    assert [(m.start_offset, m.end_offset_inclusive) for m in result.copied] == [(b, b + 9) for b in range(0, 50, 10)]
    assert writes == [[STARTED] * 5, [FINISHED] * 5]  # one per segment each before: 10 writes
    assert len(checks) == 1
    assert world.finished(tp) == [(b, b + 9) for b in range(0, 50, 10)]
    assert [o for o, _ in world.values(tp)] == list(range(50))
    assert copier.staging.staged(tp) == []


def test_a_batch_is_bounded_by_its_segment_count(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    assert COPY_BATCH_SEGMENTS == 16
    monkeypatch.setattr("rlm.tasks.copier.COPY_BATCH_SEGMENTS", 2)
    tp = five_rolled(world)
    copier = world.copier(1, tp)
    writes = count_writes(copier)
    assert len(copier.run_once(51, leader_epoch=5, current_leader_epoch=lambda: 5).copied) == 5
    assert writes == [[STARTED] * 2, [FINISHED] * 2, [STARTED] * 2, [FINISHED] * 2, [STARTED], [FINISHED]]


def test_a_fenced_batch_records_none_and_leaves_nothing(world: World) -> None:
    tp = five_rolled(world)
    copier = world.copier(1, tp)
    epoch = {"now": 5}
    during_copy(world, copier, 3, lambda: epoch.update(now=6))  # leadership moves during the third copy
    result = copier.run_once(51, leader_epoch=5, current_leader_epoch=lambda: epoch["now"])
    assert result.fenced and result.copied == []
    assert world.rlmm.list_remote_log_segments(tp) == []  # none FINISHED, none left STARTED
    assert not [p for p in (world.tmp / "remote").rglob("*") if p.is_file() and ".tmp" not in p.parts]


def test_a_finished_refused_in_a_batch_records_the_segments_before_it_only(world: World) -> None:
    """Another sidecar deletes the third copy (STARTED) while the batch runs: the metadata refuses its FINISHED.
    The two before it are recorded; it and the two after it (whose FINISHED the metadata took) are removed, so no
    hole hides the third segment's offsets from the resume point. The next run copies them."""
    tp = five_rolled(world)
    copier = world.copier(1, tp)
    other = world.copier(2, tp)

    def delete_third() -> None:
        third = [m for m in world.rlmm.list_remote_log_segments(tp) if m.start_offset == 20]
        assert [m.state for m in third] == [STARTED]
        other.deleter.delete(third[0], "test")

    during_copy(world, copier, 4, delete_third)
    with pytest.raises(UnknownSegmentError):
        copier.run_once(51, leader_epoch=5, current_leader_epoch=lambda: 5)
    assert world.finished(tp) == [(0, 9), (10, 19)]
    assert [m.state for m in world.rlmm.list_remote_log_segments(tp)] == [FINISHED, FINISHED]
    copier.rsm = world.rsm  # type: ignore[assignment]
    result = copier.run_once(51, leader_epoch=5, current_leader_epoch=lambda: 5)
    assert [(m.start_offset, m.end_offset_inclusive) for m in result.copied] == [(20, 29), (30, 39), (40, 49)]
    assert [(m.start_offset, m.end_offset_inclusive) for m in remote_chain(world.rlmm.list_remote_log_segments(tp))] \
        == [(b, b + 9) for b in range(0, 50, 10)]
    assert [o for o, _ in world.values(tp)] == list(range(50))


def test_a_metadata_fence_in_a_batch_records_none_of_it(world: World) -> None:
    """The new leader's STARTED (epoch 8) lands during the old leader's batch (epoch 7), after which the old
    leader's check still answers 7: the metadata refuses each FINISHED of the batch."""
    tp = five_rolled(world, epochs=((7, 0),))
    write_partition(world.pdir(2, tp), tp.topic_id, {0: one_per_batch(0, 10, b"v", 7),
                                                     10: one_per_batch(10, 1, b"v", 7)}, epochs=((7, 0),))
    old, new = world.copier(1, tp), world.copier(2, tp)
    during_copy(world, old, 2, lambda: new.copy_segment(new.staging.stage(tp, new.partition_dir, 0, 9), 0,
                                                        PartitionDir(new.partition_dir).leader_epochs(),
                                                        leader_epoch=8))
    result = old.run_once(51, leader_epoch=7, current_leader_epoch=lambda: 7)
    assert result.fenced and result.copied == []
    assert [(m.start_offset, m.broker_leader_epoch, m.state) for m in world.rlmm.list_remote_log_segments(tp)] \
        == [(0, 8, FINISHED)]


def test_a_crash_in_the_middle_of_a_batch_leaves_started_copies_the_next_run_deletes(world: World) -> None:
    tp = five_rolled(world)
    copier = world.copier(1, tp)

    class Killed(BaseException):
        """The process dies: nothing of the copier's clean-up runs."""

    def kill() -> None:
        raise Killed

    during_copy(world, copier, 2, kill)
    with pytest.raises(Killed):
        copier.run_once(51, leader_epoch=5, current_leader_epoch=lambda: 5)
    # the batch's five STARTED records, two of them copied (their objects stored), none FINISHED
    assert [m.state for m in world.rlmm.list_remote_log_segments(tp)] == [STARTED] * 5
    restarted = world.copier(1, tp)
    result = restarted.run_once(51, leader_epoch=5, current_leader_epoch=lambda: 5)
    assert result.cleaned_up == 5
    assert [(m.start_offset, m.state) for m in world.rlmm.list_remote_log_segments(tp)] \
        == [(b, FINISHED) for b in range(0, 50, 10)]
    assert [o for o, _ in world.values(tp)] == list(range(50))
    live = {str(m.remote_log_segment_id.id) for m in world.rlmm.list_remote_log_segments(tp)}
    stored = {p for p in (world.tmp / "remote").rglob("*") if p.is_file() and ".tmp" not in p.parts}
    assert stored and all(any(sid in str(p) for sid in live) for p in stored)  # the killed copies' objects are gone
