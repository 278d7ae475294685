"""The block cache (rsm/format/blockcache.py, issues 25 and 24): reads of one block at a time through new handles, as
Fetch after Fetch makes them, are read ahead across the reads once they are sequential (a stream per copy: ranged
GETs of several blocks, the current block kept for the reads inside it) instead of one GET per read; on a store that
does not read ahead each block is read whole once (the filesystem's mapped: tests/rsm/test_mapped_reads.py); a
block's batches are checked once, and a corrupt block fails every read of it; the bytes are those of the copy; random
reads stay streamed and keep nothing; streams are bounded in number, closed when left or idle, and give their
read-ahead back to the process."""

from __future__ import annotations

import math
import threading
import uuid
from collections import Counter, deque
from pathlib import Path

import pytest

from rsm.api import RemoteSegmentMetadata
from rsm.errors import CorruptRemoteObjectError
from rsm.format import blockcache, readahead
from rsm.format import reader as reader_module
from rsm.format.readahead import read_ahead_bytes
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import FileSystemStore
from tests.support.batches import synthetic_segment
from tests.support.sidecar import wait_for

KiB = 1024
# one 60 KiB batch a block, five blocks a data object: reads cross object boundaries; read-ahead GETs of two blocks
SMALL = {"block_size_bytes": 64 * KiB, "max_data_object_bytes": 320 * KiB, "read_ahead_request_bytes": 130 * KiB}


class _ReadStore(FileSystemStore):
    """A filesystem store whose blocks are read into buffers, not mapped (as a store without
    :class:`~rsm.store.base.MappedStore` and without read-ahead: S3 with ``read_ahead_bytes`` 0)."""

    map_range = None  # type: ignore[assignment]


def _read_into_buffers(store: FileSystemStore) -> FileSystemStore:
    return _ReadStore(store.root, fsync=False)


def _cached(store: FileSystemStore, cache_bytes: int, *, ahead: bool = True) -> RemoteStorageManager:
    """A storage manager with a block cache of ``cache_bytes``: its streams read ahead within as much (as on S3), or
    (``ahead`` False) read each block whole when reached (the filesystem store's default: no read-ahead)."""
    return RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=cache_bytes,
                                          read_ahead_bytes=cache_bytes if ahead else 0), store)


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
    cached = _cached(store, 256 * KiB)
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
    rsm = _cached(store, 256 * KiB)
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
    rsm = _cached(store, 260 * KiB)  # two 130 KiB requests
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


@pytest.mark.parametrize("ahead", [True, False], ids=["read-ahead", "block-at-a-time"])
def test_concurrent_readers_of_one_copy_get_its_bytes(tmp_path: Path, ahead: bool) -> None:
    """Readers of the same copy at once (two consumers, or Fetches in parallel) move its one stream past each other's
    blocks: a read the stream is no longer at is streamed, never handed another block."""
    store, (md,) = _copied(tmp_path)
    rsm = _cached(store, 256 * KiB, ahead=ahead)
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


class _CrcCount:
    """Counts the batch CRC-32C checks of the reader (rsm.format.reader: ``batch_crc`` of a batch read on its own,
    ``crc32c_at`` of one in a whole block, its address known)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real, real_at = reader_module.batch_crc, reader_module.crc32c_at

        def counted(data: bytearray) -> int:
            self.calls += 1
            return real(data)

        def counted_at(data: bytearray, address: int, start: int, length: int, crc: int = 0) -> int:
            self.calls += 1
            return real_at(data, address, start, length, crc)

        monkeypatch.setattr(reader_module, "batch_crc", counted)
        monkeypatch.setattr(reader_module, "crc32c_at", counted_at)


def test_without_read_ahead_each_block_is_read_whole_once_and_checked_once(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The filesystem store's default (no read-ahead, the block cache on): reads of one block at a time, each block in
    two Fetches, read each block once, whole (one GET), and check each batch once; the bytes are the copy's. Without
    the cache each read streams its block from the block's start again and checks every batch it passes again."""
    store, (md,) = _copied(tmp_path)
    plain = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=0), store)
    default = RemoteStorageManager(RsmConfig(**SMALL), store)
    assert default.block_cache is not None and default.reader(md).read_ahead_bytes == 0
    blocks = len(plain.reader(md).ledger.blocks)
    crcs = _CrcCount(monkeypatch)

    def reads(rsm: RemoteStorageManager) -> tuple[int, int, list]:
        gets, checks = store.requests.snapshot().get("get", 0), crcs.calls
        out = [_fetch_like(rsm, md, b) for b in range(blocks) for _ in range(2)]
        return store.requests.snapshot().get("get", 0) - gets, crcs.calls - checks, out

    plain_gets, plain_checks, want = reads(plain)
    gets, checks, got = reads(default)
    assert got == want
    assert (plain_gets, plain_checks) == (2 * blocks, 2 * blocks)  # one 60 KiB batch a block
    # the first read streamed (no read before it to follow), then every block once, whole, its batch checked once
    assert (gets, checks) == (1 + blocks, 1 + blocks)
    assert default.block_cache.hits == 2 * blocks - 1  # type: ignore[union-attr]


