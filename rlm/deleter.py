"""Deleting remote segments: the state walk, and the to-be-deleted topic for deletes the store refused.

Every deletion (retention, a failed or abandoned copy, a purged partition) goes through
:meth:`SegmentDeleter.delete`: DELETE_SEGMENT_STARTED, the store's delete, DELETE_SEGMENT_FINISHED. When the
store refuses, the segment stays DELETE_SEGMENT_STARTED and its full metadata record goes to the
to-be-deleted topic; :class:`rlm.cleaner.Cleaner` consumes that topic and retries until the store agrees.

The to-be-deleted topic's records: key = the remote segment id's 16 bytes, value = the segment's metadata in
``RemoteLogMetadataSerde`` format (api key 0), so Kafka's formatter can show them too.
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from rlm import metrics
from rlm.segments import to_rsm
from rlmm import serde
from rlmm.api import (
    RemoteLogMetadataManager,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
)
from rsm.api import RemoteStorageManagerApi
from rsm.errors import RemoteStorageError

__all__ = ["SegmentDeleter", "ToBeDeletedQueue", "ensure_topic"]

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
        fut.result()
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
            raise RuntimeError(f"could not write {md.remote_log_segment_id} to {self.topic}: {errors or 'timeout'}")

    def close(self) -> None:
        self._producer.flush(10)


class SegmentDeleter:
    def __init__(self, broker_id: int, rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManagerApi,
                 queue: ToBeDeletedQueue | None) -> None:
        self.broker_id = broker_id
        self.rlmm = rlmm
        self.rsm = rsm
        self.queue = queue

    def _update(self, md: RemoteLogSegmentMetadata, state: RemoteLogSegmentState) -> None:
        self.rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
            md.remote_log_segment_id, int(time.time() * 1000), md.custom_metadata, state, self.broker_id))

    def delete(self, md: RemoteLogSegmentMetadata, reason: str) -> bool:
        """Delete one remote segment; True when it is gone, False when it was queued for the cleaner."""
        sid = md.remote_log_segment_id
        if md.state != RemoteLogSegmentState.DELETE_SEGMENT_STARTED:
            self._update(md, RemoteLogSegmentState.DELETE_SEGMENT_STARTED)
        started = time.monotonic()
        try:
            self.rsm.delete_log_segment_data(to_rsm(md))
        except RemoteStorageError as err:
            metrics.ERRORS.labels("delete").inc()
            log.warning("remote delete refused; queued for the cleaner",
                        extra={"segment": str(sid), "reason": reason, "error": str(err)})
            if self.queue is None:
                raise
            self.queue.put(md)
            return False
        metrics.DELETE_SECONDS.observe(time.monotonic() - started)
        self._update(md, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED)
        metrics.SEGMENTS_DELETED.labels(sid.topic_id_partition.topic, reason).inc()
        log.info("remote segment deleted", extra={
            "segment": str(sid), "reason": reason, "start_offset": md.start_offset,
            "end_offset": md.end_offset_inclusive})
        return True
