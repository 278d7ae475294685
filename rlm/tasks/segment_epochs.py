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

So the map comes from the batch headers of the copied range, always (:func:`segment_epochs`), streamed (one read
buffer, :func:`rsm.log.batch.scan_batches`; no CRC: the storage manager's copy checks every batch's CRC as it
reads it). Where the checkpoint covers the range (from its first entry on) it must say the same; where it does not,
it says nothing. A disagreement is no copy (:class:`EpochMismatchError`): the run fails and the next one reads the
checkpoint again (Kafka writes it asynchronously: a checkpoint read between a truncation and its flush is stale).

Cost (``bench/bench_segment_epochs.py``, ms of CPU per 64 MiB segment): 119 in batches of 1 KiB, 17 of 16 KiB, 9 of
1 MiB; the storage manager's copy of the same segment to the filesystem store 400, 97, 63. For segments of 64 KiB
(``bench/bench_copy_path.py``): ~0.1 ms of the ~2.5 ms a segment's copy path costs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rlm.tier import epochs_for_range
from rsm.log.batch import BatchHeader
from rsm.log.checkpoint import EpochEntry
from rsm.log.errors import CorruptRecordBatchError

__all__ = ["EpochMismatchError", "segment_epochs"]


class EpochMismatchError(Exception):
    """The partition's leader-epoch checkpoint and the batches of a range it covers disagree about the leader epoch
    of some offset. Nothing is copied; the next copy run reads the checkpoint again. Should it persist, the local
    log and its checkpoint disagree: compare the batches' epochs (``kafka-dump-log``) with the checkpoint."""


def segment_epochs(headers: Iterable[BatchHeader], start_offset: int, end_offset_inclusive: int,
                   checkpoint: Sequence[EpochEntry], path: str = "<batches>") -> list[EpochEntry]:
    """The leader epochs of ``[start_offset, end_offset_inclusive]``: the epoch of the first batch holding an
    offset of the range, from ``start_offset`` on, then each later batch's epoch where it changes, from that batch's
    base offset on (as Kafka's cache assigns them). ``headers``: the batches holding the range, in offset order
    (batches wholly outside it are passed over); ``checkpoint``: the partition's leader-epoch checkpoint, which must
    agree from its first entry on; ``path``: the ``.log`` file, named in errors.

    Raises :class:`CorruptRecordBatchError` for a batch without a leader epoch (negative) or an epoch below the one
    before it, and when no batch holds an offset of the range (nothing to copy: the file is not what its name
    says); :class:`EpochMismatchError` when the checkpoint disagrees."""
    out: list[EpochEntry] = []
    for h in headers:
        if h.last_offset < start_offset:
            continue
        if h.base_offset > end_offset_inclusive:
            break
        epoch = h.partition_leader_epoch
        if out and epoch == out[-1].epoch:
            continue
        if epoch < 0:
            raise CorruptRecordBatchError(path, h.position, f"batch {h.base_offset}..{h.last_offset} has no leader "
                                          f"epoch ({epoch})")
        if out and epoch < out[-1].epoch:
            raise CorruptRecordBatchError(path, h.position, f"leader epoch goes backwards: batch {h.base_offset}.."
                                          f"{h.last_offset} has epoch {epoch} after epoch {out[-1].epoch}")
        out.append(EpochEntry(epoch, max(h.base_offset, start_offset)))
    if not out:
        raise CorruptRecordBatchError(path, None, f"no batch holds an offset of {start_offset}.."
                                      f"{end_offset_inclusive}")
    covered = max(start_offset, checkpoint[0].start_offset) if checkpoint else end_offset_inclusive + 1
    if covered <= end_offset_inclusive:
        says = epochs_for_range(checkpoint, covered, end_offset_inclusive)
        found = epochs_for_range(out, covered, end_offset_inclusive)
        if says != found:
            raise EpochMismatchError(
                f"{path}: offsets {covered}..{end_offset_inclusive}: the leader-epoch checkpoint says "
                f"{_pairs(says)}, the batches say {_pairs(found)}")
    return out


def _pairs(entries: Sequence[EpochEntry]) -> str:
    return ", ".join(f"epoch {e.epoch} from {e.start_offset}" for e in entries) or "nothing"
