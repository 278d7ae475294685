"""Reading a ledger back: verified entries, original ``.log`` ranges, offset <-> entry mapping.

Every entry read is checked before use: block magic and lengths against the index, entry ids in sequence,
the batch's own length field, magic and CRC-32C, its offsets inside the block's range, and the block's
original ``.log`` byte count. A failure raises :class:`~rsm.errors.CorruptRemoteObjectError` naming the key,
the byte position in the object and the Kafka offset when known; bad bytes are never handed out.

Request costs: the index object is one GET (cache it: :class:`SegmentReader` is built from a decoded index),
then one ranged GET per data object touched (a range inside one object is one GET, streamed); with read-ahead
(``read_ahead_bytes``: S3 by default) a read of several blocks is instead ranged GETs of about 8 MiB each, several in
flight (:mod:`rsm.format.readahead`), so a read of one block stays one GET. Reads of one block at a time that follow
each other (history Fetches) share a block cache (:mod:`rsm.format.blockcache`: S3 by default): the copy's reads
are read ahead across them as one long read is (ranged GETs of about 8 MiB in flight, fetched ahead of the reads).

Encrypted copies (:mod:`rsm.format.crypto`): the ledger carries the copy's data key (``LedgerIndex.cipher``, set
when the sealed index was opened); each block is read whole, authenticated and opened before any entry is parsed,
each section likewise; request costs are the same.
"""

from __future__ import annotations

import bisect
import io
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass
from itertools import chain, islice
from typing import TYPE_CHECKING, BinaryIO

import google_crc32c

from rsm.api import BlockRange, IndexType, LargeBatch, SegmentHandle
from rsm.errors import CorruptRemoteObjectError, RemoteResourceNotFoundError
from rsm.format.block import (
    BLOCK_HEADER_LENGTH,
    ENTRY_HEADER_LENGTH,
    LEDGER_ID_OFFSET,
    BlockHeader,
    EntryReader,
    decode_block_header,
    read_block_header,
)
from rsm.format.blockcache import BlockCache, MapRange
from rsm.format.crypto import worker_pool
from rsm.format.index import BlockInfo, LedgerIndex
from rsm.format.keys import SegmentKeys
from rsm.format.ledger import EntryAddress
from rsm.format.readahead import DEFAULT_REQUEST_BYTES, ReadAhead
from rsm.log._crc32c import buffer_address, crc32c_at
from rsm.log._fastinit import fast_constructor
from rsm.log.batch import ATTRIBUTES_OFFSET, CRC_OFFSET, BatchHeader, batch_crc, header_from_bytes
from rsm.log.errors import CorruptIndexError, CorruptProducerSnapshotError, CorruptRecordBatchError
from rsm.log.indexes import AbortedTxn, parse_txn_index
from rsm.log.producer_snapshot import ProducerStateEntry, parse_producer_snapshot
from rsm.store.base import Store

if TYPE_CHECKING:
    from rsm.format.crypto import CopyCipher

__all__ = ["EntryView", "SegmentReader", "iter_block_entries"]

READ_CHUNK_BYTES = 1 << 20
_POOL = 4  # opened-block buffers an encrypted read keeps for reuse (_Opener._free_buffer)


@dataclass(frozen=True, slots=True)
class EntryView:
    """One verified entry: where it is and the batch it holds (``data`` is the batch, verbatim; ``header`` its
    header, parsed once, ``position`` being the batch's position in the original ``.log``). A batch stored as
    fragments read with ``large`` is a :class:`~rsm.api.LargeBatch` (``block`` is then its first fragment's)."""

    block: BlockInfo
    entry_id: int
    object_position: int  # position of the entry header in the data object
    header: BatchHeader
    data: memoryview | LargeBatch

    @property
    def log_position(self) -> int:
        """Position of the batch in the original ``.log``."""
        return self.header.position

    @property
    def base_offset(self) -> int:
        return self.header.base_offset

    @property
    def last_offset(self) -> int:
        return self.header.last_offset

    @property
    def max_timestamp_ms(self) -> int:
        return self.header.max_timestamp


_make_entry = fast_constructor(EntryView)  # a frozen dataclass's __init__ was ~1.1 us of a batch's ~6.8 us parse


def _last_offset(block: BlockInfo) -> int:
    return block.last_offset


def _entry_last(e: EntryView) -> int:
    return e.header.last_offset


