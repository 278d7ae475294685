"""The leader epochs a copy records come from its batches' headers (:mod:`rlm.tasks.segment_epochs`), whatever the
broker's leader-epoch checkpoint still holds: the builder on crafted batches, then the segment copier and the
streaming offloader on crafted partition dirs whose checkpoint Kafka cut back to a log start inside or past the
copied range. The same against the real broker: ``tests/rlm/test_copy_epochs.py``."""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

import rsm.log.batch
from rlm.tasks.offload import StreamingOffloader
from rlm.tasks.segment_epochs import EpochMismatchError, segment_epochs
from rlmm.api import RemoteLogSegmentState, TopicIdPartition
from rsm.log.batch import scan_batches
from rsm.log.checkpoint import EpochEntry
from rsm.log.errors import CorruptRecordBatchError
from rsm.log.indexes import TIME_ENTRY
from tests.support.batches import BASE_TS, batch, one_per_batch, write_partition
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
def _partition(world: World, checkpoint: tuple[tuple[int, int], ...], topic: str = "t") -> TopicIdPartition:
    """Rolled segments [0,39] (epoch 0) and [40,79] (epoch 0 to 49, epoch 1 from 50), active [80] (epoch 1), and
    ``checkpoint`` as the broker's leader-epoch checkpoint. The rolled segments' time indexes hold the entry Kafka
    appends at a roll (so the copier reads no batch for their largest timestamp)."""
    tp = TopicIdPartition(uuid.uuid4(), topic, 0)
    epoch = {o: 0 if o < 50 else 1 for o in range(81)}
    pdir = world.pdir(1, tp)
    write_partition(pdir, tp.topic_id, {
        base: [one_per_batch(o, 1, b"v", epoch[o])[0] for o in range(base, end)]
        for base, end in ((0, 40), (40, 80), (80, 81))}, epochs=checkpoint)
    for base, last in ((0, 39), (40, 79)):
        (pdir / f"{base:020d}.timeindex").write_bytes(TIME_ENTRY.pack(BASE_TS, last - base))
    return tp


def _checkpoint(world: World, tp: TopicIdPartition, checkpoint: tuple[tuple[int, int], ...]) -> None:
    lines = ["0", str(len(checkpoint)), *(f"{e} {o}" for e, o in checkpoint)]
    (world.pdir(1, tp) / "leader-epoch-checkpoint").write_text("\n".join(lines) + "\n")


