"""The records of one record batch decoded straight into columns (numpy, Arrow): no Python object per record.

The Spark executors' hot path (:mod:`rlm.spark.executor`). The layout is Kafka's ``DefaultRecord``, written out
in :mod:`rsm.log.records` (which decodes it record by record with aiokafka's codec); after the batch's 61-byte
header come ``RecordCount`` records, compressed as one block unless the codec is none::

    Record =>
      Length => Varint                 bytes after this field
      Attributes => Int8               unused
      TimestampDelta => Varlong        from BaseTimestamp (LOG_APPEND_TIME: the batch's MaxTimestamp is used)
      OffsetDelta => Varint            from BaseOffset
      Key => Bytes                     Varint length, -1 = null
      Value => Bytes                   Varint length, -1 = null
      Headers => [Header]              Varint count

Varints are zigzag-encoded (protobuf's sint32/sint64). Records follow each other, so where record ``i + 1``
starts depends on record ``i``'s length: one Python loop walks the ``Length`` fields (a few bytecodes a record);
every other field is decoded for all records at once with numpy, and the keys and values are gathered by Arrow
(``take`` over one binary array whose offsets are the field boundaries of the decompressed bytes).

:func:`decode_columns` returns None for a batch whose records carry headers (the caller then decodes it record
by record, :func:`rsm.log.records.iter_raw_records`): headers are rare, nested, and not worth a second decoder.
It checks what the record-by-record decode checks: the record count, every record's Length against its fields,
no byte left over, the first and last offsets inside the batch's. A malformed batch raises
:class:`~rsm.log.errors.CorruptRecordBatchError` naming ``path`` and the batch's position.
"""

from __future__ import annotations

import os
import struct
import threading
import zlib
from dataclasses import dataclass
from types import ModuleType

import cramjam
import numpy as np
import pyarrow as pa
from aiokafka.codec import gzip_decode, snappy_decode

from rsm.log.batch import HEADER, BatchHeader, Codec, TimestampType
from rsm.log.errors import CorruptRecordBatchError

__all__ = ["BatchColumns", "decode_columns"]

_MAX_VARINT = 5  # bytes of a Varint (int32)
_MAX_VARLONG = 10  # bytes of a Varlong (int64)
_EMPTY_BINARY = pa.array([], pa.binary())
# What the decompressors and numpy raise on malformed input (gzip: OSError/EOFError/zlib.error; snappy's framing:
# struct.error; an index past the records: IndexError).
_DECODE_ERRORS = (ValueError, IndexError, TypeError, OverflowError, OSError, EOFError, MemoryError, zlib.error,
                  struct.error, cramjam.DecompressionError)


@dataclass(frozen=True, slots=True)
class BatchColumns:
    """The records of one batch as columns: ``offsets`` and ``timestamps`` (ms) are int64 numpy arrays, ``keys``
    and ``values`` Arrow binary arrays (null where the record's key/value is null); all of one length."""

    offsets: np.ndarray
    timestamps: np.ndarray
    keys: pa.Array
    values: pa.Array

    def __len__(self) -> int:
        return len(self.offsets)

    def slice(self, start: int, stop: int) -> BatchColumns:
        """Rows ``start..stop - 1`` (views, no copy)."""
        return BatchColumns(self.offsets[start:stop], self.timestamps[start:stop],
                            self.keys.slice(start, stop - start), self.values.slice(start, stop - start))


class _Scratch(threading.local):
    """The thread's buffer that LZ4 and zstd decompress into (reused batch after batch: a fresh megabyte per batch
    costs more in page faults than the decompression itself)."""

    def __init__(self) -> None:
        self.buf = np.empty(_SCRATCH_BYTES, np.uint8)


_SCRATCH_BYTES = 4 << 20
_scratch = _Scratch()


