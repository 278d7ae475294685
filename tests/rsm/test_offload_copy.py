"""``copy_log_range``: an offload segment (PIP-76 streaming offload) cut from segments the real broker wrote."""

from __future__ import annotations

import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from rsm.api import IndexType, LogPiece, LogRangeData
from rsm.errors import RemoteResourceNotFoundError, RemoteStorageError
from rsm.log.batch import iter_batches_with_bytes
from rsm.log.indexes import read_time_index
from rsm.manager import RemoteStorageManager, RsmConfig
from tests.support.kafka import BrokerSegment


@pytest.fixture
def manager(tmp_path: Path) -> RemoteStorageManager:
    return RemoteStorageManager(RsmConfig(store="fs", root_path=tmp_path / "remote", block_size_bytes=16 * 1024))


def _range(seg: BrokerSegment, pieces: list[LogPiece], start: int, end: int, txn: bytes | None = None):
    md = replace(seg.metadata(uuid.uuid4()), start_offset=start, end_offset_inclusive=end,
                 segment_size_bytes=sum(p.end_position - p.start_position for p in pieces))
    return md, LogRangeData(tuple(pieces), txn, seg.data.leader_epoch_checkpoint)


def _objects(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and ".tmp" not in p.parts]


def test_whole_segment_gets_kafkas_own_offset_and_time_index(manager, broker_segments) -> None:
    """Cut at the broker's own roll points, the indexes written for an offload segment are byte for byte the
    ``.index`` and ``.timeindex`` the broker wrote (the same rule as Kafka's ``LogSegment.append``)."""
    checked = 0
    for seg in broker_segments:
        size = seg.data.log_path.stat().st_size
        md, data = _range(seg, [LogPiece(seg.data.log_path, 0, size)], seg.base_offset, seg.batches[-1].last_offset)
        manager.copy_log_range(md, data)
        kafka_index = seg.data.offset_index_path.read_bytes()
        assert manager.fetch_index(md, IndexType.OFFSET).read() == kafka_index, seg.base_offset
        ours = manager.fetch_index(md, IndexType.TIMESTAMP).read()
        theirs = seg.data.time_index_path.read_bytes()
        assert ours == theirs, (seg.base_offset, read_time_index(_tmp(ours), seg.base_offset),
                                read_time_index(seg.data.time_index_path, seg.base_offset))
        assert manager.fetch_log_segment(md, 0).read() == seg.data.log_path.read_bytes()
        checked += len(kafka_index) // 8
    assert checked > 0, "the broker's segments should have offset index entries (batches over 4 KiB apart)"


def _tmp(data: bytes) -> Path:
    import tempfile

    f = tempfile.NamedTemporaryFile(delete=False, suffix=".timeindex")
    f.write(data)
    f.close()
    return Path(f.name)


def test_tail_of_one_segment_and_head_of_the_next_as_one_remote_segment(manager, broker_segments) -> None:
    a, b = broker_segments[1], broker_segments[2]
    a_batches = list(iter_batches_with_bytes(a.data.log_path))
    b_batches = list(iter_batches_with_bytes(b.data.log_path))
    tail, head = a_batches[len(a_batches) // 2:], b_batches[:len(b_batches) // 3]
    pieces = [LogPiece(a.data.log_path, tail[0][0].position, tail[-1][0].end_position),
              LogPiece(b.data.log_path, 0, head[-1][0].end_position)]
    start, end = tail[0][0].base_offset, head[-1][0].last_offset
    md, data = _range(a, pieces, start, end, txn=None)
    manager.copy_log_range(md, data)

    expected = b"".join(bytes(raw) for _h, raw in tail + head)
    # Positions are the offload segment's: its batches one after the other from 0.
    assert manager.fetch_log_segment(md, 0).read() == expected
    handle = manager.open_segment(md)
    got = [(h.base_offset, bytes(raw)) for h, raw in handle.batches(start, end)]
    assert got == [(h.base_offset, bytes(raw)) for h, raw in tail + head]
    # From the middle, through the offset index and blocks.
    mid = head[0][0].base_offset
    assert [h.base_offset for h, _raw in handle.batches(mid, end)] == [h.base_offset for h, _ in head]
    assert manager.verify_copy(md).ok
    with pytest.raises(RemoteResourceNotFoundError):
        manager.fetch_index(md, IndexType.PRODUCER_SNAPSHOT)
    with pytest.raises(RemoteResourceNotFoundError):
        manager.fetch_index(md, IndexType.TRANSACTION)


def test_transaction_index_is_stored_as_given(manager, broker_segments) -> None:
    seg = next(s for s in broker_segments if s.data.transaction_index_path is not None)
    size = seg.data.log_path.stat().st_size
    txn = seg.data.transaction_index_path.read_bytes()
    md, data = _range(seg, [LogPiece(seg.data.log_path, 0, size)], seg.base_offset, seg.batches[-1].last_offset,
                      txn=txn)
    manager.copy_log_range(md, data)
    assert manager.fetch_index(md, IndexType.TRANSACTION).read() == txn
    assert [t.producer_id for t in manager.open_segment(md).aborted_transactions()]


@pytest.mark.parametrize("case", ["mid-batch-end", "overlap", "end-offset-short", "past-file-end"])
def test_bad_pieces_fail_with_nothing_uploaded(manager, broker_segments, tmp_path: Path, case: str) -> None:
    seg = broker_segments[0]
    batches = list(seg.batches)
    size = seg.data.log_path.stat().st_size
    end = batches[-1].last_offset
    if case == "mid-batch-end":
        pieces = [LogPiece(seg.data.log_path, 0, batches[3].end_position - 5)]
        end = batches[3].last_offset
    elif case == "overlap":
        pieces = [LogPiece(seg.data.log_path, 0, size), LogPiece(seg.data.log_path, batches[-2].position, size)]
    elif case == "end-offset-short":
        pieces = [LogPiece(seg.data.log_path, 0, batches[3].end_position)]
    else:
        pieces = [LogPiece(seg.data.log_path, 0, size + 100)]
    md, data = _range(seg, pieces, seg.base_offset, end)
    with pytest.raises(RemoteStorageError) as err:
        manager.copy_log_range(md, data)
    assert str(seg.data.log_path) in str(err.value) or "offsets" in str(err.value)
    assert _objects(tmp_path / "remote") == []
