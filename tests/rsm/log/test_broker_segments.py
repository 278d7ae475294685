"""rsm.log against segments the real broker wrote: every codec, headers, tombstones, transactions, a big record,
indexes and checkpoints; then the same files damaged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rsm.log import (
    Codec,
    ControlType,
    CorruptCheckpointError,
    CorruptIndexError,
    CorruptRecordBatchError,
    LogFormatError,
    PartitionDir,
    control_type,
    decode_records,
    find_batch,
    iter_batches_with_bytes,
    lookup_position,
    read_offset_index,
    read_time_index,
    read_txn_index,
    scan_batches,
)
from rsm.log.batch import CHUNK_BYTES
from rsm.log.checkpoint import parse_leader_epoch_checkpoint, parse_partition_metadata
from tests.support.kafka import CODECS, ROLL_KEY

pytestmark = pytest.mark.kafka
REPO = Path(__file__).resolve().parents[3]


def _all_records(pdir: Path):
    """(segment, batch header, records) for every batch of every segment, in offset order."""
    for seg in PartitionDir(pdir).segments():
        for h, data in iter_batches_with_bytes(seg.log_path):
            yield seg, h, data, decode_records(h, data, path=seg.log_path)


@pytest.mark.parametrize("codec", [*CODECS, "txn"])
def test_every_record_reads_back_byte_exact(broker_topics, codec):
    t = broker_topics[codec]
    seen: dict[int, object] = {}
    codecs_seen = set()
    for _seg, h, _data, records in _all_records(t.pdir):
        assert len(records) == h.record_count
        assert [r.offset for r in records] == sorted(r.offset for r in records)
        if h.is_control:
            continue
        codecs_seen.add(h.codec)
        for r in records:
            assert h.base_offset <= r.offset <= h.last_offset
            if r.key == ROLL_KEY:
                continue
            assert r.offset not in seen, f"offset {r.offset} decoded twice"
            seen[r.offset] = r
    assert set(seen) == set(t.expected), "decoded offsets differ from the offsets produce() returned"
    for off, (key, value, headers, ts) in t.expected.items():
        r = seen[off]
        assert (r.key, r.value, r.headers, r.timestamp) == (key, value, headers, ts), f"offset {off}"
    expected_codec = Codec.LZ4 if codec == "txn" else Codec[codec.upper()]
    assert expected_codec in codecs_seen
    assert any(v is None for _, v, _, _ in t.expected.values())  # tombstones were in the data
    assert any(k is None for k, _, _, _ in t.expected.values())  # null keys too


def test_big_record(broker_topics):
    t = broker_topics["none"]
    big = [r for _seg, _h, _d, recs in _all_records(t.pdir) for r in recs if r.key == b"big"]
    assert len(big) == 1
    produced = t.expected[big[0].offset][1]
    assert big[0].value == produced
    sizes = [h.size_bytes for seg in PartitionDir(t.pdir).segments() for h in scan_batches(seg.log_path)]
    assert max(sizes) > len(produced) > CHUNK_BYTES  # the scan crossed a batch bigger than its read buffer


def test_transactions_control_batches_and_txnindex(broker_topics):
    t = broker_topics["txn"]
    markers = []
    pid = None
    for _seg, h, data, records in _all_records(t.pdir):
        if h.is_control:
            assert h.is_transactional and len(records) == 1
            markers.append((records[0].offset, control_type(h, data)))
        elif records and records[0].offset in t.committed + t.aborted:
            assert h.is_transactional
            pid = h.producer_id
    assert [m[1] for m in markers] == [ControlType.COMMIT, ControlType.ABORT, ControlType.COMMIT]
    abort_marker = markers[1][0]
    assert max(t.aborted) < abort_marker < min(o for o in t.committed if o > max(t.aborted))
    pd = PartitionDir(t.pdir)
    txn_segments = [s for s in pd.segments() if s.txn_index_path is not None]
    assert txn_segments and not any(s.is_active for s in txn_segments)
    aborted = [a for s in txn_segments for a in read_txn_index(s.txn_index_path)]
    assert len(aborted) == 1
    a = aborted[0]
    assert (a.version, a.producer_id, a.first_offset, a.last_offset) == (0, pid, min(t.aborted), abort_marker)
    # a control batch is not a data record and says so when asked for its type
    for _seg, h, data, _records in _all_records(t.pdir):
        if not h.is_control:
            with pytest.raises(CorruptRecordBatchError, match="not a control batch"):
                control_type(h, data)
            break


@pytest.mark.parametrize("codec", ["none", "zstd", "txn"])
def test_find_batch_agrees_with_scan_for_every_offset(broker_topics, codec):
    t = broker_topics[codec]
    checked = n_entries = 0
    for seg in PartitionDir(t.pdir).segments():
        headers = list(scan_batches(seg.log_path))
        entries = read_offset_index(seg.offset_index_path, seg.base_offset)
        n_entries += len(entries)
        for e in entries:  # every entry points at a batch boundary holding an offset >= the entry's
            h = next(h for h in headers if h.position == e.position)
            assert h.last_offset >= e.offset
        for h in headers:
            for off in (h.base_offset, h.last_offset, (h.base_offset + h.last_offset) // 2):
                assert find_batch(seg.log_path, seg.offset_index_path, seg.base_offset, off) == h
                assert lookup_position(entries, off) <= h.position
                checked += 1
        if headers:
            assert find_batch(seg.log_path, seg.offset_index_path, seg.base_offset, headers[-1].last_offset + 1) is None
            assert find_batch(seg.log_path, seg.offset_index_path, seg.base_offset, seg.base_offset - 1) is None
    produced = {o for o in t.expected}
    located = set()
    for seg in PartitionDir(t.pdir).segments():
        for off in produced:
            h = find_batch(seg.log_path, seg.offset_index_path, seg.base_offset, off)
            if h is not None:
                assert h.base_offset <= off <= h.last_offset
                located.add(off)
    assert located == produced and checked
    assert n_entries > 1  # index.interval.bytes=512: several entries, so the floor lookup is exercised


def test_time_index_and_partition_files(broker_topics, kafka):
    t = broker_topics["gzip"]
    pd = PartitionDir(t.pdir)
    assert (pd.topic, pd.partition, pd.topic_id) == (t.name, 0, t.topic_id)
    epochs = pd.leader_epochs()
    assert epochs and epochs[0].start_offset == 0
    segs = pd.segments()
    assert [s.base_offset for s in segs] == sorted(s.base_offset for s in segs)
    assert segs[-1].is_active and not any(s.is_active for s in segs[:-1])
    assert pd.rolled_segments() == segs[:-1]
    for seg in segs:
        max_ts = {h.last_offset: h.max_timestamp for h in scan_batches(seg.log_path)}
        entries = read_time_index(seg.time_index_path, seg.base_offset)
        for e in entries:
            assert seg.base_offset <= e.offset <= max(max_ts)
        if not seg.is_active and entries:
            assert entries[-1].timestamp_ms == max(max_ts.values())


def test_active_segment_index_zero_tail(broker_topics):
    """The active segment's .index is preallocated (zero-filled): entries stop at the first zero entry."""
    t = broker_topics["lz4"]
    active = PartitionDir(t.pdir).segments()[-1]
    raw = active.offset_index_path.read_bytes()
    assert len(raw) > 8 and raw[-8:] == bytes(8)  # preallocated
    entries = read_offset_index(active.offset_index_path, active.base_offset)
    assert len(entries) < len(raw) // 8
    assert read_time_index(active.time_index_path, active.base_offset) is not None


