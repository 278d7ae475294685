"""The partitions this sidecar has served, kept in its state dir, so a topic deleted on the cluster (its id
gone) is found and its remote data purged even after a restart."""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Iterable
from pathlib import Path

from rlmm.api import TopicIdPartition

__all__ = ["KnownPartitions"]


class KnownPartitions:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._items: set[TopicIdPartition] = set()
        if path.exists():
            for row in json.loads(path.read_text() or "[]"):
                self._items.add(TopicIdPartition(uuid.UUID(row[0]), row[1], int(row[2])))

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        rows = sorted([str(t.topic_id), t.topic, t.partition] for t in self._items)
        tmp.write_text(json.dumps(rows))
        os.replace(tmp, self.path)

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
