"""Read-ahead for sequential reads: the blocks of a read fetched by ranged GETs in flight, ahead of the parser.

One GET streaming a whole data object carries what one connection carries (S3: about 88 MB/s, issue 25). A reader
of many blocks instead asks for them in requests of about ``request_bytes`` (whole blocks, at least one), several
in flight on the process's shared I/O pool (:func:`rsm.format.crypto.worker_pool`), and hands them out in order.

Bounds: a reader starts requests while the bytes it has in flight or fetched and not yet handed out stay within
``budget_bytes`` and within its fair share of the process's :data:`PROCESS_BUDGET_BYTES` (that budget divided by the
readers reading now), and the process's within that budget (one request per reader at least, so every reader
moves), so a reader holds at most ``budget_bytes`` ahead plus the request being parsed (its entries are views of it;
a caller keeping an entry keeps that request's buffer). Fair: a reader that came first gives back what passes its
share as it hands blocks out (it starts no request until it is under it), so one that comes later grows its window
to its share instead of reading one request at a time behind the first. The process's total is
:func:`read_ahead_bytes` and the gauge ``rsm_read_ahead_bytes``. The caller reads ahead only blocks that fit the
budget twice over (:meth:`rsm.format.reader.SegmentReader.iter_entries`; larger ones stream entry by entry, as
without read-ahead).

Adaptive: a reader's window starts at :data:`START_REQUESTS` requests (or at ``budget_bytes / GROWTH`` when that
is more, so that one wait takes it to the budget) and grows :data:`GROWTH` times, up to ``budget_bytes``, each time
the caller asks for a request faster than the window fetches (a consumer catching up, a Spark task): the request has
not arrived, or the caller spent less time on the request before than the window needs per request (the last
request's fetch time over the requests the window holds). The second is what tells a fast caller at its second
request already, which has arrived with the first (both started together); waiting for a request not arrived told
it only at the third, a round trip later at a fifth of the budget. A slow caller (a live Kafka consumer) finds its
requests fetched and takes its time on them, and keeps the small window, so it holds a fraction of the budget; one
that stops after its first request (a broker's remote Fetch of a few MiB) never grows it.

Order and errors: blocks come out in order; a request's error is raised when its blocks are asked for, never
earlier. Closing early (the caller stops iterating: a bounded Fetch, an early ``close``) cancels the requests not
yet started; those running finish on their own and their buffers are dropped as they do (no caller waits for them).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future

from prometheus_client import Gauge

from rsm.errors import CorruptRemoteObjectError
from rsm.format.crypto import worker_pool
from rsm.format.index import BlockInfo
from rsm.store.base import Store

__all__ = ["DEFAULT_REQUEST_BYTES", "GROWTH", "PROCESS_BUDGET_BYTES", "START_REQUESTS", "ReadAhead", "fair_share_bytes",
           "fetch_into", "fetch_range", "new_block_buffer", "read_ahead_bytes"]

MiB = 1024 * 1024
DEFAULT_REQUEST_BYTES = 8 * MiB
"""Bytes one read-ahead GET asks for (whole blocks): boto3's transfer manager's chunk size."""
PROCESS_BUDGET_BYTES = 256 * MiB
"""Bytes all the process's readers together read ahead, beyond one request each."""
START_REQUESTS = 2
"""A reader's window starts at this many requests and grows :data:`GROWTH` times (up to its budget) each time the
caller asks for a request not yet fetched."""
GROWTH = 4
"""How much a window grows when its caller waits: one wait takes the start (a quarter of the budget: 20 MiB of the
S3 default 80 MiB, two 8 MiB requests) to the budget (doubling took two, and a whole-segment read on the latency
emulator measured 236 vs 259 MB/s, median of 5, against a window starting at its budget)."""

_READ_AHEAD_BYTES = Gauge("rsm_read_ahead_bytes", "Bytes of blocks read ahead: in flight, or fetched and not yet "
                          "handed to their reader")
_lock = threading.Lock()
_held = 0
_readers = 0  # ReadAhead windows open now (started iterating, not yet closed)


def read_ahead_bytes() -> int:
    """Bytes the process's read-ahead windows hold now (in flight, or fetched and not yet handed out)."""
    with _lock:
        return _held


def fair_share_bytes() -> int:
    """What one reader may read ahead of the process's budget now: the budget divided by the readers reading."""
    with _lock:
        return PROCESS_BUDGET_BYTES // max(1, _readers)


def _reading(n: int) -> None:
    global _readers
    with _lock:
        _readers += n


def _account(n: int) -> None:
    global _held
    with _lock:
        _held += n
    _READ_AHEAD_BYTES.inc(n)


def new_block_buffer(n: int) -> bytearray:
    """A buffer for ``n`` fetched bytes (a module function so a test can track the buffers)."""
    return bytearray(n)


def fetch_range(store: Store, key: str, start: int, n: int) -> bytearray:
    """Bytes ``start..start + n - 1`` of ``key``, whole, with one ranged GET (streamed into one buffer)."""
    buf = new_block_buffer(n)
    fetch_into(store, key, start, memoryview(buf))
    return buf


