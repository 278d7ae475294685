"""The listener's per-connection deadline (:class:`rlm.listener.net.deadline.Deadline`): one timer, moved often."""

from __future__ import annotations

import asyncio

from rlm.listener.net.deadline import Deadline


def test_a_deadline_expires_once_at_the_time_it_was_last_armed_at_and_never_when_disarmed() -> None:
    async def run() -> tuple[list[float], list[float], int]:
        loop = asyncio.get_running_loop()
        start = loop.time()
        fired: list[float] = []
        d = Deadline(loop, lambda: fired.append(loop.time() - start))
        for _ in range(100):  # moved at every "request": one timer in the loop's heap, not a hundred
            d.arm(loop.time() + 0.05)
            d.disarm()
        d.arm(loop.time() + 0.05)
        timers = len(loop._scheduled)  # type: ignore[attr-defined]
        await asyncio.sleep(0.02)
        d.arm(loop.time() + 0.1)  # later than the timer: it re-arms itself when due
        await asyncio.sleep(0.25)
        moved = list(fired)
        fired.clear()
        d.arm(loop.time() + 0.02)
        d.disarm()  # disarmed before it is due: never expires
        await asyncio.sleep(0.06)
        d.arm(loop.time() + 0.02)
        d.close()
        await asyncio.sleep(0.06)
        return moved, fired, timers

    moved, fired, timers = asyncio.run(run())
    assert timers == 1
    assert len(moved) == 1 and moved[0] >= 0.119  # 0.02 + 0.1, less the clock's coarseness (DUE_EARLY_S)
    assert fired == []
