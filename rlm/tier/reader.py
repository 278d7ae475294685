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
one offset (:mod:`rlm.tier.chain`). A block range of one data object is one ranged GET that streams
the following blocks too (sequential reads need no further request per block); ledger indexes are cached by the
storage manager (LRU), so a warm random read costs one request.

Every read goes through the storage manager's read interface (:meth:`rsm.api.RemoteStorageManagerApi.open_segment`,
:class:`rsm.api.SegmentHandle`), never the object format. What a consumer sees of a segment is decided in one
place, :func:`iter_segment_batches` (offset range, control batches, aborted transactions), and the aborted
transactions that matter in one other, :class:`TxnIndexes` (which segments' indexes: :func:`txn_search`; which of
their entries: :func:`aborted_covering`); the Spark source and the tier view (:mod:`rlm.tier.view`) use both.
The leader epoch of a record found by timestamp is its segment's
(:meth:`rlmm.api.RemoteLogSegmentMetadata.epoch_at`).
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass

from rlm import metrics
from rlm.errors import RlmError
from rlm.tier.chain import remote_chain
from rlm.tier.isolation import Isolation
from rlm.tier.segments import to_rsm
from rlmm.api import RemoteLogMetadataManager, RemoteLogSegmentMetadata, TopicIdPartition
from rsm.api import LargeBatch, RemoteStorageManagerApi, SegmentHandle
from rsm.log.batch import BatchHeader, Codec
from rsm.log.indexes import AbortedTxn
from rsm.log.records import StreamedRecord, iter_raw_records, iter_streamed_records

__all__ = [
    "LargeRemoteRecord",
    "OffsetOutOfRangeError",
    "RemoteReader",
    "RemoteRecord",
    "TxnIndexes",
    "aborted_covering",
    "is_aborted",
    "iter_segment_batches",
    "record_times",
    "txn_search",
]

log = logging.getLogger(__name__)


class OffsetOutOfRangeError(RlmError, LookupError):
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


class LargeRemoteRecord:
    """A record whose value is too large to hold (over :data:`rsm.log.records.INLINE_VALUE_BYTES`, in a batch
    stored as fragments): as :class:`RemoteRecord`, but the value is :meth:`value_chunks` (``value_size`` bytes) and
    the headers :meth:`headers` (they follow the value in the batch). Both must be taken before the next record is
    asked for (:meth:`RemoteReader.read` with ``large``)."""

    __slots__ = ("key", "leader_epoch", "offset", "partition", "record", "timestamp", "timestamp_type", "topic")

    def __init__(self, topic: str, partition: int, record: StreamedRecord, timestamp_type: int,
                 leader_epoch: int) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = record.offset
        self.timestamp = record.timestamp
        self.timestamp_type = timestamp_type
        self.key = record.key
        self.leader_epoch = leader_epoch
        self.record = record

    @property
    def value_size(self) -> int:
        return self.record.value_size

    def value_chunks(self) -> Iterator[memoryview]:
        """The value's bytes, in chunks (each valid until the next is asked for); once."""
        return self.record.value_chunks()

    def headers(self) -> tuple[tuple[str, bytes | None], ...]:
        return tuple(self.record.headers())


