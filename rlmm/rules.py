"""The refusal rules of the metadata, written once: what a record may do to the state it meets.

Every place that decides uses these functions: the RocksDB cache when it applies the topic's records in order
(:mod:`rlmm.cache`, the decision every topic-based manager agrees on), the topic-based manager when it checks a write
against its cache before producing it (:mod:`rlmm.topic_manager`), and the in-memory manager (:mod:`rlmm.memory`).
Each takes the facts (the record's state, the state it meets, epochs) and returns the error refusing the record, or
None when it is allowed; the caller raises it. ``what`` names the segment or partition in the message and is only
formatted when the record is refused (the cache passes a name it builds lazily).

The rules (the state diagrams themselves live with the enums in :mod:`rlmm.api`):

- a new segment is COPY_SEGMENT_STARTED; it is refused once its partition has any partition-delete state, and
  refused for an id already known in another state (the same id still COPY_SEGMENT_STARTED replaces it: a retry);
- an update of an unknown segment is :class:`UnknownSegmentError`; an update the segment diagram forbids is
  :class:`InvalidStateTransitionError`;
- copy fencing: COPY_SEGMENT_STARTED -> COPY_SEGMENT_FINISHED of a copy started under a broker leader epoch below
  the partition's fence (the highest epoch of any COPY_SEGMENT_STARTED of the partition seen so far, never lowered)
  is :class:`CopyFencedError`; copies without an epoch are never fenced and never raise the fence;
- a partition-delete step the partition diagram forbids is :class:`InvalidStateTransitionError`.

A refusal of a delete that another deleter already did (a second sidecar's clean-up, a second purger), or of a copy's
COPY_SEGMENT_FINISHED that meets its segment being deleted (an old leader's copy finishing after the new leader began
deleting it as abandoned or fenced: the copy is discarded, the new leader copies the segment itself), carries
``deleted_already = True``: normal in a cluster, logged at INFO rather than as an error.
"""

from __future__ import annotations

from collections.abc import Callable

from rlmm.api import (
    CopyFencedError,
    InvalidStateTransitionError,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    UnknownSegmentError,
)

__all__ = ["copy_fenced", "raised_fence", "refuse_new_segment", "refuse_partition_delete", "refuse_segment_update",
           "require_new_segment"]

_STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
_DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
_DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED
# (from, to) pairs the segment diagram allows, repeats included: one set lookup per record in the cache's apply loop
_ALLOWED = frozenset((a, b) for a in RemoteLogSegmentState for b in RemoteLogSegmentState if a.can_transition_to(b))


def require_new_segment(metadata: RemoteLogSegmentMetadata) -> None:
    """The argument check of ``add_remote_log_segment_metadata``: a ValueError unless COPY_SEGMENT_STARTED (a caller's
    mistake, never written; a record of another state met on the topic is refused by :func:`refuse_new_segment`)."""
    if metadata.state != _STARTED:
        raise ValueError(f"{metadata.remote_log_segment_id}: add needs COPY_SEGMENT_STARTED, got {metadata.state.name}")


def refuse_new_segment(what: object, state: int, known: int | None,
                       deleting: RemotePartitionDeleteState | None) -> InvalidStateTransitionError | None:
    """A segment record (``state``) for an id whose current state is ``known`` (None: a new id), in a partition whose
    partition-delete state is ``deleting`` (None: no delete began)."""
    if state != _STARTED:
        return InvalidStateTransitionError(f"{what}: a new segment must be COPY_SEGMENT_STARTED, the record has "
                                           f"{RemoteLogSegmentState(state).name}")
    if deleting is not None:
        return InvalidStateTransitionError(f"{what}: COPY_SEGMENT_STARTED refused: the partition is {deleting.name}")
    if known is not None and known != _STARTED:
        return InvalidStateTransitionError(
            f"{what}: invalid state transition {RemoteLogSegmentState(known).name} -> COPY_SEGMENT_STARTED")
    return None


def refuse_segment_update(what: object, state: int, known: int | None, *, copy_epoch: int | None,
                          fence_epoch: Callable[[], int | None], deleted: bool = False,
                          ) -> UnknownSegmentError | InvalidStateTransitionError | None:
    """An update to ``state`` of a segment whose current state is ``known`` (None: unknown). ``copy_epoch`` is the
    broker leader epoch the copy started under; ``fence_epoch()`` the partition's fence, called only when it matters
    (it may cost a lookup). ``deleted``: the unknown id was fully deleted recently (its tombstones not yet seen)."""
    deleting = state == _DELETE_STARTED or state == _DELETE_FINISHED
    moot = deleting or state == _FINISHED  # a late deleter's record, or a copy finishing under its delete
    if known is None:
        err: UnknownSegmentError | InvalidStateTransitionError = UnknownSegmentError(
            f"{what}: no such segment (update to {RemoteLogSegmentState(state).name})")
        err.deleted_already = moot and deleted  # type: ignore[attr-defined]
        return err
    if (known, state) not in _ALLOWED:
        err = InvalidStateTransitionError(f"{what}: invalid state transition {RemoteLogSegmentState(known).name} -> "
                                          f"{RemoteLogSegmentState(state).name}")
        err.deleted_already = (known == _DELETE_STARTED if deleting  # type: ignore[attr-defined]
                               else state == _FINISHED and known in (_DELETE_STARTED, _DELETE_FINISHED))
        return err
    if state == _FINISHED and known == _STARTED and copy_epoch is not None:
        return copy_fenced(what, copy_epoch, fence_epoch())
    return None


def copy_fenced(what: object, segment_epoch: int | None, fence_epoch: int | None) -> CopyFencedError | None:
    """The error refusing COPY_SEGMENT_FINISHED of a copy started under ``segment_epoch`` when the partition's
    highest started copy epoch is ``fence_epoch``, or None when it may finish (no epoch on either side, or not lower).
    """
    if segment_epoch is None or fence_epoch is None or segment_epoch >= fence_epoch:
        return None
    return CopyFencedError(f"{what}: copy fenced: COPY_SEGMENT_FINISHED of a copy started under broker leader epoch "
                           f"{segment_epoch} refused, a copy of the partition was started under broker leader epoch "
                           f"{fence_epoch}")


def raised_fence(fence_epoch: int | None, copy_epoch: int | None) -> int | None:
    """The partition's fence after an accepted COPY_SEGMENT_STARTED under ``copy_epoch``: the higher of the two."""
    if copy_epoch is None or (fence_epoch is not None and fence_epoch >= copy_epoch):
        return fence_epoch
    return copy_epoch


def refuse_partition_delete(what: object, state: RemotePartitionDeleteState,
                            known: RemotePartitionDeleteState | None) -> InvalidStateTransitionError | None:
    """A partition-delete step to ``state`` of a partition whose current partition-delete state is ``known``."""
    if known is None or known.can_transition_to(state):
        return None
    err = InvalidStateTransitionError(f"{what}: invalid state transition {known.name} -> {state.name}")
    err.deleted_already = state <= known  # type: ignore[attr-defined]
    return err
