"""A segment's offset, time and transaction indexes (``.index``, ``.timeindex``, ``.txnindex``).

Mirrors Kafka's ``OffsetIndex``, ``TimeIndex`` and ``TransactionIndex``/``AbortedTxn``
(https://github.com/apache/kafka/tree/trunk/storage/src/main/java/org/apache/kafka/storage/internals/log).
All integers big-endian; offsets in the offset and time indexes are relative to the segment's base offset::

    OffsetIndexEntry =>                (sparse: one entry every log.index.interval.bytes)
      RelativeOffset => Int32
      Position => Int32                byte position of a batch in the .log file

    TimeIndexEntry =>
      Timestamp => Int64               ms
      RelativeOffset => Int32

    AbortedTxn =>                      (one per aborted transaction whose abort marker is in this segment)
      Version => Int16                 = 0
      ProducerId => Int64
      FirstOffset => Int64
      LastOffset => Int64              the abort marker's offset (inclusive)
      LastStableOffset => Int64

:class:`KafkaIndexBuilder` writes the ``.index`` and ``.timeindex`` of a run of batches as Kafka's ``LogSegment.append``
would have (for a remote segment cut from the log at other offsets than the broker's: streaming offload).

An active segment's ``.index`` and ``.timeindex`` are preallocated and zero-filled at the tail (trimmed when it
rolls): entries end at the first all-zero entry after the first entry (the first may legitimately be zero).
Index files are small (``segment.index.bytes``, 10 MiB by default) and are read whole.
"""

from __future__ import annotations

import bisect
import os
import struct
from dataclasses import dataclass

from rsm.log.batch import BatchHeader, scan_batches
from rsm.log.errors import CorruptIndexError
from rsm.log.held import read_bytes

__all__ = [
    "OFFSET_ENTRY",
    "TIME_ENTRY",
    "TXN_ENTRY",
    "AbortedTxn",
    "KafkaIndexBuilder",
    "OffsetIndexEntry",
    "TimeIndexEntry",
    "find_batch",
    "lookup_position",
    "read_offset_index",
    "read_time_index",
    "format_txn_index", "parse_txn_index", "read_txn_index",
]

OFFSET_ENTRY = struct.Struct(
    ">"
    "i"  # relative_offset: Int32
    "i"  # position: Int32
)
TIME_ENTRY = struct.Struct(
    ">"
    "q"  # timestamp_ms: Int64
    "i"  # relative_offset: Int32
)
TXN_ENTRY = struct.Struct(
    ">"
    "h"  # version: Int16
    "q"  # producer_id: Int64
    "q"  # first_offset: Int64
    "q"  # last_offset: Int64
    "q"  # last_stable_offset: Int64
)
TXN_VERSION = 0


@dataclass(frozen=True, slots=True)
class OffsetIndexEntry:
    offset: int  # absolute (base offset + relative)
    position: int  # byte position of a batch holding or following ``offset``


@dataclass(frozen=True, slots=True)
class TimeIndexEntry:
    timestamp_ms: int
    offset: int  # absolute: the batch holding this max timestamp starts at or before it


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    version: int
    producer_id: int
    first_offset: int
    last_offset: int  # inclusive
    last_stable_offset: int


def _read_entries(path: str | os.PathLike[str], entry: struct.Struct, kind: str) -> bytes:
    data = read_bytes(path)  # (a held descriptor read with pread: rsm.log.held)
    if len(data) % entry.size:
        raise CorruptIndexError(
            path, len(data) - len(data) % entry.size, f"truncated {kind}: length {len(data)} is not a multiple of "
            f"the {entry.size}-byte entry size ({len(data) % entry.size} bytes left over)")
    return data


def _zero_tail(data: bytes, entry_size: int) -> int:
    """Number of entries before the first all-zero entry after the first one (the preallocated tail)."""
    zero = bytes(entry_size)
    idx = data.find(zero, entry_size)
    while idx != -1 and idx % entry_size:
        idx = data.find(zero, idx - idx % entry_size + entry_size)
    return len(data) // entry_size if idx == -1 else idx // entry_size


