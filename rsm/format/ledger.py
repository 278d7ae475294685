"""Writing a segment as one ledger: Kafka record batches -> entries -> blocks of a bounded size.

Entry ids run 0, 1, 2 ... in file order; one entry is one record batch, verbatim. A block closes when the
next entry would take it past ``block_size_bytes`` (a batch larger than that gets a block of its own), so the
writer holds at most one block in memory. Where blocks go (which data object, at which position) is the
caller's business: :class:`LedgerWriter` only reports what each block holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from rsm.format.block import BLOCK_HEADER_LENGTH, ENTRY_HEADER_LENGTH, BlockBuilder
from rsm.log.batch import BatchHeader

__all__ = ["BlockDraft", "EntryAddress", "LedgerWriter"]


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


class LedgerWriter:
    """Packs record batches into blocks; iterate :meth:`blocks` once."""

    def __init__(self, ledger_id: int, block_size_bytes: int) -> None:
        if block_size_bytes < BLOCK_HEADER_LENGTH + ENTRY_HEADER_LENGTH:
            raise ValueError(f"block_size_bytes {block_size_bytes} is smaller than one block header and entry")
        self.ledger_id = ledger_id
        self.block_size_bytes = block_size_bytes
        self.entry_count = 0
        self.log_bytes = 0
        self.first_offset: int | None = None
        self.last_offset: int | None = None
        self.max_timestamp_ms = -1

    def blocks(self, batches: Iterable[tuple[BatchHeader, memoryview]]) -> Iterator[tuple[BlockDraft, bytearray]]:
        """Yield ``(draft, block bytes)`` per block; the bytes are the caller's once yielded."""
        builder: BlockBuilder | None = None
        part_id = 0
        first_offset = last_offset = log_position = 0
        max_ts = -1
        expected_position: int | None = None

        def close(b: BlockBuilder) -> tuple[BlockDraft, bytearray]:
            n = b.entry_count
            block = b.finish()
            draft = BlockDraft(self.entry_count - n, part_id, n, len(block), first_offset, last_offset, max_ts,
                               log_position, len(block) - BLOCK_HEADER_LENGTH - n * ENTRY_HEADER_LENGTH)
            return draft, block

        for header, data in batches:
            if expected_position is not None and header.position != expected_position:
                raise ValueError(f"batch at position {header.position} does not follow the previous batch "
                                 f"(expected {expected_position})")
            expected_position = header.position + header.size_bytes
            if builder is not None and len(builder) + ENTRY_HEADER_LENGTH + len(data) > self.block_size_bytes:
                yield close(builder)
                part_id += 1
                builder = None
            if builder is None:
                builder = BlockBuilder(self.ledger_id, self.entry_count)
                first_offset = header.base_offset
                log_position = header.position
                max_ts = -1
            builder.add(self.entry_count, data)
            self.entry_count += 1
            self.log_bytes += len(data)
            last_offset = header.last_offset
            max_ts = max(max_ts, header.max_timestamp)
            if self.first_offset is None:
                self.first_offset = header.base_offset
            self.last_offset = header.last_offset
            self.max_timestamp_ms = max(self.max_timestamp_ms, header.max_timestamp)
        if builder is not None and builder.entry_count:
            yield close(builder)