def _check_header(data: bytearray | memoryview, block: BlockInfo, *, key: str, position: int, log_position: int,
                  size: int | None = None) -> BatchHeader:
    """The header of the batch that ``data`` holds (or, with ``size``, begins: its first fragment), checked as far
    as it goes without the CRC and against the block's offsets."""
    try:
        h = header_from_bytes(data, log_position, key, size=size)
    except CorruptRecordBatchError as err:
        raise CorruptRemoteObjectError(f"bad record batch: {err}", key=key, position=position) from err
    if h.base_offset < block.first_offset or h.last_offset > block.last_offset:
        raise CorruptRemoteObjectError(
            f"batch offsets {h.base_offset}..{h.last_offset} outside the block's "
            f"{block.first_offset}..{block.last_offset}", key=key, position=position, kafka_offset=h.base_offset)
    return h


class _Opener:
    """Reads an encrypted copy's blocks whole (their sealed length), authenticates and opens them. The reads go one
    block ahead on a worker thread (:func:`rsm.format.crypto.worker_pool`): block *i + 1* is read from the store
    while the caller opens and parses block *i*. Opening (AES-GCM) stays on the caller's thread, so the plain block
    is in the cache of the core that parses it (opened on the worker it cost more CPU in all than it saved).
    Two sealed buffers take turns; an opened block's buffer is reused only once no view of it is alive
    (:meth:`_free_buffer`), since the entries handed out are views of it. Only this opener reads ``stream``, one
    block after the other; an error of block *i* is raised when block *i* is asked for."""

    __slots__ = ("_blocks", "_cipher", "_key", "_largest", "_ledger_id", "_next", "_pending", "_pool", "_sealed",
                 "_stream", "_turn")

    def __init__(self, cipher: CopyCipher, stream: BinaryIO, blocks: list[BlockInfo], *, key: str,
                 ledger_id: int) -> None:
        self._cipher = cipher
        self._stream = stream
        self._blocks = blocks
        self._key = key
        self._ledger_id = ledger_id
        self._sealed = [bytearray(), bytearray()]
        self._pool: list[bytearray] = []  # opened blocks' buffers (_free_buffer)
        self._largest = max((b.block_length for b in blocks), default=0)
        self._turn = 0
        self._next = 0  # the next block to start reading
        self._pending: tuple[Future[memoryview], BlockInfo] | None = None

    def _start(self) -> tuple[Future[memoryview], BlockInfo] | None:
        if self._next >= len(self._blocks):
            return None
        block, turn = self._blocks[self._next], self._turn
        self._next += 1
        self._turn ^= 1
        if len(self._blocks) == 1:  # one block (a random read): nothing to overlap, no thread hop
            fut: Future[memoryview] = Future()
            try:
                fut.set_result(self._read(block, turn))
            except BaseException as err:  # noqa: BLE001 - raised by next_block, as from the worker
                fut.set_exception(err)
            return fut, block
        return worker_pool().submit(self._read, block, turn), block

    def next_block(self) -> memoryview:
        """The next block, opened (plain)."""
        pending = self._pending if self._pending is not None else self._start()
        if pending is None:
            raise IndexError("no block left to open")
        fut, block = pending
        sealed = fut.result()
        self._pending = self._start()
        return memoryview(self._cipher.open_block(
            sealed, key=self._key, ledger_id=self._ledger_id, object_number=block.object_number,
            position=block.object_position, part_id=block.part_id, kafka_offset=block.first_offset,
            into=self._free_buffer(len(sealed))))

    def _free_buffer(self, n: int) -> bytearray:
        """A buffer for an opened block that no view refers to any more. The entries handed out are views of their
        block and may be held past the next block (a Fetch gathers batches of several), so a buffer is reused only
        once every view of it is gone: its reference count is back to the pool's own (the views' shared
        memoryview holds one). Else a new one (``bytearray(n)`` zero-fills: ~0.26 ms per 4 MiB, 15% of a plain
        read in the page cache), kept in the pool up to :data:`_POOL` buffers."""
        for buf in self._pool:
            # references: the pool's list, the loop variable, getrefcount's argument
            if len(buf) >= n and sys.getrefcount(buf) == 3:
                return buf
        buf = bytearray(max(n, self._largest))  # room for any block of this read
        if len(self._pool) < _POOL:
            self._pool.append(buf)
        return buf

    def close(self) -> None:
        """Wait for a block still being read (the caller stopped early); its result is dropped."""
        pending, self._pending = self._pending, None
        if pending is not None:
            futures_wait([pending[0]])

    def _read(self, block: BlockInfo, turn: int) -> memoryview:
        n = block.block_length
        if len(self._sealed[turn]) < n:
            self._sealed[turn] = bytearray(max(n, self._largest))
        view = memoryview(self._sealed[turn])[:n]
        got = 0
        while got < n:
            k = self._stream.readinto(view[got:])  # type: ignore[attr-defined]
            if not k:
                raise CorruptRemoteObjectError(
                    f"truncated encrypted block {block.part_id}: expected {n} bytes, found {got}", key=self._key,
                    position=block.object_position + got, kafka_offset=block.first_offset)
            got += k
        return view