@pytest.mark.parametrize("ahead", [True, False], ids=["read-ahead", "block-at-a-time"])
def test_a_corrupt_block_fails_every_read_of_it(tmp_path: Path, ahead: bool) -> None:
    """A block whose batch is corrupt in the store, reached by a stream: the read raises CorruptRemoteObjectError
    (the proxy answers the partition KAFKA_STORAGE_ERROR), nothing of it is kept, and the reads after it (the same
    block again, streamed) fail as well; the blocks before it read as the copy holds them."""
    store, (md,) = _copied(tmp_path)
    rsm = _cached(store, 256 * KiB, ahead=ahead)
    plain = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=0), store)
    reader = plain.reader(md)
    bad = 6
    block = reader.ledger.blocks[bad]
    path = store._path(reader.keys.data(block.object_number))
    data = bytearray(path.read_bytes())
    data[block.object_position + block.block_length - 10] ^= 0xFF  # in the batch's last record: only its CRC tells
    want = [_fetch_like(plain, md, b) for b in range(bad)]
    path.write_bytes(data)
    assert [_fetch_like(rsm, md, b) for b in range(bad)] == want
    assert rsm.block_cache is not None and rsm.block_cache.streams == 1
    for _ in range(3):
        with pytest.raises(CorruptRemoteObjectError, match="CRC-32C"):
            _fetch_like(rsm, md, bad)


