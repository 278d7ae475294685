"""The RemoteLogMetadataManager contract, after KIP-405 (Kafka's ``storage/api`` package).

Value objects are frozen, slotted dataclasses; the two state enums carry their stable byte ids (the ids Kafka
writes on ``__remote_log_metadata``) and their transition diagrams. Offsets follow Kafka: both
``start_offset`` and ``end_offset_inclusive`` are inside the segment.

Segment states (a state may always repeat itself, so retries are idempotent)::

    COPY_SEGMENT_STARTED(0) --> COPY_SEGMENT_FINISHED(1) --> DELETE_SEGMENT_STARTED(2) --> DELETE_SEGMENT_FINISHED(3)
             \\______________________________________________/^

Partition delete states: ``DELETE_PARTITION_MARKED(0) -> DELETE_PARTITION_STARTED(1) -> DELETE_PARTITION_FINISHED(2)``.
"""

from __future__ import annotations

import abc
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import IntEnum

__all__ = [
    "CopyFencedError",
    "CorruptMetadataRecordError",
    "InvalidStateTransitionError",
    "MetadataCacheFormatError",
    "MetadataTopicMissingError",
    "MetadataWriteError",
    "PartitionNotServedError",
    "ReadYourWritesTimeoutError",
    "RemoteLogMetadata",
    "RemoteLogMetadataError",
    "RemoteLogMetadataManager",
    "RemoteLogSegmentId",
    "RemoteLogSegmentMetadata",
    "RemoteLogSegmentMetadataUpdate",
    "RemoteLogSegmentState",
    "RemotePartitionDeleteMetadata",
    "RemotePartitionDeleteState",
    "TopicIdPartition",
    "UnknownSegmentError",
]


# --------------------------------------------------------------------------------------------------- errors
class RemoteLogMetadataError(Exception):
    """Root of every error the ``rlmm`` package raises."""


class CorruptMetadataRecordError(RemoteLogMetadataError):
    """A metadata record's bytes cannot be decoded. The message names the field and byte position.

    The consumer logs, counts and skips such records; an operator should look at who writes to the topic.
    """


class InvalidStateTransitionError(RemoteLogMetadataError):
    """A segment or partition-delete state change is not allowed by the state diagram (names both states)."""


class CopyFencedError(InvalidStateTransitionError):
    """A COPY_SEGMENT_FINISHED was refused because its copy started under a broker leader epoch lower than that of
    a copy of the same partition started later in the metadata topic's order (a zombie copy of a former leader).

    The message names both epochs. The segment stays COPY_SEGMENT_STARTED: never served nor counted; its writer
    should delete the copied data (DELETE_SEGMENT_STARTED -> DELETE_SEGMENT_FINISHED).
    """


class UnknownSegmentError(RemoteLogMetadataError):
    """An update names a segment the metadata does not know (never added, or already fully deleted).

    Kafka's Java API raises ``RemoteResourceNotFoundException`` here, the same class as for absent remote data. This
    package keeps its own, named for what it means: ``rlmm`` and ``rsm`` never import each other, and "no such
    metadata record" is not "no such object in the store" (:class:`rsm.errors.RemoteResourceNotFoundError`).
    """


class ReadYourWritesTimeoutError(RemoteLogMetadataError):
    """A write was acknowledged by Kafka but the local cache did not apply it in time.

    Check that the manager's consumer is running and can reach the broker; the write itself is durable.
    """


class MetadataWriteError(RemoteLogMetadataError):
    """Kafka did not accept a metadata record (topic missing, not enough replicas, timeout); nothing changed.

    The message carries the broker's error; retry once the metadata topic is healthy.
    """


class MetadataTopicMissingError(RemoteLogMetadataError):
    """The metadata topic does not exist and this manager was configured not to create it (a reader of metadata it
    does not own: ``create_topic=False``). Nothing was created.

    Check the topic name and the cluster; create the topic, or rebuild it from the store, before starting again.
    """


class PartitionNotServedError(RemoteLogMetadataError):
    """A read names a user partition whose metadata partition this manager does not consume.

    Call ``on_partition_leadership_changes`` with the partition first (or configure the manager to serve all).
    """


class MetadataCacheFormatError(RemoteLogMetadataError):
    """The RocksDB cache directory was written by an incompatible version or another metadata topic.

    It is only a cache: delete the directory (or point the manager at a new one) and it rebuilds from the topic.
    """


