"""The invariant checker of issue 9: what the remote tier of one partition must look like once tiering is quiet.

It reads only through the project's public surfaces, from its own metadata cache (a fresh
:class:`~rlmm.topic_manager.TopicBasedRemoteLogMetadataManager` over the sidecars' metadata topic), so it sees what
any reader (``rlm cat``, Spark) would see, independent of the sidecars' own caches:

- :meth:`rlm.tier.RemoteReader.segments` and :meth:`rlm.tier.RemoteReader.read` (the chain a reader serves);
- ``list_remote_log_segments`` of the metadata manager (every segment in any state);
- the store's listing under the partition's key prefix, and the project's :class:`rlm.tasks.gc.GarbageCollector`.

Per partition (:meth:`InvariantChecker.check`; every violation is collected, then reported together):

1. ``contiguous``: the served segments are one chain: each starts right after the previous one ends (a gap or an
   overlap names both segments and their offsets), from ``first_offset`` when given;
2. ``served-twice``: reading from the earliest remote offset yields strictly increasing offsets: none twice;
3. ``lost``: every acknowledged offset between the earliest and the latest remote offset is read back;
4. ``wrong-value``: every record read at an acknowledged offset is byte-exact what was acknowledged there; a
   record read at an offset that was never acknowledged must still be one that was produced (same key and value:
   a send whose acknowledgement was lost), never anything else;
5. ``tiering``: the latest remote offset reaches ``tiered_through`` (tiering did not stall);
6. ``unserved``: no COPY_SEGMENT_FINISHED segment outside the served chain (a diverged or duplicate copy must be
   deleted, not just hidden), and no segment left COPY_SEGMENT_STARTED / DELETE_SEGMENT_STARTED;
7. ``staging``: no staged segment of the partition left in any sidecar's staging area;
8. ``orphaned``: after one GC pass (grace 0) nothing under the partition's key prefix is unowned, and every stored
   object belongs to a served segment.

Usage::

    with InvariantChecker.open(settings, tmp_path / "checker") as checker:
        checker.assert_ok(tp, sent, produced=..., staging_roots=[...], tiered_through=last, gc=True)
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlm.config import SidecarSettings
from rlm.tasks.gc import GarbageCollector, segment_id_of_key
from rlm.tier import RemoteReader
from rlmm.api import RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from rsm.format.keys import partition_prefix
from rsm.manager import RemoteStorageManager

__all__ = ["InvariantChecker", "Report", "Violation", "boundaries_differ", "local_bases", "staged_files",
           "store_keys_of_topic_id"]

Record = tuple[bytes | None, bytes | None]


@dataclass(frozen=True)
class Violation:
    kind: str
    tp: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.tp}: {self.detail}"


@dataclass
class Report:
    tp: str
    violations: list[Violation] = field(default_factory=list)
    segments: list[tuple[int, int, int]] = field(default_factory=list)  # (start, end, broker) of the chain
    records_read: int = 0
    earliest: int | None = None
    latest: int | None = None

    def add(self, kind: str, detail: str) -> None:
        self.violations.append(Violation(kind, self.tp, detail))

    @property
    def ok(self) -> bool:
        return not self.violations

    def kinds(self) -> set[str]:
        return {v.kind for v in self.violations}

    def __str__(self) -> str:
        head = (f"{self.tp}: remote {self.earliest}..{self.latest}, {len(self.segments)} segments, "
                f"{self.records_read} records read")
        if self.ok:
            return head + ": every invariant holds"
        shown = self.violations[:40]
        more = f"\n  ... {len(self.violations) - len(shown)} more" if len(self.violations) > len(shown) else ""
        return (head + f": {len(self.violations)} violations\n  " + "\n  ".join(map(str, shown)) + more
                + f"\n  served chain (start, end, broker): {self.segments[:30]}")


def _rng(md: RemoteLogSegmentMetadata) -> str:
    return (f"[{md.start_offset},{md.end_offset_inclusive}] (broker {md.broker_id}, "
            f"epochs {list(md.segment_leader_epochs)}, id {str(md.remote_log_segment_id.id)[:8]})")


def _ranges(offsets: Iterable[int], limit: int = 12) -> str:
    """``1,2,3,7,8`` -> ``1..3, 7..8`` (the first ``limit`` runs)."""
    runs: list[list[int]] = []
    for o in sorted(offsets):
        if runs and o == runs[-1][1] + 1:
            runs[-1][1] = o
        else:
            runs.append([o, o])
    text = ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in runs[:limit])
    return text + (f", ... ({len(runs)} runs)" if len(runs) > limit else "")


class InvariantChecker:
    """Checks partitions of one metadata topic + store (see the module doc)."""

    def __init__(self, rlmm: Any, rsm: RemoteStorageManager, *, gc_state_dir: Path) -> None:
        self.rlmm = rlmm
        self.rsm = rsm
        self.reader = RemoteReader(rlmm, rsm)
        self.gc_state_dir = gc_state_dir

    @classmethod
    @contextmanager
    def open(cls, settings: SidecarSettings, work_dir: Path) -> Iterator[InvariantChecker]:
        """A checker with its own metadata cache under ``work_dir`` (the sidecars' caches are locked)."""
        from rlm.rlmm_config import make_rlmm

        work_dir.mkdir(parents=True, exist_ok=True)
        cache = work_dir / f"cache-{uuid.uuid4().hex[:6]}"
        rlmm = make_rlmm(settings, cache_dir=cache)
        try:
            yield cls(rlmm, RemoteStorageManager(settings.store), gc_state_dir=work_dir)
        finally:
            rlmm.close()
            shutil.rmtree(cache, ignore_errors=True)

    # ------------------------------------------------------------------------------------------ plumbing
    def follow(self, tps: Iterable[TopicIdPartition], timeout_s: float = 60.0) -> None:
        tps = list(tps)
        self.rlmm.on_partition_leadership_changes([], tps)
        # caught up with what the metadata topic holds now, not once: a partition ready since an earlier follow would
        # otherwise be checked as it was then (seen under load: two copies left STARTED that had FINISHED)
        self.rlmm.wait_caught_up(tps, timeout_s=timeout_s)

    def all_segments(self, tp: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        return list(self.rlmm.list_remote_log_segments(tp))

    def served(self, tp: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
        return list(self.reader.segments(tp))

    def latest(self, tp: TopicIdPartition) -> int:
        segs = self.served(tp)
        return max((s.end_offset_inclusive for s in segs), default=-1)

    def read_all(self, tp: TopicIdPartition) -> list[tuple[int, bytes | None, bytes | None]]:
        """(offset, key, value) of every record served from the earliest remote offset on, in the order read."""
        segs = self.served(tp)
        if not segs:
            return []
        start = min(s.start_offset for s in segs)
        return [(r.offset, r.key, r.value) for r in self.reader.read(tp, start)]

    def values_at(self, tp: TopicIdPartition) -> dict[int, list[bytes | None]]:
        """offset -> every value served for it (more than one when an offset is served twice)."""
        out: dict[int, list[bytes | None]] = {}
        for off, _k, v in self.read_all(tp):
            out.setdefault(off, []).append(v)
        return out

    # ------------------------------------------------------------------------------------------- checks
    def check(self, tp: TopicIdPartition, acked: Mapping[int, Record], *,
              produced: Mapping[bytes | None, bytes | None] | None = None, first_offset: int | None = None,
              tiered_through: int | None = None, staging_roots: Iterable[Path] = (), gc: bool = False,
              check_values: bool = True, wait_s: float = 0.0) -> Report:
        """Check ``tp`` against ``acked`` (offset -> (key, value) of every acknowledged record).

        ``produced``: key -> value of every record sent (acknowledged or not): a record at an unacknowledged
        offset must be one of them. ``wait_s``: retry (fresh reads) until every invariant holds or the time is
        up, for the eventually-true ones (deletion of unserved segments, staging release); the last report is
        returned.
        """
        deadline = time.monotonic() + wait_s
        while True:
            report = self._check_once(tp, acked, produced=produced, first_offset=first_offset,
                                      tiered_through=tiered_through, staging_roots=list(staging_roots), gc=gc,
                                      check_values=check_values)
            if report.ok or time.monotonic() >= deadline:
                return report
            time.sleep(1.0)

    def assert_ok(self, tp: TopicIdPartition, acked: Mapping[int, Record], **kw: Any) -> Report:
        report = self.check(tp, acked, **kw)
        assert report.ok, str(report)
        return report

    def _check_once(self, tp: TopicIdPartition, acked: Mapping[int, Record], *,
                    produced: Mapping[bytes | None, bytes | None] | None, first_offset: int | None,
                    tiered_through: int | None, staging_roots: list[Path], gc: bool,
                    check_values: bool) -> Report:
        name = f"{tp.topic}-{tp.partition}"
        report = Report(name)
        try:
            segs = self.served(tp)
        except Exception as err:  # noqa: BLE001 - reported, not raised
            report.add("reader", f"segments() raised {type(err).__name__}: {err}")
            return report
        report.segments = [(s.start_offset, s.end_offset_inclusive, s.broker_id) for s in segs]
        if not segs:
            report.add("contiguous", "no remote segment at all")
            return report
        report.earliest = segs[0].start_offset
        report.latest = max(s.end_offset_inclusive for s in segs)

        # 1. one contiguous chain
        if first_offset is not None and segs[0].start_offset != first_offset:
            report.add("contiguous", f"the earliest remote offset is {segs[0].start_offset}, expected "
                                     f"{first_offset}: first segment {_rng(segs[0])}")
        for a, b in zip(segs, segs[1:], strict=False):
            if b.start_offset <= a.end_offset_inclusive:
                last = min(a.end_offset_inclusive, b.end_offset_inclusive)
                report.add("contiguous", f"overlap: offsets {b.start_offset}..{last} are in {_rng(a)} and in {_rng(b)}")
            elif b.start_offset != a.end_offset_inclusive + 1:
                report.add("contiguous", f"gap: offsets {a.end_offset_inclusive + 1}..{b.start_offset - 1} between "
                                         f"{_rng(a)} and {_rng(b)}")

        # 5. tiering reached the end
        if tiered_through is not None and report.latest < tiered_through:
            report.add("tiering", f"the latest remote offset is {report.latest}, expected >= {tiered_through} "
                                  "(tiering stalled?)")

        # 2-4. what a reader gets from the earliest offset
        if check_values:
            try:
                records = self.read_all(tp)
            except Exception as err:  # noqa: BLE001
                report.add("reader", f"read({report.earliest}) raised {type(err).__name__}: {err}")
                records = []
            report.records_read = len(records)
            seen: dict[int, int] = {}
            backwards: list[tuple[int, int]] = []
            prev = -1
            for off, _k, _v in records:
                seen[off] = seen.get(off, 0) + 1
                if off <= prev and len(backwards) < 5:
                    backwards.append((prev, off))
                prev = max(prev, off)
            twice = [o for o, n in seen.items() if n > 1]
            if twice:
                report.add("served-twice", f"{len(twice)} offsets served more than once: {_ranges(twice)} "
                                           f"(read went back: {backwards})")
            lo, hi = report.earliest, report.latest
            lost = [o for o in acked if lo <= o <= hi and o not in seen]
            if lost:
                report.add("lost", f"{len(lost)} acknowledged offsets in the remote range {lo}..{hi} not served: "
                                   f"{_ranges(lost)}")
            wrong: list[str] = []
            n_wrong = 0
            for off, k, v in records:
                want = acked.get(off)
                if want is not None:
                    bad = (k, v) != want
                elif produced is not None:
                    bad = k not in produced or produced[k] != v
                else:
                    continue
                if bad:
                    n_wrong += 1
                    if len(wrong) < 8:
                        got = (k[:24] if k else k, v[:24] if v else v)
                        exp = (want[0][:24] if want[0] else want[0], want[1][:24] if want[1] else want[1]) \
                            if want else "(not acknowledged: no such record was produced)"
                        wrong.append(f"offset {off}: served {got}, acknowledged {exp}")
            if n_wrong:
                report.add("wrong-value", f"{n_wrong} records served differ from what was produced: "
                                          + "; ".join(wrong))

        # 6. nothing FINISHED outside the chain, nothing half-done
        try:
            every = self.all_segments(tp)
        except Exception as err:  # noqa: BLE001
            report.add("metadata", f"list_remote_log_segments raised {type(err).__name__}: {err}")
            every = []
        chain = {s.remote_log_segment_id.id for s in segs}
        for md in every:
            if md.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED and md.remote_log_segment_id.id not in chain:
                report.add("unserved", f"COPY_SEGMENT_FINISHED outside the served chain, not deleted: {_rng(md)}")
            elif md.state in (RemoteLogSegmentState.COPY_SEGMENT_STARTED,
                              RemoteLogSegmentState.DELETE_SEGMENT_STARTED):
                report.add("unserved", f"left {md.state.name}: {_rng(md)}")

        # 7. staging empty
        left = [(root, p) for root in staging_roots for p in staged_files(root, tp)]
        if left:
            segs_left = sorted({f"{root.name}/.../{p.parent.name}" for root, p in left})
            report.add("staging", f"{len(left)} staged files left in {len(segs_left)} segment dirs: "
                                  f"{segs_left[:8]}")

        # 8. one GC pass, then nothing orphaned
        if gc:
            try:
                collector = GarbageCollector(self.rlmm, self.rsm, grace_ms=0,
                                             state_path=self.gc_state_dir / f"gc-{uuid.uuid4().hex[:6]}.json")
                collector.run([tp])
                still = collector.orphans(tp)
                if still:
                    report.add("orphaned", f"after one GC pass {len(still)} copies still orphaned: {sorted(still)[:4]}")
            except Exception as err:  # noqa: BLE001
                report.add("orphaned", f"GC pass raised {type(err).__name__}: {err}")
            prefix = partition_prefix(tp.topic, tp.topic_id, tp.partition, entropy=self.rsm.config.key_entropy)
            stray = []
            for obj in self.rsm.store.list(prefix):
                sid = segment_id_of_key(obj.key[len(prefix):])
                if sid not in chain:
                    stray.append(obj.key)
            if stray:
                report.add("orphaned", f"{len(stray)} stored objects belong to no served segment: {stray[:4]}")
        return report


# ------------------------------------------------------------------------------------------ file helpers
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def _files(root: Path) -> Iterator[Path]:
    """Every file under ``root``, walked while a sidecar may be changing it: a directory removed during the walk is
    skipped (``os.walk`` ignores it; ``Path.rglob`` raises ``FileNotFoundError``)."""
    for top, _dirs, names in os.walk(root):
        for name in names:
            yield Path(top) / name


def staged_files(root: Path, tp: TopicIdPartition) -> list[Path]:
    """Files staged for ``tp`` under a staging root, whatever the layout keys them by: under a directory holding
    its topic id (``<id>/<topic>-<partition>/...``), or named ``<topic>-<partition>`` with no topic id in the path
    (the layout keyed by name only, which cannot tell a re-created topic from the deleted one)."""
    root = Path(root)
    if not root.exists():
        return []
    out = []
    name = f"{tp.topic}-{tp.partition}"
    for p in _files(root):
        parts = p.relative_to(root).parts
        ids = {m.group(0) for part in parts for m in [_UUID.fullmatch(part)] if m}
        if (str(tp.topic_id) in ids and (name in parts or len(parts) <= 2)) or (not ids and name in parts):
            out.append(p)
    return out


def store_keys_of_topic_id(root: Path, topic_id: uuid.UUID) -> list[str]:
    """Keys of a filesystem store that belong to a topic id (any partition, any key layout)."""
    root = Path(root)
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in _files(root)
                  if str(topic_id) in str(p.relative_to(root)) and ".tmp" not in p.relative_to(root).parts)


def local_bases(partition_dir: Path) -> list[int]:
    """Base offsets of the ``.log`` files of a broker's partition directory (rolled and active), ascending."""
    return sorted(int(p.name.split(".")[0]) for p in Path(partition_dir).glob("*.log"))


def boundaries_differ(bases: Mapping[int, list[int]], lo: int, hi: int) -> set[int]:
    """The segment boundaries (base offsets) in ``lo..hi`` that some replicas have and others do not."""
    sets = [{b for b in bs if lo <= b <= hi} for bs in bases.values()]
    if not sets:
        return set()
    return set.union(*sets) - set.intersection(*sets)