def test_a_block_held_by_a_reader_is_never_overwritten_by_the_next(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Without read-ahead a stream reads each block into its one buffer again once no view of the previous block is
    alive (a new buffer per block costs its page faults), and a stream that ends leaves it to the next stream; a
    reader still holding a batch of the previous block (a view, not a copy: a Fetch gathering batches of two blocks)
    keeps its bytes: the next block goes to another buffer."""
    store, (md,) = _copied(tmp_path)
    plain = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=0), store)
    rsm = _cached(_read_into_buffers(store), 256 * KiB, ahead=False)
    ledger = plain.reader(md).ledger
    first_object = [b.part_id for b in ledger.blocks if b.object_number == 0]
    assert len(first_object) >= 4
    buffers: list[int] = []
    real = blockcache.new_block_buffer
    monkeypatch.setattr(blockcache, "new_block_buffer", lambda n: buffers.append(n) or real(n))
    assert _fetch_like(rsm, md, 0) == _fetch_like(plain, md, 0)  # streamed: no stream yet
    for b in first_object:  # a stream over the first data object; nothing held between the reads
        assert _fetch_like(rsm, md, b) == _fetch_like(plain, md, b)
    assert len(buffers) == 1  # one buffer, read into again for each block
    rsm.block_cache.close()  # type: ignore[union-attr]
    _fetch_like(rsm, md, 0)  # the next reads follow: a new stream
    held = [d for _h, d in rsm.open_segment(md).batches(0, md.end_offset_inclusive, first_block=0, last_block=0)]
    want = [bytes(d) for d in held]
    for b in first_object[1:]:
        assert _fetch_like(rsm, md, b) == _fetch_like(plain, md, b)
    assert [bytes(d) for d in held] == want  # the views of block 0 still hold block 0
    # The second stream took the first one's buffer (a spare once that stream was closed: no new buffer's page
    # faults), and a new one for block 1 while block 0 was held; none after.
    assert len(buffers) == 2


def test_a_spare_buffer_still_held_is_not_read_into(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream that ends leaves its buffer to the next stream, but a reader may still hold batches of its last block
    (views): the next stream then reads into a new buffer, and once they are gone it takes the spare."""
    store, (a, b) = _copied(tmp_path, copies=2)
    plain = RemoteStorageManager(RsmConfig(**SMALL, block_cache_bytes=0), store)
    rsm = _cached(_read_into_buffers(store), 256 * KiB, ahead=False)
    buffers: list[int] = []
    real = blockcache.new_block_buffer
    monkeypatch.setattr(blockcache, "new_block_buffer", lambda n: buffers.append(n) or real(n))
    for md in (a, b):
        _fetch_like(rsm, md, 0)  # the first read of a copy is streamed; the next ones follow: a stream
    held = [d for _h, d in rsm.open_segment(a).batches(0, a.end_offset_inclusive, first_block=1, last_block=1)]
    want = [bytes(d) for d in held]
    rsm.block_cache.close()  # type: ignore[union-attr]  # a's stream ends: its buffer is a spare, still held
    assert _fetch_like(rsm, b, 1) == _fetch_like(plain, b, 1)  # b's stream: a new buffer
    assert [bytes(d) for d in held] == want and len(buffers) == 2
    del held
    rsm.block_cache.close()  # type: ignore[union-attr]
    _fetch_like(rsm, a, 0)
    assert _fetch_like(rsm, a, 1) == _fetch_like(plain, a, 1)  # a spare, no view of it left: no new buffer
    assert len(buffers) == 2


def test_spares_are_handed_out_free_only_and_let_go_when_idle(monkeypatch: pytest.MonkeyPatch) -> None:
    """The spares: given while still held (a stream's last block, views in an answer), handed out once free; the
    last SPARE_BUFFERS given are kept; a free one unused for IDLE_S is let go (not counted, not handed out)."""
    now = [1000.0]
    monkeypatch.setattr(blockcache.time, "monotonic", lambda: now[0])
    spares = blockcache._Spares()
    view = memoryview(spares.take(100))  # a reader's view of the buffer
    held = id(view.obj)
    spares.give(view.obj)  # type: ignore[arg-type]
    assert spares.size_bytes == 0 and id(spares.take(100)) != held  # held: a new one
    del view
    assert spares.size_bytes == 64 * KiB and id(spares.take(100)) == held
    for _ in range(blockcache.SPARE_BUFFERS + 3):
        spares.give(bytearray(64 * KiB))
    assert spares.size_bytes == blockcache.SPARE_BUFFERS * 64 * KiB
    now[0] += blockcache.IDLE_S + 1
    assert len(spares.take(10 * 64 * KiB)) >= 10 * 64 * KiB  # none large enough: a new one; the idle let go
    assert spares.size_bytes == 0


def test_spares_held_by_answers_are_not_pushed_out_by_later_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """Buffers go round as a stream's are given while answers still hold views of them (more of them than
    SPARE_BUFFERS: answers being written, answers read ahead): each is handed out again once its answer lets it go.
    Kept in a ring of SPARE_BUFFERS, a buffer given while held was pushed out before it was free, and every block
    then cost a new buffer (its page faults: 1.5 ms of CPU per 4 MiB)."""
    made: list[int] = []
    monkeypatch.setattr(blockcache, "new_block_buffer", lambda n: made.append(n) or bytearray(n))
    spares = blockcache._Spares()
    answers: deque[memoryview] = deque()  # the views answers hold, oldest first
    in_flight = blockcache.SPARE_BUFFERS + 4
    for _ in range(10 * in_flight):
        buf = spares.take(100)
        answers.append(memoryview(buf))  # an answer's view of the block read into it
        spares.give(buf)  # the stream moves on while the answer still holds it
        del buf
        if len(answers) > in_flight:
            answers.popleft()  # the oldest answer written: its buffer free
    assert len(made) <= in_flight + 2
    answers.clear()
    assert spares.size_bytes == blockcache.SPARE_BUFFERS * 64 * KiB  # of those free, SPARE_BUFFERS kept
