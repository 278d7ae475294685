"""The block cache (rsm/format/blockcache.py, issue 25): reads of one block at a time through new handles, as Fetch
after Fetch makes them, are read ahead across the reads once they are sequential (a stream per copy: ranged GETs of
several blocks, the current block kept for the reads inside it) instead of one GET per read; the bytes are those of
the copy; random reads stay streamed and keep nothing; streams are bounded in number, closed when left or idle, and
give their read-ahead back to the process."""

from __future__ import annotations

import math
import threading
import uuid
from collections import Counter
from pathlib import Path

from rsm.api import RemoteSegmentMetadata
from rsm.format import blockcache, readahead
from rsm.format.readahead import read_ahead_bytes
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import FileSystemStore
from tests.rsm.conftest import synthetic_segment
from tests.support.sidecar import wait_for

KiB = 1024
# one 60 KiB batch a block, five blocks a data object: reads cross object boundaries; read-ahead GETs of two blocks
SMALL = {"block_size_bytes": 64 * KiB, "max_data_object_bytes": 320 * KiB, "read_ahead_request_bytes": 130 * KiB}


def _copied(tmp_path: Path, copies: int = 1) -> tuple[FileSystemStore, list[RemoteSegmentMetadata]]:
    data, last = synthetic_segment(tmp_path, 1024 * KiB)
    store = FileSystemStore(tmp_path / "remote", fsync=False)
    mds = [RemoteSegmentMetadata(uuid.uuid4(), uuid.uuid4(), "bc", 0, 0, last) for _ in range(copies)]
    for md in mds:
        RemoteStorageManager(RsmConfig(**SMALL), store).copy_log_segment_data(md, data)
    return store, mds


def _fetch_like(rsm: RemoteStorageManager, md: RemoteSegmentMetadata, block: int) -> list[tuple[int, bytes]]:
    """One block's batches through a new handle, as a history Fetch reads them."""
    handle = rsm.open_segment(md)
    return [(h.base_offset, bytes(d)) for h, d in handle.batches(0, md.end_offset_inclusive, first_block=block,
                                                                 last_block=block)]


def test_sequential_one_block_reads_are_read_ahead_across_reads(tmp_path: Path) -> None:
    store, (md,) = _copied(tmp_path)
    plain = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=0), store)
    cached = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=256 * KiB), store)
    ledger = plain.reader(md).ledger
    blocks = len(ledger.blocks)
    cached.reader(md)  # both indexes cached: only data GETs are counted
    assert blocks >= 15 and plain.block_cache is None and cached.block_cache is not None
    per_object = Counter(b.object_number for b in ledger.blocks)
    assert len(per_object) >= 3  # the reads cross data objects

    readers = readahead._readers

    def gets(rsm: RemoteStorageManager) -> tuple[int, list]:
        before = store.requests.snapshot().get("get", 0)
        out = [_fetch_like(rsm, md, b) for b in range(blocks) for _ in range(2)]  # each block in two Fetches
        return store.requests.snapshot().get("get", 0) - before, out

    plain_gets, want = gets(plain)
    cached_gets, got = gets(cached)
    assert got == want
    assert plain_gets == 2 * blocks
    # The first read streamed (no read before it to follow); then each data object is one stream whose GETs
    # carry two blocks each.
    assert cached_gets == 1 + sum(math.ceil(n / 2) for n in per_object.values())
    assert cached.block_cache.hits == 2 * blocks - 1  # type: ignore[union-attr]
    assert cached.block_cache.streams_opened == len(per_object)  # type: ignore[union-attr]
    # the last stream handed its last block out: its window is closed, not counted among the readers sharing the
    # process's budget
    assert readahead._readers == readers


def test_random_reads_stay_streamed(tmp_path: Path) -> None:
    store, (md,) = _copied(tmp_path)
    rsm = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=256 * KiB), store)
    blocks = len(rsm.reader(md).ledger.blocks)
    before = store.requests.snapshot().get("get", 0)
    streamed = blockcache._READS.labels("streamed")._value.get()
    reads = (0, 7, 3, blocks - 1, 10, 0, 7, 3, 11, 7)  # blocks read again, but never right after their neighbour
    for b in reads:
        assert _fetch_like(rsm, md, b)
    assert store.requests.snapshot().get("get", 0) - before == len(reads)
    assert blockcache._READS.labels("streamed")._value.get() - streamed == len(reads)  # and counted as such
    assert rsm.block_cache is not None and rsm.block_cache.streams_opened == 0 and rsm.block_cache.size_bytes == 0


def test_streams_are_bounded_and_give_their_read_ahead_back(tmp_path: Path, monkeypatch) -> None:
    """Three copies read one block at a time, taking turns: a cache with room for two streams keeps two (the least
    recently read closed), the bytes are exact, and every stream closed (left, idle, or the manager closed) gives its
    read-ahead back to the process."""
    store, mds = _copied(tmp_path, copies=3)
    rsm = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=260 * KiB), store)  # two 130 KiB requests
    plain = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=0), store)
    cache = rsm.block_cache
    assert cache is not None
    blocks = len(rsm.reader(mds[0]).ledger.blocks)
    idle = read_ahead_bytes()
    for b in range(blocks):
        for md in mds:
            assert _fetch_like(rsm, md, b) == _fetch_like(plain, md, b)
            assert cache.streams <= 2
    assert cache.streams_opened >= 3  # the copies took the two streams in turns
    monkeypatch.setattr(blockcache, "IDLE_S", 0.0)
    assert _fetch_like(rsm, mds[0], 0)  # a random read: every other stream is idle past IDLE_S and closed
    assert cache.streams == 0 and cache.size_bytes == 0
    wait_for(lambda: read_ahead_bytes() == idle, 30, "the closed streams' GETs to finish")  # none left running
    monkeypatch.setattr(blockcache, "IDLE_S", 10.0)
    assert _fetch_like(rsm, mds[0], 1) and cache.streams == 1  # sequential again: a stream
    rsm.close()  # the manager's close closes its streams
    assert cache.streams == 0
    wait_for(lambda: read_ahead_bytes() == idle, 30, "the closed stream's GETs to finish")


def test_concurrent_readers_of_one_copy_get_its_bytes(tmp_path: Path) -> None:
    """Readers of the same copy at once (two consumers, or Fetches in parallel) move its one stream past each other's
    blocks: a read the stream is no longer at is streamed, never handed another block."""
    store, (md,) = _copied(tmp_path)
    rsm = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=256 * KiB), store)
    plain = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=0), store)
    blocks = len(rsm.reader(md).ledger.blocks)
    want = [_fetch_like(plain, md, b) for b in range(blocks)]
    errors: list[BaseException] = []
    results: list[list] = []

    def reader() -> None:
        try:
            results.append([_fetch_like(rsm, md, b) for b in range(blocks) for _ in range(2)])
        except BaseException as err:  # noqa: BLE001 - reported by the assertion below
            errors.append(err)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert results == [[w for w in want for _ in range(2)]] * 4
