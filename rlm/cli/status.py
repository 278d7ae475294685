"""``rlm status [TOPIC...]``: per partition, what is local, what is remote, and whether offsets are lost between.

Sources, each the one owner of its answer:

- **local range** (the leader's log): ListOffsets from the cluster, ``earliest`` and ``latest`` (the high
  watermark), so the command works from any host that reaches the broker. In sidecar mode the broker has no remote
  storage of its own (``remote.storage.enable`` off), so its log start offset *is* its local log start offset:
  Kafka answers ``EARLIEST_LOCAL`` (-4) with the same offset then, and confluent-kafka 2.16 offers no -4 spec anyway.
  The log dirs are not used for the range: on another host they are absent, and on the broker's host they may hold
  a follower's replica.
- **remote range**: the remote chain of COPY_SEGMENT_FINISHED segments (:func:`rlm.tier.remote_chain` over the
  metadata's lineage, exactly what every reader serves), its gaps (:func:`rlm.tier.chain_gaps`) and the copies
  left out of it (:func:`rlm.tier.unchained`: duplicates and diverged copies expiration deletes once the chain
  covers them, and the ones it keeps).
- **copy lag**: in offsets, always (local offsets above the remote end); in rolled segments and bytes, and the
  **retention margin** (:func:`rlm.health.retention_margin`, as the sidecar's gauges), only where the leader's
  partition directory is readable: the command runs on the host of the leader, ``broker_id`` in the config is the
  leader's, and one of ``log_dirs`` holds the partition under its topic id. Elsewhere they are null (unknown).

A **hole** is an offset range neither local nor remote: between the remote end and the local log start (the broker
deleted segments before they were copied), or a gap inside the remote chain below the local log start. Offsets
below the remote start are not a hole (remote retention expired them), nor is anything while nothing is remote. On
the leader's host, offsets there that a segment the sidecar staged holds (:func:`rlm.tasks.staging.staged_ranges`:
hard links the broker's retention cannot take, read only) are not a hole either: they are **awaiting copy**
(``awaiting_copy``), as the proxy treats them (:mod:`rlm.listener.tier.boundary`).

Exit codes (README, "Command line"): 0 no partition has a hole; 1 a partition has a hole; 2 bad arguments or
config, or no such topic on the cluster; 5 the principal lacks an ACL; 6 the cluster did not answer within --timeout.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlm.cli.context import CliContext, add_config_arg, add_timeout_arg, open_context
from rlm.discovery import PartitionInfo, scan_log_dirs
from rlm.health import Margin, retention_margin
from rlm.tasks.staging import staged_ranges, staging_roots
from rlm.tier import chain_gaps, lineage_of, remote_chain, unchained
from rlmm.api import RemoteLogSegmentMetadata, TopicIdPartition
from rsm.log.errors import LogFormatError
from rsm.log.partition import PartitionDir

__all__ = ["EXIT_HOLE", "Hole", "LocalDir", "LocalRange", "PartitionStatus", "assess", "awaiting_copy", "holes",
           "register",
           "topic_summary"]

log = logging.getLogger(__name__)

EXIT_HOLE = 1  # a partition has offsets neither local nor remote


@dataclass(frozen=True, slots=True)
class LocalRange:
    """The leader's answer to ListOffsets: ``start_offset`` (earliest: the log start offset) and
    ``high_watermark`` (latest: the next offset; the range is empty when they are equal)."""

    start_offset: int
    high_watermark: int
    leader_epoch: int | None = None


@dataclass(frozen=True, slots=True)
class LocalDir:
    """The leader's partition directory, read on its host: rolled segments not remote yet, retention margin."""

    path: Path
    retention_ms: int | None
    retention_bytes: int | None
    staged: tuple[tuple[int, int], ...] = ()  # the sidecar's staged segments of it: (base, end inclusive)


@dataclass(frozen=True, slots=True)
class Hole:
    """Offsets ``first_offset..last_offset`` (inclusive) neither local nor remote. ``where``: ``before_local``
    (between the remote end and the local log start) or ``remote_chain`` (a gap inside the remote chain)."""

    first_offset: int
    last_offset: int
    where: str

    @property
    def offsets(self) -> int:
        return self.last_offset - self.first_offset + 1