def iter_block_entries(stream: BinaryIO, blocks: list[BlockInfo], *, key: str, ledger_id: int,
                       cipher: CopyCipher | None = None, large: bool = False) -> Iterator[EntryView]:
    """Verified entries of consecutive ``blocks`` of one object; ``stream`` starts at the first block.

    The framing is read by :mod:`rsm.format.block`; here each block is checked against the index and each entry
    as a Kafka record batch. With ``cipher`` (an encrypted copy) each block is first read whole and opened
    (:mod:`rsm.format.crypto`); positions in errors are then the block's position plus the position inside the
    opened block."""
    opener = None if cipher is None else _Opener(cipher, stream, blocks, key=key, ledger_id=ledger_id)
    try:
        yield from _block_entries(stream, blocks, key=key, ledger_id=ledger_id, opener=opener, large=large)
    finally:
        if opener is not None:
            opener.close()


class _Fetched:
    """Whole blocks from a :class:`~rsm.format.readahead.ReadAhead`, handed to :func:`_block_entries` as an opener's
    are (entries are views of them)."""

    __slots__ = ("_blocks",)

    def __init__(self, blocks: Iterator[memoryview]) -> None:
        self._blocks = blocks

    def next_block(self) -> memoryview:
        return next(self._blocks)


def _block_entries(stream: BinaryIO | None, blocks: list[BlockInfo], *, key: str, ledger_id: int,
                   opener: _Opener | _Fetched | None, large: bool = False) -> Iterator[EntryView]:
    """Verified entries of ``blocks`` (read from ``stream``, or whole from ``opener``). A batch stored as fragments
    (its run of blocks must be in ``blocks`` whole) is put together, or with ``large`` handed out as a
    :class:`~rsm.api.LargeBatch` whose chunks are read from the same source when asked for (:func:`_fragments`)."""

    def open_block(block: BlockInfo) -> tuple[BinaryIO | memoryview, BlockHeader]:
        pos = block.object_position
        src: BinaryIO | memoryview
        if opener is None:
            assert stream is not None
            src, block_length = stream, block.block_length
            hdr = read_block_header(src, key=key, position=pos)
        else:
            src = opener.next_block()  # the whole block (opened, or fetched ahead): entries are views of it
            block_length = len(src)
            hdr = decode_block_header(src, key=key, position=pos)
        if hdr.block_length != block_length or hdr.first_entry_id != block.first_entry_id:
            raise CorruptRemoteObjectError(
                f"block header says length {hdr.block_length}, first entry {hdr.first_entry_id}; the index says "
                f"{block_length}, {block.first_entry_id}", key=key, position=pos, kafka_offset=block.first_offset)
        if hdr.ledger_id != ledger_id:
            raise CorruptRemoteObjectError(f"block of ledger {hdr.ledger_id}, expected {ledger_id}", key=key,
                                           position=pos + LEDGER_ID_OFFSET, kafka_offset=block.first_offset)
        if (hdr.fragment_number, hdr.fragment_count) != (block.fragment_number, block.fragment_count):
            raise CorruptRemoteObjectError(
                f"block header says fragment {hdr.fragment_number} of {hdr.fragment_count}; the index says "
                f"{block.fragment_number} of {block.fragment_count}", key=key, position=pos + LEDGER_ID_OFFSET + 8,
                kafka_offset=block.first_offset)
        return src, hdr

    it = iter(blocks)
    for block in it:
        pos = block.object_position
        src, hdr = open_block(block)
        if hdr.fragment_count:
            if hdr.fragment_number != 0:
                raise CorruptRemoteObjectError(
                    f"a read starts at fragment {hdr.fragment_number} of a batch (block {block.part_id})", key=key,
                    position=pos, kafka_offset=block.first_offset)
            run = [block, *islice(it, hdr.fragment_count - 1)]
            if len(run) != hdr.fragment_count:
                raise CorruptRemoteObjectError(
                    f"a read ends inside a batch in {hdr.fragment_count} fragments (block {run[-1].part_id})",
                    key=key, position=pos, kafka_offset=block.first_offset)
            chunks = _fragments(run, src, hdr, open_block, key=key)
            first = next(chunks)
            h = _check_header(first, block, key=key, position=pos + BLOCK_HEADER_LENGTH + ENTRY_HEADER_LENGTH,
                              log_position=block.log_position, size=hdr.entry_length)
            if large:
                yield EntryView(block, block.first_entry_id, pos + BLOCK_HEADER_LENGTH, h,
                                LargeBatch(h, chain((first,), chunks)))  # type: ignore[arg-type]
                for _ in chunks:  # what the caller did not take: read (the source stays in step) and checked
                    pass
            else:
                whole = bytearray(h.size_bytes)
                at = 0
                for c in chain((first,), chunks):
                    whole[at:at + len(c)] = c
                    at += len(c)
                yield EntryView(block, block.first_entry_id, pos + BLOCK_HEADER_LENGTH, h, memoryview(whole))
            continue
        entries = EntryReader(src, hdr, key=key, position=pos)
        entries.kafka_offset = block.first_offset
        log_pos = block.log_position
        prev_last = block.first_offset - 1
        count = 0
        # a whole block in a buffer: an entry's address is this plus its position in the object (its views are
        # alive while the block is parsed)
        base = buffer_address(src) - pos if isinstance(src, memoryview) else None  # type: ignore[arg-type]
        for entry_id, p, data in entries:
            data_pos = p + ENTRY_HEADER_LENGTH
            if count == block.entry_count:
                raise CorruptRemoteObjectError(f"block holds more than the index's {block.entry_count} entries",
                                               key=key, position=p, kafka_offset=prev_last + 1)
            # the batch checked: its header (rsm.log.batch, against the block's offsets), then its CRC-32C (inline:
            # a call per batch fewer, ~64,000 a GiB of 16 KiB batches); the header checked its length is len(data)
            h = _check_header(data, block, key=key, position=data_pos, log_position=log_pos)
            crc = batch_crc(data) if base is None else crc32c_at(  # type: ignore[arg-type]
                data, base + data_pos, ATTRIBUTES_OFFSET, h.size_bytes - ATTRIBUTES_OFFSET)
            if crc != h.crc:
                raise CorruptRemoteObjectError(f"batch CRC-32C 0x{crc:08X} does not match stored 0x{h.crc:08X}",
                                               key=key, position=data_pos, kafka_offset=h.base_offset)
            if h.base_offset <= prev_last:
                raise CorruptRemoteObjectError(
                    f"batch base offset {h.base_offset} not after the previous batch's {prev_last}", key=key,
                    position=data_pos, kafka_offset=h.base_offset)
            yield _make_entry(block, entry_id, p, h, data if isinstance(data, memoryview) else memoryview(data))
            prev_last = h.last_offset
            entries.kafka_offset = prev_last + 1
            log_pos += h.size_bytes
            count += 1
        if count != block.entry_count or log_pos != block.log_position + block.log_bytes or (
                prev_last != block.last_offset):
            raise CorruptRemoteObjectError(
                f"block content ({count} entries, .log bytes {log_pos - block.log_position}, last offset "
                f"{prev_last}) does not match the index ({block.entry_count}, {block.log_bytes}, "
                f"{block.last_offset})", key=key, position=pos, kafka_offset=block.first_offset)


