"""Reads of remote offsets: what a consumer would fetch, served from the remote tier.

The sidecar answers for the remote tier what the broker answers for its local log:

- :meth:`RemoteReader.read`: records from the batch holding an offset onward, across segment boundaries, with
  ``read_committed`` isolation dropping aborted records through the uploaded transaction indexes (control
  batches are never returned, as a Kafka consumer never surfaces them);
- :meth:`RemoteReader.earliest_offset` / :meth:`latest_offset`: the ListOffsets answers for the remote tier;
- :meth:`RemoteReader.offset_for_timestamp`: the first offset whose timestamp is >= T (the first batch whose max
  timestamp is >= T, through the ledger index: one index read, then one block; then its records) and its leader
  epoch.

Only the remote chain is read: COPY_SEGMENT_FINISHED segments of one leader-epoch lineage, never two copies of
one offset (:mod:`rlm.chain`). A block range of one data object is one ranged GET that streams
the following blocks too (sequential reads need no further request per block); ledger indexes are cached by the
storage manager (LRU), so a warm random read costs one request.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

from rlm import metrics
from rlm.chain import remote_chain
from rlm.segments import to_rsm
from rlmm.api import RemoteLogMetadataManager, RemoteLogSegmentMetadata, TopicIdPartition
from rsm.api import IndexType, RemoteSegmentMetadata
from rsm.errors import RemoteResourceNotFoundError
from rsm.format.reader import EntryView, SegmentReader
from rsm.log.batch import BatchHeader, header_from_bytes
from rsm.log.indexes import AbortedTxn, parse_txn_index
from rsm.log.records import iter_raw_records
from rsm.manager import RemoteStorageManager

__all__ = [
    "OffsetOutOfRangeError",
    "RemoteReader",
    "RemoteRecord",
    "is_aborted",
    "iter_segment_batches",
    "read_txn_index",
    "txn_search",
]

log = logging.getLogger(__name__)

Isolation = Literal["read_uncommitted", "read_committed"]


class OffsetOutOfRangeError(LookupError):
    """The offset is not in the remote tier (below the earliest or above the latest remote offset)."""


@dataclass(frozen=True, slots=True)
class RemoteRecord:
    topic: str
    partition: int
    offset: int
    timestamp: int
    timestamp_type: int  # 0 CreateTime, 1 LogAppendTime (Spark's Kafka source numbering)
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    leader_epoch: int


class RemoteReader:
    def __init__(self, rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager) -> None:
        self.rlmm = rlmm
        self.rsm = rsm

    # ----------------------------------------------------------------------------------------- listings
    def segments(self, tp: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        """The segments served for ``tp``: the remote chain (:func:`rlm.chain.remote_chain`), by start offset."""
        return remote_chain(self.rlmm.list_remote_log_segments(tp))

    def earliest_offset(self, tp: TopicIdPartition) -> int | None:
        segs = self.segments(tp)
        return segs[0].start_offset if segs else None

    def latest_offset(self, tp: TopicIdPartition) -> int | None:
        """The last offset that is remote (inclusive): the latest tiered offset."""
        segs = self.segments(tp)
        return segs[-1].end_offset_inclusive if segs else None

    def offset_for_timestamp(self, tp: TopicIdPartition, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, leader epoch) of the first record whose timestamp is >= ``timestamp_ms``, or None: the
        first batch whose max timestamp is >= T, then the first record in it at or after T (as Kafka's
        ListOffsets; a LogAppendTime batch's records all carry its max timestamp)."""
        for md in self.segments(tp):
            if md.max_timestamp_ms < timestamp_ms:
                continue
            reader = self.rsm.reader(to_rsm(md))
            entry = reader.find_timestamp(timestamp_ms)
            if entry is None:
                continue
            offset = max(entry.base_offset, md.start_offset)
            h = header_from_bytes(entry.data, entry.log_position, reader.keys.base)
            if not h.timestamp_type:  # CreateTime: the records' own timestamps
                offset = next((r.offset for r in iter_raw_records(h, entry.data, path=reader.keys.base)
                               if r.offset >= offset and r.timestamp >= timestamp_ms), offset)
            return offset, _epoch_of(md, offset)
        return None

    # -------------------------------------------------------------------------------------------- reads
    def _aborted(self, segs: list[RemoteLogSegmentMetadata], i: int,
                 cache: dict[int, list[AbortedTxn]]) -> list[AbortedTxn]:
        """Aborted transactions that may cover records of ``segs[i]`` (see :func:`txn_search`)."""
        def entries(j: int) -> list[AbortedTxn]:
            if j not in cache:
                cache[j] = read_txn_index(self.rsm, to_rsm(segs[j]))
            return cache[j]

        md = segs[i]
        return [t for j in txn_search(segs, i, entries) for t in entries(j)
                if t.first_offset <= md.end_offset_inclusive and t.last_offset >= md.start_offset]

    def read(self, tp: TopicIdPartition, from_offset: int, *, max_bytes: int | None = None,
             max_records: int | None = None, isolation: Isolation = "read_uncommitted",
             to_offset_inclusive: int | None = None) -> Iterator[RemoteRecord]:
        """Records from ``from_offset`` on, in offset order, across segments.

        ``max_bytes`` bounds the batch bytes read (at least one batch is always returned, as Kafka does);
        raises :class:`OffsetOutOfRangeError` when ``from_offset`` is outside the remote tier.
        """
        started = time.monotonic()
        segs = self.segments(tp)
        if not segs or from_offset > segs[-1].end_offset_inclusive or from_offset < segs[0].start_offset:
            lo = segs[0].start_offset if segs else None
            hi = segs[-1].end_offset_inclusive if segs else None
            raise OffsetOutOfRangeError(f"{tp}: offset {from_offset} is not remote (remote offsets: {lo}..{hi})")
        i = bisect.bisect_left([m.end_offset_inclusive for m in segs], from_offset)
        read_bytes = 0
        n_records = 0
        txn_cache: dict[int, list[AbortedTxn]] = {}
        try:
            for si in range(i, len(segs)):
                md = segs[si]
                if to_offset_inclusive is not None and md.start_offset > to_offset_inclusive:
                    return
                aborted = self._aborted(segs, si, txn_cache) if isolation == "read_committed" else []
                reader = self.rsm.reader(to_rsm(md))
                want = max(from_offset, md.start_offset)
                key = reader.keys.base
                for h, entry, visible in iter_segment_batches(reader, want, md.end_offset_inclusive, aborted=aborted):
                    if max_bytes is not None and read_bytes > 0 and read_bytes + h.size_bytes > max_bytes:
                        return
                    read_bytes += h.size_bytes
                    metrics.BYTES_READ.labels(tp.topic).inc(h.size_bytes)
                    if not visible:
                        continue
                    ts_type = 1 if h.timestamp_type else 0
                    for r in iter_raw_records(h, entry.data, path=key):
                        off = r.offset
                        if off < want or off > md.end_offset_inclusive:
                            continue
                        if to_offset_inclusive is not None and off > to_offset_inclusive:
                            return
                        hdrs = r.headers
                        yield RemoteRecord(tp.topic, tp.partition, off, r.timestamp, ts_type, r.key, r.value,
                                           tuple(hdrs) if hdrs else (), h.partition_leader_epoch)
                        n_records += 1
                        if max_records is not None and n_records >= max_records:
                            return
        finally:
            metrics.READ_SECONDS.observe(time.monotonic() - started)


