"""Disaster recovery: the metadata topic rebuilt from the store alone (``rlm recover``, DESIGN.md section 11).

A copy's index object is its commit point and holds everything its metadata record needs but its state and the
leader epoch its copier started under. Recovery, per partition found in the store:

1. **Find**: every partition prefix in the store (:meth:`~rsm.api.RemoteStorageManagerApi.list_partitions`, under
   the configured key prefix, with and without the entropy prefix), every copy under it
   (:meth:`~rsm.api.RemoteStorageManagerApi.list_copies`), and each copy's index object
   (:meth:`~rsm.api.RemoteStorageManagerApi.read_committed_copy`). A copy without one (a crashed copy, a delete
   that stopped half-way) is an **orphan**; one whose index object does not decode is a **conflict**.
2. **Map** the topic identity the keys carry to a topic of the cluster (:func:`map_partitions`): ``--map
   OLD_ID=NAME`` first; otherwise by name, to the cluster's current id of that name. On the cluster that wrote the
   data the ids agree; on a new cluster (or after the topic was re-created) they differ, and each recovered record
   names the new id while its custom metadata records the key root (the old id, and the old name if it changed:
   :meth:`~rsm.api.RemoteStorageManagerApi.relocated`), so every object key stays addressable, by reads, deletes
   and garbage collection alike. A name the store holds under several ids, none the cluster's, is ambiguous; a
   name absent from the cluster is skipped (a deleted topic's leftovers are not brought back).
3. **Choose** one chain per partition with :func:`rlm.tier.chain.remote_chain`, as every reader does, over the copies
   found *and* the COPY_SEGMENT_FINISHED segments the metadata topic already holds: recovery into a live topic
   never adds a second copy of a range already served. Copies left outside the chain (duplicates, overlapping
   copies, a diverged lineage) are **orphans**: reported, never deleted here (garbage collection deletes them).
4. **Write** COPY_SEGMENT_STARTED then COPY_SEGMENT_FINISHED for each chain segment whose segment id the metadata
   does not know yet (in any state), through the metadata manager (which creates the topic when absent).
   Idempotent: a second run finds every chain segment known and writes nothing. A segment the metadata refuses
   (its partition being deleted, a fenced copy) is a **conflict**.

Fail closed: nothing is deleted, a partition that cannot be mapped or read is skipped and reported, and
``dry_run`` writes nothing at all (the metadata topic is not even created).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from rlm.tier import from_rsm, remote_chain
from rlmm.api import (
    RemoteLogMetadataError,
    RemoteLogMetadataManager,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from rsm.api import KeyLayout, RemoteStorageManagerApi, StoredCopy, StoredPartition
from rsm.errors import RemoteResourceNotFoundError, RemoteStorageError

__all__ = ["ClusterTopic", "Orphan", "PartitionRecovery", "RecoveryReport", "Recoverer", "map_partitions"]

log = logging.getLogger(__name__)

_STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


@dataclass(frozen=True, slots=True)
class ClusterTopic:
    """A topic of the cluster recovered onto: its current id and its partitions."""

    name: str
    topic_id: uuid.UUID
    partitions: frozenset[int]


@dataclass(frozen=True, slots=True)
class Orphan:
    """A copy in the store that recovery does not restore: ``name`` its key base, ``reason`` why."""

    name: str
    reason: str
    size_bytes: int = 0


@dataclass
class PartitionRecovery:
    """What recovery found and did for one partition of the cluster (possibly fed by several stored ones)."""

    target: TopicIdPartition
    sources: list[StoredPartition] = field(default_factory=list)
    chain: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    written: list[RemoteLogSegmentMetadata] = field(default_factory=list)   # with dry_run: would be written
    already_known: int = 0                                                 # chain segments the metadata held
    orphans: list[Orphan] = field(default_factory=list)
    conflicts: list[str] = field(default_factory=list)


@dataclass
class RecoveryReport:
    partitions: list[PartitionRecovery] = field(default_factory=list)
    skipped: list[tuple[StoredPartition, str]] = field(default_factory=list)   # not mapped to the cluster
    conflicts: list[str] = field(default_factory=list)                          # not tied to one partition
    dry_run: bool = False

    @property
    def segments_written(self) -> int:
        return sum(len(p.written) for p in self.partitions)

    @property
    def bytes_written(self) -> int:
        return sum(m.segment_size_bytes for p in self.partitions for m in p.written)

    @property
    def orphans(self) -> list[Orphan]:
        return [o for p in self.partitions for o in p.orphans]

    @property
    def all_conflicts(self) -> list[str]:
        return self.conflicts + [c for p in self.partitions for c in p.conflicts]

    def summary(self) -> str:
        verb = "would write" if self.dry_run else "wrote"
        chain = sum(len(p.chain) for p in self.partitions)
        chain_bytes = sum(m.segment_size_bytes for p in self.partitions for m in p.chain)
        return (f"{len(self.partitions)} partitions, {chain} segments in their chains ({chain_bytes} bytes): "
                f"{verb} {self.segments_written} segments ({self.bytes_written} bytes), "
                f"{sum(p.already_known for p in self.partitions)} already in the metadata; "
                f"{len(self.orphans)} orphans, {len(self.all_conflicts)} conflicts, "
                f"{len(self.skipped)} stored partitions skipped")


def map_partitions(stored: Iterable[StoredPartition], cluster: Mapping[str, ClusterTopic], *,
                   explicit: Mapping[uuid.UUID, str] | None = None,
                   topics: Iterable[str] | None = None) -> tuple[dict[StoredPartition, TopicIdPartition],
                                                                 list[tuple[StoredPartition, str]]]:
    """Which partition of the cluster each stored partition is recovered as: ``(mapped, skipped with reason)``.

    ``explicit`` (old topic id -> name) first; a name that is the target of an explicit mapping is not mapped by
    name from any other id. Otherwise by name: to the cluster's topic of the stored name, when the store holds it
    under the cluster's id (then only that id) or under one id only. ``topics``: only these target names."""
    explicit = dict(explicit or {})
    wanted = None if topics is None else set(topics)
    stored = list(stored)
    ids_by_name: dict[str, set[uuid.UUID]] = {}
    for sp in stored:
        ids_by_name.setdefault(sp.topic_name, set()).add(sp.topic_id)
    explicit_targets = set(explicit.values())
    mapped: dict[StoredPartition, TopicIdPartition] = {}
    skipped: list[tuple[StoredPartition, str]] = []
    for sp in stored:
        if sp.topic_id in explicit:
            name = explicit[sp.topic_id]
        else:
            name = sp.topic_name
            if name in explicit_targets:
                skipped.append((sp, f"topic {name} is the target of an explicit --map from another id"))
                continue
        if wanted is not None and name not in wanted:
            continue
        topic = cluster.get(name)
        if topic is None:
            skipped.append((sp, f"no topic {name} on the cluster: create it, or map it with --map "
                                f"{sp.topic_id}=NAME"))
            continue
        if sp.topic_id not in explicit:
            ids = ids_by_name[name]
            if topic.topic_id in ids and sp.topic_id != topic.topic_id:
                skipped.append((sp, f"a former topic named {name} (the cluster's {name} is {topic.topic_id}, "
                                    f"also in the store): map it explicitly with --map {sp.topic_id}=NAME"))
                continue
            if topic.topic_id not in ids and len(ids) > 1:
                skipped.append((sp, f"the store holds {len(ids)} topic ids named {name}, none the cluster's: "
                                    f"choose one with --map OLD_ID={name}"))
                continue
        if sp.partition not in topic.partitions:
            skipped.append((sp, f"{name} has no partition {sp.partition} on the cluster "
                                f"({len(topic.partitions)} partitions)"))
            continue
        mapped[sp] = TopicIdPartition(topic.topic_id, name, sp.partition)
    return mapped, skipped


