"""The block cache (rsm/format/blockcache.py, issue 25): reads of one block at a time through new handles, as Fetch
after Fetch makes them, get each block with one GET once they are sequential (the block kept whole, the next fetched
ahead) instead of one GET per read; the bytes are those of the copy; random reads stay streamed and keep nothing;
the cache holds at most its capacity."""

from __future__ import annotations

import uuid
from pathlib import Path

from rsm.api import RemoteSegmentMetadata
from rsm.format import blockcache
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import FileSystemStore
from tests.rsm.conftest import synthetic_segment

KiB = 1024
# one 60 KiB batch a block, five blocks a data object: reads cross object boundaries
SMALL = {"block_size_bytes": 64 * KiB, "max_data_object_bytes": 320 * KiB}


def _copied(tmp_path: Path) -> tuple[FileSystemStore, RemoteSegmentMetadata]:
    data, last = synthetic_segment(tmp_path, 1024 * KiB)
    store = FileSystemStore(tmp_path / "remote", fsync=False)
    md = RemoteSegmentMetadata(uuid.uuid4(), uuid.uuid4(), "bc", 0, 0, last)
    RemoteStorageManager(RsmConfig(**SMALL), store).copy_log_segment_data(md, data)
    return store, md


def _fetch_like(rsm: RemoteStorageManager, md: RemoteSegmentMetadata, block: int) -> list[tuple[int, bytes]]:
    """One block's batches through a new handle, as a history Fetch reads them."""
    handle = rsm.open_segment(md)
    return [(h.base_offset, bytes(d)) for h, d in handle.batches(0, md.end_offset_inclusive, first_block=block,
                                                                 last_block=block)]


def test_sequential_one_block_reads_get_each_block_once(tmp_path: Path) -> None:
    store, md = _copied(tmp_path)
    plain = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=0), store)
    cached = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=256 * KiB), store)
    blocks = len(plain.reader(md).ledger.blocks)
    cached.reader(md)  # both indexes cached: only data GETs are counted
    assert blocks >= 15 and plain.block_cache is None and cached.block_cache is not None

    def gets(rsm: RemoteStorageManager) -> tuple[int, list]:
        before = store.requests.snapshot().get("get", 0)
        out = [_fetch_like(rsm, md, b) for b in range(blocks) for _ in range(2)]  # each block in two Fetches
        return store.requests.snapshot().get("get", 0) - before, out

    plain_gets, want = gets(plain)
    cached_gets, got = gets(cached)
    assert got == want
    assert plain_gets == 2 * blocks
    assert cached_gets == blocks + 1  # the first read streamed, then every block fetched once, whole
    # Every block's second read is a hit but block 0's (the one that made the reads sequential); a first read is a
    # hit too when its block's fetch ahead had started (not always on a loaded machine: the reader then fetches it).
    assert cached.block_cache.hits >= blocks - 1  # type: ignore[union-attr]
    assert cached.block_cache.size_bytes <= 256 * KiB  # type: ignore[union-attr]


def test_random_reads_stay_streamed(tmp_path: Path) -> None:
    store, md = _copied(tmp_path)
    rsm = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=256 * KiB), store)
    blocks = len(rsm.reader(md).ledger.blocks)
    before = store.requests.snapshot().get("get", 0)
    streamed = blockcache._READS.labels("streamed")._value.get()
    reads = (0, 7, 3, blocks - 1, 10, 0, 7, 3, 11, 7)  # blocks read again, but never right after their neighbour
    for b in reads:
        assert _fetch_like(rsm, md, b)
    assert store.requests.snapshot().get("get", 0) - before == len(reads)
    assert blockcache._READS.labels("streamed")._value.get() - streamed == len(reads)  # and counted as such
    assert rsm.block_cache is not None and rsm.block_cache.fetched == 0 and rsm.block_cache.size_bytes == 0


def test_the_cache_holds_at_most_its_capacity(tmp_path: Path) -> None:
    store, md = _copied(tmp_path)
    rsm = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=130 * KiB), store)  # two blocks
    cache = rsm.block_cache
    assert cache is not None
    blocks = len(rsm.reader(md).ledger.blocks)
    seen = []
    for b in range(blocks):
        for _ in range(2):
            seen.append(_fetch_like(rsm, md, b))
            assert cache.size_bytes <= 130 * KiB
    assert cache.hits >= blocks - 1  # every second read but block 0's, as above
    plain = RemoteStorageManager(RsmConfig(**SMALL), store)  # the filesystem store: no cache by default
    assert plain.block_cache is None
    assert seen == [_fetch_like(plain, md, b) for b in range(blocks) for _ in range(2)]
