"""Executor side: one input partition (a remote segment, or a block range of one) -> Arrow record batches.

An input partition is small and picklable: the segment's metadata itself (:class:`rsm.api.RemoteSegmentMetadata`,
a frozen dataclass of plain values, built from the metadata manager's model by :func:`rlm.tier.segments.to_rsm`), the
offsets to return, the block range, the segments whose transaction indexes matter (read_committed) and the store
configuration as a dict. The executor needs only the store: it reads the blocks with ranged GETs (one per data
object, streamed), verifies every batch (block framing, CRC-32C) and decodes its records straight into columns
(:mod:`rlm.spark.columns`: no Python object per record; a batch whose records carry headers is decoded record by
record with the compiled codec). Each Arrow record batch concatenates the columns of whole record batches. It
reads through the storage manager's read interface (:class:`rsm.api.SegmentHandle`); the batch / control /
aborted-transaction logic is :func:`rlm.tier.reader.iter_segment_batches` and :func:`rlm.tier.reader.aborted_covering`,
shared with the sidecar's reader.

A batch stored as fragments (larger than a block, PDP-43) is read as :class:`rsm.api.LargeBatch` chunks; when
uncompressed its records are decoded from them (:func:`rsm.log.records.iter_streamed_records`), each value built
once, so the executor holds about one copy of a large record, not the batch and its decoded values. A record whose
key, value and headers pass :data:`ROW_MAX_BYTES` cannot be a Spark row: the task fails with
:class:`RecordTooLargeError` naming its topic, partition, offset and size. An Arrow record batch is cut at
:data:`BATCH_BYTES` of keys and values as well as at :data:`BATCH_ROWS` (its binary columns have 32-bit offsets).

Storage managers are cached per store configuration in the Python worker (Spark reuses workers), so the index
objects of the segments stay cached across tasks.
"""

from __future__ import annotations

import gc
import json
import logging
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from rlm.spark.columns import BatchColumns, decode_columns
from rlm.spark.options import SparkSourceError
from rlm.tier import aborted_covering, iter_segment_batches
from rsm.api import LargeBatch, RemoteSegmentMetadata, RemoteStorageManagerApi, SegmentHandle
from rsm.errors import RemoteResourceNotFoundError
from rsm.log.batch import BatchHeader, Codec
from rsm.log.indexes import AbortedTxn
from rsm.log.records import Record, cyclic_gc_paused, iter_raw_records, iter_streamed_records
from rsm.manager import RemoteStorageManager, RsmConfig

__all__ = ["BATCH_BYTES", "BATCH_ROWS", "ROW_MAX_BYTES", "DataLossError", "RecordTooLargeError", "SegmentSlice",
           "arrow_schema", "read_slice", "storage_manager"]

log = logging.getLogger(__name__)

BATCH_ROWS = 65_536  # rows per Arrow record batch handed to Spark
BATCH_BYTES = 256 * 1024 * 1024  # key and value bytes per Arrow record batch (one record may pass it alone)
ROW_MAX_BYTES = (1 << 31) - 1024 * 1024
"""The key, value and header bytes a Spark row may hold: an UnsafeRow is one JVM byte array (at most 2^31 - 16
bytes), its fixed fields and offsets included (1 MiB kept for them)."""

