"""Driver side: from the options, the cluster's topic ids and the metadata topic to input partitions.

Steps, none of which reads record data:

1. the partitions the options name, with their topic ids (one AdminClient ``describe_topics``);
2. their remote chains (:mod:`rlm.tier.chain`) from the metadata topic, through the metadata manager's cache
   (a temporary RocksDB directory per query unless ``metadata.cacheDir`` names one to keep);
3. per partition the offset range (starting/ending offsets, a starting timestamp, pushed-down filters), then per
   segment that overlaps it one input partition, or one per block range when the segment is larger than
   ``maxPartitionBytes`` or blocks can be pruned by time. Splitting and time pruning read the segment's index
   object (one GET, no data). A starting timestamp is resolved through the same index object to the first block
   holding a record at or after it; the executor drops the records before the first such one.

Segments are read through the storage manager's interface only (:meth:`rsm.api.SegmentHandle.block_plan`,
:meth:`~rsm.api.SegmentHandle.block_at_timestamp`); which transaction indexes a slice needs is
:class:`rlm.tier.reader.TxnIndexes`, as for the sidecar's reader.
"""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from rlm.authz import check, reader_needs
from rlm.discovery import ClusterView
from rlm.rlmm_config import rlmm_config
from rlm.spark.executor import SegmentSlice
from rlm.spark.options import EARLIEST, LATEST, SourceOptions, SparkSourceError
from rlm.tier import Isolation, TxnIndexes, chain_gaps, remote_chain, to_rsm
from rlmm.api import RemoteLogSegmentMetadata, TopicIdPartition
from rlmm.topic_manager import TopicBasedRemoteLogMetadataManager
from rsm.api import BlockRange, RemoteSegmentMetadata, RemoteStorageManagerApi
from rsm.manager import RemoteStorageManager

