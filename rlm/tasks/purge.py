"""Purging the remote data of deleted topics: when (positive proof, seen over time) and how (the partition-delete
states around the one segment delete path).

When may a topic's remote data be purged? Only on positive proof that its topic id is deleted, seen over time.

Absence proves nothing: Kafka's all-topics Metadata silently omits topics the principal may not Describe, and a
broker that lags behind the controller answers UNKNOWN_TOPIC_OR_PART for a live topic. So each known topic is
described explicitly by name every discovery round (:meth:`rlm.discovery.ClusterView.topic_ids`; confluent-kafka
cannot describe by topic id), and the answer for a known topic id X counts as *evidence that X is deleted* only
when it is one of:

- UNKNOWN_TOPIC_OR_PART for the name (no topic of that name exists), or
- the name answers with a topic id other than X (deleted and re-created: Kafka never reuses a topic id and
  never renames a topic, so X is gone).

X is purged once that evidence was seen on ``min_rounds`` consecutive rounds spanning at least ``grace_ms``.
Any other answer (X itself, TOPIC_AUTHORIZATION_FAILED, a timeout, a broker error, no answer at all) resets X's
evidence: it never purges. An authorization error is logged and counted
(:data:`rlm.metrics.PURGE_CHECK_UNAUTHORIZED`). The evidence lives in memory: a restart starts every count over
(fail closed).

How: :func:`purge_partition` walks Kafka's partition-delete states, DELETE_PARTITION_MARKED ->
DELETE_PARTITION_STARTED -> every segment deleted through :meth:`rlm.tasks.deleter.SegmentDeleter.delete` (reason
``topic-deleted``; a refused one is queued for the cleaner like any other) -> what staging holds of it released ->
DELETE_PARTITION_FINISHED. :func:`purge_deleted_topics` is the discovery round's check: describe every known
topic, feed :class:`DeletionEvidence`, purge what it proves deleted and forget it.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaError

from rlm import metrics
from rlm.discovery import ClusterView, TopicLookup
from rlm.known import KnownPartitions
from rlm.tasks.deleter import SegmentDeleter
from rlmm.api import (
    InvalidStateTransitionError,
    RemoteLogMetadataManager,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
    UnknownSegmentError,
)

__all__ = ["DeletionEvidence", "deletion_evidence", "purge_deleted_topics", "purge_partition"]

log = logging.getLogger(__name__)


def deletion_evidence(topic_id: uuid.UUID, answer: TopicLookup | None) -> str | None:
    """Why ``answer`` proves ``topic_id`` deleted ("unknown topic", "re-created as <id>"), or None if it does not."""
    if answer is None:
        return None
    if answer.topic_id is not None:
        return None if answer.topic_id == topic_id else f"re-created as {answer.topic_id}"
    if answer.error_code == KafkaError.UNKNOWN_TOPIC_OR_PART:
        return "unknown topic"
    return None


@dataclass
class _Seen:
    first: float  # clock() of the first round of the current unbroken run of evidence
    rounds: int
    why: str


class DeletionEvidence:
    """The evidence per known topic id, fed one discovery round at a time (:meth:`observe`)."""

    def __init__(self, grace_ms: int, min_rounds: int, clock: Callable[[], float] = time.monotonic) -> None:
        if grace_ms < 0 or min_rounds < 1:
            raise ValueError("grace_ms must be >= 0 and min_rounds >= 1")
        self.grace_s = grace_ms / 1000
        self.min_rounds = min_rounds
        self.clock = clock
        self._seen: dict[uuid.UUID, _Seen] = {}

    def observe(self, known: Iterable[TopicIdPartition],
                answers: Mapping[str, TopicLookup]) -> list[TopicIdPartition]:
        """Record one round's answers for the ``known`` partitions; return those proven deleted (to purge now).

        ``answers`` maps topic name to its explicit describe; a name missing from it is "no answer" (reset).
        A partition returned stays proven on later rounds while the evidence holds, so a purge that failed is
        retried; forget a purged topic id by dropping it from ``known``.
        """
        now = self.clock()
        known = list(known)
        by_id: dict[uuid.UUID, str] = {tp.topic_id: tp.topic for tp in known}
        for gone in set(self._seen) - set(by_id):
            del self._seen[gone]
        proven: set[uuid.UUID] = set()
        for topic_id, name in by_id.items():
            answer = answers.get(name)
            why = deletion_evidence(topic_id, answer)
            if why is None:
                self._reset(topic_id, name, answer)
                continue
            seen = self._seen.get(topic_id)
            if seen is None:
                seen = self._seen[topic_id] = _Seen(now, 0, why)
                log.info("topic looks deleted: purge after the grace period unless it reappears",
                         extra={"topic": name, "topic_id": str(topic_id), "evidence": why,
                                "grace_ms": int(self.grace_s * 1000), "rounds": self.min_rounds})
            seen.rounds += 1
            seen.why = why
            if seen.rounds >= self.min_rounds and now - seen.first >= self.grace_s:
                proven.add(topic_id)
        return [tp for tp in known if tp.topic_id in proven]

    def _reset(self, topic_id: uuid.UUID, name: str, answer: TopicLookup | None) -> None:
        had = self._seen.pop(topic_id, None)
        if answer is not None and answer.error_code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            metrics.PURGE_CHECK_UNAUTHORIZED.labels(name).inc()
            log.warning("deleted-topic check: not authorized to describe the topic; its remote data is kept",
                        extra={"topic": name, "topic_id": str(topic_id), "error": answer.error})
        elif answer is None or answer.topic_id is None:
            log.info("deleted-topic check: no usable answer; its remote data is kept",
                     extra={"topic": name, "topic_id": str(topic_id),
                            "error": answer.error if answer is not None else "not answered"})
        if had is not None:
            log.info("deleted-topic evidence reset", extra={"topic": name, "topic_id": str(topic_id),
                                                             "rounds": had.rounds})

    def reset(self) -> None:
        """A round without answers at all (discovery failed): every run of evidence starts over."""
        if self._seen:
            log.info("deleted-topic evidence reset: discovery round failed", extra={"topics": len(self._seen)})
        self._seen.clear()

    def pending(self) -> dict[uuid.UUID, tuple[int, float]]:
        """Topic ids with evidence so far: (rounds, seconds since the first), for tests and logs."""
        now = self.clock()
        return {tid: (s.rounds, now - s.first) for tid, s in self._seen.items()}


def purge_deleted_topics(known: KnownPartitions, view: ClusterView, evidence: DeletionEvidence,
                         purge: Callable[[TopicIdPartition], bool]) -> None:
    """One round of the deleted-topic check: partitions once served (``known``) whose topic id ``evidence`` proves
    deleted on the cluster are purged with ``purge`` and forgotten; a purge that returns False (deferred: a copy of
    the partition still runs) or fails (logged, counted) is retried on the next round (its evidence holds).

    Each known topic is described by name (:meth:`rlm.discovery.ClusterView.topic_ids`); :class:`DeletionEvidence`
    decides when the answers prove its id deleted (never on mere absence, never on an error).
    """
    tps = known.all()
    try:
        answers = view.topic_ids({tp.topic for tp in tps}) if tps else {}
    except Exception as err:  # noqa: BLE001 - no answers: every topic's evidence resets
        log.warning("deleted-topic check failed", extra={"error": str(err)})
        answers = {}
    for tp in evidence.observe(tps, answers):
        try:
            if purge(tp):
                known.remove([tp])
        except Exception as err:  # noqa: BLE001
            metrics.ERRORS.labels("purge").inc()
            log.warning("purge of deleted topic's partition failed", extra={"partition": str(tp),
                                                                            "error": str(err)})


def purge_partition(rlmm: RemoteLogMetadataManager, deleter: SegmentDeleter, tp: TopicIdPartition, broker_id: int,
                    release_staging: Callable[[TopicIdPartition], object]) -> None:
    """Purge the remote data of ``tp`` (its topic proven deleted): MARKED -> STARTED -> every segment deleted ->
    ``release_staging(tp)`` -> FINISHED (Kafka's partition-delete states, written as ``broker_id``).

    Idempotent: a state another sidecar already got past is skipped, segments already deleted are not listed.
    Raises when a segment delete raises or FINISHED cannot be written (the caller retries on a later round)."""
    rlmm.on_partition_leadership_changes([], [tp])
    rlmm.wait_ready([tp], timeout_s=30)

    def put(state: RemotePartitionDeleteState) -> None:
        rlmm.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(
            tp, state, int(time.time() * 1000), broker_id))

    for state in (RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
                  RemotePartitionDeleteState.DELETE_PARTITION_STARTED):
        try:
            put(state)
        except InvalidStateTransitionError:
            pass  # another sidecar got further already
    for md in rlmm.list_remote_log_segments(tp):
        try:
            deleter.delete(md, "topic-deleted")
        except (UnknownSegmentError, InvalidStateTransitionError) as err:
            # another sidecar's purge (every sidecar that served the partition purges it) deleted it meanwhile
            log.info("purge: segment deleted by someone else already", extra={
                "segment": str(md.remote_log_segment_id), "error": str(err)})
    release_staging(tp)
    try:
        put(RemotePartitionDeleteState.DELETE_PARTITION_FINISHED)
    except InvalidStateTransitionError:
        done = rlmm.remote_partition_delete_metadata(tp)
        if done is None or done.state != RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
            raise
        log.info("remote data of deleted topic purged (finished by another sidecar)", extra={"partition": str(tp)})
        return
    log.info("remote data of deleted topic purged", extra={"partition": str(tp)})
