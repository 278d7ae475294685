"""The index object of a remote segment copy (PIP-76 block index, seeds/000, with our ledger metadata).

Key: the first data object's key + ``-index``. Written last: its presence is the commit point of a copy.
A reader gets from a Kafka offset, a timestamp or an original ``.log`` position to the right block (object,
position, length) with this one object, and can rebuild the segment's metadata record from it alone.

Layout (big-endian)::

    IndexObject =>
      index_magic_word => uint32        (0x3D1FB0BC)
      index_len => uint32               (whole object, this header and the trailing crc included)
      data_object_length => int64       (total bytes of the copy's data objects)
      data_header_length => int64       (128, the block header length)
      ledgers => [LedgerIndex]          (until index_len - 4)
      crc32c => uint32                  (CRC-32C of everything before it; our addition to PIP-76)

    LedgerIndex =>
      ledger_id => int64
      index_entry_count => int32        (number of blocks)
      ledger_metadata_len => int32
      ledger_metadata => LedgerMetadata
      block_indices => [BlockIndex]     (index_entry_count of them)

    BlockIndex =>
      entry_id => int64                 (first entry id of the block)
      part_id => int32                  (ordinal of the block within its ledger)
      offset => int64                   (position of the block in its data object)

    LedgerMetadata =>                   (our binary encoding; PIP-76 uses protobuf here)
      version => int16                  (0; 1 when a block holds a fragment: BlockMeta then has the fragment fields)
      remote_segment_id => uuid         (16 bytes)
      topic_id => uuid
      partition => int32
      start_offset => int64
      end_offset_inclusive => int64
      max_timestamp_ms => int64
      event_timestamp_ms => int64
      broker_id => int32
      segment_size_bytes => int64       (bytes of the original .log held: its kept batches)
      entry_count => int64              (record batches in the ledger)
      topic_name_len => uint16
      topic_name => utf-8 bytes
      leader_epoch_count => int32
      leader_epochs => [leader_epoch int32, start_offset int64]
      data_object_count => int32
      data_object_lengths => [int64]
      section_count => int32
      sections => [index_type int8, object_number int32, position int64, length int64, crc32c uint32]
      block_count => int32              (= index_entry_count)
      blocks => [BlockMeta]

    BlockMeta =>
      object_number => int32            (which data object of the copy holds the block: 0, 1, ...)
      block_length => int64
      entry_count => int32
      first_offset => int64             (base offset of the first batch)
      last_offset => int64              (last offset of the last batch, inclusive)
      max_timestamp_ms => int64
      log_position => int64             (position of the first batch in the original .log file)
      log_bytes => int64                (bytes of the original .log held by the block)
      fragment_number => int32          (version 1 only: as the block's header, rsm.format.block)
      fragment_count => int32           (version 1 only: 0 for a block of whole entries)

A batch stored as fragments (rsm.format.block) is a run of ``fragment_count`` blocks: each has the batch's entry id
as ``entry_id`` and an ``entry_count`` of 1, the batch's offsets and max timestamp, and ``log_position`` /
``log_bytes`` of its own fragment (so a position maps to the fragment holding it). Only copies holding a fragment
are written as version 1: the others stay byte-identical to what readers before fragments wrote and read.

A copy holds the batches of ``[start_offset, end_offset_inclusive]`` only. When the local segment straddled the
highest remote offset (a new leader's replica rolled at other offsets), its leading batches below
``start_offset`` are not stored: the first block's ``log_position`` is then above 0, ``segment_size_bytes``
counts only the kept bytes, and every position (``log_position``, ``fetch_log_segment``'s positions) stays a
position in the original ``.log`` file, so the held bytes are ``first log_position .. + segment_size_bytes``.

Kafka's own index sections (``.index``, ``.timeindex``, ``.txnindex``, producer snapshot, leader-epoch
checkpoint) are stored verbatim, as the broker wrote them for the whole local segment. For a copy that skipped
leading batches this means: the ``.index`` and ``.timeindex`` relative offsets are relative to the local file's
base offset (its name), not to ``start_offset``, and their file positions are positions in the original ``.log``
(the same positions ``fetch_log_segment`` takes); their first entries may point into the skipped batches.
Kafka's RemoteIndexCache reads them relative to the segment's start offset, which errs towards earlier positions
(an entry read as a higher offset than it has), so its forward scan from the looked-up position still finds the
right batch; a fetch from a position below the first kept batch starts at that batch.

An encrypted copy (:mod:`rsm.format.crypto`) stores this object sealed, and its blocks and sections sealed: the
lengths and positions here (``block_length``, ``offset``, section ``position``/``length``, data object lengths)
are then those of the sealed parts as stored, while a section's ``crc32c`` stays that of its plain bytes.
"""

