"""A partition directory ``<topic>-<partition>`` of a broker's log dir, and the segments in it.

Files of a segment are named by its 20-digit zero-padded base offset: ``.log``, ``.index``, ``.timeindex``,
``.txnindex`` (only when it has aborted transactions), ``.snapshot`` (producer state, not for every segment).
Files being deleted or compacted (``.deleted``, ``.cleaned``, ``.swap`` suffixes) are ignored by
:meth:`PartitionDir.segments`; :meth:`PartitionDir.rolled_ranges` also counts ``.log.deleted`` files below the
first live segment: retention renames a segment's files to ``*.deleted`` and removes them
``log.segment.delete.delay.ms`` later (60 s by default), and a hard link taken in between still saves the bytes
(truncation leftovers, above the first live segment, are not counted: see :meth:`PartitionDir.rolled_ranges`).
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from rsm.log.checkpoint import EpochEntry, read_leader_epoch_checkpoint, read_partition_metadata
from rsm.log.errors import LogFormatError

__all__ = ["DELETED_SUFFIX", "LEADER_EPOCH_CHECKPOINT", "PARTITION_METADATA", "SEGMENT_SUFFIXES", "SNAPSHOT_SUFFIX",
           "PartitionDir", "Segment", "parse_partition_dir_name", "parse_segment_stem", "partition_dir_name",
           "segment_file_name"]

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
PARTITION_METADATA = "partition.metadata"
_LOG_NAME = re.compile(r"^(\d{20})\.log$")
_DELETED_LOG_NAME = re.compile(r"^(\d{20})\.log\.deleted$")
_DIR_NAME = re.compile(r"^(?P<topic>.+)-(?P<partition>\d+)$")
_STEM = re.compile(r"^\d{20}$")
# A segment's own files, ``.log`` first (the segment itself; the others go with it). The producer snapshot is
# named by an offset of its own (``<base>.snapshot``: the state before the segment's first offset).
SEGMENT_SUFFIXES = (".log", ".index", ".timeindex", ".txnindex")
SNAPSHOT_SUFFIX = ".snapshot"
DELETED_SUFFIX = ".deleted"  # appended by the broker to the files of a segment it is about to remove


def segment_file_name(base_offset: int, suffix: str) -> str:
    """``00000000000000000042.log`` for ``(42, ".log")``; the bare 20-digit stem for ``(42, "")``."""
    return f"{base_offset:020d}{suffix}"


def parse_segment_stem(name: str) -> int | None:
    """The offset of a bare 20-digit stem (``segment_file_name(offset, "")``), or None for any other name."""
    return int(name) if _STEM.match(name) else None


def partition_dir_name(topic: str, partition: int) -> str:
    """``<topic>-<partition>``, the name of a partition directory."""
    return f"{topic}-{partition}"


def parse_partition_dir_name(name: str) -> tuple[str, int] | None:
    """``(topic, partition)`` of a partition directory's name, or None if it is none."""
    m = _DIR_NAME.match(name)
    return None if m is None else (m.group("topic"), int(m.group("partition")))


@dataclass(frozen=True, slots=True)
class Segment:
    base_offset: int
    log_path: Path
    offset_index_path: Path  # where the .index is (Kafka may create it lazily for a new active segment)
    time_index_path: Path
    txn_index_path: Path | None  # None: the segment has no .txnindex (no aborted transactions)
    snapshot_path: Path | None  # <base>.snapshot if present
    is_active: bool  # highest base offset: the broker still appends to it

    @classmethod
    def in_dir(cls, directory: Path, base_offset: int, *, is_active: bool = False,
               names: Collection[str] | None = None) -> Segment:
        """The segment of ``base_offset`` whose files are in ``directory``. ``.txnindex`` and ``<base>.snapshot`` are
        set only if present: in ``names`` (a listing of the directory) or, without one, on disk."""
        def f(suffix: str) -> Path:
            return directory / segment_file_name(base_offset, suffix)

        def present(suffix: str) -> Path | None:
            p = f(suffix)
            return p if (p.name in names if names is not None else p.exists()) else None

        return cls(base_offset=base_offset, log_path=f(".log"), offset_index_path=f(".index"),
                   time_index_path=f(".timeindex"), txn_index_path=present(".txnindex"),
                   snapshot_path=present(SNAPSHOT_SUFFIX), is_active=is_active)