def _decompress_reusing(codec: ModuleType, payload: memoryview) -> memoryview:
    out = _scratch.buf
    try:
        n = codec.decompress_into(payload, out)
    except cramjam.DecompressionError:  # too small for this batch (or corrupt: then decompress says so)
        whole = codec.decompress(payload)
        n = len(whole)
        _scratch.buf = out = np.empty(max(n, len(out)) * 5 // 4, np.uint8)
        out[:n] = np.frombuffer(whole, np.uint8)
    return memoryview(out)[:n]


def _records_bytes(h: BatchHeader, data: bytes | memoryview) -> memoryview:
    """The batch's records, decompressed (the bytes after the header). LZ4 and zstd decompress into the thread's
    scratch buffer: the view is valid until the next call."""
    payload = memoryview(data)[HEADER.size:]
    codec = h.codec
    if codec is Codec.NONE:
        return payload
    if codec is Codec.LZ4:
        return _decompress_reusing(cramjam.lz4, payload)
    if codec is Codec.ZSTD:
        return _decompress_reusing(cramjam.zstd, payload)
    if codec is Codec.GZIP:
        return memoryview(gzip_decode(payload))
    if codec is Codec.SNAPPY:  # Kafka's Java client writes xerial-framed snappy; aiokafka reads both framings
        return memoryview(snappy_decode(payload.tobytes()))
    raise ValueError(f"unknown codec {codec}")


def _advance_table() -> list[int | None]:
    """``table[b0 | b1 << 8]``: the bytes from a record's start to the next record's (Length varint + Length) for a
    Length field of one or two bytes starting with bytes ``b0, b1``; None where it takes more than two."""
    table: list[int | None] = [None] * 65536
    for w in range(65536):
        b0, b1 = w & 0xFF, w >> 8
        if b0 < 0x80:
            table[w] = 1 + ((b0 >> 1) ^ -(b0 & 1))
        elif b1 < 0x80:
            v = (b0 & 0x7F) | (b1 << 7)
            table[w] = 2 + ((v >> 1) ^ -(v & 1))
    return table


_ADVANCE = _advance_table()


def _record_heads(d: memoryview, n: int) -> tuple[list[int], int]:
    """Where each of the ``n`` records starts (its Length field) and where the last one ends. Records shorter than
    8 KiB (a Length of one or two bytes) take one table look-up each (a record is at least 7 bytes long, so the
    look-up's second byte is there unless the batch is malformed)."""
    heads = []
    append = heads.append
    p = 0
    table = _ADVANCE
    try:
        for _ in range(n):
            append(p)
            p += table[d[p] | (d[p + 1] << 8)]  # type: ignore[operator]
        return heads, p
    except TypeError:  # a Length of three bytes or more (a record of 8 KiB or more): the general loop
        pass
    heads = [0] * n
    p = 0
    for i in range(n):
        heads[i] = p
        v = 0
        shift = 0
        while True:
            b = d[p]
            p += 1
            v |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift >= 7 * _MAX_VARINT:
                raise ValueError(f"record {i}: Length varint longer than {_MAX_VARINT} bytes")
        p += (v >> 1) ^ -(v & 1)
    return heads, p


def _varints(buf: np.ndarray, pos: np.ndarray, max_bytes: int, what: str) -> tuple[np.ndarray, np.ndarray]:
    """The zigzag varints starting at ``pos`` (one per record): values (int64) and the positions after them."""
    b = buf[pos]
    cont = b >= 0x80
    if not cont.any():  # the common case: every one a single byte
        v = b.astype(np.int64)
        return (v >> 1) ^ -(v & 1), pos + 1
    b1 = buf[pos + cont]  # the second byte where there is one
    more = cont & (b1 >= 0x80)
    if not more.any():  # every one one or two bytes
        v = (b & 0x7F).astype(np.int64) | ((b1 * cont).astype(np.int64) << 7)
        return (v >> 1) ^ -(v & 1), pos + 1 + cont
    v = (b & 0x7F).astype(np.uint64)
    after = pos + 1
    j = 1
    while cont.any():
        if j == max_bytes:
            raise ValueError(f"{what} varint longer than {max_bytes} bytes")
        idx = np.flatnonzero(cont)
        b = buf[pos[idx] + j]
        v[idx] |= (b & 0x7F).astype(np.uint64) << np.uint64(7 * j)
        after[idx] += 1
        cont[idx[b < 0x80]] = False
        j += 1
    return ((v >> np.uint64(1)) ^ (-(v & np.uint64(1)))).view(np.int64), after


def _check(ok: np.ndarray | bool, what: str) -> None:
    if not np.all(ok):
        bad = 0 if isinstance(ok, bool) else int(np.argmin(ok))
        raise ValueError(f"record {bad}: {what}")


def decode_columns(h: BatchHeader, data: bytes | memoryview, *,
                   path: str | os.PathLike[str] = "<batch bytes>") -> BatchColumns | None:
    """The records of the batch ``h`` (``data``: its verbatim bytes) as columns; None if a record has headers.

    Raises :class:`CorruptRecordBatchError` when the records do not decode (see the module docstring)."""
    if len(data) != h.size_bytes or len(data) < HEADER.size or HEADER.unpack_from(data, 0)[0] != h.base_offset:
        raise CorruptRecordBatchError(path, h.position, f"these {len(data)} bytes are not the batch with base "
                                      f"offset {h.base_offset} ({h.size_bytes} bytes)")
    n = h.record_count
    if n == 0:
        empty = np.empty(0, np.int64)
        return BatchColumns(empty, empty, _EMPTY_BINARY, _EMPTY_BINARY)
    try:
        raw = _records_bytes(h, data)
        size = len(raw)
        heads_list, end = _record_heads(raw, n)
        if end != size:
            raise ValueError(f"{size - end} bytes after the {n} records" if end < size else
                             f"the {n} records run {end - size} bytes past the batch's end")
        buf = np.frombuffer(raw, np.uint8)
        heads = np.array(heads_list, np.int64)
        ends = np.empty(n, np.int64)
        ends[:-1] = heads[1:]
        ends[-1] = end
        _, start = _varints(buf, heads, _MAX_VARINT, "Length")
        _check(start < ends, "Length is not positive")
        ts_delta, pos = _varints(buf, start + 1, _MAX_VARLONG, "TimestampDelta")  # + 1: Attributes (Int8)
        off_delta, pos = _varints(buf, pos, _MAX_VARINT, "OffsetDelta")
        key_len, key_start = _varints(buf, pos, _MAX_VARINT, "key length")
        _check(key_len >= -1, "negative key length")
        key_end = key_start + np.maximum(key_len, 0)
        _check(key_end < ends, "key runs past the record's end")
        value_len, value_start = _varints(buf, key_end, _MAX_VARINT, "value length")
        _check(value_len >= -1, "negative value length")
        value_end = value_start + np.maximum(value_len, 0)
        _check(value_end < ends, "value runs past the record's end")
        if buf[value_end].any():  # a header count (one byte when it is 0)
            return None
        _check(value_end + 1 == ends, "the record's Length does not match its fields")
    except CorruptRecordBatchError:
        raise
    except _DECODE_ERRORS as err:
        raise CorruptRecordBatchError(
            path, h.position, f"records of the batch at offset {h.base_offset} do not decode "
            f"({h.codec.name.lower()}): {type(err).__name__}: {err}") from err
    offsets = off_delta + h.base_offset
    if offsets[0] < h.base_offset or offsets[-1] > h.last_offset or offsets[0] > offsets[-1]:
        raise CorruptRecordBatchError(
            path, h.position, f"record offsets {offsets[0]}..{offsets[-1]} lie outside the batch's offsets "
            f"{h.base_offset}..{h.last_offset}")
    if h.timestamp_type is TimestampType.LOG_APPEND_TIME:  # every record takes the batch's MaxTimestamp
        timestamps = np.full(n, h.max_timestamp, np.int64)
    else:
        timestamps = ts_delta + h.base_timestamp
    # One binary array over the decompressed bytes whose elements are, per record: key, the value's length field,
    # value, the rest up to the next key. The offsets ascend (checked above); take() copies keys and values out.
    bounds = np.empty(4 * n, np.int64)
    bounds[0::4] = key_start
    bounds[1::4] = key_end
    bounds[2::4] = value_start
    bounds[3::4] = value_end
    if size < 2**31:
        fields = pa.Array.from_buffers(pa.binary(), 4 * n - 1, [None, pa.py_buffer(bounds.astype(np.int32)),
                                                                  pa.py_buffer(raw)])
    else:  # pragma: no cover - a batch decompressing to 2 GiB or more
        fields = pa.Array.from_buffers(pa.large_binary(), 4 * n - 1, [None, pa.py_buffer(bounds),
                                                                        pa.py_buffer(raw)])
    index = np.arange(0, 4 * n, 4, dtype=np.int32)
    keys = _gather(fields, index, key_len < 0)
    values = _gather(fields, index + 2, value_len < 0)
    return BatchColumns(offsets, timestamps, keys, values)


def _gather(fields: pa.Array, index: np.ndarray, null: np.ndarray) -> pa.Array:
    idx = pa.array(index, mask=null) if null.any() else pa.array(index)
    out = fields.take(idx)
    return out if out.type == pa.binary() else out.cast(pa.binary())