from __future__ import annotations

import bisect
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import google_crc32c

from rsm.api import EpochEntry, IndexType
from rsm.errors import CorruptRemoteObjectError

if TYPE_CHECKING:
    from rsm.format.crypto import CopyCipher

__all__ = [
    "INDEX_KEY_SUFFIX",
    "INDEX_MAGIC",
    "BlockInfo",
    "IndexObject",
    "IndexSection",
    "LedgerIndex",
    "LedgerMetadata",
    "decode_index",
    "encode_index",
]

INDEX_MAGIC = 0x3D1FB0BC
INDEX_KEY_SUFFIX = "-index"
LEDGER_METADATA_VERSION = 0
FRAGMENTS_METADATA_VERSION = 1  # BlockMeta carries the fragment fields

_HEADER = struct.Struct(
    ">"
    "I"  # index_magic_word
    "I"  # index_len
    "q"  # data_object_length
    "q"  # data_header_length
)
_LEDGER_HEADER = struct.Struct(
    ">"
    "q"  # ledger_id
    "i"  # index_entry_count
    "i"  # ledger_metadata_len
)
_BLOCK_INDEX = struct.Struct(
    ">"
    "q"  # entry_id
    "i"  # part_id
    "q"  # offset
)
_META_FIXED = struct.Struct(
    ">"
    "h"    # version
    "16s"  # remote_segment_id
    "16s"  # topic_id
    "i"    # partition
    "q"    # start_offset
    "q"    # end_offset_inclusive
    "q"    # max_timestamp_ms
    "q"    # event_timestamp_ms
    "i"    # broker_id
    "q"    # segment_size_bytes
    "q"    # entry_count
    "H"    # topic_name_len
)
_COUNT = struct.Struct(">i")
_EPOCH = struct.Struct(
    ">"
    "i"  # leader_epoch
    "q"  # start_offset
)
_OBJECT_LENGTH = struct.Struct(">q")
_SECTION = struct.Struct(
    ">"
    "b"  # index_type
    "i"  # object_number
    "q"  # position
    "q"  # length
    "I"  # crc32c
)
_BLOCK_META = struct.Struct(
    ">"
    "i"  # object_number
    "q"  # block_length
    "i"  # entry_count
    "q"  # first_offset
    "q"  # last_offset
    "q"  # max_timestamp_ms
    "q"  # log_position
    "q"  # log_bytes
)
_BLOCK_FRAGMENT = struct.Struct(
    ">"
    "i"  # fragment_number
    "i"  # fragment_count
)
_CRC = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """Where one block is and what it holds (BlockIndex and BlockMeta together)."""

    first_entry_id: int
    part_id: int
    object_number: int
    object_position: int
    block_length: int
    entry_count: int
    first_offset: int
    last_offset: int
    max_timestamp_ms: int
    log_position: int
    log_bytes: int
    fragment_number: int = 0
    fragment_count: int = 0
    """0: whole entries; else the block holds fragment ``fragment_number`` of a batch cut in this many blocks."""


@dataclass(frozen=True, slots=True)
class IndexSection:
    """One of Kafka's indexes stored verbatim in a data object, after the blocks."""

    index_type: IndexType
    object_number: int
    position: int
    length: int
    crc32c: int


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    """Enough to rebuild the segment's metadata record from the bucket alone."""

    remote_segment_id: uuid.UUID
    topic_id: uuid.UUID
    topic_name: str
    partition: int
    start_offset: int
    end_offset_inclusive: int
    max_timestamp_ms: int
    event_timestamp_ms: int
    broker_id: int
    segment_size_bytes: int
    entry_count: int
    leader_epochs: tuple[EpochEntry, ...]
    data_object_lengths: tuple[int, ...]
    sections: tuple[IndexSection, ...]