def fetch_into(store: Store, key: str, start: int, view: memoryview) -> None:
    """Bytes ``start..start + len(view) - 1`` of ``key`` into ``view``, with one ranged GET."""
    n = len(view)
    got = 0
    with store.get(key, start, start + n - 1) as stream:
        readinto = stream.readinto  # type: ignore[attr-defined]
        while got < n:
            k = readinto(view[got:])
            if not k:
                raise CorruptRemoteObjectError(f"truncated read: expected {n} bytes, found {got}", key=key,
                                               position=start + got)
            got += k


class ReadAhead:
    """The whole blocks of consecutive ``blocks`` of data object ``key``, fetched ahead (see the module doc).
    Iterate once: a memoryview of each block, in order; :meth:`close` (or closing the iterator) ends it early."""

    def __init__(self, store: Store, key: str, blocks: list[BlockInfo], *, budget_bytes: int,
                 request_bytes: int = DEFAULT_REQUEST_BYTES) -> None:
        self._store = store
        self._key = key
        self._budget = budget_bytes
        self._units: deque[tuple[int, int, list[BlockInfo]]] = deque()  # (position, length, blocks) to fetch
        for b in blocks:
            if self._units:
                pos, length, unit = self._units[-1]
                if pos + length == b.object_position and length + b.block_length <= request_bytes:
                    unit.append(b)
                    self._units[-1] = (pos, length + b.block_length, unit)
                    continue
            self._units.append((b.object_position, b.block_length, [b]))
        self._pending: deque[tuple[Future[bytearray], int, list[BlockInfo]]] = deque()
        self._in_window = 0  # bytes of this reader's pending requests (each released once, when it is dropped)
        self._closed = False
        self._counted = False  # among the readers sharing the process's budget
        self._window = min(budget_bytes, max(START_REQUESTS * request_bytes, budget_bytes // GROWTH))
        self._handed = 0  # requests handed out
        self._handed_at = 0.0  # when the last was (had arrived and was handed out: time.monotonic)
        self._fetch_s = 0.0  # how long the last request that arrived took, from its start

    @property
    def held_bytes(self) -> int:
        """Bytes of this reader's requests in flight, or fetched and not yet handed out."""
        return self._in_window

    @property
    def window_bytes(self) -> int:
        """What this reader may hold ahead now (it grows while the caller waits; see the module doc)."""
        return self._window

    def _fill(self) -> None:
        budget = min(self._window, fair_share_bytes())
        while self._units:
            length = self._units[0][1]
            if self._pending and (self._in_window + length > budget
                                  or read_ahead_bytes() + length > PROCESS_BUDGET_BYTES):
                return
            pos, length, unit = self._units.popleft()
            _account(length)
            self._in_window += length
            fut = worker_pool().submit(self._fetch, pos, length)
            self._pending.append((fut, length, unit))

    def _fetch(self, pos: int, length: int) -> bytearray:
        t0 = time.monotonic()
        buf = fetch_range(self._store, self._key, pos, length)
        self._fetch_s = time.monotonic() - t0
        return buf

    def _caller_is_faster(self, fut: Future[bytearray], length: int) -> bool:
        """Whether the caller, asking for the request ``fut`` (of ``length`` bytes), reads faster than the window
        fetches: the request has not arrived, or the caller took less time on the request before than the window
        needs to fetch one (a request's fetch time over the requests the window holds)."""
        if not fut.done():
            return True
        if not self._units:  # nothing left to start: a wider window could not be used (and the caller's time on
            return False     # its last requests, all fetched, tells nothing)
        took = time.monotonic() - self._handed_at
        return took * self._window < self._fetch_s * length

    def _release(self, length: int) -> None:
        self._in_window -= length
        _account(-length)

    def __iter__(self) -> Iterator[memoryview]:
        if not self._closed and not self._counted:
            self._counted = True
            _reading(1)
        try:
            while not self._closed and (self._pending or self._units):
                self._fill()
                fut, length, unit = self._pending.popleft()
                if self._handed and self._caller_is_faster(fut, length):  # widen the window
                    self._window = min(self._budget, GROWTH * self._window)
                self._handed += 1
                try:
                    buf = fut.result()
                finally:
                    self._release(length)  # handed out (or failed): the caller's now, not the window's
                self._handed_at = time.monotonic()  # the caller's time on this request starts
                self._fill()  # the next request starts before this one is parsed
                view = memoryview(buf)
                start = unit[0].object_position
                for b in unit:
                    yield view[b.object_position - start:b.object_position - start + b.block_length]
        finally:
            self.close()

    def close(self) -> None:
        """Stop: cancel the requests not started; a running one's buffer is released when it finishes."""
        self._closed = True
        if self._counted:
            self._counted = False
            _reading(-1)
        self._units.clear()
        while self._pending:
            fut, length, _ = self._pending.popleft()
            if fut.cancel() or fut.done():
                self._release(length)
            else:
                self._in_window -= length
                fut.add_done_callback(lambda _f, n=length: _account(-n))