def _header_reads(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """From now on, every batch header a scan of a ``.log`` yields (any scan: the copier's, the storage manager's
    copy's), counted by file name."""
    inner = rsm.log.batch._scan
    reads: Counter[str] = Counter()

    def counted(path, *args):  # type: ignore[no-untyped-def]
        for item in inner(path, *args):
            reads[Path(path).name] += 1
            yield item

    monkeypatch.setattr(rsm.log.batch, "_scan", counted)
    return reads


def _held(tp: TopicIdPartition, reason: str) -> float | None:
    return REGISTRY.get_sample_value("rlm_copy_held", {"topic": tp.topic, "partition": str(tp.partition),
                                                       "reason": reason})


@pytest.mark.parametrize(("checkpoint", "reads"), [(((0, 0), (1, 50)), 1), (((1, 80),), 2)],
                         ids=["covered", "cut_past"])
def test_a_copy_reads_its_batch_headers_once_where_the_checkpoint_covers_it(
        world: World, monkeypatch: pytest.MonkeyPatch, checkpoint: tuple[tuple[int, int], ...], reads: int) -> None:
    """Where the checkpoint covers a segment its map is the checkpoint's, checked on the storage manager's walk of
    the batches: each header read once (was twice: a walk for the map, then the copy's). A segment below the
    checkpoint's start is walked for its map first, as before."""
    tp = _partition(world, checkpoint)
    counted = _header_reads(monkeypatch)
    copied = world.copier(1, tp).run_once(80, leader_epoch=1).copied
    assert [(m.start_offset, m.segment_leader_epochs) for m in copied] == [(0, ((0, 0),)), (40, ((0, 40), (1, 50)))]
    assert dict(counted) == {f"{0:020d}.log": 40 * reads, f"{40:020d}.log": 40 * reads}


@pytest.mark.parametrize(("refused", "fixed", "offset"), [(((0, 0), (1, 51)), ((0, 0), (1, 50)), 40),
                                                          (((2, 60),), ((1, 60),), 60)],
                         ids=["covered_store_copy_refuses", "cut_walk_refuses"])
def test_a_refused_copy_holds_the_partition_where_an_operator_sees_it_until_it_clears(
        world: World, caplog: pytest.LogCaptureFixture, refused: tuple[tuple[int, int], ...],
        fixed: tuple[tuple[int, int], ...], offset: int) -> None:
    """The checkpoint disagrees with the second segment's batches (epoch 1 from 51, not 50: the storage manager's
    copy refuses it; epoch 2 from 60 where the batches hold epoch 1: the walk before the copy refuses it). The
    segment before it is copied, the refused one and every later one not; ``rlm_copy_held{reason="epoch-mismatch"}``
    is 1, ``rlm_copy_refusals_total`` counts it, an ERROR names the segment file and the offset. Once the checkpoint
    agrees, the next run copies it and the gauge is gone."""
    tp = _partition(world, refused, topic=f"held-{uuid.uuid4().hex[:8]}")
    copier = world.copier(1, tp)
    copy_errors = REGISTRY.get_sample_value("rlm_errors_total", {"op": "copy"}) or 0
    with caplog.at_level(logging.INFO, logger="rlm.tasks.copier"), pytest.raises(EpochMismatchError):
        copier.run_once(80, leader_epoch=1)
    # not a store failure (RlmStoreFailures counts rlm_errors_total{op="copy"})
    assert (REGISTRY.get_sample_value("rlm_errors_total", {"op": "copy"}) or 0) == copy_errors
    assert world.finished(tp) == [(0, 39)]
    assert {m.state for m in world.rlmm.list_remote_log_segments(tp)} == {RemoteLogSegmentState.COPY_SEGMENT_FINISHED}
    assert _held(tp, "epoch-mismatch") == 1.0 and copier.held == ("epoch-mismatch", 40)
    assert REGISTRY.get_sample_value("rlm_copy_refusals_total", {"topic": tp.topic, "reason": "epoch-mismatch"}) == 1
    (line,) = [r for r in caplog.records if r.getMessage().startswith("copy refused")]
    assert line.levelno == logging.ERROR
    assert (line.partition, Path(line.segment).name, line.start_offset, line.offset, line.reason) == (  # type: ignore[attr-defined]
        str(tp), f"{40:020d}.log", 40, offset, "epoch-mismatch")
    # held: the next run refuses it again, nothing past it copied
    with pytest.raises(EpochMismatchError):
        copier.run_once(80, leader_epoch=1)
    assert world.finished(tp) == [(0, 39)] and _held(tp, "epoch-mismatch") == 1.0
    _checkpoint(world, tp, fixed)
    assert [m.start_offset for m in copier.run_once(80, leader_epoch=1).copied] == [40]
    assert world.finished(tp) == [(0, 39), (40, 79)]
    assert _held(tp, "epoch-mismatch") is None and copier.held is None
    assert [o for o, _v in world.values(tp)] == list(range(80))


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


def test_a_refused_offload_holds_the_partition_until_it_clears(world: World) -> None:
    """The streaming offloader's copy of 0..69 refused (the checkpoint says epoch 1 from 51, the batches from 50):
    held at 0, the cut dropped; with the checkpoint agreeing, the next cut copies and the gauge is gone."""
    tp = _partition(world, ((0, 0), (1, 51)), topic=f"held-{uuid.uuid4().hex[:8]}")
    now = [0.0]
    copier = world.copier(1, tp)
    off = StreamingOffloader(copier, max_bytes=1 << 20, max_ms=5000, clock=lambda: now[0])
    assert not off.run_once(70, leader_epoch=1).copied  # the cut opens
    now[0] += 6
    with pytest.raises(EpochMismatchError, match="the batches say epoch 0 from 0, epoch 1 from 50"):
        off.run_once(70, leader_epoch=1)
    assert world.finished(tp) == [] and _held(tp, "epoch-mismatch") == 1.0 and copier.held == ("epoch-mismatch", 0)
    assert not world.rlmm.list_remote_log_segments(tp)  # the refused copy removed
    _checkpoint(world, tp, ((0, 0), (1, 50)))
    assert not off.run_once(70, leader_epoch=1).copied  # a new cut opens
    now[0] += 6
    assert [(m.start_offset, m.end_offset_inclusive, m.segment_leader_epochs)
            for m in off.run_once(70, leader_epoch=1).copied] == [(0, 69, ((0, 0), (1, 50)))]
    assert _held(tp, "epoch-mismatch") is None and copier.held is None
