"""The one adapter between the metadata manager's model (``rlmm``) and the storage manager's (``rsm``), and the
slicing of leader epochs, which the sidecar's tasks, the readers of the tier and the Spark source share.

Leader epochs: ``rsm`` has one type, :class:`rsm.api.EpochEntry` (the local checkpoint's entries, a segment's
epochs in :class:`rsm.api.RemoteSegmentMetadata` and in the index object); ``rlmm`` keeps Kafka's
``segmentLeaderEpochs`` as ``(epoch, start_offset)`` pairs (what its codec writes and its cache stores; it cannot
import ``rsm``). Only :func:`to_rsm`, :func:`from_rsm` and :func:`epoch_pairs` cross between the two. The leader
epoch of an offset: in a remote segment, :meth:`rlmm.api.RemoteLogSegmentMetadata.epoch_at`; in the local
checkpoint, :func:`checkpoint_epoch_at`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rlmm.api import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from rsm.api import EpochEntry, RemoteSegmentMetadata

__all__ = ["checkpoint_epoch_at", "epoch_pairs", "epochs_for_range", "from_rsm", "to_rsm"]


def to_rsm(md: RemoteLogSegmentMetadata) -> RemoteSegmentMetadata:
    """The storage manager's view of a metadata manager's segment (the two packages do not import each other)."""
    tp = md.topic_id_partition
    return RemoteSegmentMetadata(
        remote_segment_id=md.remote_log_segment_id.id,
        topic_id=tp.topic_id,
        topic_name=tp.topic,
        partition=tp.partition,
        start_offset=md.start_offset,
        end_offset_inclusive=md.end_offset_inclusive,
        max_timestamp_ms=md.max_timestamp_ms,
        segment_size_bytes=md.segment_size_bytes,
        broker_id=md.broker_id,
        event_timestamp_ms=md.event_timestamp_ms,
        segment_leader_epochs=tuple(EpochEntry(e, o) for e, o in md.segment_leader_epochs),
        custom_metadata=md.custom_metadata,
    )


def from_rsm(m: RemoteSegmentMetadata, *, state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED,
             txn_index_empty: bool = False, broker_leader_epoch: int | None = None) -> RemoteLogSegmentMetadata:
    """The metadata manager's view of a storage manager's segment (the reverse of :func:`to_rsm`): what a copy's
    index object holds (:meth:`rsm.api.RemoteStorageManagerApi.read_committed_copy`) as a metadata record.
    ``state``, ``txn_index_empty`` and ``broker_leader_epoch`` are not part of the storage manager's model."""
    tp = TopicIdPartition(m.topic_id, m.topic_name, m.partition)
    return RemoteLogSegmentMetadata(
        remote_log_segment_id=RemoteLogSegmentId(tp, m.remote_segment_id),
        start_offset=m.start_offset,
        end_offset_inclusive=m.end_offset_inclusive,
        max_timestamp_ms=m.max_timestamp_ms,
        broker_id=m.broker_id,
        event_timestamp_ms=m.event_timestamp_ms,
        segment_size_bytes=m.segment_size_bytes,
        segment_leader_epochs=epoch_pairs(m.segment_leader_epochs),
        custom_metadata=m.custom_metadata,
        state=state,
        txn_index_empty=txn_index_empty,
        broker_leader_epoch=broker_leader_epoch,
    )


def epoch_pairs(entries: Iterable[EpochEntry]) -> tuple[tuple[int, int], ...]:
    """The metadata manager's form of leader epochs: ``(epoch, start_offset)`` pairs, in the given order."""
    return tuple((e.epoch, e.start_offset) for e in entries)


def epochs_for_range(entries: Sequence[EpochEntry], start_offset: int,
                     end_offset_inclusive: int) -> list[EpochEntry]:
    """The leader epochs of ``[start_offset, end_offset_inclusive]``: the epoch in force at the start (its
    start offset raised to ``start_offset``) and every later epoch that starts inside the range.

    ``entries`` is the partition's leader-epoch checkpoint (ascending). Empty when no epoch covers the start.
    """
    out: list[EpochEntry] = []
    for i, e in enumerate(entries):
        nxt = entries[i + 1].start_offset if i + 1 < len(entries) else None
        if e.start_offset > end_offset_inclusive:
            break
        if nxt is not None and nxt <= start_offset:
            continue  # this epoch ended before the range
        out.append(EpochEntry(e.epoch, max(e.start_offset, start_offset)))
    return out


def checkpoint_epoch_at(entries: Sequence[EpochEntry], offset: int) -> int | None:
    """The leader epoch of ``offset`` in the partition's leader-epoch checkpoint (ascending): that of the last entry
    starting at or before it; None when no entry does (the checkpoint starts past ``offset``)."""
    out = None
    for e in entries:
        if e.start_offset <= offset:
            out = e.epoch
    return out
