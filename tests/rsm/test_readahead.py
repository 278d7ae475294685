"""Read-ahead (rsm/format/readahead.py): a sequential read with ranged GETs in flight returns exactly the bytes of
one streamed GET, in order, on the filesystem store and on S3; it stays within its window; a reader closed early
starts no more GETs and lets go of every buffer; a failed GET is raised at its own block, not before."""

from __future__ import annotations

import gc
import random
import struct
import threading
import time
import uuid
import weakref
from concurrent.futures import wait
from pathlib import Path

import pytest

from rsm.api import LogSegmentData, RemoteSegmentMetadata
from rsm.errors import RemoteStorageError
from rsm.format import readahead
from rsm.log.batch import batch_crc
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import FileSystemStore
from rsm.store.s3 import S3Store
from tests.support.stores import new_bucket, s3_client_for

KiB = 1024


def _batch(base: int, n: int, rng: random.Random) -> bytes:
    """An uncompressed v2 batch of ``n`` records with 200-byte values (zigzag varints: 200 -> 0x90 0x03)."""
    recs = b"".join(bytes([0x9C, 0x03]) + bytes([0, 0, i * 2, 1]) + b"\x90\x03" + rng.randbytes(200) + b"\x00"
                    for i in range(n))
    ts = 1_700_000_000_000
    tail = struct.pack(">hiqqqhii", 0, n - 1, ts, ts, -1, -1, -1, n)
    after_len = struct.pack(">ibI", 0, 2, 0) + tail + recs
    data = bytearray(struct.pack(">qi", base, len(after_len)) + after_len)
    data[17:21] = struct.pack(">I", batch_crc(data))
    return bytes(data)


def _segment(tmp: Path) -> tuple[LogSegmentData, bytes, int]:
    rng = random.Random(4)
    log = bytearray()
    offset = 0
    for _ in range(300):
        n = rng.randrange(1, 20)
        log += _batch(offset, n, rng)
        offset += n
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "0.log").write_bytes(log)
    (tmp / "0.index").write_bytes(b"")
    (tmp / "0.timeindex").write_bytes(b"")
    return LogSegmentData(tmp / "0.log", tmp / "0.index", tmp / "0.timeindex", None, None, b"0\n0\n"), bytes(log), \
        offset - 1


# small blocks in several data objects: many requests, windows that cross object boundaries
SMALL = {"block_size_bytes": 16 * KiB, "max_data_object_bytes": 200 * KiB}


def _copy(store, tmp: Path) -> tuple[RemoteSegmentMetadata, bytes]:
    data, log, last = _segment(tmp)
    md = RemoteSegmentMetadata(uuid.uuid4(), uuid.uuid4(), "ra", 0, 0, last)
    RemoteStorageManager(RsmConfig(**SMALL), store).copy_log_segment_data(md, data)
    return md, log


def _read(rsm: RemoteStorageManager, md: RemoteSegmentMetadata, lo: int, hi: int) -> list[tuple[int, bytes]]:
    return [(h.base_offset, bytes(d)) for h, d in rsm.open_segment(md).batches(lo, hi)]