def _crc32c(view: memoryview, crc: int = 0) -> int:
    """CRC-32C of ``view`` extending ``crc``, without a copy (through its address; read-only views too)."""
    return crc32c_at(view, buffer_address(view), 0, len(view), crc)  # type: ignore[arg-type]


def _fragments(run: list[BlockInfo], src: BinaryIO | memoryview, hdr: BlockHeader,
               open_block: Callable[[BlockInfo], tuple[BinaryIO | memoryview, BlockHeader]], *,
               key: str) -> Iterator[memoryview]:
    """The fragments of one batch, in order, each checked (its entry, length and CRC-32C) before it is yielded; the
    first block is already open (``src``, ``hdr``), the others are opened here as they are reached. After the last,
    the batch's CRC-32C across them is checked against its header's."""
    total = hdr.entry_length
    got = 0
    crc = stored_crc = 0
    for k, block in enumerate(run):
        if k:
            src, hdr = open_block(block)
            if hdr.entry_length != total:
                raise CorruptRemoteObjectError(
                    f"fragment {k} says its batch has {hdr.entry_length} bytes, fragment 0 said {total}", key=key,
                    position=block.object_position, kafka_offset=block.first_offset)
        entries = EntryReader(src, hdr, key=key, position=block.object_position)
        entries.kafka_offset = block.first_offset
        frags = list(entries)
        if len(frags) != 1:
            raise CorruptRemoteObjectError(f"fragment block holds {len(frags)} entries, not 1", key=key,
                                           position=block.object_position, kafka_offset=block.first_offset)
        _, p, data = frags[0]
        data_pos = p + ENTRY_HEADER_LENGTH
        view = memoryview(data)
        if len(view) != block.log_bytes or block.log_position != run[0].log_position + got:
            raise CorruptRemoteObjectError(
                f"fragment {k} holds {len(view)} bytes at batch byte {got}; the index says {block.log_bytes} at "
                f"{block.log_position - run[0].log_position}", key=key, position=data_pos,
                kafka_offset=block.first_offset)
        actual = _crc32c(view)
        if actual != hdr.fragment_crc32c:
            raise CorruptRemoteObjectError(
                f"fragment {k} CRC-32C 0x{actual:08X} does not match stored 0x{hdr.fragment_crc32c:08X}", key=key,
                position=data_pos, kafka_offset=block.first_offset)
        if k == 0:
            stored_crc = int.from_bytes(view[CRC_OFFSET:ATTRIBUTES_OFFSET], "big")
            crc = _crc32c(view[ATTRIBUTES_OFFSET:])
        else:
            crc = _crc32c(view, crc)
        got += len(view)
        if got > total or (k == len(run) - 1 and got != total):
            raise CorruptRemoteObjectError(f"fragments hold {got} bytes of a {total}-byte batch", key=key,
                                           position=data_pos, kafka_offset=block.first_offset)
        if k == len(run) - 1 and crc != stored_crc:
            raise CorruptRemoteObjectError(
                f"batch CRC-32C 0x{crc:08X} across its {len(run)} fragments does not match stored 0x{stored_crc:08X}",
                key=key, position=run[0].object_position, kafka_offset=block.first_offset)
        yield view


