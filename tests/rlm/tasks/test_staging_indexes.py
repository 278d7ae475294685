"""A rolled segment whose index files the broker has not written yet (Kafka creates them lazily) is staged with
indexes rebuilt from its ``.log`` (issue 27: copies failing on a staged ``.index`` that was never there), and its copy
goes through; indexes the broker has are linked, never rebuilt."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rlm.tasks.staging import Staging, default_staging_root
from rlm.tier import to_rsm
from rlmm.api import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition
from rsm.api import IndexType, LogSegmentData
from rsm.log.batch import scan_batches
from rsm.log.errors import CorruptRecordBatchError
from rsm.log.indexes import KafkaIndexBuilder
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import FileSystemStore
from tests.support.batches import batch, write_partition


def _partition(tmp_path: Path, tp: TopicIdPartition) -> Path:
    """Segment 0 (60 batches of 200-byte values: > 4 KiB, so the offset index has entries) rolled, segment 60
    active; segment 0's ``.index`` and ``.timeindex`` not written."""
    pdir = tmp_path / "kafka" / f"{tp.topic}-{tp.partition}"
    rolled = [batch(i, [bytes([i]) * 200], ts=1_700_000_000_000 + i) for i in range(60)]
    write_partition(pdir, tp.topic_id, {0: rolled, 60: [batch(60, [b"active"])]})
    for suffix in (".index", ".timeindex"):
        (pdir / f"{0:020d}{suffix}").unlink()
    return pdir


def _expected(log: Path) -> tuple[bytes, bytes]:
    builder = KafkaIndexBuilder(0)
    for h in scan_batches(log):
        builder.add(h, h.position)
    return builder.offset_index(), builder.time_index()


def test_missing_indexes_are_rebuilt_and_the_copy_goes_through(tmp_path: Path) -> None:
    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    pdir = _partition(tmp_path, tp)
    staging = Staging({pdir.parent: default_staging_root(pdir.parent)})
    staged = staging.stage(tp, pdir, 0, 59)
    offsets, times = _expected(staged.file(".log"))
    assert offsets and times  # entries, not empty files
    assert staged.file(".index").read_bytes() == offsets
    assert staged.file(".timeindex").read_bytes() == times
    assert not (pdir / f"{0:020d}.index").exists()  # the broker's dir is left as it is
    assert staging.staged(tp) == [staged]  # complete

    rsm = RemoteStorageManager(RsmConfig(), FileSystemStore(tmp_path / "remote", fsync=False))
    md = RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.uuid4()), 0, 59, 1_700_000_000_059, 1, 1,
                                  staged.file(".log").stat().st_size, ((0, 0),))
    rsm.copy_log_segment_data(to_rsm(md), LogSegmentData(staged.file(".log"), staged.directory / f"{0:020d}.index",
                                                         staged.directory / f"{0:020d}.timeindex", None, None,
                                                         b"0\n1\n0 0\n"))
    with rsm.fetch_log_segment(to_rsm(md), 0) as f:
        assert f.read() == staged.file(".log").read_bytes()
    with rsm.fetch_index(to_rsm(md), IndexType.OFFSET) as f:
        assert f.read() == offsets


def test_indexes_the_broker_has_are_linked_not_rebuilt(tmp_path: Path) -> None:
    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    pdir = _partition(tmp_path, tp)
    (pdir / f"{0:020d}.index").write_bytes(b"\x00" * 8)  # not what a rebuild gives: proves it is the broker's
    (pdir / f"{0:020d}.timeindex").write_bytes(b"\x00" * 12)
    staged = Staging({pdir.parent: default_staging_root(pdir.parent)}).stage(tp, pdir, 0, 59)
    assert staged.file(".index").read_bytes() == b"\x00" * 8
    assert staged.file(".index").stat().st_ino == (pdir / f"{0:020d}.index").stat().st_ino


def test_a_complete_dir_staged_without_indexes_gets_them_when_staged_again(tmp_path: Path) -> None:
    """A segment staged complete by an older sidecar (no indexes, no rebuild) is mended by the next stage call."""
    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    pdir = _partition(tmp_path, tp)
    staging = Staging({pdir.parent: default_staging_root(pdir.parent)})
    staged = staging.stage(tp, pdir, 0, 59)
    for suffix in (".index", ".timeindex"):
        (staged.directory / f"{0:020d}{suffix}").unlink()
    assert staging.stage(tp, pdir, 0, 59) == staged
    assert (staged.file(".index").read_bytes(), staged.file(".timeindex").read_bytes()) == \
        _expected(staged.file(".log"))


def test_a_corrupt_log_without_indexes_is_not_staged(tmp_path: Path) -> None:
    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    pdir = _partition(tmp_path, tp)
    log = pdir / f"{0:020d}.log"
    data = bytearray(log.read_bytes())
    data[5000] ^= 0xFF
    log.write_bytes(bytes(data))
    staging = Staging({pdir.parent: default_staging_root(pdir.parent)})
    with pytest.raises(CorruptRecordBatchError, match=str(log.name)):
        staging.stage(tp, pdir, 0, 59)
    assert staging.staged(tp) == []
