"""Writing a segment as one ledger: Kafka record batches -> entries -> blocks of a bounded size.

Entry ids run 0, 1, 2 ... in file order; one entry is one record batch, verbatim. A block closes when the
next entry would take it past ``block_size_bytes``. A batch that does not fit in a block of its own is stored as
fragments (:mod:`rsm.format.block`; PDP-43, issue 26): a run of blocks of at most ``block_size_bytes``, each read
from the file into the same block buffers, its CRC-32C taken as it is read (the batch's own CRC is checked across
them when the last is read), so a batch of hundreds of MiB is copied in the memory of two blocks.

A copy may start above the file's first batch (``start_offset``): a new leader's local segment can straddle the
highest remote offset H, since replicas roll at different offsets. Batches whose last offset is below
``start_offset`` are skipped while scanning (never held in memory), and the first kept batch must start exactly
at ``start_offset`` (batches are identical across replicas, so the one after H starts at H + 1). When nothing is
skipped, the first batch may start above ``start_offset`` (a file named below its first batch). Every batch must
end at or before ``end_offset_inclusive``. Otherwise :class:`SegmentRangeError` is raised: before the first block
is handed out for a bad start (or no batch at all in the range), and when the scan reaches a batch past
``end_offset_inclusive`` for a bad end, which may be after blocks were handed out (the storage manager then
removes what it wrote). Kept batches keep their positions in the original file (``log_position``).

An *offload segment* (PIP-76 streaming offload, :meth:`LedgerWriter.piece_blocks`) is one ledger cut from the log at
any batch boundaries: pieces ``[start_position, end_position)`` of one or more ``.log`` files (the active one too),
one after the other. A block never spans two pieces. Its ``log_position`` values are positions in the offload
segment (its batches one after the other from 0), the positions Kafka's indexes of such a segment hold.

Two passes over the (immutable, rolled) ``.log``, both streaming: ``scan_batches`` checks every batch's
header and CRC-32C and plans the blocks; each block is then framed in a reused buffer
(:func:`rsm.format.block.frame_block` writes the block and entry headers) and its batches, contiguous in the file,
are read straight into their places with ``preadv`` (one system call per up to IOV_MAX batches, no other copy), so
a block is handed out as one contiguous buffer, the unit one AES-GCM message seals in an encrypted copy. Two
buffers take turns, so a block stays valid while the next one is read (an encrypted copy seals block *i* on a
worker thread while block *i + 1* is read). Memory: two block buffers, whatever the segment size. A writer given a
:class:`~rsm.log.epochs.BatchEpochs` feeds it each block's batches as it frames them: the batches' leader-epoch map
comes with the copy, no walk of the headers of its own. Where blocks go
(which data object, at which position) is the caller's business.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from rsm.format.block import (
    BLOCK_HEADER_LENGTH,
    ENTRY_HEADER_LENGTH,
    fragment_payload,
    frame_block,
    frame_fragment,
    set_fragment_crc,
)
from rsm.log._crc32c import buffer_address, crc32c_at
from rsm.log.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_SIZE,
    BATCH_LENGTH_OFFSET,
    CRC_OFFSET,
    BatchHeader,
    scan_batches,
)
from rsm.log.epochs import BatchEpochs
from rsm.log.held import open_read
from rsm.store.base import IOV_MAX


class Piece(Protocol):
    """``[start_position, end_position)`` of a ``.log`` (``rsm.api.LogPiece``)."""

    log_path: os.PathLike[str] | str
    start_position: int
    end_position: int

__all__ = ["BlockDraft", "EntryAddress", "KeptRange", "LedgerChangedError", "LedgerWriter", "SegmentRangeError",
           "kept_range"]

# fields of the record batch header re-checked after the copying read (see LedgerWriter._emit)
_BASE_OFFSET_FIELD = slice(0, BATCH_LENGTH_OFFSET)
_CRC_FIELD = slice(CRC_OFFSET, ATTRIBUTES_OFFSET)


@dataclass(frozen=True, slots=True)
class EntryAddress:
    """A Kafka offset's place in the remote format: ledger, entry (batch) and index inside the batch.

    ``index_in_batch`` is the offset delta from the batch's base offset (``offset - base_offset``).
    """

    ledger_id: int
    entry_id: int
    index_in_batch: int


@dataclass(frozen=True, slots=True)
class BlockDraft:
    """What one finished block holds (its place in a data object is decided by the caller)."""

    first_entry_id: int
    part_id: int
    entry_count: int
    block_length: int
    first_offset: int
    last_offset: int
    max_timestamp_ms: int
    log_position: int
    log_bytes: int
    fragment_number: int = 0
    fragment_count: int = 0
    """0: whole entries; else the block holds fragment ``fragment_number`` of a batch cut in this many blocks."""


class LedgerChangedError(ValueError):
    """The ``.log`` changed between the checking pass and the copying pass (it must be immutable)."""


class SegmentRangeError(ValueError):
    """The ``.log`` does not hold exactly the batches of the requested offset range."""


@dataclass(frozen=True, slots=True)
class KeptRange:
    """The part of a ``.log`` a copy of ``[start_offset, end_offset_inclusive]`` keeps.

    ``position`` is the byte position of the first kept batch in the file, ``size_bytes`` the bytes of the kept
    batches (what a copy stores, and the segment's ``segment_size_bytes``), ``skipped_batches`` how many leading
    batches lie below ``start_offset``.
    """

    position: int
    size_bytes: int
    first_offset: int | None
    last_offset: int | None
    batch_count: int
    skipped_batches: int


def _kept_headers(log_path: str | os.PathLike[str], start_offset: int | None, end_offset_inclusive: int | None, *,
                  verify_crc: bool, on_skip: Callable[[BatchHeader], None] | None = None) -> Iterator[BatchHeader]:
    """The headers of the batches of ``[start_offset, end_offset_inclusive]``, checked as the module says."""
    first = True
    skipped: BatchHeader | None = None
    for header in scan_batches(log_path, verify_crc=verify_crc):
        if first:
            if start_offset is not None and header.last_offset < start_offset:
                skipped = header
                if on_skip is not None:
                    on_skip(header)
                continue
            if start_offset is not None and header.base_offset != start_offset and (
                    skipped is not None or header.base_offset < start_offset):
                before = (f"; the batch before it ends at {skipped.last_offset}" if skipped is not None else "")
                raise SegmentRangeError(
                    f"{log_path}: the first batch at or after start offset {start_offset} holds offsets "
                    f"{header.base_offset}..{header.last_offset} (byte {header.position}){before}: a copy must "
                    f"start exactly at a batch boundary")
            first = False
        if end_offset_inclusive is not None and header.last_offset > end_offset_inclusive:
            raise SegmentRangeError(
                f"{log_path}: batch at byte {header.position} holds offsets {header.base_offset}.."
                f"{header.last_offset}, past the segment's end offset {end_offset_inclusive}")
        yield header
    if first and skipped is not None:
        raise SegmentRangeError(f"{log_path}: no batch at or after start offset {start_offset} (the last batch "
                                f"ends at {skipped.last_offset})")


def kept_range(log_path: str | os.PathLike[str], start_offset: int | None = None,
               end_offset_inclusive: int | None = None) -> KeptRange:
    """What a copy of ``[start_offset, end_offset_inclusive]`` of ``log_path`` keeps (headers only, no CRC
    check; streams). The copier uses ``size_bytes`` as the segment's ``segment_size_bytes``. Raises
    :class:`SegmentRangeError` as the copy would."""
    skipped = 0

    def count(_h: BatchHeader) -> None:
        nonlocal skipped
        skipped += 1

    position = size = n = 0
    first_offset = last_offset = None
    for h in _kept_headers(log_path, start_offset, end_offset_inclusive, verify_crc=False, on_skip=count):
        if first_offset is None:
            first_offset = h.base_offset
            position = h.position
        last_offset = h.last_offset
        size += h.size_bytes
        n += 1
    return KeptRange(position, size, first_offset, last_offset, n, skipped)


class LedgerWriter:
    """Packs the record batches of one ``.log`` into blocks; iterate :meth:`blocks` once."""

    MIN_BLOCK_SIZE_BYTES = BLOCK_HEADER_LENGTH + ENTRY_HEADER_LENGTH + BATCH_HEADER_SIZE
    """A block holds at least a batch header (the first fragment of a large batch holds its header whole)."""

    def __init__(self, ledger_id: int, block_size_bytes: int, *, epochs: BatchEpochs | None = None) -> None:
        """``epochs``: fed every batch written, a block's at a time (:mod:`rsm.log.epochs`): the copy's walk of the
        batches gives their leader-epoch map, no walk of its own."""
        if block_size_bytes < self.MIN_BLOCK_SIZE_BYTES:
            raise ValueError(f"block_size_bytes {block_size_bytes} is smaller than one block header, entry header and "
                             f"batch header ({self.MIN_BLOCK_SIZE_BYTES})")
        self.ledger_id = ledger_id
        self.block_size_bytes = block_size_bytes
        self.entry_count = 0
        self.log_bytes = 0
        self.first_offset: int | None = None
        self.last_offset: int | None = None
        self.max_timestamp_ms = -1
        self.epochs = epochs

    def blocks(self, log_path: str | os.PathLike[str], *, verify_crc: bool = True, start_offset: int | None = None,
               end_offset_inclusive: int | None = None) -> Iterator[tuple[BlockDraft, memoryview]]:
        """Yield ``(draft, block)`` per block, the whole block framed in one buffer, valid until the block after
        the next is requested.

        With ``start_offset`` / ``end_offset_inclusive``, only the batches of that range (see the module
        docstring; :class:`SegmentRangeError` when the file does not hold exactly them)."""
        self._start_buffers()
        part_id = 0
        plan: list[BatchHeader] = []
        planned = BLOCK_HEADER_LENGTH
        # (a /proc/self/fd name, a segment held open for a copy in place, is read on its descriptor: rsm.log.held)
        with open_read(log_path) as f:
            for header in _kept_headers(log_path, start_offset, end_offset_inclusive, verify_crc=verify_crc):
                need = ENTRY_HEADER_LENGTH + header.size_bytes
                if BLOCK_HEADER_LENGTH + need > self.block_size_bytes:
                    if plan:
                        yield self._emit(f, log_path, plan, part_id)
                        part_id += 1
                        plan = []
                        planned = BLOCK_HEADER_LENGTH
                    part_id = yield from self._fragments(f, log_path, header, part_id, header.position)
                    continue
                if plan and planned + need > self.block_size_bytes:
                    yield self._emit(f, log_path, plan, part_id)
                    part_id += 1
                    plan = []
                    planned = BLOCK_HEADER_LENGTH
                plan.append(header)
                planned += need
            if plan:
                yield self._emit(f, log_path, plan, part_id)

    def piece_blocks(self, pieces: Sequence[Piece], *, start_offset: int, end_offset_inclusive: int,
                     on_batch: Callable[[BatchHeader, int], None] | None = None,
                     ) -> Iterator[tuple[BlockDraft, memoryview]]:
        """Yield ``(draft, block)`` per block of an offload segment (as :meth:`blocks`; see the module docstring),
        every batch CRC-checked. ``on_batch(header, position)`` is called for each batch with its position in the
        offload segment. Raises :class:`SegmentRangeError` when the pieces do not hold exactly whole batches of
        ``[start_offset, end_offset_inclusive]`` in increasing offsets, the last one ending at
        ``end_offset_inclusive`` (checked before the last block is handed out)."""
        if not pieces:
            raise SegmentRangeError(f"offsets {start_offset}..{end_offset_inclusive}: no log piece to copy")
        self._start_buffers()
        part_id = 0
        prev_last = start_offset - 1
        out_position = 0
        for i, piece in enumerate(pieces):
            plan: list[BatchHeader] = []
            planned = BLOCK_HEADER_LENGTH
            block_position = out_position
            where = f"{piece.log_path} bytes {piece.start_position}..{piece.end_position}"
            with open(piece.log_path, "rb", buffering=0) as f:
                for header in _piece_headers(piece):
                    if header.base_offset <= prev_last or header.last_offset > end_offset_inclusive:
                        raise SegmentRangeError(
                            f"{where}: batch at byte {header.position} holds offsets {header.base_offset}.."
                            f"{header.last_offset}, not within {prev_last + 1}..{end_offset_inclusive}")
                    need = ENTRY_HEADER_LENGTH + header.size_bytes
                    if plan and (planned + need > self.block_size_bytes
                                 or BLOCK_HEADER_LENGTH + need > self.block_size_bytes):
                        yield self._emit(f, piece.log_path, plan, part_id, block_position)
                        part_id += 1
                        plan = []
                        planned = BLOCK_HEADER_LENGTH
                        block_position = out_position
                    if on_batch is not None:
                        on_batch(header, out_position)
                    if BLOCK_HEADER_LENGTH + need > self.block_size_bytes:
                        part_id = yield from self._fragments(f, piece.log_path, header, part_id, out_position)
                        out_position += header.size_bytes
                        prev_last = header.last_offset
                        block_position = out_position
                        continue
                    plan.append(header)
                    planned += need
                    out_position += header.size_bytes
                    prev_last = header.last_offset
                if i == len(pieces) - 1 and prev_last != end_offset_inclusive:
                    raise SegmentRangeError(f"offsets {start_offset}..{end_offset_inclusive}: the pieces end at "
                                            f"offset {prev_last}")
                if plan:
                    yield self._emit(f, piece.log_path, plan, part_id, block_position)
                    part_id += 1

    def _start_buffers(self) -> None:
        self._bufs = [bytearray(0), bytearray(0)]
        self._turn = 0

    def _next_buffer(self, need: int) -> bytearray:
        """The other block buffer, at least ``need`` bytes (allocated as blocks need them, not block_size_bytes
        each: a 64 KiB segment no longer zero-fills two 4 MiB buffers)."""
        self._turn ^= 1
        buf = self._bufs[self._turn]
        if len(buf) < need:
            buf = self._bufs[self._turn] = bytearray(min(self.block_size_bytes, max(need, 2 * len(buf))))
        return buf

    def _fragments(self, f, log_path: str | os.PathLike[str], h: BatchHeader, part_id: int,
                   log_position: int) -> Iterator[tuple[BlockDraft, memoryview]]:
        """Yield the fragment blocks of batch ``h`` (too large for a block), each read into the next block buffer;
        returns the part id after them. ``log_position`` is the batch's position in the copy's positions."""
        payload = fragment_payload(self.block_size_bytes)
        size = h.size_bytes
        count = -(-size // payload)
        entry_id = self.entry_count
        crc = 0  # the batch's, from Attributes on, across the fragments
        for k in range(count):
            lo = k * payload
            n = min(payload, size - lo)
            buf = self._next_buffer(self.block_size_bytes)
            view = memoryview(buf)
            block_length, at = frame_fragment(view, self.ledger_id, entry_id, k, count, size, n)
            _read_scattered(f, log_path, [view[at:at + n]], h.position + lo)
            address = buffer_address(buf)
            set_fragment_crc(view, crc32c_at(buf, address, at, n))
            if k == 0:
                raw = view[at:at + BATCH_HEADER_SIZE]
                if (int.from_bytes(raw[_BASE_OFFSET_FIELD], "big", signed=True) != h.base_offset
                        or int.from_bytes(raw[_CRC_FIELD], "big") != h.crc):
                    raise LedgerChangedError(f"{log_path} changed while being copied (batch at byte {h.position})")
                crc = crc32c_at(buf, address, at + ATTRIBUTES_OFFSET, n - ATTRIBUTES_OFFSET)
                if self.epochs is not None:
                    self.epochs.add_all((h,))
            else:
                crc = crc32c_at(buf, address, at, n, crc)
            if k == count - 1 and crc != h.crc:
                raise LedgerChangedError(f"{log_path} changed while being copied (batch at byte {h.position}: CRC-32C "
                                         f"0x{crc:08x} across its fragments, 0x{h.crc:08x} when scanned)")
            yield BlockDraft(entry_id, part_id + k, 1, block_length, h.base_offset, h.last_offset, h.max_timestamp,
                             log_position + lo, n, k, count), view[:block_length]
        self.entry_count += 1
        self.log_bytes += size
        if self.first_offset is None:
            self.first_offset = h.base_offset
        self.last_offset = h.last_offset
        self.max_timestamp_ms = max(self.max_timestamp_ms, h.max_timestamp)
        return part_id + count

    def _emit(self, f, log_path: str | os.PathLike[str], plan: list[BatchHeader],
              part_id: int, log_position: int | None = None) -> tuple[BlockDraft, memoryview]:
        start = plan[0].position
        n = plan[-1].end_position - start
        need = BLOCK_HEADER_LENGTH + sum(ENTRY_HEADER_LENGTH + h.size_bytes for h in plan)
        view = memoryview(self._next_buffer(need))
        first_entry_id = self.entry_count
        block_length, places = frame_block(view, self.ledger_id, first_entry_id, [h.size_bytes for h in plan])
        entries = [view[p:p + size] for p, size in places]
        _read_scattered(f, log_path, entries, start)
        max_ts = -1
        for h, raw in zip(plan, entries, strict=True):
            # the bytes read now must be the batch checked by the scan (base offset and CRC fields)
            if (int.from_bytes(raw[_BASE_OFFSET_FIELD], "big", signed=True) != h.base_offset
                    or int.from_bytes(raw[_CRC_FIELD], "big") != h.crc):
                raise LedgerChangedError(f"{log_path} changed while being copied (batch at byte {h.position})")
            max_ts = max(max_ts, h.max_timestamp)
        if self.epochs is not None:
            self.epochs.add_all(plan)
        self.entry_count += len(plan)
        self.log_bytes += n
        if self.first_offset is None:
            self.first_offset = plan[0].base_offset
        self.last_offset = plan[-1].last_offset
        self.max_timestamp_ms = max(self.max_timestamp_ms, max_ts)
        draft = BlockDraft(first_entry_id, part_id, len(plan), block_length, plan[0].base_offset,
                           plan[-1].last_offset, max_ts, start if log_position is None else log_position, n)
        return draft, view[:block_length]


def _read_scattered(f, log_path: str | os.PathLike[str], views: list[memoryview], position: int) -> None:
    """Fill ``views`` from ``f`` at ``position`` on (the file's bytes, back to back), with ``preadv``."""
    fd = f.fileno()
    views = list(views)
    i = 0
    while i < len(views):
        got = os.preadv(fd, views[i:i + IOV_MAX], position)
        if not got:
            raise LedgerChangedError(f"{log_path} shrank while being copied (at byte {position})")
        position += got
        while got:  # drop what was read, keep the rest
            if got >= len(views[i]):
                got -= len(views[i])
                i += 1
            else:
                views[i] = views[i][got:]
                got = 0


def _piece_headers(piece: Piece) -> Iterator[BatchHeader]:
    """The CRC-checked headers of the batches of ``piece``, which must end exactly at its end position. The scan
    stops there: bytes past it (a batch the broker is appending to an active segment) are never looked at."""
    if piece.end_position <= piece.start_position:
        raise SegmentRangeError(f"{piece.log_path}: empty piece {piece.start_position}..{piece.end_position}")
    for header in scan_batches(piece.log_path, start_position=piece.start_position, verify_crc=True):
        if header.end_position > piece.end_position:
            raise SegmentRangeError(f"{piece.log_path}: batch at byte {header.position} ends at byte "
                                    f"{header.end_position}, past the piece's end {piece.end_position}")
        yield header
        if header.end_position == piece.end_position:
            return
    raise SegmentRangeError(f"{piece.log_path}: the file ends before the piece's end {piece.end_position}")