@pytest.mark.parametrize("kind", ["fs", "moto"])
def test_read_ahead_returns_the_same_bytes_in_order(kind: str, tmp_path: Path, request) -> None:
    if kind == "fs":
        store = FileSystemStore(tmp_path / "remote")
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        store = S3Store(new_bucket(s3_client_for(endpoint)), endpoint_url=endpoint, region_name="us-east-1")
    md, log = _copy(store, tmp_path / "local")
    streamed = RemoteStorageManager(RsmConfig(**SMALL, read_ahead_bytes=0), store)
    ahead = RemoteStorageManager(RsmConfig(**SMALL, read_ahead_bytes=48 * KiB, read_ahead_request_bytes=32 * KiB),
                                 store)
    blocks = len(ahead.reader(md).ledger.blocks)
    assert blocks > 20 and len(ahead.reader(md).ledger.metadata.data_object_lengths) > 3
    whole = _read(streamed, md, 0, md.end_offset_inclusive)
    assert b"".join(d for _, d in whole) == log
    before = store.requests.snapshot()
    assert _read(ahead, md, 0, md.end_offset_inclusive) == whole
    gets = sum(v - before.get(k, 0) for k, v in store.requests.snapshot().items() if k.lower().startswith("get"))
    assert gets >= blocks // 2  # ranged requests of two 16 KiB blocks each, not one stream per object
    for lo, hi in ((7, 9), (500, 1900), (md.end_offset_inclusive - 3, md.end_offset_inclusive)):
        assert _read(ahead, md, lo, hi) == _read(streamed, md, lo, hi)
    with ahead.fetch_log_segment(md, 1000, len(log) - 1000) as f:
        assert f.read() == log[1000:len(log) - 999]
    assert readahead.read_ahead_bytes() == 0


def test_the_budgets_bound_what_is_read_ahead(tmp_path: Path, monkeypatch) -> None:
    store = FileSystemStore(tmp_path / "remote")
    md, log = _copy(store, tmp_path / "local")
    objects = len(RemoteStorageManager(RsmConfig(**SMALL), store).reader(md).ledger.metadata.data_object_lengths)

    def read(budget: int) -> tuple[int, int]:
        """(GETs of the read, the most the process held ahead while it ran)"""
        rsm = RemoteStorageManager(RsmConfig(**SMALL, read_ahead_bytes=budget, read_ahead_request_bytes=16 * KiB),
                                   store)
        handle = rsm.open_segment(md)
        before = store.requests.snapshot().get("get", 0)
        peak = 0
        got = bytearray()
        for _, data in handle.batches(0, md.end_offset_inclusive):
            got += data
            peak = max(peak, readahead.read_ahead_bytes())
        assert got == log
        return store.requests.snapshot().get("get", 0) - before, peak

    # blocks of up to 16 KiB: a budget under two of them streams each object with one GET, as without read-ahead
    assert read(24 * KiB) == (objects, 0)
    gets, peak = read(64 * KiB)
    assert gets > 2 * objects and 0 < peak <= 64 * KiB
    monkeypatch.setattr(readahead, "PROCESS_BUDGET_BYTES", 0)  # the process's budget spent: one request each
    gets, peak = read(64 * KiB)
    assert gets > 2 * objects and 0 < peak <= 16 * KiB


class _Tracked(bytearray):
    """A buffer a weak reference can follow."""


def test_a_reader_closed_early_starts_no_more_gets_and_frees_its_buffers(tmp_path: Path, monkeypatch) -> None:
    store = FileSystemStore(tmp_path / "remote")
    md, _ = _copy(store, tmp_path / "local")
    buffers: list[weakref.ref] = []

    def tracked(n: int) -> bytearray:
        b = _Tracked(n)
        buffers.append(weakref.ref(b))
        return b

    monkeypatch.setattr(readahead, "new_block_buffer", tracked)
    rsm = RemoteStorageManager(RsmConfig(**SMALL, read_ahead_bytes=64 * KiB, read_ahead_request_bytes=16 * KiB),
                               store)
    handle = rsm.open_segment(md)
    before = store.requests.snapshot().get("get", 0)
    batches = handle.batches(0, md.end_offset_inclusive)
    for _ in range(3):
        next(batches)
    assert 0 < readahead.read_ahead_bytes() <= 64 * KiB  # the window, never more
    batches.close()
    deadline = time.monotonic() + 5
    while readahead.read_ahead_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert readahead.read_ahead_bytes() == 0
    gets = store.requests.snapshot().get("get", 0) - before
    assert gets <= 1 + 64 // 16 + 1  # the block being read, the window, one started as it was handed out
    time.sleep(0.05)
    assert store.requests.snapshot().get("get", 0) - before == gets  # nothing started after the close
    del batches, handle
    gc.collect()
    assert buffers and all(r() is None for r in buffers)


