"""Deleting remote segments: the one delete path, and the to-be-deleted topic for deletes the store refused.

Every deletion of a segment the metadata knows goes through :class:`SegmentDeleter`: remote retention
(:mod:`rlm.tasks.expiration`), the copy task's clean-ups (:mod:`rlm.tasks.copier`), the topic purge
(:mod:`rlm.tasks.purge`) with
:meth:`SegmentDeleter.delete`, and the cleaner's retries (:mod:`rlm.tasks.cleaner`) with :meth:`SegmentDeleter.retry`.
The walk is the same for all: DELETE_SEGMENT_STARTED, the store's delete
(:meth:`~rsm.api.RemoteStorageManagerApi.delete_log_segment_data`, which removes the index object first),
DELETE_SEGMENT_FINISHED. When the store refuses, the segment stays DELETE_SEGMENT_STARTED and its full metadata
record goes to the to-be-deleted topic (once); :class:`rlm.tasks.cleaner.Cleaner` consumes that topic and retries until
the store agrees. Objects no metadata owns are not segments: garbage collection (:mod:`rlm.tasks.gc`) deletes them
through the same storage-manager call.

The to-be-deleted topic's records: key = the remote segment id's 16 bytes, value = the segment's metadata in
``RemoteLogMetadataSerde`` format (api key 0), so Kafka's formatter can show them too.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from rlm import metrics
from rlm.errors import DeleteQueueError
from rlm.tier import to_rsm
from rlmm import serde
from rlmm.api import (
    InvalidStateTransitionError,
    RemoteLogMetadataManager,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
)
from rsm.api import RemoteStorageManagerApi
from rsm.errors import RemoteStorageError

__all__ = ["DeleteOutcome", "SegmentDeleter", "ToBeDeletedQueue", "ensure_topic"]

log = logging.getLogger(__name__)


def ensure_topic(client_config: dict[str, object], name: str, partitions: int, replication_factor: int,
                 config: dict[str, str] | None = None, timeout_s: float = 30.0) -> None:
    """Create ``name`` when absent (an existing topic is left as it is)."""
    admin = AdminClient(client_config)
    if name in admin.list_topics(timeout=timeout_s).topics:
        return
    fut = admin.create_topics([NewTopic(name, partitions, replication_factor, config=config or {})],
                              request_timeout=timeout_s)[name]
    try:
        fut.result(timeout_s + 5)
    except Exception as err:  # noqa: BLE001 - lost a creation race with another sidecar: fine
        if "TOPIC_ALREADY_EXISTS" not in str(err):
            raise


class ToBeDeletedQueue:
    """The producer side of ``__remote_segments_to_be_deleted``."""

    def __init__(self, client_config: dict[str, object], topic: str) -> None:
        self.topic = topic
        self._producer = Producer({**client_config, "acks": "all", "enable.idempotence": True})

    def put(self, md: RemoteLogSegmentMetadata, timeout_s: float = 30.0) -> None:
        errors: list[object] = []
        self._producer.produce(self.topic, key=md.remote_log_segment_id.id.bytes, value=serde.encode(md),
                               on_delivery=lambda err, _msg: errors.append(err) if err else None)
        if self._producer.flush(timeout_s) != 0 or errors:
            raise DeleteQueueError(f"could not write {md.remote_log_segment_id} to {self.topic}: {errors or 'timeout'}")

    def close(self) -> None:
        self._producer.flush(10)


class DeleteOutcome(enum.Enum):
    """How one attempt to delete a segment ended."""

    DELETED = "deleted"
    """The objects are gone and this attempt recorded DELETE_SEGMENT_FINISHED."""
    FINISHED_ELSEWHERE = "finished-elsewhere"
    """The objects are gone; DELETE_SEGMENT_FINISHED was recorded by someone else meanwhile (the cleaner, another
    sidecar), or by this deleter lately."""
    REFUSED = "refused"
    """The store refused: the segment stays DELETE_SEGMENT_STARTED (queued for the cleaner)."""
    BUSY = "busy"
    """Another task of this sidecar is deleting it right now."""

    @property
    def gone(self) -> bool:
        return self in (DeleteOutcome.DELETED, DeleteOutcome.FINISHED_ELSEWHERE)


class SegmentDeleter:
    """Deletes remote segments; safe to call from several tasks at once (expiration, the copy task's clean-up, the
    topic purge, the cleaner).

    A segment already being deleted by another task of this sidecar, or deleted by it lately, is not deleted a
    second time (a second DELETE_SEGMENT_FINISHED would be refused by the metadata, or come after its
    tombstones). A refused delete is queued for the cleaner once; later attempts that are refused again do not
    queue it again.
    """

    RECENT = 10_000  # how many finished deletes are remembered
    RETRY_REASON = "cleaner"  # the reason (metrics, logs) of the cleaner's retries

    def __init__(self, broker_id: int, rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManagerApi,
                 queue: ToBeDeletedQueue | None) -> None:
        self.broker_id = broker_id
        self.rlmm = rlmm
        self.rsm = rsm
        self.queue = queue
        self._lock = threading.Lock()
        self._busy: set[uuid.UUID] = set()
        self._queued: set[uuid.UUID] = set()
        self._done: dict[uuid.UUID, None] = {}

    def delete(self, md: RemoteLogSegmentMetadata, reason: str) -> bool:
        """Delete one remote segment; True when it is gone, False when it was queued for the cleaner (or another
        task of ours is deleting it). Without a queue, a refusal raises the store's
        :class:`~rsm.errors.RemoteStorageError`; an invalid DELETE_SEGMENT_STARTED transition raises
        :class:`~rlmm.api.InvalidStateTransitionError`."""
        return self._attempt(md, reason, retry=False).gone

    def retry(self, md: RemoteLogSegmentMetadata) -> DeleteOutcome:
        """The cleaner's retry of a delete the store refused before (``md`` read back from the metadata): the same
        walk, but a refusal is only logged and counted (``cleaner-delete``), never queued again nor raised: the
        record is still in the to-be-deleted topic. Raises :class:`~rlmm.api.InvalidStateTransitionError` when
        DELETE_SEGMENT_STARTED can no longer be recorded (finished by someone else)."""
        return self._attempt(md, self.RETRY_REASON, retry=True)

    def _attempt(self, md: RemoteLogSegmentMetadata, reason: str, *, retry: bool) -> DeleteOutcome:
        sid = md.remote_log_segment_id
        with self._lock:
            if sid.id in self._done:
                return DeleteOutcome.FINISHED_ELSEWHERE
            if sid.id in self._busy:
                return DeleteOutcome.BUSY
            self._busy.add(sid.id)
        try:
            return self._walk(md, reason, retry)
        finally:
            with self._lock:
                self._busy.discard(sid.id)

    def _update(self, md: RemoteLogSegmentMetadata, state: RemoteLogSegmentState) -> None:
        self.rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
            md.remote_log_segment_id, int(time.time() * 1000), md.custom_metadata, state, self.broker_id))

    def _walk(self, md: RemoteLogSegmentMetadata, reason: str, retry: bool) -> DeleteOutcome:
        """DELETE_SEGMENT_STARTED -> the store's delete -> DELETE_SEGMENT_FINISHED."""
        sid = md.remote_log_segment_id
        if md.state != RemoteLogSegmentState.DELETE_SEGMENT_STARTED:
            self._update(md, RemoteLogSegmentState.DELETE_SEGMENT_STARTED)
        started = time.monotonic()
        try:
            self.rsm.delete_log_segment_data(to_rsm(md))
        except RemoteStorageError as err:
            if not self._refused(md, reason, err, retry):
                raise
            return DeleteOutcome.REFUSED
        metrics.DELETE_SECONDS.observe(time.monotonic() - started)
        outcome = DeleteOutcome.DELETED
        try:
            self._update(md, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED)
        except InvalidStateTransitionError as err:
            # Finished by someone else meanwhile (the cleaner, another sidecar): the objects are gone either way.
            outcome = DeleteOutcome.FINISHED_ELSEWHERE
            log.info("remote segment deleted; its deletion was already recorded",
                     extra={"segment": str(sid), "reason": reason, "error": str(err)})
        with self._lock:
            self._queued.discard(sid.id)
            self._done[sid.id] = None
            while len(self._done) > self.RECENT:
                self._done.pop(next(iter(self._done)))
        metrics.SEGMENTS_DELETED.labels(sid.topic_id_partition.topic, reason).inc()
        log.info("remote segment deleted", extra={
            "segment": str(sid), "reason": reason, "start_offset": md.start_offset,
            "end_offset": md.end_offset_inclusive})
        return outcome

    def _refused(self, md: RemoteLogSegmentMetadata, reason: str, err: RemoteStorageError, retry: bool) -> bool:
        """The store refused: the cleaner's retry says so and waits; any other caller queues it for the cleaner
        (the first time). False when it cannot be queued (no queue): the caller raises."""
        sid = md.remote_log_segment_id
        if retry:
            metrics.ERRORS.labels("cleaner-delete").inc()
            log.warning("store still refuses the delete; will retry", extra={"segment": str(sid), "error": str(err)})
            return True
        metrics.ERRORS.labels("delete").inc()
        if self.queue is None:
            return False
        with self._lock:
            first = sid.id not in self._queued
        if first:
            log.warning("remote delete refused; queued for the cleaner",
                        extra={"segment": str(sid), "reason": reason, "error": str(err)})
            # Marked queued only once the record is written: a write that fails raises (the run fails, logged),
            # and the next attempt on the segment (each copy run retries DELETE_SEGMENT_STARTED ones) queues it.
            self.queue.put(md)
            with self._lock:
                self._queued.add(sid.id)
        return True
