"""The records inside a record batch (every codec), and control records (transaction markers).

Mirrors Kafka's ``DefaultRecord`` and ``ControlRecordType``
(https://github.com/apache/kafka/blob/trunk/clients/src/main/java/org/apache/kafka/common/record/DefaultRecord.java).
After the 61-byte batch header (batch.py) come ``RecordCount`` records, compressed as one block unless the codec
is none; varints are zigzag-encoded::

    Record =>
      Length => Varint                 bytes after this field
      Attributes => Int8               unused
      TimestampDelta => Varlong        from BaseTimestamp (ignored for LOG_APPEND_TIME: MaxTimestamp)
      OffsetDelta => Varint            from BaseOffset
      Key => Bytes                     Varint length, -1 = null
      Value => Bytes                   Varint length, -1 = null (a tombstone)
      Headers => [Header]              Varint count
        HeaderKey => String            Varint length, UTF-8
        HeaderValue => Bytes           Varint length, -1 = null

    ControlRecordKey (the key of the single record of a control batch) =>
      Version => Int16                 = 0
      Type => Int16                    0 = ABORT, 1 = COMMIT

Decoding uses aiokafka's compiled record codec (``aiokafka.record._crecords.default_records``: Cython, codecs via
cramjam), which decodes the broker's batches for all five codecs at a few million records/s. Its errors (and
the codecs') are wrapped into :class:`CorruptRecordBatchError` naming ``path`` (the .log file, if the caller
passes it) and the batch's position in it.
:func:`iter_raw_records` hands out aiokafka's own record objects (no copy into our dataclass) for hot paths;
:func:`decode_records` returns frozen :class:`Record` values.

A batch too large to hold (stored as fragments, read as :class:`rsm.api.LargeBatch` chunks; PDP-43) is decoded
from its chunks by :func:`iter_streamed_records` when uncompressed: each record's key and headers are bytes, a
value over ``inline_bytes`` is handed out in chunks (:class:`StreamedRecord`), never held whole.
"""

from __future__ import annotations

import gc
import os
import struct
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

import cramjam

try:
    from aiokafka.record._crecords.default_records import DefaultRecordBatch as _DecodeBatch
except ImportError:  # pragma: no cover - the wheel ships the extension; pure Python is ~10x slower
    from aiokafka.record.default_records import _DefaultRecordBatchPy as _DecodeBatch  # type: ignore[assignment]

from rsm.log._fastinit import fast_constructor
from rsm.log.batch import HEADER, BatchHeader
from rsm.log.errors import CorruptRecordBatchError

__all__ = [
    "CONTROL_KEY",
    "ControlType",
    "Record",
    "RecordView",
    "StreamedRecord",
    "control_type",
    "decode_records",
    "iter_raw_records",
    "iter_streamed_records",
]

CONTROL_KEY = struct.Struct(
    ">"
    "h"  # version: Int16, = 0
    "h"  # type: Int16, ControlType
)

# What the codec library and the decompressors raise on malformed input. RuntimeError covers aiokafka's
# KafkaError (CorruptRecordException, UnsupportedCodecError); ValueError covers UnicodeDecodeError of header keys.
_DECODE_ERRORS = (RuntimeError, ValueError, IndexError, KeyError, SystemError, OSError, EOFError, OverflowError,
                  MemoryError, TypeError, struct.error, zlib.error, cramjam.DecompressionError)
_EMPTY: tuple = ()


