"""The RemoteStorageManager interface, after KIP-405's ``org.apache.kafka.server.log.remote.storage``.

Contracts (each method repeats the ones that concern it):

- Offsets and positions are **inclusive** where the name says ``_inclusive`` (as Kafka's), otherwise a start.
- ``copy_log_segment_data`` is idempotent per ``remote_segment_id``: copying the same id again overwrites the
  same keys with the same bytes. Each copy *attempt* must use a new ``remote_segment_id`` (KIP-405), which
  also gives each attempt its own ledger id and keys, so a crashed attempt never mixes with a later one.
- Writes are atomic: a reader sees a copied segment completely or not at all (the index object is written
  last and is the commit point).
- ``delete_log_segment_data`` is idempotent: deleting twice, or a segment that never existed, is not an error.
- Absent data raises :class:`~rsm.errors.RemoteResourceNotFoundError`, never an empty answer (a segment without
  a transaction index answers ``fetch_index(..., IndexType.TRANSACTION)`` with that error).
- Fetched bytes are exactly the original bytes: ``fetch_log_segment`` returns the original ``.log`` bytes
  between the given positions of the original file, each batch's CRC-32C checked before it is returned.
"""

from __future__ import annotations

import abc
import enum
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

__all__ = [
    "IndexType",
    "LogSegmentData",
    "RemoteSegmentMetadata",
    "RemoteStorageManagerApi",
    "SegmentLeaderEpoch",
]


class IndexType(enum.IntEnum):
    """Kafka's ``RemoteStorageManager.IndexType``; the value is the stable byte id used in our index object."""

    OFFSET = 0
    TIMESTAMP = 1
    PRODUCER_SNAPSHOT = 2
    TRANSACTION = 3
    LEADER_EPOCH = 4


@dataclass(frozen=True, slots=True)
class SegmentLeaderEpoch:
    """One leader epoch of a segment and the first offset written under it."""

    leader_epoch: int
    start_offset: int


@dataclass(frozen=True, slots=True)
class RemoteSegmentMetadata:
    """What the RemoteStorageManager needs to know about one remote segment copy.

    A small value object of our own: the metadata manager (``rlmm/``) has the richer model with states; the
    sidecar adapts between the two (passing ``custom_metadata`` through). ``remote_segment_id`` is unique per
    copy attempt.
    """

    remote_segment_id: uuid.UUID
    topic_id: uuid.UUID
    topic_name: str
    partition: int
    start_offset: int
    end_offset_inclusive: int
    max_timestamp_ms: int = -1
    segment_size_bytes: int = -1
    broker_id: int = -1
    event_timestamp_ms: int = -1
    segment_leader_epochs: tuple[SegmentLeaderEpoch, ...] = field(default_factory=tuple)
    custom_metadata: bytes | None = None
    """What ``copy_log_segment_data`` returned for this copy (the metadata manager keeps it with the segment):
    the key layout it was written under. None (copies made before it existed): the current configuration."""


@dataclass(frozen=True, slots=True)
class LogSegmentData:
    """The local files of one rolled segment (Kafka's ``LogSegmentData``).

    ``leader_epoch_checkpoint`` is the checkpoint's bytes already sliced to the segment (as Kafka passes it).
    ``transaction_index_path`` is ``None`` when the segment has none; ``producer_snapshot_path`` may be ``None``
    for segments written before snapshots existed (then fetching that index answers not found).
    """

    log_path: Path
    offset_index_path: Path
    time_index_path: Path
    transaction_index_path: Path | None
    producer_snapshot_path: Path | None
    leader_epoch_checkpoint: bytes


class RemoteStorageManagerApi(abc.ABC):
    """KIP-405's RemoteStorageManager. Implementations are thread-safe."""

    @abc.abstractmethod
    def copy_log_segment_data(self, segment_metadata: RemoteSegmentMetadata,
                              segment_data: LogSegmentData) -> bytes | None:
        """Copy the segment's ``.log`` and its five indexes to remote storage; return custom metadata or None.

        Exactly the batches of ``[start_offset, end_offset_inclusive]`` are copied: leading batches of the
        ``.log`` whose last offset is below ``start_offset`` are skipped (a new leader's local segment that
        straddles the highest remote offset), and the first kept batch must start exactly at ``start_offset``;
        otherwise :class:`~rsm.errors.RemoteStorageError` naming the file and offsets, with nothing uploaded.
        ``rsm.format.ledger.kept_range`` gives the kept bytes beforehand (the segment's ``segment_size_bytes``).

        The custom metadata (``rsm.format.custom_metadata``, under 100 bytes) records the key layout the copy
        was written under; the caller stores it with the segment and passes it back in
        ``RemoteSegmentMetadata.custom_metadata`` to every later fetch and delete.

        Idempotent per ``segment_metadata.remote_segment_id``; atomic (nothing readable until all is written).
        Raises :class:`~rsm.errors.RemoteStorageError` on failure, after removing what it wrote where it can;
        leftovers of a crash are unreadable (no index object) and found by garbage collection.
        """

    @abc.abstractmethod
    def fetch_log_segment(self, segment_metadata: RemoteSegmentMetadata, start_position: int,
                          end_position_inclusive: int | None = None) -> BinaryIO:
        """A stream of the original ``.log`` bytes from ``start_position`` to ``end_position_inclusive``.

        Positions are byte positions in the original ``.log`` file; ``None`` means to the end of the segment,
        an end past the end is clamped. A copy that skipped leading batches holds the file's bytes from its
        first kept batch on; a start position below that batch begins at it. Raises
        :class:`~rsm.errors.RemoteResourceNotFoundError` when the segment is not in remote storage,
        ``ValueError`` for a start beyond the segment, and (possibly while reading)
        :class:`~rsm.errors.CorruptRemoteObjectError` naming the key and position of bad data.
        """

    @abc.abstractmethod
    def fetch_index(self, segment_metadata: RemoteSegmentMetadata, index_type: IndexType) -> BinaryIO:
        """A stream of the original bytes of one of the segment's indexes.

        Raises :class:`~rsm.errors.RemoteResourceNotFoundError` when the segment or that index is absent (a
        segment without transaction index: not found, never empty bytes).
        """

    @abc.abstractmethod
    def delete_log_segment_data(self, segment_metadata: RemoteSegmentMetadata) -> None:
        """Delete every object of this segment copy. Idempotent: absent or already deleted is not an error.

        The objects are found under the layout recorded in ``custom_metadata`` (the current one when None);
        custom metadata this manager cannot read raises instead of deleting guessed keys."""