_HEADER_TYPE = pa.list_(pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
_FIELDS = [
    pa.field("key", pa.binary()),
    pa.field("value", pa.binary()),
    pa.field("topic", pa.string()),
    pa.field("partition", pa.int32()),
    pa.field("offset", pa.int64()),
    pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    pa.field("timestampType", pa.int32()),
]


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The Arrow form of the source's Spark schema (what Spark checks each batch against)."""
    return pa.schema(_FIELDS + ([pa.field("headers", _HEADER_TYPE)] if include_headers else []))


@dataclass(frozen=True)
class SegmentSlice(InputPartition):
    """One Spark input partition: offsets ``from_offset..to_offset_inclusive`` of one remote segment.

    ``first_block``/``last_block`` (inclusive) bound the blocks read (None: from the block holding
    ``from_offset`` to the segment's last). ``start_timestamp_ms``: drop records until the first whose timestamp is
    >= it (a ``startingTimestamp`` resolved to this slice). ``txn_segments``: segments whose transaction indexes
    list the aborted transactions to drop (read_committed only; empty otherwise). ``fail_on_data_loss``: a segment
    removed by remote retention between planning and reading fails the task (:class:`DataLossError`), or is
    skipped with a warning.
    """

    segment: RemoteSegmentMetadata
    from_offset: int
    to_offset_inclusive: int
    first_block: int | None
    last_block: int | None
    start_timestamp_ms: int | None
    txn_segments: tuple[RemoteSegmentMetadata, ...]
    read_committed: bool
    include_headers: bool
    store: Mapping[str, Any]
    fail_on_data_loss: bool = True


class DataLossError(SparkSourceError):
    """``failOnDataLoss=true`` and records the query was to read are gone: offsets removed by remote retention first
    (the message names the topic, partition and offsets), a stream's tier that now ends below what it read, or a
    stream's topic deleted and re-created under its name (the message names the old and the new topic id). Set
    ``failOnDataLoss=false`` to go on past them (logged and counted)."""


_managers: dict[str, RemoteStorageManager] = {}
_managers_lock = threading.Lock()


def storage_manager(store: Mapping[str, Any]) -> RemoteStorageManager:
    """The worker's storage manager for a store configuration (one per configuration, reused across tasks)."""
    key = json.dumps(store, sort_keys=True, default=str)
    with _managers_lock:
        rsm = _managers.get(key)
        if rsm is None:
            rsm = _managers[key] = RemoteStorageManager(RsmConfig(**store))
        return rsm


class RecordTooLargeError(SparkSourceError):
    """A record larger than a Spark row can hold (:data:`ROW_MAX_BYTES` of key, value and headers): the message
    names its topic, partition, offset and size. Read it with ``rlm cat`` or through the history endpoint, which
    stream it."""


def _large_records(seg: RemoteSegmentMetadata, h: BatchHeader, data: LargeBatch, key: str) -> list[Any]:
    """The records of a batch stored as fragments: decoded from its chunks when uncompressed (each value built
    once), else from the whole batch; a record too large for a row raises :class:`RecordTooLargeError` before its
    value is built."""
    if h.codec != Codec.NONE:
        records = list(iter_raw_records(h, memoryview(data.read()), path=key))
        for r in records:
            _check_row(seg, r.offset, len(r.key or b"") + len(r.value or b"")
                       + sum(len(k) + len(v or b"") for k, v in r.headers or ()))
        return records
    out = []
    for r in iter_streamed_records(h, data.chunks(), path=key):
        _check_row(seg, r.offset, len(r.key or b"") + r.value_size)
        value = b"".join(bytes(c) for c in r.value_chunks()) if r.streamed else r.value
        headers = r.headers()
        _check_row(seg, r.offset, len(r.key or b"") + len(value or b"")
                   + sum(len(k) + len(v or b"") for k, v in headers))
        out.append(Record(r.offset, r.timestamp, r.key, value, tuple(headers)))
    return out


def _check_row(seg: RemoteSegmentMetadata, offset: int, size: int) -> None:
    if size > ROW_MAX_BYTES:
        raise RecordTooLargeError(
            f"{seg.topic_name}-{seg.partition}: the record at offset {offset} has {size} bytes of key, value and "
            f"headers, more than a Spark row can hold ({ROW_MAX_BYTES}); read it with `rlm cat` or through the "
            "history endpoint, which stream it")


def _aborted(rsm: RemoteStorageManagerApi, part: SegmentSlice) -> list[AbortedTxn]:
    if not part.read_committed:
        return []
    seg = part.segment
    return aborted_covering(seg.start_offset, seg.end_offset_inclusive,
                            (rsm.open_segment(md).aborted_transactions() for md in part.txn_segments))


def _record_columns(records: list[Any], include_headers: bool) -> tuple[BatchColumns, pa.Array | None]:
    """Columns of records decoded one by one (a batch whose records carry headers)."""
    cols = BatchColumns(np.array([r.offset for r in records], np.int64),
                        np.array([r.timestamp for r in records], np.int64),
                        pa.array([r.key for r in records], pa.binary()),
                        pa.array([r.value for r in records], pa.binary()))
    return cols, (pa.array([r.headers for r in records], _HEADER_TYPE) if include_headers else None)


def _no_headers(n: int) -> pa.Array:
    """``n`` empty header lists."""
    return pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), _NO_HEADER_VALUES, type=_HEADER_TYPE)


_NO_HEADER_VALUES = pa.array([], _HEADER_TYPE.value_type)


class _Columns:
    """The pieces (one per record batch) of the Arrow record batch being built."""

    __slots__ = ("bytes", "headers", "pieces", "rows", "ts_types")

    def __init__(self) -> None:
        self.pieces: list[BatchColumns] = []
        self.ts_types: list[int] = []
        self.headers: list[pa.Array] = []
        self.rows = 0
        self.bytes = 0  # of keys and values

    def add(self, cols: BatchColumns, ts_type: int, headers: pa.Array | None) -> None:
        self.pieces.append(cols)
        self.ts_types.append(ts_type)
        if headers is not None:
            self.headers.append(headers)
        self.rows += len(cols)
        self.bytes += _payload(cols)

    def to_batch(self, schema: pa.Schema, topic: str, partition: int) -> pa.RecordBatch:
        n = self.rows
        pieces = self.pieces
        ts = np.concatenate([p.timestamps for p in pieces]) * 1000
        if len(set(self.ts_types)) == 1:
            ts_types = np.full(n, self.ts_types[0], np.int32)
        else:
            ts_types = np.repeat(np.array(self.ts_types, np.int32), [len(p) for p in pieces])
        arrays = [
            _concat([p.keys for p in pieces]),
            _concat([p.values for p in pieces]),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array(np.concatenate([p.offsets for p in pieces]), pa.int64()),
            pa.array(ts, pa.timestamp("us", tz="UTC")),
            pa.array(ts_types, pa.int32()),
        ]
        if len(schema) > len(arrays):
            arrays.append(_concat(self.headers))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _payload(cols: BatchColumns) -> int:
    """The key and value bytes of ``cols``."""
    return cols.keys.nbytes + cols.values.nbytes


