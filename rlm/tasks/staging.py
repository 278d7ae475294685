"""Hard-link staging: keep a rolled segment's bytes alive until it is copied.

The broker's local retention may delete a rolled segment at any moment (it renames the files to
``*.deleted`` and unlinks them about a minute later). As soon as the sidecar sees a rolled segment it
hard-links the segment's files into a staging directory on the same filesystem: the broker's unlink then only
drops its own name, the inode lives on under ours until the copy is done and :meth:`Staging.release` runs.

Layout, per log dir::

    <staging root>/<topic id>/<topic>-<partition>/<20-digit base offset>/
        00000000000000000042.log  .index  .timeindex  .txnindex      links named as the originals
        00000000000000000100.snapshot                                 producer state at end offset + 1 (below)
        .complete-99                                                  the marker: the end offset (inclusive) in its
                                                                      name, made last (a link of the staged .log)

Staging is keyed by **topic id** (``<topic id>`` is ``str(uuid)``, e.g. ``8c1f...-...``): a topic deleted and
re-created under the same name has a new id, so it can never be served the old one's staged bytes. A staged dir is
reused only if it is the **same segment**: same base offset, same end offset (its ``.complete`` marker), and, while
the broker still has ``<base>.log`` (or ``<base>.log.deleted``), the same inode as our link. Anything else (another
end after a truncation and regrowth, another file, a missing, empty or unreadable marker) is replaced. Directories
of the older layout ``<staging root>/<topic>-<partition>/`` cannot be attributed to a topic id: they are removed at
start, with a warning (their segments are staged again from the log dir if the broker still has them). A canonical
``str(uuid)`` can never be an old-layout name: its last group has 12 digits, more than any partition number.

**Producer snapshot.** Kafka's RemoteLogManager uploads ``producerStateManager.fetchSnapshot(nextSegmentBaseOffset)``:
the snapshot named by the next segment's base offset, ``<end offset + 1>.snapshot``, which is the producer state at
the end of the segment (``<base>.snapshot`` is the state *before* it). That file is linked, under its own name;
:attr:`StagedSegment.producer_snapshot_path` (and ``file(".snapshot")``) finds it.

**Size bound.** With ``max_bytes`` > 0, a log dir's staging area holding bytes already refuses a segment that would
take it past ``max_bytes`` with :class:`StagingFullError` (nothing is staged; an empty area takes one segment of any
size, so a segment larger than the bound still gets copied). What is staged is copied first; a segment the broker
deletes meanwhile is a gap the copier reports.

**Durability.** Links are made, the directory fsynced, then the marker made and the directory fsynced again; new
directories are fsynced into their parents. After a crash a segment dir is either complete or has no marker (and is
removed and staged again). The marker is ``.complete-<end offset>``, a hard link of the staged ``.log``: its name is
its content, so it needs no data written and fsynced, and a link makes no inode (on this project's ext4, making an
inode is the dearest system call of the copy path; the marker was a temp file written, fsynced and renamed over
``.complete``: an inode and an fsync more per segment, issue 26). A dir of an older sidecar, marked by a
``.complete`` file holding the end offset, is read as before; a dir with two markers is incomplete.

Releasing a segment removes its dir only: the partition's dir stays for its next segment (made again per segment, it
cost a mkdir and a parent fsync each time: issue 26) until :meth:`Staging.release_partition`.

The staging root must not be inside a Kafka log dir (the broker refuses unknown directories there) and must be
on the same filesystem as the log dir (hard links cannot cross filesystems): :func:`default_staging_root` picks a
sibling of the log dir and :class:`Staging` checks the device at start.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from rlm.errors import RlmError
from rlm.state import fsync_dir, write_file_durably
from rlmm.api import TopicIdPartition
from rsm.log.batch import scan_batches
from rsm.log.checkpoint import read_partition_metadata
from rsm.log.errors import CorruptCheckpointError
from rsm.log.indexes import KafkaIndexBuilder
from rsm.log.partition import (
    DELETED_SUFFIX,
    SEGMENT_SUFFIXES,
    SNAPSHOT_SUFFIX,
    Segment,
    parse_partition_dir_name,
    parse_segment_stem,
    partition_dir_name,
    segment_file_name,
)

__all__ = ["SegmentGoneError", "StagedSegment", "Staging", "StagingError", "StagingFullError",
           "TopicIdMismatchError", "default_staging_root"]

log = logging.getLogger(__name__)

# File naming is the broker's (:mod:`rsm.log.partition`): a segment's own files are linked in the order of
# SEGMENT_SUFFIXES, ``.log`` first (without it nothing is staged); the producer snapshot is named by the next
# segment's base offset (see the module doc). A staged segment's dir is named by the bare 20-digit stem.
COMPLETE = ".complete"
_END_OFFSET = re.compile(r"\d+")


class StagingError(RlmError, RuntimeError):
    """The staging area is unusable (wrong filesystem, permissions); the message names the directories."""


class SegmentGoneError(StagingError):
    """The broker deleted the segment's ``.log`` before it could be staged: a gap the caller must count and log."""


