"""Hard-link staging: keep a rolled segment's bytes alive until it is copied.

The broker's local retention may delete a rolled segment at any moment (it renames the files to
``*.deleted`` and unlinks them about a minute later). As soon as the sidecar sees a rolled segment it
hard-links the segment's files into a staging directory on the same filesystem: the broker's unlink then only
drops its own name, the inode lives on under ours until the copy is done and :meth:`Staging.release` runs.

Layout, per log dir::

    <staging root>/<topic id>/<topic>-<partition>/                    one dir per partition, made once (not per segment)
        00000000000000000042.log  .index  .timeindex  .txnindex      links named as the originals
        00000000000000000100.snapshot                                 producer state at end offset + 1 (below)
        00000000000000000042.complete-99.itx                          the segment's marker: its end offset (inclusive)
                                                                      and the files it vouches for in its name (below),
                                                                      made last (a link of the staged .log)
        00000000000000000100.log ...                                  the partition's next segment, beside it

A segment's files are the partition's own names (a base offset names one segment; its producer snapshot is named by
the next base, which no other staged segment links), so the segments of a partition share one directory: staging a
segment makes no directory (issue 26: on this project's ext4 an inode is the dearest system call of the copy path,
and a directory per segment was one inode and one fsync of its parent more per segment). A dir of the layout before
this one, ``<topic>-<partition>/<20-digit base offset>/`` holding the files and a ``.complete-<end>`` (or an older
sidecar's ``.complete`` file), is still read, copied and released as such (:attr:`StagedSegment.directory` is then
that dir); a new staging of its base replaces it in the flat layout when it is not the same segment.

Staging is keyed by **topic id** (``<topic id>`` is ``str(uuid)``, e.g. ``8c1f...-...``): a topic deleted and
re-created under the same name has a new id, so it can never be served the old one's staged bytes. A staged segment
is reused only if it is the **same segment**: same base offset, same end offset (its marker), and, while the broker
still has ``<base>.log`` (or ``<base>.log.deleted``), the same inode as our link. Anything else (another end after a
truncation and regrowth, another file, a missing or unreadable marker, two markers) is replaced. Directories of the
oldest layout ``<staging root>/<topic>-<partition>/`` cannot be attributed to a topic id: they are removed at
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

**Durability, per round.** :meth:`Staging.stage_many` stages the segments of one partition that a round found (the
stage job's, a copy run's): every segment's files linked, every segment's marker linked, then **one** fsync of the
partition's dir. A marker vouches for the files linked with it: its name, ``<base>.complete-<end>.<letters>``, has a
letter for each optional file staged with the ``.log`` (``i`` .index, ``t`` .timeindex, ``x`` .txnindex, ``s`` the
producer snapshot), and a segment is complete (listed by :meth:`Staging.staged`, copied) only when its marker and
every file it vouches for are there. A crash (or a power cut) before the fsync returned may keep any of the round's
names and lose the others: a marker whose files did not all survive is no complete segment, so one fsync after the
markers is as safe as one before them and one after. Per segment of a round of ``n``: ``1/n`` fsyncs, where a
segment in a dir of its own cost 3 (its dir into the parent, its links, its marker). Files without a complete marker
(a round a crash interrupted, a release a crash interrupted: the marker goes first) are removed by the next listing,
under the partition's lock, and the segment is staged again from the log dir. The marker is a hard link of the
staged ``.log``: its name is its content, so it needs no data written and fsynced, and a link makes no inode. (A
marker without letters, ``<base>.complete-<end>``, of this layout's first version, vouches for the ``.log`` alone:
its files were fsynced before it was made.) A partition's dir and its topic id dir are fsynced into their parents
when made (once per partition).

Releasing a segment unlinks its marker, then its files (by name: no listing); the partition's dir stays for its next
segment (issue 26) until :meth:`Staging.release_partition`.

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
from dataclasses import dataclass, field
from pathlib import Path

from rlm.errors import RlmError
from rlm.state import fsync_dir, write_file_durably
from rlm.topic_ids import TopicIdFiles
from rlmm.api import TopicIdPartition
from rsm.log.batch import scan_batches
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

__all__ = ["TXN_UPLOAD_SUFFIX", "SegmentGoneError", "StageRound", "StagedSegment", "Staging", "StagingError",
           "StagingFullError", "TopicIdMismatchError", "default_staging_root", "partition_staging_dir",
           "staged_ranges", "staging_roots"]

log = logging.getLogger(__name__)

# File naming is the broker's (:mod:`rsm.log.partition`): a segment's own files are linked in the order of
# SEGMENT_SUFFIXES, ``.log`` first (without it nothing is staged); the producer snapshot is named by the next
# segment's base offset (see the module doc). A segment's marker is ``<stem>.complete-<end>``; a segment dir of the
# layout before (named by the bare 20-digit stem) holds ``.complete-<end>``.
COMPLETE = ".complete"
_END_OFFSET = re.compile(r"\d+")
TXN_UPLOAD_SUFFIX = ".txnindex.upload"
"""The transaction index the copier writes beside a staged segment (``<stem>.txnindex.upload``); released with it."""
_FLAT_MARKER = re.compile(r"(\d{20})\.complete(.*)", re.DOTALL)  # a segment's marker (or a broken one): base, rest
_STAGED_FILE = re.compile(r"\d{20}\..*", re.DOTALL)  # a name staging makes in a partition dir (a segment's file)


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
    directory: Path  # where its files are: the partition's staging dir (a segment dir of the layout before: that dir)

    @property
    def topic(self) -> str:
        return self.tp.topic

    @property
    def partition(self) -> int:
        return self.tp.partition

    @property
    def segment(self) -> Segment:
        """The staged files as a :class:`~rsm.log.partition.Segment` (rolled; its ``snapshot_path`` is
        ``<base>.snapshot``, which is not this segment's: the producer snapshot is :attr:`producer_snapshot_path`;
        in the partition's dir, ``<base>.snapshot`` is the previous segment's, when it is staged)."""
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

    def path(self, suffix: str) -> Path:
        """Where the staged file with this suffix is (``.log``, ``.index``, ``.timeindex``: a staged segment has them),
        without looking."""
        return self.directory / segment_file_name(self.base_offset, suffix)

    def write_txn_upload(self, data: bytes) -> Path:
        """The transaction index the copier uploads with the segment, written beside its staged files
        (``<stem>.txnindex.upload``: released with it)."""
        out = self.path(TXN_UPLOAD_SUFFIX)
        out.write_bytes(data)
        return out


def _producer_snapshot_name(end_offset_inclusive: int) -> str:
    """The producer snapshot Kafka uploads with a segment: named by the next segment's base offset."""
    return segment_file_name(end_offset_inclusive + 1, SNAPSHOT_SUFFIX)