def _concat(arrays: list[pa.Array]) -> pa.Array:
    return arrays[0] if len(arrays) == 1 else pa.concat_arrays(arrays)


def _filtered(cols: BatchColumns, headers: pa.Array | None,
              keep: np.ndarray) -> tuple[BatchColumns, pa.Array | None]:
    mask = pa.array(keep)
    return (BatchColumns(cols.offsets[keep], cols.timestamps[keep], cols.keys.filter(mask), cols.values.filter(mask)),
            None if headers is None else headers.filter(mask))


def read_slice(part: SegmentSlice) -> Iterator[pa.RecordBatch]:
    """The records of one input partition as Arrow record batches of up to :data:`BATCH_ROWS` rows (see
    :attr:`SegmentSlice.fail_on_data_loss` for a segment removed before it is read)."""
    try:
        yield from _read_slice(part)
    except RemoteResourceNotFoundError as err:
        seg = part.segment
        where = (f"{seg.topic_name}-{seg.partition}: offsets {part.from_offset} to {part.to_offset_inclusive} "
                 f"(remote segment {seg.start_offset}-{seg.end_offset_inclusive})")
        if part.fail_on_data_loss:
            raise DataLossError(f"{where} were removed by remote retention before they were read ({err}); set "
                                "failOnDataLoss=false to skip them") from err
        log.warning("remote segment removed by remote retention before it was read, skipped: %s", where)


def _read_slice(part: SegmentSlice) -> Iterator[pa.RecordBatch]:
    seg = part.segment
    schema = arrow_schema(part.include_headers)
    rsm = storage_manager(part.store)
    handle = rsm.open_segment(seg)
    lo = max(part.from_offset, seg.start_offset)
    hi = min(part.to_offset_inclusive, seg.end_offset_inclusive)
    if lo > hi:
        return
    start_ts = part.start_timestamp_ms
    cols = _Columns()
    # Decoding a batch with headers allocates a few objects per record and none of them form cycles: the cyclic
    # collector, triggered every 700 allocations, would only walk them again and again (it costs 2-2.5x the
    # decode). It is off while a batch is built and back on (if it was) whenever control leaves this generator.
    gc_was_enabled = gc.isenabled()
    with cyclic_gc_paused():
        yield from _read_into(part, rsm, handle, lo, hi, start_ts, cols, schema, gc_was_enabled)


def _read_into(part: SegmentSlice, rsm: RemoteStorageManagerApi, handle: SegmentHandle, lo: int, hi: int,
               start_ts: int | None, cols: _Columns, schema: pa.Schema,
               gc_was_enabled: bool) -> Iterator[pa.RecordBatch]:
    seg = part.segment
    key = handle.name
    include_headers = part.include_headers
    for h, data, visible in iter_segment_batches(handle, lo, hi, aborted=_aborted(rsm, part),
                                                 first_block=part.first_block, last_block=part.last_block,
                                                 large=True):
        if not visible:
            continue
        if isinstance(data, LargeBatch):
            batch_cols, headers = _record_columns(_large_records(seg, h, data, key), include_headers)
        elif (batch_cols := decode_columns(h, data, path=key)) is not None:
            headers = _no_headers(len(batch_cols)) if include_headers else None
        else:
            batch_cols, headers = _record_columns(list(iter_raw_records(h, data, path=key)), include_headers)
        if h.base_offset < lo or h.last_offset > hi:
            offsets = batch_cols.offsets
            keep = (offsets >= lo) & (offsets <= hi)
            if not keep.all():
                batch_cols, headers = _filtered(batch_cols, headers, keep)
        if start_ts is not None:
            at = np.flatnonzero(batch_cols.timestamps >= start_ts)
            if not len(at):
                continue
            i = int(at[0])
            batch_cols = batch_cols.slice(i, len(batch_cols))
            headers = None if headers is None else headers.slice(i)
            start_ts = None  # from the first such record on, every record is returned
        if not len(batch_cols):
            continue
        if cols.rows and cols.bytes + _payload(batch_cols) > BATCH_BYTES:  # binary columns: 32-bit offsets
            yield from _handed_over(cols.to_batch(schema, seg.topic_name, seg.partition), gc_was_enabled)
            cols = _Columns()
        cols.add(batch_cols, 1 if h.timestamp_type else 0, headers)
        if cols.rows >= BATCH_ROWS:
            yield from _handed_over(cols.to_batch(schema, seg.topic_name, seg.partition), gc_was_enabled)
            cols = _Columns()
    if cols.rows:
        yield from _handed_over(cols.to_batch(schema, seg.topic_name, seg.partition), gc_was_enabled)


def _handed_over(batch: pa.RecordBatch, gc_was_enabled: bool) -> Iterator[pa.RecordBatch]:
    """Yields ``batch`` with the cyclic collector as it was before the read (Spark's code runs meanwhile), and
    paused again when the read goes on."""
    if gc_was_enabled:
        gc.enable()
    yield batch
    gc.disable()