class StagingFullError(StagingError):
    """Staging the segment would take its log dir's staging area past ``max_bytes``: nothing was staged."""

    def __init__(self, message: str, held_bytes: int, segment_bytes: int, max_bytes: int) -> None:
        super().__init__(message)
        self.held_bytes = held_bytes
        self.segment_bytes = segment_bytes
        self.max_bytes = max_bytes


class TopicIdMismatchError(StagingError):
    """The partition dir's ``partition.metadata`` names another topic id: the topic was deleted and re-created."""


@dataclass(frozen=True, slots=True)
class StagedSegment:
    tp: TopicIdPartition
    base_offset: int
    end_offset_inclusive: int  # the next segment's base offset - 1, known when it was staged (rolled)
    directory: Path

    @property
    def topic(self) -> str:
        return self.tp.topic

    @property
    def partition(self) -> int:
        return self.tp.partition

    @property
    def segment(self) -> Segment:
        """The staged files as a :class:`~rsm.log.partition.Segment` (rolled; its ``snapshot_path`` is
        ``<base>.snapshot``, which staging does not link: the producer snapshot is :attr:`producer_snapshot_path`)."""
        return Segment.in_dir(self.directory, self.base_offset)

    @property
    def log_path(self) -> Path:
        return self.directory / segment_file_name(self.base_offset, ".log")

    @property
    def producer_snapshot_path(self) -> Path | None:
        """``<end offset + 1>.snapshot``: the producer state at the segment's end (what Kafka uploads), or None."""
        p = self.directory / _producer_snapshot_name(self.end_offset_inclusive)
        return p if p.exists() else None

    def file(self, suffix: str) -> Path | None:
        """The staged file with this suffix (``.log``, ``.index`` ...), or None if the segment had none.

        ``.snapshot`` is :attr:`producer_snapshot_path` (named by the next segment's base offset)."""
        if suffix == SNAPSHOT_SUFFIX:
            return self.producer_snapshot_path
        p = self.directory / segment_file_name(self.base_offset, suffix)
        return p if p.exists() else None


def _producer_snapshot_name(end_offset_inclusive: int) -> str:
    """The producer snapshot Kafka uploads with a segment: named by the next segment's base offset."""
    return segment_file_name(end_offset_inclusive + 1, SNAPSHOT_SUFFIX)


def _optional_names(base: int, end: int) -> list[str]:
    """The names of the files staged with a segment's ``.log`` when the broker has them."""
    return [segment_file_name(base, s) for s in SEGMENT_SUFFIXES[1:]] + [_producer_snapshot_name(end)]


def default_staging_root(log_dir: Path) -> Path:
    """``<parent of log dir>/.rlm-staging/<log dir name>``: same filesystem as long as the log dir is no mount."""
    log_dir = Path(log_dir).resolve()
    return log_dir.parent / ".rlm-staging" / log_dir.name


def _is_topic_id_dir(name: str) -> uuid.UUID | None:
    try:
        tid = uuid.UUID(name)
    except ValueError:
        return None
    return tid if str(tid) == name else None


_MARKER_MAX_BYTES = 4096  # an older sidecar's marker file is "<end offset>\n": anything this long is no marker
MARKER_PREFIX = f"{COMPLETE}-"  # the marker's name: .complete-<end offset>
_OLD_MARKER_TMP = f"{COMPLETE}.tmp"  # an older sidecar's marker being written: not a marker


def _read_marker(seg_dir: Path, base_offset: int, names: Iterable[str] | None = None) -> int | None:
    """The end offset the segment dir's marker says (``.complete-<end>``; an older sidecar's ``.complete`` file), or
    None when there is none, more than one, or it is empty, unreadable or not an offset >= base. ``names``: the
    dir's entries when listed already."""
    if names is None:
        try:
            names = os.listdir(seg_dir)
        except OSError:
            return None
    marks = [n for n in names if n.startswith(COMPLETE) and n != _OLD_MARKER_TMP]
    if len(marks) != 1:
        return None
    if marks[0] == COMPLETE:
        return _read_old_marker(seg_dir, base_offset)
    text = marks[0][len(MARKER_PREFIX):] if marks[0].startswith(MARKER_PREFIX) else ""
    if _END_OFFSET.fullmatch(text) is None:
        return None
    end = int(text)
    return end if end >= base_offset else None


