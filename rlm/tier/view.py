"""One partition's remote tier as a broker serves its log: the remote chain, its bounds, and fetches of its batches.

A broker answers a consumer from its log; the history endpoint (:mod:`rlm.listener`) answers from the remote tier
with the same meanings, and the streaming Spark source ends its read_committed micro-batches at the same last stable
offset. Nothing here is the Kafka protocol (the endpoint's handlers turn these values into responses):

- **log start offset**: the first offset of the remote chain (:func:`rlm.tier.chain.remote_chain`);
- **high watermark**: the latest tiered offset + 1 (everything tiered was below the broker's high watermark);
- **last stable offset**: the first offset of a transaction still undecided at the end of the tier, else the high
  watermark, never below the log start offset (as Kafka's). A read_committed consumer is served only below it. The
  tier knows which transactions were still open at its end from the producer snapshot uploaded with its last
  segment (the producer state at that segment's end: ``CurrentTxnFirstOffset`` of each producer with a transaction
  under way). A transaction decided after that segment was copied keeps the bound until the segment holding its
  marker is tiered: late, never wrong. Without a snapshot the open transactions are found by walking the tier's
  batch headers from the newest segment that has one (or from the tier's start): transactional batches open a
  producer's transaction, its control batch ends it.

A fetch returns whole batches as stored, control and aborted batches included, as a broker does; the consumer
drops them. They are views of the blocks they were read into, not joined (:class:`rsm.log.batch.RecordParts`, whose
docstring has the contract with the writer). For read_committed the aborted transactions overlapping the batches
returned come with them, from the uploaded transaction indexes (:class:`rlm.tier.reader.TxnIndexes`, Kafka's search
rule). The batches are the segment's (:meth:`rsm.api.SegmentHandle.batches`), read as every other reader reads them
(:func:`rlm.tier.reader.iter_segment_batches`, which also decides what a consumer sees: here the client does).
The leader epoch of an offset is :meth:`rlmm.api.RemoteLogSegmentMetadata.epoch_at` of the chain segment holding it
(:meth:`PartitionTier.epoch_of`).

A batch too large to hold (stored as fragments, PDP-43) is not read into a fetch's answer: the answer carries it as
a :class:`StreamedBatch` (its size, and where to read it), which the listener (endpoint or proxy) reads again and
writes to the socket a chunk at a time; such a batch is the only one of its partition in an answer.

A copy that cannot be read (a key id no longer configured, a corrupt object, a store error) raises
:class:`UnreadableCopyError` naming the partition, the segment and the cause: the endpoint answers that partition
with an error and serves the others.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from typing import Any

from rlm import metrics
from rlm.errors import RlmError
from rlm.tier.chain import Lineage, lineage_of
from rlm.tier.isolation import Isolation
from rlm.tier.reader import RemoteReader, TxnIndexes, iter_segment_batches, record_times
from rlm.tier.segments import to_rsm
from rlmm.api import RemoteLogSegmentMetadata, TopicIdPartition
from rsm.api import LargeBatch, RemoteStorageManagerApi, SegmentHandle
from rsm.errors import RemoteStorageError
from rsm.log.batch import BATCH_HEADER_SIZE, BatchHeader, RecordParts
from rsm.log.errors import LogFormatError

__all__ = ["Decided", "FetchResult", "PartitionTier", "StreamedBatch", "TierView", "TimestampHit",
           "UnreadableCopyError"]

HANDLES = 64  # segments' handles kept for fetches: each pins its copy's index (the manager's index cache holds it too)
FIRST_BATCH_CACHE = 16_384  # (partition, offset) -> size of a batch that did not fit: entries kept (about 2 MiB)


UNREADABLE = (RemoteStorageError, LogFormatError)  # what reading a copy raises when the copy cannot be read


class UnreadableCopyError(RlmError):
    """A remote copy of the partition's tier cannot be read: a key id no longer configured, a corrupt object, a
    store error (``cause``). The requests that needed it answer that partition with KAFKA_STORAGE_ERROR; the other
    partitions are served. An operator reads the key and the reason from the log line and re-copies the segment
    (from a replica that still has it) or deletes the copy; a store error may pass by itself."""

    def __init__(self, tp: TopicIdPartition, segment: RemoteLogSegmentMetadata | None, cause: Exception) -> None:
        self.tp = tp
        self.segment = segment
        self.cause = cause
        self.key: str | None = getattr(cause, "key", None)
        what = f"segment {segment.remote_log_segment_id.id} ({segment.start_offset}..{segment.end_offset_inclusive})" \
            if segment is not None else "a segment"
        super().__init__(f"{tp}: {what} cannot be read: {type(cause).__name__}: {cause}")

    @property
    def copy_id(self) -> str:
        """What identifies the copy (once-per-copy logging): its segment id, else the object key, else the tp."""
        if self.segment is not None:
            return str(self.segment.remote_log_segment_id.id)
        return self.key or str(self.tp)


@contextmanager
def _reading(tp: TopicIdPartition, segment: RemoteLogSegmentMetadata | None) -> Iterator[None]:
    try:
        yield
    except UNREADABLE as err:
        raise UnreadableCopyError(tp, segment, err) from err


def _end_offset(md: RemoteLogSegmentMetadata) -> int:
    return md.end_offset_inclusive


@dataclass(frozen=True, slots=True)
class PartitionTier:
    """One partition's remote chain and its bounds at one moment."""

    tp: TopicIdPartition
    segments: tuple[RemoteLogSegmentMetadata, ...]
    log_start_offset: int
    high_watermark: int
    last_stable_offset: int

    @property
    def latest_epoch(self) -> int:
        """The leader epoch of the tier's newest offset."""
        last = self.segments[-1]
        return last.epoch_at(last.end_offset_inclusive)

    def epoch_of(self, offset: int) -> int:
        """The leader epoch of ``offset``: that of the chain segment holding it (the first segment's first epoch
        for offsets below the tier, the newest epoch for offsets past it)."""
        i = min(self.index_of(offset), len(self.segments) - 1)
        return self.segments[i].epoch_at(offset)

    @property
    def lineage(self) -> Lineage:
        """The leader epochs of the chain, each from its first offset in it."""
        return lineage_of(self.segments)

    def end_offset(self, isolation: Isolation) -> int:
        """Where a reader at ``isolation`` stops (exclusive): the last stable offset for read_committed, else the
        high watermark."""
        return self.last_stable_offset if isolation == Isolation.READ_COMMITTED else self.high_watermark

    def index_of(self, offset: int) -> int:
        """The index of the segment holding ``offset`` (which must be in the tier), or of the first one after it
        when ``offset`` is in a gap. O(log n), no list of the n segments' ends built (a Fetch looks twice: that cost
        0.8 ms each with 10,000 segments)."""
        return bisect.bisect_left(self.segments, offset, key=_end_offset)

    def gap_at(self, offset: int) -> tuple[int, int] | None:
        """The chain's gap ``(first, last)`` holding ``offset`` (offsets no segment holds: lost from the tier), or
        None."""
        i = self.index_of(offset)
        if 0 < i < len(self.segments) and offset < self.segments[i].start_offset:
            return self.segments[i - 1].end_offset_inclusive + 1, self.segments[i].start_offset - 1
        return None


