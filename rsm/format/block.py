"""The data block of a remote data object (Pulsar PIP-17 / PIP-76 block format, seeds/000): writer and reader.

A data object is a run of blocks, back to back. Each block is a 128-byte header and a payload of entries; an
entry is one Kafka record batch, verbatim (its CRC-32C still checks and it can be served to a client as is).
In an encrypted copy each block is stored sealed (:mod:`rsm.format.crypto`); opened, it is this format.
Blocks are not padded to a fixed size: ``block_len`` is the exact length. A batch larger than a block (less its
headers) is stored as *fragments* (PDP-43, issue 26): a run of blocks, one per fragment, each holding one entry
whose bytes are that fragment of the batch (entry id: the batch's, in every fragment block), the fragment fields of
the header saying which. Copies written before fragments existed have zeros there (a block of whole entries), so
they read as before. This module is the only place that
knows how blocks and entries are framed: :func:`frame_block` (used by :mod:`rsm.format.ledger`, which reads the
entries into the places it leaves) and :func:`encode_block` write them,
:func:`read_block_header` and :class:`EntryReader` (used by :mod:`rsm.format.reader`) read them back. What an
entry holds (a Kafka record batch) is checked by the callers, through :mod:`rsm.log.batch`.

Layout (big-endian)::

    DataBlock =>
      magic_word => uint32          (0x26A66D32)
      header_len => int64           (128)
      block_len => int64            (header included)
      first_entry_id => int64       (entry id of the first entry in the block)
      ledger_id => int64
      fragment_number => int32      (0 unless fragment_count > 0: which fragment of the entry this block holds)
      fragment_count => int32       (0: whole entries; n > 0: one fragment of an entry cut into n blocks)
      entry_length => int64         (fragments: the whole entry's length; else 0)
      fragment_crc32c => uint32     (fragments: CRC-32C of this block's entry_data; else 0)
      padding => bytes              (zeros up to header_len)
      entries => [Entry]            (until block_len; a fragment block holds exactly one)

    Entry =>
      entry_len => int32            (length of entry_data)
      entry_id => int64             (0, 1, 2 ... in file order within the ledger)
      entry_data => bytes           (one Kafka record batch, or in a fragment block one fragment of it)
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

from rsm.errors import CorruptRemoteObjectError

__all__ = [
    "BLOCK_HEADER",
    "BLOCK_HEADER_LENGTH",
    "BLOCK_MAGIC",
    "ENTRY_HEADER",
    "ENTRY_HEADER_LENGTH",
    "LEDGER_ID_OFFSET",
    "BlockHeader",
    "EntryReader",
    "decode_block_header",
    "encode_block",
    "fragment_payload",
    "frame_block",
    "frame_fragment",
    "set_fragment_crc",
    "read_block_header",
]

BLOCK_MAGIC = 0x26A66D32
BLOCK_HEADER_LENGTH = 128  # header_len: the format fixes it; the fields below, then zero padding up to it

_BLOCK_HEADER_FIELDS = (
    ">"
    "I"  # magic_word
    "q"  # header_len
    "q"  # block_len
    "q"  # first_entry_id
    "q"  # ledger_id
    "i"  # fragment_number
    "i"  # fragment_count
    "q"  # entry_length
    "I"  # fragment_crc32c
)
BLOCK_HEADER = struct.Struct(_BLOCK_HEADER_FIELDS + f"{BLOCK_HEADER_LENGTH - struct.calcsize(_BLOCK_HEADER_FIELDS)}x")
_FRAGMENT_CRC_OFFSET = struct.calcsize(">Iqqqqiiq")  # 52
_HEADER_LEN_OFFSET = struct.calcsize(">I")  # 4
_BLOCK_LEN_OFFSET = struct.calcsize(">Iq")  # 12
LEDGER_ID_OFFSET = struct.calcsize(">Iqqq")  # 28

ENTRY_HEADER = struct.Struct(
    ">"
    "i"  # entry_len
    "q"  # entry_id
)
ENTRY_HEADER_LENGTH = ENTRY_HEADER.size  # 12
_ENTRY_ID_OFFSET = struct.calcsize(">i")  # 4


@dataclass(frozen=True, slots=True)
class BlockHeader:
    """A decoded block header."""

    header_length: int
    block_length: int
    first_entry_id: int
    ledger_id: int
    fragment_number: int = 0
    fragment_count: int = 0
    """0: the block holds whole entries; else it holds fragment ``fragment_number`` of an entry cut in this many."""
    entry_length: int = 0
    fragment_crc32c: int = 0


def fragment_payload(block_size_bytes: int) -> int:
    """Bytes of an entry one fragment block of at most ``block_size_bytes`` holds."""
    return block_size_bytes - BLOCK_HEADER_LENGTH - ENTRY_HEADER_LENGTH


# -- writing -----------------------------------------------------------------------------------------------------


def frame_block(buf: bytearray | memoryview, ledger_id: int, first_entry_id: int,
                entry_lengths: Sequence[int]) -> tuple[int, list[tuple[int, int]]]:
    """Frame one block of entries of ``entry_lengths`` (ids from ``first_entry_id`` on) in ``buf``, contiguous:
    the block header and every entry header are written; the entries' own bytes are left to the caller, at the
    returned ``(position, length)`` places. Returns ``(block length, places)``; ``buf`` must hold the block. The
    caller bounds the block (block size, or one entry if that is larger)."""
    places: list[tuple[int, int]] = []
    append = places.append
    pack_into = ENTRY_HEADER.pack_into
    pos = BLOCK_HEADER_LENGTH
    for entry_id, n in enumerate(entry_lengths, first_entry_id):
        pack_into(buf, pos, n, entry_id)
        pos += ENTRY_HEADER_LENGTH
        append((pos, n))
        pos += n
    BLOCK_HEADER.pack_into(buf, 0, BLOCK_MAGIC, BLOCK_HEADER_LENGTH, pos, first_entry_id, ledger_id, 0, 0, 0, 0)
    return pos, places


def frame_fragment(buf: bytearray | memoryview, ledger_id: int, entry_id: int, fragment_number: int,
                   fragment_count: int, entry_length: int, length: int) -> tuple[int, int]:
    """Frame a fragment block in ``buf``: fragment ``fragment_number`` (of ``fragment_count``) of entry
    ``entry_id`` (``entry_length`` bytes in all), ``length`` bytes of it. The fragment's bytes are the caller's, at
    the returned position, and so is its CRC (:func:`set_fragment_crc`, once they are there). Returns
    ``(block length, position of the fragment's bytes)``."""
    ENTRY_HEADER.pack_into(buf, BLOCK_HEADER_LENGTH, length, entry_id)
    end = BLOCK_HEADER_LENGTH + ENTRY_HEADER_LENGTH + length
    BLOCK_HEADER.pack_into(buf, 0, BLOCK_MAGIC, BLOCK_HEADER_LENGTH, end, entry_id, ledger_id, fragment_number,
                           fragment_count, entry_length, 0)
    return end, BLOCK_HEADER_LENGTH + ENTRY_HEADER_LENGTH


def set_fragment_crc(buf: bytearray | memoryview, crc32c: int) -> None:
    """Write a fragment block's ``fragment_crc32c`` (the CRC-32C of its entry_data)."""
    struct.pack_into(">I", buf, _FRAGMENT_CRC_OFFSET, crc32c)


def encode_block(ledger_id: int, first_entry_id: int, entries: Sequence[bytes | memoryview]) -> bytes:
    """One block of ``entries`` (ids from ``first_entry_id`` on), as bytes (:func:`frame_block`, entries copied)."""
    buf = bytearray(BLOCK_HEADER_LENGTH + sum(ENTRY_HEADER_LENGTH + len(e) for e in entries))
    length, places = frame_block(buf, ledger_id, first_entry_id, [len(e) for e in entries])
    for (pos, n), data in zip(places, entries, strict=True):
        buf[pos:pos + n] = data
    return bytes(buf[:length])


# -- reading -----------------------------------------------------------------------------------------------------


def decode_block_header(buf: bytes | bytearray | memoryview, *, key: str, position: int) -> BlockHeader:
    """Decode the header at the start of ``buf``; ``key``/``position`` locate it for errors."""
    if len(buf) < BLOCK_HEADER_LENGTH:
        raise CorruptRemoteObjectError(
            f"truncated block header: expected {BLOCK_HEADER_LENGTH} bytes, found {len(buf)}", key=key,
            position=position)
    (magic, header_len, block_len, first_entry_id, ledger_id, fragment_number, fragment_count, entry_length,
     fragment_crc) = BLOCK_HEADER.unpack_from(buf, 0)
    if magic != BLOCK_MAGIC:
        raise CorruptRemoteObjectError(f"bad block magic 0x{magic:08X}, expected 0x{BLOCK_MAGIC:08X}", key=key,
                                       position=position)
    if header_len != BLOCK_HEADER_LENGTH:
        raise CorruptRemoteObjectError(f"bad block header_len {header_len}, expected {BLOCK_HEADER_LENGTH}",
                                       key=key, position=position + _HEADER_LEN_OFFSET)
    if block_len < BLOCK_HEADER_LENGTH:
        raise CorruptRemoteObjectError(f"bad block_len {block_len} (< header length)", key=key,
                                       position=position + _BLOCK_LEN_OFFSET)
    if fragment_count < 0 or not (0 <= fragment_number < max(fragment_count, 1)) or (
            fragment_count and entry_length <= 0):
        raise CorruptRemoteObjectError(
            f"bad fragment fields: fragment {fragment_number} of {fragment_count}, entry length {entry_length}",
            key=key, position=position + LEDGER_ID_OFFSET + 8)
    return BlockHeader(header_len, block_len, first_entry_id, ledger_id, fragment_number, fragment_count,
                       entry_length, fragment_crc)


def _read_exactly(stream: BinaryIO, n: int) -> bytearray:
    """Up to ``n`` bytes from ``stream``: fewer only where the stream ends."""
    buf = bytearray(n)
    mv = memoryview(buf)
    got = 0
    while got < n:
        k = stream.readinto(mv[got:])  # type: ignore[attr-defined]
        if not k:
            mv.release()
            del buf[got:]
            break
        got += k
    return buf


def read_block_header(stream: BinaryIO, *, key: str, position: int) -> BlockHeader:
    """Read and decode the header of the block at ``position`` (where ``stream`` stands)."""
    return decode_block_header(_read_exactly(stream, BLOCK_HEADER_LENGTH), key=key, position=position)


class EntryReader:
    """The entries of one block, read from ``source``: a stream standing just after the block's header, or the
    whole block in a buffer (an opened encrypted block). ``position`` is the block's position in the object.
    Iterate once: ``(entry_id, position of the entry header in the object, entry bytes)``; from a stream each entry
    is in a fresh ``bytearray`` the caller owns, streamed one entry at a time; from a buffer it is a view of the
    buffer (no copy: the buffer must not change while the views are held).

    Entry ids must run on from ``first_entry_id`` and the entries must fill the block exactly, else
    :class:`CorruptRemoteObjectError`; it names :attr:`kafka_offset`, which the caller may keep at the Kafka offset
    it expects next.
    """

    __slots__ = ("_buffer", "_header", "_key", "_position", "_stream", "kafka_offset")

    def __init__(self, source: BinaryIO | memoryview, header: BlockHeader, *, key: str, position: int) -> None:
        self._buffer = source if isinstance(source, memoryview) else None
        self._stream = None if isinstance(source, memoryview) else source
        self._header = header
        self._key = key
        self._position = position
        self.kafka_offset: int | None = None

    def _error(self, message: str, position: int) -> CorruptRemoteObjectError:
        return CorruptRemoteObjectError(message, key=self._key, position=position, kafka_offset=self.kafka_offset)

    def _read(self, n: int, at: int) -> bytearray | memoryview:
        if self._buffer is not None:
            data: bytearray | memoryview = self._buffer[at:at + n]
        else:
            data = _read_exactly(self._stream, n)  # type: ignore[arg-type]
        if len(data) < n:
            raise self._error(f"truncated block: expected {self._header.block_length} bytes, found "
                              f"{at + len(data)}", self._position + at + len(data))
        return data

    def __iter__(self) -> Iterator[tuple[int, int, bytearray | memoryview]]:
        unpack = ENTRY_HEADER.unpack
        unpack_from = ENTRY_HEADER.unpack_from
        position = self._position
        pos = self._header.header_length
        end = self._header.block_length
        entry_id = self._header.first_entry_id
        buf = self._buffer
        # the whole block in a buffer: entries unpacked and sliced from it in place (no _read call, no header
        # slice: ~0.4 us of a 16 KiB batch's parse); the bounds below keep every slice inside it
        whole = buf is not None and len(buf) >= end
        while pos < end:
            if end - pos < ENTRY_HEADER_LENGTH:
                raise self._error(f"truncated entry header: expected {ENTRY_HEADER_LENGTH} bytes, found "
                                  f"{end - pos} before the block end", position + pos)
            entry_len, stored_id = unpack_from(buf, pos) if whole else unpack(self._read(ENTRY_HEADER_LENGTH, pos))
            if stored_id != entry_id:
                raise self._error(f"entry id {stored_id}, expected {entry_id}", position + pos + _ENTRY_ID_OFFSET)
            data_pos = pos + ENTRY_HEADER_LENGTH
            if entry_len < 0 or data_pos + entry_len > end:
                raise self._error(f"entry length {entry_len} runs past the block end ({end - data_pos} bytes left)",
                                  position + pos)
            yield entry_id, position + pos, (buf[data_pos:data_pos + entry_len] if whole  # type: ignore[index]
                                             else self._read(entry_len, data_pos))
            pos = data_pos + entry_len
            entry_id += 1
