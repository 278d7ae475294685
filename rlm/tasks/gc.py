"""Garbage collection, as a bookie does: list the store, compare with the metadata, delete what no metadata owns.

An object is an orphan when its remote segment id is not among the partition's known segments (in any state but
fully deleted): a copy that crashed before its COPY_SEGMENT_STARTED record, a delete that was lost. An orphan is
deleted only after it has been seen orphaned for ``grace_ms`` (first sightings are kept in a small state file, so
the grace survives restarts and does not depend on the store's clock). Copies in progress are never orphans: the
COPY_SEGMENT_STARTED record is written before the first byte.

Where it looks, per partition:

- under every key layout (store key prefix, entropy, and the key root: the topic id / name a recovered copy's
  keys carry) a copy of the partition was recorded with (its custom metadata), the configured one, and every one
  seen for that partition before (remembered whole in the state file, key root included, so a layout whose last
  segment is gone, e.g. the old topic id of a recovered partition, is still visited for leftovers);
- partitions it visited before and that are not passed any more are visited again once the metadata proves their
  topic purged (partition delete DELETE_PARTITION_FINISHED): their leftovers are orphans like any other. A
  partition is forgotten when it is purged and nothing is left under any of its layouts.

Fail closed: a partition whose metadata cannot be read, or holds custom metadata this storage manager cannot
decode, is skipped for the pass; an object whose segment id any known segment has (under any layout) is never
deleted; keys that do not parse are left alone; a partition not in ``tps`` is touched only on positive proof.

Everything it knows of the store comes through the storage manager's interface: what is stored under a partition
(:meth:`~rsm.api.RemoteStorageManagerApi.list_copies`, the copies grouped by their keys there, under one key
layout), and an orphan is deleted through the storage manager's own delete
(:meth:`~rsm.api.RemoteStorageManagerApi.delete_log_segment_data` of the listed copy, addressed by the key layout
it was found under), the one place that knows the order (the index object, the commit point, first): garbage
collection only decides *what* goes.

**The whole store** (``rlm gc --all-partitions``, for a lost state file): every partition stored under the configured
key layout and the remembered ones (:meth:`GarbageCollector.sweep_targets`) is visited when its topic is on the cluster
with the same topic id, or when the metadata proves it purged; a partition whose topic is gone and whose purge has not
finished is left to the purge, and one the metadata knows nothing of (another cluster sharing the bucket, or metadata
lost: ``rlm recover`` rebuilds it) is left alone. Absence from the cluster or from the metadata is never proof.

Stores' own leftovers, after the same grace: temp files of killed filesystem-store writes (``<root>/.tmp``) and
S3 multipart uploads no part was added to for the grace (a SIGKILLed copy), under each visited partition prefix.

The state file (``gc-orphans.json``, :data:`rlm.state.GC_ORPHANS`: its format versions) is replaced durably
(:func:`rlm.state.write_file_durably`).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

from rlm import metrics
from rlm.state import GC_ORPHANS, malformed, read_json, write_file_durably
from rlm.tier import to_rsm
from rlmm.api import RemoteLogMetadataManager, RemotePartitionDeleteState, TopicIdPartition
from rsm.api import CopyListing, KeyLayout, RemoteStorageManagerApi, StoredCopy
from rsm.errors import RemoteStorageError
from rsm.manager import segment_id_of_key

__all__ = ["GarbageCollector", "segment_id_of_key"]

log = logging.getLogger(__name__)

def _tp_key(tp: TopicIdPartition) -> str:
    return f"{tp.topic_id}:{tp.partition}"


def _layout_to_state(layout: KeyLayout) -> list:
    """A key layout as the state file keeps it: ``[prefix, entropy, root topic id | None, root name | None]``."""
    root_id = None if layout.root_topic_id is None else str(layout.root_topic_id)
    return [layout.key_prefix, layout.entropy, root_id, layout.root_topic_name]


def _layout_from_state(raw: list) -> KeyLayout:
    """The inverse of :func:`_layout_to_state`; a version-2 entry is ``[prefix, entropy]`` (no key root)."""
    prefix, entropy = raw[0], bool(raw[1])
    root_id = raw[2] if len(raw) > 2 else None
    root_name = raw[3] if len(raw) > 3 else None
    return KeyLayout(prefix, entropy, None if root_id is None else uuid.UUID(root_id), root_name)


def _layout_sort_key(raw: list) -> tuple:
    return (raw[0], bool(raw[1]), raw[2] or "", raw[3] or "")


TEMP_FILE_MIN_AGE_MS = 15 * 60 * 1000
"""A store temp file (a write in progress, or a killed one) younger than this is never removed."""


class GarbageCollector:
    def __init__(self, rlmm: RemoteLogMetadataManager, rsm: RemoteStorageManagerApi, *, grace_ms: int,
                 state_path: Path) -> None:
        self.rlmm = rlmm
        self.rsm = rsm
        self.grace_ms = grace_ms
        self.state_path = state_path
        self._lock = threading.Lock()
        # first sightings by physical key base (store key prefix + key base)
        self._first_seen: dict[str, int] = {}
        # partitions visited: tp key -> {"topic", "topic_id", "partition",
        #                                "layouts": [[prefix, entropy, root topic id | None, root name | None], ...]}
        self._partitions: dict[str, dict] = {}
        found = read_json(state_path, GC_ORPHANS)
        if found is not None:
            version, raw = found
            if not isinstance(raw, dict):
                raise malformed(state_path, GC_ORPHANS, f"a JSON {type(raw).__name__}, not an object")
            if version >= 2:
                self._first_seen = dict(raw.get("first_seen", {}))
                self._partitions = dict(raw.get("partitions", {}))
            else:  # version 1: a flat map of key bases, all under the configured key prefix
                self._first_seen = {rsm.layout.key_prefix + k: v for k, v in raw.items()}

    def _save(self) -> None:
        data = json.dumps({"version": GC_ORPHANS.version, "first_seen": self._first_seen,
                           "partitions": self._partitions}).encode()
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        write_file_durably(self.state_path, data)

    # -- which partitions, which layouts -----------------------------------------------------------------------

    def _remembered_layouts(self, tp: TopicIdPartition) -> set[KeyLayout]:
        entry = self._partitions.get(_tp_key(tp))
        return {_layout_from_state(raw) for raw in entry["layouts"]} if entry else set()

    def _remember(self, tp: TopicIdPartition, layouts: set[KeyLayout]) -> None:
        self._partitions[_tp_key(tp)] = {
            "topic": tp.topic, "topic_id": str(tp.topic_id), "partition": tp.partition,
            "layouts": sorted((_layout_to_state(lay) for lay in layouts), key=_layout_sort_key)}

    def _purged(self, tp: TopicIdPartition) -> bool:
        """Positive proof that ``tp``'s topic was purged: its partition delete is FINISHED in ready metadata."""
        try:
            if not self.rlmm.is_ready(tp):
                return False
            d = self.rlmm.remote_partition_delete_metadata(tp)
        except Exception as err:  # noqa: BLE001 - not served, not readable: no proof
            log.debug("partition delete state of %s unreadable: %s", tp, err)
            return False
        return d is not None and d.state == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED

    def _owned_and_layouts(self, tp: TopicIdPartition) -> tuple[set[uuid.UUID], set[KeyLayout]]:
        segs = self.rlmm.list_remote_log_segments(tp)
        layouts = {self.rsm.layout}
        for md in segs:
            if md.custom_metadata is not None:
                layouts.add(self.rsm.layout_of(to_rsm(md)))  # CustomMetadataError: skip the partition
        return {md.remote_log_segment_id.id for md in segs}, layouts

    def _visit(self, tp: TopicIdPartition) -> tuple[dict[str, StoredCopy], list[CopyListing], int]:
        """(orphans by physical key base, the listings, objects listed)."""
        owned_before, layouts = self._owned_and_layouts(tp)
        layouts |= self._remembered_layouts(tp)
        listed: list[CopyListing] = []
        for layout in sorted(layouts, key=lambda lay: _layout_sort_key(_layout_to_state(lay))):
            # The store is listed BEFORE the metadata is read (again): a copy's COPY_SEGMENT_STARTED is written
            # before its first byte, so every object listed here is owned in the metadata read next unless it
            # really is an orphan. (Read the other way round, a copy starting between the two reads would look
            # orphaned, and with a short grace be deleted under the running copy.)
            try:
                listed.append(self.rsm.list_copies(tp.topic_id, tp.topic, tp.partition, layout))
            except RemoteStorageError as err:
                log.warning("key layout not addressable: not visited", extra={"partition": str(tp),
                                                                               "layout": str(layout),
                                                                               "error": str(err)})
        owned_after, layouts_after = self._owned_and_layouts(tp)
        owned = owned_before | owned_after
        self._remember(tp, layouts | layouts_after)
        out: dict[str, StoredCopy] = {}
        for listing in listed:
            for key in listing.foreign_keys:
                log.warning("object with a foreign key under a partition prefix: left alone",
                            extra={"key": listing.layout.key_prefix + key})
            for stored in listing.copies:
                if stored.copy.remote_segment_id not in owned:
                    out[stored.name] = stored
        return out, listed, sum(listing.objects for listing in listed)

    def orphans(self, tp: TopicIdPartition) -> dict[str, list[str]]:
        """Orphaned copies of ``tp`` under all its layouts: physical key base (store key prefix + partition prefix
        + base offset + id) -> its object keys (within the layout's store)."""
        found, _, _ = self._visit(tp)
        return {base: list(o.keys) for base, o in found.items()}

    # -- the whole store ---------------------------------------------------------------------------------------

    def sweep_targets(self, current_ids: Callable[[set[str]], Mapping[str, uuid.UUID]], *, wait_s: float = 60.0,
                      ) -> tuple[list[TopicIdPartition], list[tuple[TopicIdPartition, str]]]:
        """Every partition the store holds under the configured key layout and the remembered ones: (those a pass
        may visit, those left alone with why). ``current_ids`` answers the topic id each named topic has on the
        cluster now (a topic absent from its answer is not on the cluster). See the module doc."""
        layouts = {self.rsm.layout, *(_layout_from_state(raw) for entry in self._partitions.values()
                                      for raw in entry["layouts"])}
        stored = {TopicIdPartition(sp.topic_id, sp.topic_name, sp.partition)
                  for layout in sorted(layouts, key=lambda lay: _layout_sort_key(_layout_to_state(lay)))
                  for sp in self.rsm.list_partitions(layout)}
        live_ids = current_ids({tp.topic for tp in stored}) if stored else {}
        visit = sorted((tp for tp in stored if live_ids.get(tp.topic) == tp.topic_id), key=str)
        gone = sorted(stored.difference(visit), key=str)
        left: list[tuple[TopicIdPartition, str]] = []
        if stored:  # every partition's metadata, the live ones' too: a pass reads what each owns
            try:
                self.rlmm.on_partition_leadership_changes([], sorted(stored, key=str))
                self.rlmm.wait_ready(sorted(stored, key=str), timeout_s=wait_s)
            except Exception as err:  # noqa: BLE001 - fail closed: no metadata, no proof
                return [], [(tp, f"metadata not readable: {err}") for tp in sorted(stored, key=str)]
        for tp in gone:
            if self._purged(tp):
                visit.append(tp)
            elif self.rlmm.list_remote_log_segments(tp) or self.rlmm.remote_partition_delete_metadata(tp):
                left.append((tp, "topic not on the cluster with this id, its purge not finished: left to the purge"))
            else:
                left.append((tp, "unknown to the metadata (another cluster's data in a shared bucket, or the "
                                 "metadata was lost: rlm recover rebuilds it): left alone"))
        return visit, left

    # -- a pass ------------------------------------------------------------------------------------------------

    def run(self, tps: list[TopicIdPartition], *, dry_run: bool = False,
            now_ms: int | None = None) -> list[str]:
        """One pass over ``tps`` (and remembered partitions of purged topics); returns the keys deleted (with
        ``dry_run``: the orphan keys, none deleted). Keys under another store key prefix than the configured one
        are returned with that prefix."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        cutoff_ms = now_ms - self.grace_ms
        deleted: list[str] = []
        with self._lock:
            wanted = {_tp_key(tp): tp for tp in tps}
            purged = []
            for key, entry in list(self._partitions.items()):
                if key in wanted:
                    continue
                tp = TopicIdPartition(uuid.UUID(entry["topic_id"]), entry["topic"], int(entry["partition"]))
                if self._purged(tp):
                    purged.append(tp)
            seen_now: set[str] = set()
            visited: list[str] = []
            for tp in [*wanted.values(), *purged]:
                try:
                    found, listed, n_objects = self._visit(tp)
                except Exception as err:  # noqa: BLE001 - fail closed: nothing of this partition is touched
                    metrics.ERRORS.labels("gc").inc()
                    log.warning("partition skipped by gc", extra={"partition": str(tp), "error": str(err)})
                    continue
                visited.extend(listing.layout.key_prefix + listing.prefix for listing in listed)
                for base, orphan in found.items():
                    seen_now.add(base)
                    shown = [orphan.layout.key_prefix + k for k in sorted(orphan.keys)]
                    if dry_run:
                        deleted.extend(shown)
                        continue
                    first = self._first_seen.setdefault(base, now_ms)
                    if now_ms - first < self.grace_ms:
                        continue
                    self.rsm.delete_log_segment_data(orphan.copy)  # the index (commit point) first
                    deleted.extend(shown)
                    metrics.GC_DELETED.inc(len(orphan.keys))
                    log.info("orphan deleted", extra={"key": base, "objects": len(orphan.keys),
                                                      "orphaned_for_ms": now_ms - first})
                    self._first_seen.pop(base, None)
                if not dry_run:
                    for listing in listed:
                        deleted.extend(listing.layout.key_prefix + k
                                       for k in self._abort_stale_uploads(listing, cutoff_ms))
                    if tp in purged and n_objects == 0:  # purged, and nothing left under any of its layouts
                        self._partitions.pop(_tp_key(tp), None)
                        log.info("purged partition emptied; forgotten by gc", extra={"partition": str(tp)})
            if not dry_run:
                # A temp file is a write in flight until it is TEMP_FILE_MIN_AGE_MS old, whatever the grace: a
                # throttled copy (or a long fsync) leaves its file untouched for longer than a short gc_grace_ms,
                # and another sidecar's GC sharing the store removed it mid-copy (the chaos run's livelock).
                deleted.extend(self._remove_stale_temp_files(min(cutoff_ms, now_ms - TEMP_FILE_MIN_AGE_MS)))
                # Forget sightings that are no longer orphans of the partitions looked at (adopted or deleted).
                prefixes = tuple(visited)
                for base in [b for b in self._first_seen if prefixes and b.startswith(prefixes) and b not in seen_now]:
                    del self._first_seen[base]
                self._save()
        return deleted

    def _abort_stale_uploads(self, listing: CopyListing, cutoff_ms: int) -> list[str]:
        try:
            aborted = self.rsm.abort_stale_uploads(listing, cutoff_ms)
        except RemoteStorageError as err:
            metrics.ERRORS.labels("gc").inc()
            log.warning("could not abort stale multipart uploads", extra={"prefix": listing.prefix,
                                                                           "error": str(err)})
            return []
        for k in aborted:
            log.info("stale multipart upload aborted", extra={"key": k})
        return aborted

    def _remove_stale_temp_files(self, cutoff_ms: int) -> list[str]:
        try:
            removed = self.rsm.remove_stale_temp_files(cutoff_ms)
        except RemoteStorageError as err:
            metrics.ERRORS.labels("gc").inc()
            log.warning("could not remove stale temp files", extra={"error": str(err)})
            return []
        for k in removed:
            log.info("stale temp file removed", extra={"key": k})
        return removed
