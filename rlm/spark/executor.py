"""Executor side: one input partition (a remote segment, or a block range of one) -> Arrow record batches.

An input partition is small and picklable: the segment's metadata itself (:class:`rsm.api.RemoteSegmentMetadata`,
a frozen dataclass of plain values, built from the metadata manager's model by :func:`rlm.segments.to_rsm`), the
offsets to return, the block range, the segments whose transaction indexes matter (read_committed) and the store
configuration as a dict. The executor needs only the store: it reads the blocks with ranged GETs (one per data
object, streamed), verifies every batch (block framing, CRC-32C) and decodes records with the compiled codec. It
reads through the storage manager's read interface (:class:`rsm.api.SegmentHandle`); the batch / control /
aborted-transaction logic is :func:`rlm.reader.iter_segment_batches` and :func:`rlm.reader.aborted_covering`,
shared with the sidecar's reader.

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

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import InputPartition

from rlm.reader import aborted_covering, iter_segment_batches
from rlm.spark.options import SparkSourceError
from rsm.api import RemoteSegmentMetadata, RemoteStorageManagerApi, SegmentHandle
from rsm.errors import RemoteResourceNotFoundError
from rsm.log.indexes import AbortedTxn
from rsm.log.records import cyclic_gc_paused, iter_raw_records
from rsm.manager import RemoteStorageManager, RsmConfig

__all__ = ["BATCH_ROWS", "DataLossError", "SegmentSlice", "arrow_schema", "read_slice", "storage_manager"]

log = logging.getLogger(__name__)

BATCH_ROWS = 65_536  # rows per Arrow record batch handed to Spark

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
    """Offsets the query was to read were removed by remote retention first (``failOnDataLoss=true``); the message
    names the topic, partition and offsets."""


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


def _aborted(rsm: RemoteStorageManagerApi, part: SegmentSlice) -> list[AbortedTxn]:
    if not part.read_committed:
        return []
    seg = part.segment
    return aborted_covering(seg.start_offset, seg.end_offset_inclusive,
                            (rsm.open_segment(md).aborted_transactions() for md in part.txn_segments))


class _Columns:
    """Column buffers of the batch being built."""

    __slots__ = ("headers", "keys", "offsets", "timestamps", "ts_types", "values")

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.timestamps: list[int] = []
        self.ts_types: list[int] = []
        self.headers: list[list[tuple[str, bytes | None]]] = []

    def add(self, records: list[Any], ts_type: int, include_headers: bool) -> None:
        self.keys += [r.key for r in records]
        self.values += [r.value for r in records]
        self.offsets += [r.offset for r in records]
        self.timestamps += [r.timestamp for r in records]
        self.ts_types += [ts_type] * len(records)
        if include_headers:
            self.headers += [r.headers for r in records]

    def to_batch(self, schema: pa.Schema, topic: str, partition: int) -> pa.RecordBatch:
        n = len(self.offsets)
        ts = pa.array(self.timestamps, pa.int64())
        arrays = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(topic, pa.string()), n),
            pa.repeat(pa.scalar(partition, pa.int32()), n),
            pa.array(self.offsets, pa.int64()),
            pc.multiply(ts, 1000).cast(pa.timestamp("us", tz="UTC")),
            pa.array(self.ts_types, pa.int32()),
        ]
        if len(schema) > len(arrays):
            arrays.append(pa.array(self.headers, _HEADER_TYPE))
        return pa.RecordBatch.from_arrays(arrays, schema=schema)


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
    # Decoding allocates a few objects per record and none of them form cycles: the cyclic collector, triggered
    # every 700 allocations, would only walk the growing column lists again and again (it costs 2-2.5x the
    # decode). It is off while a batch is built and back on (if it was) whenever control leaves this generator.
    gc_was_enabled = gc.isenabled()
    with cyclic_gc_paused():
        yield from _read_into(part, rsm, handle, lo, hi, start_ts, cols, schema, gc_was_enabled)


def _read_into(part: SegmentSlice, rsm: RemoteStorageManagerApi, handle: SegmentHandle, lo: int, hi: int,
               start_ts: int | None, cols: _Columns, schema: pa.Schema,
               gc_was_enabled: bool) -> Iterator[pa.RecordBatch]:
    seg = part.segment
    key = handle.name
    for h, data, visible in iter_segment_batches(handle, lo, hi, aborted=_aborted(rsm, part),
                                                 first_block=part.first_block, last_block=part.last_block):
        if not visible:
            continue
        records = list(iter_raw_records(h, data, path=key))
        if h.base_offset < lo or h.last_offset > hi:
            records = [r for r in records if lo <= r.offset <= hi]
        if start_ts is not None:
            for i, r in enumerate(records):
                if r.timestamp >= start_ts:
                    records = records[i:]
                    start_ts = None  # from the first such record on, every record is returned
                    break
            else:
                continue
        cols.add(records, 1 if h.timestamp_type else 0, part.include_headers)
        if len(cols.offsets) >= BATCH_ROWS:
            batch = cols.to_batch(schema, seg.topic_name, seg.partition)
            cols = _Columns()
            if gc_was_enabled:
                gc.enable()
            yield batch
            gc.disable()
    if cols.offsets:
        batch = cols.to_batch(schema, seg.topic_name, seg.partition)
        if gc_was_enabled:
            gc.enable()
        yield batch
