"""Kafka's on-disk log format: record batches in ``.log`` files, their records, the offset/time/transaction
indexes, the leader-epoch checkpoint and partition metadata, and partition directories. Read-only; streaming.

Each byte format lives in one module with its layout beside the code: ``batch`` (record batch header, scan),
``records`` (records, every codec; control records), ``indexes``, ``checkpoint``, ``partition``. Every
malformation raises a :class:`LogFormatError` subclass naming the file and byte position.
"""

from rsm.log.batch import BatchHeader, Codec, TimestampType, iter_batches_with_bytes, scan_batches
from rsm.log.checkpoint import EpochEntry, read_leader_epoch_checkpoint, read_partition_metadata
from rsm.log.errors import CorruptCheckpointError, CorruptIndexError, CorruptRecordBatchError, LogFormatError
from rsm.log.indexes import (
    AbortedTxn,
    OffsetIndexEntry,
    TimeIndexEntry,
    find_batch,
    lookup_position,
    read_offset_index,
    read_time_index,
    read_txn_index,
)
from rsm.log.partition import PartitionDir, Segment
from rsm.log.records import ControlType, Record, control_type, decode_records, iter_raw_records

__all__ = [
    "AbortedTxn",
    "BatchHeader",
    "Codec",
    "ControlType",
    "CorruptCheckpointError",
    "CorruptIndexError",
    "CorruptRecordBatchError",
    "EpochEntry",
    "LogFormatError",
    "OffsetIndexEntry",
    "PartitionDir",
    "Record",
    "Segment",
    "TimeIndexEntry",
    "TimestampType",
    "control_type",
    "decode_records",
    "find_batch",
    "iter_batches_with_bytes",
    "iter_raw_records",
    "lookup_position",
    "read_leader_epoch_checkpoint",
    "read_offset_index",
    "read_partition_metadata",
    "read_time_index",
    "read_txn_index",
    "scan_batches",
]
