"""A RemoteLogMetadataManager on a compacted Kafka topic, materialized into RocksDB.

Writes go to the metadata partition of the user partition (:mod:`rlmm.partitioner`), keyed by
:mod:`rlmm.keys`, valued as Kafka's ``RemoteLogMetadataSerde`` (:mod:`rlmm.serde`), with ``acks=all`` and
idempotence. One consumer thread (``assign``, never ``subscribe``, no group commits) applies records into
:class:`rlmm.cache.MetadataCache`; a write returns once that thread has applied the produced offset. A manager
configured ``read_only`` (readers: the operator commands, Spark, the history endpoint, ``mode: read_only``) has no
producer at all: it writes nothing (not even due tombstones), and its principal needs no WRITE right.

On (re)assignment of a metadata partition the cache resumes from its stored next offset, unless it has been
away longer than the topic's ``delete.retention.ms`` (it might have missed tombstones) or the stored offset fell
below the log start: then that partition's state is dropped and rebuilt from the beginning.

Refusals are decided by the cache in the topic's order, the same in every manager, with the rules of
:mod:`rlmm.rules`. A writer checks its own cache
first (no record is written for a transition it already knows is refused) and then learns, through read-your-writes,
whether the record it wrote was refused: as :class:`rlmm.api.CopyFencedError` when a copy started under a higher
broker leader epoch landed first (leader-epoch fencing of zombie copies), else :class:`InvalidStateTransitionError`.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType
from prometheus_client import Counter

from rlmm import serde
from rlmm.api import (
    CopyFencedError,
    InvalidStateTransitionError,
    MetadataTopicMissingError,
    MetadataWriteError,
    PartitionNotServedError,
    ReadYourWritesTimeoutError,
    RemoteLogMetadataError,
    RemoteLogMetadataManager,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
)
from rlmm.cache import MetadataCache, Progress, SkippedRecord
from rlmm.keys import KeyKind, encode_key, segment_keys
from rlmm.rules import refuse_new_segment, refuse_partition_delete, refuse_segment_update, require_new_segment

__all__ = ["APPLIED_RECORDS", "SKIPPED_RECORDS", "TopicBasedRlmmConfig", "TopicBasedRemoteLogMetadataManager"]

log = logging.getLogger(__name__)

SKIPPED_RECORDS = Counter("rlmm_skipped_records_total",
                          "Metadata records skipped by the cache (undecodable or refused transitions)", ["reason"])
APPLIED_RECORDS = Counter("rlmm_applied_records_total", "Metadata records applied into the cache")

DEFAULT_TOPIC = "__remote_log_metadata"


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
    close_drain_s: float = 2.0                                     # on close, consume up to this long to the end
    max_batch_records: int = 10_000
    client_config: Mapping[str, object] = field(default_factory=dict)     # every client: security, sasl.*, ssl.*
    producer_config: Mapping[str, object] = field(default_factory=dict)
    consumer_config: Mapping[str, object] = field(default_factory=dict)


class TopicBasedRemoteLogMetadataManager(RemoteLogMetadataManager):
    """See the module docstring. Counters for tests: ``records_consumed``, ``records_applied``,
    ``skipped_records`` (and ``skipped``, the last ones), ``rebuilt_partitions``."""

    def __init__(self, config: TopicBasedRlmmConfig) -> None:
        self.config = config
        self.topic = config.topic
        common = {**config.client_config, "bootstrap.servers": config.bootstrap_servers}
        self._admin = AdminClient(dict(common))
        self.num_partitions, self.delete_retention_ms = self._ensure_topic()
        self.cache = MetadataCache(config.cache_dir, topic=self.topic, num_partitions=self.num_partitions)
        # A reader has no producer: an idempotent producer asks for a producer id at once, which needs WRITE on the
        # topic or IDEMPOTENT_WRITE on the cluster, rights a principal that only reads should not need.
        self._producer = None if config.read_only else Producer(
            {**common, "acks": "all", "enable.idempotence": True, "linger.ms": 1, **config.producer_config})
        self._consumer = Consumer({**common, "group.id": f"rlmm-{uuid.uuid4()}", "enable.auto.commit": False,
                                   "enable.partition.eof": True, "auto.offset.reset": "earliest",
                                   "fetch.wait.max.ms": 50, **config.consumer_config})
        self._cond = threading.Condition()
        self._applied: dict[int, int] = {}        # metadata partition -> next offset applied (consumer thread)
        self._assigned: set[int] = set()
        self._ready: set[int] = set()
        self._at_eof: set[int] = set()
        self._served: dict[TopicIdPartition, int] = {}
        self._held: collections.Counter[int] = collections.Counter()  # metadata partitions a write is using
        self._commands: queue.Queue[tuple[Callable[[], object], list]] = queue.Queue()
        self._skipped_at: collections.OrderedDict[tuple[int, int], SkippedRecord] = collections.OrderedDict()
        self._tombstoned: set[tuple[uuid.UUID, int, uuid.UUID]] = set()
        self._stop = threading.Event()
        self._closed = False
        self._thread_error: BaseException | None = None
        self.records_consumed = 0
        self.records_applied = 0
        self.skipped_records = 0
        self.skipped: collections.deque[SkippedRecord] = collections.deque(maxlen=1000)
        self.rebuilt_partitions: list[int] = []
        self.resumed_partitions: list[int] = []
        self._thread = threading.Thread(target=self._run, name=f"rlmm-consumer-{self.topic}", daemon=True)
        self._thread.start()
        if config.serve_all:
            self._call(lambda: self._assign(range(self.num_partitions)))

    # ------------------------------------------------------------------------------------------------ topic
    def _ensure_topic(self) -> tuple[int, int]:
        cfg = self.config
        topic_conf = {"cleanup.policy": "compact", **cfg.topic_config}
        wait_s = cfg.kafka_timeout_s
        md = self._admin.list_topics(self.topic, timeout=wait_s).topics.get(self.topic)
        if (md is None or md.error is not None) and not cfg.create_topic:
            why = "does not exist" if md is None or md.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART \
                else f"cannot be described ({md.error})"
            raise MetadataTopicMissingError(
                f"metadata topic {self.topic} {why} on {cfg.bootstrap_servers}, and this manager does not create it "
                "(it reads metadata it does not own): check the topic name and the cluster, or create the topic "
                "(rebuild it from the store) first")
        if md is None or md.error is not None:
            fut = self._admin.create_topics([NewTopic(self.topic, cfg.num_partitions, cfg.replication_factor,
                                                      config=dict(topic_conf))])[self.topic]
            try:
                fut.result(wait_s)
            except KafkaException as err:
                if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise MetadataWriteError(f"cannot create metadata topic {self.topic}: {err}") from err
        deadline = time.monotonic() + wait_s
        while True:
            md = self._admin.list_topics(self.topic, timeout=min(10.0, wait_s)).topics.get(self.topic)
            if md is not None and md.error is None and md.partitions and all(
                    p.leader >= 0 for p in md.partitions.values()):
                break
            if time.monotonic() > deadline:
                raise MetadataWriteError(f"metadata topic {self.topic} has no leaders after {wait_s:g}s")
            time.sleep(0.1)
        n = len(md.partitions)
        if n != cfg.num_partitions:
            log.warning("metadata topic %s has %d partitions, configured %d: using %d", self.topic, n,
                        cfg.num_partitions, n)
        return n, self._delete_retention_ms(time.monotonic() + wait_s)

    def _delete_retention_ms(self, deadline: float) -> int:
        """The topic's ``delete.retention.ms``. Right after another manager created the topic, a broker whose
        metadata has not caught up yet answers UNKNOWN_TOPIC_OR_PART: retry until ``deadline``."""
        res = ConfigResource(ResourceType.TOPIC, self.topic)
        while True:
            try:
                entries = self._admin.describe_configs([res])[res].result(self.config.kafka_timeout_s)
                return int(entries["delete.retention.ms"].value)
            except KafkaException as err:
                code = err.args[0].code() if err.args and isinstance(err.args[0], KafkaError) else None
                if code != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                    raise MetadataWriteError(f"cannot describe metadata topic {self.topic}: {err}") from err
                time.sleep(0.2)

    # ------------------------------------------------------------------------------- consumer thread side
    def _call(self, fn: Callable[[], object], timeout_s: float = 60.0) -> object:
        """Run ``fn`` on the consumer thread (it owns the consumer and the cache writes); wait for it."""
        if threading.current_thread() is self._thread:
            return fn()
        box: list = []
        done = threading.Event()
        self._commands.put((fn, [box, done]))
        if not done.wait(timeout_s):
            raise RemoteLogMetadataError(f"consumer thread did not answer within {timeout_s}s")
        if box and isinstance(box[0], BaseException):
            raise box[0]
        return box[0] if box else None

    def _assign(self, mps: Iterable[int]) -> None:
        new = sorted(set(mps) - self._assigned)
        if not new:
            return
        now_ms = int(time.time() * 1000)
        tps, wipe = [], []
        for mp in new:
            low, high = self._watermarks(mp)
            prog = self.cache.progress(mp)
            if (prog is not None and prog.caught_up_wall_ms > 0
                    and now_ms - prog.caught_up_wall_ms <= self.delete_retention_ms and prog.next_offset >= low):
                start = prog.next_offset
                self.resumed_partitions.append(mp)
            else:
                if prog is not None:
                    log.info("metadata partition %d: cache away since %d ms (delete.retention.ms %d) or below log "
                             "start %d: rebuilding from the beginning", mp, prog.caught_up_wall_ms,
                             self.delete_retention_ms, low)
                wipe.append(mp)
                start = low
                self.rebuilt_partitions.append(mp)
            tps.append(TopicPartition(self.topic, mp, start if start > 0 else OFFSET_BEGINNING))
            with self._cond:
                self._applied[mp] = start
                if start >= high:
                    self._ready.add(mp)
                    self._at_eof.add(mp)
        if wipe:
            self.cache.wipe(wipe)
        self._consumer.incremental_assign(tps)
        with self._cond:
            self._assigned.update(new)
            self._cond.notify_all()

    def _watermarks(self, mp: int) -> tuple[int, int]:
        """(log start, high watermark) of a metadata partition; retried while leadership settles."""
        timeout_s = self.config.kafka_timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._consumer.get_watermark_offsets(TopicPartition(self.topic, mp),
                                                            timeout=min(10.0, timeout_s))
            except KafkaException as err:
                if time.monotonic() > deadline or not err.args[0].retriable() and err.args[0].code() not in (
                        KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                        KafkaError.UNKNOWN_TOPIC_OR_PART):
                    raise MetadataWriteError(f"cannot read the offsets of {self.topic}-{mp}: {err}") from err
                time.sleep(0.2)

    def _unassign(self, mps: Iterable[int]) -> None:
        """Stop consuming ``mps``, except those a write holds (:meth:`_holding`): under the lock the writers take
        to hold one, so a write either sees its partition unassigned (and assigns it again) or keeps it."""
        with self._cond:
            gone = sorted(set(mps) & self._assigned - set(self._held))
            if not gone:
                return
            self._consumer.incremental_unassign([TopicPartition(self.topic, mp) for mp in gone])
            for mp in gone:
                self._assigned.discard(mp)
                self._ready.discard(mp)
                self._at_eof.discard(mp)
                self._applied.pop(mp, None)
            self._cond.notify_all()

    def _run(self) -> None:
        last_caught_up = 0.0
        last_tombstones = 0.0
        try:
            while not self._stop.is_set():
                self._run_commands()
                self._consume_once()
                now = time.monotonic()
                if self._at_eof and now - last_caught_up >= self.config.caught_up_refresh_s:
                    self._mark_caught_up()
                    last_caught_up = now
                if self._producer is not None and now - last_tombstones >= self.config.tombstone_check_interval_s:
                    self._write_due_tombstones()
                    last_tombstones = now
                if self._producer is not None:
                    self._producer.poll(0)
            self._drain_to_eof(self.config.close_drain_s)
            self._mark_caught_up()
        except BaseException as err:  # noqa: BLE001 - reported to every waiter, then re-raised
            log.exception("metadata consumer thread died")
            self._thread_error = err
            with self._cond:
                self._cond.notify_all()
            raise

    def _consume_once(self) -> None:
        """One poll: apply the records fetched, note the partitions that reached their end."""
        # consume(n, timeout) waits for n messages or the whole timeout: a writer waiting for its own record would
        # wait the full timeout each time. Wait for the first message only, then take what is already fetched.
        first = self._consumer.poll(0.05)
        msgs = [] if first is None else [first, *self._consumer.consume(
            num_messages=max(1, self.config.max_batch_records - 1), timeout=0)]
        records = []
        eofs = []
        assigned = self._assigned
        for m in msgs:
            if m.error() is not None:
                err = m.error()
                if err.code() == KafkaError._PARTITION_EOF:
                    eofs.append((m.partition(), m.offset()))
                else:
                    log.warning("metadata consumer error: %s", err)
                continue
            mp = m.partition()
            if mp in assigned:
                records.append((mp, m.offset(), m.key(), m.value()))
        if records:
            self._apply(records)
        if eofs:
            with self._cond:
                for mp, _off in eofs:
                    if mp in self._assigned:
                        self._at_eof.add(mp)
                        self._ready.add(mp)
                self._cond.notify_all()

    def _drain_to_eof(self, timeout_s: float) -> None:
        """On close: consume until every assigned partition is at its end again (or ``timeout_s``), so the last
        caught-up mark covers them all. A partition whose last records were applied but whose end-of-partition
        event had not come yet would otherwise keep its old mark (none, on a young cache) and be rebuilt from the
        beginning on the next start."""
        deadline = time.monotonic() + timeout_s
        while self._assigned - self._at_eof and time.monotonic() < deadline:
            self._consume_once()

    def _run_commands(self) -> None:
        while True:
            try:
                fn, (box, done) = self._commands.get_nowait()
            except queue.Empty:
                return
            try:
                box.append(fn())
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                box.append(err)
            done.set()

    def _apply(self, records: list) -> None:
        self.records_consumed += len(records)
        out = self.cache.apply(records, {})
        self.records_applied += out.applied
        APPLIED_RECORDS.inc(out.applied)
        last: dict[int, int] = {}
        for mp, offset, _k, _v in records:
            last[mp] = offset
        with self._cond:
            for mp, offset in last.items():
                self._applied[mp] = offset + 1
                self._at_eof.discard(mp)
            for s in out.skipped or ():
                # a second deleter's record is normal in a cluster (not corruption): INFO; any other refusal: ERROR
                log.log(logging.INFO if s.deleted_already else logging.ERROR,
                        "metadata partition %d offset %d skipped (%s%s): %s", s.metadata_partition, s.offset,
                        s.reason, ", deleted already" if s.deleted_already else "", s.error)
                SKIPPED_RECORDS.labels(s.reason).inc()
                self.skipped_records += 1
                self.skipped.append(s)
                self._skipped_at[(s.metadata_partition, s.offset)] = s
                while len(self._skipped_at) > 10_000:
                    self._skipped_at.popitem(last=False)
            self._cond.notify_all()

    def _mark_caught_up(self) -> None:
        with self._cond:
            mps = {mp: self._applied[mp] for mp in self._at_eof if mp in self._applied}
        if mps:
            now_ms = int(time.time() * 1000)
            self.cache.mark_caught_up({mp: Progress(nxt, now_ms) for mp, nxt in mps.items()})

    def _write_due_tombstones(self) -> None:
        now_ms = int(time.time() * 1000)
        for mp in sorted(self._assigned):
            for d in self.cache.deleted_segments(mp):
                ident = (d.topic_id, d.partition, d.segment_id)
                if (d.broker_id != self.config.broker_id or ident in self._tombstoned
                        or now_ms - d.event_timestamp_ms < self.config.tombstone_delay_ms):
                    continue
                # the DELETE_SEGMENT_FINISHED key last: consuming its tombstone clears the pending entry
                for key in segment_keys(d.topic_id, d.partition, d.segment_id):
                    self._producer.produce(self.topic, key=key, value=None, partition=mp)
                self._tombstoned.add(ident)

    # ------------------------------------------------------------------------------------------ write side
    def _writer(self) -> Producer:
        """The producer of the write side; a read-only manager refuses every write."""
        self._check_open()
        if self._producer is None:
            raise RemoteLogMetadataError(f"this metadata manager of {self.topic} is read-only: nothing is written")
        return self._producer

    def _check_open(self) -> None:
        if self._closed:
            raise RemoteLogMetadataError("the metadata manager is closed")
        if self._thread_error is not None:
            raise RemoteLogMetadataError(f"the metadata consumer thread died: {self._thread_error!r}")

    @contextmanager
    def _holding(self, tps: Iterable[TopicIdPartition]) -> Iterator[None]:
        """Consume the metadata partitions of ``tps`` (if not yet), wait until caught up, and keep them consumed
        until the block ends: a write checks against them, then waits to read itself back. ``on_stop_partitions``
        leaves a held partition assigned: unassigned, it would never be applied again, and the read-your-writes
        wait on it could only time out (a fenced copy's clean-up once waited its full timeout on the metadata
        partition of its just-deleted topic). What a write assigned stays assigned until the next
        ``on_stop_partitions``, as before."""
        self._check_open()  # a closed manager's thread answers no command and its cache is closed
        mps = {self.cache.mp_of(tp): tp for tp in tps}
        with self._cond:  # before the check below: _unassign runs under the same lock and skips held partitions
            self._held.update(list(mps))
        try:
            missing = [mp for mp in mps if mp not in self._assigned]
            if missing:
                self._call(lambda: self._assign(missing))
            not_ready = [tp for mp, tp in mps.items() if mp not in self._ready]
            if not_ready:
                self.wait_ready(not_ready, self.config.write_timeout_s)
            yield
        finally:
            with self._cond:
                self._held.subtract(list(mps))
                for mp in mps:
                    if self._held[mp] <= 0:
                        del self._held[mp]

    def _not_consumed(self, mp: int, what: object) -> PartitionNotServedError:
        return PartitionNotServedError(f"{what}: metadata partition {self.topic}-{mp} is no longer consumed by this "
                                       "manager (on_stop_partitions): its records would never be applied here")

    def _write(self, tp: TopicIdPartition, key: bytes, value: bytes, what: object) -> None:
        producer = self._writer()
        mp = self.cache.mp_of(tp)
        result: list = []

        def on_delivery(err, msg) -> None:
            result.append((err, msg.offset() if err is None else None))

        deadline = time.monotonic() + self.config.write_timeout_s
        producer.produce(self.topic, key=key, value=value, partition=mp, on_delivery=on_delivery)
        while not result and time.monotonic() < deadline:
            producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
        if not result:
            raise MetadataWriteError(f"{what}: not acknowledged by {self.topic}-{mp} within "
                                     f"{self.config.write_timeout_s}s")
        err, offset = result[0]
        if err is not None:
            raise MetadataWriteError(f"{what}: {self.topic}-{mp} refused the record: {err}")
        with self._cond:
            while self._applied.get(mp, -1) <= offset:
                if self._thread_error is not None:
                    raise RemoteLogMetadataError(f"the metadata consumer thread died: {self._thread_error!r}")
                if mp not in self._assigned:
                    raise self._not_consumed(mp, what)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ReadYourWritesTimeoutError(
                        f"{what}: written at {self.topic}-{mp} offset {offset} but the local cache applied only "
                        f"up to {self._applied.get(mp, -1) - 1} within {self.config.write_timeout_s}s")
                self._cond.wait(min(left, 0.5))
            skipped = self._skipped_at.get((mp, offset))
        if skipped is not None:
            # written, but refused by every cache (the topic's order decides): e.g. a copy fenced by a newer leader
            # whose COPY_SEGMENT_STARTED landed between this writer's check and its record
            error = CopyFencedError if skipped.fenced else InvalidStateTransitionError
            raise error(f"{what}: the cache refused the record at {self.topic}-{mp} offset {offset}: {skipped.error}")

    def add_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> None:
        with self._holding([metadata.topic_id_partition]):
            tp, key, value, sid = self._checked(metadata)
            self._write(tp, key, value, sid)

    def update_remote_log_segment_metadata(self, update: RemoteLogSegmentMetadataUpdate) -> None:
        with self._holding([update.remote_log_segment_id.topic_id_partition]):
            tp, key, value, sid = self._checked(update)
            self._write(tp, key, value, sid)

    def _checked(self, rec: RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate,
                 ) -> tuple[TopicIdPartition, bytes, bytes, object]:
        """A segment record checked against the cache (the state machine, the partition's delete state, copy
        fencing), as (partition, record key, record value, segment id), ready to write. An add must be
        COPY_SEGMENT_STARTED (ValueError); refusals raise the metadata manager's errors. The caller holds the
        partition's metadata partition (:meth:`_holding`)."""
        sid = rec.remote_log_segment_id
        tp = sid.topic_id_partition
        existing = self.cache.segment(tp, sid.id)
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
        key = encode_key(KeyKind.SEGMENT, tp.topic_id, tp.partition, sid.id, rec.state)
        return tp, key, serde.encode(rec), sid

    def write_segment_metadata_many(
            self, records: Sequence[RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate],
    ) -> list[RemoteLogMetadataError | None]:
        """See :meth:`RemoteLogMetadataManager.write_segment_metadata_many`: every record checked against the cache,
        all produced, one flush, then one read-your-writes wait per metadata partition (for its highest offset)
        instead of two round trips per record. Each record's wait allows ``write_timeout_s`` of no progress."""
        out: list[RemoteLogMetadataError | None] = [None] * len(records)
        items: list[tuple[int, TopicIdPartition, bytes, bytes, object]] = []
        with self._holding({_tp_of(rec) for rec in records}):
            for i, rec in enumerate(records):
                try:
                    tp, key, value, sid = self._checked(rec)
                except RemoteLogMetadataError as err:
                    out[i] = err
                    continue
                items.append((i, tp, key, value, sid))
            for i, err in zip((it[0] for it in items), self._write_many(items), strict=True):
                out[i] = err
        return out

    def _write_many(self, items: list[tuple[int, TopicIdPartition, bytes, bytes, object]],
                    ) -> list[RemoteLogMetadataError | None]:
        """Produce every item, flush once, wait once per metadata partition; per item None or its error."""
        producer = self._writer()
        n = len(items)
        errors: list[RemoteLogMetadataError | None] = [None] * n
        written: list[tuple[int, int] | None] = [None] * n     # (metadata partition, offset)
        delivered = [0]

        def on_delivery(j: int, mp: int, what: object):
            def cb(err, msg) -> None:
                delivered[0] += 1
                if err is not None:
                    errors[j] = MetadataWriteError(f"{what}: {self.topic}-{mp} refused the record: {err}")
                else:
                    written[j] = (mp, msg.offset())
            return cb

        timeout = self.config.write_timeout_s
        for j, (_i, tp, key, value, what) in enumerate(items):
            mp = self.cache.mp_of(tp)
            while True:
                try:
                    producer.produce(self.topic, key=key, value=value, partition=mp,
                                     on_delivery=on_delivery(j, mp, what))
                    break
                except BufferError:  # the producer's queue is full: let deliveries drain it
                    producer.poll(0.1)
        progress_at, seen = time.monotonic(), -1
        while delivered[0] < n:
            if delivered[0] != seen:
                progress_at, seen = time.monotonic(), delivered[0]
            elif time.monotonic() - progress_at > timeout:
                break
            producer.flush(1.0)
        for j in range(n):
            if written[j] is None and errors[j] is None:
                errors[j] = MetadataWriteError(f"{items[j][4]}: not acknowledged by {self.topic} within {timeout}s")
        highest: dict[int, int] = {}
        for w in written:
            if w is not None:
                highest[w[0]] = max(highest.get(w[0], -1), w[1])
        with self._cond:
            for mp, offset in highest.items():
                progress_at, seen = time.monotonic(), self._applied.get(mp, -1)
                while self._applied.get(mp, -1) <= offset:
                    if self._thread_error is not None:
                        raise RemoteLogMetadataError(f"the metadata consumer thread died: {self._thread_error!r}")
                    if mp not in self._assigned:
                        for j, w in enumerate(written):
                            if w is not None and w[0] == mp and errors[j] is None:
                                errors[j] = self._not_consumed(mp, items[j][4])
                        break
                    if self._applied.get(mp, -1) != seen:
                        progress_at, seen = time.monotonic(), self._applied.get(mp, -1)
                    left = progress_at + timeout - time.monotonic()
                    if left <= 0:
                        for j, w in enumerate(written):
                            if w is not None and w[0] == mp and w[1] >= self._applied.get(mp, -1):
                                errors[j] = ReadYourWritesTimeoutError(
                                    f"{items[j][4]}: written at {self.topic}-{mp} offset {w[1]} but the local cache "
                                    f"applied only up to {self._applied.get(mp, -1) - 1} within {timeout}s")
                        break
                    self._cond.wait(min(left, 0.5))
            for j, w in enumerate(written):
                skipped = self._skipped_at.get(w) if w is not None and errors[j] is None else None
                if skipped is not None:
                    error = CopyFencedError if skipped.fenced else InvalidStateTransitionError
                    errors[j] = error(f"{items[j][4]}: the cache refused the record at {self.topic}-{w[0]} offset "
                                      f"{w[1]}: {skipped.error}")
        return errors

    def put_remote_partition_delete_metadata(self, metadata: RemotePartitionDeleteMetadata) -> None:
        tp = metadata.topic_id_partition
        with self._holding([tp]):
            existing = self.cache.partition_delete(tp)
            refused = refuse_partition_delete(tp, metadata.state, None if existing is None else existing.state)
            if refused is not None:
                raise refused
            key = encode_key(KeyKind.PARTITION_DELETE, tp.topic_id, tp.partition, None, metadata.state)
            self._write(tp, key, serde.encode(metadata), tp)

    # ------------------------------------------------------------------------------------------- read side
    def _served_mp(self, tp: TopicIdPartition) -> None:
        self._check_open()
        mp = self.cache.mp_of(tp)
        if mp not in self._assigned:
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
        """The highest broker leader epoch under which a copy of ``tp`` was started (None: no copy had one). A copy
        started under a lower epoch can no longer finish (:class:`rlmm.api.CopyFencedError`)."""
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
        self._call(lambda: self._assign({self._served[tp] for tp in tps}))

    def on_stop_partitions(self, partitions: Iterable[TopicIdPartition]) -> None:
        self._check_open()
        for tp in partitions:
            self._served.pop(tp, None)
        if self.config.serve_all:
            return
        still = set(self._served.values())
        self._call(lambda: self._unassign(self._assigned - still))

    def is_ready(self, tp: TopicIdPartition) -> bool:
        return self.cache.mp_of(tp) in self._ready

    def wait_ready(self, tps: Iterable[TopicIdPartition], timeout_s: float = 60.0) -> None:
        """Block until :meth:`is_ready` holds for every partition (or raise ReadYourWritesTimeoutError). A partition
        whose metadata partition is not consumed (never served, or stopped meanwhile) raises
        :class:`PartitionNotServedError` at once, rather than wait for records that will never be applied."""
        by_mp = {self.cache.mp_of(tp): tp for tp in tps}
        mps = set(by_mp)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not mps <= self._ready:
                gone = sorted(mps - self._assigned)
                if gone:  # never applied again here: waiting could only time out
                    raise PartitionNotServedError(
                        f"{by_mp[gone[0]]}: metadata partition {self.topic}-{gone[0]} is not consumed by this "
                        "manager (not served, or stopped while waiting): call on_partition_leadership_changes first")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ReadYourWritesTimeoutError(f"metadata partitions {sorted(mps - self._ready)} not caught "
                                                     f"up within {timeout_s}s")
                self._cond.wait(min(left, 0.5))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._stop.set()
        self._thread.join(60)
        try:
            if self._producer is not None:
                self._producer.flush(10)
            self._consumer.close()
        finally:
            self.cache.close()


def _tp_of(rec: RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate) -> TopicIdPartition:
    return rec.remote_log_segment_id.topic_id_partition