def iter_segment_batches(reader: SegmentReader, from_offset: int, end_offset_inclusive: int, *,
                         aborted: Sequence[AbortedTxn] = (), first_block: int | None = None,
                         last_block: int | None = None) -> Iterator[tuple[BatchHeader, EntryView, bool]]:
    """The verified batches of one remote segment that hold offsets ``from_offset..end_offset_inclusive``, in
    order: ``(header, entry, visible)``, where ``visible`` says a consumer sees the batch's records (it is not a
    control batch and not in one of the ``aborted`` transactions: pass those only for read_committed).

    Reads blocks ``first_block..last_block`` (default: from the block holding ``from_offset`` to the last) with
    one ranged GET per data object; the caller still drops records below ``from_offset`` inside the first batch.
    Shared by :meth:`RemoteReader.read` and the Spark executors (:mod:`rlm.spark`).
    """
    if first_block is None:
        block = reader.ledger.block_for_offset(from_offset)
        if block is None:
            return
        first_block = block.part_id
    key = reader.keys.base
    for entry in reader.iter_entries(first_block, last_block):
        h = header_from_bytes(entry.data, entry.log_position, key)
        if h.last_offset < from_offset:
            continue
        if h.base_offset > end_offset_inclusive:
            return
        visible = not h.is_control and not (
            aborted and h.is_transactional and is_aborted(aborted, h.producer_id, h.base_offset))
        yield h, entry, visible


def txn_search(segs: Sequence[RemoteLogSegmentMetadata], i: int,
               entries: Callable[[int], Sequence[AbortedTxn]]) -> list[int]:
    """Indexes ``j >= i`` of the segments whose transaction indexes may list aborted transactions covering records
    of ``segs[i]``, searched as Kafka does: an abort is indexed in the segment of its marker, which can be any later
    segment, so the search goes on through later segments (``entries(j)`` reads one's index; segments whose index
    is empty are skipped unread) until an entry whose last stable offset is past ``segs[i]``'s end: every
    transaction that began in ``segs[i]`` had ended when that marker was written, its own marker at or before it.

    Bounded by offsets and producer state, never by record timestamps (producers set those). When no entry
    completes the search, every later segment's index is read.
    """
    end = segs[i].end_offset_inclusive
    out: list[int] = []
    for j in range(i, len(segs)):
        if segs[j].txn_index_empty:
            continue
        out.append(j)
        if any(t.last_stable_offset > end for t in entries(j)):
            break
    return out


def read_txn_index(rsm: RemoteStorageManager, md: RemoteSegmentMetadata) -> list[AbortedTxn]:
    """The aborted transactions of a remote segment's transaction index (none when it has no index)."""
    try:
        with rsm.fetch_index(md, IndexType.TRANSACTION) as f:
            return parse_txn_index(f.read(), f"{md.remote_segment_id} transaction index")
    except RemoteResourceNotFoundError:
        return []


def is_aborted(aborted: Sequence[AbortedTxn], producer_id: int, offset: int) -> bool:
    """Whether the batch of ``producer_id`` at ``offset`` belongs to one of the ``aborted`` transactions."""
    return any(t.producer_id == producer_id and t.first_offset <= offset <= t.last_offset for t in aborted)


def _epoch_of(md: RemoteLogSegmentMetadata, offset: int) -> int:
    epoch = md.segment_leader_epochs[0][0]
    for e, start in md.segment_leader_epochs:
        if start <= offset:
            epoch = e
    return epoch
