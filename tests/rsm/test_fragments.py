"""Batches larger than a block (PDP-43, issue 26): stored as fragment blocks, copied and read back in bounded memory.

Golden bytes of a fragment block; copies with fragments (plain and encrypted, on the filesystem store) read back
whole, as :class:`~rsm.api.LargeBatch` chunks and as original ``.log`` bytes, byte-exact; copies without fragments
keep the index format of before (version 0); a corrupt fragment is caught before it is handed out. The memory
bound is measured in a child process on a 200 MiB batch (about 2 s).
"""

from __future__ import annotations

import base64
import json
import struct
import uuid
from pathlib import Path

import pytest

from rsm.api import EpochEntry, IndexType, LargeBatch, LogPiece, LogRangeData, LogSegmentData, RemoteSegmentMetadata
from rsm.errors import CorruptRemoteObjectError
from rsm.format.block import BLOCK_HEADER_LENGTH, decode_block_header, frame_fragment, set_fragment_crc
from rsm.format.index import decode_index
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import FileSystemStore
from rsm.verify import verify_segment
from tests.support.batches import batch, one_per_batch
from tests.support.bigbatch import run_measured
from tests.support.stores import corrupt_byte

MiB = 1 << 20
BLOCK = 1024  # fragment payload: 1024 - 128 - 12 = 884 bytes


def test_fragment_block_golden_bytes():
    buf = bytearray(BLOCK_HEADER_LENGTH + 12 + 5)
    length, at = frame_fragment(buf, ledger_id=0x0102030405060708, entry_id=7, fragment_number=2, fragment_count=3,
                                entry_length=0x1234, length=5)
    buf[at:at + 5] = b"hello"
    set_fragment_crc(buf, 0xCAFEBABE)
    assert (length, at) == (145, 140)
    assert bytes(buf[:56]) == bytes.fromhex(
        "26a66d32" "0000000000000080" "0000000000000091" "0000000000000007" "0102030405060708"
        "00000002" "00000003" "0000000000001234" "cafebabe")
    assert bytes(buf[56:128]) == bytes(72)
    assert bytes(buf[128:]) == struct.pack(">iq", 5, 7) + b"hello"
    h = decode_block_header(buf, key="k", position=0)
    assert (h.first_entry_id, h.fragment_number, h.fragment_count, h.entry_length, h.fragment_crc32c) == (
        7, 2, 3, 0x1234, 0xCAFEBABE)
    bad = bytearray(buf)
    bad[36:40] = struct.pack(">i", 3)  # fragment 3 of 3
    with pytest.raises(CorruptRemoteObjectError, match="bad fragment fields") as exc:
        decode_block_header(bad, key="k", position=1000)
    assert exc.value.position == 1036


def _segment(tmp_path: Path) -> tuple[RemoteSegmentMetadata, LogSegmentData, bytes, list[tuple[int, bytes]]]:
    """A .log of small batches around two batches larger than a block (3 and 4 fragments) and one that fits."""
    big1 = batch(3, [bytes(range(256)) * 9])  # ~2.4 KB: 3 fragments of 884 bytes
    big2 = batch(4, [b"".join(b"%06d" % i for i in range(600))])  # ~3.7 KB: 5 fragments
    batches = [*one_per_batch(0, 3, b"a"), big1, big2, batch(5, [b"x" * 600]), *one_per_batch(6, 4, b"b")]
    raw = b"".join(batches)
    log = tmp_path / "00000000000000000000.log"
    log.write_bytes(raw)
    for s in ("index", "timeindex"):
        (tmp_path / f"00000000000000000000.{s}").write_bytes(b"")
    md = RemoteSegmentMetadata(
        remote_segment_id=uuid.uuid4(), topic_id=uuid.uuid4(), topic_name="big", partition=0, start_offset=0,
        end_offset_inclusive=9, max_timestamp_ms=1, segment_size_bytes=len(raw), broker_id=1, event_timestamp_ms=1,
        segment_leader_epochs=(EpochEntry(0, 0),))
    data = LogSegmentData(log, tmp_path / "00000000000000000000.index", tmp_path / "00000000000000000000.timeindex",
                          None, None, b"0\n1\n0 0\n")
    offsets = []
    at = 0
    for b in batches:
        offsets.append((at, b))
        at += len(b)
    return md, data, raw, offsets


