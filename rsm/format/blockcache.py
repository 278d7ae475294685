"""Whole blocks for sequential reads made one block at a time, cached and fetched one ahead (issue 25).

A Kafka consumer reading history through the endpoint sends Fetch after Fetch, each asking for about a block
(``max.partition.fetch.bytes``, 1 MiB by default, or a few MiB) and each opening the segment anew: no single read is
long enough for read-ahead (:mod:`rsm.format.readahead`), so each paid a first byte (about 27 ms on S3) and streamed
its block from the block's start, again for every Fetch inside the same block.

With a :class:`BlockCache`, a read of one block looks at what the process read recently:

- when it follows the copy's last read (the same block, or the next one), the read is sequential: the block comes
  from the cache, or is fetched whole with one ranged GET and kept, and the copy's next blocks (in the same data
  object or the next) are fetched ahead on the process's I/O pool, so the next Fetches find them in memory: one
  block ahead at first, twice as many each time a read finds its block not yet fetched (the reader is faster than
  one GET at a time), up to :data:`MAX_AHEAD` and the copy's fair share of the capacity (half of it divided by the
  copies with blocks fetched ahead and not yet read: a second reader takes half of what the first had, as
  read-ahead windows share the process's budget);
- a block cached or being fetched ahead is used by any read of it;
- otherwise (a random read) it is streamed as without the cache: one GET stopping where the read ends, nothing kept,
  nothing fetched ahead.

Bounds: at most ``capacity_bytes`` of whole blocks, cached or being fetched ahead. Room is made by dropping the least
recently used block already read; a block fetched ahead and not yet read is dropped only for a reader's own block,
never to fetch another ahead (that would pay a GET to throw one away); a block fetched ahead is never waited for by
a reader if it has not started (the reader cancels it and fetches the
block itself, so no reader waits on a pool thread its caller may hold). Cached blocks are shared read-only by
readers (their entries are views of them). Plain copies only: an encrypted copy's blocks are opened per read.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from concurrent.futures import Future

from prometheus_client import Counter, Gauge

from rsm.format.crypto import worker_pool
from rsm.format.index import BlockInfo
from rsm.format.readahead import fetch_range
from rsm.store.base import Store

__all__ = ["MAX_AHEAD", "RECENT_READS", "BlockCache"]

log = logging.getLogger(__name__)

_BYTES = Gauge("rsm_block_cache_bytes", "Bytes of whole blocks the block caches hold, cached or being fetched ahead")
_READS = Counter("rsm_block_cache_reads", "Reads of one block by the block cache's decision: hit (cached or fetched "
                 "ahead), fetched (whole, by the reader: sequential), streamed (random: nothing kept)", ["result"])

MAX_AHEAD = 8
"""Blocks one copy's sequential reads fetch ahead at most (32 MiB of 4 MiB blocks: 8 GETs in flight, as read-ahead
keeps). The capacity bounds it too: a copy fetches ahead at most half the capacity divided by the copies fetching
ahead (the default 64 MiB: 8 blocks of 4 MiB for one reader; before, a quarter of the capacity for every copy
capped one reader at 4 blocks, 0.38x boto3's download in bench_s3)."""
RECENT_READS = 4096
"""Copies whose last read block is remembered (what tells a sequential read), the least recently read forgotten."""


class BlockCache:
    """Whole blocks of sequential reads (see the module doc). Thread-safe; one per storage manager.

    Keys are the data objects' full keys (with the store's key prefix), blocks their positions in them."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._blocks: OrderedDict[tuple[str, int], bytearray] = OrderedDict()
        self._fetching: dict[tuple[str, int], Future[bytearray]] = {}
        self._bytes = 0  # cached and being fetched
        self._last: OrderedDict[str, int] = OrderedDict()  # the block each copy's last read read
        self._depth: OrderedDict[str, int] = OrderedDict()  # blocks fetched ahead, per copy read sequentially
        self._unread: dict[tuple[str, int], str] = {}  # blocks fetched ahead (or being fetched), not yet read: copy
        self._ahead: dict[str, int] = {}  # per copy: its blocks in _unread
        self.hits = 0
        """Reads served from the cache (or from a block fetched ahead)."""
        self.fetched = 0
        """Blocks fetched whole (by a reader, or ahead)."""

    @property
    def size_bytes(self) -> int:
        """Bytes of blocks cached or being fetched ahead."""
        with self._lock:
            return self._bytes

    def sequential(self, segment: str, block: BlockInfo) -> bool:
        """Whether this read of ``block`` of the copy ``segment`` (its key base) follows the copy's last read: the
        same block or the next one. Notes this read as the copy's last; a read that does not follow starts over at
        one block fetched ahead."""
        with self._lock:
            last = self._last.get(segment)
            follows = last is not None and block.part_id in (last, last + 1)
            self._last[segment] = block.part_id
            self._last.move_to_end(segment)
            while len(self._last) > RECENT_READS:
                self._last.popitem(last=False)
            if not follows:
                self._depth.pop(segment, None)
            return follows

    def holds(self, key: str, block: BlockInfo) -> bool:
        """Whether ``block`` of data object ``key`` is cached or being fetched ahead."""
        where = (key, block.object_position)
        with self._lock:
            return where in self._blocks or where in self._fetching

    def depth(self, segment: str, block_length: int) -> int:
        """Blocks (of about ``block_length``) the copy ``segment``'s reads fetch ahead now: what its reads grew it to
        (see :meth:`block`), within its fair share of the capacity (see the module doc)."""
        with self._lock:
            copies = len(self._ahead) + (segment not in self._ahead)
            share = max(1, self.capacity_bytes // (2 * copies * max(1, block_length)))
            return min(self._depth.get(segment, 1), share)

    def _read_now(self, where: tuple[str, int]) -> None:
        """``where`` was read (or dropped): no longer fetched ahead and unread (lock held)."""
        segment = self._unread.pop(where, None)
        if segment is not None:
            left = self._ahead[segment] - 1
            if left:
                self._ahead[segment] = left
            else:
                del self._ahead[segment]

    def block(self, store: Store, store_key: str, key: str, block: BlockInfo, segment: str) -> bytearray:
        """The whole ``block`` of data object ``store_key`` (``key``: the same with the store's prefix): cached, being
        fetched ahead (waited for once started), or fetched now with one ranged GET and kept. A read that has to wait
        (the reader is faster than the blocks fetched ahead of it) doubles how many blocks the copy ``segment``'s
        reads fetch ahead, up to :data:`MAX_AHEAD` and a quarter of the capacity."""
        where = (key, block.object_position)
        with self._lock:
            cached = self._blocks.get(where)
            if cached is not None:
                self._blocks.move_to_end(where)
                self._read_now(where)
                self.hits += 1
                _READS.labels("hit").inc()
                return cached
            pending = self._fetching.get(where)
            self._read_now(where)
            self._depth[segment] = min(MAX_AHEAD, 2 * self._depth.get(segment, 1))
            self._depth.move_to_end(segment)
            while len(self._depth) > RECENT_READS:
                self._depth.popitem(last=False)
        if pending is not None and not pending.cancel():
            try:
                data = pending.result()
            except Exception:  # noqa: BLE001 - a failed read ahead: the reader asks again, and its error counts
                data = None
            if data is not None:
                with self._lock:
                    self.hits += 1
                _READS.labels("hit").inc()
                return data
        data = fetch_range(store, store_key, block.object_position, block.block_length)
        _READS.labels("fetched").inc()
        self._keep(where, data)
        return data

    @staticmethod
    def streamed() -> None:
        """Count a read the cache left alone (random: streamed, nothing kept)."""
        _READS.labels("streamed").inc()

    def _grow(self, n: int) -> None:
        """``n`` more bytes held (lock held)."""
        self._bytes += n
        _BYTES.inc(n)

    def prefetch(self, store: Store, store_key: str, key: str, block: BlockInfo, segment: str = "") -> None:
        """Fetch ``block`` of the copy ``segment`` ahead on the I/O pool, unless cached, being fetched, or without
        room once the least recently used blocks already read are dropped."""
        where = (key, block.object_position)
        with self._lock:
            if where in self._blocks or where in self._fetching:
                return
            if not self._make_room(block.block_length, drop_unread=False):
                return
            self._grow(block.block_length)
            fut = worker_pool().submit(fetch_range, store, store_key, block.object_position, block.block_length)
            self._fetching[where] = fut
            self._unread[where] = segment
            self._ahead[segment] = self._ahead.get(segment, 0) + 1
        fut.add_done_callback(lambda f: self._fetched_ahead(where, block.block_length, f))

    def _fetched_ahead(self, where: tuple[str, int], length: int, fut: Future[bytearray]) -> None:
        err = None if fut.cancelled() else fut.exception()
        if err is not None:
            log.debug("reading block %s ahead failed: %s", where, err)
        with self._lock:  # from being fetched to cached in one step: a reader never sees the block in neither
            self._fetching.pop(where, None)
            self._grow(-length)
            if fut.cancelled() or err is not None or not self._keep_locked(where, fut.result(), drop_unread=False):
                self._read_now(where)  # not kept: nothing unread

    def _keep(self, where: tuple[str, int], data: bytearray) -> None:
        with self._lock:
            self._keep_locked(where, data)

    def _keep_locked(self, where: tuple[str, int], data: bytearray, *, drop_unread: bool = True) -> bool:
        """Cache ``data`` at ``where``; whether it is cached now (lock held)."""
        self.fetched += 1
        if where in self._blocks:
            return True
        if not self._make_room(len(data), drop_unread=drop_unread):
            return False
        self._blocks[where] = data
        self._grow(len(data))
        return True

    def _make_room(self, n: int, *, drop_unread: bool) -> bool:
        """Drop the least recently used cached blocks already read (with ``drop_unread``, then those fetched ahead
        and not yet read) until ``n`` more bytes fit; False if they cannot (lock held)."""
        if n > self.capacity_bytes:
            return False
        if self._bytes + n > self.capacity_bytes:
            for where in [w for w in self._blocks if w not in self._unread]:
                self._drop(where)
                if self._bytes + n <= self.capacity_bytes:
                    return True
            while drop_unread and self._bytes + n > self.capacity_bytes and self._blocks:
                self._drop(next(iter(self._blocks)))
        return self._bytes + n <= self.capacity_bytes

    def _drop(self, where: tuple[str, int]) -> None:
        dropped = self._blocks.pop(where)
        self._read_now(where)
        self._grow(-len(dropped))
