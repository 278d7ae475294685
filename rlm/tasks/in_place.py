"""A rolled segment copied in place from the broker's partition dir, without staging it first (issue 26).

Staging (:mod:`rlm.tasks.staging`) hard-links a rolled segment's files so that the broker's local retention cannot
take them away before the copy: five links, a marker, an fsync of the partition's staging dir, and as many unlinks
at its release, 0.6-0.75 ms of CPU a segment in a burst of 2,000 partitions rolling at once (``bench_scale``,
session 17), a fifth of the sidecar's CPU per segment. Most of those segments are copied seconds after they roll.

**When staging may wait.** Kafka never unlinks a segment's files at once: retention (and a log start offset moved)
renames them to ``*.deleted`` and unlinks them ``file.delete.delay.ms`` later (the topic's config; the broker's
``log.segment.delete.delay.ms``, 60 s by default). Staging links from the ``.deleted`` names too. So while that delay
is long against the stage job's interval, a segment seen rolled may be left in place for a while: the copy run that
copies it opens its files itself, and the stage job stages it
(:meth:`PartitionCopier.stage_rolled <rlm.tasks.copier.PartitionCopier.stage_rolled>`)

- at once when its ``.log`` is no longer live (retention renamed it: the log-dir watcher reports the rename as it
  reports a roll, and the stage job's next round links it), or when the delay is unknown or short
  (:func:`staging_deferral_s` None: staging as before; the sidecar reads the delay at each full discovery round,
  and again at each discovery round while segments wait, so one lowered at runtime counts within a round);
- otherwise once it has waited :func:`staging_deferral_s` (half the delay) since a stage round or copy run first saw
  it uncopied.

A roll staged at once is lost if the broker unlinks it before the stage job's next round: retention renaming it at
once and the stage job not running within the delay. A segment left waiting is lost on the same condition, counted
from retention's rename instead of the roll. The second rule bounds what waits unstaged while nothing else happens:
what a sidecar that is down longer than the delay (and so sees no rename) can lose is what waited at its stop, the
segments of the last half delay, as it can lose the rolls of its downtime; a copy held back for long (an open
transaction, a slow store) has its segments staged as before. The delay must be at least
:data:`DEFERRAL_MIN_INTERVALS` stage intervals.

**How a copy holds it.** :meth:`InPlaceSegment.open` opens every file of the segment the copy reads (the ``.log``,
its offset and time indexes, its ``.txnindex`` and the producer snapshot named by the next base, when the broker has
them), each under its live name or, when retention renamed it meanwhile, its ``.deleted`` one; the copy then reads
them through ``/proc/self/fd/<fd>``, which names the open file whatever happens to its names (on Linux an open file
stays readable after its unlink). Anything less plain (the ``.log`` already ``.deleted``, a ``.deleted`` beside a
live one of the same base, an index the broker did not write, a file gone between the listing and its opening) is
not copied in place: the copier stages it as before, and staging judges it (its rebuilt indexes, its generation
checks, its gap reports).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from rlmm.api import TopicIdPartition
from rsm.log.partition import DELETED_SUFFIX, SNAPSHOT_SUFFIX, segment_file_name

__all__ = ["DEFERRAL_MIN_INTERVALS", "InPlaceSegment", "LocalRange", "live_log", "staging_deferral_s"]

DEFERRAL_MIN_INTERVALS = 4
"""Staging waits only where ``file.delete.delay.ms`` is at least this many stage intervals: half of it, the longest
a segment waits unstaged, then leaves two intervals or more for a stage job that runs late."""

_FD_DIR = "/proc/self/fd"
_HAS_FD_DIR = os.path.isdir(_FD_DIR)  # (asked for every led partition at each stage round: looked at once)


def staging_deferral_s(file_delete_delay_ms: int | None, stage_interval_ms: int) -> float | None:
    """How long a rolled segment may wait unstaged, in seconds: half of ``file_delete_delay_ms``; None (stage at
    once) when the delay is unknown, shorter than :data:`DEFERRAL_MIN_INTERVALS` stage intervals, or this system
    has no ``/proc/self/fd`` to read an open file through."""
    if file_delete_delay_ms is None or file_delete_delay_ms < DEFERRAL_MIN_INTERVALS * stage_interval_ms \
            or not _HAS_FD_DIR:
        return None
    return file_delete_delay_ms / 2000


def live_log(base_offset: int, names: Collection[str]) -> bool:
    """Whether the segment's ``.log`` is live in the partition dir's listing ``names`` with no ``.log.deleted`` of
    the same base beside it (a generation truncated away: staging tells the two apart)."""
    log_name = segment_file_name(base_offset, ".log")
    return log_name in names and f"{log_name}{DELETED_SUFFIX}" not in names


@dataclass(frozen=True, slots=True)
class LocalRange:
    """A rolled segment left unstaged in its partition dir (its ``.log`` :func:`live_log` when listed), opened at its
    copy (:meth:`InPlaceSegment.open`)."""

    tp: TopicIdPartition
    base_offset: int
    end_offset_inclusive: int
    partition_dir: Path

    @property
    def log_path(self) -> Path:
        """The broker's live ``.log`` (its size for the lag gauges; the copy reads the file it opens)."""
        return self.partition_dir / segment_file_name(self.base_offset, ".log")


