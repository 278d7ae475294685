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
    "control_type",
    "decode_records",
    "iter_raw_records",
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
