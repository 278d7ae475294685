"""The remote object format: golden bytes, round trips, malformed input, keys; and the throttle."""

from __future__ import annotations

import io
import struct
import uuid

import pytest

from rsm.api import EpochEntry, IndexType
from rsm.errors import CorruptRemoteObjectError
from rsm.format.block import BLOCK_HEADER_LENGTH, EntryReader, decode_block_header, encode_block
from rsm.format.index import (
    BlockInfo,
    IndexObject,
    IndexSection,
    LedgerIndex,
    LedgerMetadata,
    decode_index,
    encode_index,
)
from rsm.format.keys import SegmentKeys, encode_topic_name, ledger_id_for, partition_prefix
from rsm.throttle import THROTTLE_SECONDS, Throttle


def _after_header(block: bytes | bytearray) -> io.BytesIO:
    stream = io.BytesIO(block)
    stream.seek(BLOCK_HEADER_LENGTH)
    return stream


def test_block_golden_bytes_and_entries():
    block = encode_block(ledger_id=0x0102030405060708, first_entry_id=5, entries=[b"hello", memoryview(b"kafka!")])
    assert len(block) == 128 + 12 + 5 + 12 + 6
    assert bytes(block[:36]) == bytes.fromhex(
        "26a66d32" "0000000000000080" "00000000000000a3" "0000000000000005" "0102030405060708")
    assert bytes(block[36:128]) == bytes(92)
    assert bytes(block[128:145]) == struct.pack(">iq", 5, 5) + b"hello"
    h = decode_block_header(block, key="k", position=0)
    assert (h.header_length, h.block_length, h.first_entry_id, h.ledger_id) == (128, 163, 5, 0x0102030405060708)
    entries = [(i, p, bytes(d)) for i, p, d in EntryReader(_after_header(block), h, key="k", position=1000)]
    assert entries == [(5, 1128, b"hello"), (6, 1145, b"kafka!")]


def test_block_errors_name_key_and_position():
    block = encode_block(1, 0, [b"x" * 10])
    bad = bytearray(block)
    bad[0] ^= 1
    with pytest.raises(CorruptRemoteObjectError, match=r"obj at byte 4096: bad block magic"):
        decode_block_header(bad, key="obj", position=4096)
    h = decode_block_header(block, key="obj", position=0)
    with pytest.raises(CorruptRemoteObjectError, match="truncated block: expected 150 bytes, found 149"):
        list(EntryReader(_after_header(block[:-1]), h, key="obj", position=0))
    bad = bytearray(block)
    bad[BLOCK_HEADER_LENGTH + 4:BLOCK_HEADER_LENGTH + 12] = struct.pack(">q", 9)
    with pytest.raises(CorruptRemoteObjectError, match="entry id 9, expected 0") as exc:
        list(EntryReader(_after_header(bad), h, key="obj", position=0))
    assert exc.value.position == BLOCK_HEADER_LENGTH + 4


def _index() -> IndexObject:
    meta = LedgerMetadata(
        remote_segment_id=uuid.UUID(int=1), topic_id=uuid.UUID(int=2), topic_name="tópic/ü", partition=3,
        start_offset=100, end_offset_inclusive=199, max_timestamp_ms=1_700_000_000_000, event_timestamp_ms=5,
        broker_id=1, segment_size_bytes=9999, entry_count=4, leader_epochs=(EpochEntry(0, 100), EpochEntry(2, 150)),
        data_object_lengths=(5000, 6000),
        sections=(IndexSection(IndexType.OFFSET, 1, 4000, 80, 0xDEADBEEF),
                  IndexSection(IndexType.LEADER_EPOCH, 1, 4080, 12, 7)))
    blocks = (BlockInfo(0, 0, 0, 0, 3000, 2, 100, 149, 1_700_000_000_000, 0, 2800, ),
              BlockInfo(2, 1, 1, 0, 3900, 2, 150, 199, 1_699_000_000_000, 2800, 3700))
    return IndexObject(11000, 128, (LedgerIndex(77, meta, blocks),))


def test_index_round_trip_and_lookups():
    idx = _index()
    raw = encode_index(idx)
    assert raw[:4] == bytes.fromhex("3d1fb0bc") and struct.unpack(">I", raw[4:8])[0] == len(raw)
    back = decode_index(raw, key="i")
    assert back == idx
    ledger = back.ledgers[0]
    assert ledger.block_for_offset(99) is None and ledger.block_for_offset(100).part_id == 0
    assert ledger.block_for_offset(150).part_id == 1 and ledger.block_for_offset(200) is None
    assert ledger.block_for_position(2799) == 0 and ledger.block_for_position(2800) == 1
    assert ledger.block_for_position(6500) is None
    assert ledger.block_for_timestamp(1_699_500_000_000).part_id == 0
    assert ledger.block_for_entry(3).part_id == 1 and ledger.block_for_entry(4) is None
    assert ledger.section(IndexType.TRANSACTION) is None and ledger.section(IndexType.OFFSET).crc32c == 0xDEADBEEF