def _check_copy(rsm: RemoteStorageManager, md: RemoteSegmentMetadata, raw: bytes,
                offsets: list[tuple[int, bytes]]) -> None:
    seg = rsm.open_segment(md)
    whole = list(seg.batches(0, 9))
    assert [bytes(d) for _, d in whole] == [b for _, b in offsets]
    streamed = []
    for h, d in seg.batches(0, 9, large=True):
        if isinstance(d, LargeBatch):
            chunks = [bytes(c) for c in d.chunks()]
            assert len(chunks) > 1 and len(d) == h.size_bytes
            streamed.append(b"".join(chunks))
        else:
            streamed.append(bytes(d))
    assert streamed == [b for _, b in offsets]
    # a LargeBatch left untaken is read past (and checked): the batches after it still come
    assert [h.base_offset for h, _ in seg.batches(3, 9, large=True)] == list(range(3, 10))
    plan = seg.block_plan(4, 4, 1)  # a budget of 1 byte: still the big batch's blocks in one run
    assert len(plan) == 1 and plan[0].first_offset <= 4 <= plan[0].last_offset
    assert [h.base_offset for h, _ in seg.batches(4, 4, first_block=plan[0].first_block,
                                                  last_block=plan[0].last_block)] == [4]
    for start, end in ((0, None), (offsets[3][0] + 100, offsets[4][0] + 2000), (offsets[4][0] + 900, None)):
        with rsm.fetch_log_segment(md, start, end) as f:
            assert f.read() == raw[start:None if end is None else end + 1]


def test_copy_with_fragments_reads_back_byte_exact(store, tmp_path):
    """On every store: S3's reads go through read-ahead (several blocks) and the block cache (one block)."""
    md, data, raw, offsets = _segment(tmp_path)
    rsm = RemoteStorageManager(RsmConfig(block_size_bytes=BLOCK, max_data_object_bytes=4096), store)
    rsm.copy_log_segment_data(md, data)
    keys = rsm.keys(md)
    index = decode_index(store.get_bytes(keys.index), key=keys.index)
    blocks = index.ledgers[0].blocks
    frags = [(b.first_entry_id, b.fragment_number, b.fragment_count) for b in blocks if b.fragment_count]
    assert frags[:3] == [(3, 0, 3), (3, 1, 3), (3, 2, 3)] and {f[0] for f in frags} == {3, 4}
    # objects split between batches only: a batch's fragments are in one data object
    for b in blocks:
        if b.fragment_number:
            assert b.object_number == blocks[b.part_id - 1].object_number
    assert len(index.ledgers[0].metadata.data_object_lengths) > 1
    _check_copy(rsm, md, raw, offsets)
    seg = rsm.open_segment(md)
    plan = seg.block_plan(4, 4, 1)
    assert plan[0].first_offset == plan[0].last_offset == 4 and plan[0].last_block - plan[0].first_block == 4
    middle = plan[0].first_block + 2  # a read asked to start inside the batch's fragments starts at its first
    assert [bytes(d) for _, d in seg.batches(4, 4, first_block=middle, last_block=middle)] == [offsets[4][1]]
    reader = rsm.reader(md)  # offset <-> (ledger, entry, index): the entry of a batch in fragments
    for offset in (3, 4, 5):
        address = reader.locate(offset)
        assert (address.entry_id, address.index_in_batch) == (offset, 0)
        assert reader.offset_of(address) == offset
    report = verify_segment(store, keys)
    assert report.ok and report.entries == len(offsets) and report.blocks == len(blocks)
    # read-ahead (ranged GETs of several blocks in flight) and the block cache (one-block reads)
    ahead = RemoteStorageManager(RsmConfig(block_size_bytes=BLOCK, read_ahead_bytes=16 * 1024,
                                           read_ahead_request_bytes=3000, block_cache_bytes=1 << 20), store)
    _check_copy(ahead, md, raw, offsets)


def test_offload_copy_with_fragments(tmp_path):
    """An offload segment (PIP-76 pieces, positions from 0 across them) cut inside and around the large batches."""
    md, data, raw, offsets = _segment(tmp_path)
    store = FileSystemStore(tmp_path / "remote")
    rsm = RemoteStorageManager(RsmConfig(block_size_bytes=BLOCK), store)
    cut = offsets[4][0]  # the second large batch starts the second piece
    pieces = (LogPiece(data.log_path, 0, cut), LogPiece(data.log_path, cut, len(raw)))
    rsm.copy_log_range(md, LogRangeData(pieces, None, b"0\n1\n0 0\n"))
    blocks = decode_index(store.get_bytes(rsm.keys(md).index), key="i").ledgers[0].blocks
    assert {b.first_entry_id for b in blocks if b.fragment_count} == {3, 4}
    _check_copy(rsm, md, raw, offsets)
    # the offset index written for the range points at each batch's position
    with rsm.fetch_index(md, IndexType.OFFSET) as f:
        entries = [struct.unpack(">ii", e) for e in iter(lambda: f.read(8), b"")]
    assert all(offsets[rel][0] == pos for rel, pos in entries) and entries