def _read_old_marker(seg_dir: Path, base_offset: int) -> int | None:
    """The end offset in an older sidecar's ``.complete`` file (see :func:`_read_marker`), read with ``os.open`` and
    one ``read``."""
    try:
        fd = os.open(seg_dir / COMPLETE, os.O_RDONLY)
    except OSError:
        return None
    try:
        data = os.read(fd, _MARKER_MAX_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        text = data.decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    if len(data) >= _MARKER_MAX_BYTES:
        return None
    if _END_OFFSET.fullmatch(text) is None:
        return None
    end = int(text)
    return end if end >= base_offset else None


def _stat(path: Path) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None


def _remove_files_dir(d: Path) -> None:
    """Remove a staged segment's dir (files only): unlink each, then the dir; anything else (a subdirectory someone
    put there) falls back to :func:`shutil.rmtree`. Missing: nothing to do."""
    try:
        for name in os.listdir(d):
            os.unlink(os.path.join(d, name))
        os.rmdir(d)
    except FileNotFoundError:
        if os.path.isdir(d):  # a file went meanwhile (never the case: staging is locked): the rest is removed below
            shutil.rmtree(d, ignore_errors=True)
    except OSError:
        shutil.rmtree(d, ignore_errors=True)


def _write_marker(target: Path, base: int, end: int) -> None:
    """The marker of ``target`` (``.complete-<end>``, a link of its staged ``.log``: see the module doc), durably: the
    directory fsynced after it. The caller fsynced the directory after the links, before."""
    os.link(target / segment_file_name(base, ".log"), target / f"{MARKER_PREFIX}{end}")
    fsync_dir(target)


def _dir_bytes(seg_dir: Path) -> int:
    total = 0
    try:
        entries = list(os.scandir(seg_dir))
    except FileNotFoundError:
        return 0
    for e in entries:
        if e.name.startswith(COMPLETE):
            continue
        try:
            total += e.stat().st_size
        except FileNotFoundError:
            pass
    return total


class Staging:
    """Staging areas, one per broker log dir; ``max_bytes`` (0: unbounded) bounds each of them."""

    def __init__(self, roots: dict[Path, Path], max_bytes: int = 0) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 (0: unbounded), not {max_bytes}")
        self.max_bytes = max_bytes
        self._roots: dict[Path, Path] = {}
        # Locks. A partition's stage(), release() and staged() hold its own lock (_partition_lock): staged() must not
        # take a segment being staged right now for one a crash left half-done (and remove it). Partitions do not
        # wait for each other: one lock for all, held across each first staging's fsyncs, made a burst's copy runs
        # wait for the stage job one segment at a time (issue 26). _lock (taken before any partition's) serializes
        # what spans partitions (the listing of every partition, a topic's release) and, with a size bound, every
        # staging (the bound counts every partition's bytes). _meta guards the dicts below, never held across I/O.
        self._lock = threading.RLock()
        self._meta = threading.Lock()
        self._partition_locks: dict[TopicIdPartition, threading.RLock] = {}
        # staging root -> complete segment dir -> bytes held (the size bound's count; None when unbounded: _bytes)
        self._held: dict[Path, dict[Path, int | None]] = {}
        # complete segment dirs this process staged or checked -> (end offset, st_dev, st_ino of the staged .log): a
        # segment staged again (the stage job and each copy run stage what is not remote yet) is checked by its
        # marker and the broker's .log being that file, without resolving paths and testing each file (issue 26)
        self._verified: dict[Path, tuple[int, int, int]] = {}
        # complete segment dirs this process staged or checked -> the names in them when it did (holds(): the stage
        # job links a file the broker wrote after the first staging, a producer snapshot, as before)
        self._linked: dict[Path, set[str]] = {}
        self._resolved: dict[Path, Path] = {}  # partition dir -> its staging root (root_for)
        # partition dir -> (stat of its partition.metadata, the topic id it names) (_check_topic_id)
        self._topic_ids: dict[Path, tuple[tuple[int, int, int, int], uuid.UUID]] = {}
        for log_dir, root in roots.items():
            log_dir, root = Path(log_dir).resolve(), Path(root).resolve()
            if root == log_dir or log_dir in root.parents:
                raise StagingError(f"staging dir {root} is inside log dir {log_dir}: the broker would refuse it")
            root.mkdir(parents=True, exist_ok=True)
            if log_dir.exists() and os.stat(root).st_dev != os.stat(log_dir).st_dev:
                raise StagingError(f"staging dir {root} is not on the filesystem of log dir {log_dir}: "
                                   "hard links cannot cross filesystems; set staging_dir to a directory on it")
            self._roots[log_dir] = root
            self._held[root] = {}
            self._remove_old_layout(root)
        with self._lock:
            self._staged(None)  # counts what is held; removes what a crash left incomplete

    # ------------------------------------------------------------------------------------------- layout
    def root_for(self, partition_dir: Path) -> Path:
        key = Path(partition_dir)
        root = self._resolved.get(key)
        if root is not None:
            return root
        log_dir = key.resolve().parent
        try:
            root = self._roots[log_dir]
        except KeyError:
            raise StagingError(f"{partition_dir} is in no configured log dir ({sorted(map(str, self._roots))})") \
                from None
        self._resolved[key] = root
        return root

    def _partition_lock(self, tp: TopicIdPartition) -> threading.RLock:
        """The lock of ``tp``'s staged segments (see ``__init__``); kept for the process's life (a lock dropped while
        a thread waits for it would let a second one be made beside it)."""
        lock = self._partition_locks.get(tp)
        if lock is None:
            with self._meta:
                lock = self._partition_locks.setdefault(tp, threading.RLock())
        return lock

    def _hold(self, root: Path, seg_dir: Path, n_bytes: int | None) -> None:
        with self._meta:
            self._held[root][seg_dir] = n_bytes

    @staticmethod
    def _partition_path(root: Path, tp: TopicIdPartition) -> Path:
        return root / str(tp.topic_id) / partition_dir_name(tp.topic, tp.partition)

    def _remove_old_layout(self, root: Path) -> None:
        """``<root>/<topic>-<partition>/`` of an older version: no topic id, so no proof which topic it was."""
        for entry in sorted(root.iterdir()):
            if not entry.is_dir() or _is_topic_id_dir(entry.name) or parse_partition_dir_name(entry.name) is None:
                continue
            segments = [p.name for p in entry.iterdir() if parse_segment_stem(p.name) is not None]
            log.warning("staging dir of an older layout (keyed by topic name, not topic id) removed: its segments "
                        "cannot be proven to belong to the current topic; they are staged again from the log dir "
                        "if the broker still has them", extra={"directory": str(entry), "segments": len(segments)})
            shutil.rmtree(entry, ignore_errors=True)
        fsync_dir(root)

    def _mkdirs(self, root: Path, path: Path) -> None:
        """Create ``path`` (below ``root``) and the missing directories above it, each fsynced into its parent. A
        topic id dir removed meanwhile (the release of another of its partitions, which holds another lock) is made
        again."""
        for attempt in range(3):
            missing = []
            p = path
            while p != root and not p.exists():
                missing.append(p)
                p = p.parent
            try:
                for d in reversed(missing):
                    try:
                        d.mkdir()
                    except FileExistsError:
                        continue
                    fsync_dir(d.parent)
                return
            except FileNotFoundError:
                if attempt == 2:
                    raise

    # -------------------------------------------------------------------------------------------- stage
    def stage(self, tp: TopicIdPartition, partition_dir: Path, base_offset: int,
              end_offset_inclusive: int, *, names: Collection[str] | None = None) -> StagedSegment:
        """Hard-link the segment's files into staging; idempotent for the same segment (returned as is).

        ``end_offset_inclusive`` (the next segment's base offset - 1) is kept with the links, so a staged segment
        can be copied after the broker deleted it and its successor. A staged dir of the same base that is not
        this segment (another end offset, another inode, incomplete) is replaced.

        Raises :class:`SegmentGoneError` when neither ``<base>.log`` nor ``<base>.log.deleted`` exists any more,
        :class:`StagingFullError` when the bound refuses it, :class:`TopicIdMismatchError` when ``partition_dir``
        belongs to another topic id than ``tp``'s.

        ``names``: the entries of ``partition_dir`` when the caller listed it already (the copier lists it once per
        run or stage round): a file the segment may have (``.txnindex``, the producer snapshot ...) is linked only
        if it, or its ``.deleted`` name, is among them, not tried by a failing ``link`` each time (issue 26). The
        ``.log`` is tried whatever they say.
        """
        if end_offset_inclusive < base_offset:
            raise ValueError(f"end offset {end_offset_inclusive} below base offset {base_offset}")
        if self.max_bytes:  # the bound counts every partition's bytes: one staging at a time
            with self._lock, self._partition_lock(tp):
                return self._stage(tp, Path(partition_dir), base_offset, end_offset_inclusive, names)
        with self._partition_lock(tp):
            return self._stage(tp, Path(partition_dir), base_offset, end_offset_inclusive, names)

    def _stage(self, tp: TopicIdPartition, partition_dir: Path, base: int, end: int,
               names: Collection[str] | None) -> StagedSegment:
        self._check_topic_id(tp, partition_dir)
        root = self.root_for(partition_dir)
        stem = segment_file_name(base, "")
        target = self._partition_path(root, tp) / stem
        staged = StagedSegment(tp, base, end, target)
        known = self._verified.get(target)
        present = self._listing(target) if known is not None and known[0] == end else None
        if present is not None and known is not None and target in self._held[root] \
                and all(segment_file_name(base, x) in present for x in (".index", ".timeindex")) \
                and _read_marker(target, base, present) == end \
                and self._same_log(partition_dir, segment_file_name(base, ".log"), known[1:]):
            # staged complete (or checked) by this process, still marked so, its indexes there, and the broker's
            # .log is still that file: only files the broker wrote since (a producer snapshot) are linked
            got: set[str] = set()
            if self._link_files(partition_dir, target, base, end, optional_only=True, ours=known[1:],
                                present=present, names=names, collect=got):
                fsync_dir(target)
                self._hold(root, target, self._bytes(target))
            self._linked[target] = present | got
            return staged
        if target.exists():
            mismatch = self._mismatch(staged, partition_dir)
            if mismatch is None:
                self._linked.pop(target, None)  # (not listed here: holds() asks stage() until it is)
                linked = self._link_files(partition_dir, target, base, end, optional_only=True, names=names)
                # a dir staged complete without its indexes (before they were rebuilt at staging) gets them now
                if self._rebuild_missing_indexes(tp, target, base) or linked:
                    fsync_dir(target)  # e.g. a snapshot written after the segment was first staged
                    self._hold(root, target, self._bytes(target))
                self._verify(target, end)
                return staged
            log.info("staged segment replaced: not the local segment of that base", extra={
                "partition": str(tp), "base_offset": base, "end_offset": end, "reason": mismatch})
            self._remove_segment_dir(root, target)

        # the .log's size, and with a bound the others' too (unbounded: not stat-ed one by one, issue 26)
        size = self._local_bytes(partition_dir, base, end, log_only=not self.max_bytes)
        if size is None:
            raise SegmentGoneError(f"{partition_dir}/{stem}.log vanished before it was staged")
        if self.max_bytes:
            with self._meta:
                held = sum(n or 0 for n in self._held[root].values())
            if held and held + size > self.max_bytes:
                raise StagingFullError(
                    f"staging {root} holds {held} bytes; {tp} segment {stem} ({size} bytes) would take it past "
                    f"staging_max_bytes={self.max_bytes}: not staged", held, size, self.max_bytes)

        try:  # (known missing: checked above; its parents are there from the partition's first segment on)
            target.mkdir()
            fsync_dir(target.parent)
        except FileNotFoundError:
            self._mkdirs(root, target)
        try:
            linked: set[str] = set()
            if not self._link_files(partition_dir, target, base, end, optional_only=False, names=names,
                                    collect=linked):
                raise SegmentGoneError(f"{partition_dir}/{stem}.log vanished before it was staged")
            if not all(segment_file_name(base, x) in linked for x in (".index", ".timeindex")):
                self._rebuild_missing_indexes(tp, target, base)
            fsync_dir(target)
            _write_marker(target, base, end)
        except BaseException:
            self._remove_segment_dir(root, target)
            raise
        self._hold(root, target, self._bytes(target))
        self._verify(target, end)
        self._linked[target] = linked
        return staged

    def holds(self, tp: TopicIdPartition, partition_dir: Path, base_offset: int, end_offset_inclusive: int,
              names: Collection[str]) -> bool:
        """Whether this process staged (or checked) the segment complete with this end offset, still holds it with
        every file of it that ``names`` (the entries of ``partition_dir``) lists, and the broker's ``.log`` of that
        base is still the file staged (or is gone): one ``stat``, where :meth:`stage` lists the staged dir and tries
        each file the broker may have written since. For the stage job, which runs between copy runs to stage what
        is new before local retention can take it; False: ask :meth:`stage` (issue 26)."""
        target = self._partition_path(self.root_for(partition_dir), tp) / segment_file_name(base_offset, "")
        known, linked = self._verified.get(target), self._linked.get(target)
        if known is None or linked is None or known[0] != end_offset_inclusive:
            return False
        if any(n not in linked and (n in names or f"{n}{DELETED_SUFFIX}" in names)
               for n in _optional_names(base_offset, end_offset_inclusive)):
            return False  # the broker wrote a file of it since (a producer snapshot): stage() links it
        return self._same_log(Path(partition_dir), segment_file_name(base_offset, ".log"), known[1:])

    @staticmethod
    def _listing(target: Path) -> set[str] | None:
        try:
            return set(os.listdir(target))
        except (FileNotFoundError, NotADirectoryError):
            return None

    def _verify(self, target: Path, end: int) -> None:
        """Remember ``target`` as complete with end offset ``end`` and its staged ``.log`` (see ``_verified``)."""
        st = _stat(target / segment_file_name(int(target.name), ".log"))
        if st is not None:
            with self._meta:
                self._verified[target] = (end, st.st_dev, st.st_ino)

    def _same_log(self, partition_dir: Path, log_name: str, ours: tuple[int, int]) -> bool:
        """The broker's ``.log`` (or ``.log.deleted``) of that name is the staged file ``ours`` (device, inode), or the
        broker has neither any more (ours is the only copy left): as :meth:`_mismatch` judges it."""
        for src in self._sources(partition_dir, log_name):
            st = _stat(src)
            if st is not None:
                return (st.st_dev, st.st_ino) == ours
        return True

    @staticmethod
    def _rebuild_missing_indexes(tp: TopicIdPartition, target: Path, base: int) -> bool:
        """Write the ``.index`` / ``.timeindex`` the broker did not have (neither live nor ``.deleted``) from the
        staged ``.log``, as Kafka rebuilds a missing index on recovery: Kafka creates a segment's index files lazily,
        so one can be rolled (its successor's ``.log`` exists) before its index files do. Without them the segment
        would be staged complete and its copy fail on the missing path at every run, for good once the broker
        deleted the ``.log``. The rebuilt files are Kafka's layout at the default ``index.interval.bytes`` (a valid
        index, perhaps denser or sparser than the broker's). A corrupt ``.log`` raises (nothing is staged). Returns
        whether anything was written."""
        offset_index, time_index = (target / segment_file_name(base, s) for s in (".index", ".timeindex"))
        missing = [p for p in (offset_index, time_index) if not p.exists()]
        if not missing:
            return False
        builder = KafkaIndexBuilder(base)
        for header in scan_batches(target / segment_file_name(base, ".log")):
            builder.add(header, header.position)
        for path, data in ((offset_index, builder.offset_index()), (time_index, builder.time_index())):
            if path in missing:
                write_file_durably(path, data)
        log.info("staged segment's index files rebuilt from its .log: the broker had not written them", extra={
            "partition": str(tp), "base_offset": base, "rebuilt": [p.name for p in missing]})
        return True

    def _check_topic_id(self, tp: TopicIdPartition, partition_dir: Path) -> None:
        """Raise :class:`TopicIdMismatchError` when ``partition_dir``'s ``partition.metadata`` names another topic id.
        The file is read again only when its stat changed (device, inode, mtime, size): the broker writes it once per
        directory (a re-created topic's directory is a new one, its file a new inode), and reading and parsing it at
        every stage call (the stage job's and each copy run's, per segment) was a sixth of staging's CPU (issue 26)."""
        path = partition_dir / "partition.metadata"
        try:
            st = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):
            return  # not written yet, or the dir is gone (then the segment is, too)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        known = self._topic_ids.get(partition_dir)
        if known is not None and known[0] == key:
            tid = known[1]
        else:
            try:
                tid = read_partition_metadata(path)
            except (FileNotFoundError, NotADirectoryError, CorruptCheckpointError):
                return  # gone meanwhile, or being written
            self._topic_ids[partition_dir] = (key, tid)
        if tid != tp.topic_id:
            raise TopicIdMismatchError(f"{partition_dir} belongs to topic id {tid}, not {tp}: the topic was "
                                       "deleted and re-created")

    @staticmethod
    def _sources(partition_dir: Path, name: str, prefer_deleted: bool = False) -> tuple[Path, Path]:
        live, deleted = partition_dir / name, partition_dir / f"{name}{DELETED_SUFFIX}"
        return (deleted, live) if prefer_deleted else (live, deleted)

    def _local_bytes(self, partition_dir: Path, base: int, end: int, log_only: bool = False) -> int | None:
        """What staging the segment would take (``log_only``: its ``.log`` alone); None without a ``.log``."""
        log_name = segment_file_name(base, ".log")
        log_st = next((st for p in self._sources(partition_dir, log_name) if (st := _stat(p))), None)
        if log_st is None:
            return None
        total = log_st.st_size
        if log_only:
            return total
        for name in _optional_names(base, end):
            st = next((st for p in self._sources(partition_dir, name) if (st := _stat(p))), None)
            total += st.st_size if st else 0
        return total

    def _link_files(self, partition_dir: Path, target: Path, base: int, end: int, optional_only: bool,
                    ours: tuple[int, int] | None = None, present: set[str] | None = None,
                    names: Collection[str] | None = None, collect: set[str] | None = None) -> bool:
        """Link the segment's files not linked yet; return whether anything was linked (False: no ``.log``).
        ``ours``: the staged ``.log``'s (device, inode), ``present``: the names in ``target``, ``names``: the names
        in ``partition_dir`` (an optional file in neither of its names there is not tried), when known; ``collect``
        gets the names of the optional files linked (or there already).

        The index files come from the same generation as the ``.log``: when it was ``<base>.log.deleted``
        (a segment truncated away while a new one of the same base exists), ``*.deleted`` are preferred."""
        log_name = segment_file_name(base, ".log")
        prefer_deleted = False
        if not optional_only:
            for src in self._sources(partition_dir, log_name):
                if self._link(src, target / log_name):
                    prefer_deleted = src.name.endswith(DELETED_SUFFIX)
                    break
            else:
                return False
        else:
            live = _stat(partition_dir / log_name)
            prefer_deleted = live is None or live.st_ino != (ours[1] if ours else os.stat(target / log_name).st_ino)
        linked = not optional_only
        if present is None:
            present = set(os.listdir(target)) if optional_only else set()
        for name in _optional_names(base, end):
            dest = target / name
            if name in present:  # (a first staging links into a new, empty dir: nothing to look for)
                continue
            if names is not None and name not in names and f"{name}{DELETED_SUFFIX}" not in names:
                continue
            prefer = prefer_deleted and not name.endswith(SNAPSHOT_SUFFIX)
            for src in self._sources(partition_dir, name, prefer_deleted=prefer):
                if self._link(src, dest):
                    linked = True
                    if collect is not None:
                        collect.add(name)
                    break
        return linked

    @staticmethod
    def _link(src: Path, dest: Path) -> bool:
        try:
            os.link(src, dest)
            return True
        except FileNotFoundError:
            return False
        except FileExistsError:
            return True
        except OSError as err:
            if err.errno == errno.EXDEV:
                raise StagingError(f"cannot hard-link {src} into {dest.parent}: different filesystems") from err
            raise

    def _mismatch(self, staged: StagedSegment, partition_dir: Path) -> str | None:
        """Why the staged dir is not this segment, or None if it is."""
        end = _read_marker(staged.directory, staged.base_offset)
        if end is None:
            return "incomplete: the .complete marker is missing, empty or unreadable"
        if end != staged.end_offset_inclusive:
            return f"staged with end offset {end}, the segment now ends at {staged.end_offset_inclusive}"
        ours = _stat(staged.log_path)
        if ours is None:
            return "the staged .log is missing"
        for src in self._sources(partition_dir, staged.log_path.name):
            st = _stat(src)
            if st is None:
                continue
            if (st.st_dev, st.st_ino) != (ours.st_dev, ours.st_ino):
                return f"{src.name} is another file than the staged one"
            return None
        return None  # the broker deleted it: ours is the only copy left

    # ------------------------------------------------------------------------------------------ release
    def release(self, staged: StagedSegment) -> None:
        """Drop the staged links (after a successful copy, or when the segment is known remote)."""
        with self._partition_lock(staged.tp):
            root = next((r for r in self._held if r in staged.directory.parents), None)
            if root is None:
                shutil.rmtree(staged.directory, ignore_errors=True)
                return
            self._remove_segment_dir(root, staged.directory)

    def release_partition(self, tp: TopicIdPartition) -> int:
        """Drop everything staged for one partition (leadership lost, partition purged); return how many segments."""
        with self._partition_lock(tp):
            n = 0
            for root in self._held:
                pdir = self._partition_path(root, tp)
                n += self._forget(root, pdir)
                shutil.rmtree(pdir, ignore_errors=True)
                self._rmdir_if_empty(pdir.parent)
            return n

    def release_topic(self, topic_id: uuid.UUID) -> int:
        """Drop everything staged for one topic id (the topic was deleted); return how many segments."""
        with self._lock:
            n = 0
            with self._meta:
                tps = [tp for tp in self._partition_locks if tp.topic_id == topic_id]
            for tp in tps:  # each partition's staging and release is over (or not begun) when its part goes
                n += self.release_partition(tp)
            for root in self._held:
                tdir = root / str(topic_id)
                n += self._forget(root, tdir)  # (partitions of it this process never locked: staged before a restart)
                shutil.rmtree(tdir, ignore_errors=True)
            return n

    def topic_ids(self) -> set[uuid.UUID]:
        """The topic ids with a staging dir (e.g. to release those of topics deleted while the sidecar was down)."""
        out = set()
        for root in self._held:
            for entry in root.iterdir():
                if entry.is_dir() and (tid := _is_topic_id_dir(entry.name)) is not None:
                    out.add(tid)
        return out

    def _forget(self, root: Path, under: Path) -> int:
        with self._meta:
            held = self._held[root]
            gone = [d for d in held if under in d.parents]
            for d in gone:
                del held[d]
            for d in [d for d in self._verified if under in d.parents]:
                del self._verified[d]
            for d in [d for d in self._linked if under in d.parents]:
                del self._linked[d]
        return len(gone)

    def _remove_segment_dir(self, root: Path, seg_dir: Path) -> None:
        """Remove one staged segment's dir. The partition and topic id dirs above it stay, empty or not: the next
        segment of the partition is staged into them (a rolled segment a few seconds later, typically), and making
        them again costs a mkdir and an fsync of the parent each, per segment (issue 26: on ext4, creating an inode
        is the dearest system call of the copy path). :meth:`release_partition` and :meth:`release_topic` remove
        them, when the partition is no longer led here or the topic is deleted."""
        with self._meta:
            self._held[root].pop(seg_dir, None)
            self._verified.pop(seg_dir, None)
            self._linked.pop(seg_dir, None)
        _remove_files_dir(seg_dir)

    @staticmethod
    def _rmdir_if_empty(d: Path) -> None:
        try:
            d.rmdir()
        except OSError:
            pass

    # ------------------------------------------------------------------------------------------- listing
    def staged(self, tp: TopicIdPartition | None = None) -> list[StagedSegment]:
        """The complete staged segments of ``tp`` (of every partition if None), oldest first per partition.

        A segment dir without a valid ``.complete`` marker (a stage a crash interrupted, an empty or unreadable
        marker) is removed here: the next :meth:`stage` of it redoes it."""
        if tp is not None:
            with self._partition_lock(tp):
                return self._staged(tp)
        with self._lock:
            return self._staged(None)

    def partitions(self) -> set[TopicIdPartition]:
        """The partitions with a staging dir (segments staged or not: a partition's dir stays between its segments),
        from a listing of the topic id dirs alone: no segment's marker read (:meth:`staged` reads each)."""
        return {ptp for root in self._held for ptp, _pdir in self._partition_dirs(root)}

    @staticmethod
    def _partition_dirs(root: Path) -> list[tuple[TopicIdPartition, Path]]:
        """Each partition's staging dir under ``root``, by topic id dir (``scandir``: an entry's type without a stat;
        every discovery round lists them, issue 26)."""
        out = []
        for tentry in sorted(os.scandir(root), key=lambda e: e.name):
            tid = _is_topic_id_dir(tentry.name) if tentry.is_dir() else None
            if tid is None:
                continue
            try:
                entries = sorted(os.scandir(tentry.path), key=lambda e: e.name)
            except (FileNotFoundError, NotADirectoryError):
                continue  # released meanwhile
            tdir = root / tentry.name
            for e in entries:
                parsed = parse_partition_dir_name(e.name)
                if parsed and e.is_dir():
                    out.append((TopicIdPartition(tid, *parsed), tdir / e.name))
        return out

    def _staged(self, tp: TopicIdPartition | None) -> list[StagedSegment]:
        out: list[StagedSegment] = []
        for root in self._held:
            pdirs = [(tp, self._partition_path(root, tp))] if tp is not None else self._partition_dirs(root)
            for ptp, pdir in pdirs:
                with self._partition_lock(ptp):  # (re-entrant: held already when tp is given)
                    out += self._staged_in(root, ptp, pdir)
        out.sort(key=lambda s: (s.tp.topic, s.tp.partition, str(s.tp.topic_id), s.base_offset))
        return out

    def _staged_in(self, root: Path, tp: TopicIdPartition, pdir: Path) -> list[StagedSegment]:
        """The complete staged segments in ``tp``'s dir ``pdir``; the incomplete ones removed. Under ``tp``'s lock."""
        try:
            segs = sorted(p for p in pdir.iterdir() if parse_segment_stem(p.name) is not None)
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for seg in segs:
            base = int(seg.name)
            end = _read_marker(seg, base)
            if end is None:
                log.info("incomplete staged segment removed (staged again if still local)", extra={
                    "partition": str(tp), "base_offset": base, "directory": str(seg)})
                self._remove_segment_dir(root, seg)
                continue
            if seg not in self._held[root]:
                self._hold(root, seg, self._bytes(seg))
            out.append(StagedSegment(tp, base, end, seg))
        return out

    def size_bytes(self) -> int:
        """Bytes under every staging root (markers aside), walked afresh (the metric)."""
        total = 0
        for root in self._roots.values():
            for dirpath, _, files in os.walk(root):
                for f in files:
                    if f.startswith(COMPLETE):
                        continue
                    try:
                        total += os.stat(os.path.join(dirpath, f)).st_size
                    except FileNotFoundError:
                        pass
        return total

    def held_bytes(self) -> int:
        """Bytes of complete staged segments, summed over the log dirs (what the bound counts, per log dir). A
        segment not counted yet (unbounded staging counts none as it stages it) is counted once and remembered (the
        gauge asks every 5 s: walking every staged file each time was a tenth of a burst's CPU, issue 26)."""
        with self._meta:
            held = [(h, d, n) for h in self._held.values() for d, n in h.items()]
        total = 0
        for h, d, n in held:
            if n is None:
                n = _dir_bytes(d)
                with self._meta:
                    if d in h and h[d] is None:  # (not released, nor relinked, meanwhile)
                        h[d] = n
            total += n
        return total

    def _bytes(self, seg_dir: Path) -> int | None:
        """What a staged segment holds, for the bound; None when unbounded (not counted: a scandir and a stat per
        file, per segment staged; :meth:`held_bytes` counts those when asked)."""
        return _dir_bytes(seg_dir) if self.max_bytes else None
