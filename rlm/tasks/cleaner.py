"""The cleaner: consumes the to-be-deleted topic and retries each refused delete, with backoff, until done.

Every sidecar runs one, in one consumer group per to-be-deleted topic (:func:`group_for`: ``rlm-cleaner`` for the
default topic), so each record is retried by exactly one of them. A record is committed only once its segment is
gone from the store and DELETE_SEGMENT_FINISHED is recorded (or the metadata no longer knows the segment: somebody
else finished it). On a refusal the consumer seeks back to the same record and waits (exponential backoff,
``base_backoff_s`` doubling up to ``max_backoff_s``); records behind it wait too, which keeps deletes in order.

The retry is the one delete path (:meth:`rlm.tasks.deleter.SegmentDeleter.retry`): DELETE_SEGMENT_STARTED (already
recorded for a queued segment), the store's delete, DELETE_SEGMENT_FINISHED; only a refusal is handled apart
(logged, counted as ``cleaner-delete``, never queued again).

The consumer subscribes once the broker lists the topic (:meth:`Cleaner._wait_listed`). The sidecar creates it just
before (:func:`rlm.tasks.deleter.ensure_topic`), and Kafka's CreateTopics answers once the controller has the topic,
not once the broker answering Metadata has applied it. Behind a large change (a topic of 50 partitions created just
before: the metadata topic's default, ``__consumer_offsets`` on a new cluster) the broker listed it 0.35-1.3 s
later, and 7 of 8 consumers subscribed at once were told ``UNKNOWN_TOPIC_OR_PART`` (0 of 8 after the wait; session
24): librdkafka tells the subscription that once, as an error, then takes the topic up when it is listed; every run
of bench_sidecar logged it as a warning. An error after the wait is the topic gone or the cluster failing: a warning.

``rlm_deletions_queued`` is the cleaner's backlog: records of the to-be-deleted topic in the partitions this
sidecar's cleaner consumes, not yet done (the high watermark it last fetched minus its position), refreshed about
once a second. Summed over the sidecars it is the whole queue; it stays above 0 while the store refuses.
"""

from __future__ import annotations

import logging
import threading
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from rlm import metrics
from rlm.config import MetadataSettings
from rlm.tasks.deleter import DeleteOutcome, SegmentDeleter
from rlmm import serde
from rlmm.api import (
    InvalidStateTransitionError,
    RemoteLogMetadataError,
    RemoteLogMetadataManager,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
)
from rsm.api import RemoteStorageManagerApi

__all__ = ["Cleaner", "group_for"]

log = logging.getLogger(__name__)

BACKLOG_INTERVAL_S = 1.0
LISTED_WAIT_S = 30.0  # at most this long for the broker to list the topic before subscribing all the same
DEFAULT_TOPIC = MetadataSettings.model_fields["to_be_deleted_topic"].default
DEFAULT_GROUP = "rlm-cleaner"


def group_for(topic: str) -> str:
    """The cleaner's consumer group for the to-be-deleted topic ``topic``: ``rlm-cleaner`` for the default topic,
    ``rlm-cleaner.<topic>`` for any other. Two deployments on one cluster each have their own queue, so they never
    share a group, whose static members (``<group>-<broker id>``) would otherwise fence each other."""
    return DEFAULT_GROUP if topic == DEFAULT_TOPIC else f"{DEFAULT_GROUP}.{topic}"


def _backlog(consumer: Consumer, next_offsets: dict[tuple[str, int], int]) -> int:
    """Records not yet done in the partitions assigned to ``consumer``: the high watermark of its last fetch
    (no request) minus the next offset to handle (the record retried, or the one after the last done; the
    consumer's position before any, which librdkafka does not know right after a seek)."""
    try:
        assigned = consumer.assignment()
        if not assigned:
            return 0
        total = 0
        for tp in consumer.position(assigned):
            _low, high = consumer.get_watermark_offsets(tp, cached=True)
            offset = next_offsets.get((tp.topic, tp.partition), tp.offset)
            if offset >= 0 and high >= 0:
                total += max(high - offset, 0)
        return total
    except Exception:  # noqa: BLE001 - a gauge: not worth failing the cleaner for
        return 0


def _listed(consumer: Consumer, topic: str) -> bool:
    """Whether the broker ``consumer`` asks lists ``topic``, each of its partitions with a leader."""
    try:
        md = consumer.list_topics(topic, timeout=5.0).topics.get(topic)
    except KafkaException:
        return False
    return (md is not None and md.error is None and bool(md.partitions)
            and all(p.error is None and p.leader >= 0 for p in md.partitions.values()))


