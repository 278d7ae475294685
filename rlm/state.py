"""The sidecar's state dir (``metadata.state_dir``): what it holds, under which names, in which format versions, and
the one way a state file is replaced.

Layout::

    <state_dir>/
        metadata-cache/             RocksDB cache of the metadata topic: the sidecar's (its format is rlmm's)
        cli-metadata-cache/         the operator commands' cache, kept between runs (a live sidecar locks its own)
        history-metadata-cache/     the history endpoint's cache
        recover-metadata-cache-*/   ``rlm recover``'s cache, a temporary dir removed when it ends
        known-partitions.json       the partitions served, so a topic deleted meanwhile is purged after a restart
        gc-orphans.json             garbage collection's first sightings and the key layouts it visits
        copied/<topic id>-<partition>   a partition's copy watermark: ``<offset> <leader epoch> <CRC-32>`` (64 bytes)

**Format versions.** A JSON state file of version 2 or later is an object with an integer ``"version"``; anything
else is version 1 (both version-1 formats predate the key: ``known-partitions.json`` a bare list of
``[topic id, topic, partition]``, ``gc-orphans.json`` a flat map of key bases). :func:`read_json` checks the version
against what this rlm reads and raises :class:`StateFormatError`, naming the file and what to do, for any other (a
newer rlm wrote it) and for a file that is not JSON. The copy watermarks are plain text and not versioned: one that
cannot be read is ignored with a warning (the metadata is the truth; the watermark only saves copying again what
remote retention already expired).

**Durable replace.** :func:`write_file_durably`: temp file, fsync, rename over, fsync of the directory. After a
crash at any step the file holds the old bytes or the new ones, never a part.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rlm.errors import RlmError
from rlmm.api import TopicIdPartition

__all__ = ["COPY_WATERMARKS", "GC_ORPHANS", "KNOWN_PARTITIONS", "RECOVER_CACHE_PREFIX", "MetadataCacheUser",
           "StateDir", "StateFile", "StateFormatError", "fsync_dir", "malformed", "read_json", "write_file_durably"]


class StateFormatError(RlmError, ValueError):
    """A state file is not in a format this rlm reads: not JSON, or a format version it does not know (written by a
    newer rlm). The message names the file, the version found and the ones read, and what removing the file loses:
    run the rlm that wrote it, or move the file away."""


@dataclass(frozen=True, slots=True)
class StateFile:
    """A JSON file in the state dir: its name, the format version written, the versions read."""

    name: str
    version: int  # written
    reads: tuple[int, ...]  # read (``version`` among them)
    if_removed: str  # what moving the file away loses, for the error message

    def version_of(self, document: Any) -> Any:
        """The document's format version: its ``"version"`` (2 and later), else 1 (see the module doc)."""
        return document["version"] if isinstance(document, dict) and "version" in document else 1


KNOWN_PARTITIONS = StateFile(
    "known-partitions.json", version=1, reads=(1,),
    if_removed="the partitions served before are forgotten: a topic deleted while the sidecar was down is not purged")
GC_ORPHANS = StateFile(
    "gc-orphans.json", version=3, reads=(1, 2, 3),  # 3: layouts carry their key root; 2: layouts without one
    if_removed="orphans seen so far start their grace again, and key layouts no segment names any more are "
               "not visited")

MetadataCacheUser = Literal["sidecar", "cli", "history"]
"""Which process a metadata cache is for: RocksDB locks a cache to one process, so each has its own."""

_METADATA_CACHES: dict[str, str] = {"sidecar": "metadata-cache", "cli": "cli-metadata-cache",
                                    "history": "history-metadata-cache"}
RECOVER_CACHE_PREFIX = "recover-metadata-cache-"
COPY_WATERMARKS = "copied"


@dataclass(frozen=True, slots=True)
class StateDir:
    """The paths in a state dir (``metadata.state_dir``)."""

    root: Path

    def metadata_cache(self, user: MetadataCacheUser = "sidecar") -> Path:
        return self.root / _METADATA_CACHES[user]

    def new_recover_cache(self) -> Path:
        """A new, empty ``recover-metadata-cache-*`` dir (the caller removes it)."""
        return Path(tempfile.mkdtemp(prefix=RECOVER_CACHE_PREFIX, dir=self.root))

    @property
    def known_partitions(self) -> Path:
        return self.root / KNOWN_PARTITIONS.name

    @property
    def gc_orphans(self) -> Path:
        return self.root / GC_ORPHANS.name

    def copy_watermark(self, tp: TopicIdPartition) -> Path:
        return self.root / COPY_WATERMARKS / f"{tp.topic_id}-{tp.partition}"


def malformed(path: Path, fmt: StateFile, problem: str) -> StateFormatError:
    """The error for a file at ``path`` that is not in ``fmt``'s format (``problem`` says how)."""
    return StateFormatError(f"{path}: not a {fmt.name} state file ({problem}): move it away if it is not one "
                            f"({fmt.if_removed})")


def read_json(path: Path, fmt: StateFile) -> tuple[int, Any] | None:
    """``(format version, document)`` of the state file at ``path``, or None when it is missing or empty. Raises
    :class:`StateFormatError` when it is not JSON or of a version ``fmt`` does not read."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as err:
        raise malformed(path, fmt, str(err)) from err
    if not text.strip():
        return None
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise malformed(path, fmt, str(err)) from err
    version = fmt.version_of(document)
    if type(version) is not int or version not in fmt.reads:
        readable = ", ".join(map(str, fmt.reads))
        raise StateFormatError(
            f"{path}: format version {version!r}, this rlm reads version {readable}: a newer rlm wrote it. Run that "
            f"version, or move the file away ({fmt.if_removed})")
    return version, document


def fsync_dir(path: Path) -> None:
    """fsync a directory, so the names created, renamed or removed in it survive a crash."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_durably(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: temp file, fsync, rename over, fsync of the directory (which must exist).
    After a crash the file holds the old bytes or the new ones, never a part, and once this returns the new ones
    stay. A failure before the rename leaves the old file and no temp file. Callers serialize writes of one path
    (the temp file's name is fixed: a crash's leftover is overwritten by the next write, and never read)."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
