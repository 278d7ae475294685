"""The Spark executor over a batch stored as fragments (PDP-43): its records read back as rows, Arrow batches cut by
bytes, and a record no Spark row can hold failing with its offset and size (no Spark session: the executor alone)."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

import rlm.spark.executor as executor
from rlm.spark.executor import RecordTooLargeError, SegmentSlice, read_slice
from rsm.api import EpochEntry, LogSegmentData, RemoteSegmentMetadata
from rsm.manager import RemoteStorageManager, RsmConfig
from tests.support.bigbatch import big_batch_segment, value_chunks

VALUE = 20_000  # 20 fragments of 1 KiB blocks


def _copied(tmp_path) -> tuple[SegmentSlice, dict]:
    log = tmp_path / "00000000000000000000.log"
    info = big_batch_segment(log, VALUE, small_before=3, small_after=2)
    for s in ("index", "timeindex"):
        (tmp_path / f"00000000000000000000.{s}").write_bytes(b"")
    md = RemoteSegmentMetadata(
        remote_segment_id=uuid.uuid4(), topic_id=uuid.uuid4(), topic_name="big", partition=0, start_offset=0,
        end_offset_inclusive=info["end_offset"], max_timestamp_ms=1, segment_size_bytes=log.stat().st_size,
        broker_id=1, event_timestamp_ms=1, segment_leader_epochs=(EpochEntry(0, 0),))
    store = {"store": "fs", "root_path": str(tmp_path / "remote"), "block_size_bytes": 1024}
    RemoteStorageManager(RsmConfig(**store)).copy_log_segment_data(md, LogSegmentData(
        log, tmp_path / "00000000000000000000.index", tmp_path / "00000000000000000000.timeindex", None, None,
        b"0\n1\n0 0\n"))
    return SegmentSlice(md, 0, info["end_offset"], None, None, None, (), False, True, store, True), info


def test_a_record_in_fragments_is_a_row(tmp_path, monkeypatch):
    part, info = _copied(tmp_path)
    table = pa.Table.from_batches(list(read_slice(part)))
    assert table.column("offset").to_pylist() == list(range(info["end_offset"] + 1))
    values = table.column("value").to_pylist()
    assert values[info["big_offset"]] == b"".join(value_chunks(VALUE))
    assert values[0] == b"before-0" and values[-1] == b"after-%d" % info["end_offset"]
    # Arrow batches are cut by bytes too: the big record's batch alone, the small ones around it
    monkeypatch.setattr(executor, "BATCH_BYTES", 1000)
    sizes = [b.num_rows for b in read_slice(part)]
    assert sizes == [3, 1, 2]


def test_a_record_no_row_can_hold_fails_naming_offset_and_size(tmp_path, monkeypatch):
    part, info = _copied(tmp_path)
    monkeypatch.setattr(executor, "ROW_MAX_BYTES", VALUE - 1)
    with pytest.raises(RecordTooLargeError, match=rf"big-0: the record at offset {info['big_offset']} has "
                                                  rf"{VALUE} bytes of key, value and headers"):
        list(read_slice(part))
