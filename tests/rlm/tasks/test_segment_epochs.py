"""The leader epochs a copy records come from its batches' headers (:mod:`rlm.tasks.segment_epochs`), whatever the
broker's leader-epoch checkpoint still holds: the builder on crafted batches, then the segment copier and the
streaming offloader on crafted partition dirs whose checkpoint Kafka cut back to a log start inside or past the
copied range. The same against the real broker: ``tests/rlm/test_copy_epochs.py``."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rlm.tasks.offload import StreamingOffloader
from rlm.tasks.segment_epochs import EpochMismatchError, segment_epochs
from rlmm.api import TopicIdPartition
from rsm.log.batch import scan_batches
from rsm.log.checkpoint import EpochEntry
from rsm.log.errors import CorruptRecordBatchError
from tests.support.batches import batch, one_per_batch, write_partition
from tests.support.world import World

E = EpochEntry


def _segment(tmp_path: Path, epochs: dict[int, int], base: int = 40, n: int = 40) -> Path:
    """A ``.log`` of ``n`` one-record batches from ``base``, each under the epoch of the last ``epochs`` entry
    (offset -> epoch) at or below its offset."""
    path = tmp_path / f"{base:020d}.log"
    path.write_bytes(b"".join(one_per_batch(o, 1, b"v", max((s, e) for s, e in epochs.items() if s <= o)[1])[0]
                              for o in range(base, base + n)))
    return path


def _epochs(path: Path, start: int, end: int, checkpoint: list[EpochEntry]) -> list[EpochEntry]:
    return segment_epochs(scan_batches(path), start, end, checkpoint, str(path))


def test_the_batches_say_where_each_epoch_starts_whatever_the_checkpoint_holds(tmp_path: Path) -> None:
    """Segment 40..79: epoch 0 to 49, epoch 1 from 50. The checkpoint as Kafka leaves it after its log start moved:
    cut back to 60 (inside the segment, past epoch 1's start: the map was ((1, 60),)), to 80 (past the segment: the
    first batch's epoch alone, ((0, 40),)), to 45 (inside epoch 0: ((0, 45), (1, 50)))."""
    seg = _segment(tmp_path, {40: 0, 50: 1})
    exact = [E(0, 40), E(1, 50)]
    for checkpoint in ([E(0, 0), E(1, 50)], [E(0, 45), E(1, 50)], [E(1, 60)], [E(1, 80)], [E(2, 80)], []):
        assert _epochs(seg, 40, 79, checkpoint) == exact, checkpoint
    # from inside the segment (a straddling copy) to its end, and a range ending before it does
    assert _epochs(seg, 50, 79, [E(1, 60)]) == [E(1, 50)]
    assert _epochs(seg, 47, 79, [E(1, 60)]) == [E(0, 47), E(1, 50)]
    assert _epochs(seg, 40, 49, []) == [E(0, 40)]


def test_several_epochs_and_batches_of_many_records(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"".join([*one_per_batch(0, 2, b"a", 3), batch(2, [b"x"] * 10, epoch=4),
                               batch(12, [b"y"] * 10, epoch=4), *one_per_batch(22, 3, b"c", 7)]))
    assert _epochs(path, 0, 24, [E(7, 23)]) == [E(3, 0), E(4, 2), E(7, 22)]
    assert _epochs(path, 5, 24, [E(7, 23)]) == [E(4, 5), E(7, 22)]  # 5 is inside the batch 2..11


def test_a_checkpoint_that_disagrees_where_it_covers_the_range_stops_the_copy(tmp_path: Path) -> None:
    seg = _segment(tmp_path, {40: 0, 50: 1})
    for checkpoint in ([E(0, 0), E(1, 51)], [E(0, 0), E(1, 49)], [E(0, 0)], [E(0, 0), E(1, 50), E(2, 70)],
                       [E(1, 45)], [E(2, 60)]):
        with pytest.raises(EpochMismatchError, match="the batches say"):
            _epochs(seg, 40, 79, checkpoint)


def test_batches_without_an_epoch_or_going_back_or_none_at_all_are_an_error(tmp_path: Path) -> None:
    with pytest.raises(CorruptRecordBatchError, match="goes backwards"):
        _epochs(_segment(tmp_path, {40: 2, 50: 1}), 40, 79, [])
    with pytest.raises(CorruptRecordBatchError, match="no leader epoch"):
        _epochs(_segment(tmp_path, {40: -1}), 40, 79, [])
    with pytest.raises(CorruptRecordBatchError, match="no batch holds"):
        _epochs(_segment(tmp_path, {40: 0}), 80, 90, [])


# ------------------------------------------------------------------------------------- copier and offloader
def _partition(world: World, checkpoint: tuple[tuple[int, int], ...]) -> TopicIdPartition:
    """Rolled segments [0,39] (epoch 0) and [40,79] (epoch 0 to 49, epoch 1 from 50), active [80] (epoch 1), and
    ``checkpoint`` as the broker's leader-epoch checkpoint."""
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    epoch = {o: 0 if o < 50 else 1 for o in range(81)}
    write_partition(world.pdir(1, tp), tp.topic_id, {
        base: [one_per_batch(o, 1, b"v", epoch[o])[0] for o in range(base, end)]
        for base, end in ((0, 40), (40, 80), (80, 81))}, epochs=checkpoint)
    return tp


@pytest.mark.parametrize("checkpoint", [((0, 0), (1, 50)), ((1, 60),), ((1, 80),)],
                         ids=["whole", "log_start_inside", "log_start_past"])
def test_the_copier_records_the_batches_epochs(world: World, checkpoint: tuple[tuple[int, int], ...]) -> None:
    """The second segment's map is ((0, 40), (1, 50)) with the checkpoint whole or cut back to 60 or 80 (was
    ((1, 60),) and ((0, 40),))."""
    tp = _partition(world, checkpoint)
    copier = world.copier(1, tp)
    copied = copier.run_once(80, leader_epoch=1).copied
    assert [(m.start_offset, m.end_offset_inclusive, m.segment_leader_epochs) for m in copied] == [
        (0, 39, ((0, 0),)), (40, 79, ((0, 40), (1, 50)))]


@pytest.mark.parametrize("checkpoint", [((0, 0), (1, 50)), ((1, 60),), ((1, 80),)],
                         ids=["whole", "log_start_inside", "log_start_past"])
def test_the_offloader_records_the_batches_epochs(world: World, checkpoint: tuple[tuple[int, int], ...]) -> None:
    """An offload segment cut across the two rolled local segments, 0..69, has the map ((0, 0), (1, 50)) (was
    ((1, 60),) and ((0, 0),))."""
    tp = _partition(world, checkpoint)
    now = [0.0]
    off = StreamingOffloader(world.copier(1, tp), max_bytes=1 << 20, max_ms=5000, clock=lambda: now[0])
    assert not off.run_once(70).copied  # the cut opens
    now[0] += 6
    copied = off.run_once(70).copied
    assert [(m.start_offset, m.end_offset_inclusive, m.segment_leader_epochs) for m in copied] == [
        (0, 69, ((0, 0), (1, 50)))]
