"""Streaming offload (PIP-76, ``/work/shared/seeds`` 000): committed data becomes remote within seconds, whatever the
broker's segment rolls.

A partition of a topic in ``streaming`` mode (:class:`rlm.config.OffloadRule`) is offloaded by its leader's sidecar
in *offload segments* cut from the local log at any batch boundary, the active segment included:

- An offload segment starts right after the highest offset tiered along this broker's lineage (as the segment
  copier resumes: :meth:`PartitionCopier.resume_point`) and grows, poll after poll, by the whole batches that are
  committed: below the last stable offset, so never above the high watermark (a leader change could truncate
  there) and never inside an open transaction.
- It closes when it holds ``offload_max_bytes`` (a batch that would take it past the bound goes to the next one; a
  batch larger than the bound is one segment on its own), or ``offload_max_ms`` after its first batch was seen
  committed. Then it is copied (:meth:`rsm.api.RemoteStorageManagerApi.copy_log_range`: one data object and one
  index object, two PUTs) as one Kafka remote segment, COPY_SEGMENT_STARTED / FINISHED with the copier's fencing
  (:meth:`PartitionCopier.commit_copy`). The next one starts only after that (PIP-76).
- It may hold the tail of one local segment and the head of the next; a huge local segment spans several.
  Rolled local segments are hard-linked into staging first (as the segment copier does), so the broker's local
  retention cannot take them while they are read.
- **No offload buffer**: the batches are read from the broker's log files when the segment closes, not held in
  memory while it grows (they were written seconds ago: the page cache has them). Memory is one block, whatever the
  bounds; an offload that fell behind reads the same files.
- A copy that failed, a crash or a SIGKILL leave at most a COPY_SEGMENT_STARTED copy: the next run (or the next
  leader) deletes it and cuts the segment again, with a new copy id, from the resume point. A leadership move
  continues from the last FINISHED offload segment of the new leader's lineage.
- When the broker later rolls a segment whose offsets are remote already, nothing is copied: the segment copier
  and this offloader both resume after the highest remote offset, and a local segment that straddles it is copied
  from there on (switching a topic back to ``segment`` mode leaves no gap and no overlap).

Aborted transactions come from the ``.txnindex`` of the local segments (the active one's is live; every marker of
a transaction with records in the range is there, the range being below the LSO).
There is no producer snapshot for an offload segment: fetching it answers not found.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rlm import metrics
from rlm.tasks.copier import REFUSED, CopyFencedError, CopyResult, PartitionCopier
from rlm.tasks.segment_epochs import copy_epochs
from rlm.tier import epoch_pairs, to_rsm
from rlmm.api import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState
from rsm.api import LogPiece, LogRangeData
from rsm.errors import CopyCancelledError
from rsm.log.batch import BatchHeader, scan_batches
from rsm.log.checkpoint import EpochEntry, format_leader_epoch_checkpoint
from rsm.log.errors import CorruptRecordBatchError, LogFormatError
from rsm.log.indexes import format_txn_index, lookup_position, read_offset_index
from rsm.log.partition import PartitionDir, segment_file_name

__all__ = ["OffloadCut", "StreamingOffloader"]

log = logging.getLogger(__name__)

STUCK_S = 60.0  # a batch cut short at the end of the active segment for this long is reported, not waited for


@dataclass
class OffloadCut:
    """The offload segment being cut: committed batches from ``start_offset`` on, not remote yet."""

    start_offset: int
    pieces: list[LogPiece] = field(default_factory=list)
    size_bytes: int = 0
    last_offset: int = -1
    max_timestamp_ms: int = -1
    opened_at: float | None = None  # clock() when its first batch was seen committed
    full: bool = False  # the next committed batch would take it past offload_max_bytes
    resume_at: LogPiece | None = None  # the previous offload segment's last piece: its end is where this one starts

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1 if self.pieces else self.start_offset

    def add(self, path: Path, position: int, size: int, last_offset: int, max_timestamp_ms: int) -> None:
        last = self.pieces[-1] if self.pieces else None
        if last is not None and last.log_path == path and last.end_position == position:
            self.pieces[-1] = LogPiece(path, last.start_position, position + size)
        else:
            self.pieces.append(LogPiece(path, position, position + size))
        self.size_bytes += size
        self.last_offset = last_offset
        self.max_timestamp_ms = max(self.max_timestamp_ms, max_timestamp_ms)


@dataclass(frozen=True, slots=True)
class _LocalFile:
    base_offset: int
    log_path: Path
    index_path: Path
    rolled: bool


class StreamingOffloader:
    """Offloads one led partition in streaming mode; one :meth:`run_once` per poll. Not thread-safe (the scheduler
    runs one at a time). Shares the partition's :class:`PartitionCopier` (its resume point, watermark, staging,
    clean-up and commit of copies)."""

    def __init__(self, copier: PartitionCopier, *, max_bytes: int, max_ms: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.copier = copier
        self.max_bytes = max_bytes
        self.max_ms = max_ms
        self.clock = clock
        self.cut: OffloadCut | None = None  # None: resume point to be found (first run, after a failure or move)
        self._epoch: int | None = None
        self._torn: tuple[tuple[Path, int], float] | None = None  # (file, position) of a batch cut short, since

    @property
    def tp(self):  # noqa: ANN201 - rlmm.api.TopicIdPartition
        return self.copier.tp

    def reset(self) -> None:
        """Forget the cut: the next run finds the resume point again from the metadata."""
        self.cut = None

    def run_once(self, last_stable_offset: int, stop: threading.Event | None = None, *,
                 leader_epoch: int | None = None,
                 current_leader_epoch: Callable[[], int | None] | None = None,
                 epochs: list[EpochEntry] | None = None) -> CopyResult:
        """One offload run (the arguments as :meth:`PartitionCopier.run_once`'s)."""
        try:
            return self._run_once(last_stable_offset, stop, leader_epoch, current_leader_epoch, epochs)
        finally:
            if self.cut is not None:
                self._report_lag(self.cut, self._local_files())

    def _run_once(self, last_stable_offset: int, stop: threading.Event | None, leader_epoch: int | None,
                  current_leader_epoch: Callable[[], int | None] | None,
                  epochs: list[EpochEntry] | None) -> CopyResult:
        result = CopyResult()
        if stop is not None and stop.is_set():
            return result  # leadership lost before the run started: nothing to do (see PartitionCopier.run_once)
        copier = self.copier
        if epochs is None:
            epochs = PartitionDir(copier.partition_dir).leader_epochs()
        if self.cut is None or leader_epoch != self._epoch:
            result.cleaned_up = copier.clean_up_unfinished(leader_epoch=leader_epoch)
            self.cut = OffloadCut(copier.resume_point(epochs) + 1)
            self._epoch = leader_epoch
        cut = self.cut
        _staged, result.gaps = copier.stage_new(cut.start_offset - 1, stop)
        try:
            self._extend(cut, last_stable_offset, self._local_files())
        except LogFormatError as err:
            # A batch below the LSO that does not parse: never skipped (the copy would CRC-check it anyway).
            metrics.ERRORS.labels("offload-scan").inc()
            log.error("local log unreadable where the offload segment continues: not offloaded", extra={
                "partition": str(self.tp), "offset": cut.next_offset, "error": str(err)})
        age_ms = (self.clock() - cut.opened_at) * 1000 if cut.pieces and cut.opened_at is not None else 0.0
        metrics.OFFLOAD_OPEN_SECONDS.labels(self.tp.topic, str(self.tp.partition)).set(age_ms / 1000)
        if not cut.pieces or (stop is not None and stop.is_set()):
            return result
        if not cut.full and age_ms < self.max_ms:
            result.waiting_for_lso = 1  # open: waiting for more committed data or for its time bound
            return result
        try:
            md = self._copy(cut, epochs, leader_epoch, current_leader_epoch)
        except CopyFencedError as err:
            metrics.ERRORS.labels("copy-fenced").inc()
            log.warning("offload fenced: the partition's leader epoch moved on; copy deleted", extra={
                "partition": str(self.tp), "start_offset": cut.start_offset, "error": str(err)})
            result.fenced = True
            self.reset()
            return result
        except CopyCancelledError:
            result.cancelled = True
            self.reset()
            return result
        except REFUSED as err:
            copier.refused(err, self._base_of(cut.start_offset), cut.pieces[0].log_path, cut.start_offset)
            self.reset()
            raise
        except Exception:
            self.reset()  # the failed copy was removed; the next run cuts again from the resume point
            raise
        result.copied.append(md)
        copier.tiered(md.end_offset_inclusive, md.epoch_at(md.end_offset_inclusive))
        copier.write_watermark()
        self.cut = OffloadCut(md.end_offset_inclusive + 1, resume_at=cut.pieces[-1])
        return result

    # ------------------------------------------------------------------------------------------------ scan
    def _local_files(self) -> list[_LocalFile]:
        """The partition's local segments, oldest first: a staged (hard-linked) copy of a rolled one when there is
        one, else the log dir's file (the active segment, or a rolled one staging refused)."""
        copier = self.copier
        files: dict[int, _LocalFile] = {}
        for seg in PartitionDir(copier.partition_dir).segments():
            files[seg.base_offset] = _LocalFile(seg.base_offset, seg.log_path, seg.offset_index_path,
                                                not seg.is_active)
        for s in copier.staging.staged(self.tp):
            files[s.base_offset] = _LocalFile(s.base_offset, s.log_path,
                                              s.directory / segment_file_name(s.base_offset, ".index"), True)
        return [files[b] for b in sorted(files)]

    def _report_lag(self, cut: OffloadCut, files: list[_LocalFile]) -> None:
        """``rlm_copy_lag_*`` in streaming mode: the local segments (the active one included) holding offsets from
        the cut's start on, and their bytes from where the cut starts (committed or not: what is local only)."""
        first = max((k for k, f in enumerate(files) if f.base_offset <= cut.start_offset), default=0)
        start = cut.pieces[0] if cut.pieces else None
        lag_bytes = 0
        for k, f in enumerate(files[first:]):
            try:
                size = f.log_path.stat().st_size
            except FileNotFoundError:
                continue  # deleted by the broker's retention since the listing
            if k == 0 and start is not None and start.log_path == f.log_path:
                size -= start.start_position
            elif k == 0 and not cut.pieces and cut.resume_at is not None and cut.resume_at.log_path == f.log_path:
                size -= cut.resume_at.end_position
            lag_bytes += max(size, 0)
        labels = (self.tp.topic, str(self.tp.partition))
        metrics.COPY_LAG_SEGMENTS.labels(*labels).set(len(files) - first if lag_bytes else 0)
        metrics.COPY_LAG_BYTES.labels(*labels).set(lag_bytes)

    def _extend(self, cut: OffloadCut, last_stable_offset: int, files: list[_LocalFile]) -> None:
        """Add the committed batches after the cut's last one, up to its byte bound."""
        i = max((k for k, f in enumerate(files) if f.base_offset <= cut.next_offset), default=None)
        if i is None:
            if files and not cut.pieces and cut.start_offset >= 0 and files[0].rolled:
                # The broker deleted the offsets after the resume point before they were offloaded (the sidecar was
                # down longer than local retention): reported by staging as a gap; go on from what is local, as the
                # segment copier does.
                cut.start_offset = files[0].base_offset
                i = 0
            else:
                return  # nothing local yet
        while i < len(files) and not cut.full:
            f = files[i]
            want = cut.next_offset
            if want >= last_stable_offset:
                return
            position = self._position(f, want, cut)
            for h in self._headers(f, position):
                if h.last_offset < want:
                    continue  # below the resume point (the scan started at an index entry at or before it)
                if h.base_offset < want:
                    raise LogFormatError(f.log_path, h.position, f"batch holds offsets {h.base_offset}.."
                                         f"{h.last_offset}, across the next offset to offload {want}")
                if h.last_offset >= last_stable_offset:
                    return  # not committed yet
                if cut.pieces and cut.size_bytes + h.size_bytes > self.max_bytes:
                    cut.full = True
                    return
                if not cut.pieces:
                    cut.opened_at = self.clock()
                cut.add(f.log_path, h.position, h.size_bytes, h.last_offset, h.max_timestamp)
                want = h.last_offset + 1
                if cut.size_bytes >= self.max_bytes:
                    cut.full = True
                    return
            if not f.rolled:
                return  # the end of the active segment: wait for more
            i += 1

    def _headers(self, f: _LocalFile, position: int) -> Iterator[BatchHeader]:
        """The batch headers of ``f`` from ``position``. In the active segment a batch cut short by the end of the
        file is one the broker is writing: the scan ends before it (it is above the high watermark). If it is
        still there after ``STUCK_S`` while the LSO is above, it is reported (the copy itself would refuse it)."""
        try:
            yield from scan_batches(f.log_path, start_position=position, verify_crc=False, zero_tail_ok=not f.rolled)
        except CorruptRecordBatchError as err:
            if f.rolled:
                raise
            now = self.clock()
            if self._torn is None or self._torn[0] != (f.log_path, err.position):
                self._torn = ((f.log_path, err.position), now)
            elif now - self._torn[1] > STUCK_S:
                raise
            return
        self._torn = None

    def _base_of(self, offset: int) -> int:
        """The base offset of the local segment holding ``offset`` (``offset`` itself when none does)."""
        return max((f.base_offset for f in self._local_files() if f.base_offset <= offset), default=offset)

    @staticmethod
    def _position(f: _LocalFile, offset: int, cut: OffloadCut) -> int:
        """Where to scan ``f`` from for ``offset``: right after the cut's last batch (or the previous offload
        segment's) when it is in ``f``, else the floor entry of ``f``'s offset index (0 when there is none: an
        active segment's index is preallocated, megabytes read whole, so it is not read again at every cut)."""
        last = cut.pieces[-1] if cut.pieces else cut.resume_at
        if last is not None and last.log_path == f.log_path:
            return last.end_position
        if offset <= f.base_offset:
            return 0
        try:
            return lookup_position(read_offset_index(f.index_path, f.base_offset), offset)
        except (OSError, LogFormatError):
            return 0  # no usable index: scan from the start

    # ------------------------------------------------------------------------------------------------ copy
    def _copy(self, cut: OffloadCut, epochs: list[EpochEntry], leader_epoch: int | None,
              current_leader_epoch: Callable[[], int | None] | None) -> RemoteLogSegmentMetadata:
        copier = self.copier
        start, end = cut.start_offset, cut.last_offset
        # The batches' epochs: the checkpoint's where it covers the cut (the store's copy checks them), else a walk
        # of its batches here (rlm.tasks.segment_epochs)
        seg_epochs = copy_epochs(epochs, start, end, lambda: _cut_headers(cut), str(cut.pieces[0].log_path),
                                 copy_checks=copier.copy_checks_epochs)
        base = self._base_of(start)
        # every .txnindex from the local segment holding `start` on (aborted_txns takes those above its base)
        aborted = copier.aborted_txns(base - 1, start, end)
        md = RemoteLogSegmentMetadata(
            remote_log_segment_id=RemoteLogSegmentId.generate(self.tp),
            start_offset=start,
            end_offset_inclusive=end,
            max_timestamp_ms=cut.max_timestamp_ms,
            broker_id=copier.broker_id,
            event_timestamp_ms=int(time.time() * 1000),
            segment_size_bytes=cut.size_bytes,
            segment_leader_epochs=epoch_pairs(seg_epochs),
            state=RemoteLogSegmentState.COPY_SEGMENT_STARTED,
            txn_index_empty=not aborted,
            broker_leader_epoch=leader_epoch,
        )
        data = LogRangeData(
            pieces=tuple(cut.pieces),
            transaction_index=format_txn_index(aborted) if aborted else None,
            leader_epoch_checkpoint=format_leader_epoch_checkpoint([e for e in epochs if e.start_offset <= end]))
        md = copier.commit_copy(md, lambda: copier.rsm.copy_log_range(to_rsm(md), data, cancel=copier.cancel,
                                                                      **copier.copy_options, **copier.epoch_options),
                                leader_epoch=leader_epoch, current_leader_epoch=current_leader_epoch)
        metrics.OFFLOAD_SEGMENT_SECONDS.observe(self.clock() - (cut.opened_at or self.clock()))
        return md


def _cut_headers(cut: OffloadCut) -> Iterator[BatchHeader]:
    """The batch headers of ``cut``'s pieces, in offset order. A piece is whole batches; what follows it in an
    active segment (a batch the broker is writing) is none of the cut's: the scan ends there, whatever it finds."""
    for piece in cut.pieces:
        reached = piece.start_position
        try:
            for h in scan_batches(piece.log_path, start_position=piece.start_position, verify_crc=False,
                                  zero_tail_ok=True):
                if h.position >= piece.end_position:
                    break
                yield h
                reached = h.end_position
        except CorruptRecordBatchError as err:
            if err.position is None or err.position < piece.end_position:
                raise
        if reached != piece.end_position:
            raise CorruptRecordBatchError(piece.log_path, reached, f"the offload segment's batches end at byte "
                                          f"{piece.end_position}, the file's at {reached}")
