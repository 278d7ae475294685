"""What ``/health`` answers: the sidecar's readiness, check by check, and the retention margin.

Readiness (``/health``, ``/health/ready``: 200 when every check passes, else 503 with the failing checks' reasons):

- ``broker``: a discovery round (DescribeTopics on the cluster) succeeded within ``max(health.broker_stale_ms,
  6 rounds)``;
- ``log_dirs``: every configured log dir exists and is readable (``rlm_log_dir_ok{log_dir}``). The sidecar starts
  even when none exists yet (a broker creates them at its first start, and may start after the sidecar): it is not
  ready until they appear;
- ``metadata``: the metadata cache has caught up with the metadata partitions of every partition served;
- ``store``: fewer than ``health.store_failures`` store requests failed in a row (a probe each discovery round,
  one HEAD of a key no copy uses, and every copy);
- ``retention_margin``: no led partition's margin is below ``health.min_retention_margin_ms``.

Liveness (``/health/live``): 200 while the scheduler runs and a discovery round has been attempted within
``max(120 s, 12 rounds)``; a sidecar stuck that long is better restarted.

**Retention margin.** In sidecar mode the broker deletes local segments by the topic's ``retention.ms`` /
``retention.bytes`` whether they are tiered or not. The margin of a partition is how long (and how many more
bytes appended) until the broker's retention reaches its oldest segment that is neither tiered nor staged (a
staged segment is hard-linked: safe). Kafka's rules: a segment is deleted by time once its largest timestamp is
``retention.ms`` old, by size once the log without it and every older segment is still at least
``retention.bytes``. Unlimited retention, or nothing at risk, is an infinite margin.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rsm.log.indexes import read_time_index
from rsm.log.partition import PartitionDir, Segment

if TYPE_CHECKING:
    from rlm.config import HealthSettings

__all__ = ["Margin", "MarginCache", "StoreHealth", "liveness", "log_dir_problems", "readiness", "retention_margin"]


def readiness(h: HealthSettings, *, discovery_interval_ms: float, last_discovery_ok: float | None,
              last_error: str | None, not_caught_up: Iterable[str], log_dir_problems: Mapping[str, str],
              store_probes: StoreHealth, store_copies: StoreHealth, margins: Mapping[object, Margin],
              now: float | None = None) -> tuple[bool, dict[str, dict[str, object]]]:
    """Readiness (see the module doc): (every check passes, each check ``{"ok": bool, ...its reason}``).

    ``last_discovery_ok``: when a discovery round last succeeded (epoch seconds; None: never); ``last_error``: the
    sidecar's last error, the broker check's reason; ``not_caught_up``: the served partitions whose metadata cache
    has not caught up; ``margins``: each led partition's retention margin."""
    now = time.time() if now is None else now
    window_s = max(h.broker_stale_ms, 6 * discovery_interval_ms) / 1000
    broker_ok = last_discovery_ok is not None and now - last_discovery_ok < window_s
    behind = list(not_caught_up)
    failures = max(store_probes.consecutive_failures, store_copies.consecutive_failures)
    low = {str(tp): {"seconds": m.seconds, "bytes": m.bytes, "segment": m.segment}
           for tp, m in list(margins.items()) if m.seconds * 1000 < h.min_retention_margin_ms}
    checks: dict[str, dict[str, object]] = {
        "broker": {"ok": broker_ok, "last_discovery_ok": last_discovery_ok,
                   **({} if broker_ok else {"reason": last_error or "no discovery round succeeded yet"})},
        "log_dirs": {"ok": not log_dir_problems, "problems": log_dir_problems},
        "metadata": {"ok": not behind, "not_caught_up": behind},
        "store": {"ok": failures < h.store_failures, "failures_in_a_row": failures,
                  "last_error": store_copies.last_error if store_copies.consecutive_failures
                  else store_probes.last_error},
        "retention_margin": {"ok": not low, "below_min": low, "min_ms": h.min_retention_margin_ms},
    }
    return all(c["ok"] for c in checks.values()), checks


def liveness(*, discovery_interval_ms: float, scheduler_running: bool, last_discovery_attempt: float | None,
             now: float | None = None) -> tuple[bool, dict[str, object]]:
    """Liveness (see the module doc): the scheduler runs and a discovery round was attempted within
    ``max(120 s, 12 rounds)``."""
    window_s = max(120.0, 12 * discovery_interval_ms / 1000)
    now = time.time() if now is None else now
    ok = scheduler_running and last_discovery_attempt is not None and now - last_discovery_attempt < window_s
    return ok, {"last_discovery_attempt": last_discovery_attempt, "scheduler_running": scheduler_running}


@dataclass(frozen=True, slots=True)
class Margin:
    seconds: float  # math.inf: nothing at risk or no time retention
    bytes: float  # math.inf likewise
    segment: int | None  # base offset of the oldest segment at risk


def retention_margin(partition_dir: Path, tiered_offset: int, staged_bases: Iterable[int], *,
                     retention_ms: int | None, retention_bytes: int | None, now_ms: float | None = None) -> Margin:
    """The margin of one partition (see the module doc). ``tiered_offset``: the highest offset tiered (-1: none)."""
    return _Listing(partition_dir).margin(tiered_offset, staged_bases, retention_ms=retention_ms,
                                          retention_bytes=retention_bytes, now_ms=now_ms)


