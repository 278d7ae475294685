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
  one GET at a time), up to :data:`MAX_AHEAD`;
- a block cached or being fetched ahead is used by any read of it;
- otherwise (a random read) it is streamed as without the cache: one GET stopping where the read ends, nothing kept,
  nothing fetched ahead.

Bounds: at most ``capacity_bytes`` of whole blocks, cached or being fetched ahead; the least recently used go first;
a block fetched ahead is never waited for by a reader if it has not started (the reader cancels it and fetches the
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
"""Blocks one copy's sequential reads fetch ahead at most (32 MiB of 4 MiB blocks: about 8 GETs in flight, as
read-ahead keeps)."""
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

    def depth(self, segment: str) -> int:
        """Blocks the copy ``segment``'s reads fetch ahead now (see :meth:`block`)."""
        with self._lock:
            return self._depth.get(segment, 1)

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
                self.hits += 1
                _READS.labels("hit").inc()
                return cached
            pending = self._fetching.get(where)
            most = max(1, min(MAX_AHEAD, self.capacity_bytes // (4 * block.block_length)))
            self._depth[segment] = min(most, 2 * self._depth.get(segment, 1))
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

    def prefetch(self, store: Store, store_key: str, key: str, block: BlockInfo) -> None:
        """Fetch ``block`` ahead on the I/O pool, unless cached, being fetched, or without room once the least
        recently used cached blocks are dropped."""
        where = (key, block.object_position)
        with self._lock:
            if where in self._blocks or where in self._fetching:
                return
            if not self._make_room(block.block_length):
                return
            self._grow(block.block_length)
            fut = worker_pool().submit(fetch_range, store, store_key, block.object_position, block.block_length)
            self._fetching[where] = fut
        fut.add_done_callback(lambda f: self._fetched_ahead(where, block.block_length, f))

    def _fetched_ahead(self, where: tuple[str, int], length: int, fut: Future[bytearray]) -> None:
        err = None if fut.cancelled() else fut.exception()
        if err is not None:
            log.debug("reading block %s ahead failed: %s", where, err)
        with self._lock:  # from being fetched to cached in one step: a reader never sees the block in neither
            self._fetching.pop(where, None)
            self._grow(-length)
            if not fut.cancelled() and err is None:
                self._keep_locked(where, fut.result())

    def _keep(self, where: tuple[str, int], data: bytearray) -> None:
        with self._lock:
            self._keep_locked(where, data)

    def _keep_locked(self, where: tuple[str, int], data: bytearray) -> None:
        self.fetched += 1
        if where in self._blocks or not self._make_room(len(data)):
            return
        self._blocks[where] = data
        self._grow(len(data))

    def _make_room(self, n: int) -> bool:
        """Drop the least recently used cached blocks until ``n`` more bytes fit; False if they cannot (lock held)."""
        if n > self.capacity_bytes:
            return False
        while self._bytes + n > self.capacity_bytes and self._blocks:
            _, dropped = self._blocks.popitem(last=False)
            self._grow(-len(dropped))
        return self._bytes + n <= self.capacity_bytes
