"""The broker's bounds of partitions as one upstream connection learned them, so that a history Fetch need not ask.

A Fetch below the broker's log start costs three trips to the broker when asked for each (the Fetch answered
OFFSET_OUT_OF_RANGE, then ListOffsets EARLIEST and LATEST: an error answer carries no bounds); bench_proxy's profile
of a history read had those at 18% of the proxy's CPU, more than the tier read. :class:`KnownBounds` keeps what the
ListOffsets answered, per partition (its topic id included: a topic deleted and created again is another key), for
``fresh_s``; :mod:`rlm.listener.upstream.proxy` then

- answers a read_uncommitted Fetch whose every partition asks below a known log start from the tier alone
  (:func:`rlm.listener.tier.boundary.fetch_from_tier`), and
- takes a known log start for a partition the broker answers OFFSET_OUT_OF_RANGE when the fetch offset is below it,

asking the broker again once the bounds are older than ``fresh_s``. Why it stays exact: the broker's log start only
moves up, so an offset below a known one is below the broker's too (the broker would answer OFFSET_OUT_OF_RANGE and
the tier's answer would be merged in), and whatever the tier serves is the log's own records; where the tier has
nothing at an offset, the broker is asked, as without the cache. Known log starts are kept at the largest seen (a
new leader's log start may be below its predecessor's: an offset between the two is served from the tier, which holds
it, instead of the broker). read_committed (librdkafka's default): a Fetch is answered from the tier alone only when
the broker's last stable offset is known (asked by a read_committed Fetch's ListOffsets) and the tier of each
partition sees no transaction open at its end (its last stable offset is its high watermark): the tier then decides
every transaction it serves by its own indexes, as the exact path does, and the broker's last stable offset is only
reported (a stale one is lower, as a consumer's lag). A tier with a transaction open at its end needs the broker's
aborted transactions: asked each time. A partition the broker answers OFFSET_OUT_OF_RANGE takes a known log start
only for read_uncommitted. What skipping the broker's Fetch costs: a leader that moved, or a client's stale
leader epoch, is told at the next Fetch that reaches the broker (at most ``fresh_s`` later, or at the live data).

One instance per upstream connection (so per client connection and per broker: a follower's bounds never mix with
its leader's), used on the listener's event loop only.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rlm.listener.tier.boundary import BrokerBounds
from rlmm.api import TopicIdPartition

__all__ = ["BOUNDS_FRESH_S", "KnownBounds"]

BOUNDS_FRESH_S = 1.0  # bounds older than this are asked again (a high watermark this stale is a consumer's lag)
MAX_KNOWN = 100_000  # partitions remembered per connection (then forgotten all at once, and asked again)


class KnownBounds:
    def __init__(self, fresh_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.fresh_s = BOUNDS_FRESH_S if fresh_s is None else fresh_s
        self.clock = clock
        self._known: dict[TopicIdPartition, tuple[float, BrokerBounds, bool]] = {}  # (when, bounds, LSO asked)

    def learn(self, tp: TopicIdPartition, bounds: BrokerBounds, *, stable: bool) -> None:
        """The broker's bounds of ``tp`` as it answered them just now (its aborted transactions not kept);
        ``stable``: their last stable offset is the broker's (asked: ListOffsets LATEST read_committed), not its
        high watermark standing in for it. A last stable offset known before is kept when none is asked now (it
        only moves up: an older one is lower, as a consumer's lag)."""
        old = self._known.get(tp)
        start, lso = bounds.log_start_offset, bounds.last_stable_offset
        if old is not None:
            start = max(start, old[1].log_start_offset)
            if not stable and old[2]:
                lso, stable = old[1].last_stable_offset, True
        if len(self._known) >= MAX_KNOWN and old is None:
            self._known.clear()
        hw = max(bounds.high_watermark, start)
        self._known[tp] = (self.clock(), BrokerBounds(start, hw, min(max(lso, start), hw)), stable)

    def below(self, tp: TopicIdPartition, offset: int, *, stable: bool = False) -> BrokerBounds | None:
        """The known bounds of ``tp`` when they are fresh and ``offset`` is below their log start (and with
        ``stable``, their last stable offset is the broker's); else None."""
        got = self._known.get(tp)
        if (got is None or not 0 <= offset < got[1].log_start_offset or self.clock() - got[0] > self.fresh_s
                or (stable and not got[2])):
            return None
        return got[1]

    def clear(self) -> None:
        self._known.clear()
