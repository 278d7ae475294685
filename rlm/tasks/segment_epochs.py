"""The leader epochs a copy records (KIP-405's ``segmentLeaderEpochs``): what the copied batches' headers say.

Every record batch carries the leader epoch it was written under (``PartitionLeaderEpoch``, :mod:`rsm.log.batch`),
and Kafka's leader-epoch cache is built from them (``UnifiedLog.append`` assigns each batch's epoch at its base
offset; ``LeaderEpochFileCache.assign``). The cache's checkpoint is no record of a range's epochs, though: once the
broker's log start moves (local retention, DeleteRecords), Kafka cuts the checkpoint back to it
(``LeaderEpochFileCache.truncateFromStartAsyncFlush``: the entries below are dropped, the last of them starting at
the log start instead). A segment the sidecar staged and copies after that (:mod:`rlm.tasks.staging`) has offsets
below the checkpoint's first entry. Taken from the checkpoint, the map of a segment 40..79 whose batches hold epoch
0 up to 49 and epoch 1 from 50 was ``((1, 60),)`` with the log start at 60 (epoch 0 lost, epoch 1 ten offsets late)
and ``((0, 40),)`` with the log start past the segment (the first batch's epoch alone). The tier's lineage
(:mod:`rlm.tier.chain`) is built from these maps: an epoch ending at the wrong offset there hides a truncation from
a consumer validating its position through the proxy (OffsetForLeaderEpoch).

So the map comes from the batch headers of the copied range, always, built by :class:`rsm.log.epochs.BatchEpochs`
(one piece of logic, which the storage manager's copy uses too). Where the checkpoint covers the range (from its
first entry on) it must say the same; where it does not, it says nothing. A disagreement is no copy
(:class:`EpochMismatchError`): the run fails and the next one reads the checkpoint again (Kafka writes it
asynchronously: a checkpoint read between a truncation and its flush is stale).

The headers are read once (:func:`copy_epochs`): where the checkpoint covers the whole range (the segment is at or
above the broker's log start, as it is unless the log start moved past it while it waited staged), the map is the
checkpoint's slice, and the storage manager's copy checks, on its own walk of the batches (``check_epochs``), that
the batches say the same before its copy is readable; a mismatch is the same :class:`EpochMismatchError`, raised by
the copy. Only a range the checkpoint does not cover is walked before its COPY_SEGMENT_STARTED (the metadata records
the map then, and Kafka's FINISHED update carries none), streamed (one read buffer,
:func:`rsm.log.batch.scan_batches`; no CRC: the copy checks every batch's CRC as it reads it).

Cost (``bench/bench_segment_epochs.py``, ms of CPU per 64 MiB segment): the walk of its own 119 in batches of 1 KiB,
17 of 16 KiB, 9 of 1 MiB, 15-30% of the storage manager's copy of the same segment to the filesystem store (400, 97,
63). A whole copy (map and filesystem store copy), the walk first vs the checkpoint's slice checked on the copy's walk,
10 alternating pairs (``--pairs``, load 1.4-1.5): 517 -> 399 ms (-23%), 88 -> 70 (-21%), 56 -> 46 (-18%).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from rlm.tier import epochs_for_range
from rsm.log.batch import BatchHeader
from rsm.log.checkpoint import EpochEntry
from rsm.log.epochs import BatchEpochError, EpochMismatchError, batch_epochs, describe_epochs

__all__ = ["BatchEpochError", "EpochMismatchError", "copy_epochs", "covers", "segment_epochs"]


def segment_epochs(headers: Iterable[BatchHeader], start_offset: int, end_offset_inclusive: int,
                   checkpoint: Sequence[EpochEntry], path: str = "<batches>") -> list[EpochEntry]:
    """The leader epochs of ``[start_offset, end_offset_inclusive]`` from ``headers`` (the batches holding the range,
    in offset order; :func:`rsm.log.epochs.batch_epochs`), which ``checkpoint``, the partition's leader-epoch
    checkpoint, must agree with from its first entry on; ``path``: the ``.log`` file, named in errors.

    Raises :class:`BatchEpochError` (a :class:`~rsm.log.errors.CorruptRecordBatchError`) for a batch without a
    leader epoch (negative) or an epoch below the one before it, and when no batch holds an offset of the range
    (nothing to copy: the file is not what its name says); :class:`EpochMismatchError` when the checkpoint
    disagrees."""
    out = batch_epochs(headers, start_offset, end_offset_inclusive, path)
    covered = max(start_offset, checkpoint[0].start_offset) if checkpoint else end_offset_inclusive + 1
    if covered <= end_offset_inclusive:
        says = epochs_for_range(checkpoint, covered, end_offset_inclusive)
        found = epochs_for_range(out, covered, end_offset_inclusive)
        if says != found:
            raise EpochMismatchError(
                f"{path}: offsets {covered}..{end_offset_inclusive}: the leader-epoch checkpoint says "
                f"{describe_epochs(says)}, the batches say {describe_epochs(found)}", path=path, offset=covered)
    return out


def covers(checkpoint: Sequence[EpochEntry], start_offset: int) -> bool:
    """The checkpoint covers a range from ``start_offset`` on (its first entry starts at or before it)."""
    return bool(checkpoint) and checkpoint[0].start_offset <= start_offset


def copy_epochs(checkpoint: Sequence[EpochEntry], start_offset: int, end_offset_inclusive: int,
                headers: Callable[[], Iterable[BatchHeader]], path: str, *, copy_checks: bool) -> list[EpochEntry]:
    """The map a copy of ``[start_offset, end_offset_inclusive]`` records. ``copy_checks``: the storage manager's
    copy checks the batches against it (``check_epochs``); then, where ``checkpoint`` covers the range, its slice,
    no header read here. Otherwise :func:`segment_epochs` of ``headers()`` (a walk of the range's batches)."""
    if copy_checks and covers(checkpoint, start_offset):
        return epochs_for_range(checkpoint, start_offset, end_offset_inclusive)
    return segment_epochs(headers(), start_offset, end_offset_inclusive, checkpoint, path)
