"""The index cache (rsm/manager.py, issue 25) is bounded by memory as well as by count: the least recently used
index goes first once the indexes held pass ``index_cache_bytes`` (as :func:`rsm.manager.index_size_bytes` counts
them), a read of a cached index costs one request and of an evicted one two, and an index larger than the whole
bound is never cached."""

from __future__ import annotations

import uuid
from pathlib import Path

from rsm.api import RemoteSegmentMetadata
from rsm.manager import RemoteStorageManager, RsmConfig, index_size_bytes
from rsm.store.fs import FileSystemStore
from tests.support.batches import synthetic_segment

KiB = 1024


def test_the_index_cache_is_bounded_by_bytes(tmp_path: Path) -> None:
    data, last = synthetic_segment(tmp_path, 1024 * KiB)
    store = FileSystemStore(tmp_path / "remote", fsync=False)
    small = {"block_size_bytes": 64 * KiB}  # one batch (60 KiB) a block: 17 blocks an index
    writer = RemoteStorageManager(RsmConfig(**small), store)
    mds = [RemoteSegmentMetadata(uuid.uuid4(), uuid.uuid4(), "ic", 0, 0, last) for _ in range(3)]
    for md in mds:
        writer.copy_log_segment_data(md, data)
    one = index_size_bytes(writer.reader(mds[0]).ledger)
    # no block cache: a read of the same block again would come from its stream, no request at all
    rsm = RemoteStorageManager(RsmConfig(**small, index_cache_bytes=2 * one + one // 2, block_cache_bytes=0), store)

    def requests_to_read(md: RemoteSegmentMetadata) -> int:
        before = store.requests.total()
        with rsm.fetch_log_segment(md, 0, 99) as f:
            assert len(f.read()) == 100
        return store.requests.total() - before

    assert [requests_to_read(md) for md in mds] == [2, 2, 2]  # cold: index + block
    assert rsm._cache.size_bytes == 2 * one  # two indexes fit, the first went
    assert requests_to_read(mds[2]) == 1 and requests_to_read(mds[1]) == 1
    assert requests_to_read(mds[0]) == 2  # evicted: read again, and the least recent (mds[2]) goes
    assert requests_to_read(mds[1]) == 1 and requests_to_read(mds[2]) == 2
    tiny = RemoteStorageManager(RsmConfig(**small, index_cache_bytes=one - 1), store)
    tiny.reader(mds[0])
    assert tiny._cache.size_bytes == 0  # larger than the bound: never cached