@dataclass
class PartitionStatus:
    tp: TopicIdPartition
    leader: int
    local: LocalRange | None
    chain: list[RemoteLogSegmentMetadata]
    holes: list[Hole] | None  # None: not judged (the local range is unknown)
    lag_offsets: int | None
    lag_segments: int | None = None
    lag_bytes: int | None = None
    margin: Margin | None = None
    duplicates: int = 0  # copies outside the chain, awaiting deletion
    diverged: list[tuple[RemoteLogSegmentMetadata, bool]] = field(default_factory=list)  # (copy, awaiting deletion)
    kept: int = 0  # non-diverged copies outside the chain that expiration keeps (they hold offsets it lacks)
    awaiting_copy: list[tuple[int, int]] = field(default_factory=list)  # below the local start, staged, not remote
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        chain = self.chain
        margin = None if self.margin is None else {
            "seconds": _finite(self.margin.seconds), "bytes": _finite(self.margin.bytes),
            "segment_base_offset": self.margin.segment}
        return {
            "partition": self.tp.partition,
            "leader": self.leader,
            "local": None if self.local is None else {
                "start_offset": self.local.start_offset,
                "end_offset_inclusive": (self.local.high_watermark - 1
                                         if self.local.high_watermark > self.local.start_offset else None),
                "high_watermark": self.local.high_watermark,
                "leader_epoch": self.local.leader_epoch,
            },
            "remote": None if not chain else {
                "start_offset": chain[0].start_offset,
                "end_offset_inclusive": chain[-1].end_offset_inclusive,
                "segments": len(chain),
                "size_bytes": sum(m.segment_size_bytes for m in chain),
            },
            "copy_lag": {"offsets": self.lag_offsets, "segments": self.lag_segments, "bytes": self.lag_bytes},
            "retention_margin": margin,
            "holes": None if self.holes is None else [
                {"first_offset": h.first_offset, "last_offset": h.last_offset, "offsets": h.offsets,
                 "where": h.where} for h in self.holes],
            "awaiting_copy": [{"first_offset": a, "last_offset": b, "offsets": b - a + 1}
                              for a, b in self.awaiting_copy],
            "duplicate_copies": self.duplicates,
            "diverged_copies": [{
                "segment_id": str(md.remote_log_segment_id.id), "start_offset": md.start_offset,
                "end_offset_inclusive": md.end_offset_inclusive, "size_bytes": md.segment_size_bytes,
                "leader_epochs": [list(e) for e in md.segment_leader_epochs], "broker_id": md.broker_id,
                "awaiting_deletion": awaiting} for md, awaiting in self.diverged],
            "kept_unserved_copies": self.kept,
            "error": self.error,
        }


def _finite(v: float) -> float | None:
    """JSON has no infinity: ``null`` is "nothing at risk / unlimited"."""
    return None if math.isinf(v) else v


# --------------------------------------------------------------------------------------------------- logic
def holes(chain: Sequence[RemoteLogSegmentMetadata], local_start: int,
          staged: Sequence[tuple[int, int]] = ()) -> list[Hole]:
    """Offset ranges neither in the remote ``chain`` nor local (at or above ``local_start``), ascending; of those
    between the remote end and the local start, not the offsets ``staged`` segments hold (:func:`awaiting_copy`)."""
    out = [Hole(first, min(last, local_start - 1), "remote_chain")
           for first, last in chain_gaps(chain) if first < local_start]
    if chain and chain[-1].end_offset_inclusive + 1 < local_start:
        uncovered, _covered = _split(chain[-1].end_offset_inclusive + 1, local_start - 1, staged)
        out += [Hole(first, last, "before_local") for first, last in uncovered]
    return out