# ---------------------------------------------------------------------------------------------------- enums
class RemoteLogSegmentState(IntEnum):
    """Lifecycle of one remote segment copy; the values are Kafka's byte ids."""

    COPY_SEGMENT_STARTED = 0
    COPY_SEGMENT_FINISHED = 1
    DELETE_SEGMENT_STARTED = 2
    DELETE_SEGMENT_FINISHED = 3

    def can_transition_to(self, target: RemoteLogSegmentState) -> bool:
        """True when ``self -> target`` is allowed; a repeated state is always allowed."""
        return target == self or target in _SEGMENT_TRANSITIONS[self]

    def check_transition(self, target: RemoteLogSegmentState, what: object = "segment") -> None:
        """Raise :class:`InvalidStateTransitionError` naming ``what`` and both states when not allowed."""
        if not self.can_transition_to(target):
            raise InvalidStateTransitionError(f"{what}: invalid state transition {self.name} -> {target.name}")


_SEGMENT_TRANSITIONS: dict[RemoteLogSegmentState, frozenset[RemoteLogSegmentState]] = {
    RemoteLogSegmentState.COPY_SEGMENT_STARTED: frozenset(
        {RemoteLogSegmentState.COPY_SEGMENT_FINISHED, RemoteLogSegmentState.DELETE_SEGMENT_STARTED}),
    RemoteLogSegmentState.COPY_SEGMENT_FINISHED: frozenset({RemoteLogSegmentState.DELETE_SEGMENT_STARTED}),
    RemoteLogSegmentState.DELETE_SEGMENT_STARTED: frozenset({RemoteLogSegmentState.DELETE_SEGMENT_FINISHED}),
    RemoteLogSegmentState.DELETE_SEGMENT_FINISHED: frozenset(),
}


class RemotePartitionDeleteState(IntEnum):
    """Lifecycle of a whole partition's remote data being deleted; the values are Kafka's byte ids."""

    DELETE_PARTITION_MARKED = 0
    DELETE_PARTITION_STARTED = 1
    DELETE_PARTITION_FINISHED = 2

    def can_transition_to(self, target: RemotePartitionDeleteState) -> bool:
        return target == self or target == self + 1

    def check_transition(self, target: RemotePartitionDeleteState, what: object = "partition") -> None:
        if not self.can_transition_to(target):
            raise InvalidStateTransitionError(f"{what}: invalid state transition {self.name} -> {target.name}")


# ---------------------------------------------------------------------------------------------- identities
@dataclass(frozen=True, slots=True)
class TopicIdPartition:
    """A user partition: topic id (the identity that survives a re-created topic name), name and number."""

    topic_id: uuid.UUID
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}({self.topic_id})"


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentId:
    """One copy attempt of one segment: its partition and a random uuid."""

    topic_id_partition: TopicIdPartition
    id: uuid.UUID

    @staticmethod
    def generate(tp: TopicIdPartition) -> RemoteLogSegmentId:
        return RemoteLogSegmentId(tp, uuid.uuid4())

    def __str__(self) -> str:
        return f"RemoteLogSegmentId({self.topic_id_partition}, {self.id})"


# -------------------------------------------------------------------------------------------- value objects
_INT32_MAX = 2**31 - 1