# ------------------------------------------------------------------------------------------ damaged copies
def _rolled_copy(broker_topics, tmp_path: Path, codec: str = "zstd"):
    seg = PartitionDir(broker_topics[codec].pdir).rolled_segments()[0]
    dst = tmp_path / seg.log_path.name
    shutil.copyfile(seg.log_path, dst)
    idx = tmp_path / seg.offset_index_path.name
    shutil.copyfile(seg.offset_index_path, idx)
    headers = list(scan_batches(seg.log_path))
    # the damage tests need a batch in the middle and index entries to cut (the conftest's batches of 10 records)
    assert len(headers) >= 3 and idx.stat().st_size >= 16, (seg.log_path, len(headers), idx.stat().st_size)
    return seg, dst, idx, headers


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlm.cli", "dump-segment", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_flipped_byte_is_a_crc_error(broker_topics, tmp_path):
    _seg, log, _idx, headers = _rolled_copy(broker_topics, tmp_path)
    victim = headers[len(headers) // 2]
    with open(log, "r+b") as f:
        f.seek(victim.position + victim.size_bytes - 3)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0x40]))
    got = []
    with pytest.raises(CorruptRecordBatchError) as ei:
        for h in scan_batches(log):
            got.append(h)
    assert got == headers[: len(got)] and got[-1].position < victim.position
    assert ei.value.position == victim.position and str(log) in str(ei.value) and "CRC-32C mismatch" in str(ei.value)
    r = _cli(str(log), "--records")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert str(log) in r.stderr and f"byte {victim.position}" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [x["base_offset"] for x in lines if x["type"] == "batch"] == [h.base_offset for h in got]


def test_truncated_batch(broker_topics, tmp_path):
    _seg, log, _idx, headers = _rolled_copy(broker_topics, tmp_path, "none")
    last = headers[-1]
    os.truncate(log, last.position + last.size_bytes - 1)
    with pytest.raises(CorruptRecordBatchError, match="truncated batch") as ei:
        list(scan_batches(log))
    assert ei.value.position == last.position
    os.truncate(log, last.position + 30)  # inside the header
    with pytest.raises(CorruptRecordBatchError, match="truncated batch header") as ei:
        list(scan_batches(log, verify_crc=False))
    assert ei.value.position == last.position
    r = _cli(str(log))
    assert r.returncode == 1 and f"byte {last.position}" in r.stderr and "Traceback" not in r.stderr


def test_truncated_index(broker_topics, tmp_path):
    seg, _log, idx, _headers = _rolled_copy(broker_topics, tmp_path)
    size = idx.stat().st_size
    os.truncate(idx, size - 3)
    with pytest.raises(CorruptIndexError, match=f"length {size - 3} is not a multiple") as ei:
        read_offset_index(idx, seg.base_offset)
    assert str(idx) in str(ei.value)