def _optional_names(base: int, end: int) -> list[str]:
    """The names of the files staged with a segment's ``.log`` when the broker has them."""
    return [segment_file_name(base, s) for s in SEGMENT_SUFFIXES[1:]] + [_producer_snapshot_name(end)]


def _segment_names(base: int, end: int) -> list[str]:
    """Every name a segment staged in its partition's dir may have but its marker: its ``.log`` first."""
    return [segment_file_name(base, ".log"), *_optional_names(base, end), segment_file_name(base, TXN_UPLOAD_SUFFIX)]


_VOUCHED = (("i", ".index"), ("t", ".timeindex"), ("x", ".txnindex"))  # a marker's letters ("s": the snapshot)
_MARKER_REST = re.compile(r"-(\d+)(?:\.([itxs]*))?")  # what follows <stem>.complete in a marker's name


def _marker_name(base: int, end: int, files: Collection[str]) -> str:
    """A segment's marker in its partition's dir, ``<stem>.complete-<end offset>.<letters>``: a letter for each
    optional file of the segment among ``files`` (``i`` .index, ``t`` .timeindex, ``x`` .txnindex, ``s`` the producer
    snapshot), the files it vouches for with its ``.log`` (see the module doc's *Durability*)."""
    letters = "".join(c for c, suffix in _VOUCHED if segment_file_name(base, suffix) in files)
    letters += "s" if _producer_snapshot_name(end) in files else ""
    return f"{segment_file_name(base, '')}{MARKER_PREFIX}{end}.{letters}"


def _vouched(base: int, end: int, letters: str) -> list[str]:
    """The files a marker with ``letters`` vouches for: the ``.log`` and those its letters name."""
    out = [segment_file_name(base, ".log")] + [segment_file_name(base, s) for c, s in _VOUCHED if c in letters]
    return out + ([_producer_snapshot_name(end)] if "s" in letters else [])


def _markers(names: Collection[str]) -> dict[int, tuple[int, str] | None]:
    """Base offset -> (end offset, the marker's name) for every segment of a partition's dir (``names``: its
    listing) that has a marker there and is complete: one marker, ``<stem>.complete-<end offset >= base>[.<letters>]``,
    and every file it vouches for (:func:`_vouched`) among ``names``; None for a segment whose marker is not so. (A
    marker without letters, ``<stem>.complete-<end>``, vouches for the ``.log`` alone: its files were fsynced before
    it was made.)"""
    found: dict[int, list[str]] = {}
    for name in names:
        m = _FLAT_MARKER.fullmatch(name)
        if m is not None:
            found.setdefault(int(m[1]), []).append(name)
    out: dict[int, tuple[int, str] | None] = {}
    for base, marks in found.items():
        m = _MARKER_REST.fullmatch(marks[0][len(segment_file_name(base, COMPLETE)):]) if len(marks) == 1 else None
        end = int(m[1]) if m is not None else -1
        letters = (m[2] or "") if m is not None else ""
        ok = m is not None and end >= base and len(set(letters)) == len(letters) \
            and all(n in names for n in _vouched(base, end, letters))
        out[base] = (end, marks[0]) if ok else None
    return out


