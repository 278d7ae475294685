"""The storage manager's copy takes the leader-epoch map of the batches it copies on its own walk of them
(:mod:`rsm.log.epochs`, ``check_epochs``), so the copier reads a segment's batch headers once: the map the walk gives
(a block's batches at a time, a fragmented batch once), and a copy whose metadata records another map refused before
its index object, nothing left in the store, raised as itself and not as a store failure. Crafted batches; the
copier over them is ``tests/rlm/tasks/test_segment_epochs.py``, the real broker ``tests/rlm/test_copy_held.py``."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rsm.api import LogPiece, LogRangeData, LogSegmentData, RemoteSegmentMetadata
from rsm.errors import RemoteStorageError
from rsm.format.ledger import LedgerWriter
from rsm.log.batch import scan_batches
from rsm.log.checkpoint import EpochEntry
from rsm.log.epochs import BatchEpochError, BatchEpochs, EpochMismatchError, batch_epochs
from rsm.manager import RemoteStorageManager, RsmConfig
from tests.support.batches import batch, one_per_batch
from tests.support.sidecar import store_keys

E = EpochEntry
BLOCK = 4096
EXACT = [E(3, 0), E(4, 10), E(7, 40)]


def _log(tmp_path: Path, batches: list[bytes]) -> LogSegmentData:
    (tmp_path / "0.log").write_bytes(b"".join(batches))
    (tmp_path / "0.index").write_bytes(b"")
    (tmp_path / "0.timeindex").write_bytes(b"")
    return LogSegmentData(tmp_path / "0.log", tmp_path / "0.index", tmp_path / "0.timeindex", None, None, b"0\n0\n")


def _segment(tmp_path: Path) -> LogSegmentData:
    """Offsets 0..9 one a batch under epoch 3; 10..19 one batch under epoch 4; 20..29 one batch under epoch 4 larger
    than a block (copied as fragments); 30..39 under epoch 4 and 40..49 under epoch 7, one a batch."""
    return _log(tmp_path, [*one_per_batch(0, 10, b"a", 3), batch(10, [b"x" * 10] * 10, epoch=4),
                           batch(20, [b"y" * 1000] * 10, epoch=4), *one_per_batch(30, 10, b"b", 4),
                           *one_per_batch(40, 10, b"c", 7)])


def _md(start: int, end: int, epochs: list[EpochEntry]) -> RemoteSegmentMetadata:
    return RemoteSegmentMetadata(remote_segment_id=uuid.uuid4(), topic_id=uuid.uuid4(), topic_name="t", partition=0,
                                 start_offset=start, end_offset_inclusive=end, max_timestamp_ms=0,
                                 segment_size_bytes=0, broker_id=1, event_timestamp_ms=0,
                                 segment_leader_epochs=tuple(epochs), custom_metadata=None)


def _rsm(tmp_path: Path) -> RemoteStorageManager:
    return RemoteStorageManager(RsmConfig(store="fs", root_path=tmp_path / "remote", fsync=False,
                                          block_size_bytes=BLOCK))


def test_the_copy_walk_gives_the_batches_map_a_block_at_a_time(tmp_path: Path) -> None:
    data = _segment(tmp_path)
    assert batch_epochs(scan_batches(data.log_path), 0, 49) == EXACT
    for start, want in ((0, EXACT), (5, [E(3, 5), E(4, 10), E(7, 40)]), (20, [E(4, 20), E(7, 40)])):
        epochs = BatchEpochs(start, 49, data.log_path)
        writer = LedgerWriter(1, BLOCK, epochs=epochs)
        drafts = [d for d, _block in writer.blocks(data.log_path, start_offset=start, end_offset_inclusive=49)]
        assert any(d.fragment_count > 1 for d in drafts) and len({d.part_id for d in drafts}) > 3  # the premise
        assert epochs.entries() == want == batch_epochs(scan_batches(data.log_path), start, 49), start


def test_a_copy_whose_metadata_records_other_epochs_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    data = _segment(tmp_path)
    rsm = _rsm(tmp_path)
    said = "the batches say epoch 3 from 0, epoch 4 from 10, epoch 7 from 40"
    for wrong in ([E(3, 0)], [E(3, 0), E(4, 11), E(7, 40)], [*EXACT, E(8, 45)], [E(3, 0), E(7, 40)], []):
        with pytest.raises(EpochMismatchError, match=said):
            rsm.copy_log_segment_data(_md(0, 49, wrong), data, check_epochs=True)
        assert store_keys(tmp_path / "remote") == set(), wrong
    md = _md(0, 49, EXACT)
    rsm.copy_log_segment_data(md, data, check_epochs=True)
    assert rsm.reader(md).ledger.metadata.leader_epochs == tuple(EXACT)
    # without check_epochs the copy records what it is given (Kafka's RemoteStorageManager checks nothing of it)
    loose = _md(0, 49, [E(3, 0)])
    rsm.copy_log_segment_data(loose, data)
    assert rsm.reader(loose).ledger.metadata.leader_epochs == (E(3, 0),)


@pytest.mark.parametrize(("epochs", "reason", "offset"), [((3, -1), "no-leader-epoch", 5),
                                                           ((3, 2), "epoch-backwards", 5)])
def test_batches_without_a_map_are_refused_and_not_a_store_failure(tmp_path: Path, epochs: tuple[int, int],
                                                                   reason: str, offset: int) -> None:
    """Offsets 0..4 under the first epoch, 5..9 under the second: none (-1), or one below the first."""
    data = _log(tmp_path, [*one_per_batch(0, 5, b"a", epochs[0]), *one_per_batch(5, 5, b"b", epochs[1])])
    with pytest.raises(BatchEpochError) as caught:
        _rsm(tmp_path).copy_log_segment_data(_md(0, 9, [E(3, 0)]), data, check_epochs=True)
    assert not isinstance(caught.value, RemoteStorageError)
    assert (caught.value.reason, caught.value.offset, caught.value.path) == (reason, offset, str(data.log_path))
    assert store_keys(tmp_path / "remote") == set()


def test_an_offload_copy_checks_its_batches_epochs_too(tmp_path: Path) -> None:
    data = _segment(tmp_path)
    size = data.log_path.stat().st_size
    pieces = (LogPiece(data.log_path, 0, size),)
    rsm = _rsm(tmp_path)
    with pytest.raises(EpochMismatchError, match="the segment's metadata records epoch 3 from 0, epoch 7 from 40"):
        rsm.copy_log_range(_md(0, 49, [E(3, 0), E(7, 40)]), LogRangeData(pieces, None, b"0\n0\n"), check_epochs=True)
    assert store_keys(tmp_path / "remote") == set()
    md = _md(0, 49, EXACT)
    rsm.copy_log_range(md, LogRangeData(pieces, None, b"0\n0\n"), check_epochs=True)
    assert rsm.reader(md).ledger.metadata.leader_epochs == tuple(EXACT)