@dataclass(frozen=True, slots=True)
class LedgerIndex:
    """One ledger (one segment copy): its metadata and its blocks in order.

    ``cipher``: an encrypted copy's data key (:mod:`rsm.format.crypto`), set when its sealed index object was
    opened; None for a plain copy. Not encoded here (the sealed index object carries it, wrapped), not compared,
    not in ``repr``."""

    ledger_id: int
    metadata: LedgerMetadata
    blocks: tuple[BlockInfo, ...]
    cipher: CopyCipher | None = field(default=None, repr=False, compare=False)

    @property
    def log_start_position(self) -> int:
        """Position in the original ``.log`` of the first batch held (0 unless leading batches were skipped)."""
        return self.blocks[0].log_position if self.blocks else 0

    def block_for_offset(self, offset: int) -> BlockInfo | None:
        """The block holding Kafka ``offset`` (the first block whose last offset is >= it), or None."""
        i = bisect.bisect_left(self.blocks, offset, key=lambda b: b.last_offset)
        if i == len(self.blocks) or offset < self.metadata.start_offset:
            return None
        return self.blocks[i]

    def block_for_timestamp(self, timestamp_ms: int) -> BlockInfo | None:
        """The first block holding a record with timestamp >= ``timestamp_ms`` (ListOffsets semantics)."""
        for block in self.blocks:
            if block.max_timestamp_ms >= timestamp_ms:
                return block
        return None

    def block_for_position(self, log_position: int) -> int | None:
        """The ordinal of the block holding byte ``log_position`` of the original ``.log``, or None."""
        i = bisect.bisect_right(self.blocks, log_position, key=lambda b: b.log_position) - 1
        if i < 0:
            return None
        b = self.blocks[i]
        return i if log_position < b.log_position + b.log_bytes else None

    def block_for_entry(self, entry_id: int) -> BlockInfo | None:
        """The block holding entry ``entry_id``, or None."""
        i = bisect.bisect_right(self.blocks, entry_id, key=lambda b: b.first_entry_id) - 1
        if i < 0:
            return None
        i -= self.blocks[i].fragment_number  # a batch in fragments: its first block
        b = self.blocks[i]
        return b if entry_id < b.first_entry_id + b.entry_count else None

    def section(self, index_type: IndexType) -> IndexSection | None:
        for s in self.metadata.sections:
            if s.index_type == index_type:
                return s
        return None


@dataclass(frozen=True, slots=True)
class IndexObject:
    """A decoded index object."""

    data_object_length: int
    data_header_length: int
    ledgers: tuple[LedgerIndex, ...]


def _encode_metadata(ledger: LedgerIndex) -> bytes:
    m = ledger.metadata
    name = m.topic_name.encode("utf-8")
    fragments = any(b.fragment_count for b in ledger.blocks)
    version = FRAGMENTS_METADATA_VERSION if fragments else LEDGER_METADATA_VERSION
    parts = [
        _META_FIXED.pack(version, m.remote_segment_id.bytes, m.topic_id.bytes, m.partition,
                         m.start_offset, m.end_offset_inclusive, m.max_timestamp_ms, m.event_timestamp_ms,
                         m.broker_id, m.segment_size_bytes, m.entry_count, len(name)),
        name,
        _COUNT.pack(len(m.leader_epochs)),
        *(_EPOCH.pack(e.epoch, e.start_offset) for e in m.leader_epochs),
        _COUNT.pack(len(m.data_object_lengths)),
        *(_OBJECT_LENGTH.pack(n) for n in m.data_object_lengths),
        _COUNT.pack(len(m.sections)),
        *(_SECTION.pack(int(s.index_type), s.object_number, s.position, s.length, s.crc32c) for s in m.sections),
        _COUNT.pack(len(ledger.blocks)),
        *(_BLOCK_META.pack(b.object_number, b.block_length, b.entry_count, b.first_offset, b.last_offset,
                           b.max_timestamp_ms, b.log_position, b.log_bytes)
          + (_BLOCK_FRAGMENT.pack(b.fragment_number, b.fragment_count) if fragments else b"")
          for b in ledger.blocks),
    ]
    return b"".join(parts)


