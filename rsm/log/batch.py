"""Record batches (magic v2) in a segment's ``.log`` file: header-level streaming scan with CRC-32C check.

Mirrors Kafka's ``org.apache.kafka.common.record.DefaultRecordBatch``
(https://github.com/apache/kafka/blob/trunk/clients/src/main/java/org/apache/kafka/common/record/DefaultRecordBatch.java).
A ``.log`` file is record batches back to back; all integers big-endian::

    RecordBatch =>
      BaseOffset => Int64
      BatchLength => Int32            bytes after this field (the whole batch is 12 + BatchLength bytes)
      PartitionLeaderEpoch => Int32
      Magic => Int8                   = 2
      CRC => Uint32                   CRC-32C of Attributes .. end of batch (not of the fields above it)
      Attributes => Int16             bits 0-2 codec, bit 3 timestamp type, bit 4 transactional, bit 5 control
      LastOffsetDelta => Int32
      BaseTimestamp => Int64
      MaxTimestamp => Int64
      ProducerId => Int64
      ProducerEpoch => Int16
      BaseSequence => Int32
      RecordCount => Int32
      Records => [Record]             compressed as one block when codec != none (see records.py)

Scanning streams the file through one reusable read buffer (``preadv`` at the scan's own position, never the
file's offset: a segment held open for a copy in place is scanned on a descriptor others may read too,
:mod:`rsm.log.held`): the file is never loaded whole;
a batch larger than the buffer is checked chunk by chunk (``scan_batches``) or read into its own buffer
(``iter_batches_with_bytes``, one batch in memory at a time).

Zero-filled tail: Kafka only preallocates ``.log`` files with ``file.preallocate=true``, and trims them when
the segment rolls. By default a zero header where a batch should start is an error (a rolled segment that ends
in zeros has lost data); pass ``zero_tail_ok=True`` for an active segment of a broker with
``file.preallocate=true``: then a run of zero bytes that reaches EOF ends the scan cleanly, and zeros followed
by anything else are still an error.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from enum import IntEnum, IntFlag
from typing import BinaryIO

from rsm.log._crc32c import buffer_address, crc32c_at
from rsm.log._fastinit import fast_constructor
from rsm.log.errors import CorruptRecordBatchError
from rsm.log.held import open_read

__all__ = [
    "ATTRIBUTES_OFFSET",
    "BATCH_HEADER_SIZE",
    "BATCH_LENGTH_OFFSET",
    "CHUNK_BYTES",
    "CRC_OFFSET",
    "BatchAttributes",
    "BatchHeader",
    "Codec",
    "RecordParts",
    "TimestampType",
    "batch_crc",
    "header_from_bytes",
    "iter_batches_with_bytes",
    "scan_batches",
]

HEADER = struct.Struct(
    ">"
    "q"  # base_offset: Int64
    "i"  # batch_length: Int32, bytes after this field
    "i"  # partition_leader_epoch: Int32
    "b"  # magic: Int8
    "I"  # crc: Uint32, CRC-32C from attributes to the end of the batch
    "h"  # attributes: Int16
    "i"  # last_offset_delta: Int32
    "q"  # base_timestamp: Int64
    "q"  # max_timestamp: Int64
    "q"  # producer_id: Int64
    "h"  # producer_epoch: Int16
    "i"  # base_sequence: Int32
    "i"  # record_count: Int32
)
BATCH_HEADER_SIZE = HEADER.size  # 61
BATCH_LENGTH_OFFSET = struct.calcsize(">q")  # 8: BaseOffset is the first field
LOG_OVERHEAD = struct.calcsize(">qi")  # 12: BaseOffset + BatchLength, not counted in BatchLength
MAGIC_OFFSET = struct.calcsize(">qii")  # 16
CRC_OFFSET = MAGIC_OFFSET + struct.calcsize(">b")  # 17
ATTRIBUTES_OFFSET = CRC_OFFSET + struct.calcsize(">I")  # 21: the CRC covers bytes from here to the end
MIN_BATCH_LENGTH = BATCH_HEADER_SIZE - LOG_OVERHEAD  # 49: an empty batch
CURRENT_MAGIC = 2
CHUNK_BYTES = 1024 * 1024  # read buffer; a batch up to this size is checked without another copy


class Codec(IntEnum):
    """Compression codec of a batch (attributes bits 0-2)."""

    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


class TimestampType(IntEnum):
    """Attributes bit 3: whose clock set the record timestamps."""

    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class BatchAttributes(IntFlag):
    """The flag bits of a batch's attributes (the codec is bits 0-2, see :class:`Codec`)."""

    CODEC_MASK = 0x07
    LOG_APPEND_TIME = 0x08
    TRANSACTIONAL = 0x10
    CONTROL = 0x20
    DELETE_HORIZON = 0x40