class ControlType(IntEnum):
    """The type of a control record: the transaction marker written when a transaction ends."""

    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record. ``timestamp`` is in ms (the batch's MaxTimestamp under LOG_APPEND_TIME)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]


_make_record = fast_constructor(Record)


class RecordView(Protocol):
    """What :func:`iter_raw_records` yields (aiokafka's record objects): read-only attributes like Record's,
    ``headers`` a list."""

    @property
    def offset(self) -> int: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> list[tuple[str, bytes | None]]: ...


def _check_bytes(batch: BatchHeader, data: bytes | memoryview, path: str | os.PathLike[str]) -> None:
    if len(data) != batch.size_bytes:
        raise CorruptRecordBatchError(
            path, batch.position, f"expected {batch.size_bytes} bytes for the batch at offset "
            f"{batch.base_offset}, got {len(data)}")
    if len(data) < HEADER.size or HEADER.unpack_from(data, 0)[0] != batch.base_offset:
        raise CorruptRecordBatchError(
            path, batch.position, f"these bytes are not the batch with base offset {batch.base_offset}")


@contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Python's cyclic collector off for the block (back on after, if it was on). Decoding allocates a few objects
    per record and none form cycles: a collection every 700 allocations would cost more than the decode."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def iter_raw_records(batch: BatchHeader, data: bytes | memoryview, *,
                     path: str | os.PathLike[str] = "<batch bytes>") -> Iterator[RecordView]:
    """Decode the records of one batch (``data``: its verbatim bytes, e.g. from ``iter_batches_with_bytes``),
    returning an iterator of aiokafka's record objects. Raises :class:`CorruptRecordBatchError` (at the call, not
    during iteration) if they do not decode, if their count is not the header's, or the first/last offset lies
    outside the batch. The CRC is not checked here (the scan does).
    """
    _check_bytes(batch, data, path)
    try:
        with cyclic_gc_paused():
            records = list(_DecodeBatch(data))  # the codec stops at the header's RecordCount
    except _DECODE_ERRORS as err:
        raise CorruptRecordBatchError(
            path, batch.position, f"records of the batch at offset {batch.base_offset} do not decode "
            f"({batch.codec.name.lower()}): {type(err).__name__}: {err}") from err
    if len(records) != batch.record_count:
        raise CorruptRecordBatchError(
            path, batch.position, f"expected {batch.record_count} records, decoded {len(records)}")
    # Offsets ascend inside a batch (the broker validates them on append; the CRC protects them after): checking
    # the first and last keeps this O(1) in Python.
    if records and (records[0].offset < batch.base_offset or records[-1].offset > batch.last_offset
                    or records[0].offset > records[-1].offset):
        raise CorruptRecordBatchError(
            path, batch.position, f"record offsets {records[0].offset}..{records[-1].offset} lie outside the "
            f"batch's offsets {batch.base_offset}..{batch.last_offset}")
    return iter(records)


def decode_records(batch: BatchHeader, data: bytes | memoryview, *,
                   path: str | os.PathLike[str] = "<batch bytes>") -> list[Record]:
    """Decode every record of one batch into :class:`Record` values (see :func:`iter_raw_records`)."""
    empty = _EMPTY
    make = _make_record
    with cyclic_gc_paused():
        return [make(r.offset, r.timestamp, r.key, r.value, tuple(r.headers) if r.headers else empty)
                for r in iter_raw_records(batch, data, path=path)]


def control_type(batch: BatchHeader, data: bytes | memoryview, *,
                 path: str | os.PathLike[str] = "<batch bytes>") -> ControlType:
    """The marker type (ABORT/COMMIT) of a control batch. Raises :class:`CorruptRecordBatchError` if ``batch``
    is not a control batch or its control record key is malformed."""
    if not batch.is_control:
        raise CorruptRecordBatchError(path, batch.position,
                                      f"the batch at offset {batch.base_offset} is not a control batch")
    records = decode_records(batch, data, path=path)
    key = records[0].key if records else None
    if key is None or len(key) < CONTROL_KEY.size:
        raise CorruptRecordBatchError(
            path, batch.position, f"control record key: expected {CONTROL_KEY.size} bytes, found "
            f"{0 if key is None else len(key)}")
    version, kind = CONTROL_KEY.unpack_from(key, 0)
    if version != 0 or kind not in (ControlType.ABORT, ControlType.COMMIT):
        raise CorruptRecordBatchError(
            path, batch.position, f"control record key: expected version 0 and type 0/1, found version "
            f"{version} type {kind}")
    return ControlType(kind)


# -- records of a batch read in chunks (uncompressed) -------------------------------------------------------------

INLINE_VALUE_BYTES = 1 << 20
"""Values up to this size are bytes in a :class:`StreamedRecord`; larger ones are handed out in chunks."""


class _Chunked:
    """Sequential reads over an iterator of byte chunks; ``consumed`` counts the bytes taken."""

    __slots__ = ("_chunks", "_cur", "_fail", "consumed")

    def __init__(self, chunks: Iterator[memoryview], fail) -> None:  # type: ignore[no-untyped-def]
        self._chunks = chunks
        self._cur = memoryview(b"")
        self._fail = fail
        self.consumed = 0

    def _more(self) -> bool:
        while not self._cur:
            nxt = next(self._chunks, None)
            if nxt is None:
                return False
            self._cur = memoryview(nxt).cast("B")
        return True

    def at_end(self) -> bool:
        return not self._more()

    def byte(self) -> int:
        if not self._more():
            raise self._fail("the batch ends inside a record")
        b = self._cur[0]
        self._cur = self._cur[1:]
        self.consumed += 1
        return b

    def varint(self) -> int:
        """A zigzag varint (Kafka's Varint / Varlong)."""
        shift = raw = 0
        while True:
            b = self.byte()
            raw |= (b & 0x7F) << shift
            if not b & 0x80:
                return (raw >> 1) ^ -(raw & 1)
            shift += 7
            if shift > 63:
                raise self._fail("a varint longer than 10 bytes")

    def take(self, n: int) -> bytes:
        return b"".join(bytes(c) for c in self.pieces(n))

    def pieces(self, n: int) -> Iterator[memoryview]:
        """The next ``n`` bytes, as views of the chunks (valid until the next read)."""
        while n > 0:
            if not self._more():
                raise self._fail(f"the batch ends {n} bytes before the end of a field")
            k = min(n, len(self._cur))
            piece, self._cur = self._cur[:k], self._cur[k:]
            self.consumed += k
            n -= k
            yield piece