def test_copy_without_fragments_keeps_the_old_index_version(tmp_path):
    md, data, raw, offsets = _segment(tmp_path)
    store = FileSystemStore(tmp_path / "remote")
    rsm = RemoteStorageManager(RsmConfig(block_size_bytes=64 * 1024), store)
    rsm.copy_log_segment_data(md, data)
    keys = rsm.keys(md)
    raw_index = store.get_bytes(keys.index)
    version_at = 24 + 16  # index header, ledger header: the ledger metadata's version
    assert struct.unpack_from(">h", raw_index, version_at) == (0,)
    assert not any(b.fragment_count for b in decode_index(raw_index, key=keys.index).ledgers[0].blocks)
    _check_copy(rsm, md, raw, offsets)


def test_encrypted_copy_with_fragments(tmp_path):
    md, data, raw, offsets = _segment(tmp_path)
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(json.dumps({"k1": base64.b64encode(bytes(range(32))).decode()}))
    rsm = RemoteStorageManager(RsmConfig(block_size_bytes=BLOCK, encryption={
        "key_file": str(keys_file), "enabled": True, "active_key_id": "k1"}), FileSystemStore(tmp_path / "remote"))
    rsm.copy_log_segment_data(md, data)
    _check_copy(rsm, md, raw, offsets)


def test_corrupt_fragment_is_caught_before_it_is_handed_out(store, tmp_path):
    md, data, raw, offsets = _segment(tmp_path)
    rsm = RemoteStorageManager(RsmConfig(block_size_bytes=BLOCK), store)
    rsm.copy_log_segment_data(md, data)
    keys = rsm.keys(md)
    blocks = decode_index(store.get_bytes(keys.index), key=keys.index).ledgers[0].blocks
    second = next(b for b in blocks if b.fragment_number == 1)
    corrupt_byte(store, keys.data(second.object_number), second.object_position + BLOCK_HEADER_LENGTH + 12 + 50)
    got = []
    with pytest.raises(CorruptRemoteObjectError, match="fragment 1 CRC-32C") as exc:
        for _, d in rsm.open_segment(md).batches(0, 9, large=True):
            if isinstance(d, LargeBatch):
                got.extend(bytes(c) for c in d.chunks())
    assert exc.value.kafka_offset == second.first_offset
    assert len(got) == 1  # the first fragment only: the bad one was never handed out


_MEASURE = """
import hashlib, json, uuid
from pathlib import Path
from rsm.api import EpochEntry, IndexType, LargeBatch, LogPiece, LogRangeData, LogSegmentData, RemoteSegmentMetadata
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import FileSystemStore
from tests.support.bigbatch import big_batch_segment, peak_above_idle, reset_peak, value_chunks
d = Path({dir!r})
size = {size}
log = d / "00000000000000000000.log"
info = big_batch_segment(log, size)
for s in ("index", "timeindex"):
    (d / f"00000000000000000000.{{s}}").write_bytes(b"")
md = RemoteSegmentMetadata(remote_segment_id=uuid.uuid4(), topic_id=uuid.uuid4(), topic_name="big", partition=0,
    start_offset=0, end_offset_inclusive=info["end_offset"], max_timestamp_ms=1, segment_size_bytes=log.stat().st_size,
    broker_id=1, event_timestamp_ms=1, segment_leader_epochs=(EpochEntry(0, 0),))
data = LogSegmentData(log, d / "00000000000000000000.index", d / "00000000000000000000.timeindex", None, None,
                      b"0\\n1\\n0 0\\n")
rsm = RemoteStorageManager(RsmConfig(), FileSystemStore(d / "store"))
idle = reset_peak()
rsm.copy_log_segment_data(md, data)
copy_peak = peak_above_idle(idle)
idle = reset_peak()
equal, n = True, 0
for h, b in rsm.open_segment(md).batches(0, info["end_offset"], large=True):
    if isinstance(b, LargeBatch):  # the record's value: bytes size_bytes - 1 - size .. size_bytes - 1 of the batch
        lo, hi, at = h.size_bytes - 1 - size, h.size_bytes - 1, 0
        have, want = hashlib.sha256(), hashlib.sha256()
        for c in b.chunks():
            have.update(c[max(lo - at, 0):max(min(hi - at, len(c)), 0)])
            at += len(c)
        for c in value_chunks(size):
            want.update(c)
        equal = have.digest() == want.digest() and n == 10 and at == h.size_bytes
    n += 1
read_peak = peak_above_idle(idle)
print(json.dumps({{"copy": copy_peak, "read": read_peak, "equal": equal, "batches": n}}))
"""


def test_200_mib_batch_is_copied_and_read_in_bounded_memory(tmp_path):
    out = run_measured(_MEASURE.format(dir=str(tmp_path), size=200 * MiB))
    print(f"peak above idle: copy {out['copy'] / MiB:.1f} MiB, read {out['read'] / MiB:.1f} MiB")
    assert out["batches"] == 21 and out["equal"]
    assert out["copy"] <= 64 * MiB  # before fragments: +209 MiB (the batch was one block)
    assert out["read"] <= 64 * MiB
