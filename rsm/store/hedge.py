"""Hedged requests for S3's slow outliers (issue 25): a GET that has not answered by the p95 of recent GETs' answer
times is sent a second time; whichever answers first is used, the other's answer is closed unread.

On S3 a GET's first byte takes about 27 ms at the median (lognormal, sigma about 0.6: p95 about 70 ms), and now and
then 0.4-2 s: one such outlier stalls a random read, or a sequential read's whole window. A second request after the
p95 costs about 5% more GETs and cuts that tail to about p95 plus one more first byte ("The Tail at Scale", Dean and
Barroso, 2013).

- The delay: the 95th percentile of the last :data:`WINDOW` answer times (the time until ``GetObject``'s headers came,
  from the first request sent), never below :data:`MIN_DELAY_S`; no hedging before :data:`MIN_SAMPLES` answers.
- The bound: hedges are paid from a budget that every GET adds ``share`` to (at most :data:`BURST` hedges saved
  up): hedges stay within ``share`` of GETs (plus the burst), however slow the store gets (a store slow for every
  request is not helped by asking twice).
- Counted: ``rsm_store_hedged_requests_total{store,result}`` (``won``: the second request answered first; ``lost``:
  the first did, the second was wasted).

Answers are waited for on a pool of their own (never the pools that call the store: a read-ahead GET runs on
:func:`rsm.format.crypto.worker_pool`), so a hedged request never waits for a thread its caller holds.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Generic, TypeVar

from prometheus_client import Counter

__all__ = ["BURST", "HEDGE_SHARE", "MIN_DELAY_S", "MIN_SAMPLES", "WINDOW", "Hedger"]

_T = TypeVar("_T")

HEDGE_SHARE = 0.05
"""The most hedges per request by default: what hedging after the p95 costs when the store behaves."""
WINDOW = 200
"""Answer times the p95 is taken over (the most recent)."""
MIN_SAMPLES = 20
"""Answers seen before the first hedge: until then no p95 is trusted."""
MIN_DELAY_S = 0.010
"""The shortest hedge delay (a store on 127.0.0.1 answers in well under that: no hedging there)."""
BURST = 5.0
"""Hedges the budget saves up at most."""
POOL_THREADS = 64
"""Threads of the pool requests wait on (threads start as needed)."""

HEDGED = Counter("rsm_store_hedged_requests", "Second requests sent for a request slower than the p95 of recent "
                 "ones: won (answered first) or lost", ["store", "result"])

_pool_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None


def _requests_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(POOL_THREADS, thread_name_prefix="rsm-hedge")
        return _pool


class Hedger(Generic[_T]):
    """Runs requests hedged (see the module doc), for one store. Thread-safe.

    ``share``: the most hedges per request (0: never hedge, and no thread hop either); ``discard(answer)``: what to
    do with the answer that came second (close its body); ``store``: the metric's label; ``fixed_delay_s``: hedge
    after this delay rather than the p95 (tests)."""

    def __init__(self, share: float, discard: Callable[[_T], None], *, store: str = "s3",
                 fixed_delay_s: float | None = None) -> None:
        if not 0 <= share <= 1:
            raise ValueError(f"hedge share must be in [0, 1], got {share}")
        self.share = share
        self.fixed_delay_s = fixed_delay_s
        """A delay of its own instead of the p95 (None: the p95)."""
        self._discard = discard
        self._store = store
        self._lock = threading.Lock()
        self._times: deque[float] = deque(maxlen=WINDOW)
        self._since_sorted = 0
        self._p95: float | None = None
        self._tokens = 0.0
        self.hedges = 0
        """Hedges sent so far."""
        self.won = 0
        """Hedges that answered first."""

    def delay_s(self) -> float | None:
        """The current hedge delay: None while fewer than :data:`MIN_SAMPLES` answers were seen."""
        with self._lock:
            return self._delay_locked()

    def _delay_locked(self) -> float | None:
        if self.fixed_delay_s is not None:
            return self.fixed_delay_s
        if len(self._times) < MIN_SAMPLES:
            return None
        if self._p95 is None or self._since_sorted >= 10:
            ordered = sorted(self._times)
            self._p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
            self._since_sorted = 0
        return max(MIN_DELAY_S, self._p95)

    def _observe(self, seconds: float) -> None:
        with self._lock:
            self._times.append(seconds)
            self._since_sorted += 1

    def _earn(self) -> tuple[float | None, bool]:
        """A request starts: its share goes to the budget; (the delay after which it may be hedged, None while no
        p95 is known; whether the budget holds a hedge now)."""
        with self._lock:
            self._tokens = min(BURST, self._tokens + self.share)
            return self._delay_locked(), self._tokens >= 1

    def _spend(self) -> bool:
        with self._lock:
            if self._tokens < 1:
                return False
            self._tokens -= 1
            self.hedges += 1
            return True

    def call(self, request: Callable[[], _T]) -> _T:
        """``request()``'s answer: hedged by a second ``request()`` when the first is slower than the delay and the
        budget allows. An error of the first is raised only if the second also fails (or was never sent)."""
        if self.share == 0:
            return request()
        delay, affordable = self._earn()
        t0 = time.monotonic()
        if delay is None or not affordable:  # nothing to hedge by, or no budget: no thread hop either
            answer = request()
            self._observe(time.monotonic() - t0)
            return answer
        first = _requests_pool().submit(request)
        done, _ = wait([first], timeout=delay)
        if done or not self._spend():
            answer = first.result()
            self._observe(time.monotonic() - t0)
            return answer
        second = _requests_pool().submit(request)
        pending = {first, second}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for f in (first, second):  # the first's answer wins a tie
                if f in done and f.exception() is None:
                    self._observe(time.monotonic() - t0)
                    won = f is second
                    with self._lock:
                        self.won += won
                    HEDGED.labels(self._store, "won" if won else "lost").inc()
                    for other in pending:
                        other.add_done_callback(self._discard_answer)
                    return f.result()
        HEDGED.labels(self._store, "lost").inc()
        return first.result()  # both failed: the first's error

    def _discard_answer(self, f: Future[_T]) -> None:
        if not f.cancelled() and f.exception() is None:
            try:
                self._discard(f.result())
            except Exception:  # noqa: BLE001 - closing an unread answer; nothing to do if it fails
                pass