class StreamedRecord:
    """A record of a batch read in chunks (:func:`iter_streamed_records`). ``value`` is the value's bytes (None: a
    tombstone) unless it is over the inline size: then ``value`` is None, ``value_size`` its length and
    :meth:`value_chunks` its bytes, once, before the next record. :meth:`headers` come after the value in the
    batch: asking for them reads past what of the value was not taken."""

    __slots__ = ("_headers", "_rest", "_src", "_value_left", "key", "offset", "timestamp", "value", "value_size")

    def __init__(self, offset: int, timestamp: int, key: bytes | None, value: bytes | None, value_size: int,
                 src: _Chunked | None, rest) -> None:  # type: ignore[no-untyped-def]
        self.offset = offset
        self.timestamp = timestamp
        self.key = key
        self.value = value
        self.value_size = value_size
        self._src = src
        self._value_left = value_size if src is not None else 0
        self._rest = rest
        self._headers: list[tuple[str, bytes | None]] | None = None

    @property
    def streamed(self) -> bool:
        """Whether the value is handed out in chunks (:meth:`value_chunks`) rather than as ``value``."""
        return self._src is not None

    def value_chunks(self) -> Iterator[memoryview]:
        """The value's bytes in chunks (views valid until the next is asked for); once."""
        if self._src is None:
            if self.value is not None:
                yield memoryview(self.value)
            return
        src, self._src = self._src, None
        for piece in src.pieces(self._value_left):
            self._value_left -= len(piece)
            yield piece

    def headers(self) -> list[tuple[str, bytes | None]]:
        """The record's headers (read after the rest of the value, which is skipped if not taken)."""
        if self._headers is None:
            for _ in self.value_chunks():
                pass
            self._headers = self._rest()
        return self._headers


def iter_streamed_records(batch: BatchHeader, chunks: Iterator[memoryview], *,
                          path: str | os.PathLike[str] = "<batch bytes>",
                          inline_bytes: int = INLINE_VALUE_BYTES) -> Iterator[StreamedRecord]:
    """The records of an uncompressed batch whose verbatim bytes are ``chunks`` (the batch header included), each
    taken in turn: a record's value and headers must be read (or are skipped) before the next record is asked for.
    Raises :class:`CorruptRecordBatchError` as :func:`iter_raw_records` does (during the iteration: the batch is
    not held), and ``ValueError`` for a compressed batch (decode those whole)."""
    if batch.codec != 0:
        raise ValueError(f"the batch at offset {batch.base_offset} is compressed ({batch.codec.name.lower()}): "
                         "streamed records are read from uncompressed batches only")

    def fail(detail: str) -> CorruptRecordBatchError:
        return CorruptRecordBatchError(path, batch.position, f"records of the batch at offset {batch.base_offset}: "
                                       f"{detail} (at batch byte {src.consumed})")

    src = _Chunked(chunks, fail)
    for _ in src.pieces(HEADER.size):
        pass
    log_append = bool(batch.timestamp_type)
    prev = batch.base_offset - 1
    for _ in range(batch.record_count):
        length = src.varint()
        start = src.consumed
        src.byte()  # attributes
        ts_delta = src.varint()
        offset = batch.base_offset + src.varint()
        if offset <= prev or offset > batch.last_offset:
            raise fail(f"record offset {offset} is outside {prev + 1}..{batch.last_offset}")
        prev = offset
        key_len = src.varint()
        key = None if key_len < 0 else src.take(key_len)
        value_len = src.varint()

        def rest(start: int = start, length: int = length, offset: int = offset) -> list[tuple[str, bytes | None]]:
            headers = []
            for _ in range(src.varint()):
                name = src.take(src.varint())
                vlen = src.varint()
                try:
                    headers.append((name.decode("utf-8"), None if vlen < 0 else src.take(vlen)))
                except UnicodeDecodeError as err:
                    raise fail(f"a header key of the record at offset {offset} is not UTF-8") from err
            if src.consumed - start != length:
                raise fail(f"record at offset {offset} has {src.consumed - start} bytes, its length says {length}")
            return headers

        timestamp = batch.max_timestamp if log_append else batch.base_timestamp + ts_delta
        if value_len > inline_bytes:
            record = StreamedRecord(offset, timestamp, key, None, value_len, src, rest)
        else:
            value = None if value_len < 0 else src.take(value_len)
            record = StreamedRecord(offset, timestamp, key, value, max(value_len, 0), None, rest)
        yield record
        record.headers()  # what the caller did not read of the record
    if not src.at_end():
        raise fail(f"bytes after the last of {batch.record_count} records")