class InPlaceSegment:
    """A rolled segment's files held open for its copy, as paths through ``/proc/self/fd`` (see the module doc), the
    way :class:`rlm.tasks.staging.StagedSegment` gives its staged ones. :meth:`close` once the copy is over."""

    def __init__(self, tp: TopicIdPartition, base_offset: int, end_offset_inclusive: int, fds: dict[str, int]) -> None:
        self.tp = tp
        self.base_offset = base_offset
        self.end_offset_inclusive = end_offset_inclusive
        self._fds = fds  # suffix (".log", ".index", ".timeindex", ".txnindex", ".snapshot") -> fd

    @classmethod
    def open(cls, r: LocalRange, names: Collection[str]) -> InPlaceSegment | None:
        """Open ``r``'s files (``names``: the partition dir's listing, which showed its ``.log`` live); None when it
        is not that plain (see the module doc): the caller stages it."""
        base, pdir = r.base_offset, r.partition_dir
        if not live_log(base, names):
            return None
        wanted = [(s, segment_file_name(base, s), True) for s in (".log", ".index", ".timeindex")]
        wanted.append((".txnindex", segment_file_name(base, ".txnindex"), False))
        wanted.append((SNAPSHOT_SUFFIX, segment_file_name(r.end_offset_inclusive + 1, SNAPSHOT_SUFFIX), False))
        fds: dict[str, int] = {}
        deleted_first = False  # the .log was renamed since the listing: its other files are looked for .deleted first
        done = False
        try:
            for suffix, name, required in wanted:
                if name not in names and f"{name}{DELETED_SUFFIX}" not in names:
                    if required:
                        return None  # an index the broker did not write: staging rebuilds it
                    continue
                live, deleted = f"{pdir}/{name}", f"{pdir}/{name}{DELETED_SUFFIX}"
                fd = None
                for path in (deleted, live) if deleted_first else (live, deleted):
                    try:
                        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                    except FileNotFoundError:
                        continue
                    deleted_first |= suffix == ".log" and path == deleted
                    break
                if fd is None:
                    return None  # listed, gone under both names since: staging judges what is left
                fds[suffix] = fd
            done = True
            return cls(r.tp, base, r.end_offset_inclusive, fds)
        finally:
            if not done:
                _close(fds.values())

    @property
    def log_path(self) -> Path:
        return self.path(".log")

    def path(self, suffix: str) -> Path:
        """The open file of ``suffix`` (``.log``, ``.index``, ``.timeindex``; KeyError for one it has not)."""
        return Path(f"{_FD_DIR}/{self._fds[suffix]}")

    def file(self, suffix: str) -> Path | None:
        """The open file of ``suffix``, or None when the segment has none (``.txnindex``; ``.snapshot``: the producer
        snapshot named by the next base)."""
        fd = self._fds.get(suffix)
        return None if fd is None else Path(f"{_FD_DIR}/{fd}")

    def write_txn_upload(self, data: bytes) -> Path:
        """The transaction index to upload with the segment (the copier's), in an anonymous file held with the
        others: nothing is written into the broker's dir, nothing is left to remove."""
        fd = os.memfd_create(segment_file_name(self.base_offset, ".txnindex.upload"), os.MFD_CLOEXEC)
        self._fds[".txnindex.upload"] = fd
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        return Path(f"{_FD_DIR}/{fd}")

    def close(self) -> None:
        """Close every file held (idempotent)."""
        fds, self._fds = list(self._fds.values()), {}
        _close(fds)


def _close(fds: Iterable[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass
