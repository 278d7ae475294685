"""Which partition directories of the broker's log dirs changed: filesystem notifications, a slow rescan behind them.

A broker with thousands of partitions rolls a segment of one of them now and then; listing every partition directory
every few seconds to find those rolls cost most of the sidecar's idle CPU (``bench/bench_scale.py``).
:class:`LogDirWatcher` asks the kernel instead (Linux inotify, through ``inotify_simple``: a thin ctypes wrapper over
the three system calls, no thread and no callbacks of its own, so the sidecar reads the events when it wants them,
sees the queue's overflow as the event it is, and costs nothing between reads):

- each log dir is watched for partition directories created, moved in, deleted or moved out (a topic's deletion
  renames ``<topic>-<partition>`` to ``...-delete``; a move between log dirs renames ``...-future`` to it);
- each partition directory is watched for entries created, moved in or out, or deleted: a roll creates the new
  segment's ``.log``, retention renames segments to ``.deleted`` and removes them, the broker rewrites
  ``leader-epoch-checkpoint`` and ``partition.metadata`` by a rename. Appends (``IN_MODIFY``) are not watched: they
  are every produce request, and say nothing of rolls.

What the events can miss, the watcher finds by listing:

- a partition directory created just before its watch was added (the roll happened in between): a directory is
  reported changed when its watch is added, so the caller looks at it once;
- the kernel's event queue overflowed (``fs.inotify.max_queued_events``; ``IN_Q_OVERFLOW``): a full rescan at once;
- a watch that could not be added (``fs.inotify.max_user_watches`` reached, inotify unavailable): that directory is
  listed at every :meth:`LogDirWatcher.changes` call instead, as before the watcher (a warning says which limit to
  raise);
- anything else (a bug, a filesystem without inotify): a full rescan every ``rescan_interval_s``, which compares
  each partition directory's entry names with the last listing and reports those that differ.

A rescan is one ``listdir`` per partition directory: about 20 ms per 1,000 partitions.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rlm.discovery import partition_key

__all__ = ["Changes", "LogDirWatcher"]

log = logging.getLogger(__name__)

try:  # Linux only; elsewhere every directory is listed (as before the watcher)
    from inotify_simple import INotify
    from inotify_simple import flags as _f

    _DIR_EVENTS = _f.CREATE | _f.DELETE | _f.MOVED_FROM | _f.MOVED_TO | _f.ONLYDIR
    _LOG_DIR_EVENTS = _DIR_EVENTS | _f.DELETE_SELF | _f.MOVE_SELF
    _GONE = _f.DELETE | _f.MOVED_FROM
    _OVERFLOW = int(_f.Q_OVERFLOW)
    _IGNORED = int(_f.IGNORED)
    _SELF_GONE = int(_f.DELETE_SELF | _f.MOVE_SELF)
except ImportError:  # pragma: no cover - not on Linux
    INotify = None  # type: ignore[assignment,misc]


@dataclass(frozen=True, slots=True)
class Changes:
    """What changed since the last :meth:`LogDirWatcher.changes`.

    ``partitions``: partition directories whose entries changed (or that appeared, or whose watch is new): the
    caller looks at each once. ``layout``: a partition directory appeared in or left a log dir (a topic created,
    deleted or re-created, a replica moved), or a log dir itself came or went. ``rescanned``: this call listed every
    directory (the interval passed, the queue overflowed, or the first call). ``listings``: the entry names of those
    of ``partitions`` that this call listed (after reading the events: a change after the listing is reported by the
    next call), for the caller's look, so it need not list them again (the stage job: issue 26); a directory that
    could not be listed (gone) is not in it."""

    partitions: frozenset[Path] = field(default_factory=frozenset)
    layout: bool = False
    rescanned: bool = False
    listings: Mapping[Path, frozenset[str]] = field(default_factory=dict)


class LogDirWatcher:
    """The partition directories of ``log_dirs`` that changed, from inotify events and a rescan every
    ``rescan_interval_s`` (see the module doc). Thread-safe; :meth:`close` releases the inotify descriptor.

    ``use_inotify=False`` lists every directory at every call (the behaviour where inotify is unavailable).
    """

    def __init__(self, log_dirs: Iterable[Path], *, rescan_interval_s: float, use_inotify: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log_dirs = [Path(d) for d in log_dirs]
        self.rescan_interval_s = rescan_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._inotify = None
        if use_inotify and INotify is not None:
            try:
                self._inotify = INotify(nonblocking=True)
            except OSError as err:  # fs.inotify.max_user_instances reached
                log.warning("inotify unavailable: every partition directory is listed each round instead (raise "
                            "fs.inotify.max_user_instances)", extra={"error": str(err)})
        self._wd_log_dir: dict[int, Path] = {}
        self._wd_partition: dict[int, Path] = {}
        self._watch_of: dict[Path, int] = {}  # a watched directory -> its watch descriptor
        self._unwatched: set[Path] = set()  # partition directories whose watch could not be added: listed each call
        self._names: dict[Path, frozenset[str]] = {}  # partition directory -> its entry names at the last listing
        self._last_rescan: float | None = None
        self._pending: set[Path] = set()  # changed since the last changes()
        self._pending_layout = False
        self._pending_rescanned = False
        self._warned_watches = False
        self.layout_version = 0
        """Bumped whenever a partition directory appears in or leaves a log dir (read after :meth:`changes`)."""
        self.rescans = 0
        """Full rescans done (the first call's included): for tests and metrics."""

    # ------------------------------------------------------------------------------------------------ public
    def poll(self) -> int:
        """Read the pending events (and rescan when due), keeping what changed for :meth:`changes`; return
        :attr:`layout_version`."""
        with self._lock:
            self._poll()
            return self.layout_version

    def changes(self) -> Changes:
        """The partition directories changed since the last call (see :class:`Changes`). Reads the pending events
        without waiting; lists every directory when a rescan is due, the event queue overflowed or a log dir that
        was missing is there now."""
        with self._lock:
            self._poll()
            listings: dict[Path, frozenset[str]] = {}
            for pdir in self._pending:  # the caller looks now: the next rescan compares with what it sees
                if pdir in self._names:
                    names = _listing(pdir)
                    self._names[pdir] = frozenset() if names is None else names
                    if names is not None:
                        listings[pdir] = names
            out = Changes(frozenset(self._pending), self._pending_layout, self._pending_rescanned, listings)
            self._pending = set()
            self._pending_layout = self._pending_rescanned = False
            return out

    def close(self) -> None:
        with self._lock:
            if self._inotify is not None:
                self._inotify.close()
                self._inotify = None

    @property
    def watched(self) -> int:
        """Directories watched now (log dirs and partition directories)."""
        return len(self._watch_of)

    # -------------------------------------------------------------------------------------------- internals
    def _poll(self) -> None:
        layout = self._drain(self._pending)
        now = self._clock()
        rescan = (layout is None or self._last_rescan is None or now - self._last_rescan >= self.rescan_interval_s
                  or any(d not in self._watch_of and d.is_dir() for d in self.log_dirs))
        if rescan:
            layout = self._rescan(self._pending) or bool(layout)
            self._last_rescan = now
            self.rescans += 1
            self._pending_rescanned = True
        else:
            for pdir in list(self._unwatched):
                self._relist(pdir, self._pending)
        if layout:
            self.layout_version += 1
            self._pending_layout = True

    def _drain(self, changed: set[Path]) -> bool | None:
        """Read the pending events into ``changed``; True when the layout changed, None when the queue overflowed
        (a rescan must follow)."""
        if self._inotify is None:
            return False
        layout = False
        wd_partition = self._wd_partition
        for wd, mask, raw_name in _events(self._inotify.fileno()):
            if wd == -1:
                if mask & _OVERFLOW:
                    log.warning("inotify event queue overflowed: rescanning every partition directory (raise "
                                "fs.inotify.max_queued_events if this repeats)")
                    return None
                continue
            if mask & _IGNORED:  # the watch is gone (its directory removed, or rm_watch)
                self._forget_wd(wd)
                continue
            pdir = wd_partition.get(wd)
            if pdir is not None:  # (the entry's name does not matter: the directory changed)
                changed.add(pdir)
                continue
            log_dir = self._wd_log_dir.get(wd)
            if log_dir is None:
                continue  # a watch removed meanwhile
            if mask & _SELF_GONE:
                layout = True
                self._unwatch(log_dir)
                continue
            name = os.fsdecode(raw_name.split(b"\0", 1)[0])
            if partition_key(name) is None:
                continue  # a checkpoint file, a -future, -delete or -stray directory
            pdir = log_dir / name
            layout = True
            if mask & _GONE:
                self._unwatch(pdir)
                self._names.pop(pdir, None)
                self._unwatched.discard(pdir)
            else:
                self._watch_partition(pdir, changed)
        return layout

    def _rescan(self, changed: set[Path]) -> bool:
        """List every log dir and partition directory: (re)add missing watches, report directories whose entries
        differ from the last listing. True when the set of partition directories changed."""
        seen: set[Path] = set()
        new = False
        for log_dir in self.log_dirs:
            if log_dir not in self._watch_of:
                self._add_watch(log_dir, _LOG_DIR_EVENTS if self._inotify is not None else 0, self._wd_log_dir)
            try:
                entries = os.listdir(log_dir)
            except OSError:
                continue  # missing or unreadable: /health's log_dirs says so
            for name in entries:
                pdir = log_dir / name
                if partition_key(name) is None or not pdir.is_dir():
                    continue
                seen.add(pdir)
                new = new or pdir not in self._names
                if pdir not in self._watch_of and pdir not in self._unwatched:
                    self._watch_partition(pdir, changed)
                else:
                    self._relist(pdir, changed)
        gone = set(self._names) - seen
        for pdir in gone:
            self._unwatch(pdir)
            self._names.pop(pdir, None)
            self._unwatched.discard(pdir)
        return bool(gone) or new

    def _relist(self, pdir: Path, changed: set[Path]) -> None:
        names = _names(pdir)
        if self._names.get(pdir) != names:
            changed.add(pdir)
            self._names[pdir] = names

    def _watch_partition(self, pdir: Path, changed: set[Path]) -> None:
        """Watch ``pdir`` and report it changed (what happened before the watch is seen by the caller's look)."""
        changed.add(pdir)
        if self._inotify is None or not self._add_watch(pdir, _DIR_EVENTS, self._wd_partition):
            self._unwatched.add(pdir)
        self._names.setdefault(pdir, frozenset())

    def _add_watch(self, path: Path, mask: int, into: dict[int, Path]) -> bool:
        if self._inotify is None:
            return False
        try:
            wd = self._inotify.add_watch(path, mask)
        except OSError as err:
            if err.errno == errno.ENOSPC and not self._warned_watches:
                self._warned_watches = True
                log.warning("inotify watches exhausted: the partition directories not watched are listed each "
                            "round instead (raise fs.inotify.max_user_watches)", extra={"path": str(path)})
            return False  # ENOENT / ENOTDIR: gone already, the next rescan says
        into[wd] = path
        self._watch_of[path] = wd
        return True

    def _unwatch(self, path: Path) -> None:
        wd = self._watch_of.pop(path, None)
        if wd is None:
            return
        self._wd_partition.pop(wd, None)
        self._wd_log_dir.pop(wd, None)
        if self._inotify is not None:
            try:
                self._inotify.rm_watch(wd)  # a directory moved away keeps its watch: drop it
            except OSError:
                pass  # removed with its directory already

    def _forget_wd(self, wd: int) -> None:
        path = self._wd_partition.pop(wd, None) or self._wd_log_dir.pop(wd, None)
        if path is not None and self._watch_of.get(path) == wd:
            del self._watch_of[path]


_EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len (of the name that follows)
_READ_BYTES = 64 * 1024  # events read at a time (the largest is 16 bytes and a name of at most 256)


def _events(fd: int) -> Iterator[tuple[int, int, bytes]]:
    """The events waiting on the nonblocking inotify descriptor ``fd``, without waiting: (watch descriptor, mask,
    the name's bytes, NUL-padded). Not ``INotify.read``: it decodes every event's name into an ``Event``, and a roll
    makes about ten events in a partition directory, where the name does not matter (issue 26)."""
    unpack = _EVENT.unpack_from
    while True:
        try:
            data = os.read(fd, _READ_BYTES)
        except BlockingIOError:
            return
        if not data:
            return
        pos, end = 0, len(data)
        while pos < end:
            wd, mask, _cookie, size = unpack(data, pos)
            pos += _EVENT.size + size
            yield wd, mask, data[pos - size:pos]


def _names(pdir: Path) -> frozenset[str]:
    names = _listing(pdir)
    return frozenset() if names is None else names


def _listing(pdir: Path) -> frozenset[str] | None:
    """``pdir``'s entry names; None when it cannot be listed (gone)."""
    try:
        return frozenset(os.listdir(pdir))
    except OSError:
        return None