# Plain ints for the hot loop (IntFlag arithmetic costs microseconds per batch).
_CODEC_MASK = int(BatchAttributes.CODEC_MASK)
_MAX_CODEC = int(Codec.ZSTD)
_LOG_APPEND_TIME = int(BatchAttributes.LOG_APPEND_TIME)
_TRANSACTIONAL = int(BatchAttributes.TRANSACTIONAL)
_CONTROL = int(BatchAttributes.CONTROL)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The header of one record batch and where it sits in its ``.log`` file. Offsets are inclusive."""

    position: int  # byte position of the batch in the .log file
    base_offset: int
    last_offset: int  # base_offset + lastOffsetDelta (inclusive)
    size_bytes: int  # whole batch incl. the 12-byte baseOffset+batchLength prefix
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    # The flags are read with plain ints: with the IntFlag members each test cost ~9 us (bench_tier_read's
    # profile: is_control, asked of every batch a Fetch reads, was 4% of the tier read's CPU).
    @property
    def codec(self) -> Codec:
        return Codec(self.attributes & _CODEC_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType.LOG_APPEND_TIME if self.attributes & _LOG_APPEND_TIME else TimestampType.CREATE_TIME

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL)

    @property
    def next_offset(self) -> int:
        """The offset after this batch (``last_offset + 1``)."""
        return self.last_offset + 1

    @property
    def end_position(self) -> int:
        """Byte position just after this batch (where the next one starts)."""
        return self.position + self.size_bytes


_make_header = fast_constructor(BatchHeader)


def scan_batches(path: str | os.PathLike[str], *, start_position: int = 0, verify_crc: bool = True,
                 zero_tail_ok: bool = False) -> Iterator[BatchHeader]:
    """Yield the header of every batch of a ``.log`` file from ``start_position`` (a batch boundary) to EOF.

    Streams the file through a :data:`CHUNK_BYTES` buffer (smaller when less is left to scan). Raises
    :class:`CorruptRecordBatchError` (naming the file and byte position) on a bad magic, impossible length, codec or
    offsets, a CRC-32C mismatch (when ``verify_crc``), or a batch cut short by EOF. Headers already yielded were
    valid; the error comes when the scan reaches the bad batch. See the module docstring for ``zero_tail_ok``.
    """
    for header, _ in _scan(path, start_position, verify_crc, False, zero_tail_ok):
        yield header


def iter_batches_with_bytes(path: str | os.PathLike[str], *, start_position: int = 0, verify_crc: bool = True,
                            zero_tail_ok: bool = False) -> Iterator[tuple[BatchHeader, memoryview]]:
    """Like :func:`scan_batches`, also yielding each batch's verbatim bytes (12-byte prefix included).

    Each memoryview is read-only and over a private copy, so it stays valid after the iterator moves on; only
    one batch's bytes are held by the iterator at a time.
    """
    return _scan(path, start_position, verify_crc, True, zero_tail_ok)  # type: ignore[return-value]


def _scan(path: str | os.PathLike[str], start_position: int, verify_crc: bool, with_bytes: bool,
          zero_tail_ok: bool) -> Iterator[tuple[BatchHeader, memoryview | None]]:
    if start_position < 0:
        raise ValueError(f"start_position must be >= 0, got {start_position}")
    unpack_header = HEADER.unpack_from
    with open_read(path) as f:  # (a held descriptor wrapped, not opened again: rsm.log.held)
        file_size = os.fstat(f.fileno()).st_size
        if start_position > file_size:
            raise CorruptRecordBatchError(path, start_position,
                                          f"start position is beyond the end of the file ({file_size} bytes)")
        # no larger than what is left to scan: a 64 KiB segment's scan zero-filled a 1 MiB buffer, half its CPU
        # (~100 -> ~50 us a scan, the copy's CRC scan of each segment; issue 26)
        chunk = max(1, min(CHUNK_BYTES, file_size - start_position))
        buf = bytearray(chunk)
        view = memoryview(buf)
        address = buffer_address(buf)
        buf_pos = start_position  # file position of buf[0]
        buf_len = 0  # valid bytes in buf; the next read is at buf_pos + buf_len
        pos = start_position
        prev_last = -1
        while pos < file_size:
            off = pos - buf_pos
            remaining = file_size - pos
            if buf_len - off < min(BATCH_HEADER_SIZE, remaining):
                buf_pos, buf_len = _refill(f, path, view, buf_pos, buf_len, off, file_size)
                off = 0
            if remaining < BATCH_HEADER_SIZE:
                if zero_tail_ok and not view[off:off + remaining].tobytes().strip(b"\0"):
                    return
                raise CorruptRecordBatchError(
                    path, pos, f"truncated batch header: expected {BATCH_HEADER_SIZE} bytes, found {remaining} "
                    "before the end of the file")
            (base_offset, batch_length, leader_epoch, magic, crc, attributes, last_delta, base_ts, max_ts,
             producer_id, producer_epoch, base_seq, record_count) = unpack_header(buf, off)
            if batch_length == 0 and base_offset == 0 and magic == 0:
                if zero_tail_ok:
                    _check_zero_tail(f, path, view, off, buf_len, pos, file_size)
                    return
                raise CorruptRecordBatchError(
                    path, pos, "zero bytes where a batch header was expected (a preallocated tail of an active "
                    "segment? scan it with zero_tail_ok=True)")
            if magic != CURRENT_MAGIC:
                raise CorruptRecordBatchError(path, pos, f"unsupported magic: expected {CURRENT_MAGIC}, found {magic}")
            if batch_length < MIN_BATCH_LENGTH:
                raise CorruptRecordBatchError(
                    path, pos, f"batch length {batch_length} is below the minimum {MIN_BATCH_LENGTH}")
            size = LOG_OVERHEAD + batch_length
            if size > remaining:
                raise CorruptRecordBatchError(
                    path, pos, f"truncated batch: expected {size} bytes (batch length {batch_length}), found "
                    f"{remaining} before the end of the file")
            if attributes & _CODEC_MASK > _MAX_CODEC:
                raise CorruptRecordBatchError(
                    path, pos, f"unknown compression codec {attributes & _CODEC_MASK} in attributes "
                    f"0x{attributes & 0xFFFF:04x}")
            if base_offset < 0 or last_delta < 0 or record_count < 0 or record_count > last_delta + 1:
                raise CorruptRecordBatchError(
                    path, pos, f"impossible offsets: base offset {base_offset}, last offset delta {last_delta}, "
                    f"record count {record_count}")
            if base_offset <= prev_last:
                raise CorruptRecordBatchError(
                    path, pos, f"offsets go backwards: batch base offset {base_offset} after a batch ending at "
                    f"offset {prev_last}")
            header = _make_header(pos, base_offset, base_offset + last_delta, size, leader_epoch, magic, crc,
                                 attributes, base_ts, max_ts, producer_id, producer_epoch, base_seq, record_count)
            data: memoryview | None = None
            if size <= chunk:
                if off + size > buf_len:
                    buf_pos, buf_len = _refill(f, path, view, buf_pos, buf_len, off, file_size)
                    off = 0
                if verify_crc:
                    computed = crc32c_at(buf, address, off + ATTRIBUTES_OFFSET, size - ATTRIBUTES_OFFSET)
                    if computed != crc:
                        raise _crc_error(path, pos, crc, computed)
                if with_bytes:
                    data = memoryview(bytes(view[off:off + size]))
            else:
                # A batch larger than the read buffer: its own buffer (with_bytes), else chunk by chunk.
                have = buf_len - off
                if with_bytes:
                    big = bytearray(size)
                    big[:have] = view[off:buf_len]
                    _read_exactly(f, path, memoryview(big)[have:], pos + have, file_size)
                    if verify_crc:
                        computed = crc32c_at(big, buffer_address(big), ATTRIBUTES_OFFSET, size - ATTRIBUTES_OFFSET)
                        if computed != crc:
                            raise _crc_error(path, pos, crc, computed)
                    data = memoryview(big).toreadonly()
                elif verify_crc:
                    computed = crc32c_at(buf, address, off + ATTRIBUTES_OFFSET, have - ATTRIBUTES_OFFSET)
                    left = size - have
                    while left:
                        n = _read_exactly(f, path, view[:min(left, chunk)], pos + size - left, file_size)
                        computed = crc32c_at(buf, address, 0, n, computed)
                        left -= n
                    if computed != crc:
                        raise _crc_error(path, pos, crc, computed)
                buf_pos, buf_len = pos + size, 0  # the next read starts past this batch
            yield header, data
            prev_last = base_offset + last_delta
            pos += size


def _crc_error(path: str | os.PathLike[str], pos: int, stored: int, computed: int) -> CorruptRecordBatchError:
    return CorruptRecordBatchError(
        path, pos, f"CRC-32C mismatch: header says 0x{stored:08x}, bytes {pos + ATTRIBUTES_OFFSET}.. compute "
        f"0x{computed:08x}")


def _read_exactly(f: BinaryIO, path: str | os.PathLike[str], into: memoryview, file_pos: int,
                  file_size: int) -> int:
    """Fill ``into`` from the file at ``file_pos`` (``preadv``: the file's offset neither read nor moved); a short
    file is a truncation error."""
    fd = f.fileno()
    done = 0
    while done < len(into):
        n = os.preadv(fd, [into[done:]], file_pos + done)
        if not n:
            raise CorruptRecordBatchError(
                path, file_pos + done, f"file ended while reading: expected {len(into) - done} more bytes (the "
                f"file was {file_size} bytes when the scan began; was it truncated meanwhile?)")
        done += n
    return done


def _refill(f: BinaryIO, path: str | os.PathLike[str], view: memoryview, buf_pos: int, buf_len: int, off: int,
            file_size: int) -> tuple[int, int]:
    """Move the unread bytes ``view[off:buf_len]`` to the front and fill the buffer up (or to EOF)."""
    keep = buf_len - off
    if keep:
        view[:keep] = view[off:buf_len]
    new_pos = buf_pos + off
    end = min(len(view), file_size - new_pos)
    if end > keep:
        _read_exactly(f, path, view[keep:end], new_pos + keep, file_size)
    return new_pos, max(end, keep)


def _check_zero_tail(f: BinaryIO, path: str | os.PathLike[str], view: memoryview, off: int, buf_len: int, pos: int,
                     file_size: int) -> None:
    """Everything from ``pos`` to EOF must be zero bytes, else the zeros hide data: an error."""
    start, end, file_pos = off, buf_len, pos
    while True:
        chunk = view[start:end].tobytes()
        rest = chunk.lstrip(b"\0")
        if rest:
            nz = len(chunk) - len(rest)
            raise CorruptRecordBatchError(
                path, file_pos + nz, f"non-zero byte 0x{rest[0]:02x} after a zero-filled tail that began at "
                f"byte {pos}")
        file_pos += end - start
        if file_pos >= file_size:
            return
        n = min(len(view), file_size - file_pos)
        _read_exactly(f, path, view[:n], file_pos, file_size)
        start, end = 0, n


def header_from_bytes(data: bytes | memoryview, position: int = 0,
                      path: str | os.PathLike[str] = "<batch bytes>", *, size: int | None = None) -> BatchHeader:
    """The header of the batch whose verbatim bytes are ``data`` (e.g. a remote entry), found at ``position``;
    with ``size``, ``data`` is only the batch's start (a large batch's first fragment) and ``size`` its length.

    Checks what the scan checks short of the CRC: magic, length against ``len(data)``, offsets. Raises
    :class:`CorruptRecordBatchError` naming ``path`` and ``position``.
    """
    if len(data) < BATCH_HEADER_SIZE:
        raise CorruptRecordBatchError(path, position, f"expected at least {BATCH_HEADER_SIZE} header bytes, "
                                      f"found {len(data)}")
    (base, length, epoch, magic, crc, attrs, last_delta, base_ts, max_ts, pid, pepoch, bseq,
     count) = HEADER.unpack_from(data, 0)
    if magic != CURRENT_MAGIC:
        raise CorruptRecordBatchError(path, position, f"expected magic {CURRENT_MAGIC}, found {magic}")
    total = len(data) if size is None else size
    if length + LOG_OVERHEAD != total or length < MIN_BATCH_LENGTH:
        raise CorruptRecordBatchError(path, position, f"batch length {length} + {LOG_OVERHEAD} does not match "
                                      f"the {total} bytes given")
    if attrs & _CODEC_MASK > _MAX_CODEC:
        raise CorruptRecordBatchError(path, position, f"unknown compression codec {attrs & _CODEC_MASK} in "
                                      f"attributes 0x{attrs & 0xFFFF:04x}")
    if base < 0 or last_delta < 0 or count < 0 or count > last_delta + 1:
        raise CorruptRecordBatchError(path, position, f"impossible offsets: base offset {base}, last offset delta "
                                      f"{last_delta}, record count {count}")
    return _make_header(position, base, base + last_delta, total, epoch, magic, crc, attrs, base_ts, max_ts,
                       pid, pepoch, bseq, count)


def batch_crc(data: bytearray) -> int:
    """The CRC-32C a batch's header must carry: over its bytes from Attributes to the end (``data`` is the
    whole batch, 12-byte prefix included). Compare with :attr:`BatchHeader.crc`."""
    return crc32c_at(data, buffer_address(data), ATTRIBUTES_OFFSET, len(data) - ATTRIBUTES_OFFSET)


class RecordParts:
    """Whole record batches, in offset order, as the buffers they were read into: a Fetch answer's records from the
    tier (:meth:`rlm.tier.TierView.fetch`) without joining them into one buffer (the join was a copy of every byte
    served, into fresh memory: ~38 us per MiB on one thread, bench_tier_read --breakdown; 8 partitions read on
    threads, bench_tier_read 0.56-0.85 -> 0.29-0.35 CPU s/GiB; issue 24). ``len()`` is the bytes
    in all, ``bytes()`` the batches joined (for those who need one buffer: kio's encoder, tests); ``last_offset``
    the last batch's last offset.

    The contract with whoever writes them (:func:`rlm.listener.protocol.codec.fetch_response_parts`, the listener's
    socket writes): a part is a view of a block buffer the reader may use again for another block, but only once
    nothing refers to that buffer any more (:mod:`rsm.format.blockcache`, :mod:`rsm.format.reader` check the
    buffer's reference count; a live view counts). So a part's bytes never change while the part, or any view of
    it, is held; a writer that keeps what the socket did not take must keep the views (or copy them), never a raw
    address. Parts are read-only to everyone."""

    __slots__ = ("last_offset", "parts", "size")

    def __init__(self, parts: list[memoryview], size: int, last_offset: int) -> None:
        self.parts = parts
        self.size = size  # sum of the parts' lengths
        self.last_offset = last_offset

    def __len__(self) -> int:
        return self.size

    def __bytes__(self) -> bytes:
        return b"".join(self.parts)

    def __repr__(self) -> str:
        return f"RecordParts({len(self.parts)} parts, {self.size} bytes, last offset {self.last_offset})"