def test_index_corruption_is_caught_with_position():
    raw = bytearray(encode_index(_index()))
    for pos in (0, 10, len(raw) // 2, len(raw) - 1):
        bad = bytearray(raw)
        bad[pos] ^= 0x40
        with pytest.raises(CorruptRemoteObjectError) as exc:
            decode_index(bytes(bad), key="x-index")
        assert exc.value.key == "x-index"
    with pytest.raises(CorruptRemoteObjectError, match="index_len"):
        decode_index(bytes(raw[:-3]), key="x-index")


def test_keys_are_safe_for_any_topic_name():
    assert encode_topic_name("orders.v1_x-y") == "orders.v1_x-y"
    assert encode_topic_name("a/b c%ü") == "a%2Fb%20c%25%C3%BC"
    assert encode_topic_name("..") == "%2E%2E"
    tid, sid = uuid.UUID(int=5), uuid.UUID("12345678-1234-5678-1234-567812345678")
    keys = SegmentKeys.for_segment("a/b", tid, 7, 42, sid)
    assert keys.data(0) == f"a%2Fb-{tid}/7/00000000000000000042-{sid}"
    assert keys.index == keys.data(0) + "-index" and keys.data(2) == keys.data(0) + ".part-00002"
    entropic = SegmentKeys.for_segment("a/b", tid, 7, 42, sid, entropy=True)
    prefix = partition_prefix("a/b", tid, 7, entropy=True)
    assert entropic.base.startswith(prefix) and len(prefix.split("/")[0]) == 4
    assert 0 <= ledger_id_for(sid) < 2**63 and ledger_id_for(sid) != ledger_id_for(uuid.uuid4())


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_throttle_holds_its_rate_and_changes_at_run_time():
    clock = FakeClock()
    t = Throttle("test-copy", 1000.0, clock=clock, sleep=clock.sleep)
    before = THROTTLE_SECONDS.labels("test-copy")._value.get()
    start = clock.now
    for _ in range(100):
        t.acquire(100)  # 10 000 bytes at 1000 B/s with a 1 s burst: 9 s
    assert clock.now - start == pytest.approx(9.0)
    assert THROTTLE_SECONDS.labels("test-copy")._value.get() - before == pytest.approx(9.0)
    t.set_rate(4000.0)
    start = clock.now
    for _ in range(100):
        t.acquire(400)  # 40 000 bytes at 4000 B/s, bucket empty: 10 s
    assert clock.now - start == pytest.approx(10.0)
    t.set_rate(None)
    start = clock.now
    t.acquire(10**9)
    assert clock.now == start
    big = Throttle("test-big", 100.0, clock=clock, sleep=clock.sleep)
    assert big.acquire(1000) == pytest.approx(9.0)  # larger than the bucket: debt, not a stall
    with pytest.raises(ValueError):
        big.set_rate(-1)


def test_block_buffers_grow_to_the_blocks_they_hold_not_block_size(tmp_path):
    """A small segment does not zero-fill two whole blocks of buffers (issue 26: at 4 MiB blocks, two 8 MiB of page
    faults per 64 KiB segment were half the copy path's CPU); a large one grows them up to the block size; the
    blocks are the same either way."""
    from rsm.format.ledger import LedgerWriter
    from tests.support.batches import batch

    block = 4 * 1024 * 1024
    small = tmp_path / "small.log"
    small.write_bytes(b"".join(batch(i, [b"v" * 1000]) for i in range(60)))  # about 64 KiB
    writer = LedgerWriter(7, block)
    blocks = [bytes(b) for _draft, b in writer.blocks(small)]
    assert len(blocks) == 1 and len(blocks[0]) < 128 * 1024
    assert max(len(buf) for buf in writer._bufs) < 128 * 1024
    big = tmp_path / "big.log"
    big.write_bytes(b"".join(batch(i, [b"w" * 100_000]) for i in range(100)))  # about 10 MiB: 3 blocks
    writer = LedgerWriter(7, block)
    assert len([bytes(b) for _draft, b in writer.blocks(big)]) == 3
    assert block // 2 < max(len(buf) for buf in writer._bufs) <= block
