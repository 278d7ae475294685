"""Fetches waiting for the tier to grow (long polls), as Kafka's DelayedFetch, re-checked together.

A Fetch with less than ``min_bytes`` of data waits up to its ``max_wait`` (capped) for newly tiered data: it becomes
one :class:`PendingFetch` (its partitions, deadline, ``min_bytes``, its connection, the tier bounds it was answered
from) in the server's :class:`LongPolls`. One ticker serves them all: every ``poll_s`` it drops the polls whose
client closed the connection (no tier read for them), then re-reads the bounds of every partition anyone waits on,
once each, in one worker job, and wakes only the polls one of whose partitions changed. A waiting Fetch holds no
worker thread.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter, Gauge

from rlm.logs import limited_logger
from rlm.tier import TierView, UnreadableCopyError

__all__ = ["EXPIRED", "GONE", "GROWN", "LongPolls", "Mark", "PendingFetch", "tier_marks"]

log = limited_logger(__name__)

WAITING = Gauge("rlm_history_waiting_fetches", "Fetches waiting for data (long polls) now")
POLL_TICKS = Counter("rlm_history_long_poll_ticks", "Ticks of the long-poll ticker (one bounds read of the partitions "
                     "polls wait on, each)")
POLL_WAKEUPS = Counter("rlm_history_long_poll_wakeups",
                       "Long polls woken: grown (their tier), expired (deadline), gone (client left)", ["reason"])


Mark = tuple[int, int, int] | None  # a partition's tier bounds (log start, high watermark, last stable offset)
UNREADABLE_MARK: Mark = (-1, -1, -1)  # a tier that cannot be read: a change from any real mark
GROWN, EXPIRED, GONE = "grown", "expired", "gone"


def tier_marks(tier: TierView, tps: Any) -> dict[Any, Mark]:
    """Each partition's bounds as the tier serves them now (None: nothing of it is remote). Blocks: a worker's."""
    marks: dict[Any, Mark] = {}
    for tp in tps:
        try:
            pt = tier.partition(tp)
        except UnreadableCopyError:
            marks[tp] = UNREADABLE_MARK
            continue
        marks[tp] = None if pt is None else (pt.log_start_offset, pt.high_watermark, pt.last_stable_offset)
    return marks


@dataclass(eq=False, slots=True)
class PendingFetch:
    """One Fetch waiting for data (a long poll): what it waits on and the bounds its last answer was made from.
    ``woken`` is done with GROWN, EXPIRED or GONE; the object is the same across its re-runs."""

    tps: frozenset[Any]
    deadline: float  # event-loop time
    min_bytes: int
    gone: Callable[[], bool]  # its client closed the connection
    seen: dict[Any, Mark]
    woken: asyncio.Future[str]
    timer: asyncio.TimerHandle | None = None
    expired: bool = False


class LongPolls:
    """The waiting Fetches of one server, re-checked together (on the event loop only, but for the bounds read).

    One ticker task runs while any poll waits; each ``poll_s`` it wakes with GONE the polls whose client left, then
    reads, in one worker job, the bounds of the union of the partitions the others wait on (:meth:`TierView.refresh`
    once, then one chain per partition) and wakes with GROWN each poll one of whose partitions' bounds differ from
    those its last answer was made from. A poll's deadline is a timer (EXPIRED). ``ticks`` counts the ticks that read
    bounds (the ``rlm_history_long_poll_ticks`` counter in all servers)."""

    def __init__(self, tier: TierView, pool: concurrent.futures.Executor, poll_s: float) -> None:
        self.tier = tier
        self.pool = pool
        self.poll_s = poll_s
        self.ticks = 0
        self._waiting: set[PendingFetch] = set()
        self._ticker: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._waiting)

    def add(self, p: PendingFetch) -> None:
        loop = asyncio.get_running_loop()
        self._waiting.add(p)
        WAITING.inc()
        p.timer = loop.call_at(p.deadline, self._expire, p)
        if self._ticker is None or self._ticker.done():
            self._ticker = loop.create_task(self._tick_loop(), name="rlm-history-long-polls")

    def discard(self, p: PendingFetch) -> None:
        if p in self._waiting:
            self._waiting.remove(p)
            WAITING.dec()
        if p.timer is not None:
            p.timer.cancel()

    @staticmethod
    def wake(p: PendingFetch, reason: str) -> None:
        if not p.woken.done():
            POLL_WAKEUPS.labels(reason).inc()
            p.woken.set_result(reason)

    def _expire(self, p: PendingFetch) -> None:
        p.expired = True  # seen by a poll woken (GROWN) and re-running meanwhile
        self.wake(p, EXPIRED)

    async def _tick_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while self._waiting:
            await asyncio.sleep(self.poll_s)
            live = []
            for p in list(self._waiting):
                if p.woken.done():
                    continue  # re-running or answering: it is re-checked when it waits again
                if p.gone():
                    self.wake(p, GONE)  # its client left: no bounds read for it, its answer is never made
                else:
                    live.append(p)
            if not live:
                continue
            tps = frozenset().union(*(p.tps for p in live))
            self.ticks += 1
            POLL_TICKS.inc()
            try:
                marks = await loop.run_in_executor(self.pool, self._read_marks, tps)
            except Exception:  # noqa: BLE001 - one failed tick must not end every long poll's re-check
                log.exception("history endpoint: long polls: reading the tier bounds failed",
                              extra={"partitions": len(tps), "waiting": len(live)})
                continue
            for p in live:
                if any(marks.get(tp) != p.seen.get(tp) for tp in p.tps):
                    self.wake(p, GROWN)

    def _read_marks(self, tps: frozenset[Any]) -> dict[Any, Mark]:
        self.tier.refresh(tps)
        return tier_marks(self.tier, tps)
