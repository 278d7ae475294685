"""``spark.readStream.format("kafka-remote")``: a Structured Streaming source over the remote tier.

The stream reader (``pyspark.sql.datasource.DataSourceStreamReader``, Spark 4.2+ admission control) lives in one
Python process on the driver for the query's life; it follows the metadata partitions of the partitions it reads
(:class:`rlm.spark.planning.MetadataReader`) and plans each micro-batch with the batch source's planner
(:func:`rlm.spark.planning.plan_range`); executors read the slices with :func:`rlm.spark.executor.read_slice`,
exactly as in batch.

**Offsets** Spark checkpoints: ``{"topic": {"partition": next offset, ..., "topicId": "<uuid>"}}`` (JSON,
partitions as strings, sorted, then the topic's id), the next offset of each partition to read. A micro-batch reads
``start`` (inclusive) to ``end`` (exclusive) per partition; the latest offset of a partition is its latest tiered
offset + 1 (the tier's high watermark). The topic id is what identifies the partitions: a topic deleted and
re-created under its name is another topic (see data loss). Offsets without ``topicId`` (checkpoints written before
it was added) are accepted: they resume as before, and the next offsets carry the id.

- ``startingOffsets`` (a new query only; a restarted one resumes from its checkpoint): ``earliest`` (default),
  ``latest`` or JSON per partition (-2 earliest, -1 latest; partitions it does not name start at earliest).
- A partition with nothing tiered yet, or added to a topic (or a topic matching ``subscribePattern``) while the
  query runs, enters the offsets at its earliest remote offset in the first micro-batch that sees it (reading
  nothing of it in that batch): its start is checkpointed before anything of it is read, so a restart neither
  repeats nor skips any of it. A deleted topic's partitions stay in the offsets, at the offsets read, with the
  topic's id, while the options still select its name: their stream ends, and a topic created again under that
  name is recognized as another one (below). They leave the offsets once the options no longer select the name.
- Read limits: ``maxOffsetsPerTrigger`` (``ReadMaxRows``) spreads that many offsets over the partitions by their
  backlog, as Spark's Kafka source (offsets, not records: transaction markers count); ``minOffsetsPerTrigger``
  holds a micro-batch back until that many offsets are tiered or ``maxTriggerDelay`` has passed since the last
  one. Both together: at least min (or the delay), at most max.
- ``Trigger.AvailableNow``: the tier's latest offsets when the query starts are the target; the query reads up to
  them (in several micro-batches under ``maxOffsetsPerTrigger``) and stops. ``minOffsetsPerTrigger`` is ignored.
- **Data loss**: offsets between a batch's start and the tier's earliest offset were removed by remote retention
  before they were read. ``failOnDataLoss=true`` (default) fails the query naming the topic, partition and
  offsets; ``false`` logs them, counts them (:attr:`KafkaRemoteStreamReader.lost_offsets`) and reads on from the
  earliest remote offset. A segment deleted between planning and reading fails the task, or (``false``) is
  skipped with a warning on the executor. Offsets missing inside the tier (never tiered) are treated as in batch.
  A tier that now ends *below* what the query has read (an unclean election replaced the lineage) is data loss
  too, as in Spark's Kafka source: the query fails, or (``false``) it counts and logs it and goes back to the
  tier's end. A topic whose id is not the checkpointed one (deleted and re-created under its name, while the query
  ran or while it was stopped) is data loss too: the query fails naming the topic, the old and the new id, or
  (``false``) it counts and logs it and the new topic enters the offsets at its earliest remote offset, as a new
  partition does: the new topic is never read at the old topic's offsets. :meth:`KafkaRemoteStreamReader._data_loss`
  is the one place that decides (fail, or count and log); ``data_losses`` counts the events, ``lost_offsets`` the
  offsets where they are known.
- ``read_committed``: the transaction indexes of the tier decide, as in batch, and a micro-batch ends at the
  tier's last stable offset (:class:`rlm.tier.TierView`, as the history endpoint serves it): a transaction
  still open at the tier's end, its marker not tiered yet, is held back until it is. ``endingOffsets`` is refused.
- ``startingTimestamp`` / ``startingOffsetsByTimestamp`` (a new query only, before ``startingOffsets``): each
  partition starts at the first offset whose record's timestamp is at or after it (Kafka's ListOffsets by
  timestamp, over the remote tier), or at the tier's end when no record is that recent. Partitions
  ``startingOffsetsByTimestamp`` does not name follow ``startingOffsets``.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from rlm.discovery import ClusterView
from rlm.spark.executor import DataLossError, SegmentSlice, read_slice
from rlm.spark.options import EARLIEST, LATEST, SourceOptions, SparkSourceError
from rlm.spark.planning import MetadataReader, plan_range, resolve_partitions, topic_selected
from rlm.tier import Isolation, RemoteReader, TierView
from rlmm.api import RemoteLogSegmentMetadata, TopicIdPartition
from rsm.manager import RemoteStorageManager

__all__ = ["KafkaRemoteStreamReader", "Offsets"]

log = logging.getLogger(__name__)

# topic -> partition (as a string) -> next offset to read, and TOPIC_ID -> the topic's id (a UUID string)
Offsets = dict[str, dict[str, int | str]]
TOPIC_ID = "topicId"  # beside the partitions' numbers in a topic's offsets: never a partition


def _offsets(positions: Mapping[tuple[str, int], int], ids: Mapping[str, uuid.UUID]) -> Offsets:
    """The canonical JSON form: topics sorted, partitions sorted by number, then the topic's id when known (Spark
    compares offsets as JSON)."""
    out: Offsets = {}
    for (topic, p), off in sorted(positions.items()):
        out.setdefault(topic, {})[str(p)] = off
    for topic, parts in out.items():
        if topic in ids:
            parts[TOPIC_ID] = str(ids[topic])
    return out


def _positions(offsets: Mapping[str, Any] | None) -> dict[tuple[str, int], int]:
    return {(t, int(p)): int(o) for t, parts in (offsets or {}).items() for p, o in parts.items() if p != TOPIC_ID}


def _topic_ids(offsets: Mapping[str, Any] | None) -> dict[str, uuid.UUID]:
    """topic -> id of the offsets that carry one (offsets checkpointed before ids were added carry none)."""
    out = {}
    for topic, parts in (offsets or {}).items():
        raw = parts.get(TOPIC_ID)
        if raw is None:
            continue
        try:
            out[topic] = uuid.UUID(str(raw))
        except ValueError:
            raise SparkSourceError(f"the query's offsets name topic {topic} with {TOPIC_ID} {raw!r}, not a topic id "
                                   "(a checkpoint this source did not write?)") from None
    return out


class KafkaRemoteStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring."""

    def __init__(self, opts: SourceOptions) -> None:
        if opts.ending_given:
            raise SparkSourceError("option endingOffsets is not supported by readStream (a stream has no end)")
        self.opts = opts
        self.lost_offsets = 0  # offsets lost (failOnDataLoss=false), where known
        self.data_losses = 0  # data loss events (failOnDataLoss=false): each decided by _data_loss
        self._recreations: set[tuple[str, uuid.UUID, uuid.UUID]] = set()  # (topic, old id, new id) counted
        self._metadata: MetadataReader | None = None
        self._rsm: RemoteStorageManager | None = None
        self._target: dict[tuple[str, int], int] | None = None  # Trigger.AvailableNow
        self._last_trigger = time.monotonic()
        self._tps: dict[tuple[str, int], TopicIdPartition] = {}
        self._ids: dict[str, uuid.UUID] = {}  # topic -> its id on the cluster at the last _tier()
        self._txn_view: TierView | None = None  # read_committed only
        self._view: ClusterView | None = None
        self._reported: dict[tuple[str, int], int] = {}  # the tier's latest offsets at the last latestOffset

    # ------------------------------------------------------------------------------------------- the tier
    def _metadata_reader(self) -> MetadataReader:
        """The metadata reader, with the cluster view: opened at first use, and again after :meth:`stop`."""
        if self._metadata is None:
            self._metadata = MetadataReader(self.opts)
            self._view = ClusterView(dict(self.opts.client_config))
        return self._metadata

    def _tier(self) -> dict[tuple[str, int], list[RemoteLogSegmentMetadata]]:
        """(topic, partition) -> remote chain of every partition the options select now (on the cluster)."""
        metadata = self._metadata_reader()
        tps = resolve_partitions(self.opts, strict=False, view=self._view)
        self._tps = {(tp.topic, tp.partition): tp for tp in tps}
        self._ids = {tp.topic: tp.topic_id for tp in tps}
        return {(tp.topic, tp.partition): segs for tp, segs in metadata.chains(tps).items()}

    def _storage(self) -> RemoteStorageManager:
        if self._rsm is None:
            self._rsm = RemoteStorageManager(self.opts.rsm_config())
        return self._rsm

    def _stable_end(self, k: tuple[str, int], hwm: int) -> int:
        """read_committed: the tier's last stable offset (a transaction open at the tier's end, its marker not
        tiered yet, is held back until it is), as the history endpoint serves it; else the high watermark."""
        if self.opts.isolation != Isolation.READ_COMMITTED or self._metadata is None:
            return hwm
        if self._txn_view is None:  # the one computation of a tier's last stable offset
            self._txn_view = TierView(RemoteReader(self._metadata.rlmm, self._storage()), ttl_s=0.0)
        tier = self._txn_view.partition(self._tps[k])
        return hwm if tier is None else min(hwm, tier.last_stable_offset)

    @staticmethod
    def _bounds(segs: list[RemoteLogSegmentMetadata]) -> tuple[int, int] | None:
        """(earliest remote offset, latest tiered offset + 1), or None when nothing is remote."""
        return (segs[0].start_offset, segs[-1].end_offset_inclusive + 1) if segs else None

    def _latest(self, tier: dict[tuple[str, int], list[RemoteLogSegmentMetadata]]) -> dict[tuple[str, int], int]:
        out = {}
        for k, segs in tier.items():
            b = self._bounds(segs)
            if b is not None:
                out[k] = self._stable_end(k, b[1])
        return out

    # --------------------------------------------------------------------------------------- Spark's API
    def initialOffset(self) -> dict:  # noqa: N802 - Spark's name
        tier = self._tier()
        out: dict[tuple[str, int], int] = {}
        for (topic, p), segs in tier.items():
            b = self._bounds(segs)
            if b is None:
                continue  # enters the offsets once something of it is tiered
            spec = self.opts.starting.for_partition(topic, p)
            latest = self._stable_end((topic, p), b[1])
            ts = self.opts.starting_timestamp_ms
            if self.opts.starting_by_timestamp is not None:
                ts = self.opts.starting_by_timestamp.get((topic, p))
            if ts is not None:
                out[(topic, p)] = self._offset_at(topic, p, ts, latest)
                continue
            out[(topic, p)] = b[0] if spec is None or spec == EARLIEST else latest if spec == LATEST else spec
        offsets = _offsets(out, self._ids)
        log.info("kafka-remote stream: initial offsets", extra={"offsets": offsets})
        return offsets

    def _offset_at(self, topic: str, p: int, timestamp_ms: int, latest: int) -> int:
        """The first offset whose record's timestamp is >= ``timestamp_ms`` (Kafka's ListOffsets by timestamp,
        through the remote reader); the tier's end when no record is that recent (the partition reads only what
        is tiered from now on, as the batch source reads nothing of it)."""
        hit = RemoteReader(self._metadata_reader().rlmm, self._storage()).offset_for_timestamp(
            self._tps[(topic, p)], timestamp_ms)
        return latest if hit is None else min(hit[0], latest)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's name
        if self.opts.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        if self.opts.min_offsets_per_trigger is not None:
            return ReadMinRows(self.opts.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        self._target = self._latest(self._tier())
        log.info("kafka-remote stream: Trigger.AvailableNow target",
                 extra={"offsets": _offsets(self._target, self._ids)})

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802 - Spark's name
        begin = _positions(start)
        checkpointed_ids = _topic_ids(start)
        tier = self._tier()
        latest = self._reported = self._latest(tier)
        for topic, old_id in checkpointed_ids.items():
            new_id = self._ids.get(topic)
            if new_id is not None and new_id != old_id:  # re-created: its partitions enter as new ones (below)
                self._recreated(topic, old_id, new_id, {k: o for k, o in begin.items() if k[0] == topic})
                begin = {k: o for k, o in begin.items() if k[0] != topic}
        # A deleted topic (still selected by the options) keeps its offsets and its id: it reads nothing, and a
        # topic created again under its name is recognized as another one by its id.
        on_cluster = set(self._ids) | {t for t, _p in tier}
        gone = {t for t in checkpointed_ids if t not in on_cluster and topic_selected(self.opts, t)}
        end = {k: o for k, o in begin.items() if k[0] in gone}
        for k, segs in tier.items():
            b = self._bounds(segs)
            if k in begin:
                end[k] = begin[k]
            elif b is not None and (self._target is None or k in self._target):
                end[k] = b[0]  # a new partition: checkpointed at its earliest offset before any of it is read
        # other partitions in `begin` no longer on the cluster (an old checkpoint's deleted topic) leave the offsets
        avail = {}
        for k in end:
            if k not in begin or k not in latest:
                continue
            if latest[k] < begin[k]:
                end[k] = self._tier_end_moved_back(k, begin[k], latest[k])
                continue
            top = latest[k] if self._target is None else min(latest[k], self._target.get(k, begin[k]))
            avail[k] = max(0, top - begin[k])
        total = sum(avail.values())
        if not isinstance(limit, ReadAllAvailable) and self._target is None:
            min_rows = self.opts.min_offsets_per_trigger
            if isinstance(limit, ReadMinRows):
                min_rows = limit.min_rows
            waited_ms = (time.monotonic() - self._last_trigger) * 1000
            if min_rows is not None and total < min_rows and waited_ms < self.opts.max_trigger_delay_ms:
                avail = {}  # not enough yet: hold the batch back (new partitions still enter)
                total = 0
        max_rows = None
        if isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        elif not isinstance(limit, ReadAllAvailable):
            max_rows = self.opts.max_offsets_per_trigger
        for k, n in avail.items():
            if max_rows is not None and total > max_rows:
                share = max_rows * (n / total)  # Spark's KafkaMicroBatchStream.rateLimit
                n = min(n, int(share) if share >= 1 else -(-share // 1))
            end[k] = begin[k] + int(n)
        if total > 0:
            self._last_trigger = time.monotonic()
        ids = {t: checkpointed_ids[t] for t in gone}
        ids.update((t, self._ids[t]) for t, _p in end if t in self._ids)
        return _offsets(end, ids)

    def _data_loss(self, message: str, fix: str, lost_offsets: int | None, **fields: Any) -> None:
        """The one decision on data loss (offsets removed by remote retention before they were read, a tier that now
        ends below what was read, a topic re-created under its name): ``failOnDataLoss=true`` raises
        :class:`~rlm.spark.executor.DataLossError` with ``message`` and how to go on; ``false`` counts it
        (:attr:`data_losses`, and :attr:`lost_offsets` when the number is known), logs it at WARNING and returns:
        the caller then does ``fix``."""
        if self.opts.fail_on_data_loss:
            raise DataLossError(f"{message}; set failOnDataLoss=false to {fix}")
        self.data_losses += 1
        if lost_offsets:
            self.lost_offsets += lost_offsets
        log.warning("kafka-remote stream: data loss: %s; failOnDataLoss=false: going on, to %s", message, fix,
                    extra={**fields, "data_losses_total": self.data_losses, "lost_offsets_total": self.lost_offsets})

    def _recreated(self, topic: str, old_id: uuid.UUID, new_id: uuid.UUID,
                   positions: Mapping[tuple[str, int], int]) -> None:
        """``topic`` is not the topic of the query's offsets any more: it was deleted and created again under its
        name. Its records at those offsets (if any) are another topic's, and whatever the old topic held beyond them
        is gone. Data loss, counted once per re-creation."""
        if (topic, old_id, new_id) in self._recreations and not self.opts.fail_on_data_loss:
            return
        read = ", ".join(f"{p}: {o}" for (_t, p), o in sorted(positions.items())) or "none"
        self._data_loss(
            f"{topic}: the topic was deleted and re-created under its name: the query's offsets (partition: next "
            f"offset {read}) are of topic id {old_id}, the topic is now topic id {new_id}; the old topic's records "
            "it had not read are lost, and the new topic's are not at those offsets",
            "read the new topic from its earliest remote offset", None,
            topic=topic, old_topic_id=str(old_id), new_topic_id=str(new_id))
        self._recreations.add((topic, old_id, new_id))

    def _tier_end_moved_back(self, k: tuple[str, int], begin: int, latest: int) -> int:
        """The tier now ends below offsets this query has read: the remote chain was replaced (an unclean election
        truncated the lineage those offsets were tiered from, or the remote data was deleted and tiered again).
        Spark's Kafka source reports this as data loss: fail, or (``failOnDataLoss=false``) count it, log it and go
        back to the tier's end, reading what is tiered there from now on."""
        topic, p = k
        self._data_loss(
            f"{topic}-{p}: the remote tier now ends at offset {latest - 1}, below offset {begin} this query has "
            f"already read up to: offsets {latest} to {begin - 1} were replaced (an unclean leader election, or "
            "the partition's remote data deleted and tiered again)", "go on from the tier's end", begin - latest,
            topic=topic, partition=p, read_up_to=begin, tier_end=latest)
        return latest

    def reportLatestOffset(self) -> dict | None:  # noqa: N802 - Spark's name
        """The tier's latest offsets as :meth:`latestOffset` saw them (Spark asks right after it)."""
        return _offsets(self._reported, self._ids) if self._reported else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = _positions(start)
        stop = _positions(end)
        todo = {k: (begin[k], e) for k, e in stop.items() if k in begin and begin[k] < e}
        if not todo:
            return []
        tier = self._tier()
        start_ids, end_ids = _topic_ids(start), _topic_ids(end)
        for topic in sorted({t for t, _p in todo}):
            planned, now = end_ids.get(topic), self._ids.get(topic)
            if planned is not None and now is not None and planned != now:
                # planned against a topic since re-created (a restart replaying a planned micro-batch)
                self._recreated(topic, planned, now, {k: o for k, o in begin.items() if k[0] == topic})
            elif planned is None or start_ids.get(topic, planned) == planned:
                continue
            # else: the batch crosses a re-creation latestOffset decided; its end is the new topic's earliest offset
            todo = {k: r for k, r in todo.items() if k[0] != topic}
        out: list[InputPartition] = []
        for (topic, p), (s, e) in sorted(todo.items()):
            segs = tier.get((topic, p), [])
            b = self._bounds(segs)
            earliest = b[0] if b is not None else e
            if s < earliest:
                lost_to = min(earliest, e) - 1
                self._data_loss(
                    f"{topic}-{p}: offsets {s} to {lost_to} were removed by remote retention before this query "
                    f"read them (the earliest remote offset is now {earliest if b is not None else 'none'})",
                    "skip to the earliest remote offset", lost_to - s + 1,
                    topic=topic, partition=p, from_offset=s, to_offset=lost_to)
                s = earliest
            out.extend(plan_range(self.opts, self._storage(), segs, s, e))
        log.info("kafka-remote stream: micro-batch planned", extra={"slices": len(out)})
        return out

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SegmentSlice):
            return iter(())
        return read_slice(partition)

    def __getstate__(self) -> dict[str, Any]:
        """Spark pickles a fresh reader to the executors for :meth:`read`: its options without the Kafka
        credentials, none of the driver's clients or caches."""
        return {"opts": self.opts.for_executors()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["opts"])  # type: ignore[misc]

    def commit(self, end: dict) -> None:
        pass

    def stop(self) -> None:
        try:
            if self._view is not None:
                self._view.close()
            if self._metadata is not None:
                self._metadata.close()
        finally:
            self._metadata = None
            self._txn_view = None
            self._view = None
            if self._rsm is not None:
                self._rsm.close()
                self._rsm = None