class _ChunkStream(io.RawIOBase):
    """A readable stream over an iterator of byte chunks (closing it closes the iterator)."""

    def __init__(self, chunks: Iterator[bytes | memoryview]) -> None:
        self._chunks = chunks
        self._cur = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        while not self._cur:
            nxt = next(self._chunks, None)
            if nxt is None:
                return 0
            self._cur = memoryview(nxt).cast("B")
        n = min(len(b), len(self._cur))
        b[:n] = self._cur[:n]
        self._cur = self._cur[n:]
        return n

    def close(self) -> None:
        if not self.closed:
            close = getattr(self._chunks, "close", None)
            if close is not None:
                close()
        super().close()


class SegmentReader(SegmentHandle):
    """Reads one segment copy, given its decoded index (from a cache or one GET): the storage manager's
    :class:`~rsm.api.SegmentHandle`, plus entry-level access for this package (addresses, verify, ``.log`` bytes)."""

    def __init__(self, store: Store, keys: SegmentKeys, ledger: LedgerIndex,
                 on_bytes: Callable[[int], None] | None = None, *, read_ahead_bytes: int = 0,
                 read_ahead_request_bytes: int = DEFAULT_REQUEST_BYTES, block_cache: BlockCache | None = None,
                 map_range: MapRange | None = None) -> None:
        self.store = store
        self.keys = keys
        self.ledger = ledger
        self.name = keys.base
        self._on_bytes = on_bytes
        self.read_ahead_bytes = read_ahead_bytes
        """Budget of a read of several blocks: ranged GETs in flight ahead of the parser (rsm.format.readahead);
        0: one GET streamed per data object."""
        self.read_ahead_request_bytes = read_ahead_request_bytes
        self.block_cache = block_cache
        """Whole blocks for sequential reads of one block at a time (rsm.format.blockcache); None: none."""
        self.map_range = map_range
        """The store's ``map_range`` (rsm.store.base.MappedStore): the block cache maps blocks instead of reading them
        into buffers; None: it reads them."""

    # -- the SegmentHandle -------------------------------------------------------------------------------------

    def batches(self, from_offset: int, end_offset_inclusive: int, *, first_block: int | None = None,
                last_block: int | None = None, large: bool = False,
                ) -> Iterator[tuple[BatchHeader, memoryview | LargeBatch]]:
        """See :meth:`rsm.api.SegmentHandle.batches`."""
        if first_block is None:
            block = self.ledger.block_for_offset(from_offset)
            if block is None:
                return
            first_block = block.part_id
        for e in self.iter_entries(first_block, last_block, large=large, from_offset=from_offset):
            h = e.header
            if h.last_offset < from_offset:
                continue
            if h.base_offset > end_offset_inclusive:
                return
            yield h, e.data

    def block_plan(self, from_offset: int, end_offset_inclusive: int, max_log_bytes: int, *,
                   min_timestamp_ms: int | None = None, from_block: int = 0,
                   runs: int | None = None) -> list[BlockRange]:
        """See :meth:`rsm.api.SegmentHandle.block_plan`. The scan starts at the first block holding ``from_offset``
        (bisected: blocks are in offset order) and stops past ``end_offset_inclusive`` or after ``runs`` runs: a
        history Fetch asks for the first run only, and listing every block to the end of a 1 GiB segment (256 of
        4 MiB) cost it ~0.25 ms each time."""
        blocks = self.ledger.blocks
        groups: list[list[BlockInfo]] = []
        sizes: list[int] = []
        for i in range(max(from_block, bisect.bisect_left(blocks, from_offset, key=_last_offset)), len(blocks)):
            b = blocks[i]
            if b.first_offset > end_offset_inclusive:
                break  # and so are all those after it
            if min_timestamp_ms is not None and b.max_timestamp_ms < min_timestamp_ms:
                continue
            if groups and groups[-1][-1].part_id + 1 == b.part_id and (
                    sizes[-1] + b.log_bytes <= max_log_bytes or b.fragment_number > 0):  # a batch's fragments: one run
                groups[-1].append(b)
                sizes[-1] += b.log_bytes
            else:
                if runs is not None and len(groups) == runs:
                    break
                groups.append([b])
                sizes.append(b.log_bytes)
        return [BlockRange(g[0].part_id, g[-1].part_id, g[0].first_offset, g[-1].last_offset, n)
                for g, n in zip(groups, sizes, strict=True)]

    def block_at_timestamp(self, timestamp_ms: int) -> BlockRange | None:
        """See :meth:`rsm.api.SegmentHandle.block_at_timestamp`."""
        b = self.ledger.block_for_timestamp(timestamp_ms)
        return None if b is None else BlockRange(b.part_id, b.part_id, b.first_offset, b.last_offset, b.log_bytes)

    def aborted_transactions(self) -> list[AbortedTxn]:
        """See :meth:`rsm.api.SegmentHandle.aborted_transactions`."""
        try:
            with self.open_section(IndexType.TRANSACTION) as f:
                data = f.read()
        except RemoteResourceNotFoundError:
            return []
        try:
            return parse_txn_index(data, f"{self.name} transaction index")
        except CorruptIndexError as err:  # bad when uploaded (its section CRC matches): as producer_snapshot does
            s = self.ledger.section(IndexType.TRANSACTION)
            raise CorruptRemoteObjectError(
                f"transaction index section ({s.length} bytes), at its byte {err.position}: {err.detail}",
                key=self.keys.data(s.object_number), position=s.position + (err.position or 0)) from err

    def producer_snapshot(self) -> list[ProducerStateEntry] | None:
        """See :meth:`rsm.api.SegmentHandle.producer_snapshot`."""
        s = self.ledger.section(IndexType.PRODUCER_SNAPSHOT)
        if s is None:  # copied without one (open_section would say not found)
            return None
        with self.open_section(IndexType.PRODUCER_SNAPSHOT) as f:
            data = f.read()
        try:
            return parse_producer_snapshot(data, path=f"{self.name} producer snapshot")
        except CorruptProducerSnapshotError as err:
            raise CorruptRemoteObjectError(
                f"producer snapshot section ({s.length} bytes), at its byte {err.position}: {err.detail}",
                key=self.keys.data(s.object_number), position=s.position + (err.position or 0)) from err

    # -- entries -----------------------------------------------------------------------------------------------

    def iter_entries(self, first_block: int = 0, last_block: int | None = None, *,
                     large: bool = False, from_offset: int | None = None) -> Iterator[EntryView]:
        """Verified entries of blocks ``first_block..last_block`` (inclusive): one GET per data object streamed, or
        with :attr:`read_ahead_bytes` (a plain copy, several blocks, each within half the budget) ranged GETs of
        about :attr:`read_ahead_request_bytes` each, in flight within that budget. A bound inside a batch stored as
        fragments is widened to the whole batch (its fragments are in one data object); such a batch is put
        together whole, or with ``large`` handed out as a :class:`~rsm.api.LargeBatch`. ``from_offset``: entries
        wholly below it may be left out (a block from the block cache starts at the first entry reaching it,
        bisected: a history Fetch inside a 4 MiB block of 16 KiB batches walked up to 192 entries before its own)."""
        blocks = self.ledger.blocks
        last_block = len(blocks) - 1 if last_block is None else last_block
        if blocks:
            first_block -= blocks[first_block].fragment_number
            b = blocks[last_block]
            last_block += max(0, b.fragment_count - 1 - b.fragment_number)
        i = first_block
        while i <= last_block:
            obj = blocks[i].object_number
            j = i
            while j + 1 <= last_block and blocks[j + 1].object_number == obj:
                j += 1
            key = self.keys.data(obj)
            start = blocks[i].object_position
            end = blocks[j].object_position + blocks[j].block_length - 1
            if (self.read_ahead_bytes > 0 and j > i and self.ledger.cipher is None
                    and 2 * max(b.block_length for b in blocks[i:j + 1]) <= self.read_ahead_bytes):
                ahead = ReadAhead(self.store, key, list(blocks[i:j + 1]), budget_bytes=self.read_ahead_bytes,
                                  request_bytes=self.read_ahead_request_bytes)
                fetched = iter(ahead)
                try:
                    yield from _block_entries(None, list(blocks[i:j + 1]), key=key, ledger_id=self.ledger.ledger_id,
                                              opener=_Fetched(fetched), large=large)
                finally:
                    fetched.close()  # type: ignore[attr-defined]
                i = j + 1
                continue
            if i == j and self.block_cache is not None and self.ledger.cipher is None:
                cached = self._cached_block(i, self.block_cache)
                if cached is None:
                    yield from self._streamed_block(i)
                else:
                    start = 0 if from_offset is None else bisect.bisect_left(cached, from_offset, key=_entry_last)
                    yield from (cached[start:] if start else cached)
                i = j + 1
                continue
            with self.store.get(key, start, end) as stream:
                yield from iter_block_entries(stream, list(blocks[i:j + 1]), key=key, ledger_id=self.ledger.ledger_id,
                                              cipher=self.ledger.cipher, large=large)
            i = j + 1

    def _cached_block(self, i: int, cache: BlockCache) -> list[EntryView] | None:
        """Entries of block ``i`` of a plain copy from the copy's stream in the block cache when the reads are
        sequential (read ahead across reads within :attr:`read_ahead_bytes`; where the store does not read ahead,
        each block read whole when it is reached), each block's entries verified once, when the stream reaches it,
        and kept with it for the reads inside it; else None: the caller streams it (:meth:`_streamed_block`;
        rsm.format.blockcache). A list, not a generator: one generator fewer per batch on a history Fetch's path."""
        block = self.ledger.blocks[i]
        prefix = getattr(self.store, "key_prefix", "") or ""  # PrefixedStore
        key = self.keys.data(block.object_number)
        ledger_id = self.ledger.ledger_id

        def parse(data: memoryview) -> list[EntryView]:
            return list(_block_entries(None, [block], key=key, ledger_id=ledger_id, opener=_Fetched(iter([data]))))

        return cache.read(self.store, key, self.ledger.blocks, i, prefix + self.keys.base,
                          budget_bytes=self.read_ahead_bytes, parse=parse, request_bytes=self.read_ahead_request_bytes,
                          map_range=self.map_range)

    def _streamed_block(self, i: int) -> Iterator[EntryView]:
        """Entries of block ``i`` of a plain copy, streamed with one ranged GET (a random read), nothing kept."""
        block = self.ledger.blocks[i]
        key = self.keys.data(block.object_number)
        end = block.object_position + block.block_length - 1
        with self.store.get(key, block.object_position, end) as stream:
            yield from iter_block_entries(stream, [block], key=key, ledger_id=self.ledger.ledger_id)

    def _block_ordinal(self, block: BlockInfo) -> int:
        return block.part_id

    def locate(self, offset: int) -> EntryAddress:
        """Kafka ``offset`` -> (ledger id, entry id, index in batch); reads one block.

        An offset in a gap between batches maps to the next batch (index 0). Raises
        :class:`RemoteResourceNotFoundError` when the offset is not in this segment.
        """
        block = self.ledger.block_for_offset(offset)
        if block is None:
            raise RemoteResourceNotFoundError(f"offset {offset} is not in remote segment {self.keys.base}")
        n = self._block_ordinal(block)
        for e in self.iter_entries(n, n, large=True):  # headers only: a batch in fragments is not read whole
            if e.last_offset >= offset:
                return EntryAddress(self.ledger.ledger_id, e.entry_id, max(0, offset - e.base_offset))
        raise RemoteResourceNotFoundError(f"offset {offset} is not in remote segment {self.keys.base}")

    def offset_of(self, address: EntryAddress) -> int:
        """(ledger id, entry id, index in batch) -> Kafka offset; reads one block."""
        if address.ledger_id != self.ledger.ledger_id:
            raise RemoteResourceNotFoundError(f"ledger {address.ledger_id} is not {self.keys.base}")
        block = self.ledger.block_for_entry(address.entry_id)
        if block is None:
            raise RemoteResourceNotFoundError(f"entry {address.entry_id} is not in ledger {address.ledger_id}")
        n = self._block_ordinal(block)
        for e in self.iter_entries(n, n, large=True):  # headers only
            if e.entry_id == address.entry_id:
                offset = e.base_offset + address.index_in_batch
                if not 0 <= address.index_in_batch or offset > e.last_offset:
                    raise RemoteResourceNotFoundError(
                        f"index {address.index_in_batch} is outside entry {e.entry_id} "
                        f"(offsets {e.base_offset}..{e.last_offset})")
                return offset
        raise RemoteResourceNotFoundError(f"entry {address.entry_id} is not in ledger {address.ledger_id}")

    def find_timestamp(self, timestamp_ms: int) -> EntryView | None:
        """The first batch whose max timestamp is >= ``timestamp_ms`` (reads one block), or None."""
        block = self.ledger.block_for_timestamp(timestamp_ms)
        if block is None:
            return None
        n = self._block_ordinal(block)
        for e in self.iter_entries(n, len(self.ledger.blocks) - 1):
            if e.max_timestamp_ms >= timestamp_ms:
                return e
        return None

    # -- original bytes ----------------------------------------------------------------------------------------

    def open_log(self, start_position: int, end_position_inclusive: int | None = None) -> BinaryIO:
        """The original ``.log`` bytes ``start_position..end_position_inclusive`` (clamped to the end).

        Positions are those of the original ``.log``. A copy that skipped leading batches (it starts above the
        file's first batch) holds only the bytes from its first kept batch on: a start below it begins there
        (Kafka's reader looks a position up in the uploaded offset index, whose floor entry may be a skipped
        batch, and skips batches below its target offset anyway)."""
        lo, size = self.ledger.log_start_position, self.ledger.metadata.segment_size_bytes
        hi = lo + size  # exclusive
        if start_position < 0 or start_position >= hi or size == 0:
            raise ValueError(f"start position {start_position} is outside remote segment {self.keys.base} "
                             f"(.log bytes {lo}..{hi - 1})")
        start_position = max(start_position, lo)
        end = hi - 1 if end_position_inclusive is None else min(end_position_inclusive, hi - 1)
        if end < start_position:
            return io.BytesIO(b"")  # type: ignore[return-value]
        first = self.ledger.block_for_position(start_position)
        last = self.ledger.block_for_position(end)
        if first is None or last is None:
            raise CorruptRemoteObjectError(f"the index does not cover .log bytes {start_position}..{end}",
                                           key=self.keys.index, position=0)
        return io.BufferedReader(_ChunkStream(self._log_chunks(first, last, start_position, end)),
                                 READ_CHUNK_BYTES)  # type: ignore[return-value]

    def _log_chunks(self, first: int, last: int, start: int, end: int) -> Iterator[memoryview]:
        for e in self.iter_entries(first, last, large=True):
            e_end = e.log_position + len(e.data)
            if e_end <= start:
                continue
            if e.log_position > end:
                return
            pieces = e.data.chunks() if isinstance(e.data, LargeBatch) else (e.data,)
            at = e.log_position  # of the piece in the original .log
            for piece in pieces:
                p_end = at + len(piece)
                if p_end > start and at <= end:
                    lo = max(start, at) - at
                    hi = min(end + 1, p_end) - at
                    if self._on_bytes is not None:
                        self._on_bytes(hi - lo)
                    yield piece[lo:hi]
                if p_end > end:
                    return  # the rest of the batch is not needed
                at = p_end
            if e_end > end:
                return  # stop reading the object: the rest of the range is not needed

    def open_section(self, index_type: IndexType) -> BinaryIO:
        """One of Kafka's indexes, original bytes, CRC-32C checked before it is returned."""
        s = self.ledger.section(index_type)
        if s is None:
            raise RemoteResourceNotFoundError(f"remote segment {self.keys.base} has no {index_type.name} index")
        key = self.keys.data(s.object_number)
        if s.length == 0:
            return io.BytesIO(b"")  # type: ignore[return-value]
        data = self.store.get_bytes(key, s.position, s.position + s.length - 1)
        if len(data) != s.length:
            raise CorruptRemoteObjectError(f"{index_type.name} index: expected {s.length} bytes, found {len(data)}",
                                           key=key, position=s.position + len(data))
        if self.ledger.cipher is not None:
            data = self.ledger.cipher.open_section(data, key=key, ledger_id=self.ledger.ledger_id,
                                                   object_number=s.object_number, position=s.position,
                                                   what=f"{index_type.name} index section")
        crc = google_crc32c.value(data)
        if crc != s.crc32c:
            raise CorruptRemoteObjectError(
                f"{index_type.name} index CRC-32C 0x{crc:08X} does not match the index's 0x{s.crc32c:08X}", key=key,
                position=s.position)
        if self._on_bytes is not None:
            self._on_bytes(len(data))
        return io.BytesIO(data)  # type: ignore[return-value]