class _FailingStore:
    """A store that fails the ranged GETs starting at or after ``fail_from`` of the first data object."""

    def __init__(self, inner: FileSystemStore, fail_from: int) -> None:
        self._inner = inner
        self._fail_from = fail_from

    def get(self, key: str, start: int = 0, end_inclusive: int | None = None):
        if start >= self._fail_from and not key.endswith("-index"):
            raise RemoteStorageError(f"injected failure at {key} byte {start}")
        return self._inner.get(key, start, end_inclusive)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def test_a_failed_get_is_raised_at_its_own_block(tmp_path: Path) -> None:
    inner = FileSystemStore(tmp_path / "remote")
    md, log = _copy(inner, tmp_path / "local")
    ledger = RemoteStorageManager(RsmConfig(**SMALL), inner).reader(md).ledger
    fail_block = ledger.blocks[5]
    store = _FailingStore(inner, fail_block.object_position)
    rsm = RemoteStorageManager(RsmConfig(**SMALL, read_ahead_bytes=64 * KiB, read_ahead_request_bytes=16 * KiB),
                               store)  # type: ignore[arg-type]
    got = []
    with pytest.raises(RemoteStorageError, match="injected"):
        for h, _ in rsm.open_segment(md).batches(0, fail_block.last_offset):
            got.append(h.base_offset)
    assert got and got[-1] < fail_block.first_offset
    assert got[-1] >= ledger.blocks[4].first_offset  # every block before the failed one was handed out
    assert _settle()


def _settle() -> bool:
    deadline = time.monotonic() + 5
    while readahead.read_ahead_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    return readahead.read_ahead_bytes() == 0


def test_readers_share_the_process_budget_fairly(tmp_path: Path, monkeypatch) -> None:
    """A reader that comes second grows its window to its share (half the process's budget) as the first hands
    blocks out, instead of reading one request at a time behind it; neither passes its share plus one request."""
    store = FileSystemStore(tmp_path / "remote")
    md, _ = _copy(store, tmp_path / "local")
    ledger = RemoteStorageManager(RsmConfig(**SMALL), store).reader(md).ledger
    blocks = [b for b in ledger.blocks if b.object_number == 0]
    key = RemoteStorageManager(RsmConfig(**SMALL), store).keys(md).data(0)
    assert len(blocks) >= 10 and max(b.block_length for b in blocks) <= 16 * KiB
    monkeypatch.setattr(readahead, "PROCESS_BUDGET_BYTES", 64 * KiB)
    monkeypatch.setattr(readahead, "START_REQUESTS", 4)  # windows start at their budget: only the share bounds them
    first = readahead.ReadAhead(store, key, blocks, budget_bytes=64 * KiB, request_bytes=16 * KiB)
    second = readahead.ReadAhead(store, key, blocks, budget_bytes=64 * KiB, request_bytes=16 * KiB)
    a, b = iter(first), iter(second)
    try:
        next(a)
        assert first.held_bytes > 32 * KiB  # alone: the whole budget
        assert readahead.fair_share_bytes() == 64 * KiB
        next(b)
        assert readahead.fair_share_bytes() == 32 * KiB
        most_second = 0
        for _ in range(4):
            next(a)
            next(b)
            most_second = max(most_second, second.held_bytes)
            assert first.held_bytes <= 32 * KiB + 16 * KiB and second.held_bytes <= 32 * KiB + 16 * KiB
        assert most_second > 16 * KiB  # more than one request in flight: not starved by the first
    finally:
        a.close()  # type: ignore[attr-defined]
        b.close()  # type: ignore[attr-defined]
    assert readahead.fair_share_bytes() == 64 * KiB  # both closed: no reader counted