class Recoverer:
    """One recovery run. ``rlmm`` is a factory: the metadata manager is opened only when needed (a dry run
    against a missing metadata topic opens none, so nothing is created); ``metadata_exists`` says whether the
    metadata topic exists (a dry run then reads what it holds)."""

    def __init__(self, rsm: RemoteStorageManagerApi, rlmm: Callable[[], RemoteLogMetadataManager], *,
                 metadata_exists: bool, read_threads: int = 16, batch_size: int = 10_000,
                 progress: Callable[[int, str], Callable[[int], None]] | None = None) -> None:
        self.rsm = rsm
        self._rlmm_factory = rlmm
        self._rlmm: RemoteLogMetadataManager | None = None
        self.metadata_exists = metadata_exists
        self.read_threads = read_threads
        self.batch_size = batch_size  # records per write batch; 1: one round trip per record (no batching)
        self._progress = progress

    def _bar(self, total: int, what: str) -> Callable[[int], None]:
        return self._progress(total, what) if self._progress is not None else (lambda _n: None)

    @property
    def rlmm(self) -> RemoteLogMetadataManager:
        if self._rlmm is None:
            self._rlmm = self._rlmm_factory()
        return self._rlmm

    def layouts(self) -> list[KeyLayout]:
        """Where to look: the configured key prefix, with and without the entropy prefix (a ``key_entropy``
        toggled since; copies under another ``key_prefix`` are not searched)."""
        own = self.rsm.layout
        return [own, KeyLayout(own.key_prefix, not own.entropy)]

    def stored_partitions(self) -> list[StoredPartition]:
        return [sp for layout in self.layouts() for sp in self.rsm.list_partitions(layout)]

    def run(self, mapped: Mapping[StoredPartition, TopicIdPartition], *, dry_run: bool = False,
            report: RecoveryReport | None = None) -> RecoveryReport:
        report = report if report is not None else RecoveryReport()
        report.dry_run = dry_run
        by_target: dict[TopicIdPartition, PartitionRecovery] = {}
        for sp, tp in sorted(mapped.items(), key=lambda kv: (kv[1].topic, kv[1].partition, str(kv[0]))):
            by_target.setdefault(tp, PartitionRecovery(tp)).sources.append(sp)
        if not by_target:
            return report

        # 1. what is stored, and each copy's index object (in parallel: one GET each)
        listed: list[tuple[PartitionRecovery, StoredPartition, StoredCopy]] = []
        for pr in by_target.values():
            for sp in pr.sources:
                listing = self.rsm.list_copies(sp.topic_id, sp.topic_name, sp.partition, sp.layout)
                listed += [(pr, sp, c) for c in listing.copies]
        bar = self._bar(len(listed), "index objects")
        found: dict[TopicIdPartition, list[RemoteLogSegmentMetadata]] = {tp: [] for tp in by_target}

        def read(item: tuple[PartitionRecovery, StoredPartition, StoredCopy]):
            try:
                return self.rsm.read_committed_copy(item[2])
            except RemoteStorageError as err:
                return err

        with ThreadPoolExecutor(max_workers=self.read_threads) as pool:
            for (pr, _sp, stored), got in zip(listed, pool.map(read, listed), strict=True):
                bar(1)
                if isinstance(got, RemoteResourceNotFoundError):
                    pr.orphans.append(Orphan(stored.name, "no index object (a crashed or half-deleted copy)"))
                    continue
                if isinstance(got, Exception):
                    pr.conflicts.append(f"{stored.name}: index object unreadable: {got}")
                    continue
                try:
                    moved = self.rsm.relocated(got.metadata, pr.target.topic_id, pr.target.topic)
                    md = from_rsm(moved, state=_FINISHED, txn_index_empty=got.txn_index_empty)
                except (RemoteStorageError, ValueError) as err:
                    pr.conflicts.append(f"{stored.name}: {err}")
                    continue
                found[pr.target].append(md)

        # 2. per partition: the chain over what the metadata holds and what the store holds
        if self.metadata_exists or not dry_run:
            tps = list(by_target)
            self.rlmm.on_partition_leadership_changes([], tps)
            self.rlmm.wait_ready(tps, timeout_s=120)
        todo: list[tuple[PartitionRecovery, RemoteLogSegmentMetadata]] = []
        resumed: set[uuid.UUID] = set()
        for tp, pr in by_target.items():
            live = self.rlmm.list_remote_log_segments(tp) if (self.metadata_exists or not dry_run) else []
            known = {m.remote_log_segment_id.id: m for m in live}
            deleting = (self.rlmm.remote_partition_delete_metadata(tp)
                        if (self.metadata_exists or not dry_run) else None)
            candidates = [m for m in live if m.state == _FINISHED]
            recovered: dict[uuid.UUID, RemoteLogSegmentMetadata] = {}
            for md in found[tp]:
                sid = md.remote_log_segment_id.id
                have = known.get(sid)
                if have is not None and have == replace(md, state=_STARTED):
                    resumed.add(sid)  # the COPY_SEGMENT_STARTED of an interrupted recovery: finished now
                    recovered[sid] = md
                    continue
                if have is not None:
                    if (have.start_offset, have.end_offset_inclusive) != (md.start_offset, md.end_offset_inclusive):
                        pr.conflicts.append(
                            f"{tp} segment {sid}: the metadata says offsets {have.start_offset}.."
                            f"{have.end_offset_inclusive}, its index object {md.start_offset}.."
                            f"{md.end_offset_inclusive}")
                    continue
                recovered[sid] = md
            chain = remote_chain([*candidates, *recovered.values()])
            pr.chain = chain
            in_chain = {m.remote_log_segment_id.id for m in chain}
            for sid, md in recovered.items():
                if sid not in in_chain:
                    pr.orphans.append(Orphan(f"{tp} {md.start_offset}..{md.end_offset_inclusive} segment {sid}",
                                             "outside the chain (a duplicate, overlapping or diverged copy)",
                                             md.segment_size_bytes))
            pr.already_known = sum(1 for m in chain if m.remote_log_segment_id.id not in recovered)
            if deleting is not None and any(m.remote_log_segment_id.id in recovered for m in chain):
                pr.conflicts.append(f"{tp}: the metadata says the partition is {deleting.state.name}: not recovered")
                continue
            todo += [(pr, m) for m in chain if m.remote_log_segment_id.id in recovered]

        # 3. write the chain segments the metadata does not know yet
        if dry_run:
            for pr, md in todo:
                pr.written.append(md)
        else:
            self._write(todo, resumed)
        report.partitions += by_target.values()
        return report

    def _write(self, todo: Sequence[tuple[PartitionRecovery, RemoteLogSegmentMetadata]],
               resumed: set[uuid.UUID]) -> None:
        """COPY_SEGMENT_STARTED for every segment (but resumed ones) in one batch, then COPY_SEGMENT_FINISHED for
        those accepted in another (:meth:`~rlmm.api.RemoteLogMetadataManager.write_segment_metadata_many`: with the
        topic-based manager one flush and one read-your-writes wait per metadata partition and batch, not two
        round trips per segment). ``batch_size`` bounds a batch."""
        bar = self._bar(len(todo), "segments written")
        for at in range(0, len(todo), self.batch_size):
            chunk = todo[at:at + self.batch_size]
            refused: dict[int, RemoteLogMetadataError] = {}
            starts = [(k, replace(md, state=_STARTED)) for k, (_pr, md) in enumerate(chunk)
                      if md.remote_log_segment_id.id not in resumed]
            for (k, _), err in zip(starts, self._write_many([m for _, m in starts]), strict=True):
                if err is not None:
                    refused[k] = err
            finishes = [(k, RemoteLogSegmentMetadataUpdate(md.remote_log_segment_id, md.event_timestamp_ms,
                                                           md.custom_metadata, _FINISHED, md.broker_id))
                        for k, (_pr, md) in enumerate(chunk) if k not in refused]
            for (k, _), err in zip(finishes, self._write_many([u for _, u in finishes]), strict=True):
                if err is not None:
                    refused[k] = err
            for k, (pr, md) in enumerate(chunk):
                err = refused.get(k)
                if err is not None:
                    pr.conflicts.append(f"{md.remote_log_segment_id}: the metadata refused it: {err}")
                    log.warning("recovered segment refused", extra={"segment": str(md.remote_log_segment_id),
                                                                     "error": str(err)})
                else:
                    pr.written.append(md)
            bar(len(chunk))

    def _write_many(self, records: Sequence[RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate],
                    ) -> list[RemoteLogMetadataError | None]:
        if self.batch_size > 1:
            return self.rlmm.write_segment_metadata_many(records)
        return RemoteLogMetadataManager.write_segment_metadata_many(self.rlmm, records)  # one at a time

    def close(self) -> None:
        if self._rlmm is not None:
            self._rlmm.close()
            self._rlmm = None

