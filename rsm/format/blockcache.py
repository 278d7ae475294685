"""Sequential reads made one block at a time, served by read-ahead across the reads (issue 25).

A Kafka consumer reading history through the endpoint sends Fetch after Fetch, each asking for about a block
(``max.partition.fetch.bytes``, 1 MiB by default, or a few MiB) and each opening the segment anew: no single read is
long enough for read-ahead (:mod:`rsm.format.readahead`), so each paid a first byte (about 27 ms on S3) and streamed
its block from the block's start, again for every Fetch inside the same block.

With a :class:`BlockCache`, a read of one block looks at the copy's last read:

- when it follows it (the same block, or the next one), the reads are sequential: the copy gets a *stream*, kept open
  across the reads. Where the store reads ahead (S3: the reader's ``read_ahead_bytes``), it is a
  :class:`~rsm.format.readahead.ReadAhead` over the rest of the block's data object, so the next block is predicted
  and fetched ahead exactly as a long read's are (ranged GETs of about ``read_ahead_request_bytes``, several blocks
  each; a window that grows while the reads keep waiting, within the reader's ``read_ahead_bytes`` and its fair share
  of the process's read-ahead budget, which the streams share with every other reader); where it does not, each
  block is read whole when the reads reach it: mapped where the store maps its objects (the filesystem,
  :class:`~rsm.store.base.MappedStore`: a view of the page cache's pages, no copy), else one ranged GET into one
  buffer. The stream's
  current block is kept with its entries, parsed and verified once (block framing, each batch's header and CRC-32C)
  when the stream reached it, so the Fetches inside one block slice it from memory and check nothing again; a block
  that fails its checks raises to the read that reached it and is not kept (the next read of it streams it and fails
  again);
- otherwise (a random read, or a read of a block the stream is not at) it is streamed as without the cache: one GET
  stopping where the read ends, nothing kept; a stream the reads left is closed.

Bounds: at most ``capacity_bytes // read_ahead_request_bytes`` read-ahead streams (8 with the defaults: 64 MiB,
8 MiB; one at least), or ``capacity_bytes // block size`` streams that read a block at a time (16 of 4 MiB blocks),
the least recently read closed first, and a stream not read for :data:`IDLE_S` is closed by the next read of any
copy. Memory: each stream holds what its read-ahead window holds (counted in ``rsm_read_ahead_bytes``, within the
process's budget) plus its current block's request (the block is a view of it) or the block itself: at most
``capacity_bytes`` of current blocks, and up to :data:`SPARE_BUFFERS` block buffers of streams that ended, kept
for the next (those free counted in ``rsm_block_cache_bytes`` too, let go after :data:`IDLE_S` unused). A Fetch's
answer holds views of its blocks (:class:`rsm.log.batch.RecordParts`), so a block buffer is read into again only once
no answer holds it: the listener's write lets go of an answer's parts when the call returns (what the socket did not
take is copied: :mod:`rlm.listener.net.vectored`), a proxy's answer read ahead holds them until it is used or dropped
(at most ``PREFETCHES_HELD`` in the process, :mod:`rlm.listener.upstream.proxy`), the buffers all such answers hold
within this cache's ``capacity_bytes`` (counted once each; past it an answer's records are copied out:
:mod:`rlm.listener.tier.held`). Plain copies only: an encrypted copy's blocks are opened per read.

A history Fetch through the proxy from the filesystem store (``bench/bench_tier_read.py``, 1 MiB Fetches of 4 MiB
blocks), before streams read a block whole and kept it verified: each Fetch streamed its block from the block's
start, parsing and checking every batch before its fetch offset again (2.5 MiB read and checked per 1 MiB served).

Before: blocks were fetched ahead one GET each into an LRU of whole blocks (4, then 8, blocks ahead); bench_s3 on the
latency emulator measured 0.34-0.38x boto3's download for 256 MiB read one block a read, at twice the GETs per GiB.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator

from prometheus_client import Counter, Gauge

from rsm.format.index import BlockInfo
from rsm.format.readahead import DEFAULT_REQUEST_BYTES, ReadAhead, fetch_into, new_block_buffer
from rsm.store.base import Store

__all__ = ["IDLE_S", "RECENT_READS", "BlockCache", "MapRange"]

_BYTES = Gauge("rsm_block_cache_bytes", "Bytes the block caches' streams hold: their current blocks' requests and "
               "what their read-ahead windows hold")
_caches: weakref.WeakSet[BlockCache] = weakref.WeakSet()
_BYTES.set_function(lambda: sum(c.size_bytes for c in list(_caches)))
_READS = Counter("rsm_block_cache_reads", "Reads of one block by the block cache's decision: hit (from a stream), "
                 "streamed (random: nothing kept)", ["result"])
_HIT, _STREAMED = _READS.labels("hit"), _READS.labels("streamed")  # children kept: labels() is ~5 us a call

MapRange = Callable[[str, int, int], memoryview]
"""A store's ``map_range`` (:class:`rsm.store.base.MappedStore`): key, start, length -> a read-only view."""