def _epochs(value: Mapping[int, int] | Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple((int(e), int(o)) for e, o in items)


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadata:
    """What is known about one remote segment copy.

    ``segment_leader_epochs`` maps each leader epoch in the segment to its first offset, ascending by epoch
    (a dict is accepted and normalised to a tuple of pairs). ``custom_metadata`` is the RSM's opaque bytes or
    ``None``. ``broker_leader_epoch`` is the leader epoch under which the copying broker started the copy (None
    for records written without one, e.g. by Kafka 4.x or before fencing existed): a copy whose epoch is lower
    than that of a copy of the same partition started later cannot finish (:class:`CopyFencedError`). Updates
    never change it. On the topic it is written inside the record's CustomMetadata (:mod:`rlmm.envelope`).
    """

    remote_log_segment_id: RemoteLogSegmentId
    start_offset: int
    end_offset_inclusive: int
    max_timestamp_ms: int
    broker_id: int
    event_timestamp_ms: int
    segment_size_bytes: int
    segment_leader_epochs: tuple[tuple[int, int], ...]
    custom_metadata: bytes | None = None
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED
    txn_index_empty: bool = False
    broker_leader_epoch: int | None = None

    def __post_init__(self) -> None:
        epochs = _epochs(self.segment_leader_epochs)
        object.__setattr__(self, "segment_leader_epochs", epochs)
        object.__setattr__(self, "state", RemoteLogSegmentState(self.state))
        what = self.remote_log_segment_id
        if self.start_offset < 0 or self.end_offset_inclusive < self.start_offset:
            raise ValueError(f"{what}: bad offsets start={self.start_offset} end={self.end_offset_inclusive}")
        if not epochs:
            raise ValueError(f"{what}: segment_leader_epochs must not be empty")
        for (e0, o0), (e1, o1) in zip(epochs, epochs[1:], strict=False):
            if e1 <= e0 or o1 < o0:
                raise ValueError(f"{what}: segment_leader_epochs not ascending: {epochs}")
        if epochs[0][1] < self.start_offset or epochs[-1][1] > self.end_offset_inclusive:
            raise ValueError(f"{what}: segment_leader_epochs {epochs} outside "
                             f"[{self.start_offset}, {self.end_offset_inclusive}]")
        ble = self.broker_leader_epoch
        if ble is not None and (type(ble) is not int or not 0 <= ble <= _INT32_MAX):
            raise ValueError(f"{what}: broker_leader_epoch {ble!r} is not an int32 >= 0")

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return self.remote_log_segment_id.topic_id_partition

    def epoch_end_offset(self, epoch: int) -> int | None:
        """The last offset of ``epoch`` inside this segment (inclusive), or None when the epoch is absent."""
        epochs = self.segment_leader_epochs
        for i, (e, _o) in enumerate(epochs):
            if e == epoch:
                return epochs[i + 1][1] - 1 if i + 1 < len(epochs) else self.end_offset_inclusive
        return None

    def epoch_at(self, offset: int) -> int:
        """The leader epoch of ``offset`` in this segment: that of the last epoch starting at or before it (the
        inverse of :meth:`epoch_end_offset`). Not bounded by the segment: an offset below the first epoch's start
        has the first epoch, one past ``end_offset_inclusive`` the last (a batch at the segment's edge may hold
        offsets outside it; which segment holds an offset is the caller's choice)."""
        epochs = self.segment_leader_epochs
        epoch = epochs[0][0]
        for e, start in epochs:
            if start > offset:
                break
            epoch = e
        return epoch

    def with_update(self, update: RemoteLogSegmentMetadataUpdate) -> RemoteLogSegmentMetadata:
        """The metadata after ``update`` (state, broker, event time and custom metadata replaced; checked).
        ``broker_leader_epoch`` is kept: it is the epoch the copy started under."""
        self.state.check_transition(update.state, self.remote_log_segment_id)
        return replace(self, state=update.state, broker_id=update.broker_id,
                       event_timestamp_ms=update.event_timestamp_ms, custom_metadata=update.custom_metadata)


@dataclass(frozen=True, slots=True)
class RemoteLogSegmentMetadataUpdate:
    """A state change of a known segment."""

    remote_log_segment_id: RemoteLogSegmentId
    event_timestamp_ms: int
    custom_metadata: bytes | None
    state: RemoteLogSegmentState
    broker_id: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", RemoteLogSegmentState(self.state))
        if self.state == RemoteLogSegmentState.COPY_SEGMENT_STARTED:
            raise ValueError(f"{self.remote_log_segment_id}: an update cannot carry COPY_SEGMENT_STARTED")

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return self.remote_log_segment_id.topic_id_partition


@dataclass(frozen=True, slots=True)
class RemotePartitionDeleteMetadata:
    """A step in deleting all remote data of one partition."""

    topic_id_partition: TopicIdPartition
    state: RemotePartitionDeleteState
    event_timestamp_ms: int
    broker_id: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "state", RemotePartitionDeleteState(self.state))


RemoteLogMetadata = RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate | RemotePartitionDeleteMetadata