class StreamedBatch:
    """A batch of a fetch's answer that is too large to hold (a :class:`rsm.api.LargeBatch` when it was met): its
    size, and :meth:`chunks`, which reads it again from the store a chunk (a fragment) at a time, each verified
    before it is handed out (the listener, endpoint and proxy alike, writes it so). ``bytes()`` of it reads it whole."""

    __slots__ = ("_first_block", "_last_block", "_rsm", "_segment", "header", "tp")

    def __init__(self, tp: TopicIdPartition, rsm: RemoteStorageManagerApi, segment: RemoteLogSegmentMetadata,
                 header: BatchHeader, first_block: int, last_block: int | None) -> None:
        self.tp = tp
        self._rsm = rsm
        self._segment = segment
        self.header = header
        self._first_block = first_block
        self._last_block = last_block

    def __len__(self) -> int:
        return self.header.size_bytes

    def chunks(self) -> Iterator[memoryview]:
        """The batch's bytes, in order, read from the store as they are asked for. Raises
        :class:`UnreadableCopyError` when the copy cannot be read (then what was handed out is all there is)."""
        h = self.header
        with _reading(self.tp, self._segment):
            seg = self._rsm.open_segment(to_rsm(self._segment))
            with closing(iter_segment_batches(seg, h.base_offset, h.last_offset, first_block=self._first_block,
                                              last_block=self._last_block, large=True)) as batches:
                for got, data, _visible in batches:
                    if got.base_offset != h.base_offset:
                        continue
                    if got.size_bytes != h.size_bytes or got.crc != h.crc:
                        raise RemoteStorageError(f"the batch at offset {h.base_offset} changed since it was planned")
                    yield from (data.chunks() if isinstance(data, LargeBatch) else (data,))
                    return
            raise RemoteStorageError(f"the batch at offset {h.base_offset} is no longer in its copy")

    def __bytes__(self) -> bytes:
        return b"".join(bytes(c) for c in self.chunks())


