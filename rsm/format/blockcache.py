"""Sequential reads made one block at a time, served by read-ahead across the reads (issue 25).

A Kafka consumer reading history through the endpoint sends Fetch after Fetch, each asking for about a block
(``max.partition.fetch.bytes``, 1 MiB by default, or a few MiB) and each opening the segment anew: no single read is
long enough for read-ahead (:mod:`rsm.format.readahead`), so each paid a first byte (about 27 ms on S3) and streamed
its block from the block's start, again for every Fetch inside the same block.

With a :class:`BlockCache`, a read of one block looks at the copy's last read:

- when it follows it (the same block, or the next one), the reads are sequential: the copy gets a *stream*, a
  :class:`~rsm.format.readahead.ReadAhead` over the rest of the block's data object, kept open across the reads, so
  the next block is predicted and fetched ahead exactly as a long read's are (ranged GETs of about
  ``read_ahead_request_bytes``, several blocks each; a window that grows while the reads keep waiting, within the
  reader's ``read_ahead_bytes`` and its fair share of the process's read-ahead budget, which the streams share with
  every other reader). The stream's current block is kept, so the Fetches inside one block read it from memory;
- otherwise (a random read, or a read of a block the stream is not at) it is streamed as without the cache: one GET
  stopping where the read ends, nothing kept; a stream the reads left is closed.

Bounds: at most ``capacity_bytes // read_ahead_request_bytes`` streams (8 with the defaults: 64 MiB, 8 MiB; one at
least), the least recently read closed first, and a stream not read for :data:`IDLE_S` is closed by the next read of
any copy. Memory: each stream holds what its read-ahead window holds (counted in ``rsm_read_ahead_bytes``, within the
process's budget) plus its current block's request (the block is a view of it): at most ``capacity_bytes`` of
current requests. Plain copies only: an encrypted copy's blocks are opened per read.

Before: blocks were fetched ahead one GET each into an LRU of whole blocks (4, then 8, blocks ahead); bench_s3 on the
latency emulator measured 0.34-0.38x boto3's download for 256 MiB read one block a read, at twice the GETs per GiB.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterator

from prometheus_client import Counter, Gauge

from rsm.format.index import BlockInfo
from rsm.format.readahead import DEFAULT_REQUEST_BYTES, ReadAhead
from rsm.store.base import Store

__all__ = ["IDLE_S", "RECENT_READS", "BlockCache"]

_BYTES = Gauge("rsm_block_cache_bytes", "Bytes the block caches' streams hold: their current blocks' requests and "
               "what their read-ahead windows hold")
_caches: weakref.WeakSet[BlockCache] = weakref.WeakSet()
_BYTES.set_function(lambda: sum(c.size_bytes for c in list(_caches)))
_READS = Counter("rsm_block_cache_reads", "Reads of one block by the block cache's decision: hit (from a stream), "
                 "streamed (random: nothing kept)", ["result"])

RECENT_READS = 4096
"""Copies whose last read block is remembered (what tells a sequential read), the least recently read forgotten."""
IDLE_S = 10.0
"""A stream not read for this long is closed (its consumer stopped): its window goes back to the other readers."""


class _Stream:
    """One copy's sequential reads: a read-ahead over blocks ``first..`` of one data object, and the block handed
    out last (kept for the reads inside it)."""

    def __init__(self, ahead: ReadAhead, blocks: list[BlockInfo], key: str) -> None:
        self.ahead = ahead
        self.key = key
        self.blocks = blocks
        self.lock = threading.Lock()
        self.it: Iterator[memoryview] = iter(ahead)
        self.next = 0  # index in blocks of the block the iterator hands out next
        self.current: tuple[int, memoryview] | None = None  # (part id, whole block)
        self.used = time.monotonic()
        self.closed = False

    @property
    def current_bytes(self) -> int:
        """Bytes the current block keeps alive: the request it is a view of."""
        return 0 if self.current is None else len(self.current[1].obj)  # type: ignore[arg-type]

    def at(self, part_id: int) -> bool:
        """Whether the stream can hand out block ``part_id``: its current block or the next."""
        if self.current is not None and self.current[0] == part_id:
            return True
        return self.next < len(self.blocks) and self.blocks[self.next].part_id == part_id

    def take(self, part_id: int) -> memoryview | None:
        """Block ``part_id``, whole; None if the stream is not at it (any more: another read of the copy moved it on
        or closed it meanwhile). Call with :attr:`lock` held."""
        if self.closed or not self.at(part_id):
            return None
        self.used = time.monotonic()
        if self.current is not None and self.current[0] == part_id:
            return self.current[1]
        self.current = None  # the previous block's request may go
        view = next(self.it)
        self.next += 1
        self.current = (part_id, view)
        if self.next == len(self.blocks):  # the last: its window ends now (no longer a reader sharing the budget)
            self.it.close()  # type: ignore[attr-defined]
        return view

    def close(self) -> None:
        """End the read-ahead (call with :attr:`lock` held)."""
        self.closed = True
        self.current = None
        self.it.close()  # type: ignore[attr-defined]


class BlockCache:
    """Streams for sequential reads of one block at a time (see the module doc). Thread-safe; one per storage
    manager. Copies are named by their key base with the store's key prefix; keys are data objects' store keys."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._last: OrderedDict[str, int] = OrderedDict()  # the block each copy's last read read
        self._streams: OrderedDict[str, _Stream] = OrderedDict()
        self.hits = 0
        """Reads served by a stream."""
        self.streams_opened = 0
        """Streams opened (sequential reads detected, or a stream's data object ended and the next begun)."""
        _caches.add(self)

    @property
    def size_bytes(self) -> int:
        """Bytes the streams hold: current blocks' requests and read-ahead windows."""
        with self._lock:
            streams = list(self._streams.values())
        return sum(s.current_bytes + s.ahead.held_bytes for s in streams)

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
             request_bytes: int = DEFAULT_REQUEST_BYTES) -> memoryview | None:
        """Block ``blocks[i]`` of the copy ``segment`` whole, from its stream, or None: the read is random (the
        caller streams it). ``blocks``: the copy's blocks; ``key``: the block's data object's store key;
        ``budget_bytes`` and ``request_bytes``: a new stream's read-ahead (see :class:`ReadAhead`)."""
        block = blocks[i]
        sequential = self.sequential(segment, block)
        stream, stale = self._stream(segment, block.part_id)
        for s in stale:
            with s.lock:
                s.close()
        if stream is None and sequential and 2 * block.block_length <= budget_bytes:
            j = i
            while j + 1 < len(blocks) and blocks[j + 1].object_number == block.object_number:
                j += 1
            stream = _Stream(ReadAhead(store, key, blocks[i:j + 1], budget_bytes=budget_bytes,
                                       request_bytes=request_bytes), blocks[i:j + 1], key)
            for s in self._open(segment, stream, request_bytes):
                with s.lock:
                    s.close()
        view = None
        if stream is not None:
            with stream.lock:
                try:
                    view = stream.take(block.part_id)
                except BaseException:
                    self._forget(segment, stream)
                    stream.close()
                    raise
        if view is None:
            _READS.labels("streamed").inc()
            return None
        with self._lock:
            self.hits += 1
        _READS.labels("hit").inc()
        return view

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

    def _open(self, segment: str, stream: _Stream, request_bytes: int) -> list[_Stream]:
        """Keep ``stream`` as the copy's; the streams past the most (the least recently read) are returned to close."""
        most = max(1, self.capacity_bytes // max(1, request_bytes))
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