def awaiting_copy(chain: Sequence[RemoteLogSegmentMetadata], local_start: int,
                  staged: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The offsets between the remote end and the local start that ``staged`` segments ((base, end inclusive)) hold:
    deleted by the broker, not remote yet, kept for their copy (ranges, ascending)."""
    if not chain or chain[-1].end_offset_inclusive + 1 >= local_start:
        return []
    return _split(chain[-1].end_offset_inclusive + 1, local_start - 1, staged)[1]


def _split(first: int, last: int, ranges: Sequence[tuple[int, int]]) -> tuple[list[tuple[int, int]],
                                                                            list[tuple[int, int]]]:
    """``first..last`` as the parts ``ranges`` do not cover and those they do (inclusive ranges, ascending)."""
    uncovered: list[tuple[int, int]] = []
    covered: list[tuple[int, int]] = []
    at = first
    for a, b in sorted(ranges):
        if b < at or a > last:
            continue
        if a > at:
            uncovered.append((at, a - 1))
        hi = min(b, last)
        covered.append((max(a, at), hi))
        at = hi + 1
        if at > last:
            break
    if at <= last:
        uncovered.append((at, last))
    return uncovered, covered


def assess(tp: TopicIdPartition, leader: int, local: LocalRange | None,
           segments: Iterable[RemoteLogSegmentMetadata], local_dir: LocalDir | None = None, *,
           error: str | None = None) -> PartitionStatus:
    """One partition's status from the leader's ListOffsets answer (None: unknown, ``error`` says why), every
    metadata record of the partition, and (on the leader's host) its partition directory."""
    segments = list(segments)
    lineage = lineage_of(segments)  # the metadata's lineage: what every reader serves (rlm.tier)
    chain = remote_chain(segments, lineage)
    delete, kept = unchained(segments, chain, lineage)
    remote_end = chain[-1].end_offset_inclusive if chain else -1
    st = PartitionStatus(tp, leader, local, chain, None, None, error=error)
    st.duplicates = sum(1 for _md, why in delete if why == "duplicate")
    st.diverged = [(md, True) for md, why in delete if why == "diverged-lineage"]
    st.diverged += [(md, False) for md in kept if not lineage.holds(md)]
    st.diverged.sort(key=lambda d: (d[0].start_offset, d[0].end_offset_inclusive))
    st.kept = sum(1 for md in kept if lineage.holds(md))
    if local is not None:
        staged = local_dir.staged if local_dir is not None else ()
        st.holes = holes(chain, local.start_offset, staged)
        st.awaiting_copy = awaiting_copy(chain, local.start_offset, staged)
        st.lag_offsets = max(0, local.high_watermark - max(remote_end + 1, local.start_offset))
    if local_dir is not None:
        try:
            pdir = PartitionDir(local_dir.path)
            sizes = {s.base_offset: _size(s.log_path) for s in pdir.segments()}
            # As rlm_copy_lag_* in segment mode: rolled segments holding offsets above the remote end.
            rolled = [(base, end) for base, end in pdir.rolled_ranges() if end > remote_end and base in sizes]
            st.lag_segments = len(rolled)
            st.lag_bytes = sum(sizes[base] for base, _end in rolled)
            st.margin = retention_margin(local_dir.path, remote_end, (), retention_ms=local_dir.retention_ms,
                                         retention_bytes=local_dir.retention_bytes)
        except (FileNotFoundError, LogFormatError) as err:  # moved or deleted meanwhile: unknown, not a failure
            log.info("partition dir not readable: copy lag in segments and retention margin unknown", extra={
                "partition": str(tp), "path": str(local_dir.path), "error": str(err)})
    return st


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def topic_summary(statuses: Sequence[PartitionStatus]) -> dict[str, Any]:
    """The per-topic totals (the ``summary`` object of ``--json``)."""
    def total(values: list[int | None]) -> int | None:
        return None if any(v is None for v in values) else sum(v for v in values if v is not None)

    margins = [s.margin.seconds for s in statuses if s.margin is not None]
    return {
        "partitions": len(statuses),
        "partitions_remote": sum(1 for s in statuses if s.chain),
        "remote_segments": sum(len(s.chain) for s in statuses),
        "remote_bytes": sum(m.segment_size_bytes for s in statuses for m in s.chain),
        "copy_lag_offsets": total([s.lag_offsets for s in statuses]),
        "copy_lag_segments": total([s.lag_segments for s in statuses]),
        "copy_lag_bytes": total([s.lag_bytes for s in statuses]),
        "min_retention_margin_seconds": _finite(min(margins)) if margins else None,
        "partitions_with_holes": sum(1 for s in statuses if s.holes),
        "hole_offsets": sum(h.offsets for s in statuses for h in s.holes or ()),
        "duplicate_copies": sum(s.duplicates for s in statuses),
        "diverged_copies": sum(len(s.diverged) for s in statuses),
        "diverged_awaiting_deletion": sum(1 for s in statuses for _md, awaiting in s.diverged if awaiting),
        "partitions_unknown": sum(1 for s in statuses if s.local is None),
    }


# -------------------------------------------------------------------------------------------------- cluster
def list_local_ranges(client_config: dict[str, object], partitions: Iterable[tuple[str, int]],
                      timeout_s: float = 15.0) -> dict[tuple[str, int], LocalRange | str]:
    """ListOffsets earliest and latest (read_uncommitted: the high watermark) per partition, from its leader: its
    :class:`LocalRange`, or the error text when either went unanswered."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import AdminClient, OffsetSpec

    keys = sorted(set(partitions))
    if not keys:
        return {}
    admin = AdminClient(dict(client_config))
    answers: dict[str, dict[tuple[str, int], Any]] = {}
    for name, spec in (("earliest", OffsetSpec.earliest()), ("latest", OffsetSpec.latest())):
        futures = admin.list_offsets({TopicPartition(t, p): spec for t, p in keys}, request_timeout=timeout_s)
        got: dict[tuple[str, int], Any] = {}
        for tp, fut in futures.items():
            try:
                got[(tp.topic, tp.partition)] = fut.result(timeout_s + 5)
            except Exception as err:  # noqa: BLE001 - this partition's answer: an error (no leader, timed out)
                got[(tp.topic, tp.partition)] = f"ListOffsets {name}: {err}"
        answers[name] = got
    out: dict[tuple[str, int], LocalRange | str] = {}
    for key in keys:
        lo, hi = answers["earliest"].get(key, "no answer"), answers["latest"].get(key, "no answer")
        if isinstance(lo, str) or isinstance(hi, str):
            out[key] = lo if isinstance(lo, str) else hi
            log.warning("local range unknown", extra={"partition": f"{key[0]}-{key[1]}", "error": out[key]})
        else:
            out[key] = LocalRange(lo.offset, hi.offset, hi.leader_epoch)
    return out


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _local_dirs(ctx: CliContext, infos: dict[tuple[str, int], PartitionInfo],
                configs: dict[str, dict[str, str | None] | None]) -> dict[tuple[str, int], LocalDir]:
    """The partitions whose leader is this config's broker and whose directory (under its topic id) is here."""
    s = ctx.settings
    led = {k: i for k, i in infos.items() if i.leader == s.broker_id}
    if not led:
        return {}
    roots = list(staging_roots(s.log_dirs, s.staging_dir).values())
    out = {}
    for key, lp in scan_log_dirs(s.log_dirs).items():
        info = led.get(key)
        if info is None:
            continue
        try:
            if PartitionDir(lp.path).topic_id != info.topic_id:
                continue  # left over from a deleted topic of the same name
        except (FileNotFoundError, LogFormatError):
            continue
        cfg = configs.get(key[0]) or {}
        try:
            staged = tuple(staged_ranges(roots, TopicIdPartition(info.topic_id, key[0], key[1])))
        except OSError as err:  # not known: what is missing is reported as a hole
            log.info("staging dir not readable: no offsets counted as awaiting copy", extra={
                "partition": f"{key[0]}-{key[1]}", "error": str(err)})
            staged = ()
        out[key] = LocalDir(lp.path, _int(cfg.get("retention.ms")), _int(cfg.get("retention.bytes")), staged)
    return out


# ---------------------------------------------------------------------------------------------- command
def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status", help="per partition: local and remote ranges, copy lag, retention margin, holes, diverged copies",
        description="Per partition: the leader's local range, the remote range, the copy lag, the retention margin, "
                    "holes (offsets neither local nor remote) and copies awaiting deletion; a summary per topic. "
                    "Exit codes: 0 no hole; 1 a partition has a hole; 2 bad arguments or config, or no such topic; "
                    "5 the principal lacks an ACL; 6 the Kafka cluster did not answer within --timeout.")
    add_config_arg(p)
    add_timeout_arg(p)
    p.add_argument("topics", nargs="*", metavar="TOPIC",
                   help="topics (default: every topic on the cluster the config tiers)")
    p.add_argument("--json", action="store_true", help="one JSON object per topic (schema: README, 'rlm status')")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with open_context(args) as ctx:
        names = list(dict.fromkeys(args.topics)) or _tiered_topics(ctx)
        tps = {t: ctx.partitions(t) for t in names}  # exits 2 (unknown) or 5 (no DESCRIBE) before any output
        infos = ctx.view.partitions(names) if names else {}
        configs = ctx.view.topic_configs(names) if names else {}
        keys = [(tp.topic, tp.partition) for t in names for tp in tps[t]]
        ranges = list_local_ranges(ctx.settings.kafka.client_config(), keys, ctx.view.timeout_s)
        dirs = _local_dirs(ctx, infos, configs)
        any_hole = False
        for t in names:
            statuses = []
            for tp in tps[t]:
                key = (tp.topic, tp.partition)
                info = infos.get(key)
                got = ranges.get(key, "no answer")
                local = got if isinstance(got, LocalRange) else None
                error = got if isinstance(got, str) else None
                statuses.append(assess(tp, info.leader if info else -1, local,
                                       ctx.rlmm.list_remote_log_segments(tp), dirs.get(key), error=error))
            any_hole |= any(s.holes for s in statuses)
            if args.json:
                print(json.dumps({"topic": t, "topic_id": str(tps[t][0].topic_id), "summary": topic_summary(statuses),
                                  "partitions": [s.to_json() for s in statuses]}))
            else:
                _print_topic(t, statuses)
    return EXIT_HOLE if any_hole else 0


def _tiered_topics(ctx: CliContext) -> list[str]:
    """Every topic on the cluster this config tiers (``topics`` rules; compacted topics never are)."""
    names = sorted({t for t, _p in ctx.view.partitions() if ctx.settings.topics.tiered(t)})
    compaction = ctx.view.compaction(names) if names else {}
    return [t for t in names if compaction.get(t) is False]


# ------------------------------------------------------------------------------------------------- text
def _range(lo: int | None, hi: int | None) -> str:
    return "-" if lo is None or hi is None else f"{lo}..{hi}"


def _bytes(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n}"


def _print_topic(topic: str, statuses: Sequence[PartitionStatus]) -> None:
    print(f"{'PARTITION':>9} {'LEADER':>6} {'LOCAL':>23} {'REMOTE':>23} {'LAG_OFFSETS':>11} {'LAG_SEGS':>8} "
          f"{'LAG_BYTES':>10} {'MARGIN_S':>9}  NOTES")
    for s in statuses:
        j = s.to_json()
        loc, rem, lag, m = j["local"], j["remote"], j["copy_lag"], j["retention_margin"]
        local = "?" if loc is None else (f"empty at {loc['high_watermark']}" if loc["end_offset_inclusive"] is None
                                         else _range(loc["start_offset"], loc["end_offset_inclusive"]))
        remote = "-" if rem is None else _range(rem["start_offset"], rem["end_offset_inclusive"])
        margin = "?" if m is None else ("inf" if m["seconds"] is None else f"{m['seconds']:.0f}")
        notes = []
        if s.error:
            notes.append(f"error: {s.error}")
        for h in s.holes or ():
            notes.append(f"HOLE {h.first_offset}..{h.last_offset} ({h.where})")
        for a, b in s.awaiting_copy:
            notes.append(f"staged {a}..{b} (deleted locally, awaiting copy)")
        awaiting = sum(1 for _md, a in s.diverged if a)
        if awaiting:
            notes.append(f"{awaiting} diverged copies awaiting deletion")
        if len(s.diverged) - awaiting:
            notes.append(f"{len(s.diverged) - awaiting} diverged copies kept (offsets the chain lacks)")
        if s.duplicates:
            notes.append(f"{s.duplicates} duplicate copies awaiting deletion")
        if s.kept:
            notes.append(f"{s.kept} unserved copies kept (offsets the chain lacks)")
        print(f"{s.tp.partition:>9} {s.leader:>6} {local:>23} {remote:>23} "
              f"{'?' if lag['offsets'] is None else lag['offsets']:>11} "
              f"{'?' if lag['segments'] is None else lag['segments']:>8} {_bytes(lag['bytes']):>10} {margin:>9}  "
              f"{', '.join(notes) or '-'}")
    print(_summary_line(topic, topic_summary(statuses)))


def _summary_line(topic: str, s: dict[str, Any]) -> str:
    parts = [f"{s['partitions']} partition{'' if s['partitions'] == 1 else 's'}",
             f"{s['partitions_remote']} with remote data ({s['remote_segments']} segments, "
             f"{_bytes(s['remote_bytes'])})"]
    lag = "?" if s["copy_lag_offsets"] is None else s["copy_lag_offsets"]
    parts.append(f"copy lag {lag} offsets" + ("" if s["copy_lag_segments"] is None else
                                              f", {s['copy_lag_segments']} segments, {_bytes(s['copy_lag_bytes'])}"))
    if s["min_retention_margin_seconds"] is not None:
        parts.append(f"min retention margin {s['min_retention_margin_seconds']:.0f} s")
    if s["partitions_with_holes"]:
        parts.append(f"HOLES in {s['partitions_with_holes']} partition{'' if s['partitions_with_holes'] == 1 else 's'}"
                     f" ({s['hole_offsets']} offsets neither local nor remote)")
    else:
        parts.append("no holes")
    if s["diverged_copies"] or s["duplicate_copies"]:
        parts.append(f"{s['diverged_awaiting_deletion']} diverged and {s['duplicate_copies']} duplicate copies "
                     f"awaiting deletion")
    kept = s["diverged_copies"] - s["diverged_awaiting_deletion"]
    if kept:
        parts.append(f"{kept} diverged copies kept until the chain covers them")
    if s["partitions_unknown"]:
        parts.append(f"{s['partitions_unknown']} partitions with no local range (see error)")
    return f"{topic}: " + "; ".join(parts)