@dataclass(slots=True)
class FetchResult:
    """What one partition contributes to a Fetch response."""

    error: str | None = None  # None, "offset_out_of_range", "offset_not_available"
    gap: tuple[int, int] | None = None  # with "offset_out_of_range": the chain's gap (first, last) holding the offset
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    # the whole batches, as stored, one after the other (views of the blocks read: RecordParts); or one batch too
    # large to hold, read when the answer is written
    records: bytes | bytearray | RecordParts | StreamedBatch = field(default_factory=bytearray)
    size: int = 0
    aborted: list[tuple[int, int]] | None = None  # (producer id, first offset), for read_committed


@dataclass(frozen=True, slots=True)
class Decided:
    """What the log's holder (the broker a listener proxies) says of transactions, for a read_committed fetch of the
    tier: its ``last_stable_offset`` (every transaction that began below it is decided) and the transactions it
    aborted that may cover the tier's records, ``aborted``: ``(producer id, first offset)``, as a Fetch answer
    lists them."""

    last_stable_offset: int
    aborted: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class TimestampHit:
    offset: int
    timestamp: int
    leader_epoch: int


class TierView:
    """The remote tier as the endpoint serves it. Thread-safe; a partition's chain is computed at most once per
    ``ttl_s`` (so a stream of fetches costs no metadata scan each), and again at once by :meth:`refresh`."""

    def __init__(self, reader: RemoteReader, *, ttl_s: float = 0.5) -> None:
        self.reader = reader
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._cache: dict[TopicIdPartition, tuple[float, PartitionTier | None]] = {}
        # (tp, newest segment id) -> {producer id: first offset of its open transaction} at the tier's end
        self._open_txns: dict[tuple[TopicIdPartition, object], dict[int, int]] = {}
        # (tp, fetch offset) -> bytes of the batch holding it, learned when it did not fit a fetch's room: the same
        # ask with no more room is answered without reading its block again (batches in the tier never change).
        self._first_batch_bytes: OrderedDict[tuple[TopicIdPartition, int], int] = OrderedDict()
        self._bytes_read_of: dict[str, Any] = {}  # topic -> its rlm_bytes_read child
        self._handles: OrderedDict[object, SegmentHandle] = OrderedDict()  # segment id -> its handle (_open)

    def refresh(self, tps: Iterable[TopicIdPartition]) -> None:
        with self._lock:
            for tp in tps:
                self._cache.pop(tp, None)

    def ready(self, tp: TopicIdPartition) -> bool:
        """Whether the partition's tier is known: its metadata read up to where it was when the metadata manager
        began serving it (:meth:`rlmm.api.RemoteLogMetadataManager.is_ready`). Before, a tier that is empty or ends
        early may only not be read yet: asked before :meth:`partition`, true means its answer is complete as of then
        (a chain read before is not kept)."""
        return self.reader.rlmm.is_ready(tp)

    def partition(self, tp: TopicIdPartition) -> PartitionTier | None:
        """The partition's tier now, or None when nothing of it is remote (or, before :meth:`ready`, nothing read
        yet)."""
        now = time.monotonic()
        with self._lock:
            hit = self._cache.get(tp)
        if hit is not None and now - hit[0] < self.ttl_s:
            return hit[1]
        known = self.ready(tp)  # before the read: a chain read before its metadata is caught up is not kept
        segs = tuple(self.reader.segments(tp))
        tier = None
        if segs:
            hwm = segs[-1].end_offset_inclusive + 1
            open_txns = self._open_transactions(tp, segs)
            # Never below the log start offset (Kafka's UnifiedLog.updateFirstUnstableOffset does the same): a
            # transaction whose first records remote retention expired would otherwise hide the whole tier.
            lso = max(min([hwm, *open_txns.values()]), segs[0].start_offset)
            tier = PartitionTier(tp, segs, segs[0].start_offset, hwm, lso)
        if known:
            with self._lock:
                self._cache[tp] = (now, tier)
        return tier

    # --------------------------------------------------------------------------------------------- fetch
    def fetch(self, tp: TopicIdPartition, offset: int, max_bytes: int, *,
              isolation: Isolation = Isolation.READ_UNCOMMITTED, at_least_one: bool = True,
              decided: Decided | None = None) -> FetchResult:
        """Whole batches from the one holding ``offset`` on, up to ``max_bytes`` (the first batch even past it when
        ``at_least_one``: Kafka's rule for the first partition of a response with data), below the high watermark
        (read_uncommitted) or the last stable offset (read_committed).

        ``decided``: for read_committed, what the log's holder (a proxied broker) knows of transactions the tier
        may not have seen decided (their markers not tiered yet): reads go up to the lower of the tier's high
        watermark and the holder's last stable offset, and the holder's aborted transactions are sent with the
        tier's. Pass it only when the holder's last stable offset is above its log start offset (Kafka raises a last
        stable offset below the log start to it: equal, a transaction begun below may still be open).

        Nothing is read from the store when no batch can be sent: ``max_bytes`` below a batch header
        (:data:`~rsm.log.batch.BATCH_HEADER_SIZE`, 61 bytes) without ``at_least_one``, or once the bytes taken
        reach ``max_bytes``; the bounds then come from the metadata alone. Blocks are planned within what is left
        (:meth:`~rsm.api.SegmentHandle.block_plan`), so the one block read that may send nothing is one whose
        first batch turns out larger than the room (the index knows block sizes, not batch sizes): that size is
        remembered for the partition and offset, and the same ask with no more room is not read again."""
        tier = self.partition(tp)
        if tier is None:
            return FetchResult(error="offset_not_available")
        out = FetchResult(high_watermark=tier.high_watermark, last_stable_offset=tier.last_stable_offset,
                          log_start_offset=tier.log_start_offset)
        if offset < tier.log_start_offset or offset > tier.high_watermark:
            out.error = "offset_out_of_range"
            return out
        gap = tier.gap_at(offset)
        if gap is not None:  # lost from the tier: as Kafka's remote read of an offset no segment holds
            out.error, out.gap = "offset_out_of_range", gap
            return out
        bound = tier.end_offset(isolation)
        if isolation == Isolation.READ_COMMITTED:
            out.aborted = []
            if decided is not None:
                bound = min(tier.high_watermark, decided.last_stable_offset)
        if offset >= bound or not self._room(max_bytes, out.size, at_least_one):
            return out
        if not at_least_one:
            with self._lock:
                known = self._first_batch_bytes.get((tp, offset))
            if known is not None and known > max_bytes:
                return out  # read before, and it did not fit then either
        segs = tier.segments
        txns = TxnIndexes(self.reader.rsm, segs) if isolation == Isolation.READ_COMMITTED else None
        last_offset = offset - 1
        full = False
        current: RemoteLogSegmentMetadata | None = None
        started, read = time.monotonic(), False
        pieces: list[memoryview] = []  # the batches, views of the blocks read
        try:
            first = tier.index_of(offset)
            for si in range(first, len(segs)):
                md = current = segs[si]
                if md.start_offset >= bound or full or not self._room(max_bytes, out.size, at_least_one):
                    break
                if si > first and md.start_offset > segs[si - 1].end_offset_inclusive + 1:
                    break  # a gap: never crossed silently (the next fetch, inside it, is out of range)
                seg = self._open(md)
                want = max(offset, md.start_offset)
                end = min(md.end_offset_inclusive, bound - 1)
                budget = max(max_bytes - out.size, 1)
                plan = seg.block_plan(want, end, budget, runs=1)
                if not plan:
                    continue
                read = True
                # the segment's batches as stored, control ones included (visibility is the consumer's): not
                # through iter_segment_batches, whose visibility per batch this answer does not use (a generator
                # and a tuple fewer per batch: ~64,000 a GiB of 16 KiB batches)
                batches = seg.batches(want, end, first_block=plan[0].first_block, last_block=plan[0].last_block,
                                      large=True)
                with closing(batches):
                    for h, data in batches:
                        if h.last_offset < want:
                            continue
                        if h.base_offset >= bound:
                            full = True
                            break
                        if out.size + h.size_bytes > max_bytes and (out.size or not at_least_one):
                            if not out.size:
                                self._remember_first_batch(tp, offset, h.size_bytes)
                            full = True
                            break
                        if isinstance(data, LargeBatch):  # alone in the partition's answer, read when it is sent
                            if out.size:
                                full = True
                                break
                            out.records = StreamedBatch(tp, self.reader.rsm, md, h, plan[0].first_block,
                                                        plan[0].last_block)
                            out.size = h.size_bytes
                            last_offset = h.last_offset
                            full = True
                            break
                        pieces.append(data)  # type: ignore[arg-type]
                        out.size += h.size_bytes
                        last_offset = h.last_offset
                if txns is not None and last_offset >= md.start_offset:
                    seen = set(out.aborted or ())
                    for t in txns.aborted(si):
                        if t.first_offset <= last_offset and t.last_offset >= offset:
                            key = (t.producer_id, t.first_offset)
                            if key not in seen:
                                seen.add(key)
                                out.aborted.append(key)  # type: ignore[union-attr]
                if decided is not None and out.aborted is not None and last_offset >= md.start_offset:
                    seen = set(out.aborted)
                    out.aborted += [t for t in decided.aborted if t[1] <= last_offset and t not in seen]
                if last_offset < end and not full:
                    full = True  # the plan's byte budget ended inside this segment
        except UNREADABLE as err:
            raise UnreadableCopyError(tp, current, err) from err
        if pieces:  # views of the blocks read, not joined (rsm.log.batch.RecordParts: the writer's contract)
            out.records = RecordParts(pieces, out.size, last_offset)
        if read:  # the remote reads' metrics, as the reader counts its own (rlm_bytes_read, rlm_read_seconds)
            self._bytes_read(tp.topic).inc(out.size)
            metrics.READ_SECONDS.observe(time.monotonic() - started)
        return out

    def _open(self, md: RemoteLogSegmentMetadata) -> SegmentHandle:
        """The copy's handle, opened once and kept while it is among the :data:`HANDLES` last read: a history
        Fetch reads the same segment again and again, and opening it (its keys built, its index looked up in the
        storage manager's cache) was ~0.1 ms per partition per Fetch, a tenth of the tier read. A copy's handle never
        goes stale: a copy's bytes never change (a new copy is a new segment id), and a deleted one leaves the chain."""
        key = md.remote_log_segment_id.id
        with self._lock:
            seg = self._handles.get(key)
            if seg is not None:
                self._handles.move_to_end(key)
                return seg
        seg = self.reader.rsm.open_segment(to_rsm(md))
        with self._lock:
            self._handles[key] = seg
            while len(self._handles) > HANDLES:
                self._handles.popitem(last=False)
        return seg

    def _bytes_read(self, topic: str) -> Any:
        """``rlm_bytes_read`` of ``topic``, its child kept (``labels()`` cost ~12 us a call, asked per partition
        per Fetch)."""
        child = self._bytes_read_of.get(topic)
        if child is None:
            child = self._bytes_read_of[topic] = metrics.BYTES_READ.labels(topic)
        return child

    def _remember_first_batch(self, tp: TopicIdPartition, offset: int, size: int) -> None:
        with self._lock:
            self._first_batch_bytes[(tp, offset)] = size
            self._first_batch_bytes.move_to_end((tp, offset))
            while len(self._first_batch_bytes) > FIRST_BATCH_CACHE:
                self._first_batch_bytes.popitem(last=False)

    @staticmethod
    def _room(max_bytes: int, taken: int, at_least_one: bool) -> bool:
        """Whether a batch may still be sent: the first one of an ``at_least_one`` fetch always may; otherwise at
        least a batch header's bytes must be left."""
        return (at_least_one and taken == 0) or max_bytes - taken >= BATCH_HEADER_SIZE

    # ----------------------------------------------------------------------------------------- offsets
    def offset_for_timestamp(self, tp: TopicIdPartition, timestamp_ms: int) -> TimestampHit | None:
        """The first record whose timestamp is >= ``timestamp_ms`` (Kafka's ListOffsets by timestamp)."""
        with _reading(tp, None):
            hit = self.reader.find_timestamp(tp, timestamp_ms)
        return None if hit is None else TimestampHit(hit[0], hit[2], hit[1])

    def max_timestamp(self, tp: TopicIdPartition) -> TimestampHit | None:
        """The record with the largest timestamp (the first of several), as ListOffsets' MAX_TIMESTAMP (-3)."""
        tier = self.partition(tp)
        if tier is None:
            return None
        md = max(tier.segments, key=lambda m: m.max_timestamp_ms)  # first of equals: max() keeps the first
        with _reading(tp, md):
            return self._max_timestamp(tier, md)

    def _max_timestamp(self, tier: PartitionTier, md: RemoteLogSegmentMetadata) -> TimestampHit | None:
        seg = self.reader.rsm.open_segment(to_rsm(md))
        with closing(iter_segment_batches(seg, md.start_offset, md.end_offset_inclusive, large=True)) as batches:
            for h, data, _visible in batches:
                if h.max_timestamp != md.max_timestamp_ms:
                    continue
                offset = max(h.base_offset, md.start_offset)
                if not h.timestamp_type:  # CreateTime: the record that carries it
                    offset = next((o for o, t in record_times(h, data, path=seg.name)
                                   if o >= md.start_offset and t == h.max_timestamp), offset)
                return TimestampHit(offset, h.max_timestamp, tier.epoch_of(offset))
        return None

    # ---------------------------------------------------------------------------------- transactions
    def _open_transactions(self, tp: TopicIdPartition,
                           segs: tuple[RemoteLogSegmentMetadata, ...]) -> dict[int, int]:
        """Producer id -> first offset of its transaction still open at the tier's end (cached per newest
        segment: the answer changes only when the tier grows or shrinks at its end). When the tier grew, the walk
        goes on from the previous answer (offload segments of streaming mode have no producer snapshot: without
        this every new one would walk the whole tier)."""
        key = (tp, segs[-1].remote_log_segment_id.id)
        with self._lock:
            known = self._open_txns.get(key)
            previous = next(((k[1], v) for k, v in self._open_txns.items() if k[0] == tp), None)
        if known is not None:
            return known
        rsm = self.reader.rsm
        open_txns: dict[int, int] = {}
        start = 0
        ids = [md.remote_log_segment_id.id for md in segs]
        if previous is not None and previous[0] in ids:
            start = ids.index(previous[0]) + 1
            open_txns = dict(previous[1])
        else:
            for i in range(len(segs) - 1, -1, -1):
                with _reading(tp, segs[i]):
                    entries = rsm.open_segment(to_rsm(segs[i])).producer_snapshot()
                if entries is not None:
                    open_txns = {e.producer_id: e.current_txn_first_offset for e in entries
                                 if e.current_txn_first_offset >= 0}
                    start = i + 1
                    break
        for md in segs[start:]:  # no snapshot from here on: follow the batch headers
            with _reading(tp, md):
                seg = rsm.open_segment(to_rsm(md))
                with closing(seg.batches(md.start_offset, md.end_offset_inclusive, large=True)) as batches:
                    for h, _data in batches:  # headers only: a batch in fragments is never put together
                        if h.last_offset < md.start_offset or not h.is_transactional:
                            continue
                        if h.is_control:
                            open_txns.pop(h.producer_id, None)
                        else:
                            open_txns.setdefault(h.producer_id, max(h.base_offset, md.start_offset))
        with self._lock:
            self._open_txns = {k: v for k, v in self._open_txns.items() if k[0] != tp}
            self._open_txns[key] = open_txns
        return open_txns