def read_offset_index(path: str | os.PathLike[str], base_offset: int) -> list[OffsetIndexEntry]:
    """The entries of a ``.index`` file, absolute offsets, zero tail dropped. Raises :class:`CorruptIndexError`
    for a truncated file or entries whose offsets do not increase or whose positions go backwards."""
    data = _read_entries(path, OFFSET_ENTRY, "offset index")
    n = _zero_tail(data, OFFSET_ENTRY.size)
    out: list[OffsetIndexEntry] = []
    prev_rel, prev_pos = -1, -1
    for i, (rel, pos) in enumerate(OFFSET_ENTRY.iter_unpack(data[: n * OFFSET_ENTRY.size])):
        if rel <= prev_rel or pos < prev_pos or rel < 0 or pos < 0:
            raise CorruptIndexError(
                path, i * OFFSET_ENTRY.size, f"offset index entry {i} (relative offset {rel}, position {pos}) does "
                f"not follow the previous one (relative offset {prev_rel}, position {prev_pos})")
        out.append(OffsetIndexEntry(base_offset + rel, pos))
        prev_rel, prev_pos = rel, pos
    return out


def read_time_index(path: str | os.PathLike[str], base_offset: int) -> list[TimeIndexEntry]:
    """The entries of a ``.timeindex`` file, absolute offsets, zero tail dropped. Raises
    :class:`CorruptIndexError` for a truncated file or entries whose timestamps or offsets go backwards."""
    data = _read_entries(path, TIME_ENTRY, "time index")
    n = _zero_tail(data, TIME_ENTRY.size)
    out: list[TimeIndexEntry] = []
    prev_ts, prev_rel = -(1 << 63), -1
    for i, (ts, rel) in enumerate(TIME_ENTRY.iter_unpack(data[: n * TIME_ENTRY.size])):
        if ts < prev_ts or rel < prev_rel or rel < 0:
            raise CorruptIndexError(
                path, i * TIME_ENTRY.size, f"time index entry {i} (timestamp {ts}, relative offset {rel}) goes "
                f"backwards from the previous one (timestamp {prev_ts}, relative offset {prev_rel})")
        out.append(TimeIndexEntry(ts, base_offset + rel))
        prev_ts, prev_rel = ts, rel
    return out


def read_txn_index(path: str | os.PathLike[str]) -> list[AbortedTxn]:
    """The aborted transactions of a ``.txnindex`` file. Raises :class:`CorruptIndexError` for a truncated file,
    an unknown version or an entry whose offsets are inverted."""
    return parse_txn_index(read_bytes(path), path)


def parse_txn_index(data: bytes | memoryview, path: str | os.PathLike[str] = "<txnindex bytes>") -> list[AbortedTxn]:
    """The aborted transactions in the bytes of a ``.txnindex`` (e.g. fetched from remote storage); errors name
    ``path``. See :func:`read_txn_index`."""
    data = bytes(data)
    if len(data) % TXN_ENTRY.size:
        raise CorruptIndexError(
            path, len(data) - len(data) % TXN_ENTRY.size, f"truncated transaction index: length {len(data)} is "
            f"not a multiple of the {TXN_ENTRY.size}-byte entry size ({len(data) % TXN_ENTRY.size} bytes left over)")
    out: list[AbortedTxn] = []
    for i, (version, pid, first, last, lso) in enumerate(TXN_ENTRY.iter_unpack(data)):
        if version != TXN_VERSION:
            raise CorruptIndexError(path, i * TXN_ENTRY.size,
                                    f"aborted txn entry {i}: expected version {TXN_VERSION}, found {version}")
        if first < 0 or last < first:
            raise CorruptIndexError(path, i * TXN_ENTRY.size,
                                    f"aborted txn entry {i}: first offset {first} > last offset {last}")
        out.append(AbortedTxn(version, pid, first, last, lso))
    return out