def _marker_names_of(base: int, names: Iterable[str]) -> list[str]:
    """Every marker-like name of the segment of ``base`` among ``names`` (a broken one, two of them)."""
    return [n for n in names if (m := _FLAT_MARKER.fullmatch(n)) is not None and int(m[1]) == base]


def _unlink_names(d: Path, names: Iterable[str]) -> None:
    for name in names:
        try:
            os.unlink(d / name)
        except FileNotFoundError:
            pass


def default_staging_root(log_dir: Path) -> Path:
    """``<parent of log dir>/.rlm-staging/<log dir name>``: same filesystem as long as the log dir is no mount."""
    log_dir = Path(log_dir).resolve()
    return log_dir.parent / ".rlm-staging" / log_dir.name


def staging_roots(log_dirs: Iterable[Path], staging_dir: Path | None) -> dict[Path, Path]:
    """Each log dir's staging root, as the settings give them: ``<staging_dir>/<log dir name>``, or, without
    ``staging_dir``, :func:`default_staging_root`."""
    return {Path(d): (Path(staging_dir) / Path(d).resolve().name if staging_dir else default_staging_root(Path(d)))
            for d in log_dirs}


def partition_staging_dir(root: Path, tp: TopicIdPartition) -> Path:
    """``tp``'s staging dir under the staging root ``root``: ``<root>/<topic id>/<topic>-<partition>``."""
    return root / str(tp.topic_id) / partition_dir_name(tp.topic, tp.partition)


def staged_ranges(roots: Iterable[Path], tp: TopicIdPartition) -> list[tuple[int, int]]:
    """``(base offset, end offset inclusive)`` of each complete staged segment of ``tp`` under the staging ``roots``
    (one listing of its dir per root), oldest first, as :meth:`Staging.staged` finds them, read only: no lock taken,
    nothing removed, so it may run in another component of the process (the proxying listener,
    :mod:`rlm.listener.tier.boundary`) while the sidecar stages and releases. A segment being staged counts once
    its marker is made (last), one being released no more once its marker is gone (first)."""
    out: list[tuple[int, int]] = []
    for root in roots:
        pdir = partition_staging_dir(root, tp)
        try:
            entries = list(os.scandir(pdir))
        except (FileNotFoundError, NotADirectoryError):
            continue
        files: set[str] = set()
        for e in entries:
            if not e.is_dir(follow_symlinks=False):
                files.add(e.name)
            elif (base := parse_segment_stem(e.name)) is not None and (end := _read_marker(pdir / e.name, base)) \
                    is not None:  # a segment dir of the layout before
                out.append((base, end))
        out += [(base, got[0]) for base, got in _markers(files).items() if got is not None]
    return sorted(out)


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


def _stat(path: Path | str) -> os.stat_result | None:
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


def _key_of(staged: StagedSegment) -> Path:
    """The key of a staged segment in :class:`Staging`'s books: ``<partition's staging dir>/<stem>`` (a dir only in
    the layout before, where it is :attr:`StagedSegment.directory`)."""
    stem = segment_file_name(staged.base_offset, "")
    return staged.directory if staged.directory.name == stem else staged.directory / stem


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


@dataclass(slots=True)
class StageRound:
    """What :meth:`Staging.stage_many` did: the segments staged (complete, durable), those the broker deleted before
    they could be, and why the round stopped early (None: it did not)."""

    staged: list[StagedSegment] = field(default_factory=list)
    gone: list[tuple[int, int]] = field(default_factory=list)
    error: StagingFullError | TopicIdMismatchError | None = None


