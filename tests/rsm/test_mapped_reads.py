"""Blocks of the filesystem store mapped, not read into buffers (issue 24): the block cache's streams take each block
as a view of the file mapped into memory (:meth:`rsm.store.fs.FileSystemStore.map_range`), still checked (block
framing, each batch's CRC-32C), with no buffer of their own; a mapping outlives its object's deletion (retention
deleting a segment while a Fetch holds its blocks); an object shorter than its index says is an error, never a page
mapped past the file's end (SIGBUS); what holds a mapped block counts the block's size (rlm.listener.tier.held)."""

from __future__ import annotations

import mmap
import uuid
from pathlib import Path

import google_crc32c
import pytest

from rsm.api import RemoteSegmentMetadata
from rsm.errors import CorruptRemoteObjectError, RemoteResourceNotFoundError, RemoteStorageError
from rsm.format import blockcache
from rsm.log._crc32c import buffer_address, crc32c_at
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import FileSystemStore
from tests.support.batches import synthetic_segment

KiB = 1024
SMALL = {"block_size_bytes": 64 * KiB, "max_data_object_bytes": 320 * KiB}  # five 64 KiB blocks a data object


def _copied(tmp_path: Path) -> tuple[FileSystemStore, RemoteSegmentMetadata]:
    data, last = synthetic_segment(tmp_path, 1024 * KiB)
    store = FileSystemStore(tmp_path / "remote", fsync=False)
    md = RemoteSegmentMetadata(uuid.uuid4(), uuid.uuid4(), "mapped", 0, 0, last)
    RemoteStorageManager(RsmConfig(**SMALL), store).copy_log_segment_data(md, data)
    return store, md


def _batches(rsm: RemoteStorageManager, md: RemoteSegmentMetadata, block: int) -> list:
    """One block's batches through a new handle, as a history Fetch reads them: (header, view) pairs."""
    return list(rsm.open_segment(md).batches(0, md.end_offset_inclusive, first_block=block, last_block=block))


def test_map_range_is_the_objects_bytes_and_refuses_what_is_past_its_end(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path, fsync=False)
    data = bytes(range(256)) * 100  # 25,600 bytes: ranges across a page boundary, not page-aligned
    store.put("a/b", [data])
    for start, n in ((0, len(data)), (1, 10), (4095, 2), (5000, 20_000), (len(data) - 1, 1)):
        view = store.map_range("a/b", start, n)
        assert view.readonly and bytes(view) == data[start:start + n]
        assert isinstance(view.obj, mmap.mmap)  # the mapping is the view's own (what holds it counts its size)
    assert bytes(store.map_range("a/b", 10, 0)) == b""
    with pytest.raises(CorruptRemoteObjectError, match="truncated"):
        store.map_range("a/b", len(data) - 10, 11)  # a page past the end is never mapped (reading it: SIGBUS)
    with pytest.raises(CorruptRemoteObjectError, match="truncated"):
        store.map_range("a/b", len(data) + 4096, 1)
    with pytest.raises(RemoteResourceNotFoundError):
        store.map_range("a/missing", 0, 1)
    assert store.requests.snapshot()["get"] == 9


def test_a_mapping_outlives_its_objects_deletion(tmp_path: Path) -> None:
    """Deletion unlinks the file: a mapping of it keeps its pages (a Fetch's answer holding blocks of a segment that
    retention deleted meanwhile is written whole); a new mapping of the key is not found."""
    store = FileSystemStore(tmp_path, fsync=False)
    data = b"x" * 10_000 + b"y" * 10_000
    store.put("k", [data])
    view = store.map_range("k", 5000, 10_000)
    store.delete("k")
    assert not (tmp_path / "k").exists()
    assert bytes(view) == data[5000:15_000]
    with pytest.raises(RemoteResourceNotFoundError):
        store.map_range("k", 0, 1)


def test_the_crc_of_a_read_only_view_is_taken_in_place() -> None:
    """A mapped block is read-only (ctypes gives the address of writable buffers only): its CRC-32C is taken at its
    address all the same, not of a copy."""
    data = bytes(range(256)) * 64
    ro = memoryview(data)[7:9000]
    assert ro.readonly
    assert crc32c_at(ro, buffer_address(ro), 3, 5000) == google_crc32c.value(data[10:5010])  # type: ignore[arg-type]
    rw = bytearray(data)
    assert crc32c_at(rw, buffer_address(rw), 3, 5000) == google_crc32c.value(data[3:5003])


