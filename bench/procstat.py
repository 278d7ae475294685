"""CPU times of a process's threads, from ``/proc/<pid>/task/<tid>/stat`` (proc(5): utime and stime are fields 14 and
15, counted in clock ticks), for the benchmarks that split a sidecar's CPU by thread."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

__all__ = ["TICKS", "profile_every_thread", "thread_times"]

TICKS = os.sysconf("SC_CLK_TCK")


def thread_times(pid: int) -> dict[tuple[int, str], tuple[float, float]]:
    """(user, system) CPU seconds so far of each live thread of ``pid``, keyed by (thread id, its name: ``comm``);
    a thread that ends while it is read is left out."""
    out: dict[tuple[int, str], tuple[float, float]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm, rest = (task / "stat").read_text().split("(", 1)[1].rsplit(")", 1)
        except OSError:
            continue  # ended meanwhile
        f = rest.split()
        out[(int(task.name), comm)] = (int(f[11]) / TICKS, int(f[12]) / TICKS)
    return out


def profile_every_thread() -> list[tuple[threading.Thread, Any]]:
    """Wrap :meth:`threading.Thread.run` so that each thread started from now on runs under a profiler of its own
    (cProfile, thread CPU time; it hooks only the thread that enables it); the list gets (thread, profiler) pairs."""
    import cProfile
    import time

    profiles: list[tuple[threading.Thread, Any]] = []
    run = threading.Thread.run

    def profiled(self: threading.Thread) -> None:
        prof = cProfile.Profile(time.thread_time)
        profiles.append((self, prof))
        prof.enable()
        try:
            run(self)
        finally:
            prof.disable()

    threading.Thread.run = profiled  # type: ignore[method-assign]
    return profiles
