"""The RemoteStorageManager contract, run against every store (filesystem; S3 over HTTP: moto's mock and s3proxy, a
real S3 server), with segments the real broker wrote."""

from __future__ import annotations

import uuid

import pytest

from rsm.api import IndexType
from rsm.errors import CorruptRemoteObjectError, RemoteResourceNotFoundError
from rsm.format.custom_metadata import decode_custom_metadata
from rsm.format.index import decode_index
from rsm.format.keys import partition_prefix
from rsm.format.ledger import EntryAddress
from rsm.log.batch import Codec
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.verify import main as verify_main
from rsm.verify import verify_prefix, verify_segment
from tests.support.kafka import CODECS
from tests.support.stores import corrupt_byte

pytestmark = [pytest.mark.kafka, pytest.mark.s3]


def make_rsm(store, **config) -> RemoteStorageManager:
    return RemoteStorageManager(RsmConfig(**{"block_size_bytes": 16 * 1024, **config}), store)


def read_all(stream) -> bytes:
    with stream as f:
        return f.read()


def positions_of(seg) -> list[tuple[int, int | None]]:
    """(start, end inclusive) pairs: batch starts, batch middles, the very end, with and without end."""
    size = seg.data.log_path.stat().st_size
    b = seg.batches
    out: list[tuple[int, int | None]] = [(0, None), (0, size - 1), (size - 1, None), (size - 1, size + 100)]
    for i in sorted({0, min(1, len(b) - 1), len(b) // 2, len(b) - 1}):
        h = b[i]
        out += [(h.position, None), (h.position, h.end_position - 1), (h.position + h.size_bytes // 2, None),
                (h.position + 7, min(size - 1, h.end_position + 33)), (h.position + 61, h.position + 61)]
    return out


def test_segments_cover_codecs_and_transactions(broker_segments):
    codecs = {b.codec for s in broker_segments for b in s.batches}
    assert {Codec.NONE, Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD} <= codecs, (codecs, CODECS)
    assert any(b.is_control for s in broker_segments for b in s.batches)
    assert any(s.data.transaction_index_path is not None for s in broker_segments)


def test_copy_then_fetch_original_bytes(store, broker_segments):
    rsm = make_rsm(store)
    for seg in broker_segments:
        md = seg.metadata()
        assert decode_custom_metadata(rsm.copy_log_segment_data(md, seg.data)) == rsm.layout
        local = seg.data.log_path.read_bytes()
        for start, end in positions_of(seg):
            got = read_all(rsm.fetch_log_segment(md, start, end))
            want = local[start:] if end is None else local[start:end + 1]
            assert got == want, (seg.base_offset, start, end)
        with pytest.raises(ValueError):
            rsm.fetch_log_segment(md, len(local))


def test_cold_reader_needs_two_requests_warm_one(store, broker_segments):
    seg = broker_segments[0]
    md = seg.metadata()
    make_rsm(store).copy_log_segment_data(md, seg.data)
    cold = make_rsm(store)
    local = seg.data.log_path.read_bytes()
    h = seg.batches[len(seg.batches) // 2]
    before = store.requests.total()
    assert read_all(cold.fetch_log_segment(md, h.position, h.end_position - 1)) == local[h.position:h.end_position]
    assert store.requests.total() - before == 2
    h2 = seg.batches[-1]
    before = store.requests.total()
    assert read_all(cold.fetch_log_segment(md, h2.position, h2.end_position - 1)) == local[h2.position:]
    assert store.requests.total() - before == 1


def test_all_five_indexes_byte_identical(store, broker_segments):
    rsm = make_rsm(store)
    for seg in broker_segments:
        md = seg.metadata()
        rsm.copy_log_segment_data(md, seg.data)
        d = seg.data
        assert read_all(rsm.fetch_index(md, IndexType.OFFSET)) == d.offset_index_path.read_bytes()
        assert read_all(rsm.fetch_index(md, IndexType.TIMESTAMP)) == d.time_index_path.read_bytes()
        assert read_all(rsm.fetch_index(md, IndexType.LEADER_EPOCH)) == d.leader_epoch_checkpoint
        if d.producer_snapshot_path is not None:
            assert read_all(rsm.fetch_index(md, IndexType.PRODUCER_SNAPSHOT)) == d.producer_snapshot_path.read_bytes()
        if d.transaction_index_path is not None:
            txn = read_all(rsm.fetch_index(md, IndexType.TRANSACTION))
            assert txn == d.transaction_index_path.read_bytes() and len(txn) % 34 == 0 and txn
        else:
            with pytest.raises(RemoteResourceNotFoundError):
                rsm.fetch_index(md, IndexType.TRANSACTION)
    assert any(s.data.producer_snapshot_path is not None for s in broker_segments)


def test_offset_entry_mapping_matches_the_batches(store, broker_segments):
    rsm = make_rsm(store, block_size_bytes=4096)
    for seg in broker_segments[:3] + broker_segments[-1:]:
        md = seg.metadata()
        rsm.copy_log_segment_data(md, seg.data)
        reader = rsm.reader(md)
        ledger_id = reader.ledger.ledger_id
        for entry_id, b in enumerate(seg.batches):
            for offset in {b.base_offset, b.last_offset, (b.base_offset + b.last_offset) // 2}:
                addr = rsm.locate_offset(md, offset)
                assert addr == EntryAddress(ledger_id, entry_id, offset - b.base_offset)
                assert rsm.offset_of(md, addr) == offset
        with pytest.raises(RemoteResourceNotFoundError):
            rsm.locate_offset(md, seg.batches[-1].last_offset + 1)
        with pytest.raises(RemoteResourceNotFoundError):
            rsm.offset_of(md, EntryAddress(ledger_id, len(seg.batches), 0))
        # timestamp -> the first batch whose max timestamp reaches it
        target = seg.batches[len(seg.batches) // 2]
        found = reader.find_timestamp(target.max_timestamp)
        first = next(b for b in seg.batches if b.max_timestamp >= target.max_timestamp)
        assert found is not None and found.base_offset == first.base_offset


def test_index_object_rebuilds_the_segment_metadata(store, broker_segments):
    seg = broker_segments[1]
    md = seg.metadata()
    rsm = make_rsm(store)
    rsm.copy_log_segment_data(md, seg.data)
    keys = rsm.keys(md)
    listed = [o.key for o in store.list(keys.prefix)]
    assert listed == sorted([keys.data(0), keys.index])
    meta = decode_index(store.get_bytes(keys.index), key=keys.index).ledgers[0].metadata
    assert (meta.remote_segment_id, meta.topic_id, meta.topic_name, meta.partition) == (
        md.remote_segment_id, md.topic_id, md.topic_name, 0)
    assert (meta.start_offset, meta.end_offset_inclusive, meta.max_timestamp_ms) == (
        md.start_offset, md.end_offset_inclusive, md.max_timestamp_ms)
    assert meta.segment_size_bytes == seg.data.log_path.stat().st_size == md.segment_size_bytes
    assert meta.leader_epochs == md.segment_leader_epochs and meta.broker_id == 1
    assert meta.entry_count == len(seg.batches)


def test_spanning_several_data_objects(store, broker_segments):
    seg = max(broker_segments, key=lambda s: s.data.log_path.stat().st_size)
    md = seg.metadata()
    rsm = make_rsm(store, block_size_bytes=2048, max_data_object_bytes=8192)
    rsm.copy_log_segment_data(md, seg.data)
    keys = rsm.keys(md)
    objects = [o.key for o in store.list(keys.prefix)]
    assert len(objects) > 3 and keys.data(2) in objects
    local = seg.data.log_path.read_bytes()
    assert read_all(rsm.fetch_log_segment(md, 0)) == local
    h = seg.batches[len(seg.batches) // 3]
    assert read_all(rsm.fetch_log_segment(md, h.position + 3, len(local) - 5)) == local[h.position + 3:len(local) - 4]
    report = verify_segment(store, keys)
    assert report.ok and report.entries == len(seg.batches), str(report)
    assert read_all(rsm.fetch_index(md, IndexType.OFFSET)) == seg.data.offset_index_path.read_bytes()


def test_copy_is_idempotent_and_attempts_do_not_mix(store, broker_segments):
    seg = broker_segments[2]
    rsm = make_rsm(store)
    md = seg.metadata()
    rsm.copy_log_segment_data(md, seg.data)
    rsm.copy_log_segment_data(md, seg.data)
    md2 = seg.metadata()  # a new attempt: new remote segment id, new ledger id, own keys
    rsm.copy_log_segment_data(md2, seg.data)
    assert rsm.reader(md).ledger.ledger_id != rsm.reader(md2).ledger.ledger_id
    assert len(list(store.list(rsm.keys(md).prefix))) == 2
    rsm.delete_log_segment_data(md)
    assert read_all(rsm.fetch_log_segment(md2, 0)) == seg.data.log_path.read_bytes()


def test_delete_is_idempotent(store, broker_segments):
    seg = broker_segments[0]
    rsm = make_rsm(store)
    md = seg.metadata()
    rsm.copy_log_segment_data(md, seg.data)
    rsm.delete_log_segment_data(md)
    rsm.delete_log_segment_data(md)
    rsm.delete_log_segment_data(seg.metadata())  # never copied
    assert list(store.list(rsm.keys(md).prefix)) == []
    with pytest.raises(RemoteResourceNotFoundError):
        rsm.fetch_log_segment(md, 0)
    with pytest.raises(RemoteResourceNotFoundError):
        make_rsm(store).fetch_index(md, IndexType.OFFSET)


def test_corrupt_entry_is_reported_by_verify_and_fetch(store, broker_segments):
    seg = broker_segments[0]
    md = seg.metadata()
    rsm = make_rsm(store)
    rsm.copy_log_segment_data(md, seg.data)
    keys = rsm.keys(md)
    assert verify_segment(store, keys).ok
    ledger = rsm.reader(md).ledger
    block = ledger.blocks[1]
    position = block.object_position + 128 + 12 + 40  # inside the first batch of the second block
    corrupt_byte(store, keys.data(0), position)
    report = verify_segment(store, keys)
    assert not report.ok and report.bad_key == keys.data(0)
    assert report.bad_offset == block.first_offset and report.bad_position is not None
    assert block.object_position <= report.bad_position < block.object_position + block.block_length
    fresh = make_rsm(store)
    with pytest.raises(CorruptRemoteObjectError) as exc:
        read_all(fresh.fetch_log_segment(md, block.log_position))
    assert exc.value.key == keys.data(0) and exc.value.kafka_offset == block.first_offset
    # bytes before the bad block are still served, intact
    local = seg.data.log_path.read_bytes()
    assert read_all(fresh.fetch_log_segment(md, 0, block.log_position - 1)) == local[:block.log_position]


def test_corrupt_index_object_and_block_header(store, broker_segments):
    seg = broker_segments[3]
    md = seg.metadata()
    rsm = make_rsm(store)
    rsm.copy_log_segment_data(md, seg.data)
    keys = rsm.keys(md)
    corrupt_byte(store, keys.data(0), 0)  # block magic
    report = verify_segment(store, keys)
    assert not report.ok and report.bad_key == keys.data(0) and report.bad_position == 0 and "magic" in report.message
    corrupt_byte(store, keys.index, 30)
    report = verify_segment(store, keys)
    assert not report.ok and report.bad_key == keys.index and "CRC" in report.message
    with pytest.raises(CorruptRemoteObjectError):
        make_rsm(store).fetch_log_segment(md, 0)


def test_store_put_is_atomic_when_the_source_fails(store):
    def chunks():
        yield b"x" * (3 * 1024 * 1024)
        yield b"y" * (3 * 1024 * 1024)
        raise OSError("local disk went away")

    key = f"atomic/{uuid.uuid4()}"
    with pytest.raises(OSError):
        store.put(key, chunks())
    assert store.head(key) is None
    assert list(store.list("atomic/")) == []
    store.put(key, [b"abc", memoryview(b"defg")])
    assert store.get_bytes(key) == b"abcdefg" and store.get_bytes(key, 2, 4) == b"cde"
    assert store.get_bytes(key, 5, 100) == b"fg" and store.head(key) == 7
    store.delete(key)
    store.delete(key)
    with pytest.raises(RemoteResourceNotFoundError):
        store.get_bytes(key)


def test_verify_prefix_finds_the_bad_copy(store, store_kind, broker_segments, capsys):
    rsm = make_rsm(store)
    good, bad = broker_segments[0].metadata(), broker_segments[1].metadata()
    rsm.copy_log_segment_data(good, broker_segments[0].data)
    rsm.copy_log_segment_data(bad, broker_segments[1].data)
    bad_keys = rsm.keys(bad)
    store.delete(bad_keys.data(0))  # a lost data object under a committed index
    prefix = partition_prefix(good.topic_name, good.topic_id, 0)
    reports = {r.index_key: r for r in verify_prefix(store, prefix)}
    assert reports[rsm.keys(good).index].ok
    assert not reports[bad_keys.index].ok and reports[bad_keys.index].bad_key == bad_keys.data(0)
    where = (["--root", str(store.root)] if store_kind == "fs"
             else ["--bucket", store.bucket, "--endpoint-url", store.client.meta.endpoint_url])
    assert verify_main([*where, "--prefix", prefix]) == 1
    out = capsys.readouterr().out
    assert f"BAD {bad_keys.index}" in out and f"OK {rsm.keys(good).index}" in out
