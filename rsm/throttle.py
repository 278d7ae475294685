"""Byte-rate throttles (Pulsar PIP-211 offload throttling, Kafka KIP-956 tiered storage quotas).

A :class:`Throttle` is a token bucket shared by every thread that draws on it (all concurrent copies share
one, all remote fetches another). ``acquire(n)`` takes ``n`` bytes' worth of tokens and sleeps, outside the
lock, until the bucket has paid them back: callers are served in arrival order and a burst larger than the
bucket goes into debt rather than stalling forever. The rate may be changed at run time (``set_rate``);
``None`` means unlimited.

Metrics (prometheus_client, label ``throttle``): ``rsm_throttle_bytes_total`` (bytes that passed),
``rsm_throttle_seconds_total`` (seconds callers slept), ``rsm_throttle_rate_bytes_per_second`` (0 = unlimited).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from prometheus_client import Counter, Gauge

__all__ = ["THROTTLE_BYTES", "THROTTLE_RATE", "THROTTLE_SECONDS", "Throttle"]

THROTTLE_BYTES = Counter("rsm_throttle_bytes", "Bytes that passed a remote storage throttle", ["throttle"])
THROTTLE_SECONDS = Counter("rsm_throttle_seconds", "Seconds callers waited on a remote storage throttle",
                           ["throttle"])
THROTTLE_RATE = Gauge("rsm_throttle_rate_bytes_per_second", "Configured rate of a remote storage throttle "
                      "(0 = unlimited)", ["throttle"])


class Throttle:
    """A thread-safe token bucket of bytes.

    ``burst_seconds`` sizes the bucket (``rate * burst_seconds`` bytes): how much may pass at once after a
    quiet spell. ``clock``/``sleep`` are injectable for tests.
    """

    def __init__(self, name: str, rate_bytes_per_second: float | None, *, burst_seconds: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.name = name
        self.burst_seconds = burst_seconds
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._rate: float | None = None
        self._tokens = 0.0
        self._last = clock()
        self._bytes = THROTTLE_BYTES.labels(name)
        self._seconds = THROTTLE_SECONDS.labels(name)
        self._gauge = THROTTLE_RATE.labels(name)
        self.set_rate(rate_bytes_per_second)

    @property
    def rate_bytes_per_second(self) -> float | None:
        return self._rate

    def _refill(self, now: float) -> None:
        if self._rate is not None:
            cap = self._rate * self.burst_seconds
            self._tokens = min(cap, self._tokens + (now - self._last) * self._rate)
        self._last = now

    def set_rate(self, rate_bytes_per_second: float | None) -> None:
        """Change the rate now (``None`` or 0: unlimited). Bytes already owed are repaid at the new rate."""
        if rate_bytes_per_second is not None and rate_bytes_per_second < 0:
            raise ValueError(f"negative throttle rate {rate_bytes_per_second}")
        with self._lock:
            self._refill(self._clock())
            new = rate_bytes_per_second or None
            if new is not None and self._rate is None:
                self._tokens = new * self.burst_seconds  # start full, as a fresh bucket
            self._rate = new
            self._gauge.set(new or 0)

    def acquire(self, n_bytes: int, cancel: threading.Event | None = None) -> float:
        """Take ``n_bytes``; sleep until the budget allows it. Returns the seconds slept. With ``cancel``: the sleep
        ends when it is set, and the bytes are given back (a cancelled copy never sends them, and leaves no debt
        behind for the copies after it); the caller checks ``cancel`` itself."""
        with self._lock:
            self._bytes.inc(n_bytes)
            if self._rate is None:
                return 0.0
            now = self._clock()
            self._refill(now)
            self._tokens -= n_bytes
            wait = -self._tokens / self._rate if self._tokens < 0 else 0.0
        if wait <= 0:
            return 0.0
        if cancel is None:
            self._seconds.inc(wait)
            self._sleep(wait)
            return wait
        started = self._clock()
        if cancel.wait(wait):
            slept = max(0.0, self._clock() - started)
            with self._lock:  # the bytes were never sent: as if they had never been taken
                if self._rate is not None:
                    self._refill(self._clock())
                    self._tokens = min(self._rate * self.burst_seconds, self._tokens + n_bytes)
            self._seconds.inc(slept)
            return slept
        self._seconds.inc(wait)
        return wait
