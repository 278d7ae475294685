"""Garbage collection, as a bookie does: list the store, compare with the metadata, delete what no metadata owns.

An object is an orphan when its remote segment id is not among the partition's known segments (in any state but
fully deleted): a copy that crashed before its COPY_SEGMENT_STARTED record, a delete that was lost. An orphan is
deleted only after it has been seen orphaned for ``grace_ms`` (first sightings are kept in a small state file, so
the grace survives restarts and does not depend on the store's clock). Copies in progress are never orphans: the
COPY_SEGMENT_STARTED record is written before the first byte.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from pathlib import Path

from rlm import metrics
from rlmm.api import RemoteLogMetadataManager, TopicIdPartition
from rsm.format.keys import partition_prefix
from rsm.manager import RemoteStorageManager

__all__ = ["GarbageCollector", "segment_id_of_key"]

log = logging.getLogger(__name__)

# The part of a key after the partition prefix (rsm/format/keys.py has the layout):
#   <20-digit base offset>-<remote segment id>[.part-NNNNN | -index]
_KEY_TAIL = re.compile(r"^(?P<base>\d{20})-(?P<id>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
                       r"(?:\.part-\d{5}|-index)?$")


def segment_id_of_key(key_tail: str) -> uuid.UUID | None:
    m = _KEY_TAIL.match(key_tail)
    return uuid.UUID(m["id"]) if m else None


class GarbageCollector:
    def __init__(self, rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManager, *, grace_ms: int,
                 state_path: Path) -> None:
        self.rlmm = rlmm
        self.rsm = rsm
        self.grace_ms = grace_ms
        self.state_path = state_path
        self._lock = threading.Lock()
        self._first_seen: dict[str, int] = {}
        if state_path.exists():
            self._first_seen = json.loads(state_path.read_text() or "{}")

    def _save(self) -> None:
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._first_seen))
        os.replace(tmp, self.state_path)

    def orphans(self, tp: TopicIdPartition) -> dict[str, list[str]]:
        """Orphaned copies of ``tp``: key base (prefix + base offset + id) -> its object keys."""
        prefix = partition_prefix(tp.topic, tp.topic_id, tp.partition, entropy=self.rsm.config.key_entropy)
        # The store is listed BEFORE the metadata is read: a copy's COPY_SEGMENT_STARTED is written before its
        # first byte, so every object listed here is owned in the metadata read next unless it really is an
        # orphan. (Read the other way round, a copy starting between the two reads would look orphaned, and with
        # a short grace be deleted under the running copy.)
        objects = list(self.rsm.store.list(prefix))
        owned = {m.remote_log_segment_id.id for m in self.rlmm.list_remote_log_segments(tp)}
        out: dict[str, list[str]] = {}
        for obj in objects:
            tail = obj.key[len(prefix):]
            sid = segment_id_of_key(tail)
            if sid is None:
                log.warning("object with a foreign key under a partition prefix: left alone",
                            extra={"key": obj.key})
                continue
            if sid not in owned:
                out.setdefault(prefix + tail[:57], []).append(obj.key)
        return out

    def run(self, tps: list[TopicIdPartition], *, dry_run: bool = False,
            now_ms: int | None = None) -> list[str]:
        """One pass over ``tps``; returns the keys deleted (with ``dry_run``: the orphan keys, none deleted)."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        deleted: list[str] = []
        with self._lock:
            seen_now: set[str] = set()
            for tp in tps:
                for base, keys in self.orphans(tp).items():
                    seen_now.add(base)
                    if dry_run:
                        deleted.extend(sorted(keys))
                        continue
                    first = self._first_seen.setdefault(base, now_ms)
                    if now_ms - first < self.grace_ms:
                        continue
                    index_keys = [k for k in keys if k.endswith("-index")]
                    for k in index_keys:  # the index (commit point) first: readers stop seeing it
                        self.rsm.store.delete(k)
                    rest = [k for k in keys if k not in index_keys]
                    if rest:
                        self.rsm.store.delete_many(rest)
                    deleted.extend(sorted(keys))
                    metrics.GC_DELETED.inc(len(keys))
                    log.info("orphan deleted", extra={"key": base, "objects": len(keys),
                                                      "orphaned_for_ms": now_ms - first})
                    self._first_seen.pop(base, None)
            if not dry_run:
                # Forget sightings that are no longer orphans of the partitions looked at (adopted or deleted).
                prefixes = tuple(partition_prefix(t.topic, t.topic_id, t.partition,
                                                  entropy=self.rsm.config.key_entropy) for t in tps)
                for base in [b for b in self._first_seen if b.startswith(prefixes) and b not in seen_now]:
                    del self._first_seen[base]
                self._save()
        return deleted