class _Round:
    """One round of :meth:`Staging.stage_many` in a partition's staging dir ``sdir``: its listing (made once, kept
    up to date by the round), the dirs it linked into (fsynced once at its end) and its segments waiting for their
    marker."""

    def __init__(self, sdir: Path) -> None:
        self.sdir = sdir
        self.dirty: set[Path] = set()
        self.pending: list[tuple[Path, int, int, set[str]]] = []  # (key, base, end, optional names linked)
        self._names: set[str] | None = None
        self._listed = False
        self._markers: dict[int, tuple[int, str] | None] | None = None

    def listing(self) -> set[str] | None:
        """The names in ``sdir`` (None: no such dir yet), listed at the first call."""
        if not self._listed:
            try:
                self._names = set(os.listdir(self.sdir))
            except (FileNotFoundError, NotADirectoryError):
                self._names = None
            self._listed = True
        return self._names

    def markers(self) -> dict[int, tuple[int, str] | None]:
        """:func:`_markers` of the listing (as it was before this round's new markers: they are made at its end)."""
        if self._markers is None:
            self._markers = _markers(self.listing() or set())
        return self._markers

    def made(self) -> set[str]:
        """``sdir`` was just made: its (empty) listing."""
        self._names, self._listed, self._markers = set(), True, {}
        return self._names

    def forget(self) -> None:
        """The dir changed beyond what the round tracks (a segment removed, the dir made): list it again."""
        self._listed, self._names, self._markers = False, None, None


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
        self._legacy: set[Path] = set()  # segment dirs of the layout before (a dir per segment), as listed
        self._marker_of: dict[Path, str] = {}  # segment key -> its marker's name (released by name, no listing)
        self._resolved: dict[Path, Path] = {}  # partition dir -> its staging root (root_for)
        self._given: dict[str, Path] = {}  # a log dir as configured, and resolved -> its staging root (root_for)
        self._pdirs: dict[tuple[Path, TopicIdPartition], Path] = {}  # (root, partition) -> its dir (_partition_path)
        self._topic_ids = TopicIdFiles()  # each partition dir's partition.metadata, read when it changed
        for given, root in roots.items():
            log_dir, root = Path(given).resolve(), Path(root).resolve()
            self._given[os.path.normpath(given)] = self._given[str(log_dir)] = root
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
        root = self._resolved.get(partition_dir)  # (a Path given: no Path made of it, issue 26)
        if root is not None:
            return root
        key = Path(partition_dir)
        root = self._resolved.get(key)  # (a str given)
        if root is not None:
            return root
        # A partition dir named in a log dir as configured (or resolved), not itself a symbolic link, resolves to a
        # dir of that log dir: one lstat, where resolving the whole path took one a component (a cold burst's 2,000
        # partitions: 2.5% of its GIL samples, in the stage job, issue 26).
        parent, name = os.path.split(os.path.normpath(key))
        root = self._given.get(parent) if name not in ("", ".", "..") and not os.path.islink(key) else None
        if root is None:
            try:
                root = self._roots[key.resolve().parent]
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

    def _partition_path(self, root: Path, tp: TopicIdPartition) -> Path:
        """``tp``'s staging dir under ``root`` (kept: asked at every staging and check of the partition, issue 26)."""
        path = self._pdirs.get((root, tp))
        if path is None:
            path = self._pdirs[(root, tp)] = partition_staging_dir(root, tp)
        return path

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
        """Hard-link the segment's files into staging, durably (:meth:`stage_many` of one segment); idempotent for the
        same segment (returned as is).

        Raises :class:`SegmentGoneError` when neither ``<base>.log`` nor ``<base>.log.deleted`` exists any more,
        :class:`StagingFullError` when the bound refuses it, :class:`TopicIdMismatchError` when ``partition_dir``
        belongs to another topic id than ``tp``'s."""
        done = self.stage_many(tp, partition_dir, [(base_offset, end_offset_inclusive)], names=names)
        if done.error is not None:
            raise done.error
        if done.gone:
            raise SegmentGoneError(f"{partition_dir}/{segment_file_name(base_offset, '.log')} vanished before it was "
                                   "staged")
        return done.staged[0]

    def stage_many(self, tp: TopicIdPartition, partition_dir: Path, ranges: Iterable[tuple[int, int]], *,
                   names: Collection[str] | None = None) -> StageRound:
        """Stage the segments ``ranges`` (``(base offset, end offset inclusive)``, oldest first) of one partition as
        one round: every segment's files linked, every new segment's marker, one fsync of the partition's staging
        dir (the module doc's *Durability*). Idempotent per segment: one staged already is checked
        (the same segment: its marker's end, the broker's ``.log`` the staged file) and gets only the files the
        broker wrote since (a producer snapshot); one that is not this segment is replaced.

        ``end_offset_inclusive`` (the next segment's base offset - 1) is kept with the links, so a staged segment
        can be copied after the broker deleted it and its successor. Returns what the round staged, the segments
        the broker deleted before they could be (:attr:`StageRound.gone`, gaps for the caller to count), and, when
        the round stopped early, why (:class:`StagingFullError`: the rest is not staged; the segments before it
        are; :class:`TopicIdMismatchError`: nothing is). Any other failure raises, the segments before it staged.

        ``names``: the entries of ``partition_dir`` when the caller listed it already (the copier lists it once per
        run or stage round): a file the segment may have (``.txnindex``, the producer snapshot ...) is linked only
        if it, or its ``.deleted`` name, is among them, not tried by a failing ``link`` each time (issue 26). The
        ``.log`` is tried whatever they say."""
        ranges = list(ranges)
        for base, end in ranges:
            if end < base:
                raise ValueError(f"end offset {end} below base offset {base}")
        partition_dir = partition_dir if isinstance(partition_dir, Path) else Path(partition_dir)
        if self.max_bytes:  # the bound counts every partition's bytes: one staging at a time
            with self._lock, self._partition_lock(tp):
                return self._stage_round(tp, partition_dir, ranges, names)
        with self._partition_lock(tp):
            return self._stage_round(tp, partition_dir, ranges, names)

    def _stage_round(self, tp: TopicIdPartition, partition_dir: Path, ranges: list[tuple[int, int]],
                     names: Collection[str] | None) -> StageRound:
        done = StageRound()
        if not ranges:
            return done
        try:
            self.check_topic_id(tp, partition_dir)
        except TopicIdMismatchError as err:
            done.error = err
            return done
        root = self.root_for(partition_dir)
        rnd = _Round(self._partition_path(root, tp))
        try:
            for base, end in ranges:
                try:
                    done.staged.append(self._stage_one(tp, partition_dir, root, rnd, base, end, names))
                except SegmentGoneError:
                    done.gone.append((base, end))
                except StagingFullError as err:
                    done.error = err
                    break
        finally:
            self._finish_round(root, rnd)
        return done

    def _stage_one(self, tp: TopicIdPartition, partition_dir: Path, root: Path, rnd: _Round, base: int, end: int,
                   names: Collection[str] | None) -> StagedSegment:
        """One segment of a round: checked, or linked (its marker and the fsyncs are :meth:`_finish_round`'s)."""
        sdir = rnd.sdir
        stem = segment_file_name(base, "")
        key = sdir / stem  # the segment's key in _held, _verified, _linked (a dir only in the layout before)
        if key in self._legacy:
            kept = self._stage_legacy(tp, partition_dir, root, key, base, end, names)
            if kept is not None:
                return kept
        staged = StagedSegment(tp, base, end, sdir)
        present = rnd.listing()
        log_name = segment_file_name(base, ".log")
        if present is not None and base in rnd.markers():
            got_marker = rnd.markers()[base]
            marked = got_marker[0] if got_marker is not None else None
            known = self._verified.get(key)
            if marked == end and known is not None and known[0] == end and key in self._held[root] \
                    and all(segment_file_name(base, x) in present for x in (".index", ".timeindex")) \
                    and self._same_log(partition_dir, log_name, known[1:]):
                # staged complete (or checked) by this process, still marked so, its indexes there, and the broker's
                # .log is still that file: only files the broker wrote since (a producer snapshot) are linked
                got: set[str] = set()
                if self._link_files(partition_dir, sdir, base, end, optional_only=True, ours=known[1:],
                                    present=present, names=names, collect=got):
                    rnd.dirty.add(sdir)
                    present |= got
                    self._hold(root, key, self._bytes(key, end))
                self._linked[key] = {n for n in _optional_names(base, end) if n in present}
                return staged
            mismatch = self._mismatch(staged, partition_dir, marked)
            if mismatch is None:
                linked = self._link_files(partition_dir, sdir, base, end, optional_only=True, present=present,
                                          names=names)
                # a segment staged complete without its indexes (before they were rebuilt at staging) gets them now
                if self._rebuild_missing_indexes(tp, sdir, base) or linked:
                    rnd.dirty.add(sdir)  # e.g. a snapshot written after the segment was first staged
                self._hold(root, key, self._bytes(key, end))
                self._verify(key, end)
                self._linked.pop(key, None)  # (not listed here: holds() asks stage() until it is)
                if got_marker is not None:
                    self._marker_of[key] = got_marker[1]
                rnd.forget()
                return staged
            log.info("staged segment replaced: not the local segment of that base", extra={
                "partition": str(tp), "base_offset": base, "end_offset": end, "reason": mismatch})
            self._remove_segment(root, key, marked, extra=_marker_names_of(base, present))
            rnd.forget()
            present = rnd.listing()

        # with a bound, the segment's bytes; unbounded, the .log's link says whether it is there (issue 26), unless
        # the partition's dir would be made for it first (a segment gone leaves nothing made)
        if self.max_bytes or present is None:
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
        if present is None:  # the partition's first segment here: its dir (and the topic id's) made, once
            self._mkdirs(root, sdir)
            present = rnd.made()
        stale = [n for n in _segment_names(base, end) if n in present]
        if stale:  # files of that base without a marker (a round a crash interrupted): never linked over
            _unlink_names(sdir, stale)
            present.difference_update(stale)
        linked: set[str] = set()
        try:
            if not self._link_files(partition_dir, sdir, base, end, optional_only=False, present=present,
                                    names=names, collect=linked):
                raise SegmentGoneError(f"{partition_dir}/{stem}.log vanished before it was staged")
            if not all(segment_file_name(base, x) in linked for x in (".index", ".timeindex")):
                self._rebuild_missing_indexes(tp, sdir, base)
        except BaseException:
            _unlink_names(sdir, _segment_names(base, end))
            raise
        present |= linked | {log_name}
        rnd.dirty.add(sdir)
        rnd.pending.append((key, base, end, linked | {segment_file_name(base, x) for x in (".index", ".timeindex")}))
        self._hold(root, key, self._bytes(key, end))  # (counted by the bound from now on; dropped if not finished)
        return staged

    def _finish_round(self, root: Path, rnd: _Round) -> None:
        """The round's durability: its new segments' markers (each vouching for the files linked with it), then one
        fsync of each dir it linked into. On a failure the round's new segments are removed (staged again by the
        next round) and it raises."""
        if not rnd.dirty:
            return
        made = []
        try:
            sdir = str(rnd.sdir)
            for key, base, end, linked in rnd.pending:
                marker = _marker_name(base, end, linked)
                os.link(f"{sdir}/{segment_file_name(base, '.log')}", f"{sdir}/{marker}")
                made.append((key, end, marker))
            for d in rnd.dirty:
                fsync_dir(d)
        except BaseException:
            with self._meta:
                self._marker_of.update((key, marker) for key, _end, marker in made)
            for key, _base, end, _linked in rnd.pending:
                self._remove_segment(root, key, end)
            raise
        for (key, _base, end, linked), (_key, _end, marker) in zip(rnd.pending, made, strict=True):
            self._verify(key, end)
            self._linked[key] = linked
            with self._meta:
                self._marker_of[key] = marker

    def _stage_legacy(self, tp: TopicIdPartition, partition_dir: Path, root: Path, seg_dir: Path, base: int,
                      end: int, names: Collection[str] | None) -> StagedSegment | None:
        """A segment staged in a dir of its own (the layout before): kept as is when it is this segment (the files
        the broker wrote since linked into it, fsynced here: a rare path, once per such segment), else removed
        (None: the caller stages it anew)."""
        staged = StagedSegment(tp, base, end, seg_dir)
        present = self._listing(seg_dir)
        mismatch = self._mismatch(staged, partition_dir, _read_marker(seg_dir, base, present)
                                  if present is not None else None)
        if mismatch is None:
            linked = self._link_files(partition_dir, seg_dir, base, end, optional_only=True, present=present,
                                      names=names)
            if self._rebuild_missing_indexes(tp, seg_dir, base) or linked:
                fsync_dir(seg_dir)
                self._hold(root, seg_dir, self._bytes(seg_dir, end))
            self._verify(seg_dir, end)
            self._linked.pop(seg_dir, None)  # (holds() asks stage() for it: the rare layout)
            return staged
        log.info("staged segment replaced: not the local segment of that base", extra={
            "partition": str(tp), "base_offset": base, "end_offset": end, "reason": mismatch})
        self._remove_segment(root, seg_dir, end)
        return None

    def holds(self, tp: TopicIdPartition, partition_dir: Path, base_offset: int, end_offset_inclusive: int,
              names: Collection[str]) -> bool:
        """Whether this process staged (or checked) the segment complete with this end offset, still holds it with
        every file of it that ``names`` (the entries of ``partition_dir``) lists, and the broker's ``.log`` of that
        base is still the file staged (or is gone): one ``stat``, where :meth:`stage` lists the staged dir and tries
        each file the broker may have written since. For the stage job, which runs between copy runs to stage what
        is new before local retention can take it; False: ask :meth:`stage` (issue 26)."""
        key = self._partition_path(self.root_for(partition_dir), tp) / segment_file_name(base_offset, "")
        known, linked = self._verified.get(key), self._linked.get(key)
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

    def _files_dir(self, key: Path) -> Path:
        """Where the files of the segment of ``key`` are: its partition's dir, or its own (the layout before)."""
        return key if key in self._legacy else key.parent

    def _verify(self, key: Path, end: int) -> None:
        """Remember ``key``'s segment as complete with end offset ``end`` and its staged ``.log`` (``_verified``)."""
        st = _stat(f"{self._files_dir(key)}/{segment_file_name(int(key.name), '.log')}")
        if st is not None:
            with self._meta:
                self._verified[key] = (end, st.st_dev, st.st_ino)

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

    def check_topic_id(self, tp: TopicIdPartition, partition_dir: Path) -> None:
        """Raise :class:`TopicIdMismatchError` when ``partition_dir``'s ``partition.metadata`` names another topic id
        (read again only when it changed: :class:`rlm.topic_ids.TopicIdFiles`; at every stage call, the stage job's
        and each copy run's, reading it was a sixth of staging's CPU, issue 26)."""
        try:
            tid = self._topic_ids.topic_id(partition_dir)
        except (FileNotFoundError, NotADirectoryError, CorruptCheckpointError):
            return  # not written yet, being written, or the dir is gone (then the segment is, too)
        if tid != tp.topic_id:
            raise TopicIdMismatchError(f"{partition_dir} belongs to topic id {tid}, not {tp}: the topic was "
                                       "deleted and re-created")

    @staticmethod
    def _sources(partition_dir: Path, name: str, prefer_deleted: bool = False) -> tuple[str, str]:
        """The broker's file of ``name`` and its ``.deleted`` name, as paths in strings (a :class:`Path` joined per
        name tried was most of a staging's Python: issue 26)."""
        live = f"{partition_dir}/{name}"
        deleted = f"{live}{DELETED_SUFFIX}"
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
                if self._link(src, f"{target}/{log_name}"):
                    prefer_deleted = src.endswith(DELETED_SUFFIX)
                    break
            else:
                return False
        else:
            live = _stat(f"{partition_dir}/{log_name}")
            prefer_deleted = live is None or \
                live.st_ino != (ours[1] if ours else os.stat(f"{target}/{log_name}").st_ino)
        linked = not optional_only
        if present is None:
            present = set(os.listdir(target)) if optional_only else set()
        for name in _optional_names(base, end):
            if name in present:  # (a first staging links into a new, empty dir: nothing to look for)
                continue
            if names is not None and name not in names and f"{name}{DELETED_SUFFIX}" not in names:
                continue
            prefer = prefer_deleted and not name.endswith(SNAPSHOT_SUFFIX)
            dest = f"{target}/{name}"
            for src in self._sources(partition_dir, name, prefer_deleted=prefer):
                if self._link(src, dest):
                    linked = True
                    if collect is not None:
                        collect.add(name)
                    break
        return linked

    @staticmethod
    def _link(src: str, dest: str) -> bool:
        try:
            os.link(src, dest)
            return True
        except FileNotFoundError:
            return False
        except FileExistsError:
            return True
        except OSError as err:
            if err.errno == errno.EXDEV:
                raise StagingError(f"cannot hard-link {src} into {os.path.dirname(dest)}: different filesystems") \
                    from err
            raise

    def _mismatch(self, staged: StagedSegment, partition_dir: Path, marked: int | None) -> str | None:
        """Why the staged segment is not this segment, or None if it is; ``marked``: the end offset its marker says
        (None: no marker, two, or an unreadable one)."""
        if marked is None:
            return "incomplete: the .complete marker is missing, empty or unreadable"
        if marked != staged.end_offset_inclusive:
            return f"staged with end offset {marked}, the segment now ends at {staged.end_offset_inclusive}"
        ours = _stat(staged.log_path)
        if ours is None:
            return "the staged .log is missing"
        for src in self._sources(partition_dir, staged.log_path.name):
            st = _stat(src)
            if st is None:
                continue
            if (st.st_dev, st.st_ino) != (ours.st_dev, ours.st_ino):
                return f"{os.path.basename(src)} is another file than the staged one"
            return None
        return None  # the broker deleted it: ours is the only copy left

    # ------------------------------------------------------------------------------------------ release
    def release(self, staged: StagedSegment) -> None:
        """Drop the staged links (after a successful copy, or when the segment is known remote)."""
        with self._partition_lock(staged.tp):
            key = _key_of(staged)
            root = next((r for r in self._held if r in key.parents), None)
            if root is None:  # (not listed by this process: removed all the same)
                if key == staged.directory:
                    shutil.rmtree(key, ignore_errors=True)
                else:
                    _unlink_names(key.parent, [
                        *_marker_names_of(staged.base_offset, self._listing(key.parent) or ()),
                        *_segment_names(staged.base_offset, staged.end_offset_inclusive)])
                return
            self._remove_segment(root, key, staged.end_offset_inclusive)

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
            self._legacy.difference_update([d for d in self._legacy if under in d.parents])
            for d in [d for d in self._marker_of if under in d.parents]:
                del self._marker_of[d]
        return len(gone)

    def _remove_segment(self, root: Path, key: Path, end: int | None, extra: Iterable[str] = ()) -> None:
        """Remove one staged segment: its marker first (a crash midway leaves files without a marker, which the next
        listing removes), then its files, by name (``end`` None: a marker unreadable, its producer snapshot left to
        that listing); ``extra``: more names of it to unlink first (a broken marker). A segment dir of the layout
        before is removed whole. The partition and topic id dirs stay, empty or not: the partition's next segment
        is staged into them (:meth:`release_partition` and :meth:`release_topic` remove them)."""
        with self._meta:
            self._held[root].pop(key, None)
            self._verified.pop(key, None)
            linked = self._linked.pop(key, None)
            marker = self._marker_of.pop(key, None)
            legacy = key in self._legacy
            self._legacy.discard(key)
        if legacy:
            _remove_files_dir(key)
            return
        base = int(key.name)
        if end is None:
            names = [segment_file_name(base, s) for s in (*SEGMENT_SUFFIXES, TXN_UPLOAD_SUFFIX)]
        elif linked is not None:  # (what this process linked: no unlink of a name it never made)
            names = [segment_file_name(base, ".log"), *sorted(linked), segment_file_name(base, TXN_UPLOAD_SUFFIX)]
        else:
            names = _segment_names(base, end)
        if marker is None and end is not None:  # (not known: listed, once)
            marker_names = _marker_names_of(base, self._listing(key.parent) or ())
        else:
            marker_names = [marker] if marker is not None else []
        _unlink_names(key.parent, [*dict.fromkeys([*marker_names, *extra]), *names])

    @staticmethod
    def _rmdir_if_empty(d: Path) -> None:
        try:
            d.rmdir()
        except OSError:
            pass

    # ------------------------------------------------------------------------------------------- listing
    def staged(self, tp: TopicIdPartition | None = None) -> list[StagedSegment]:
        """The complete staged segments of ``tp`` (of every partition if None), oldest first per partition.

        A segment without a valid marker (a round a crash interrupted, a release a crash interrupted, a marker
        unreadable or doubled) is removed here: the next :meth:`stage` of it redoes it."""
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
        """The complete staged segments in ``tp``'s dir ``pdir`` (one listing); the incomplete ones removed. Under
        ``tp``'s lock, so no round of it is under way."""
        try:
            entries = list(os.scandir(pdir))
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        files: set[str] = set()
        for e in entries:
            if not e.is_dir(follow_symlinks=False):
                files.add(e.name)
                continue
            base = parse_segment_stem(e.name)
            if base is None:
                continue
            seg = pdir / e.name  # a segment dir of the layout before
            with self._meta:
                self._legacy.add(seg)
            end = _read_marker(seg, base)
            if end is None:
                log.info("incomplete staged segment removed (staged again if still local)", extra={
                    "partition": str(tp), "base_offset": base, "directory": str(seg)})
                self._remove_segment(root, seg, None)
                continue
            if seg not in self._held[root]:
                self._hold(root, seg, self._bytes(seg, end))
            out.append(StagedSegment(tp, base, end, seg))
        owned: set[str] = set()
        for base, got in _markers(files).items():
            if got is None:
                continue
            end, marker = got
            key = pdir / segment_file_name(base, "")
            owned.add(marker)
            owned.update(_segment_names(base, end))
            with self._meta:
                self._marker_of[key] = marker
            if key not in self._held[root]:
                self._hold(root, key, self._bytes(key, end))
            out.append(StagedSegment(tp, base, end, pdir))
        orphans = sorted(n for n in files if n not in owned and _STAGED_FILE.fullmatch(n))
        if orphans:
            log.info("incomplete staged segments removed (staged again if still local)", extra={
                "partition": str(tp), "files": orphans, "directory": str(pdir)})
            # markers first: a crash midway leaves no marker naming files that are gone
            _unlink_names(pdir, sorted(orphans, key=lambda n: COMPLETE not in n))
            with self._meta:
                for key in {pdir / n[:20] for n in orphans} - {pdir / n[:20] for n in owned}:
                    self._held[root].pop(key, None)
                    self._verified.pop(key, None)
                    self._linked.pop(key, None)
                    self._marker_of.pop(key, None)
        out.sort(key=lambda s: s.base_offset)
        return out

    def size_bytes(self) -> int:
        """Bytes under every staging root (markers aside), walked afresh (the metric)."""
        total = 0
        for root in self._roots.values():
            for dirpath, _, files in os.walk(root):
                for f in files:
                    if COMPLETE in f:
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
            held = [(h, d, n, self._verified.get(d)) for h in self._held.values() for d, n in h.items()]
        total = 0
        for h, d, n, known in held:
            if n is None:
                n = self._segment_bytes(d, known[0] if known is not None else None)
                with self._meta:
                    if d in h and h[d] is None:  # (not released, nor relinked, meanwhile)
                        h[d] = n
            total += n
        return total

    def _bytes(self, key: Path, end: int) -> int | None:
        """What a staged segment holds, for the bound; None when unbounded (not counted: a stat per file, per segment
        staged; :meth:`held_bytes` counts those when asked)."""
        return self._segment_bytes(key, end) if self.max_bytes else None

    def _segment_bytes(self, key: Path, end: int | None) -> int:
        """The bytes of the staged segment of ``key`` (markers aside; ``end`` None: its producer snapshot too)."""
        if key in self._legacy:
            return _dir_bytes(key)
        base = int(key.name)
        linked = self._linked.get(key)
        if end is not None and linked is not None:  # (what this process linked: no stat of a name it never made)
            names = [segment_file_name(base, ".log"), *list(linked), segment_file_name(base, TXN_UPLOAD_SUFFIX)]
        else:
            names = _segment_names(base, end) if end is not None else [
                segment_file_name(base, s) for s in (*SEGMENT_SUFFIXES, TXN_UPLOAD_SUFFIX)]
        d = str(key.parent)  # (paths joined as strings: the gauge counts every segment staged, issue 26)
        return sum(st.st_size for n in names if (st := _stat(f"{d}/{n}")) is not None)
