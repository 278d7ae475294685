"""The topic id in each partition directory's ``partition.metadata``, read again only when the file changed.

The broker writes a partition directory's ``partition.metadata`` once (a topic deleted and re-created under its name
gets a new directory, its file a new inode), and discovery's full rounds and staging ask for it far more often: every
full round asks for every partition's (reading and parsing 2,000 files was most of a full round's own CPU at 2,000
partitions), staging at every stage call (a sixth of staging's CPU once). :class:`TopicIdFiles` keeps each
directory's answer with the file's stat (device, inode, mtime, size) and reads the file again when the stat differs
(issue 26).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from rsm.log.checkpoint import read_partition_metadata
from rsm.log.partition import PARTITION_METADATA

__all__ = ["TopicIdFiles"]


class TopicIdFiles:
    """Each partition directory's topic id, cached by its ``partition.metadata``'s stat. Thread-safe (one dict, set
    and read whole entries); an entry stays for the process's life (one per partition directory seen)."""

    def __init__(self) -> None:
        self._known: dict[Path, tuple[tuple[int, int, int, int], uuid.UUID]] = {}

    def topic_id(self, partition_dir: Path) -> uuid.UUID:
        """The topic id ``partition_dir``'s ``partition.metadata`` names. Raises as reading it does:
        FileNotFoundError (or NotADirectoryError) when it is absent, ``CorruptCheckpointError`` when it is bad."""
        path = f"{partition_dir}/{PARTITION_METADATA}"
        st = os.stat(path)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
        known = self._known.get(partition_dir)
        if known is not None and known[0] == key:
            return known[1]
        tid = read_partition_metadata(Path(path))
        self._known[partition_dir] = (key, tid)
        return tid