class RemoteReader:
    def __init__(self, rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManagerApi) -> None:
        self.rlmm = rlmm
        self.rsm = rsm

    # ----------------------------------------------------------------------------------------- listings
    def segments(self, tp: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        """The segments served for ``tp``: the remote chain (:func:`rlm.tier.chain.remote_chain`), by start offset."""
        return remote_chain(self.rlmm.list_remote_log_segments(tp))

    def earliest_offset(self, tp: TopicIdPartition) -> int | None:
        segs = self.segments(tp)
        return segs[0].start_offset if segs else None

    def latest_offset(self, tp: TopicIdPartition) -> int | None:
        """The last offset that is remote (inclusive): the latest tiered offset."""
        segs = self.segments(tp)
        return segs[-1].end_offset_inclusive if segs else None

    def offset_for_timestamp(self, tp: TopicIdPartition, timestamp_ms: int) -> tuple[int, int] | None:
        """(offset, leader epoch) of the first record whose timestamp is >= ``timestamp_ms``, or None
        (:meth:`find_timestamp`)."""
        hit = self.find_timestamp(tp, timestamp_ms)
        return None if hit is None else (hit[0], hit[1])

    def find_timestamp(self, tp: TopicIdPartition, timestamp_ms: int) -> tuple[int, int, int] | None:
        """(offset, leader epoch, timestamp) of the first record whose timestamp is >= ``timestamp_ms``, or None:
        the first batch whose max timestamp is >= T, then the first record in it at or after T (as Kafka's
        ListOffsets; a LogAppendTime batch's records all carry its max timestamp)."""
        for md in self.segments(tp):
            if md.max_timestamp_ms < timestamp_ms:
                continue
            seg = self.rsm.open_segment(to_rsm(md))
            block = seg.block_at_timestamp(timestamp_ms)
            if block is None:
                continue
            with closing(seg.batches(block.first_offset, md.end_offset_inclusive, first_block=block.first_block,
                                     large=True)) as batches:
                for h, data in batches:  # the first batch from the block on whose max timestamp is >= T
                    if h.max_timestamp < timestamp_ms:
                        continue
                    offset, ts = max(h.base_offset, md.start_offset), h.max_timestamp
                    if not h.timestamp_type:  # CreateTime: the records' own timestamps
                        offset, ts = next(((o, t) for o, t in record_times(h, data, path=seg.name)
                                           if o >= offset and t >= timestamp_ms), (offset, ts))
                    return offset, md.epoch_at(offset), ts
        return None

    # -------------------------------------------------------------------------------------------- reads
    def read(self, tp: TopicIdPartition, from_offset: int, *, max_bytes: int | None = None,
             max_records: int | None = None, isolation: Isolation = Isolation.READ_UNCOMMITTED,
             to_offset_inclusive: int | None = None,
             large: bool = False) -> Iterator[RemoteRecord | LargeRemoteRecord]:
        """Records from ``from_offset`` on, in offset order, across segments.

        ``max_bytes`` bounds the batch bytes read (at least one batch is always returned, as Kafka does);
        raises :class:`OffsetOutOfRangeError` when ``from_offset`` is outside the remote tier.

        With ``large``, a batch stored as fragments (larger than a block) is read in chunks, never held whole: when
        uncompressed its records are decoded from the chunks and one whose value is over
        :data:`rsm.log.records.INLINE_VALUE_BYTES` is a :class:`LargeRemoteRecord` (its value in chunks); a
        compressed one is still decompressed whole. Without it every record is a :class:`RemoteRecord`.
        """
        started = time.monotonic()
        segs = self.segments(tp)
        if not segs or from_offset > segs[-1].end_offset_inclusive or from_offset < segs[0].start_offset:
            lo = segs[0].start_offset if segs else None
            hi = segs[-1].end_offset_inclusive if segs else None
            raise OffsetOutOfRangeError(f"{tp}: offset {from_offset} is not remote (remote offsets: {lo}..{hi})")
        i = bisect.bisect_left(segs, from_offset, key=lambda m: m.end_offset_inclusive)
        read_bytes = 0
        n_records = 0
        txns = TxnIndexes(self.rsm, segs)
        try:
            for si in range(i, len(segs)):
                md = segs[si]
                if to_offset_inclusive is not None and md.start_offset > to_offset_inclusive:
                    return
                aborted = txns.aborted(si) if isolation == Isolation.READ_COMMITTED else []
                seg = self.rsm.open_segment(to_rsm(md))
                want = max(from_offset, md.start_offset)
                key = seg.name
                for h, data, visible in iter_segment_batches(seg, want, md.end_offset_inclusive, aborted=aborted,
                                                             large=large):
                    if max_bytes is not None and read_bytes > 0 and read_bytes + h.size_bytes > max_bytes:
                        return
                    read_bytes += h.size_bytes
                    metrics.BYTES_READ.labels(tp.topic).inc(h.size_bytes)
                    if not visible:
                        continue
                    ts_type = 1 if h.timestamp_type else 0
                    if isinstance(data, LargeBatch):
                        if h.codec == Codec.NONE:
                            for sr in iter_streamed_records(h, data.chunks(), path=key):
                                off = sr.offset
                                if off < want or off > md.end_offset_inclusive:
                                    continue
                                if to_offset_inclusive is not None and off > to_offset_inclusive:
                                    return
                                if sr.streamed:
                                    yield LargeRemoteRecord(tp.topic, tp.partition, sr, ts_type,
                                                            h.partition_leader_epoch)
                                else:
                                    hdrs = sr.headers()
                                    yield RemoteRecord(tp.topic, tp.partition, off, sr.timestamp, ts_type, sr.key,
                                                       sr.value, tuple(hdrs) if hdrs else (),
                                                       h.partition_leader_epoch)
                                n_records += 1
                                if max_records is not None and n_records >= max_records:
                                    return
                            continue
                        data = memoryview(data.read())  # compressed: decoded whole
                    for r in iter_raw_records(h, data, path=key):
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


def iter_segment_batches(seg: SegmentHandle, from_offset: int, end_offset_inclusive: int, *,
                         aborted: Sequence[AbortedTxn] = (), first_block: int | None = None,
                         last_block: int | None = None,
                         large: bool = False) -> Iterator[tuple[BatchHeader, memoryview | LargeBatch, bool]]:
    """The verified batches of one remote segment that hold offsets ``from_offset..end_offset_inclusive``, in
    order: ``(header, batch bytes, visible)``, where ``visible`` says a consumer sees the batch's records (it is
    not a control batch and not in one of the ``aborted`` transactions: pass those only for read_committed).

    Reads blocks ``first_block..last_block`` (default: from the block holding ``from_offset`` to the last) with
    one ranged GET per data object; the caller still drops records outside the range inside the edge batches.
    The one decision of what a reader sees: :meth:`RemoteReader.read`, the tier view's fetches and the Spark
    executors (:mod:`rlm.spark`). With ``large``, a batch stored as fragments is a :class:`rsm.api.LargeBatch`
    (:meth:`rsm.api.SegmentHandle.batches`).
    """
    for h, data in seg.batches(from_offset, end_offset_inclusive, first_block=first_block, last_block=last_block,
                               large=large):
        yield h, data, not h.is_control and not (
            aborted and h.is_transactional and is_aborted(aborted, h.producer_id, h.base_offset))


def record_times(h: BatchHeader, data: memoryview | LargeBatch, *, path: str) -> Iterator[tuple[int, int]]:
    """``(offset, timestamp)`` of the records of one batch (as :meth:`RemoteReader.find_timestamp` and the tier
    view's MAX_TIMESTAMP look them up): decoded whole, or, for a batch read in chunks
    (:class:`~rsm.api.LargeBatch`) that is uncompressed, decoded from its chunks with the values skipped (never
    held); a compressed one is decompressed whole. Take them before the batches' iteration moves on."""
    if isinstance(data, LargeBatch):
        if h.codec == Codec.NONE:
            return ((r.offset, r.timestamp) for r in iter_streamed_records(h, data.chunks(), path=path))
        data = memoryview(data.read())
    return ((r.offset, r.timestamp) for r in iter_raw_records(h, data, path=path))


class TxnIndexes:
    """The transaction indexes of one remote chain's segments, each read at most once, through the storage
    manager: which segments' indexes matter to a segment (:func:`txn_search`) and the aborted transactions they
    list that cover it (:func:`aborted_covering`)."""

    def __init__(self, rsm: RemoteStorageManagerApi, segs: Sequence[RemoteLogSegmentMetadata]) -> None:
        self._rsm = rsm
        self.segs = segs
        self._cache: dict[int, list[AbortedTxn]] = {}

    def __call__(self, j: int) -> list[AbortedTxn]:
        """The entries of ``segs[j]``'s transaction index (none when it has none)."""
        entries = self._cache.get(j)
        if entries is None:
            entries = self._cache[j] = self._rsm.open_segment(to_rsm(self.segs[j])).aborted_transactions()
        return entries

    def search(self, i: int) -> list[int]:
        """:func:`txn_search` for ``segs[i]``."""
        return txn_search(self.segs, i, self)

    def aborted(self, i: int) -> list[AbortedTxn]:
        """The aborted transactions that may cover records of ``segs[i]``."""
        md = self.segs[i]
        return aborted_covering(md.start_offset, md.end_offset_inclusive, map(self, self.search(i)))


def aborted_covering(start_offset: int, end_offset_inclusive: int,
                     indexes: Iterable[Sequence[AbortedTxn]]) -> list[AbortedTxn]:
    """The entries of transaction ``indexes`` (those :func:`txn_search` chose) whose offsets overlap
    ``start_offset..end_offset_inclusive``: what :func:`iter_segment_batches` drops for read_committed."""
    return [t for entries in indexes for t in entries
            if t.first_offset <= end_offset_inclusive and t.last_offset >= start_offset]


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


def is_aborted(aborted: Sequence[AbortedTxn], producer_id: int, offset: int) -> bool:
    """Whether the batch of ``producer_id`` at ``offset`` belongs to one of the ``aborted`` transactions."""
    return any(t.producer_id == producer_id and t.first_offset <= offset <= t.last_offset for t in aborted)