RECENT_READS = 4096
"""Copies whose last read block is remembered (what tells a sequential read), the least recently read forgotten."""
IDLE_S = 10.0
"""A stream not read for this long is closed (its consumer stopped): its window goes back to the other readers."""
SPARE_BUFFERS = 16
"""Free block buffers kept for the next stream that reads a block at a time (:class:`_Spares`)."""
KEPT_MAX = 4 * SPARE_BUFFERS
"""Block buffers :class:`_Spares` keeps in all, held ones included."""
SPARE_ROUND_BYTES = 64 * 1024
"""A block buffer's size is rounded up to a multiple of this: block lengths differ by a few bytes between copies."""


class _Stream:
    """One copy's sequential reads: blocks ``first..`` of one data object, read ahead (a :class:`ReadAhead`) or each
    read whole when it is reached (a store that does not read ahead), and the block handed out last with its entries
    parsed and verified (kept for the reads inside it)."""

    def __init__(self, ahead: ReadAhead | None, blocks: list[BlockInfo], key: str, store: Store,
                 spares: _Spares, map_range: MapRange | None = None) -> None:
        self.ahead = ahead
        self.key = key
        self.blocks = blocks
        self.lock = threading.Lock()
        self.it: Iterator[memoryview] = (iter(ahead) if ahead is not None else _each_mapped(map_range, key, blocks)
                                         if map_range is not None else _each_whole(store, key, blocks, spares))
        self.next = 0  # index in blocks of the block the iterator hands out next
        self.current: tuple[int, memoryview, list] | None = None  # (part id, whole block, its verified entries)
        self.used = time.monotonic()
        self.closed = False

    @property
    def current_bytes(self) -> int:
        """Bytes the current block keeps alive: the request (or the block's own buffer) it is a view of."""
        return 0 if self.current is None else len(self.current[1].obj)  # type: ignore[arg-type]

    @property
    def ahead_bytes(self) -> int:
        return 0 if self.ahead is None else self.ahead.held_bytes

    def at(self, part_id: int) -> bool:
        """Whether the stream can hand out block ``part_id``: its current block or the next."""
        if self.current is not None and self.current[0] == part_id:
            return True
        return self.next < len(self.blocks) and self.blocks[self.next].part_id == part_id

    def take(self, part_id: int, parse: Callable[[memoryview], list]) -> list | None:
        """The verified entries of block ``part_id`` (``parse`` of the whole block, once per block: an error it
        raises is raised here and nothing is kept); None if the stream is not at it (any more: another read of the
        copy moved it on or closed it meanwhile). Call with :attr:`lock` held."""
        if self.closed or not self.at(part_id):
            return None
        self.used = time.monotonic()
        if self.current is not None and self.current[0] == part_id:
            return self.current[2]
        self.current = None  # the previous block's request may go
        view = next(self.it)
        self.next += 1
        if self.next == len(self.blocks):  # the last: its window ends now (no longer a reader sharing the budget)
            self.it.close()  # type: ignore[attr-defined]
        entries = parse(view)
        self.current = (part_id, view, entries)
        return entries

    def close(self) -> None:
        """End the read-ahead (call with :attr:`lock` held)."""
        self.closed = True
        self.current = None
        self.it.close()  # type: ignore[attr-defined]


