"""Group commit for lookups: concurrent callers' keys answered by one request.

Each led partition's copy job asks the cluster for its last stable offset and leader epoch before every run (and
again before each COPY_SEGMENT_FINISHED, as a fence). In streaming mode that is every ``poll_interval_ms`` per
partition: one ListOffsets request each. :class:`Coalescer` lets the copy jobs running at the same time share one
request: a caller joins the round that has not started yet, and whoever finds no request in flight sends that
round for everyone in it. An answer therefore always comes from a request sent *after* the caller asked, so a
fencing check never reads an answer older than its question.

While rounds follow each other (the last one was sent less than ``busy_s`` ago: a burst of copy runs), a caller
that asks to linger and sends the next round first waits ``linger_s``, so that the callers coming meanwhile go out
in it too, as the metadata writes' group commit does (:mod:`rlmm.group_commit`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Generic, TypeVar

__all__ = ["Coalescer"]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Round(Generic[K, V]):
    __slots__ = ("done", "error", "keys", "result")

    def __init__(self) -> None:
        self.keys: set[K] = set()
        self.result: Mapping[K, V] = {}
        self.error: BaseException | None = None
        self.done = False


class Coalescer(Generic[K, V]):
    """``get(keys)`` answers ``fetch(all keys of the round)`` restricted to ``keys``; at most one ``fetch`` runs at
    a time, and every caller waiting meanwhile joins the next one. ``fetch`` leaves out keys it has no answer for;
    an exception it raises is raised to every caller of that round. ``rounds`` counts the fetches."""

    def __init__(self, fetch: Callable[[set[K]], Mapping[K, V]], *, linger_s: float = 0.0, busy_s: float = 0.1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if linger_s < 0 or busy_s < 0:
            raise ValueError(f"linger_s and busy_s must be >= 0, not {linger_s} and {busy_s}")
        self._fetch = fetch
        self._cond = threading.Condition()
        self._open: _Round[K, V] | None = None  # the round callers join: not sent yet
        self._busy = False  # a fetch is running, or its sender lingers
        self._linger_s, self._busy_s, self._clock = linger_s, busy_s, clock
        self._last_sent: float | None = None  # when the last round was taken to be sent
        self.rounds = 0
        self.lingered = 0
        """Rounds whose sender lingered first (for tests)."""

    def get(self, keys: Iterable[K], *, linger: bool = False) -> dict[K, V]:
        """``linger``: when this caller sends the round while rounds follow each other, it first waits ``linger_s``
        (a caller asking for one partition after another, alone, does not ask to)."""
        wanted = set(keys)
        with self._cond:
            rnd = self._open
            if rnd is None:
                rnd = self._open = _Round()
            rnd.keys |= wanted
            while not rnd.done:
                if not self._busy and self._open is rnd:
                    self._busy = True
                    if linger and self._linger_s > 0 and self._last_sent is not None \
                            and self._clock() - self._last_sent < self._busy_s:
                        # rounds follow each other: callers coming within linger_s join this one
                        self.lingered += 1
                        self._cond.release()
                        try:
                            time.sleep(self._linger_s)
                        finally:
                            self._cond.acquire()
                    self._open = None
                    self._last_sent = self._clock()
                    break  # this caller sends the round
                self._cond.wait()
        if not rnd.done:
            try:
                rnd.result = self._fetch(rnd.keys)
            except BaseException as err:  # noqa: BLE001 - handed to every caller of the round
                rnd.error = err
            with self._cond:
                rnd.done = True
                self._busy = False
                self.rounds += 1
                self._cond.notify_all()
        if rnd.error is not None:
            raise rnd.error
        return {k: rnd.result[k] for k in wanted if k in rnd.result}