# ------------------------------------------------------------------------------------------------- manager
class RemoteLogMetadataManager(abc.ABC):
    """Where the metadata of remote segments lives (KIP-405). Implementations must be thread-safe.

    Writes return once the write is durable AND visible to reads of this same manager (read-your-writes).
    Reads of a partition whose metadata this manager does not consume raise :class:`PartitionNotServedError`.
    """

    @abc.abstractmethod
    def add_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> None:
        """Record a new copy in state COPY_SEGMENT_STARTED (any other state is a ValueError).

        Idempotent: adding the same id again while it is still COPY_SEGMENT_STARTED replaces it.
        """

    @abc.abstractmethod
    def update_remote_log_segment_metadata(self, update: RemoteLogSegmentMetadataUpdate) -> None:
        """Move a known segment to a new state. Raises :class:`UnknownSegmentError` for an unknown
        segment and :class:`InvalidStateTransitionError` for a transition the diagram refuses."""

    def write_segment_metadata_many(
            self, records: Sequence[RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate],
    ) -> list[RemoteLogMetadataError | None]:
        """Write many records at once: each a new copy (as :meth:`add_remote_log_segment_metadata`) or an update
        (as :meth:`update_remote_log_segment_metadata`), each checked against the metadata as it was before the
        call (so a segment's COPY_SEGMENT_STARTED and its COPY_SEGMENT_FINISHED go in two calls). Returns, per
        record in order, None when written (and applied: read-your-writes) or the error that refused it; one
        refused record does not stop the others. For bulk writers (``rlm recover``): an implementation may send
        them all before waiting once; this default writes them one by one."""
        out: list[RemoteLogMetadataError | None] = []
        for rec in records:
            try:
                if isinstance(rec, RemoteLogSegmentMetadataUpdate):
                    self.update_remote_log_segment_metadata(rec)
                else:
                    self.add_remote_log_segment_metadata(rec)
            except RemoteLogMetadataError as err:
                out.append(err)
            else:
                out.append(None)
        return out

    @abc.abstractmethod
    def remote_log_segment_metadata(self, tp: TopicIdPartition, epoch: int,
                                    offset: int) -> RemoteLogSegmentMetadata | None:
        """The COPY_SEGMENT_FINISHED segment holding ``offset`` under leader ``epoch``, or None."""

    @abc.abstractmethod
    def highest_offset_for_epoch(self, tp: TopicIdPartition, epoch: int) -> int | None:
        """The highest offset (inclusive) of ``epoch`` copied to remote storage, or None when none was."""

    @abc.abstractmethod
    def list_remote_log_segments(self, tp: TopicIdPartition,
                                 epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        """All known (not fully deleted) segments of ``tp``, optionally only those holding ``epoch``,
        in every state, sorted by start offset."""

    @abc.abstractmethod
    def remote_log_size(self, tp: TopicIdPartition, epoch: int | None = None) -> int:
        """Sum of ``segment_size_bytes`` of :meth:`list_remote_log_segments` (as Kafka's ``remoteLogSize``)."""

    @abc.abstractmethod
    def copy_fence_epoch(self, tp: TopicIdPartition) -> int | None:
        """The highest broker leader epoch under which a copy of ``tp`` was started (None: no copy carried one, or
        the partition's delete finished). A copy started under a lower epoch can no longer finish
        (:class:`CopyFencedError`)."""

    @abc.abstractmethod
    def remote_partition_delete_metadata(self, tp: TopicIdPartition) -> RemotePartitionDeleteMetadata | None:
        """The partition-delete state of ``tp`` (MARKED, STARTED, FINISHED), or None when no delete began."""

    @abc.abstractmethod
    def put_remote_partition_delete_metadata(self, metadata: RemotePartitionDeleteMetadata) -> None:
        """Record a partition-delete step; DELETE_PARTITION_FINISHED drops the partition's segments."""

    @abc.abstractmethod
    def on_partition_leadership_changes(self, leaders: Iterable[TopicIdPartition],
                                        followers: Iterable[TopicIdPartition]) -> None:
        """Start serving these partitions (consume their metadata partitions)."""

    @abc.abstractmethod
    def on_stop_partitions(self, partitions: Iterable[TopicIdPartition]) -> None:
        """Stop serving these partitions."""

    @abc.abstractmethod
    def is_ready(self, tp: TopicIdPartition) -> bool:
        """True once the metadata of ``tp`` has been consumed up to where it was when serving began."""

    @abc.abstractmethod
    def wait_ready(self, tps: Iterable[TopicIdPartition], timeout_s: float = 60.0) -> None:
        """Block until :meth:`is_ready` holds for every partition of ``tps`` (each already served, see
        :meth:`on_partition_leadership_changes`); raise :class:`ReadYourWritesTimeoutError` naming those still
        behind when ``timeout_s`` passes first. A manager whose reads are always current returns at once."""

    @abc.abstractmethod
    def close(self) -> None:
        """Stop the consumer and producer and close the cache; idempotent."""

    def __enter__(self) -> RemoteLogMetadataManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

