"""The leader copy task of one partition: rolled segments below the last stable offset, oldest first.

One run (:meth:`PartitionCopier.run_once`):

1. Stage every rolled segment that is not remote yet (hard links, :mod:`rlm.staging`), so the broker's local
   retention cannot take it away before it is copied. A segment the broker deleted before it could be staged is
   a *gap*: counted (``rlm_segment_gaps``) and logged with its offsets, never silent.
2. Clean up copies that were left COPY_SEGMENT_STARTED (a crashed or abandoned attempt): delete them.
3. Copy, oldest first, every staged segment whose end offset is below the last stable offset (nothing of an open
   transaction is ever uploaded): COPY_SEGMENT_STARTED, the store's copy, COPY_SEGMENT_FINISHED; release staging.

Where to resume: the highest remote offset of the partition's leader-epoch lineage (as Kafka's
``findHighestRemoteOffset``), so a new leader continues where the old one stopped. A local segment that starts
below that offset but ends above it (replicas roll at different offsets) is copied whole, but recorded as
starting at highest + 1, so no offset range is ever remote twice.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from rlm import metrics
from rlm.deleter import SegmentDeleter
from rlm.segments import epochs_for_range, to_rsm
from rlm.staging import SegmentGoneError, StagedSegment, Staging
from rlmm.api import (
    RemoteLogMetadataManager,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from rsm.api import LogSegmentData, RemoteStorageManagerApi
from rsm.log.batch import scan_batches
from rsm.log.checkpoint import EpochEntry, format_leader_epoch_checkpoint
from rsm.log.errors import LogFormatError
from rsm.log.indexes import read_time_index
from rsm.log.partition import PartitionDir

__all__ = ["CopyResult", "PartitionCopier", "highest_remote_offset"]

log = logging.getLogger(__name__)

ABANDONED_COPY_MS = 10 * 60 * 1000  # another broker's COPY_SEGMENT_STARTED older than this is abandoned


@dataclass
class CopyResult:
    copied: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)  # (first, last) offsets lost before staging
    waiting_for_lso: int = 0  # staged segments not copied because they end at or above the LSO
    cleaned_up: int = 0


def highest_remote_offset(rlmm: RemoteLogMetadataManager, tp: TopicIdPartition,
                          epochs: list[EpochEntry]) -> int:
    """The highest offset copied under the partition's epoch lineage (latest epoch first), or -1.

    From live COPY_SEGMENT_FINISHED segments only (the metadata cache answers so, to answer the same after a rebuild
    from the compacted topic): once remote retention has deleted every segment of an epoch, it no longer counts.
    :class:`PartitionCopier` keeps the highest it has tiered, in its watermark file across restarts.
    """
    for i in range(len(epochs) - 1, -1, -1):
        off = rlmm.highest_offset_for_epoch(tp, epochs[i].epoch)
        if off is not None:
            # As Kafka does: bounded by the epoch's end in this log (a diverged, truncated epoch ends earlier).
            return min(off, epochs[i + 1].start_offset - 1) if i + 1 < len(epochs) else off
    return -1


class PartitionCopier:
    """Copies one partition's rolled segments. Not thread-safe: the scheduler runs one instance at a time."""

    def __init__(self, *, broker_id: int, tp: TopicIdPartition, partition_dir: Path,
                 rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManagerApi, staging: Staging,
                 deleter: SegmentDeleter, min_max_timestamp_ms: int | None = None,
                 watermark_path: Path | None = None) -> None:
        self.broker_id = broker_id
        self.tp = tp
        self.partition_dir = partition_dir
        self.rlmm = rlmm
        self.rsm = rsm
        self.staging = staging
        self.deleter = deleter
        # Segments whose newest record is older than this would be expired at once: not copied (see expiration).
        self.min_max_timestamp_ms = min_max_timestamp_ms
        self._last_known_end = -1
        # The highest offset tiered so far (None: no run yet). Kept in ``watermark_path`` across restarts: once
        # remote retention has deleted every segment, the metadata no longer knows it (see highest_remote_offset).
        self.watermark_path = watermark_path
        self._highest: int | None = self._read_watermark()
        self._persisted = self._highest

    # --------------------------------------------------------------------------------------------- staging
    def stage_new(self, highest: int) -> tuple[list[StagedSegment], list[tuple[int, int]]]:
        """Stage the rolled local segments above ``highest``; return all staged segments and new gaps."""
        pdir = PartitionDir(self.partition_dir)
        segments = pdir.segments()
        gaps: list[tuple[int, int]] = []
        for base, end in pdir.rolled_ranges():
            if end <= highest:
                continue
            try:
                self.staging.stage(self.tp.topic, self.tp.partition, self.partition_dir, base, end)
            except SegmentGoneError:
                gaps.append((base, end))
        staged = sorted((s for s in self.staging.staged()
                         if s.topic == self.tp.topic and s.partition == self.tp.partition),
                        key=lambda s: s.base_offset)
        # Staged leftovers that are remote already (copied by us before a crash, or by another leader).
        keep = []
        for s in staged:
            if s.end_offset_inclusive <= highest:
                self.staging.release(s)
            else:
                keep.append(s)
        # Offsets between what is remote (or staged) and the first local segment: gone before we saw them.
        expect = highest + 1
        first_local = segments[0].base_offset if segments else None
        if highest >= 0 and keep and keep[0].base_offset > expect:
            gaps.append((expect, keep[0].base_offset - 1))
        elif highest >= 0 and not keep and first_local is not None and first_local > expect:
            gaps.append((expect, first_local - 1))
        gaps = [g for g in gaps if g[1] > self._last_known_end]  # report each gap once
        for first, last in gaps:
            metrics.SEGMENT_GAPS.labels(self.tp.topic, str(self.tp.partition)).inc()
            log.error("offsets deleted by the broker before they could be staged: not remote",
                      extra={"partition": str(self.tp), "first_offset": first, "last_offset": last})
            self._last_known_end = max(self._last_known_end, last)
        return keep, gaps

    def stage_rolled(self) -> int:
        """Stage the rolled local segments above the highest remote offset of the last run; return how many.

        Runs on its own short interval, between copy runs, so the broker's local retention cannot delete a
        segment before it is staged even when local retention is shorter than the copy interval. Safe to run
        beside :meth:`run_once` (staging is locked; a segment staged again after its copy is released by the
        next run). Gaps are counted by :meth:`run_once` only.
        """
        highest = self._highest
        if highest is None:
            return 0
        n = 0
        for base, end in PartitionDir(self.partition_dir).rolled_ranges():
            if end <= highest:
                continue
            try:
                self.staging.stage(self.tp.topic, self.tp.partition, self.partition_dir, base, end)
                n += 1
            except SegmentGoneError:
                continue
        return n

    # ------------------------------------------------------------------------------------------- clean-up
    def clean_up_unfinished(self, in_flight: set[uuid.UUID] | None = None) -> int:
        """Delete copies left COPY_SEGMENT_STARTED by a crash (ours) or abandoned (another broker's, old)."""
        now_ms = int(time.time() * 1000)
        n = 0
        for md in self.rlmm.list_remote_log_segments(self.tp):
            if md.state != RemoteLogSegmentState.COPY_SEGMENT_STARTED:
                if md.state == RemoteLogSegmentState.DELETE_SEGMENT_STARTED:
                    self.deleter.delete(md, "unfinished-delete")
                    n += 1
                continue
            if in_flight and md.remote_log_segment_id.id in in_flight:
                continue
            if md.broker_id != self.broker_id and now_ms - md.event_timestamp_ms < ABANDONED_COPY_MS:
                continue
            self.deleter.delete(md, "unfinished-copy")
            n += 1
        return n

    # ----------------------------------------------------------------------------------------------- copy
    def run_once(self, last_stable_offset: int, stop: threading.Event | None = None) -> CopyResult:
        result = CopyResult()
        result.cleaned_up = self.clean_up_unfinished()
        pdir = PartitionDir(self.partition_dir)
        epochs = pdir.leader_epochs()
        highest = highest_remote_offset(self.rlmm, self.tp, epochs)
        if self._highest is not None and self._highest > highest:
            # The metadata counts only live segments: remote retention deleted what we copied (all of it, or the
            # newest). Those offsets were tiered once; copying the still-local segments again would only feed
            # retention again.
            highest = self._highest
        staged, result.gaps = self.stage_new(highest)
        self._highest = highest
        lag_bytes = sum(s.log_path.stat().st_size for s in staged if s.log_path.exists())
        metrics.COPY_LAG_SEGMENTS.labels(self.tp.topic, str(self.tp.partition)).set(len(staged))
        metrics.COPY_LAG_BYTES.labels(self.tp.topic, str(self.tp.partition)).set(lag_bytes)
        for s in staged:
            if stop is not None and stop.is_set():
                break
            if s.end_offset_inclusive <= highest:
                # Remote already, by a copy earlier in this run: the same offsets staged twice (a replica moved
                # between log dirs leaves them staged from the old dir and from the new one).
                self.staging.release(s)
                continue
            if s.end_offset_inclusive >= last_stable_offset:
                result.waiting_for_lso += 1
                continue  # this and every later segment wait for the LSO to move past them
            start = max(s.base_offset, highest + 1)
            md = self.copy_segment(s, start, epochs)
            if md is None:
                self.staging.release(s)  # nothing worth copying (expired already); not a gap
                highest = self._highest = s.end_offset_inclusive
                continue
            result.copied.append(md)
            highest = self._highest = md.end_offset_inclusive
            self.staging.release(s)
        self._write_watermark()
        return result

    # ------------------------------------------------------------------------------------------ watermark
    def _read_watermark(self) -> int | None:
        if self.watermark_path is None:
            return None
        try:
            return int(self.watermark_path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            log.warning("copy watermark unreadable: ignored", extra={
                "partition": str(self.tp), "path": str(self.watermark_path), "error": str(err)})
            return None

    def _write_watermark(self) -> None:
        """Persist the highest tiered offset when it moved (temp file + rename: never half written)."""
        if self.watermark_path is None or self._highest is None or self._highest == self._persisted:
            return
        self.watermark_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.watermark_path.with_name(self.watermark_path.name + ".tmp")
        tmp.write_text(str(self._highest))
        os.replace(tmp, self.watermark_path)
        self._persisted = self._highest

    def _max_timestamp(self, s: StagedSegment) -> int:
        """The segment's largest timestamp: the last time-index entry (Kafka appends one at roll), else a scan."""
        tix = s.file(".timeindex")
        if tix is not None:
            try:
                entries = read_time_index(tix, s.base_offset)
                if entries:
                    return entries[-1].timestamp_ms
            except LogFormatError:
                pass
        return max((b.max_timestamp for b in scan_batches(s.log_path)), default=-1)

    def copy_segment(self, s: StagedSegment, start_offset: int,
                     epochs: list[EpochEntry]) -> RemoteLogSegmentMetadata | None:
        seg_epochs = epochs_for_range(epochs, start_offset, s.end_offset_inclusive)
        if not seg_epochs:
            # No checkpoint entry covers the segment (should not happen on a leader): take the batches' epochs.
            first = next(iter(scan_batches(s.log_path)), None)
            seg_epochs = [EpochEntry(max(first.partition_leader_epoch, 0) if first else 0, start_offset)]
        max_ts = self._max_timestamp(s)
        if self.min_max_timestamp_ms is not None and 0 <= max_ts < self.min_max_timestamp_ms:
            log.info("segment older than remote retention: not copied", extra={
                "partition": str(self.tp), "base_offset": s.base_offset, "max_timestamp_ms": max_ts})
            return None
        now_ms = int(time.time() * 1000)
        md = RemoteLogSegmentMetadata(
            remote_log_segment_id=RemoteLogSegmentId.generate(self.tp),
            start_offset=start_offset,
            end_offset_inclusive=s.end_offset_inclusive,
            max_timestamp_ms=max_ts,
            broker_id=self.broker_id,
            event_timestamp_ms=now_ms,
            segment_size_bytes=s.log_path.stat().st_size,
            segment_leader_epochs=tuple((e.epoch, e.start_offset) for e in seg_epochs),
            state=RemoteLogSegmentState.COPY_SEGMENT_STARTED,
            txn_index_empty=s.file(".txnindex") is None,
        )
        # The checkpoint as Kafka hands it to the storage manager: the epochs up to the segment's end.
        checkpoint = format_leader_epoch_checkpoint([e for e in epochs if e.start_offset <= s.end_offset_inclusive])
        data = LogSegmentData(
            log_path=s.log_path,
            offset_index_path=s.directory / f"{s.base_offset:020d}.index",
            time_index_path=s.directory / f"{s.base_offset:020d}.timeindex",
            transaction_index_path=s.file(".txnindex"),
            producer_snapshot_path=s.file(".snapshot"),
            leader_epoch_checkpoint=checkpoint,
        )
        self.rlmm.add_remote_log_segment_metadata(md)
        started = time.monotonic()
        try:
            custom = self.rsm.copy_log_segment_data(to_rsm(md), data)
        except Exception as err:
            metrics.ERRORS.labels("copy").inc()
            log.error("copy failed; removing the attempt", extra={
                "partition": str(self.tp), "base_offset": s.base_offset, "segment": str(md.remote_log_segment_id),
                "error": str(err)})
            try:
                self.deleter.delete(md, "failed-copy")
            except Exception as cleanup_err:  # noqa: BLE001 - the next run's clean-up retries it
                log.error("clean-up of failed copy failed", extra={"error": str(cleanup_err)})
            raise
        elapsed = time.monotonic() - started
        self.rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
            md.remote_log_segment_id, int(time.time() * 1000), custom,
            RemoteLogSegmentState.COPY_SEGMENT_FINISHED, self.broker_id))
        metrics.COPY_SECONDS.observe(elapsed)
        metrics.BYTES_COPIED.labels(self.tp.topic).inc(md.segment_size_bytes)
        metrics.SEGMENTS_COPIED.labels(self.tp.topic).inc()
        log.info("segment copied", extra={
            "partition": str(self.tp), "start_offset": md.start_offset, "end_offset": md.end_offset_inclusive,
            "bytes": md.segment_size_bytes, "seconds": round(elapsed, 3), "segment": str(md.remote_log_segment_id)})
        from dataclasses import replace

        return replace(md, state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED, custom_metadata=custom)