class PartitionDir:
    """A partition directory. The listing is read on each call (the broker rolls and deletes meanwhile)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        parsed = parse_partition_dir_name(self.path.name)
        if parsed is None:
            raise LogFormatError(self.path, None, "not a partition directory: expected a name '<topic>-<partition>'")
        self.topic, self.partition = parsed

    def __repr__(self) -> str:
        return f"PartitionDir({str(self.path)!r})"

    @property
    def topic_id(self) -> uuid.UUID:
        """The topic id from ``partition.metadata`` (FileNotFoundError if absent, CorruptCheckpointError if bad)."""
        return read_partition_metadata(self.path / PARTITION_METADATA)

    def leader_epochs(self) -> list[EpochEntry]:
        """The ``leader-epoch-checkpoint`` entries ([] if the file does not exist yet)."""
        p = self.path / LEADER_EPOCH_CHECKPOINT
        try:
            return read_leader_epoch_checkpoint(p)
        except FileNotFoundError:
            return []

    def segments(self, names: Collection[str] | None = None) -> list[Segment]:
        """All segments, sorted by base offset; the last one is the active segment. ``names``: the directory's
        entries when listed already (one listing for several questions, issue 26)."""
        names = set(os.listdir(self.path) if names is None else names)
        bases = sorted(int(m.group(1)) for n in names if (m := _LOG_NAME.match(n)))
        return [Segment.in_dir(self.path, base, is_active=i == len(bases) - 1, names=names)
                for i, base in enumerate(bases)]

    def rolled_ranges(self, names: Collection[str] | None = None) -> list[tuple[int, int]]:
        """``(base offset, end offset inclusive)`` of every rolled segment, oldest first, including segments
        retention has already renamed to ``.log.deleted`` but not removed yet. ``names``: the directory's entries
        when listed already.

        Which ``.log.deleted`` files count follows from the two ways Kafka renames a segment to ``*.deleted``:

        - **retention** (and log-start-offset moves) deletes the *oldest* segments: they lie below every live
          segment and hold offsets of the current log. They count.
        - **truncation** (a follower truncating to the leader's epoch end, an unclean election) deletes the
          segments *above* the truncation point and truncates the one containing it, which then regrows, possibly
          rolled at other offsets. Those ``.deleted`` files hold offsets of a diverged lineage, and their bases may
          fall between live segments (``0, 100, [200.deleted], 350``: segment 100 really holds 100..349). They
          never count.

        So: the chain is the live segments plus the ``.deleted`` ones below the *first live* segment; a segment's
        end is the next base in that chain - 1 (a live segment's end is the next *live* segment's base - 1; the
        last counted ``.deleted`` one ends at the first live base - 1). The active (highest live) segment is not
        rolled. A live and a ``.deleted`` file with the same base (truncated, then regrown from that base): the
        live one is the segment. Without a live segment nothing is known to be rolled.

        Not distinguishable by names alone: a truncation leftover that retention overtook within
        ``log.segment.delete.delay.ms`` (retention deleting the regrown live segments above it in that minute).
        The end is the next base - 1: its last offset when compaction removed nothing from the segment's tail.
        """
        if names is None:
            names = os.listdir(self.path)
        live = sorted(int(m.group(1)) for n in names if (m := _LOG_NAME.match(n)))
        if not live:
            return []
        first_live = live[0]
        retained = sorted(int(m.group(1)) for n in names
                          if (m := _DELETED_LOG_NAME.match(n)) and int(m.group(1)) < first_live)
        bases = retained + live
        return [(b, nxt - 1) for b, nxt in zip(bases, bases[1:], strict=False)]

    def rolled_segments(self) -> list[Segment]:
        """The immutable segments: all but the active one."""
        return [s for s in self.segments() if not s.is_active]
