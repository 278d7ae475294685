"""The leader copy task of one partition: rolled segments below the last stable offset, oldest first.

One run (:meth:`PartitionCopier.run_once`):

1. Stage every rolled segment that is not remote yet (hard links, :mod:`rlm.tasks.staging`; all of them as one
   staging round: one fsync), so the broker's local retention cannot take it away before it is copied. A segment
   the broker deleted before it could be staged is a *gap*: counted (``rlm_segment_gaps``) and logged with its
   offsets, never silent. Where the topic's ``file.delete.delay.ms`` is long against the stage interval
   (:attr:`PartitionCopier.defer_staging_s`), a segment whose ``.log`` is live is not staged: step 3 opens its files
   in place when its turn comes (:mod:`rlm.tasks.in_place`), and the stage job stages it should it wait too long or
   retention rename it first.
2. Clean up copies that were left COPY_SEGMENT_STARTED (a crashed or abandoned attempt): delete them.
3. Copy, oldest first, every staged segment whose end offset is below the last stable offset (nothing of an open
   transaction is ever uploaded), in *batches* of up to :data:`COPY_BATCH_SEGMENTS` segments
   (:meth:`PartitionCopier.commit_copies`): COPY_SEGMENT_STARTED of the batch in one metadata write, the store's
   copies one after the other, the batch's copies made durable together (the filesystem store: one directory fsync
   for the batch), one fencing check, COPY_SEGMENT_FINISHED of the batch in one metadata write (one produce flush
   and one read-your-writes wait each, instead of one per segment); release staging.

Where to resume: the end of the remote chain of this broker's leader-epoch lineage (:mod:`rlm.tier.chain`; as Kafka's
``findHighestRemoteOffset``), so a new leader continues where the old one stopped, and offsets a diverged lineage
tiered (an unclean election) are tiered again from this lineage. A local segment that starts below that offset
but ends above it (replicas roll at different offsets) is copied from highest + 1 on (the storage manager skips
the batches below), so no offset range is ever remote twice.

The transaction index uploaded with a segment lists every aborted transaction whose records it holds, wherever its
ABORT marker is (Kafka's local ``.txnindex`` lists the aborts whose *markers* are in the segment). A segment is
copied only below the last stable offset, so by then every such marker is in the local log: in the segment or a
later one, often the active one, which could be copied much later. Readers of the remote tier have no local log
to fall back on, as Kafka's broker has; with the markers' entries uploaded with the segment they need no later
segment to drop the aborted records.

Fencing, as Kafka's copy task: a copy carries the leader epoch it started under (``broker_leader_epoch``). Before
COPY_SEGMENT_FINISHED the copier asks again; once the partition's leader epoch has moved on (or leadership is
lost), the copy is deleted instead of finished. The metadata manager refuses a FINISHED whose epoch is below one
a later copy started under (:class:`rlmm.api.CopyFencedError`), which closes the window between check and write.
In a batch the one check is made after the batch's last copy, so it comes after each segment's copy and before its
FINISHED, as a check per segment would; the metadata's refusal is per record.

A batch and a crash: whatever point a crash interrupts, the batch's segments are COPY_SEGMENT_STARTED (copied or
not yet: the next run's clean-up deletes them, as it deletes any copy of ours left STARTED, and deleting a copy
whose objects were never written deletes nothing) or COPY_SEGMENT_FINISHED (copied, checked). A failure in a batch
finishes the segments before it (they are copied and checked) and removes the failing one and every later one,
FINISHED ones included: the remote chain never gets a hole that a later segment would hide from the resume point.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from rlm import metrics
from rlm.state import fsync_dir
from rlm.tasks.deleter import SegmentDeleter
from rlm.tasks.in_place import InPlaceSegment, LocalRange, live_log
from rlm.tasks.segment_epochs import BatchEpochError, EpochMismatchError, copy_epochs
from rlm.tasks.staging import StagedSegment, Staging, StagingFullError, TopicIdMismatchError
from rlm.tier import Lineage, checkpoint_epoch_at, epoch_pairs, lineage_of, remote_chain, to_rsm
from rlmm.api import (
    CopyFencedError,
    InvalidStateTransitionError,
    RemoteLogMetadataManager,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
    UnknownSegmentError,
)
from rsm.api import LogSegmentData, RemoteStorageManagerApi
from rsm.errors import CopyCancelledError
from rsm.log.batch import scan_batches
from rsm.log.checkpoint import EpochEntry, format_leader_epoch_checkpoint
from rsm.log.epochs import REASONS as BATCH_EPOCH_REASONS
from rsm.log.errors import LogFormatError
from rsm.log.indexes import TXN_ENTRY, AbortedTxn, format_txn_index, parse_txn_index, read_time_index
from rsm.log.partition import DELETED_SUFFIX, PartitionDir, segment_file_name
from rsm.manager import kept_range

__all__ = ["REFUSED", "CopyFencedError", "CopyResult", "PartitionCopier", "forget_held", "highest_remote_offset"]

log = logging.getLogger(__name__)

ABANDONED_COPY_MS = 10 * 60 * 1000  # another broker's COPY_SEGMENT_STARTED older than this is abandoned
_TXN_INDEX_NAME = re.compile(r"(\d{20})\.txnindex")  # a segment's transaction index in the partition dir
COPY_BATCH_SEGMENTS = 16
"""The most segments one batch copies (:meth:`PartitionCopier.commit_copies`): their FINISHED waits for the batch's
last copy, so a backfill of many segments still makes them readable 16 at a time."""
_WATERMARK_BYTES = 64  # the copy watermark file's one record (write_watermark)
COPY_BATCH_BYTES = 64 * 1024 * 1024
"""A batch closes once its segments hold this many bytes (a large segment is a batch of its own)."""


Copied = StagedSegment | InPlaceSegment  # a segment as a copy reads it: staged, or held open in place
REFUSED = (EpochMismatchError, BatchEpochError)
"""A copy refused for its batches' leader epochs (:mod:`rlm.tasks.segment_epochs`): the partition's copying is held
at that segment, each run trying it again, until it clears (:meth:`PartitionCopier.refused`)."""


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


@dataclass
class CopyResult:
    copied: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    gaps: list[tuple[int, int]] = field(default_factory=list)  # (first, last) offsets lost before staging
    waiting_for_lso: int = 0  # staged segments not copied because they end at or above the LSO
    cleaned_up: int = 0
    fenced: bool = False  # the run stopped: the partition's leader epoch moved on during a copy
    cancelled: bool = False  # the run stopped: the copy in flight was cancelled (leadership lost, topic deleted)


def highest_remote_offset(rlmm: RemoteLogMetadataManager, tp: TopicIdPartition, epochs: list[EpochEntry],
                          segments: list[RemoteLogSegmentMetadata] | None = None) -> tuple[int, Lineage]:
    """The end of the remote chain of this broker's leader-epoch lineage (-1 when nothing is remote), and that
    lineage (the metadata's below the local checkpoint's first epoch, the checkpoint from there on).

    From live COPY_SEGMENT_FINISHED segments only (the metadata cache answers so, to answer the same after a rebuild
    from the compacted topic): once remote retention has deleted every segment, it no longer counts.
    :class:`PartitionCopier` keeps the highest it has tiered, in its watermark file across restarts.
    ``segments``: the partition's metadata as just listed (None: listed here).
    """
    if segments is None:
        segments = rlmm.list_remote_log_segments(tp)
    lineage = lineage_of(segments).merged_with_local(epochs)
    chain = remote_chain(segments, lineage)
    return (chain[-1].end_offset_inclusive if chain else -1), lineage


class PartitionCopier:
    """Copies one partition's rolled segments. Not thread-safe: the scheduler runs one instance at a time."""

    def __init__(self, *, broker_id: int, tp: TopicIdPartition, partition_dir: Path,
                 rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManagerApi, staging: Staging,
                 deleter: SegmentDeleter, min_max_timestamp_ms: int | None = None,
                 watermark_path: Path | None = None, cancel: threading.Event | None = None) -> None:
        self.broker_id = broker_id
        self.tp = tp
        self.partition_dir = partition_dir
        self._pdir = PartitionDir(partition_dir)  # (stateless: every question lists or reads anew)
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
        self._watermark: tuple[int, int | None] | None = self._read_watermark()  # (offset, its leader epoch)
        self._persisted = self._watermark
        # tiered() passed over offsets no metadata records (expired, not copied): the next write is fsynced
        self._watermark_unrecorded = False
        self._watermark_named = False  # the file's name made durable by this process (write_watermark)
        self._highest: int | None = None  # the resume point of the last run (staging between runs starts there)
        self._run_staged: list[StagedSegment] | None = None  # the staged segments of the run in progress
        # How long a rolled segment may wait unstaged (rlm.tasks.in_place; None: staged at once, as before), set by
        # the sidecar from the topic's file.delete.delay.ms before each copy run and stage round.
        self.defer_staging_s: float | None = None
        # base offset -> (end offset, when a stage round or copy run first saw it uncopied and left it unstaged)
        self._deferred: dict[int, tuple[int, float]] = {}
        self._deferred_lock = threading.Lock()  # (the stage job and the copy run both keep it)
        self._run_names: set[str] | None = None  # the partition dir's entries, listed at the run's start
        self._listing: list[RemoteLogSegmentMetadata] | None = None  # the last clean-up's, when it changed nothing
        # Set when the partition is no longer led here (leadership moved, topic deleted): the copy in flight stops
        # at its next block and is removed (rsm CopyCancelledError), instead of running to its end to be fenced.
        self.cancel = cancel
        # Another broker's copies left COPY_SEGMENT_STARTED that the last clean-up let be (young: maybe in flight).
        self._unfinished_waiting = 0
        # The store's copies of a batch are made durable together, after the batch's last copy (make_durable: one
        # directory fsync for the batch on the filesystem store), when the storage manager can: the keyword arguments
        # of each store copy (of this copier's and the streaming offloader's) say so.
        self.copy_options: dict[str, bool] = {"durable": False} if callable(getattr(rsm, "make_durable", None)) \
            else {}
        # A storage manager whose copy checks the batches' leader epochs against the metadata's on its own walk of
        # them (rsm check_epochs): a range the checkpoint covers is not walked here first (rlm.tasks.segment_epochs).
        self.copy_checks_epochs = getattr(rsm, "checks_epochs", False) is True
        self.epoch_options: dict[str, bool] = {"check_epochs": True} if self.copy_checks_epochs else {}
        """The keyword arguments of each store copy (the copier's and the offloader's) that have it check them."""
        self._held: tuple[str, int] | None = None  # (reason, start offset) of the refused copy holding the partition

    # --------------------------------------------------------------------------------------------- staging
    @property
    def tiered_offset(self) -> int:
        """The highest offset tiered so far by this copier (its watermark; -1 when none)."""
        return self._watermark[0] if self._watermark is not None else -1

    def stage_new(self, highest: int, stop: threading.Event | None = None, names: set[str] | None = None, *,
                  defer: bool = False) -> tuple[list[StagedSegment | LocalRange], list[tuple[int, int]]]:
        """Stage the rolled local segments above ``highest``; return all staged segments and new gaps.
        ``defer`` (a copy run while :attr:`defer_staging_s` is set): a segment whose ``.log`` is live is not staged
        but returned as a :class:`~rlm.tasks.in_place.LocalRange` among the staged ones, in offset order, to be
        copied in place (:mod:`rlm.tasks.in_place`), and left to the stage job's deferral until then; one renamed
        ``.deleted`` already is staged.
        ``highest`` is remembered: :meth:`stage_rolled` stages above it between runs. With ``stop`` set by the
        time the gaps are known (leadership lost meanwhile: the sidecar releases the staging of partitions it does
        not lead, so what it held looks missing), no gap is reported: the new leader's replica decides.

        ``names``: the partition dir's entries (None: listed here). One listing answers the segments, the rolled
        ranges and which of a segment's optional files exist (issue 26: a run listed the directory three times, plus
        once per segment copied)."""
        self._highest = highest
        pdir = self._pdir
        if names is None:
            names = set(os.listdir(self.partition_dir))
        ranges = pdir.rolled_ranges(names)
        # one staging round for every segment above highest that staging does not hold as is already (the stage job
        # staged most of them between runs: Staging.holds, one stat each, no listing of the staging dir): one fsync
        todo = [(b, e) for b, e in ranges
                if e > highest and not self.staging.holds(self.tp, self.partition_dir, b, e, names)]
        in_place = [(b, e) for b, e in todo if live_log(b, names)] if defer else []
        if in_place:
            try:  # (staging checks it when it stages: a segment copied in place is checked here)
                self.staging.check_topic_id(self.tp, self.partition_dir)
            except TopicIdMismatchError:
                in_place = []  # nothing copied; staging reports it below
        if in_place:
            todo = [r for r in todo if not live_log(r[0], names)]
        done = self.staging.stage_many(self.tp, self.partition_dir, todo, names=names)
        gaps: list[tuple[int, int]] = list(done.gone)
        if isinstance(done.error, TopicIdMismatchError):
            # The local partition now belongs to a re-created topic: discovery stops this copier next round.
            log.warning("partition dir belongs to another topic id: not staged", extra={
                "partition": str(self.tp), "error": str(done.error)})
        elif isinstance(done.error, StagingFullError):
            # what is staged is copied first; an unstaged segment the broker deletes meanwhile is a gap
            metrics.ERRORS.labels("staging-full").inc()
            log.warning("staging full: segment not staged", extra={
                "partition": str(self.tp), "error": str(done.error)})
        staged = self.staging.staged(self.tp)
        # Staged leftovers that are remote already (copied by us before a crash, or by another leader).
        keep: list[StagedSegment | LocalRange] = []
        for s in staged:
            if s.end_offset_inclusive <= highest:
                self.staging.release(s)
            else:
                keep.append(s)
        if in_place:
            held = {s.base_offset for s in keep}
            local = [LocalRange(self.tp, b, e, self.partition_dir) for b, e in in_place if b not in held]
            self._defer([(r.base_offset, r.end_offset_inclusive) for r in local])
            keep = sorted([*keep, *local], key=lambda s: s.base_offset)
        # Offsets between what is remote (or staged) and the first local segment: gone before we saw them.
        expect = highest + 1
        # the first live segment: the oldest rolled one whose .log is live, else the active one (the next base after
        # the rolled ones; without rolled ones, the only segment); no Segment built per file (issue 26)
        first_local = next((b for b, _e in ranges if segment_file_name(b, ".log") in names), None)
        if first_local is None:
            first_local = ranges[-1][1] + 1 if ranges else next((x.base_offset for x in pdir.segments(names)), None)
        if highest >= 0 and keep and keep[0].base_offset > expect:
            gaps.append((expect, keep[0].base_offset - 1))
        elif highest >= 0 and not keep and first_local is not None and first_local > expect:
            gaps.append((expect, first_local - 1))
        gaps = [g for g in gaps if g[1] > self._last_known_end]  # report each gap once
        if stop is not None and stop.is_set():
            return keep, []
        for first, last in gaps:
            metrics.SEGMENT_GAPS.labels(self.tp.topic, str(self.tp.partition)).inc()
            log.error("offsets deleted by the broker before they could be staged: not remote",
                      extra={"partition": str(self.tp), "first_offset": first, "last_offset": last})
            self._last_known_end = max(self._last_known_end, last)
        return keep, gaps

    def stage_rolled(self, names: frozenset[str] | None = None) -> int:
        """Stage the rolled local segments above the highest remote offset of the last run; return how many.
        ``names``: the partition dir's entries when the caller listed them already (the stage job: the log-dir
        watcher's listing of a changed dir, :attr:`rlm.watch.Changes.listings`); else it is listed here.

        Runs on its own short interval, between copy runs, so the broker's local retention cannot delete a
        segment before it is staged even when local retention is shorter than the copy interval. Safe to run
        beside :meth:`run_once` (staging is locked; a segment staged again after its copy is released by the
        next run). Gaps are counted by :meth:`run_once` only. With :attr:`defer_staging_s` set, a segment whose
        ``.log`` is live waits unstaged that long at most, for a copy run to copy it in place (:meth:`_due`,
        :mod:`rlm.tasks.in_place`).
        """
        highest = self._highest
        if highest is None:
            return 0
        if names is None:
            names = frozenset(os.listdir(self.partition_dir))
        # (a segment staged already is not asked for: the copy run checks it again before its copy); one staging
        # round for the rest: one fsync for their links, one for their markers
        ranges = self._pdir.rolled_ranges(names)
        # a segment known to wait unstaged is not asked of staging (it holds none such): _due judges it
        with self._deferred_lock:
            waiting = dict(self._deferred)
        todo = [(base, end) for base, end in ranges if end > highest and (
            (got := waiting.get(base)) is not None and got[0] == end
            or not self.staging.holds(self.tp, self.partition_dir, base, end, names))]
        todo = self._due(todo, ranges, highest, names)
        if not todo:
            return 0
        return len(self.staging.stage_many(self.tp, self.partition_dir, todo, names=names).staged)

    @property
    def deferring(self) -> bool:
        """Rolled segments are left unstaged (:mod:`rlm.tasks.in_place`) and not copied yet."""
        return bool(self._deferred)

    def staging_due(self, defer_s: float | None) -> bool:
        """Some segment left unstaged is to be staged now, with ``defer_s`` the topic's deferral (None: staging no
        longer waits): the stage job visits the partition then, changed or not (a rename shows as a change)."""
        with self._deferred_lock:
            if not self._deferred:
                return False
            if defer_s is None:
                return True
            now = time.monotonic()
            return any(now - t >= defer_s for _e, t in self._deferred.values())

    def deferred_bases(self) -> list[int]:
        """The base offsets of the rolled segments left unstaged (:attr:`deferring`): the retention margin counts
        them as it counts staged ones (retention's rename stages them before the broker's unlink)."""
        with self._deferred_lock:
            return list(self._deferred)

    def _defer(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Remember when ``ranges`` (rolled, uncopied) were first left unstaged."""
        now = time.monotonic()
        with self._deferred_lock:
            for base, end in ranges:
                got = self._deferred.get(base)
                if got is None or got[0] != end:
                    self._deferred[base] = (end, now)

    def _due(self, todo: list[tuple[int, int]], ranges: Sequence[tuple[int, int]], highest: int,
             names: Collection[str]) -> list[tuple[int, int]]:
        """Of the rolled segments ``todo`` that staging does not hold, those to stage now: all of them unless
        :attr:`defer_staging_s` is set; then those whose ``.log`` is not live any more (retention renamed it) and
        those left unstaged that long already (:mod:`rlm.tasks.in_place`); the others are remembered as left
        unstaged. Forgets what was copied (up to ``highest``) or staged since (among ``ranges``, not in ``todo``)."""
        defer = self.defer_staging_s
        now = time.monotonic()
        with self._deferred_lock:
            if defer is None:
                self._deferred.clear()
                return todo
            due = []
            for base, end in todo:
                got = self._deferred.get(base)
                if got is None or got[0] != end:
                    got = self._deferred[base] = (end, now)
                if not live_log(base, names) or now - got[1] >= defer:
                    due.append((base, end))
            left = {b for b, _e in todo} - {b for b, _e in due}
            rolled = {b for b, _e in ranges}
            for base in [b for b, (e, _t) in self._deferred.items()
                         if e <= highest or (b in rolled and b not in left)]:
                del self._deferred[base]
            return due

    # ------------------------------------------------------------------------------------------- clean-up
    def clean_up_unfinished(self, in_flight: set[uuid.UUID] | None = None, leader_epoch: int | None = None) -> int:
        """Delete copies left COPY_SEGMENT_STARTED by a crash (ours), abandoned (another broker's, old), or fenced:
        started under a leader epoch below ``leader_epoch`` (ours), so the metadata would refuse their
        COPY_SEGMENT_FINISHED once we start a copy (objects a zombie still writes after this are GC's)."""
        now_ms = int(time.time() * 1000)
        n = 0
        self._unfinished_waiting = 0
        segments = self.rlmm.list_remote_log_segments(self.tp)
        touched = False  # a deletion was tried: the listing is stale
        for md in segments:
            if md.state != RemoteLogSegmentState.COPY_SEGMENT_STARTED:
                deleting = md.state == RemoteLogSegmentState.DELETE_SEGMENT_STARTED
                touched |= deleting
                if deleting and self._delete_left(md, "unfinished-delete"):
                    n += 1
                continue
            if in_flight and md.remote_log_segment_id.id in in_flight:
                continue
            fenced = leader_epoch is not None and md.broker_leader_epoch is not None \
                and md.broker_leader_epoch < leader_epoch
            if md.broker_id != self.broker_id and not fenced and now_ms - md.event_timestamp_ms < ABANDONED_COPY_MS:
                self._unfinished_waiting += 1
                continue
            touched = True
            if self._delete_left(md, "unfinished-copy"):
                n += 1
        # the run's resume point is computed from the same listing when nothing changed it (one listing of the
        # partition's metadata per run, not two: each decodes every segment of the partition, issue 26)
        self._listing = None if touched else segments
        return n

    def _delete_left(self, md: RemoteLogSegmentMetadata, reason: str) -> bool:
        """Delete a segment left behind; False when someone else deleted it first (another sidecar's clean-up of the
        same copy, the copier that made it): normal in a cluster, said at INFO."""
        try:
            self.deleter.delete(md, reason)
            return True
        except (UnknownSegmentError, InvalidStateTransitionError) as err:
            log.info("clean-up: segment deleted by someone else already", extra={
                "segment": str(md.remote_log_segment_id), "reason": reason, "error": str(err)})
            return False

    # ----------------------------------------------------------------------------------------------- copy
    def run_once(self, last_stable_offset: int, stop: threading.Event | None = None, *,
                 leader_epoch: int | None = None,
                 current_leader_epoch: Callable[[], int | None] | None = None,
                 epochs: list[EpochEntry] | None = None) -> CopyResult:
        """One copy run. ``leader_epoch``: the partition's leader epoch this broker leads under (each copy carries
        it); ``current_leader_epoch``: asked before each COPY_SEGMENT_FINISHED, a different answer fences the copy.
        ``epochs``: the partition's leader-epoch checkpoint as the caller just read it to check ``leader_epoch``
        against it (None: read here). ``stop`` set (leadership lost) before the run starts: it does nothing, neither
        clean-up nor staging nor a gap report (a follower's local log start says nothing of what the leader tiered).
        """
        result = CopyResult()
        if stop is not None and stop.is_set():
            return result
        result.cleaned_up = self.clean_up_unfinished(leader_epoch=leader_epoch)
        if epochs is None:
            epochs = self._pdir.leader_epochs()
        highest = self.resume_point(epochs, self._listing)
        self._listing = None
        # one listing of the partition dir for the run, made after the caller asked for the last stable offset (so
        # it names every .txnindex holding an abort below it: aborted_txns)
        self._run_names = set(os.listdir(self.partition_dir))
        try:
            staged, result.gaps = self.stage_new(highest, stop, self._run_names,
                                                 defer=self.defer_staging_s is not None)
            self._highest = highest
            sizes = [_size(s.log_path) for s in staged]  # (a staged segment's paths are built anew on each look)
            self._set_lag(staged, sizes)
            self._run_staged = [s for s in staged if isinstance(s, StagedSegment)]
            self._copy_staged(result, staged, sizes, epochs, highest, last_stable_offset, stop, leader_epoch,
                              current_leader_epoch)
        finally:
            self._run_staged = None
            self._run_names = None
        self.write_watermark()
        self._set_lag(staged, sizes)  # what this run copied is no longer lag (a caught-up copier sleeps on it)
        if self._deferred:  # what this run copied waits no more (the stage job would look at it once again)
            with self._deferred_lock:
                for base in [b for b, (e, _t) in self._deferred.items() if e <= self.tiered_offset]:
                    del self._deferred[base]
        metrics.COPY_RUN_SEGMENTS.observe(len(result.copied))
        return result

    def _copy_staged(self, result: CopyResult, staged: list[StagedSegment | LocalRange], sizes: list[int],
                     epochs: list[EpochEntry], highest: int, last_stable_offset: int, stop: threading.Event | None,
                     leader_epoch: int | None, current_leader_epoch: Callable[[], int | None] | None) -> None:
        """The copies of :meth:`run_once`: ``staged`` from ``highest`` + 1 on, in batches (``sizes``: their
        ``.log`` bytes, in their order, as :meth:`run_once` read them). A segment left in place is opened when its
        turn comes and closed once its batch is over (:mod:`rlm.tasks.in_place`); one that cannot be opened so is
        staged then, and where that fails too (the broker deleted it) the run ends before it: the next run's staging
        reports the gap."""
        batch: list[tuple[Copied, RemoteLogSegmentMetadata, Callable[[], bytes | None]]] = []
        opened: list[InPlaceSegment] = []
        planned = highest  # the end of the batch's last segment: where the next one starts
        try:
            for x, size in zip(staged, sizes, strict=True):
                if stop is not None and stop.is_set():
                    batch = []  # not started: nothing written for it yet
                    break
                if x.end_offset_inclusive <= planned:
                    # Remote already, by a copy earlier in this run: the same offsets staged twice (a replica moved
                    # between log dirs leaves them staged from the old dir and from the new one).
                    if not batch and isinstance(x, StagedSegment):
                        self.staging.release(x)
                    continue  # (one staged twice beside a pending batch: released by the next run, once remote)
                if x.end_offset_inclusive >= last_stable_offset:
                    result.waiting_for_lso += 1
                    continue  # this and every later segment wait for the LSO to move past them
                s = self._open(x)
                if s is None:
                    break  # (the batch before it is committed below)
                if isinstance(s, InPlaceSegment):
                    opened.append(s)
                try:
                    prepared = self._prepare(s, max(s.base_offset, planned + 1), epochs, leader_epoch,
                                             size or None)
                except REFUSED as err:
                    # the batch before it copied first: the partition is held at this segment, not before it
                    if batch and not self._commit_batch(batch, result, leader_epoch, current_leader_epoch, stop):
                        batch = []
                        break
                    batch = []
                    self.refused(err, s.base_offset, s.log_path, max(s.base_offset, planned + 1))
                    raise
                if prepared is None:
                    # Nothing worth copying (expired already); not a gap. Tiered only once the batch before it is.
                    if batch and not self._commit_batch(batch, result, leader_epoch, current_leader_epoch, stop):
                        break
                    batch = []
                    self._done_with(s)
                    highest = planned = s.end_offset_inclusive
                    self.tiered(highest, checkpoint_epoch_at(epochs, highest), recorded=False)
                    continue
                batch.append((s, *prepared))
                planned = s.end_offset_inclusive
                if len(batch) >= COPY_BATCH_SEGMENTS or \
                        sum(md.segment_size_bytes for _s, md, _c in batch) >= COPY_BATCH_BYTES:
                    if not self._commit_batch(batch, result, leader_epoch, current_leader_epoch, stop):
                        batch = []
                        break
                    batch = []
            if batch:
                self._commit_batch(batch, result, leader_epoch, current_leader_epoch, stop)
        finally:
            for s in opened:
                s.close()

    def _open(self, x: StagedSegment | LocalRange) -> Copied | None:
        """``x`` as its copy reads it: a staged segment as is; one left in place opened (:mod:`rlm.tasks.in_place`),
        or, when it cannot be opened so, staged now; None when it cannot be staged either (deleted by the broker, the
        topic re-created, staging full): not copied in this run, whose next staging says why."""
        if isinstance(x, StagedSegment):
            return x
        names = self._run_names if self._run_names is not None else set(os.listdir(self.partition_dir))
        opened = InPlaceSegment.open(x, names)
        if opened is not None:
            return opened
        done = self.staging.stage_many(self.tp, self.partition_dir, [(x.base_offset, x.end_offset_inclusive)])
        if not done.staged:
            log.info("segment left in place could not be opened or staged: not copied in this run", extra={
                "partition": str(self.tp), "base_offset": x.base_offset, "end_offset": x.end_offset_inclusive,
                "gone": bool(done.gone), "error": str(done.error) if done.error is not None else None})
            return None
        if self._run_staged is not None:
            self._run_staged.append(done.staged[0])
        return done.staged[0]

    def _done_with(self, s: Copied) -> None:
        """``s`` is copied (or passed over): its staging released, or its files closed."""
        if isinstance(s, StagedSegment):
            self.staging.release(s)
        else:
            s.close()

    def _set_lag(self, staged: Sequence[StagedSegment], sizes: Sequence[int]) -> None:
        """The lag gauges: the staged segments above the highest offset tiered (``sizes``: their ``.log`` bytes).
        Set at a run's start and again at its end, so that a copier that caught up and sleeps until its directory
        changes shows 0, not the count its last run started with."""
        highest = self._highest if self._highest is not None else -1
        left = [size for s, size in zip(staged, sizes, strict=True) if s.end_offset_inclusive > highest]
        metrics.COPY_LAG_SEGMENTS.labels(self.tp.topic, str(self.tp.partition)).set(len(left))
        metrics.COPY_LAG_BYTES.labels(self.tp.topic, str(self.tp.partition)).set(sum(left))

    def _commit_batch(self, batch: Sequence[tuple[Copied, RemoteLogSegmentMetadata, Callable[[], bytes | None]]],
                      result: CopyResult, leader_epoch: int | None,
                      current_leader_epoch: Callable[[], int | None] | None, stop: threading.Event | None) -> bool:
        """Copy one batch of :meth:`run_once` (:meth:`commit_copies`); what was copied is tiered and its staging
        released. False when the run stops here (fenced, cancelled, stopped); any other failure raises, after the
        segments before it are tiered."""
        try:
            finished, err = self.commit_copies([(md, copy) for _s, md, copy in batch], leader_epoch=leader_epoch,
                                               current_leader_epoch=current_leader_epoch, stop=stop)
        finally:
            for s, _md, _copy in batch:
                if isinstance(s, InPlaceSegment):
                    s.close()  # (its copy is over, made or not)
        for (s, _md, _copy), md in zip(batch, finished, strict=False):
            result.copied.append(md)
            self.tiered(md.end_offset_inclusive, md.epoch_at(md.end_offset_inclusive))
            self._done_with(s)
        if err is None:
            return len(finished) == len(batch)  # less: stopped (leadership lost), the rest removed
        if isinstance(err, CopyFencedError):
            metrics.ERRORS.labels("copy-fenced").inc()
            log.warning("copy fenced: the partition's leader epoch moved on; copy deleted", extra={
                "partition": str(self.tp), "base_offset": batch[len(finished)][0].base_offset, "error": str(err)})
            result.fenced = True
            return False
        if isinstance(err, CopyCancelledError):
            result.cancelled = True
            return False
        if isinstance(err, REFUSED):
            s, md, _copy = batch[len(finished)]
            self.refused(err, s.base_offset, s.log_path, md.start_offset)
        raise err

    def refused(self, err: EpochMismatchError | BatchEpochError, base_offset: int, log_path: Path | str,
                start_offset: int) -> None:
        """A copy from ``start_offset`` of the segment of ``base_offset``, read at ``log_path`` (staged, held open, or
        the broker's), refused for its batches' leader epochs: the partition's copying is held there
        (``rlm_copy_held``, with the reason; ``rlm_copy_refusals``), logged with the segment's file in the partition
        dir, the file read, the offsets and the reason, until a copy from there succeeds (:meth:`tiered`) or the
        partition is no longer led (:func:`forget_held`)."""
        reason = "epoch-mismatch" if isinstance(err, EpochMismatchError) else err.reason
        labels = (self.tp.topic, str(self.tp.partition))
        metrics.COPY_REFUSALS.labels(self.tp.topic, reason).inc()
        if self._held is not None and self._held[0] != reason:
            _remove_held(labels, self._held[0])
        metrics.COPY_HELD.labels(*labels, reason).set(1)
        self._held = (reason, start_offset)
        log.error("copy refused: the batches' leader epochs; the partition's copying is held at this segment", extra={
            "partition": str(self.tp), "segment": str(self.partition_dir / segment_file_name(base_offset, ".log")),
            "file": str(log_path), "start_offset": start_offset,
            "offset": err.offset, "position": getattr(err, "position", None), "reason": reason, "error": str(err)})

    @property
    def held(self) -> tuple[str, int] | None:
        """(reason, start offset) of the refused copy the partition's copying is held at; None when it is not."""
        return self._held

    def caught_up(self) -> bool:
        """Nothing left for a later run unless the partition directory changes: a run has happened, every rolled local
        segment is tiered (up to the last run's resume point), nothing is staged, and no other broker's young copy
        waits for the clean-up to judge it abandoned. The sidecar lets the copy job sleep then, until the log-dir
        watcher sees the directory change (:mod:`rlm.watch`). One listing of the partition directory."""
        highest = self._highest
        if highest is None or self._unfinished_waiting or self.staging.staged(self.tp):
            return False
        return all(end <= highest for _base, end in self._pdir.rolled_ranges())

    def resume_point(self, epochs: list[EpochEntry], segments: list[RemoteLogSegmentMetadata] | None = None) -> int:
        """The highest offset tiered along this broker's lineage (-1: none): copying resumes right after it.
        ``segments``: the partition's metadata as just listed (None: listed here)."""
        highest, lineage = highest_remote_offset(self.rlmm, self.tp, epochs, segments)
        if self._watermark is not None:
            # The metadata counts only live segments: remote retention deleted what we copied (all of it, or the
            # newest). Those offsets were tiered once; copying the still-local segments again would only feed
            # retention again. Bounded by this lineage: offsets a diverged lineage tiered are tiered again.
            highest = max(highest, lineage.bound(*self._watermark))
        return highest

    def tiered(self, end_offset_inclusive: int, epoch: int | None, *, recorded: bool = True) -> None:
        """Record that offsets up to ``end_offset_inclusive`` (last leader epoch ``epoch``) are tiered; persisted
        by :meth:`write_watermark`. ``recorded``: the metadata holds them (COPY_SEGMENT_FINISHED, written before
        this is called); False for offsets passed over without a copy (older than remote retention), which only the
        watermark knows: its next write is then fsynced."""
        self._highest = end_offset_inclusive
        self._watermark = (end_offset_inclusive, epoch)
        self._watermark_unrecorded |= not recorded
        if self._held is not None and end_offset_inclusive >= self._held[1]:
            _remove_held((self.tp.topic, str(self.tp.partition)), self._held[0])
            log.info("copy no longer held: the segment it was held at is tiered", extra={
                "partition": str(self.tp), "start_offset": self._held[1], "reason": self._held[0]})
            self._held = None

    # ------------------------------------------------------------------------------------------ watermark
    def _read_watermark(self) -> tuple[int, int | None] | None:
        """``<offset> <leader epoch or -> <CRC-32 of the two, 8 hex digits>`` (:meth:`write_watermark`); older
        sidecars wrote ``<offset> <leader epoch>`` or ``<offset>`` alone (its epoch unknown) by replacing the file.
        Unreadable (a torn overwrite fails its CRC): ignored, with a warning."""
        if self.watermark_path is None:
            return None
        try:
            parts = self.watermark_path.read_text().split()
            if len(parts) == 3:
                if f"{zlib.crc32(f'{parts[0]} {parts[1]}'.encode()):08x}" != parts[2]:
                    raise ValueError("CRC mismatch: a torn overwrite")
                return int(parts[0]), (None if parts[1] == "-" else int(parts[1]))
            if len(parts) not in (1, 2):
                raise ValueError(f"expected '<offset> <epoch> <crc>', found {len(parts)} fields")
            return int(parts[0]), (int(parts[1]) if len(parts) == 2 else None)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as err:
            log.warning("copy watermark unreadable: ignored", extra={
                "partition": str(self.tp), "path": str(self.watermark_path), "error": str(err)})
            return None

    def write_watermark(self) -> None:
        """Persist the highest tiered offset and its epoch when they moved.

        Every write puts its one record in place, at offset 0 and the same length: the first one makes the file
        there (no temp file, no rename), later ones overwrite it: no new inode, no rename, no directory fsync per
        copy run (issue 26: a burst of 6,000 segments made as many runs). The record is 64 bytes at offset 0, inside
        one disk sector, so a crash leaves the old record or the new one; should an overwrite tear all the same, its
        CRC fails and the watermark is ignored as unreadable.

        A write is fsynced only when the watermark passed over offsets that no metadata records (segments older than
        remote retention, not copied: :meth:`tiered` with ``recorded=False``), and the first such write of the process
        fsyncs the file's directory too (its name durable, however it was made). Otherwise every offset it names is
        COPY_SEGMENT_FINISHED in the metadata, written (and acknowledged) before :meth:`tiered` was told, so the
        metadata is the durable record and the watermark a copy of it, kept for the day remote retention has deleted
        those segments (the metadata then no longer names them: :meth:`resume_point`). Left to the page cache's
        writeback (seconds), what a power cut can lose is that copy: the file then holds an older record, or a torn one,
        or, for the first write, is missing or empty (its name or its bytes not written back yet), each ignored
        (:meth:`_read_watermark`), never one ahead of what the metadata made durable, and the worst it costs is copying
        again the local segments that remote retention expired in those seconds, as when the state dir is lost. One
        fsync per copy run saved (issue 26: 2,000 partitions rolling at once, a run copies one or two segments), and a
        partition's first run two fsyncs and a rename (issue 26: the cold burst makes 2,000 watermark files)."""
        if self.watermark_path is None or self._watermark is None or self._watermark == self._persisted:
            return
        offset, epoch = self._watermark
        text = f"{offset} {epoch if epoch is not None else '-'}"
        record = f"{text} {zlib.crc32(text.encode()):08x}".ljust(_WATERMARK_BYTES - 1).encode() + b"\n"
        try:
            fd = os.open(self.watermark_path, os.O_WRONLY | os.O_CREAT, 0o644)
        except FileNotFoundError:  # its directory is new
            self.watermark_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.watermark_path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, record, 0)
            if self._watermark_unrecorded:
                os.fsync(fd)
                if not self._watermark_named:  # (made in place, or by an earlier process: its name durable too)
                    fsync_dir(self.watermark_path.parent)
                    self._watermark_named = True
        finally:
            os.close(fd)
        self._persisted = self._watermark
        self._watermark_unrecorded = False

    @staticmethod
    def _max_timestamp(base_offset: int, log_path: Path, time_index_path: Path) -> int:
        """The segment's largest timestamp: the last time-index entry (Kafka appends one at roll), else a scan."""
        try:
            entries = read_time_index(time_index_path, base_offset)
            if entries:
                return entries[-1].timestamp_ms
        except (FileNotFoundError, LogFormatError):
            pass
        return max((b.max_timestamp for b in scan_batches(log_path)), default=-1)

    def copy_segment(self, s: Copied, start_offset: int, epochs: list[EpochEntry], *,
                     leader_epoch: int | None = None,
                     current_leader_epoch: Callable[[], int | None] | None = None,
                     ) -> RemoteLogSegmentMetadata | None:
        """Copy ``s`` from ``start_offset`` on; None when it is older than remote retention. Raises
        :class:`CopyFencedError` (after deleting the copy) when the leader epoch moved on meanwhile."""
        prepared = self._prepare(s, start_offset, epochs, leader_epoch)
        if prepared is None:
            return None
        return self.commit_copy(*prepared, leader_epoch=leader_epoch, current_leader_epoch=current_leader_epoch)

    def _prepare(self, s: Copied, start_offset: int, epochs: list[EpochEntry], leader_epoch: int | None,
                 log_bytes: int | None = None,
                 ) -> tuple[RemoteLogSegmentMetadata, Callable[[], bytes | None]] | None:
        """The COPY_SEGMENT_STARTED metadata of ``s`` from ``start_offset`` on and its store copy (not run yet);
        None when it is older than remote retention. ``log_bytes``: the staged ``.log``'s size when known (a staged
        segment is immutable)."""
        log_path = s.log_path  # (built on each look: once here)
        time_index_path = s.path(".timeindex")
        max_ts = self._max_timestamp(s.base_offset, log_path, time_index_path)
        if self.min_max_timestamp_ms is not None and 0 <= max_ts < self.min_max_timestamp_ms:
            log.info("segment older than remote retention: not copied", extra={
                "partition": str(self.tp), "base_offset": s.base_offset, "max_timestamp_ms": max_ts})
            return None
        # The batches' epochs: the checkpoint's where it covers the segment (the store's copy checks them), else
        # a walk of its batches here (rlm.tasks.segment_epochs)
        seg_epochs = copy_epochs(epochs, start_offset, s.end_offset_inclusive,
                                 lambda: scan_batches(log_path, verify_crc=False), str(log_path),
                                 copy_checks=self.copy_checks_epochs)
        now_ms = int(time.time() * 1000)
        txn_index = self._aborted_index(s, start_offset)
        md = RemoteLogSegmentMetadata(
            remote_log_segment_id=RemoteLogSegmentId.generate(self.tp),
            start_offset=start_offset,
            end_offset_inclusive=s.end_offset_inclusive,
            max_timestamp_ms=max_ts,
            broker_id=self.broker_id,
            event_timestamp_ms=now_ms,
            # A straddling segment is copied from start_offset on: the storage manager skips the batches below.
            segment_size_bytes=kept_range(log_path, start_offset).size_bytes if start_offset > s.base_offset
            else log_bytes if log_bytes is not None else log_path.stat().st_size,
            segment_leader_epochs=epoch_pairs(seg_epochs),
            state=RemoteLogSegmentState.COPY_SEGMENT_STARTED,
            txn_index_empty=txn_index is None,
            broker_leader_epoch=leader_epoch,
        )
        # The checkpoint as Kafka hands it to the storage manager: the epochs up to the segment's end.
        checkpoint = format_leader_epoch_checkpoint([e for e in epochs if e.start_offset <= s.end_offset_inclusive])
        data = LogSegmentData(
            log_path=log_path,
            offset_index_path=s.path(".index"),
            time_index_path=time_index_path,
            transaction_index_path=txn_index,
            producer_snapshot_path=s.file(".snapshot"),
            leader_epoch_checkpoint=checkpoint,
        )
        return md, lambda: self.rsm.copy_log_segment_data(to_rsm(md), data, cancel=self.cancel, **self.copy_options,
                                                          **self.epoch_options)

    def commit_copy(self, md: RemoteLogSegmentMetadata, copy: Callable[[], bytes | None], *,
                    leader_epoch: int | None, current_leader_epoch: Callable[[], int | None] | None,
                    ) -> RemoteLogSegmentMetadata:
        """COPY_SEGMENT_STARTED, ``copy()`` (the store's copy; returns custom metadata), the fencing check,
        COPY_SEGMENT_FINISHED (:meth:`commit_copies` of one copy). Anything failing removes the copy (never left
        STARTED behind us) and raises; :class:`CopyFencedError` when the leader epoch moved on,
        :class:`~rsm.errors.CopyCancelledError` when :attr:`cancel` stopped the store's copy. Returns the FINISHED
        metadata."""
        finished, err = self.commit_copies([(md, copy)], leader_epoch=leader_epoch,
                                           current_leader_epoch=current_leader_epoch)
        if err is not None:
            raise err
        return finished[0]

    def commit_copies(self, copies: Sequence[tuple[RemoteLogSegmentMetadata, Callable[[], bytes | None]]], *,
                      leader_epoch: int | None, current_leader_epoch: Callable[[], int | None] | None,
                      stop: threading.Event | None = None,
                      ) -> tuple[list[RemoteLogSegmentMetadata], Exception | None]:
        """Copy a batch, in order: COPY_SEGMENT_STARTED of every copy in one metadata write, each ``copy()`` (the
        store's copy, with :attr:`copy_options`; returns custom metadata) one after the other, the copies made
        durable together (``make_durable``, when :attr:`copy_options` deferred it), one fencing check
        (``current_leader_epoch()`` must still answer ``leader_epoch``), COPY_SEGMENT_FINISHED of the copies made in
        one metadata write.

        Returns the FINISHED metadata of a prefix of the batch, and None or the first failure: the metadata's
        refusal of a STARTED or FINISHED record, the store's copy failing (:class:`~rsm.errors.CopyCancelledError`
        when :attr:`cancel` stopped it), :class:`CopyFencedError` when the leader epoch moved on. The copies before
        the failing one are finished when they can be; the failing one and every later one are removed (never
        left STARTED behind us; a FINISHED one after a refused one too, so the remote chain has no hole). ``stop``
        set (leadership lost) before a copy: no more copies, the rest removed, no failure."""
        if not copies or (stop is not None and stop.is_set()):
            return [], None
        mds = [md for md, _copy in copies]
        refusals = self.rlmm.write_segment_metadata_many(mds)
        error: Exception | None = next((e for e in refusals if e is not None), None)
        copied: list[RemoteLogSegmentMetadata] = []
        elapsed: list[float] = []
        copy_failed = False  # the copy after the last of ``copied`` failed (and is removed)
        for (md, copy), refusal in zip(copies, refusals, strict=True):
            if refusal is not None or (stop is not None and stop.is_set()):
                break
            started = time.monotonic()
            try:
                custom = copy()
            except CopyCancelledError as err:
                log.info("copy cancelled: the partition is no longer led here; the attempt is removed", extra={
                    "partition": str(self.tp), "start_offset": md.start_offset,
                    "segment": str(md.remote_log_segment_id)})
                error, copy_failed = err, True
                self._remove(md, "cancelled-copy")
                break
            except Exception as err:  # noqa: BLE001 - returned: the caller raises it
                if not isinstance(err, REFUSED):  # (counted and logged as a refusal: not the store's failure)
                    metrics.ERRORS.labels("copy").inc()
                log.error("copy failed; removing the attempt", extra={
                    "partition": str(self.tp), "start_offset": md.start_offset,
                    "segment": str(md.remote_log_segment_id), "error": str(err)})
                error, copy_failed = err, True
                self._remove(md, "failed-copy")
                break
            elapsed.append(time.monotonic() - started)
            copied.append(replace(md, custom_metadata=custom))
        tried = len(copied) + (1 if copy_failed else 0)
        if copied and self.copy_options:
            try:  # the batch's copies durable before any of them is FINISHED
                self.rsm.make_durable([to_rsm(md) for md in copied])  # type: ignore[attr-defined]
            except Exception as err:  # noqa: BLE001 - returned: the caller raises it
                metrics.ERRORS.labels("copy").inc()
                log.error("copies could not be made durable; removing them", extra={
                    "partition": str(self.tp), "start_offset": copied[0].start_offset, "error": str(err)})
                for md in copied:
                    self._remove(md, "failed-copy")
                error, copied = err, []  # (about the first segment copied: before any later failure)
        finished, finish_error = self._finish(copied, leader_epoch, current_leader_epoch)
        if finish_error is not None:
            error = finish_error  # about a segment before any later failure
            for md in copied[len(finished):]:  # copied, not recorded FINISHED
                self._remove(md, "fenced-copy" if isinstance(error, CopyFencedError) else "failed-copy")
        for md, refusal in zip(mds[tried:], refusals[tried:], strict=True):
            if refusal is None:  # STARTED written, never copied: nothing stored to delete but the record
                self._remove(md, "unfinished-copy")
        for md, seconds in zip(finished, elapsed, strict=False):
            metrics.COPY_SECONDS.observe(seconds)
            metrics.BYTES_COPIED.labels(self.tp.topic).inc(md.segment_size_bytes)
            metrics.SEGMENTS_COPIED.labels(self.tp.topic).inc()
            log.info("segment copied", extra={
                "partition": str(self.tp), "start_offset": md.start_offset, "end_offset": md.end_offset_inclusive,
                "bytes": md.segment_size_bytes, "seconds": round(seconds, 3), "segment": str(md.remote_log_segment_id)})
        return finished, error

    def _finish(self, copied: list[RemoteLogSegmentMetadata], leader_epoch: int | None,
                current_leader_epoch: Callable[[], int | None] | None,
                ) -> tuple[list[RemoteLogSegmentMetadata], Exception | None]:
        """The fencing check, then COPY_SEGMENT_FINISHED of ``copied`` in one write: the FINISHED metadata of all of
        them, or of the prefix before the first one refused and the failure (none finished: the check failed)."""
        if not copied:
            return [], None
        try:
            now_epoch = current_leader_epoch() if current_leader_epoch is not None else leader_epoch
            if now_epoch != leader_epoch:
                raise CopyFencedError(f"{copied[0].remote_log_segment_id}: started under leader epoch {leader_epoch}, "
                                      f"the partition's leader epoch is now {now_epoch} (None: not led by this broker)")
            now_ms = int(time.time() * 1000)
            refusals = self.rlmm.write_segment_metadata_many([RemoteLogSegmentMetadataUpdate(
                md.remote_log_segment_id, now_ms, md.custom_metadata, RemoteLogSegmentState.COPY_SEGMENT_FINISHED,
                self.broker_id) for md in copied])
        except Exception as err:  # noqa: BLE001 - returned: the caller removes the copies and raises it
            return [], err
        done = [replace(md, state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED) for md in copied]
        refused = next((i for i, e in enumerate(refusals) if e is not None), None)
        return (done, None) if refused is None else (done[:refused], refusals[refused])

    def _aborted_index(self, s: Copied, start_offset: int) -> Path | None:
        """The transaction index to upload with ``s`` (see the module docstring), written next to its staged
        files (or held with its open ones); None when no aborted transaction has records in it."""
        found = self.aborted_txns(s.base_offset, start_offset, s.end_offset_inclusive, own=s.file(".txnindex"))
        if not found:
            return None
        return s.write_txn_upload(format_txn_index(found))

    def aborted_txns(self, base_offset: int, start_offset: int, end_offset_inclusive: int, *,
                     own: Path | None = None) -> list[AbortedTxn]:
        """The aborted transactions with records in ``[start_offset, end_offset_inclusive]``, by marker offset:
        from ``own`` (the ``.txnindex`` of the segment of ``base_offset``) and the ``.txnindex`` of every later
        segment, local or staged (the active one is read up to its last whole entry). Every marker is there once
        the range is below the last stable offset."""
        sources = [own] if own is not None else []
        # the partition dir's .txnindex files by name: in a run, from its listing (made after the last stable offset
        # was asked, so every marker below it, and its .txnindex entry, was written by then); else listed here
        names = self._run_names if self._run_names is not None else os.listdir(self.partition_dir)
        sources += [self.partition_dir / name for name in sorted(names)
                    if (m := _TXN_INDEX_NAME.fullmatch(name)) is not None and int(m.group(1)) > base_offset]
        # the run's staged segments when in a run (a segment staged since is still local: retention deletes the
        # oldest first, and this one is older), else staging's listing (which reads every marker)
        staged = self._run_staged if self._run_staged is not None else self.staging.staged(self.tp)
        sources += [p for t in staged if t.base_offset > base_offset and (p := t.file(".txnindex")) is not None]
        found: dict[tuple[int, int, int], AbortedTxn] = {}
        for path in sources:
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                try:  # renamed by retention since the listing (a later segment left in place: rlm.tasks.in_place)
                    data = Path(f"{path}{DELETED_SUFFIX}").read_bytes()
                except FileNotFoundError:
                    continue  # deleted meanwhile (it is staged then, or it was above the segment's transactions)
            whole = len(data) - len(data) % TXN_ENTRY.size  # the broker may be appending an entry right now
            for t in parse_txn_index(data[:whole], path):
                if t.first_offset <= end_offset_inclusive and t.last_offset >= start_offset:
                    found[(t.producer_id, t.first_offset, t.last_offset)] = t
        return sorted(found.values(), key=lambda t: (t.last_offset, t.first_offset))

    def _remove(self, md: RemoteLogSegmentMetadata, reason: str) -> None:
        """Remove this copier's failed, fenced or cancelled copy (deleted already by the new leader's clean-up or a
        purge: fine); a failure is logged, and the next run's clean-up retries it."""
        try:
            self._delete_left(md, reason)
        except Exception as cleanup_err:  # noqa: BLE001 - the next run's clean-up retries it
            log.error("clean-up of a copy failed", extra={"segment": str(md.remote_log_segment_id),
                                                          "reason": reason, "error": str(cleanup_err)})




def _remove_held(labels: tuple[str, str], reason: str) -> None:
    try:
        metrics.COPY_HELD.remove(*labels, reason)
    except KeyError:
        pass  # (dropped by forget_held meanwhile)


def forget_held(tp: TopicIdPartition) -> None:
    """Drop ``rlm_copy_held`` of a partition no longer led (its new leader's sidecar reports it), whatever the
    reason."""
    for reason in ("epoch-mismatch", *BATCH_EPOCH_REASONS):
        _remove_held((tp.topic, str(tp.partition)), reason)