def test_crcs_are_taken_by_the_folding_crc_where_the_cpu_has_it(tmp_path: Path) -> None:
    """Where the ``crc32c`` package runs on the CPU's instructions, every CRC-32C is its (21 GB/s on this host where
    google-crc32c's library through ctypes gave 1.5-3.1): over a read-only view of a mapped file, a region of it, and
    extending an earlier CRC, the same values as google-crc32c's."""
    import crc32c

    from rsm.log import _crc32c

    if not crc32c.hardware_based:
        pytest.skip("the crc32c package runs in software here: google-crc32c's library is used")
    assert _crc32c._folding is crc32c.crc32c
    data = bytes(range(251)) * 1200  # not a multiple of 8 or of a page
    path = tmp_path / "blob"
    path.write_bytes(data)
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        ro = memoryview(m)
        assert ro.readonly
        head = crc32c_at(ro, buffer_address(ro), 5, 100_000)  # type: ignore[arg-type]
        assert head == google_crc32c.value(data[5:100_005])
        whole = crc32c_at(ro, buffer_address(ro), 100_005, len(data) - 100_005, head)  # type: ignore[arg-type]
        assert whole == google_crc32c.value(data[5:])
        ro.release()


def test_a_filesystem_stream_maps_its_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sequential reads of one block at a time (the filesystem store's default: the block cache on, no read-ahead):
    each block mapped once, the batches views of the mapping, checked, the copy's bytes; no block buffer made."""
    store, md = _copied(tmp_path)
    plain = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=0), store)
    rsm = RemoteStorageManager(RsmConfig(**SMALL), store)
    assert rsm.block_cache is not None and rsm.reader(md).read_ahead_bytes == 0
    made: list[int] = []
    monkeypatch.setattr(blockcache, "new_block_buffer", lambda n: made.append(n) or bytearray(n))
    blocks = len(plain.reader(md).ledger.blocks)
    for b in range(blocks):
        got = _batches(rsm, md, b)
        assert [(h.base_offset, bytes(d)) for h, d in got] == [(h.base_offset, bytes(d))
                                                                for h, d in _batches(plain, md, b)]
        if b:  # the first read is streamed (no read before it to follow); then each block mapped
            assert all(isinstance(d.obj, mmap.mmap) and len(d.obj) < 2 * 64 * KiB for _h, d in got)
    assert made == []
    assert rsm.block_cache.hits == blocks - 1


def test_a_block_deleted_while_served_is_served_whole_and_the_next_is_an_error(tmp_path: Path) -> None:
    """Retention deletes a segment's objects while a consumer reads it: the batches an answer holds keep their bytes,
    the reads inside the stream's current block are still served from it, and the next block, gone, is a
    RemoteStorageError (the proxy's KAFKA_STORAGE_ERROR for that partition), not a crash."""
    store, md = _copied(tmp_path)
    plain = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=0), store)
    want = {b: [(h.base_offset, bytes(d)) for h, d in _batches(plain, md, b)] for b in (1, 2)}
    rsm = RemoteStorageManager(RsmConfig(**SMALL), store)
    _batches(rsm, md, 0)
    held = _batches(rsm, md, 1)  # mapped: the stream is at block 1
    assert all(isinstance(d.obj, mmap.mmap) for _h, d in held)
    keys = [o.key for o in store.list("")]
    assert keys
    store.delete_many(keys)
    assert list(store.list("")) == []
    assert [(h.base_offset, bytes(d)) for h, d in held] == want[1]
    assert [(h.base_offset, bytes(d)) for h, d in _batches(rsm, md, 1)] == want[1]
    with pytest.raises(RemoteStorageError):
        _batches(rsm, md, 2)
    assert [(h.base_offset, bytes(d)) for h, d in held] == want[1]


def test_a_data_object_shorter_than_its_index_says_is_an_error(tmp_path: Path) -> None:
    """A data object cut short at rest (a damaged store): the block past its end is CorruptRemoteObjectError, as a
    read of it is, not a mapping past the file's end (the process killed by SIGBUS when the check reads it); the
    blocks before it are served."""
    store, md = _copied(tmp_path)
    plain = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=0), store)
    reader = plain.reader(md)
    block = reader.ledger.blocks[3]
    want = [[(h.base_offset, bytes(d)) for h, d in _batches(plain, md, b)] for b in range(3)]
    path = store._path(reader.keys.data(block.object_number))
    with open(path, "r+b") as f:
        f.truncate(block.object_position + block.block_length // 2)
    rsm = RemoteStorageManager(RsmConfig(**SMALL), store)
    assert [[(h.base_offset, bytes(d)) for h, d in _batches(rsm, md, b)] for b in range(3)] == want
    with pytest.raises(CorruptRemoteObjectError, match="truncated"):
        _batches(rsm, md, 3)
