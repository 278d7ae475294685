"""A RemoteLogMetadataManager on a compacted Kafka topic, materialized into RocksDB.

Writes go to the metadata partition of the user partition (:mod:`rlmm.partitioner`), keyed by
:mod:`rlmm.keys`, valued as Kafka's ``RemoteLogMetadataSerde`` (:mod:`rlmm.serde`). The manager is wiring over three
jobs, one module each, as Kafka splits its own:

- :mod:`rlmm.topic_admin`: find or create the metadata topic (at start);
- :mod:`rlmm.topic_consumer`: the consumer task, one thread that consumes the metadata partitions served and applies
  their records into :class:`rlmm.cache.MetadataCache`;
- :mod:`rlmm.topic_producer`: the producer (``acks=all``, idempotent), and the tombstones of deleted segments.

What stays here: checking a write against the cache, then the one write path (:meth:`_write_many`: produce, then
wait until the consumer task applied every record, read-your-writes; concurrent writers grouped into one such write,
:mod:`rlmm.group_commit`), and the reads. A manager configured
``read_only`` (readers: the operator commands, Spark, the history endpoint, ``mode: read_only``) has no producer at
all: it writes nothing (not even due tombstones), and its principal needs no WRITE right.

Refusals are decided by the cache in the topic's order, the same in every manager, with the rules of
:mod:`rlmm.rules`. A writer checks its own cache first (no record is written for a transition it already knows is
refused) and then learns, through read-your-writes, whether the record it wrote was refused: as
:class:`rlmm.api.CopyFencedError` when a copy started under a higher broker leader epoch landed first (leader-epoch
fencing of zombie copies), else :class:`InvalidStateTransitionError`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from rlmm import serde
from rlmm.api import (
    CopyFencedError,
    InvalidStateTransitionError,
    PartitionNotServedError,
    ReadYourWritesTimeoutError,
    RemoteLogMetadataError,
    RemoteLogMetadataManager,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
)
from rlmm.cache import MetadataCache, SkippedRecord
from rlmm.group_commit import GroupCommit
from rlmm.keys import KeyKind, encode_key
from rlmm.rules import refuse_new_segment, refuse_partition_delete, refuse_segment_update, require_new_segment
from rlmm.topic_admin import ensure_metadata_topic
from rlmm.topic_consumer import APPLIED_RECORDS, SKIPPED_RECORDS, ConsumerTask
from rlmm.topic_producer import MetadataProducer

__all__ = ["APPLIED_RECORDS", "SKIPPED_RECORDS", "TopicBasedRlmmConfig", "TopicBasedRemoteLogMetadataManager"]

DEFAULT_TOPIC = "__remote_log_metadata"

# a record to write: (user partition, record key, record value, what it is, for messages)
_Item = tuple[TopicIdPartition, bytes, bytes, object]


@dataclass(frozen=True, slots=True)
class TopicBasedRlmmConfig:
    """Settings of :class:`TopicBasedRemoteLogMetadataManager` (units in names)."""

    bootstrap_servers: str
    cache_dir: Path
    broker_id: int = -1
    topic: str = DEFAULT_TOPIC
    num_partitions: int = 50
    replication_factor: int = 3
    topic_config: Mapping[str, str] = field(default_factory=dict)   # extra configs when the topic is created
    create_topic: bool = True                                       # False: a missing topic is an error
    read_only: bool = False                                         # True: no producer, no write (readers)
    serve_all: bool = False                                         # consume every metadata partition
    write_timeout_s: float = 30.0                                   # produce + read-your-writes
    kafka_timeout_s: float = 30.0                                   # each wait on the cluster: topic, leaders, offsets
    tombstone_delay_ms: int = 60_000                                # DELETE_SEGMENT_FINISHED -> tombstones
    tombstone_check_interval_s: float = 1.0
    caught_up_refresh_s: float = 5.0                               # how often an idle, caught-up cache says so
    stall_renew_s: float = 10.0    # an acknowledged record not delivered this long: a new consumer (topic_consumer)
    close_drain_s: float = 2.0                                     # on close, consume up to this long to the end
    max_batch_records: int = 10_000
    write_linger_ms: float = 2.0   # a burst's writer waits this long for others to share its write (rlmm.group_commit)
    client_config: Mapping[str, object] = field(default_factory=dict)     # every client: security, sasl.*, ssl.*
    producer_config: Mapping[str, object] = field(default_factory=dict)
    consumer_config: Mapping[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.write_linger_ms < 0:
            raise ValueError(f"write_linger_ms must be >= 0 (0: no linger), not {self.write_linger_ms}")


class TopicBasedRemoteLogMetadataManager(RemoteLogMetadataManager):
    """See the module docstring. Counters for tests (the consumer task's): ``records_consumed``, ``records_applied``,
    ``skipped_records`` (and ``skipped``, the last ones), ``rebuilt_partitions``, ``resumed_partitions``."""

    def __init__(self, config: TopicBasedRlmmConfig) -> None:
        self.config = config
        self.topic = config.topic
        common = {**config.client_config, "bootstrap.servers": config.bootstrap_servers}
        found = ensure_metadata_topic(common, self.topic, create=config.create_topic,
                                      num_partitions=config.num_partitions,
                                      replication_factor=config.replication_factor, topic_config=config.topic_config,
                                      timeout_s=config.kafka_timeout_s)
        self.num_partitions, self.delete_retention_ms = found.num_partitions, found.delete_retention_ms
        self.cache = MetadataCache(config.cache_dir, topic=self.topic, num_partitions=self.num_partitions)
        self._producer = None if config.read_only else MetadataProducer(
            self.topic, {**common, **config.producer_config})
        self._served: dict[TopicIdPartition, int] = {}
        self._group: GroupCommit[_Item, RemoteLogMetadataError | None] = GroupCommit(
            self._write_now, linger_s=config.write_linger_ms / 1000)
        self._closed = False
        self._last_tombstones = 0.0
        self._consumer = ConsumerTask(found, self.cache, {**common, **config.consumer_config},
                                      caught_up_refresh_s=config.caught_up_refresh_s,
                                      close_drain_s=config.close_drain_s, max_batch_records=config.max_batch_records,
                                      kafka_timeout_s=config.kafka_timeout_s, stall_renew_s=config.stall_renew_s,
                                      on_idle=None if self._producer is None else self._on_idle)
        self._consumer.start()
        if config.serve_all:
            self._consumer.call(lambda: self._consumer.assign(range(self.num_partitions)))

    def _on_idle(self) -> None:
        """On the consumer thread, every loop: now and then the producer's delivery reports (the tombstones' have no
        callback; a write serves its own, flushing) and due tombstones. Not a poll per loop: each is a call
        that lets the GIL go, a thread hand-off when the copy workers wait for it (issue 26)."""
        now = time.monotonic()
        if now - self._last_tombstones >= self.config.tombstone_check_interval_s:
            self._producer.poll()   # type: ignore[union-attr]  # (the last check's: one check's at most held)
            self._producer.write_due_tombstones(self.cache, self._consumer.assigned_partitions(),  # type: ignore
                                                self.config.broker_id, self.config.tombstone_delay_ms)
            self._last_tombstones = now

    # the consumer task's counters
    @property
    def records_consumed(self) -> int:
        return self._consumer.records_consumed

    @property
    def records_applied(self) -> int:
        return self._consumer.records_applied

    @property
    def skipped_records(self) -> int:
        return self._consumer.skipped_records

    @property
    def skipped(self) -> Sequence[SkippedRecord]:
        return self._consumer.skipped

    @property
    def rebuilt_partitions(self) -> list[int]:
        return self._consumer.rebuilt_partitions

    @property
    def resumed_partitions(self) -> list[int]:
        return self._consumer.resumed_partitions

    # ------------------------------------------------------------------------------------------ write side
    def _check_open(self) -> None:
        if self._closed:
            raise RemoteLogMetadataError("the metadata manager is closed")
        self._consumer.check_alive()

    def _holding(self, tps: Iterable[TopicIdPartition]) -> AbstractContextManager[None]:
        """Consume the metadata partitions of ``tps`` until the block ends (:meth:`ConsumerTask.holding`)."""
        self._check_open()  # a closed manager's thread answers no command and its cache is closed
        return self._consumer.holding({self.cache.mp_of(tp): tp for tp in tps}, self.config.write_timeout_s)

    def add_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> None:
        _raise(self.write_segment_metadata_many([metadata]))

    def update_remote_log_segment_metadata(self, update: RemoteLogSegmentMetadataUpdate) -> None:
        _raise(self.write_segment_metadata_many([update]))

    def write_segment_metadata_many(
            self, records: Sequence[RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate],
    ) -> list[RemoteLogMetadataError | None]:
        """See :meth:`RemoteLogMetadataManager.write_segment_metadata_many`: every record checked against the cache,
        then all written by :meth:`_write_many` (one flush, one read-your-writes wait per metadata partition)."""
        out: list[RemoteLogMetadataError | None] = [None] * len(records)
        items: list[tuple[int, _Item]] = []
        with self._holding({rec.remote_log_segment_id.topic_id_partition for rec in records}):
            for i, rec in enumerate(records):
                try:
                    items.append((i, self._checked(rec)))
                except RemoteLogMetadataError as err:
                    out[i] = err
            for (i, _item), err in zip(items, self._write_many([item for _i, item in items]), strict=True):
                out[i] = err
        return out

    def _checked(self, rec: RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate) -> _Item:
        """A segment record checked against the cache (the state machine, the partition's delete state, copy
        fencing), ready to write. An add must be COPY_SEGMENT_STARTED (ValueError); refusals raise the metadata
        manager's errors. The caller holds the partition's metadata partition (:meth:`_holding`)."""
        sid = rec.remote_log_segment_id
        tp = sid.topic_id_partition
        existing = self.cache.segment_view(tp, sid.id)   # (its state and copy epoch: no segment decoded)
        known = None if existing is None else existing.state
        if isinstance(rec, RemoteLogSegmentMetadataUpdate):
            refused = refuse_segment_update(sid, rec.state, known,
                                            copy_epoch=None if existing is None else existing.broker_leader_epoch,
                                            fence_epoch=lambda: self.cache.copy_fence_epoch(tp))
        else:
            require_new_segment(rec)
            deleting = self.cache.partition_delete(tp)
            refused = refuse_new_segment(sid, rec.state, known, None if deleting is None else deleting.state)
        if refused is not None:
            raise refused
        return tp, encode_key(KeyKind.SEGMENT, tp.topic_id, tp.partition, sid.id, rec.state), serde.encode(rec), sid

    def put_remote_partition_delete_metadata(self, metadata: RemotePartitionDeleteMetadata) -> None:
        tp = metadata.topic_id_partition
        with self._holding([tp]):
            existing = self.cache.partition_delete(tp)
            refused = refuse_partition_delete(tp, metadata.state, None if existing is None else existing.state)
            if refused is not None:
                raise refused
            key = encode_key(KeyKind.PARTITION_DELETE, tp.topic_id, tp.partition, None, metadata.state)
            _raise(self._write_many([(tp, key, serde.encode(metadata), tp)]))

    def _write_many(self, items: Sequence[_Item]) -> list[RemoteLogMetadataError | None]:
        """The one write path: produce every item, then wait until the consumer task applied each (read-your-writes),
        allowing ``write_timeout_s`` without progress; per item None (written and applied) or its error, among them
        the cache's refusal of the record as written (the topic's order decides). The caller holds the items'
        metadata partitions (:meth:`_holding`). Writers of other threads that come while a write is in flight go
        out together in the next one (:class:`rlmm.group_commit.GroupCommit`: one flush, one wait for all)."""
        return self._group.write(items)

    def _write_now(self, items: Sequence[_Item]) -> list[RemoteLogMetadataError | None]:
        """:meth:`_write_many`'s write of the records of every writer of a group."""
        if self._producer is None:
            raise RemoteLogMetadataError(f"this metadata manager of {self.topic} is read-only: nothing is written")
        timeout = self.config.write_timeout_s
        sent = self._producer.send([(self.cache.mp_of(tp), key, value, what) for tp, key, value, what in items],
                                   timeout)
        highest: dict[int, int] = {}
        for s in sent:
            if isinstance(s, tuple):
                highest[s[0]] = max(highest.get(s[0], -1), s[1])
        applied = self._consumer.wait_applied(highest, timeout)
        errors: list[RemoteLogMetadataError | None] = []
        for (_tp, _key, _value, what), s in zip(items, sent, strict=True):
            if not isinstance(s, tuple):
                errors.append(s)
                continue
            mp, offset = s
            upto = applied[mp]
            if upto is None:
                errors.append(PartitionNotServedError(
                    f"{what}: metadata partition {self.topic}-{mp} is no longer consumed by this manager "
                    "(on_stop_partitions): its records would never be applied here"))
            elif upto <= offset:
                errors.append(ReadYourWritesTimeoutError(
                    f"{what}: written at {self.topic}-{mp} offset {offset} but the local cache applied only up to "
                    f"{upto - 1} within {timeout}s"))
            else:
                # written, but refused by every cache (the topic's order decides): e.g. a copy fenced by a newer
                # leader whose COPY_SEGMENT_STARTED landed between this writer's check and its record
                skipped = self._consumer.skipped_at(mp, offset)
                errors.append(None if skipped is None else (CopyFencedError if skipped.fenced else
                              InvalidStateTransitionError)(f"{what}: the cache refused the record at {self.topic}-{mp} "
                                                           f"offset {offset}: {skipped.error}"))
        return errors

    # ------------------------------------------------------------------------------------------- read side
    def _served_mp(self, tp: TopicIdPartition) -> None:
        self._check_open()
        mp = self.cache.mp_of(tp)
        if not self._consumer.consumes(mp):
            raise PartitionNotServedError(f"{tp}: metadata partition {self.topic}-{mp} is not consumed by this "
                                          "manager; call on_partition_leadership_changes first")

    def remote_log_segment_metadata(self, tp: TopicIdPartition, epoch: int,
                                    offset: int) -> RemoteLogSegmentMetadata | None:
        self._served_mp(tp)
        return self.cache.segment_floor(tp, epoch, offset)

    def highest_offset_for_epoch(self, tp: TopicIdPartition, epoch: int) -> int | None:
        self._served_mp(tp)
        return self.cache.highest_offset_for_epoch(tp, epoch)

    def list_remote_log_segments(self, tp: TopicIdPartition,
                                 epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        self._served_mp(tp)
        return self.cache.segments(tp, epoch)

    def remote_log_size(self, tp: TopicIdPartition, epoch: int | None = None) -> int:
        return sum(md.segment_size_bytes for md in self.list_remote_log_segments(tp, epoch))

    def copy_fence_epoch(self, tp: TopicIdPartition) -> int | None:
        self._served_mp(tp)
        return self.cache.copy_fence_epoch(tp)

    def remote_partition_delete_metadata(self, tp: TopicIdPartition) -> RemotePartitionDeleteMetadata | None:
        self._served_mp(tp)
        return self.cache.partition_delete(tp)

    # ----------------------------------------------------------------------------------------- lifecycle
    def on_partition_leadership_changes(self, leaders: Iterable[TopicIdPartition],
                                        followers: Iterable[TopicIdPartition]) -> None:
        self._check_open()
        tps = [*leaders, *followers]
        for tp in tps:
            self._served[tp] = self.cache.mp_of(tp)
        self._consumer.call(lambda: self._consumer.assign({self._served[tp] for tp in tps}))

    def on_stop_partitions(self, partitions: Iterable[TopicIdPartition]) -> None:
        self._check_open()
        for tp in partitions:
            self._served.pop(tp, None)
        if self.config.serve_all:
            return
        still = set(self._served.values())
        self._consumer.call(lambda: self._consumer.unassign(self._consumer.assigned_partitions() - still))

    def is_ready(self, tp: TopicIdPartition) -> bool:
        return self._consumer.is_ready(self.cache.mp_of(tp))

    def wait_ready(self, tps: Iterable[TopicIdPartition], timeout_s: float = 60.0) -> None:
        """Block until :meth:`is_ready` holds for every partition (or raise ReadYourWritesTimeoutError). A partition
        whose metadata partition is not consumed (never served, or stopped meanwhile) raises
        :class:`PartitionNotServedError` at once, rather than wait for records that will never be applied."""
        self._consumer.wait_ready({self.cache.mp_of(tp): tp for tp in tps}, timeout_s)

    def wait_caught_up(self, tps: Iterable[TopicIdPartition], timeout_s: float = 60.0) -> None:
        """Block until the cache holds every record the partitions' metadata partitions held when called (their high
        watermarks then), not only caught up once (:meth:`wait_ready` stays true after the first catch-up): a reader
        that must see what writers wrote up to now (a checker, an operator's command). Raises
        ReadYourWritesTimeoutError after ``timeout_s`` without progress, PartitionNotServedError like wait_ready."""
        by_mp = {self.cache.mp_of(tp): tp for tp in tps}
        self._consumer.wait_ready(by_mp, timeout_s)
        self._consumer.wait_caught_up(by_mp, timeout_s)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._consumer.stop()
            if self._producer is not None:
                self._producer.close(10)
        finally:
            self.cache.close()


def _raise(errors: list[RemoteLogMetadataError | None]) -> None:
    """Raise the error of a write of one record, if any."""
    if errors[0] is not None:
        raise errors[0]