__all__ = ["Bounds", "MetadataReader", "list_segments", "plan_range", "plan_slices", "resolve_partitions",
           "topic_selected"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Bounds:
    """What pushed-down filters allow (a superset of the rows Spark keeps: Spark still applies the filters)."""

    topics: set[str] | None = None
    partitions: set[int] | None = None
    offset_min: int | None = None            # inclusive
    offset_max: int | None = None            # inclusive
    timestamp_min_ms: int | None = None      # rows with timestamp >= this

    def narrow_topics(self, topics: Iterable[str]) -> None:
        s = set(topics)
        self.topics = s if self.topics is None else self.topics & s

    def narrow_partitions(self, partitions: Iterable[int]) -> None:
        s = set(partitions)
        self.partitions = s if self.partitions is None else self.partitions & s

    def raise_offset_min(self, v: int) -> None:
        self.offset_min = v if self.offset_min is None else max(self.offset_min, v)

    def lower_offset_max(self, v: int) -> None:
        self.offset_max = v if self.offset_max is None else min(self.offset_max, v)

    def raise_timestamp_min(self, v: int) -> None:
        self.timestamp_min_ms = v if self.timestamp_min_ms is None else max(self.timestamp_min_ms, v)


def resolve_partitions(opts: SourceOptions, bounds: Bounds | None = None, *, strict: bool = True,
                       view: ClusterView | None = None) -> list[TopicIdPartition]:
    """The (topic id, topic, partition)s the options select, narrowed by the pushed-down filters. ``strict``: a
    named topic or assigned partition absent from the cluster fails (a stream, not strict, lets it end). ``view``:
    a cluster view to ask (a stream keeps one), else a new one."""
    view = view if view is not None else ClusterView(dict(opts.client_config))
    if opts.subscribe is not None:
        wanted: Iterable[str] | None = opts.subscribe
    elif opts.assign is not None:
        wanted = opts.assign.keys()
    else:
        wanted = None
    if wanted is not None and bounds is not None and bounds.topics is not None:
        wanted = [t for t in wanted if t in bounds.topics]
    infos = view.partitions(sorted(set(wanted)) if wanted is not None else None)
    found_topics = {t for t, _p in infos}
    if strict and (opts.subscribe is not None or opts.assign is not None):
        missing = sorted(set(wanted or ()) - found_topics)
        if missing:
            raise SparkSourceError(f"topics not found on the cluster: {', '.join(missing)}")
    out = []
    for (topic, p), info in sorted(infos.items()):
        if not topic_selected(opts, topic):
            continue
        if opts.assign is not None and p not in opts.assign[topic]:
            continue
        if bounds is not None and ((bounds.topics is not None and topic not in bounds.topics)
                                   or (bounds.partitions is not None and p not in bounds.partitions)):
            continue
        out.append(TopicIdPartition(info.topic_id, topic, p))
    if strict and opts.assign is not None:
        have = {(tp.topic, tp.partition) for tp in out}
        absent = sorted((t, p) for t, ps in opts.assign.items() for p in ps
                        if (t, p) not in have and (bounds is None or _allowed(bounds, t, p)))
        if absent:
            raise SparkSourceError(f"option assign: partitions not found on the cluster: {absent}")
    return out


def topic_selected(opts: SourceOptions, topic: str) -> bool:
    """Whether the options select a topic of this name (``subscribe``, ``assign``, or ``subscribePattern``: a full
    match, internal ``__`` topics never), whether it exists or not."""
    if opts.subscribe is not None:
        return topic in opts.subscribe
    if opts.assign is not None:
        return topic in opts.assign
    return (opts.subscribe_pattern is not None and not topic.startswith("__")
            and re.fullmatch(opts.subscribe_pattern, topic) is not None)


def _allowed(bounds: Bounds, topic: str, p: int) -> bool:
    return (bounds.topics is None or topic in bounds.topics) and (bounds.partitions is None or p in bounds.partitions)


class MetadataReader:
    """The remote chains of partitions, from the metadata topic through the metadata manager's cache (a temporary
    RocksDB directory unless ``metadata.cacheDir`` names one to keep). It keeps consuming the metadata partitions
    it was asked for until :meth:`close`: a stream asks again each micro-batch without reading the topic again."""

    def __init__(self, opts: SourceOptions) -> None:
        client = dict(opts.client_config)
        check(client, reader_needs(opts.metadata_topic))  # a missing ACL named (rlm.authz), not a 120 s wait
        admin = AdminClient(client)
        md = admin.list_topics(opts.metadata_topic, timeout=30).topics.get(opts.metadata_topic)
        if md is None or md.error is not None or not md.partitions:
            raise SparkSourceError(f"metadata topic {opts.metadata_topic!r} not found on "
                                   f"{client.get('bootstrap.servers')} (option metadata.topic)")
        self._tmp = None
        if opts.metadata_cache_dir:
            cache_dir = Path(opts.metadata_cache_dir)
        else:
            self._tmp = cache_dir = Path(tempfile.mkdtemp(prefix="rlm-spark-metadata-"))
        self._followed: set[TopicIdPartition] = set()
        try:
            # The topic exists (checked above) and the driver only reads it: its partition count and replication
            # factor are the topic's own, as the cluster reports them (the latter is only used to create a topic).
            self._rlmm = TopicBasedRemoteLogMetadataManager(rlmm_config(
                client, topic=opts.metadata_topic, num_partitions=len(md.partitions),
                replication_factor=max(len(p.replicas) for p in md.partitions.values()), cache_dir=cache_dir,
                read_only=True))
        except BaseException:
            self._remove_tmp()
            raise

    def chains(self, tps: Iterable[TopicIdPartition],
               timeout_s: float = 120.0) -> dict[TopicIdPartition, list[RemoteLogSegmentMetadata]]:
        """The remote chain (:func:`rlm.tier.remote_chain`) of each partition, caught up first if not followed yet."""
        tps = list(tps)
        new = [tp for tp in tps if tp not in self._followed]
        if new:
            self._rlmm.on_partition_leadership_changes([], new)
            self._rlmm.wait_ready(new, timeout_s)
            self._followed.update(new)
        return {tp: remote_chain(self._rlmm.list_remote_log_segments(tp)) for tp in tps}

    @property
    def rlmm(self) -> TopicBasedRemoteLogMetadataManager:
        """The metadata manager (following the partitions :meth:`chains` was asked for)."""
        return self._rlmm

    def close(self) -> None:
        try:
            self._rlmm.close()
        finally:
            self._remove_tmp()

    def _remove_tmp(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


def list_segments(opts: SourceOptions, tps: list[TopicIdPartition],
                  timeout_s: float = 120.0) -> dict[TopicIdPartition, list[RemoteLogSegmentMetadata]]:
    """The remote chain of each partition (:mod:`rlm.tier.chain`), from the metadata topic, caught up first."""
    if not tps:
        return {}
    reader = MetadataReader(opts)
    try:
        return reader.chains(tps, timeout_s)
    finally:
        reader.close()


def plan_slices(opts: SourceOptions, bounds: Bounds | None = None) -> list[SegmentSlice]:
    """Every input partition of the query, in (topic, partition, offset) order. Reads no record data."""
    bounds = bounds or Bounds()
    tps = resolve_partitions(opts, bounds)
    segments = list_segments(opts, tps)
    rsm = RemoteStorageManager(opts.rsm_config())
    out: list[SegmentSlice] = []
    try:
        for tp in tps:
            out.extend(_plan_partition(opts, bounds, rsm, segments[tp]))
    finally:
        rsm.close()
    log.info("kafka-remote plan", extra={"partitions": len(tps), "slices": len(out)})
    return out


def _plan_partition(opts: SourceOptions, bounds: Bounds, rsm: RemoteStorageManagerApi,
                    segs: list[RemoteLogSegmentMetadata]) -> list[SegmentSlice]:
    if not segs:
        return []
    tp = segs[0].topic_id_partition
    earliest = segs[0].start_offset
    latest_excl = segs[-1].end_offset_inclusive + 1
    start = opts.starting.for_partition(tp.topic, tp.partition)
    start = earliest if start is None or start == EARLIEST else latest_excl if start == LATEST else start
    end = opts.ending.for_partition(tp.topic, tp.partition)
    end_excl = latest_excl if end is None or end == LATEST else min(end, latest_excl)
    if start < earliest:
        if opts.fail_on_data_loss:
            raise SparkSourceError(f"{tp}: starting offset {start} is below the earliest remote offset {earliest} "
                                   "(records removed by remote retention); set failOnDataLoss=false to start there")
        start = earliest
    if bounds.offset_min is not None:
        start = max(start, bounds.offset_min)
    if bounds.offset_max is not None:
        end_excl = min(end_excl, bounds.offset_max + 1)
    # A starting timestamp: the first block (in offset order) holding a record at or after it.
    ts_start = opts.starting_timestamp_ms
    if opts.starting_by_timestamp is not None:
        ts_start = opts.starting_by_timestamp.get((tp.topic, tp.partition))
    ts_segment = None
    ts_block: BlockRange | None = None
    if ts_start is not None:
        for i, md in enumerate(segs):
            if md.max_timestamp_ms >= ts_start and md.end_offset_inclusive >= start:
                block = rsm.open_segment(to_rsm(md)).block_at_timestamp(ts_start)
                if block is not None:
                    ts_segment, ts_block = i, block
                    start = max(start, block.first_offset)
                    break
        else:
            return []  # no record at or after the timestamp: this partition reads nothing
    return plan_range(opts, rsm, segs, start, end_excl, ts_min=bounds.timestamp_min_ms, ts_start=ts_start,
                      ts_segment=ts_segment, ts_block=ts_block)


def plan_range(opts: SourceOptions, rsm: RemoteStorageManagerApi, segs: list[RemoteLogSegmentMetadata], start: int,
               end_excl: int, *, ts_min: int | None = None, ts_start: int | None = None, ts_segment: int | None = None,
               ts_block: BlockRange | None = None) -> list[SegmentSlice]:
    """The input partitions reading offsets ``start`` (inclusive) to ``end_excl`` (exclusive) of one partition's
    chain ``segs``: one per segment, or per block range of a segment larger than ``maxPartitionBytes`` or pruned by
    ``ts_min``. ``ts_start`` / ``ts_segment`` / ``ts_block``: a starting timestamp resolved to segment
    ``segs[ts_segment]``, block ``ts_block``. Offsets missing from the chain inside the range (lost before they
    were tiered) fail under ``failOnDataLoss`` and are logged otherwise. The batch and the streaming source both
    plan through this."""
    if start >= end_excl or not segs:
        return []
    tp = segs[0].topic_id_partition
    lost = [(a, b) for a, b in chain_gaps(segs) if b >= start and a < end_excl]
    if lost:
        if opts.fail_on_data_loss:
            raise SparkSourceError(f"{tp}: offsets {lost} are missing from the remote tier between {start} and "
                                   f"{end_excl - 1} (lost before they were tiered); set failOnDataLoss=false to "
                                   "read around them")
        log.warning("offsets missing from the remote tier", extra={"partition": str(tp), "missing": lost})
    txns = TxnIndexes(rsm, segs)
    out: list[SegmentSlice] = []
    committed = opts.isolation == Isolation.READ_COMMITTED
    for i, md in enumerate(segs):
        if md.end_offset_inclusive < start or md.start_offset >= end_excl:
            continue
        if ts_min is not None and md.max_timestamp_ms < ts_min:
            continue  # pruned by time: no record of this segment is that recent
        ref = to_rsm(md)
        lo = max(start, md.start_offset)
        hi = min(end_excl - 1, md.end_offset_inclusive)
        txn = tuple(to_rsm(segs[j]) for j in txns.search(i)) if committed else ()
        starts_at_ts = ts_segment == i

        def make(first: int | None, last: int | None, lo_: int, hi_: int, ts: int | None,
                 ref: RemoteSegmentMetadata = ref, txn: tuple[RemoteSegmentMetadata, ...] = txn) -> SegmentSlice:
            return SegmentSlice(ref, lo_, hi_, first, last, ts, txn, committed,
                                opts.include_headers, opts.store, opts.fail_on_data_loss)

        if md.segment_size_bytes <= opts.max_partition_bytes and ts_min is None and not starts_at_ts:
            out.append(make(None, None, lo, hi, None))
            continue
        from_block = ts_block.first_block if starts_at_ts and ts_block is not None else 0
        for r in rsm.open_segment(ref).block_plan(lo, hi, opts.max_partition_bytes,
                                                            min_timestamp_ms=ts_min, from_block=from_block):
            ts = ts_start if starts_at_ts and r.first_block == from_block else None
            out.append(make(r.first_block, r.last_block, max(lo, r.first_offset), min(hi, r.last_offset), ts))
    return out