def encode_index(index: IndexObject) -> bytes:
    """Encode an index object (small: about 70 bytes per block plus the metadata)."""
    body = bytearray()
    for ledger in index.ledgers:
        meta = _encode_metadata(ledger)
        body += _LEDGER_HEADER.pack(ledger.ledger_id, len(ledger.blocks), len(meta))
        body += meta
        for b in ledger.blocks:
            body += _BLOCK_INDEX.pack(b.first_entry_id, b.part_id, b.object_position)
    total = _HEADER.size + len(body) + _CRC.size
    out = bytearray(_HEADER.pack(INDEX_MAGIC, total, index.data_object_length, index.data_header_length))
    out += body
    out += _CRC.pack(google_crc32c.value(bytes(out)))
    return bytes(out)


class _Cursor:
    """Bounds-checked reads from the index bytes; every failure names the key and byte position."""

    __slots__ = ("buf", "key", "pos", "end")

    def __init__(self, buf: memoryview, key: str, pos: int, end: int) -> None:
        self.buf, self.key, self.pos, self.end = buf, key, pos, end

    def take(self, st: struct.Struct, what: str) -> tuple:
        if self.pos + st.size > self.end:
            raise CorruptRemoteObjectError(
                f"truncated index {what}: expected {st.size} bytes, found {self.end - self.pos}", key=self.key,
                position=self.pos)
        v = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return v

    def raw(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > self.end:
            raise CorruptRemoteObjectError(
                f"truncated index {what}: expected {n} bytes, found {self.end - self.pos}", key=self.key,
                position=self.pos)
        v = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return v

    def count(self, what: str) -> int:
        (n,) = self.take(_COUNT, what + " count")
        if n < 0:
            raise CorruptRemoteObjectError(f"negative {what} count {n}", key=self.key, position=self.pos - 4)
        return n


def _decode_ledger(c: _Cursor, index_entry_count: int, ledger_id: int,
                   block_indices: Sequence[tuple[int, int, int]], meta_start: int) -> LedgerIndex:
    (version, seg_id, topic_id, partition, start, end, max_ts, event_ts, broker, size, entries,
     name_len) = c.take(_META_FIXED, "ledger metadata")
    if version not in (LEDGER_METADATA_VERSION, FRAGMENTS_METADATA_VERSION):
        raise CorruptRemoteObjectError(f"unknown ledger metadata version {version}", key=c.key,
                                       position=meta_start)
    try:
        name = c.raw(name_len, "topic name").decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorruptRemoteObjectError(f"topic name is not utf-8: {err}", key=c.key, position=c.pos) from err
    epochs = tuple(EpochEntry(*c.take(_EPOCH, "leader epoch")) for _ in range(c.count("leader epoch")))
    objects = tuple(c.take(_OBJECT_LENGTH, "data object length")[0] for _ in range(c.count("data object")))
    sections = []
    for _ in range(c.count("section")):
        t, obj, pos, length, crc = c.take(_SECTION, "section")
        try:
            kind = IndexType(t)
        except ValueError as err:
            raise CorruptRemoteObjectError(f"unknown index type {t}", key=c.key, position=c.pos - _SECTION.size) \
                from err
        sections.append(IndexSection(kind, obj, pos, length, crc))
    n_blocks = c.count("block")
    if n_blocks != index_entry_count:
        raise CorruptRemoteObjectError(
            f"ledger {ledger_id}: {n_blocks} block metadata records but index_entry_count {index_entry_count}",
            key=c.key, position=c.pos - 4)
    blocks = []
    next_entry = 0
    for i in range(n_blocks):
        obj, blen, ecount, first, last, bmax, lpos, lbytes = c.take(_BLOCK_META, "block metadata")
        frag, frags = (c.take(_BLOCK_FRAGMENT, "block fragment fields") if version == FRAGMENTS_METADATA_VERSION
                       else (0, 0))
        entry_id, part_id, offset = block_indices[i]
        if part_id != i or entry_id != next_entry:
            raise CorruptRemoteObjectError(
                f"ledger {ledger_id}: block {i} has part_id {part_id} and first entry {entry_id}, expected {i} and "
                f"{next_entry}", key=c.key, position=c.pos - _BLOCK_META.size)
        prev = blocks[-1] if blocks else None
        expected = (prev.fragment_number + 1 if prev is not None and prev.fragment_number + 1 < prev.fragment_count
                    else 0)
        if frag != expected or (frags > 0) != (ecount == 1 and frags > 0) or (frags == 1) or (
                frag and (frags != prev.fragment_count or (first, last) != (prev.first_offset, prev.last_offset))):
            raise CorruptRemoteObjectError(
                f"ledger {ledger_id}: block {i} is fragment {frag} of {frags} ({ecount} entries, offsets {first}.."
                f"{last}); expected fragment {expected} after the block before it", key=c.key,
                position=c.pos - _BLOCK_FRAGMENT.size)
        # the fragments of one batch share its entry id: the next entry starts after the last of them
        next_entry = entry_id + (ecount if frag + 1 >= frags else 0)
        blocks.append(BlockInfo(entry_id, part_id, obj, offset, blen, ecount, first, last, bmax, lpos, lbytes, frag,
                                frags))
    if blocks and blocks[-1].fragment_number + 1 < blocks[-1].fragment_count:
        raise CorruptRemoteObjectError(
            f"ledger {ledger_id}: the last block is fragment {blocks[-1].fragment_number} of "
            f"{blocks[-1].fragment_count}", key=c.key, position=c.pos)
    meta = LedgerMetadata(uuid.UUID(bytes=seg_id), uuid.UUID(bytes=topic_id), name, partition, start, end, max_ts,
                          event_ts, broker, size, entries, epochs, objects, tuple(sections))
    return LedgerIndex(ledger_id, meta, tuple(blocks))


def decode_index(data: bytes | memoryview, *, key: str) -> IndexObject:
    """Decode and check an index object (magic, lengths, CRC-32C)."""
    buf = memoryview(data)
    if len(buf) < _HEADER.size + _CRC.size:
        raise CorruptRemoteObjectError(
            f"truncated index object: expected at least {_HEADER.size + _CRC.size} bytes, found {len(buf)}",
            key=key, position=0)
    magic, index_len, data_len, header_len = _HEADER.unpack_from(buf, 0)
    if magic != INDEX_MAGIC:
        raise CorruptRemoteObjectError(f"bad index magic 0x{magic:08X}, expected 0x{INDEX_MAGIC:08X}", key=key,
                                       position=0)
    if index_len != len(buf):
        raise CorruptRemoteObjectError(f"index_len {index_len} but the object has {len(buf)} bytes", key=key,
                                       position=4)
    crc_pos = len(buf) - _CRC.size
    (stored,) = _CRC.unpack_from(buf, crc_pos)
    actual = google_crc32c.value(bytes(buf[:crc_pos]))
    if stored != actual:
        raise CorruptRemoteObjectError(f"index CRC-32C 0x{actual:08X} does not match stored 0x{stored:08X}",
                                       key=key, position=crc_pos)
    c = _Cursor(buf, key, _HEADER.size, crc_pos)
    ledgers = []
    while c.pos < crc_pos:
        ledger_id, count, meta_len = c.take(_LEDGER_HEADER, "ledger header")
        meta_start = c.pos
        if meta_len < 0 or meta_start + meta_len + count * _BLOCK_INDEX.size > crc_pos:
            raise CorruptRemoteObjectError(f"ledger {ledger_id}: metadata length {meta_len} / {count} blocks "
                                           "run past the index end", key=key, position=meta_start - 4)
        c2 = _Cursor(buf, key, meta_start + meta_len, crc_pos)
        block_indices = [c2.take(_BLOCK_INDEX, "block index") for _ in range(count)]
        meta_cursor = _Cursor(buf, key, meta_start, meta_start + meta_len)
        ledgers.append(_decode_ledger(meta_cursor, count, ledger_id, block_indices, meta_start))
        c.pos = c2.pos
    return IndexObject(data_len, header_len, tuple(ledgers))