class MarginCache:
    """:func:`retention_margin` of many partitions, every few seconds, without listing each directory every time.

    Per partition directory, the segment list, the rolled segments' sizes and largest timestamps are kept while the
    directory's mtime is the same (a roll, a retention rename or delete changes it); the active segment is
    ``stat``-ed each time (appends grow it). A listing is kept only once its directory's mtime is
    :data:`SETTLED_NS` old: two changes within one tick of the filesystem's clock may leave the same mtime.
    Thread-safe enough for one caller (the gauges job)."""

    SETTLED_NS = 2_000_000_000

    def __init__(self) -> None:
        self._listings: dict[Path, tuple[int, _Listing]] = {}

    def margin(self, partition_dir: Path, tiered_offset: int, staged_bases: Iterable[int], *,
               retention_ms: int | None, retention_bytes: int | None, now_ms: float | None = None) -> Margin:
        """As :func:`retention_margin`; raises FileNotFoundError when the directory is gone."""
        mtime_ns = os.stat(partition_dir).st_mtime_ns
        kept = self._listings.get(partition_dir)
        if kept is not None and kept[0] == mtime_ns:
            listing = kept[1]
        else:
            listing = _Listing(partition_dir)
            if time.time_ns() - mtime_ns >= self.SETTLED_NS:
                self._listings[partition_dir] = (mtime_ns, listing)
            else:
                self._listings.pop(partition_dir, None)
        return listing.margin(tiered_offset, staged_bases, retention_ms=retention_ms,
                              retention_bytes=retention_bytes, now_ms=now_ms)

    def keep_only(self, partition_dirs: Iterable[Path]) -> None:
        """Forget the listings of every other directory (partitions no longer led)."""
        keep = set(partition_dirs)
        for path in set(self._listings) - keep:
            del self._listings[path]


class _Listing:
    """A partition directory's segments, listed once; the rolled ones' sizes and largest timestamps read once."""

    def __init__(self, partition_dir: Path) -> None:
        self.segments = PartitionDir(partition_dir).segments()
        self._rolled_sizes = [_size(s.log_path) for s in self.segments[:-1]]
        self._largest: dict[int, float] = {}

    def margin(self, tiered_offset: int, staged_bases: Iterable[int], *, retention_ms: int | None,
               retention_bytes: int | None, now_ms: float | None) -> Margin:
        now_ms = time.time() * 1000 if now_ms is None else now_ms
        segments = self.segments
        active: os.stat_result | None = None
        if segments:
            try:
                active = segments[-1].log_path.stat()
            except FileNotFoundError:
                pass
        staged = set(staged_bases)
        sizes = [*self._rolled_sizes, active.st_size if active is not None else 0] if segments else []
        total = sum(sizes)
        cum = 0
        for i, seg in enumerate(segments):
            cum += sizes[i]
            end = segments[i + 1].base_offset - 1 if i + 1 < len(segments) else None
            if (end is not None and end <= tiered_offset) or seg.base_offset in staged:
                continue
            if end is None and not sizes[i]:
                break  # an empty active segment: nothing at risk
            if retention_ms is None or retention_ms < 0:
                ms = math.inf
            elif end is None:  # the active segment: its index is preallocated, its mtime is its newest append
                ms = (active.st_mtime * 1000 if active is not None else now_ms) + retention_ms - now_ms
            else:
                if seg.base_offset not in self._largest:
                    self._largest[seg.base_offset] = _largest_timestamp(seg)
                ms = self._largest[seg.base_offset] + retention_ms - now_ms
            by = math.inf if retention_bytes is None or retention_bytes < 0 else retention_bytes + cum - total
            return Margin(ms / 1000, by, seg.base_offset)
        return Margin(math.inf, math.inf, None)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _largest_timestamp(seg: Segment) -> float:
    """Kafka's ``LogSegment.largestTimestamp`` of a rolled segment: its time index's largest timestamp, else the
    file's mtime."""
    try:
        entries = read_time_index(seg.time_index_path, seg.base_offset)
        if entries:
            return float(max(e.timestamp_ms for e in entries))
        return seg.log_path.stat().st_mtime * 1000
    except (FileNotFoundError, ValueError):
        return time.time() * 1000


def log_dir_problems(log_dirs: Iterable[Path]) -> dict[str, str]:
    """Each configured log dir that is missing or unreadable, with the reason."""
    out = {}
    for d in log_dirs:
        p = Path(d)
        if not p.exists():
            out[str(p)] = "missing"
        elif not p.is_dir():
            out[str(p)] = "not a directory"
        elif not os.access(p, os.R_OK | os.X_OK):
            out[str(p)] = "not readable"
        else:
            try:
                next(iter(os.scandir(p)), None)
            except OSError as err:
                out[str(p)] = f"not readable: {err.strerror}"
    return out


class StoreHealth:
    """Consecutive failed store requests (probes and copies), thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self.last_ok: float | None = None

    def ok(self) -> None:
        with self._lock:
            self.consecutive_failures = 0
            self.last_ok = time.time()

    def failed(self, err: BaseException) -> None:
        with self._lock:
            self.consecutive_failures += 1
            self.last_error = f"{type(err).__name__}: {err}"
