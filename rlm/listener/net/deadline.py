"""A deadline moved at every request and seldom reached, kept by one event-loop timer instead of one per request.

``asyncio.timeout`` (or ``call_later`` and ``cancel``) per request pushes a timer onto the event loop's heap and
cancels it a moment later; the cancelled timers stay in the heap until they come due or make up half of it, so each
request paid a heap push among a hundred or more dead timers (bench_history: 14 timer comparisons and 16 clock reads
per Fetch that the endpoint before the issue-22 bounds did not make). A :class:`Deadline` keeps one timer: arming it
later than the timer leaves the timer alone (it re-arms itself when it comes due early), so a connection that sends
a request a millisecond pushes one timer per idle limit, not one per request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

__all__ = ["Deadline"]

DUE_EARLY_S = 0.001  # a timer that comes due this close to the deadline expires it (the loop's clock is coarse)


class Deadline:
    """Calls ``expire`` (on the event loop) once ``loop.time()`` reaches the time it was last armed at, unless it
    was disarmed meanwhile. Event loop only."""

    __slots__ = ("_expire", "_handle", "_loop", "when")

    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[[], None]) -> None:
        self._loop = loop
        self._expire = expire
        self._handle: asyncio.TimerHandle | None = None
        self.when: float | None = None  # armed until then; None: disarmed

    def arm(self, when: float) -> None:
        self.when = when
        handle = self._handle
        if handle is None or handle.when() > when:  # the timer would come too late: one at ``when``
            if handle is not None:
                handle.cancel()
            self._handle = self._loop.call_at(when, self._due)

    def disarm(self) -> None:
        self.when = None  # the timer stays: when it comes due disarmed, it goes

    def close(self) -> None:
        self.when = None
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _due(self) -> None:
        self._handle = None
        when = self.when
        if when is None:
            return
        if self._loop.time() + DUE_EARLY_S < when:  # armed again later since: wait for that
            self._handle = self._loop.call_at(when, self._due)
            return
        self.when = None
        self._expire()
