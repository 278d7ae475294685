"""PartitionDir on a directory laid out as the broker lays it out (names only; the contents are the broker's in
test_broker_segments)."""

from __future__ import annotations

import base64
import uuid

import pytest

from rsm.log import CorruptCheckpointError, LogFormatError, PartitionDir


def test_names_suffixes_and_optional_files(tmp_path):
    d = tmp_path / "my.topic-with-dashes-12"
    d.mkdir()
    tid = uuid.uuid4()
    (d / "partition.metadata").write_text(
        f"version: 0\ntopic_id: {base64.urlsafe_b64encode(tid.bytes).decode().rstrip('=')}\n")
    (d / "leader-epoch-checkpoint").write_text("0\n2\n0 0\n4 150\n")
    for base in (0, 100, 250):
        for suffix in (".log", ".index", ".timeindex"):
            (d / f"{base:020d}{suffix}").write_bytes(b"")
    (d / f"{100:020d}.txnindex").write_bytes(b"")
    (d / f"{250:020d}.snapshot").write_bytes(b"")
    for junk in (f"{50:020d}.log.deleted", f"{60:020d}.log.cleaned", f"{70:020d}.log.swap", "garbage.log"):
        (d / junk).write_bytes(b"")
    pd = PartitionDir(d)
    assert (pd.topic, pd.partition, pd.topic_id) == ("my.topic-with-dashes", 12, tid)
    assert [(e.epoch, e.start_offset) for e in pd.leader_epochs()] == [(0, 0), (4, 150)]
    segs = pd.segments()
    assert [s.base_offset for s in segs] == [0, 100, 250]
    assert [s.is_active for s in segs] == [False, False, True]
    assert [s.txn_index_path is not None for s in segs] == [False, True, False]
    assert segs[2].snapshot_path == d / f"{250:020d}.snapshot" and segs[0].snapshot_path is None
    assert segs[1].offset_index_path == d / f"{100:020d}.index"
    assert [s.base_offset for s in pd.rolled_segments()] == [0, 100]


def test_rolled_ranges_count_segments_retention_is_deleting(tmp_path):
    d = tmp_path / "t-0"
    d.mkdir()
    # 0 and 40 renamed by retention (the old active segment 40 too: Kafka rolls it first); 90 is live and rolled;
    # 130 is the active segment; a stray .deleted above the active one (a truncation) is not a rolled segment.
    for name in (f"{0:020d}.log.deleted", f"{40:020d}.log.deleted", f"{90:020d}.log", f"{130:020d}.log",
                 f"{500:020d}.log.deleted", f"{20:020d}.log.cleaned"):
        (d / name).write_bytes(b"")
    assert PartitionDir(d).rolled_ranges() == [(0, 39), (40, 89), (90, 129)]
    assert [s.base_offset for s in PartitionDir(d).rolled_segments()] == [90]
    for name in (f"{90:020d}.log", f"{130:020d}.log"):
        (d / name).unlink()
    assert PartitionDir(d).rolled_ranges() == []  # no live segment: nothing is known to be rolled


def test_bad_directory_and_files(tmp_path):
    with pytest.raises(LogFormatError, match="not a partition directory"):
        PartitionDir(tmp_path / "no_partition_number")
    d = tmp_path / "t-0"
    d.mkdir()
    assert PartitionDir(d).leader_epochs() == [] and PartitionDir(d).segments() == []
    (d / "partition.metadata").write_text("version: 0\ntopic_id: AAAA\n")
    with pytest.raises(CorruptCheckpointError, match=r"partition.metadata: line 2"):
        _ = PartitionDir(d).topic_id
    (d / "leader-epoch-checkpoint").write_bytes(b"0\n1\n\xff 0\n")
    with pytest.raises(CorruptCheckpointError, match="not UTF-8"):
        PartitionDir(d).leader_epochs()


def test_names_round_trip():
    from rsm.log.partition import parse_partition_dir_name, parse_segment_stem, partition_dir_name, segment_file_name

    assert parse_partition_dir_name(partition_dir_name("my.topic-with-dashes", 12)) == ("my.topic-with-dashes", 12)
    assert parse_partition_dir_name("no_partition") is None
    assert parse_segment_stem(segment_file_name(42, "")) == 42
    assert parse_segment_stem(segment_file_name(42, ".log")) is None and parse_segment_stem("42") is None