def test_garbage_file(tmp_path):
    g = tmp_path / "00000000000000000000.log"
    g.write_bytes(os.urandom(100_000))
    with pytest.raises(LogFormatError) as ei:
        list(scan_batches(g))
    assert ei.value.position == 0 and str(g) in str(ei.value)
    z = tmp_path / "zeros.log"
    z.write_bytes(bytes(4096))
    with pytest.raises(CorruptRecordBatchError, match="zero bytes"):
        list(scan_batches(z))
    assert list(scan_batches(z, zero_tail_ok=True)) == []
    r = _cli(str(g))
    assert r.returncode == 1 and str(g) in r.stderr and "Traceback" not in r.stderr
    r = _cli(str(tmp_path / "missing.log"))
    assert r.returncode == 1 and "missing.log" in r.stderr and "Traceback" not in r.stderr


def test_zero_tail_after_real_batches(broker_topics, tmp_path):
    _seg, log, _idx, headers = _rolled_copy(broker_topics, tmp_path)
    with open(log, "ab") as f:
        f.write(bytes(10_000))
    assert list(scan_batches(log, zero_tail_ok=True)) == headers
    with pytest.raises(CorruptRecordBatchError) as ei:
        list(scan_batches(log))
    assert ei.value.position == headers[-1].end_position
    with open(log, "ab") as f:
        f.write(b"\x01")
    with pytest.raises(CorruptRecordBatchError, match="non-zero byte"):
        list(scan_batches(log, zero_tail_ok=True))


def test_cli_dump_matches_library(broker_topics):
    t = broker_topics["snappy"]
    seg = PartitionDir(t.pdir).rolled_segments()[0]
    r = _cli(str(seg.log_path), "--records")
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    batches = [x for x in lines if x["type"] == "batch"]
    records = [x for x in lines if x["type"] == "record"]
    headers = list(scan_batches(seg.log_path))
    assert [(b["base_offset"], b["last_offset"], b["position"], b["size"], b["codec"], b["crc_ok"]) for b in batches] \
        == [(h.base_offset, h.last_offset, h.position, h.size_bytes, h.codec.name.lower(), True) for h in headers]
    # the codec is the header's: librdkafka sends a batch uncompressed when snappy would not make it smaller (a
    # lone random value), so a snappy topic's segment can hold 'none' batches (test_every_record_reads_back_byte_exact
    # checks that snappy batches are there and decode)
    assert len(records) == sum(h.record_count for h in headers)
    import base64

    for rec in records:
        if rec["offset"] in t.expected:
            key, value, hdrs, _ts = t.expected[rec["offset"]]
            assert rec["key"] == (None if key is None else base64.b64encode(key).decode())
            assert rec["value"] == (None if value is None else base64.b64encode(value).decode())
            assert [tuple(h) for h in rec["headers"]] == [
                (k, None if v is None else base64.b64encode(v).decode()) for k, v in hdrs]


def test_checkpoint_parse_errors_name_file_and_line():
    with pytest.raises(CorruptCheckpointError, match="f.txt: line 4: expected the epoch"):
        parse_leader_epoch_checkpoint("0\n2\n0 0\nx 5\n", "f.txt")
    with pytest.raises(CorruptCheckpointError, match="line 2: count says 3"):
        parse_leader_epoch_checkpoint("0\n3\n0 0\n", "f.txt")
    with pytest.raises(CorruptCheckpointError, match="line 2: expected a base64 topic id"):
        parse_partition_metadata("version: 0\ntopic_id: not-an-id\n", "pm")
    entries = parse_leader_epoch_checkpoint("0\n2\n0 0\n3 17\n")
    assert [(e.epoch, e.start_offset) for e in entries] == [(0, 0), (3, 17)]


@pytest.mark.parametrize("chunk_bytes", [64, 4096, 65_536])
def test_scan_independent_of_read_buffer_size(broker_topics, monkeypatch, chunk_bytes):
    """Batches straddling read-buffer boundaries, and batches larger than the buffer, scan the same."""
    import rsm.log.batch as batch_mod

    expected = {}
    for t in broker_topics.values():
        for seg in PartitionDir(t.pdir).segments():
            expected[seg.log_path] = [(h, bytes(d)) for h, d in iter_batches_with_bytes(seg.log_path)]
    monkeypatch.setattr(batch_mod, "CHUNK_BYTES", chunk_bytes)
    for path, want in expected.items():
        assert [(h, bytes(d)) for h, d in iter_batches_with_bytes(path)] == want
        assert list(scan_batches(path)) == [h for h, _ in want]
        assert list(scan_batches(path, verify_crc=False)) == [h for h, _ in want]
        assert [(h, bytes(d)) for h, d in iter_batches_with_bytes(path, verify_crc=False)] == want
        if len(want) > 2:  # start in the middle
            mid = want[len(want) // 2][0]
            assert list(scan_batches(path, start_position=mid.position)) == [h for h, _ in want[len(want) // 2:]]