class Cleaner:
    def __init__(self, client_config: dict[str, object], topic: str, rlmm: RemoteLogMetadataManager,
                 rsm: RemoteStorageManagerApi, broker_id: int, *, group_id: str | None = None,
                 base_backoff_s: float = 0.5, max_backoff_s: float = 60.0,
                 deleter: SegmentDeleter | None = None) -> None:
        """``group_id``: by default :func:`group_for` the topic. ``deleter``: the delete path to retry through (by
        default one of its own, without a queue: a retry that is refused again is never queued again)."""
        self.topic = topic
        self.rlmm = rlmm
        self.rsm = rsm
        self.broker_id = broker_id
        self.deleter = deleter or SegmentDeleter(broker_id, rlmm, rsm, None)
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        # A static member (KIP-345), one per broker: closing sends no LeaveGroup, so a sidecar's shutdown never
        # waits on a group leave, and its restart takes its partition back without a rebalance.
        group_id = group_id or group_for(topic)
        self._consumer_config = {**client_config, "group.id": group_id, "group.instance.id": f"{group_id}-{broker_id}",
                                 "enable.auto.commit": False, "auto.offset.reset": "earliest",
                                 "isolation.level": "read_committed"}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rlm-cleaner", daemon=True)
        self.deleted = 0
        self.retries = 0
        self.skipped = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _run(self) -> None:
        consumer = Consumer(self._consumer_config)
        attempt = 0
        measured = 0.0
        next_offsets: dict[tuple[str, int], int] = {}  # per partition: the next record to handle
        try:
            self._wait_listed(consumer)
            consumer.subscribe([self.topic])
            while not self._stop.is_set():
                if time.monotonic() - measured >= BACKLOG_INTERVAL_S:
                    measured = time.monotonic()
                    metrics.DELETIONS_QUEUED.set(_backlog(consumer, next_offsets))
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                if msg.error():
                    if msg.error().code() != KafkaError._PARTITION_EOF:
                        log.warning("cleaner consumer error", extra={"error": str(msg.error())})
                    continue
                try:
                    done = self.handle(msg.value())
                except Exception as err:  # noqa: BLE001 - anything else: retry the same record later
                    log.exception("cleaner failed on a record", extra={"offset": msg.offset(), "error": str(err)})
                    done = False
                if done:
                    consumer.commit(message=msg, asynchronous=False)
                    next_offsets[(msg.topic(), msg.partition())] = msg.offset() + 1
                    attempt = 0
                    continue
                attempt += 1
                self.retries += 1
                next_offsets[(msg.topic(), msg.partition())] = msg.offset()
                consumer.seek(TopicPartition(msg.topic(), msg.partition(), msg.offset()))
                metrics.DELETIONS_QUEUED.set(_backlog(consumer, next_offsets))  # (the backoff may be long)
                self._stop.wait(min(self.max_backoff_s, self.base_backoff_s * 2 ** (attempt - 1)))
        finally:
            consumer.close()
            metrics.DELETIONS_QUEUED.set(0)  # (its partitions go to another sidecar's cleaner)

    def _wait_listed(self, consumer: Consumer) -> None:
        """Wait (up to ``LISTED_WAIT_S``, or until stopped) until the broker lists the topic (see the module's
        docstring); not listed by then, the consumer subscribes all the same, and librdkafka's error is a warning."""
        deadline = time.monotonic() + LISTED_WAIT_S
        while not _listed(consumer, self.topic):
            if self._stop.wait(0.1) or time.monotonic() >= deadline:
                return

    def handle(self, value: bytes | None) -> bool:
        """Try one queued delete; True when the record is done with (deleted, or nothing left to do)."""
        try:
            queued = serde.decode(value)
        except RemoteLogMetadataError as err:
            self.skipped += 1
            log.error("undecodable record in the to-be-deleted topic: skipped", extra={"error": str(err)})
            return True
        if not isinstance(queued, RemoteLogSegmentMetadata):
            self.skipped += 1
            return True
        tp = queued.topic_id_partition
        self.rlmm.on_partition_leadership_changes([], [tp])
        self.rlmm.wait_ready([tp], timeout_s=30)
        current = next((m for m in self.rlmm.list_remote_log_segments(tp)
                        if m.remote_log_segment_id == queued.remote_log_segment_id), None)
        if current is None or current.state == RemoteLogSegmentState.DELETE_SEGMENT_FINISHED:
            return True  # deleted by someone else (a retry of the copy task, another sidecar)
        try:
            outcome = self.deleter.retry(current)
        except InvalidStateTransitionError:
            # The copy task's clean-up (or another sidecar) recorded the deletion meanwhile: done.
            log.info("queued delete was finished by someone else",
                     extra={"segment": str(current.remote_log_segment_id)})
            return True
        if outcome is DeleteOutcome.DELETED:
            self.deleted += 1
        return outcome.gone
