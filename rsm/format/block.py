"""The data block of a remote data object (Pulsar PIP-17 / PIP-76 block format, seeds/000).

A data object is a run of blocks, back to back. Each block is a 128-byte header and a payload of entries; an
entry is one Kafka record batch, verbatim (its CRC-32C still checks and it can be served to a client as is).
Blocks are not padded to a fixed size: ``block_len`` is the exact length.

Layout (big-endian)::

    DataBlock =>
      magic_word => uint32          (0x26A66D32)
      header_len => int64           (128)
      block_len => int64            (header included)
      first_entry_id => int64       (entry id of the first entry in the block)
      ledger_id => int64
      padding => bytes              (zeros up to header_len)
      entries => [Entry]            (until block_len)

    Entry =>
      entry_len => int32            (length of entry_data)
      entry_id => int64             (0, 1, 2 ... in file order within the ledger)
      entry_data => bytes           (one Kafka record batch)
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from rsm.errors import CorruptRemoteObjectError

__all__ = [
    "BLOCK_HEADER_LENGTH",
    "BLOCK_MAGIC",
    "ENTRY_HEADER",
    "ENTRY_HEADER_LENGTH",
    "BlockBuilder",
    "BlockHeader",
    "decode_block_header",
    "encode_block_header",
    "iter_entries",
]

BLOCK_MAGIC = 0x26A66D32
BLOCK_HEADER_LENGTH = 128

_BLOCK_HEADER = struct.Struct(
    ">"
    "I"  # magic_word
    "q"  # header_len
    "q"  # block_len
    "q"  # first_entry_id
    "q"  # ledger_id
)
ENTRY_HEADER = struct.Struct(
    ">"
    "i"  # entry_len
    "q"  # entry_id
)
ENTRY_HEADER_LENGTH = ENTRY_HEADER.size  # 12
_PADDING = bytes(BLOCK_HEADER_LENGTH - _BLOCK_HEADER.size)


@dataclass(frozen=True, slots=True)
class BlockHeader:
    """A decoded block header."""

    header_length: int
    block_length: int
    first_entry_id: int
    ledger_id: int


def encode_block_header(block_length: int, first_entry_id: int, ledger_id: int) -> bytes:
    """The 128-byte header of a block of ``block_length`` bytes (header included)."""
    return _BLOCK_HEADER.pack(BLOCK_MAGIC, BLOCK_HEADER_LENGTH, block_length, first_entry_id, ledger_id) + _PADDING


def decode_block_header(buf: bytes | memoryview, *, key: str, position: int) -> BlockHeader:
    """Decode the header at the start of ``buf``; ``key``/``position`` locate it for errors."""
    if len(buf) < BLOCK_HEADER_LENGTH:
        raise CorruptRemoteObjectError(
            f"truncated block header: expected {BLOCK_HEADER_LENGTH} bytes, found {len(buf)}", key=key,
            position=position)
    magic, header_len, block_len, first_entry_id, ledger_id = _BLOCK_HEADER.unpack_from(buf, 0)
    if magic != BLOCK_MAGIC:
        raise CorruptRemoteObjectError(f"bad block magic 0x{magic:08X}, expected 0x{BLOCK_MAGIC:08X}", key=key,
                                       position=position)
    if header_len != BLOCK_HEADER_LENGTH:
        raise CorruptRemoteObjectError(f"bad block header_len {header_len}, expected {BLOCK_HEADER_LENGTH}",
                                       key=key, position=position + 4)
    if block_len < BLOCK_HEADER_LENGTH:
        raise CorruptRemoteObjectError(f"bad block_len {block_len} (< header length)", key=key,
                                       position=position + 12)
    return BlockHeader(header_len, block_len, first_entry_id, ledger_id)


def iter_entries(block: memoryview, header: BlockHeader, *, key: str,
                 position: int) -> Iterator[tuple[int, int, memoryview]]:
    """Yield ``(entry_id, position of the entry header in the object, entry bytes)`` for a whole block.

    ``block`` is the whole block, header included; ``position`` is the block's position in the object. Entry
    ids must run on from ``first_entry_id`` and entries must fill the block exactly.
    """
    if len(block) != header.block_length:
        raise CorruptRemoteObjectError(
            f"truncated block: expected {header.block_length} bytes, found {len(block)}", key=key,
            position=position)
    pos = header.header_length
    expected_id = header.first_entry_id
    end = header.block_length
    while pos < end:
        if end - pos < ENTRY_HEADER_LENGTH:
            raise CorruptRemoteObjectError(
                f"truncated entry header: expected {ENTRY_HEADER_LENGTH} bytes, found {end - pos}", key=key,
                position=position + pos)
        entry_len, entry_id = ENTRY_HEADER.unpack_from(block, pos)
        if entry_id != expected_id:
            raise CorruptRemoteObjectError(f"entry id {entry_id}, expected {expected_id}", key=key,
                                           position=position + pos + 4)
        if entry_len < 0 or pos + ENTRY_HEADER_LENGTH + entry_len > end:
            raise CorruptRemoteObjectError(
                f"entry length {entry_len} runs past the block end ({end - pos - ENTRY_HEADER_LENGTH} bytes left)",
                key=key, position=position + pos)
        data_pos = pos + ENTRY_HEADER_LENGTH
        yield entry_id, position + pos, block[data_pos:data_pos + entry_len]
        pos = data_pos + entry_len
        expected_id += 1


class BlockBuilder:
    """Builds one block in memory; the caller bounds it (block size, or one entry if that is larger)."""

    __slots__ = ("_buf", "_first_entry_id", "_ledger_id", "entry_count")

    def __init__(self, ledger_id: int, first_entry_id: int) -> None:
        self._ledger_id = ledger_id
        self._first_entry_id = first_entry_id
        self._buf = bytearray(BLOCK_HEADER_LENGTH)
        self.entry_count = 0

    def __len__(self) -> int:
        return len(self._buf)

    def add(self, entry_id: int, data: bytes | memoryview) -> None:
        """Append one entry (its id must be the next one)."""
        self._buf += ENTRY_HEADER.pack(len(data), entry_id)
        self._buf += data
        self.entry_count += 1

    def finish(self) -> bytearray:
        """Write the header and hand over the block's bytes (the builder is spent)."""
        buf = self._buf
        _BLOCK_HEADER.pack_into(buf, 0, BLOCK_MAGIC, BLOCK_HEADER_LENGTH, len(buf), self._first_entry_id,
                                self._ledger_id)
        buf[_BLOCK_HEADER.size:BLOCK_HEADER_LENGTH] = _PADDING
        self._buf = bytearray()
        return buf
