"""The partitions this sidecar has served, kept in its state dir, so a topic deleted on the cluster (its id
gone) is found and its remote data purged even after a restart."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path

from rlm.state import KNOWN_PARTITIONS, malformed, read_json, write_file_durably
from rlmm.api import TopicIdPartition

__all__ = ["KnownPartitions"]


class KnownPartitions:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._items: set[TopicIdPartition] = set()
        found = read_json(path, KNOWN_PARTITIONS)  # version 1, the only one: a list of [topic id, topic, partition]
        for row in found[1] if found is not None else []:
            try:
                self._items.add(TopicIdPartition(uuid.UUID(row[0]), row[1], int(row[2])))
            except (TypeError, ValueError, IndexError, KeyError) as err:
                raise malformed(path, KNOWN_PARTITIONS, f"{row!r} is not [topic id, topic, partition]") from err

    def _save(self) -> None:
        """Temp file + fsync + rename + fsync of the directory: after a crash the file is the old or the new list,
        and a list that was saved stays saved (a partition forgotten here is never purged)."""
        rows = sorted([str(t.topic_id), t.topic, t.partition] for t in self._items)
        write_file_durably(self.path, json.dumps(rows).encode())

    def add(self, tps: Iterable[TopicIdPartition]) -> None:
        with self._lock:
            before = len(self._items)
            self._items.update(tps)
            if len(self._items) != before:
                self._save()

    def remove(self, tps: Iterable[TopicIdPartition]) -> None:
        with self._lock:
            self._items.difference_update(tps)
            self._save()

    def all(self) -> list[TopicIdPartition]:
        with self._lock:
            return sorted(self._items, key=lambda t: (t.topic, t.partition, str(t.topic_id)))
