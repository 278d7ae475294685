"""Hard-link staging: keep a rolled segment's bytes alive until it is copied.

The broker's local retention may delete a rolled segment at any moment (it renames the files to
``*.deleted`` and unlinks them about a minute later). As soon as the sidecar sees a rolled segment it
hard-links the segment's files into a staging directory on the same filesystem: the broker's unlink then only
drops its own name, the inode lives on under ours until the copy is done and :meth:`Staging.release` runs.

Layout: ``<staging root>/<topic>-<partition>/<20-digit base offset>/`` holding links named as the originals
(``00000000000000000042.log``, ``.index``, ``.timeindex``, ``.txnindex``, ``.snapshot``).

The staging root must not be inside a Kafka log dir (the broker refuses unknown directories there) and must be
on the same filesystem as the log dir (hard links cannot cross filesystems): :func:`default_staging_root` picks a
sibling of the log dir and :class:`Staging` checks the device at start.
"""

from __future__ import annotations

import errno
import os
import shutil
import threading
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SegmentGoneError", "StagedSegment", "Staging", "StagingError", "default_staging_root"]

# The suffixes of a segment's files, in the order they are linked. ``.log`` first: without it nothing is staged.
SEGMENT_SUFFIXES = (".log", ".index", ".timeindex", ".txnindex", ".snapshot")
DELETED_SUFFIX = ".deleted"


class StagingError(RuntimeError):
    """The staging area is unusable (wrong filesystem, permissions); the message names the directories."""


class SegmentGoneError(StagingError):
    """The broker deleted the segment's ``.log`` before it could be staged: a gap the caller must count and log."""


@dataclass(frozen=True, slots=True)
class StagedSegment:
    topic: str
    partition: int
    base_offset: int
    end_offset_inclusive: int  # the next segment's base offset - 1, known when it was staged (rolled)
    directory: Path

    def file(self, suffix: str) -> Path | None:
        """The staged file with this suffix (``.log``, ``.index`` ...), or None if the segment had none."""
        p = self.directory / f"{self.base_offset:020d}{suffix}"
        return p if p.exists() else None

    @property
    def log_path(self) -> Path:
        return self.directory / f"{self.base_offset:020d}.log"


def default_staging_root(log_dir: Path) -> Path:
    """``<parent of log dir>/.rlm-staging/<log dir name>``: same filesystem as long as the log dir is no mount."""
    log_dir = Path(log_dir).resolve()
    return log_dir.parent / ".rlm-staging" / log_dir.name


class Staging:
    """Staging areas, one per broker log dir."""

    def __init__(self, roots: dict[Path, Path]) -> None:
        self._roots: dict[Path, Path] = {}
        # stage(), release() and staged() of different partitions run on different copy threads: staged() must
        # not take a segment being staged right now for one a crash left half-done (and remove it).
        self._lock = threading.RLock()
        for log_dir, root in roots.items():
            log_dir, root = Path(log_dir).resolve(), Path(root).resolve()
            if root == log_dir or log_dir in root.parents:
                raise StagingError(f"staging dir {root} is inside log dir {log_dir}: the broker would refuse it")
            root.mkdir(parents=True, exist_ok=True)
            if log_dir.exists() and os.stat(root).st_dev != os.stat(log_dir).st_dev:
                raise StagingError(f"staging dir {root} is not on the filesystem of log dir {log_dir}: "
                                   "hard links cannot cross filesystems; set staging_dir to a directory on it")
            self._roots[log_dir] = root

    def root_for(self, partition_dir: Path) -> Path:
        log_dir = Path(partition_dir).resolve().parent
        try:
            return self._roots[log_dir]
        except KeyError:
            raise StagingError(f"{partition_dir} is in no configured log dir ({sorted(map(str, self._roots))})") \
                from None

    def stage(self, topic: str, partition: int, partition_dir: Path, base_offset: int,
              end_offset_inclusive: int) -> StagedSegment:
        """Hard-link the segment's files into staging; idempotent (an already staged segment is returned as is).

        ``end_offset_inclusive`` (the next segment's base offset - 1) is kept with the links, so a staged segment
        can be copied after the broker deleted it and its successor.

        Raises :class:`SegmentGoneError` when neither ``<base>.log`` nor ``<base>.log.deleted`` exists any more.
        """
        with self._lock:
            return self._stage(topic, partition, partition_dir, base_offset, end_offset_inclusive)

    def _stage(self, topic: str, partition: int, partition_dir: Path, base_offset: int,
               end_offset_inclusive: int) -> StagedSegment:
        target = self.root_for(partition_dir) / f"{topic}-{partition}" / f"{base_offset:020d}"
        staged = StagedSegment(topic, partition, base_offset, end_offset_inclusive, target)
        if staged.log_path.exists() and (target / ".complete").exists():
            return staged
        target.mkdir(parents=True, exist_ok=True)
        stem = f"{base_offset:020d}"
        for suffix in SEGMENT_SUFFIXES:
            dest = target / f"{stem}{suffix}"
            if dest.exists():
                continue
            linked = False
            for name in (f"{stem}{suffix}", f"{stem}{suffix}{DELETED_SUFFIX}"):
                try:
                    os.link(partition_dir / name, dest)
                    linked = True
                    break
                except FileNotFoundError:
                    continue
                except OSError as err:
                    if err.errno == errno.EXDEV:
                        raise StagingError(f"cannot hard-link {partition_dir / name} into {target}: "
                                           "different filesystems") from err
                    raise
            if not linked and suffix == ".log":
                shutil.rmtree(target, ignore_errors=True)
                raise SegmentGoneError(f"{partition_dir}/{stem}.log vanished before it was staged")
        (target / ".complete").write_text(str(end_offset_inclusive))
        return staged

    def release(self, staged: StagedSegment) -> None:
        """Drop the staged links (after a successful copy, or when the segment is known remote)."""
        with self._lock:
            self._release(staged)

    def _release(self, staged: StagedSegment) -> None:
        shutil.rmtree(staged.directory, ignore_errors=True)
        try:
            staged.directory.parent.rmdir()  # the partition dir, if this was its last staged segment
        except OSError:
            pass

    def staged(self) -> list[StagedSegment]:
        """Every complete staged segment (e.g. left over by a crash), oldest first per partition."""
        with self._lock:
            return self._staged()

    def _staged(self) -> list[StagedSegment]:
        out = []
        for root in self._roots.values():
            for pdir in sorted(root.iterdir()) if root.exists() else []:
                topic, _, part = pdir.name.rpartition("-")
                if not part.isdigit():
                    continue
                for seg in sorted(pdir.iterdir()):
                    marker = seg / ".complete"
                    if seg.name.isdigit() and marker.exists():
                        end = int(marker.read_text() or -1)
                        out.append(StagedSegment(topic, int(part), int(seg.name), end, seg))
                    elif seg.name.isdigit():
                        shutil.rmtree(seg, ignore_errors=True)  # a stage interrupted half-way: redo later
        return out

    def size_bytes(self) -> int:
        total = 0
        for root in self._roots.values():
            for dirpath, _, files in os.walk(root):
                for f in files:
                    if f == ".complete":
                        continue
                    try:
                        total += os.stat(os.path.join(dirpath, f)).st_size
                    except FileNotFoundError:
                        pass
        return total