def format_txn_index(entries: list[AbortedTxn]) -> bytes:
    """The bytes of a ``.txnindex`` holding ``entries`` (the inverse of :func:`parse_txn_index`)."""
    return b"".join(TXN_ENTRY.pack(TXN_VERSION, t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset)
                    for t in entries)


def lookup_position(index_entries: list[OffsetIndexEntry], target_offset: int) -> int:
    """Floor lookup: the position of the last entry whose offset is <= ``target_offset`` (0 if none)."""
    i = bisect.bisect_right(index_entries, target_offset, key=lambda e: e.offset)
    return index_entries[i - 1].position if i else 0


def find_batch(log_path: str | os.PathLike[str], index_path: str | os.PathLike[str], base_offset: int,
               target_offset: int, *, or_next: bool = False) -> BatchHeader | None:
    """The batch of ``log_path`` holding ``target_offset``: floor via the offset index, then scan forward
    (CRC-checked). ``None`` if the segment has no such offset (before its base, past its end, or - without
    ``or_next`` - in a gap left by compaction; with ``or_next`` the first batch after the gap is returned).
    Raises :class:`CorruptIndexError` / :class:`CorruptRecordBatchError` on damaged files."""
    if target_offset < base_offset:
        return None
    position = lookup_position(read_offset_index(index_path, base_offset), target_offset)
    for header in scan_batches(log_path, start_position=position):
        if header.last_offset >= target_offset:
            return header if (or_next or header.base_offset <= target_offset) else None
    return None


DEFAULT_INDEX_INTERVAL_BYTES = 4096  # Kafka's log.index.interval.bytes


class KafkaIndexBuilder:
    """The ``.index`` and ``.timeindex`` Kafka would write for a segment of ``base_offset`` holding the batches
    passed to :meth:`add`, in file order, at the given positions of that segment.

    As ``LogSegment.append`` (Kafka 4.x): before a batch, when more than ``index_interval_bytes`` were appended since
    the last entry, the offset index gets (the batch's last offset, its position) and the time index gets (the
    largest timestamp so far, the last offset of the batch holding it) if that timestamp is larger than its last
    entry's. :meth:`time_index` adds the entry Kafka appends when a segment rolls (the largest timestamp of all).
    """

    def __init__(self, base_offset: int, index_interval_bytes: int = DEFAULT_INDEX_INTERVAL_BYTES) -> None:
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self._offsets = bytearray()
        self._times = bytearray()
        self._since_last = 0
        self._max_ts = -1
        self._max_ts_offset = -1
        self._last_time_entry = -1  # the timestamp of the time index's last entry

    def _relative(self, offset: int) -> int:
        rel = offset - self.base_offset
        if not 0 <= rel <= 0x7FFFFFFF:
            raise ValueError(f"offset {offset} is not within a segment of base offset {self.base_offset}")
        return rel

    def add(self, header: BatchHeader, position: int) -> None:
        """One batch at ``position`` of the segment (``header.position`` is ignored: it is the source file's)."""
        if header.max_timestamp > self._max_ts:
            self._max_ts, self._max_ts_offset = header.max_timestamp, header.last_offset
        if self._since_last > self.index_interval_bytes:
            self._offsets += OFFSET_ENTRY.pack(self._relative(header.last_offset), position)
            self._append_time()
            self._since_last = 0
        self._since_last += header.size_bytes

    def _append_time(self) -> None:
        if self._max_ts > self._last_time_entry:
            self._times += TIME_ENTRY.pack(self._max_ts, self._relative(self._max_ts_offset))
            self._last_time_entry = self._max_ts

    def offset_index(self) -> bytes:
        return bytes(self._offsets)

    def time_index(self) -> bytes:
        """The time index as a rolled segment has it (with the entry of the roll)."""
        self._append_time()
        return bytes(self._times)