class _Spares:
    """Block buffers no stream reads into any more (:func:`_each_whole`: a store that neither reads ahead nor maps;
    measured below on the filesystem store, before it mapped), handed to the next stream that needs one: a stream
    ends with its data object (with each segment: every 2 blocks of 8 MiB segments, bench_proxy's 8 partitions), and
    a new buffer cost its page faults (1.5 ms of CPU per 4 MiB; bench_proxy's profile of that read: 56 new buffers).
    A buffer is given when its stream is done with it, usually while still held (the stream keeps its last block for
    the reads inside it until the reads of the next segment push it out; an answer holds views of it until it is
    written: :class:`rsm.log.batch.RecordParts`), and handed out only once nothing refers to it.

    Kept: every buffer given while it is still held (it is alive anyway; up to :data:`KEPT_MAX`), and of those free the
    :data:`SPARE_BUFFERS` given last (enough for as many streams as ``capacity_bytes`` allows of 4 MiB blocks); one
    free and not taken for :data:`IDLE_S` is let go. Held ones are not pushed out by later gives: with answers
    holding views (bench_proxy's 8 partitions: a block per partition in the answer being written, another in the one
    read ahead), more than 16 buffers go round, and a buffer pushed out while held was lost to reuse once free (58
    new buffers in that read's profile, 0.13 s of 1.8)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: list[tuple[bytearray, float]] = []  # (buffer, when given), oldest first

    def take(self, n: int) -> bytearray:
        """A buffer of at least ``n`` bytes that nothing refers to: a spare, else a new one."""
        now = time.monotonic()
        with self._lock:
            for entry in list(self._kept):
                buf = entry[0]
                # references: the entry's, this frame's, getrefcount's argument; a view's managed buffer one more
                if sys.getrefcount(buf) != 3:
                    continue
                if len(buf) >= n:
                    self._kept.remove(entry)
                    return buf
                if now - entry[1] > IDLE_S:
                    self._kept.remove(entry)
        return new_block_buffer(n + (-n % SPARE_ROUND_BYTES))  # rounded up: a spare fits the next copy's blocks

    def give(self, buf: bytearray) -> None:
        """Keep ``buf`` (its stream is done with it) for the next stream; of the free ones, the oldest beyond
        :data:`SPARE_BUFFERS` let go (and the oldest of all beyond :data:`KEPT_MAX`)."""
        with self._lock:
            self._kept.append((buf, time.monotonic()))
            self._prune()

    def _prune(self) -> None:
        """Let go of the oldest free spares beyond :data:`SPARE_BUFFERS`, and the oldest beyond :data:`KEPT_MAX`
        (call with the lock held)."""
        free = 0
        for i in range(len(self._kept) - 1, -1, -1):  # newest first
            b = self._kept[i][0]
            # references: the entry's, ``b``, getrefcount's argument
            if sys.getrefcount(b) == 3:
                free += 1
                if free > SPARE_BUFFERS:
                    del self._kept[i]
            del b
        del self._kept[:-KEPT_MAX]

    @property
    def size_bytes(self) -> int:
        """Bytes of the spares nothing else refers to (a held one is counted by what holds it)."""
        with self._lock:
            self._prune()
            entries = list(self._kept)
        # references: the entry's, the comprehension's, getrefcount's argument
        return sum(len(b) for b, _t in entries if sys.getrefcount(b) == 3)


def _each_mapped(map_range: MapRange, key: str, blocks: list[BlockInfo]) -> Iterator[memoryview]:
    """Each of ``blocks`` whole, mapped when it is asked for (a store whose objects are files:
    :meth:`rsm.store.fs.FileSystemStore.map_range`): a view of the page cache's pages, where :func:`_each_whole`
    copied them into a buffer first (bench_tier_read: the copy was ~35% of a history Fetch's tier read; the block's
    checks then read the mapped pages, and the socket's write takes them from there). A block's mapping is its own
    (a view's ``obj``), of the block's size: what holds views of it is counted by that size, as a buffer's
    (:mod:`rlm.listener.tier.held`, :attr:`_Stream.current_bytes`), and it goes when the last view does."""
    for b in blocks:
        yield map_range(key, b.object_position, b.block_length)


def _each_whole(store: Store, key: str, blocks: list[BlockInfo], spares: _Spares) -> Iterator[memoryview]:
    """Each of ``blocks`` whole, read when it is asked for (one ranged GET: a store that does not read ahead). The
    stream's one buffer is read into again for the next block once no view of the previous one is alive (its
    entries are views of it, and a read may still hold them: a Fetch gathering batches of two blocks), else a new
    one. A new buffer per block cost its page faults on the listener's threads: 1.5 ms of CPU per 4 MiB block in
    bench_proxy's profile of a history read, about as much as reading and checking the block; with the buffer
    reused bench_tier_read's CPU per GiB fell 10-20% (0.57-0.70 -> 0.52-0.59 s, 8 partitions; threaded runs)."""
    buf: bytearray | None = None
    largest = max((b.block_length for b in blocks), default=0)
    try:
        for b in blocks:
            # references: this frame's and getrefcount's argument; views of it add their managed buffer's
            if buf is None or sys.getrefcount(buf) > 2:
                if buf is not None:
                    spares.give(buf)  # free once its views are gone
                buf = spares.take(largest)
            view = memoryview(buf)[:b.block_length]
            fetch_into(store, key, b.object_position, view)
            yield view
            del view
    finally:
        if buf is not None:
            spares.give(buf)


class BlockCache:
    """Streams for sequential reads of one block at a time (see the module doc). Thread-safe; one per storage
    manager. Copies are named by their key base with the store's key prefix; keys are data objects' store keys."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._last: OrderedDict[str, int] = OrderedDict()  # the block each copy's last read read
        self._streams: OrderedDict[str, _Stream] = OrderedDict()
        self._spares = _Spares()  # block buffers of streams that ended (_each_whole)
        self.hits = 0
        """Reads served by a stream."""
        self.streams_opened = 0
        """Streams opened (sequential reads detected, or a stream's data object ended and the next begun)."""
        _caches.add(self)

    @property
    def size_bytes(self) -> int:
        """Bytes the streams hold: current blocks' requests and read-ahead windows; and the spare block buffers."""
        with self._lock:
            streams = list(self._streams.values())
        return sum(s.current_bytes + s.ahead_bytes for s in streams) + self._spares.size_bytes

    @property
    def streams(self) -> int:
        """Streams open now."""
        with self._lock:
            return len(self._streams)

    def sequential(self, segment: str, block: BlockInfo) -> bool:
        """Whether this read of ``block`` of the copy ``segment`` follows the copy's last read: the same block or the
        next one. Notes this read as the copy's last."""
        with self._lock:
            last = self._last.get(segment)
            follows = last is not None and block.part_id in (last, last + 1)
            self._last[segment] = block.part_id
            self._last.move_to_end(segment)
            while len(self._last) > RECENT_READS:
                self._last.popitem(last=False)
            return follows

    def read(self, store: Store, key: str, blocks: list[BlockInfo], i: int, segment: str, *, budget_bytes: int,
             parse: Callable[[memoryview], list], request_bytes: int = DEFAULT_REQUEST_BYTES,
             map_range: MapRange | None = None) -> list | None:
        """The entries of block ``blocks[i]`` of the copy ``segment``, from its stream: ``parse`` of the whole block
        (its entries verified), run once per block and kept with it; or None: the read is random (the caller streams
        it). ``blocks``: the copy's blocks; ``key``: the block's data object's store key; ``budget_bytes`` and
        ``request_bytes``: a new stream's read-ahead (see :class:`ReadAhead`); 0: the store does not read ahead, a
        stream reads each block whole when it is reached (one ranged GET), or maps it with ``map_range`` when given
        (the store's :class:`~rsm.store.base.MappedStore`: the filesystem)."""
        block = blocks[i]
        sequential = self.sequential(segment, block)
        stream, stale = self._stream(segment, block.part_id)
        for s in stale:
            with s.lock:
                s.close()
        if stream is None and sequential and (budget_bytes <= 0 or 2 * block.block_length <= budget_bytes):
            j = i
            while j + 1 < len(blocks) and blocks[j + 1].object_number == block.object_number:
                j += 1
            ahead = ReadAhead(store, key, blocks[i:j + 1], budget_bytes=budget_bytes,
                              request_bytes=request_bytes) if budget_bytes > 0 else None
            stream = _Stream(ahead, blocks[i:j + 1], key, store, self._spares,
                             map_range if ahead is None else None)
            for s in self._open(segment, stream, request_bytes if ahead is not None else block.block_length):
                with s.lock:
                    s.close()
        entries = None
        if stream is not None:
            with stream.lock:
                try:
                    entries = stream.take(block.part_id, parse)
                except BaseException:
                    self._forget(segment, stream)
                    stream.close()
                    raise
        if entries is None:
            _STREAMED.inc()
            return None
        with self._lock:
            self.hits += 1
        _HIT.inc()
        return entries

    def _stream(self, segment: str, part_id: int) -> tuple[_Stream | None, list[_Stream]]:
        """The copy's stream if it can hand out ``part_id``; and the streams to close: idle ones, and the copy's own
        if it cannot (the reads left it)."""
        now = time.monotonic()
        stale: list[_Stream] = []
        with self._lock:
            for name, s in list(self._streams.items()):
                if now - s.used > IDLE_S:
                    stale.append(self._streams.pop(name))
            s = self._streams.get(segment)
            if s is not None and s.at(part_id):
                self._streams.move_to_end(segment)
                return s, stale
            if s is not None:
                stale.append(self._streams.pop(segment))
            return None, stale

    def _open(self, segment: str, stream: _Stream, unit_bytes: int) -> list[_Stream]:
        """Keep ``stream`` as the copy's; the streams past the most (the least recently read) are returned to close.
        ``unit_bytes``: what a stream's current block keeps alive (its read-ahead request, or the block)."""
        most = max(1, self.capacity_bytes // max(1, unit_bytes))
        out = []
        with self._lock:
            old = self._streams.pop(segment, None)
            if old is not None:
                out.append(old)
            self._streams[segment] = stream
            while len(self._streams) > most:
                out.append(self._streams.popitem(last=False)[1])
            self.streams_opened += 1
        return out

    def _forget(self, segment: str, stream: _Stream) -> None:
        with self._lock:
            if self._streams.get(segment) is stream:
                del self._streams[segment]

    def close(self) -> None:
        """Close every stream (their requests not started are cancelled)."""
        with self._lock:
            streams = list(self._streams.values())
            self._streams.clear()
        for s in streams:
            with s.lock:
                s.close()