class _PacedStore:
    """The filesystem store, its ranged GETs answered no sooner than ``pace_s`` apart."""

    def __init__(self, inner: FileSystemStore, pace_s: float) -> None:
        self._inner = inner
        self._pace_s = pace_s
        self._lock = threading.Lock()
        self._next = time.monotonic()

    def get(self, key: str, start: int = 0, end_inclusive: int | None = None):
        with self._lock:
            self._next = max(self._next + self._pace_s, time.monotonic())
            due = self._next
        time.sleep(max(0.0, due - time.monotonic()))
        return self._inner.get(key, start, end_inclusive)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def test_the_window_grows_for_a_fast_caller_and_stays_small_for_a_slow_one(tmp_path: Path) -> None:
    inner = FileSystemStore(tmp_path / "remote")
    md, _ = _copy(inner, tmp_path / "local")
    rsm = RemoteStorageManager(RsmConfig(**SMALL), inner)
    blocks = [b for b in rsm.reader(md).ledger.blocks if b.object_number == 0]
    key = rsm.keys(md).data(0)
    start = readahead.START_REQUESTS * 16 * KiB

    # a caller faster than the store (GETs answered 5 ms apart): it waits, and the window widens to the budget
    fast = _PacedStore(inner, 0.005)
    ahead = readahead.ReadAhead(fast, key, blocks, budget_bytes=64 * KiB, request_bytes=16 * KiB)
    assert ahead.window_bytes == start
    n = sum(1 for _ in ahead)
    assert n == len(blocks) and ahead.window_bytes == 64 * KiB

    # a slow caller: every request started has been fetched before it asks for the next block: the window stays
    ahead = readahead.ReadAhead(inner, key, blocks, budget_bytes=64 * KiB, request_bytes=16 * KiB)
    it = iter(ahead)
    try:
        for _ in range(len(blocks)):
            next(it)
            wait([f for f, _, _ in ahead._pending], timeout=10)  # the caller dawdles until they are in
            assert ahead.held_bytes <= start
    finally:
        it.close()  # type: ignore[attr-defined]
    assert ahead.window_bytes == start


class _SlowStore:
    """The filesystem store, each ranged GET answered ``delay_s`` after it was asked (GETs in parallel overlap)."""

    def __init__(self, inner: FileSystemStore, delay_s: float) -> None:
        self._inner = inner
        self._delay_s = delay_s

    def get(self, key: str, start: int = 0, end_inclusive: int | None = None):
        time.sleep(self._delay_s)
        return self._inner.get(key, start, end_inclusive)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


def test_a_fast_caller_widens_the_window_at_its_second_request(tmp_path: Path) -> None:
    """The first two requests start together and arrive together: a caller that is done with the first long before
    the window could fetch another widens the window when it asks for the second, though that one has arrived (it
    waited only for the first: before, the window grew only when the caller waited, a round trip later)."""
    inner = FileSystemStore(tmp_path / "remote")
    md, _ = _copy(inner, tmp_path / "local")
    rsm = RemoteStorageManager(RsmConfig(**SMALL), inner)
    blocks = [b for b in rsm.reader(md).ledger.blocks if b.object_number == 0]
    key = rsm.keys(md).data(0)
    start = readahead.START_REQUESTS * 16 * KiB
    ahead = readahead.ReadAhead(_SlowStore(inner, 0.3), key, blocks, budget_bytes=64 * KiB, request_bytes=16 * KiB)
    assert len(ahead._units) > readahead.START_REQUESTS + 1
    first_request = len(ahead._units[0][2])
    it = iter(ahead)
    try:
        for _ in range(first_request):
            next(it)
        assert ahead.window_bytes == start
        second = ahead._pending[0][0]
        wait([second], timeout=30)  # arrived (it started with the first)
        next(it)
        assert ahead.window_bytes == 64 * KiB
    finally:
        it.close()  # type: ignore[attr-defined]
