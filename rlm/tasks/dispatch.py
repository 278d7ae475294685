"""The copy jobs' own scheduler: one job per led partition, run on a fixed pool of worker threads.

:class:`rlm.tasks.leadership.Leadership` adds, removes, pauses (sleeping copy jobs) and wakes one job per led
partition through the four calls of apscheduler's scheduler it needs (:class:`rlm.tasks.leadership.Scheduler`).
apscheduler ran them at first; with thousands of partitions rolling at once (``bench/bench_scale.py``'s burst) its
dispatch was a tenth of the sidecar's CPU (issue 26): its scheduler thread walks the due jobs, submits each to an
unbounded executor queue and counts its instances, and a job due again while queued (a backlog of 2,000 woken jobs
lasts many intervals) is skipped with a warning formatted each time. :class:`CopyJobs` keeps the same contract at a
fraction of the cost: the due jobs in one heap, taken by the workers themselves under one condition (no scheduler
thread, no executor queue, no events, no warnings), and a job due while it runs does not queue a second run.

Semantics (those of the apscheduler jobs it replaces, ``coalesce=True, max_instances=1``):

- an *interval* job runs at ``next_run_time`` (now, for a new copy job), then once per interval; a run that lasts
  longer than the interval is followed by the first tick of the interval after it ends (ticks missed are not made up);
- one run of a job at a time; a job is never queued twice;
- :meth:`CopyJobs.pause_job`: no run until :meth:`CopyJobs.modify_job` gives it a ``next_run_time`` again (a job
  paused by its own run stays paused once the run ends);
- :meth:`CopyJobs.modify_job` with ``next_run_time`` while the job runs: it runs again as soon as the run ends (where
  apscheduler skipped that run and waited an interval: a wake is never lost); while it waits for a worker, it keeps
  the earlier of its due time and the new one (its place in a backlog);
- ``coalesce_s`` (``tasks.copy_coalesce_ms``; apscheduler has no such thing): a job woken by :meth:`CopyJobs.modify_job`
  less than ``coalesce_s`` after its last run ended runs ``coalesce_s`` after that end, not at once (a wake while it
  runs likewise, counted from the run's end). The first wake after a quiet spell runs at once; the ones following it
  closely (a partition rolling again and again) wait, so that the segments rolled meanwhile are copied in one run:
  a run's metadata writes, its read-your-writes wait and its ListOffsets calls are shared by its segments (issue 26).
  A wake is still never lost, only put off; :meth:`CopyJobs.remove_job` and :meth:`CopyJobs.shutdown` do not wait
  for a job put off (nothing waits for a job's due time);
- :meth:`CopyJobs.remove_job`: no further run (a run going on ends on its own; ``Led.stop`` and ``Led.cancel`` end it
  early); a job replaced by :meth:`CopyJobs.add_job` with ``replace_existing`` likewise.

Due jobs run oldest due first (a burst's 2,000 woken partitions in the order they were woken). The workers are
daemon threads named ``rlm-copy-<n>``; :meth:`CopyJobs.shutdown` lets the runs going on end and joins the workers.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = ["CopyJob", "CopyJobs"]

log = logging.getLogger(__name__)


@dataclass(eq=False)
class CopyJob:
    """One job: ``func(*args)`` every ``interval_s``. Its fields are guarded by its :class:`CopyJobs`' condition."""

    id: str
    func: Callable[..., object]
    args: Sequence[object]
    interval_s: float
    due: float | None = None  # monotonic time of the next run; None: paused (or running, see ``CopyJobs``)
    ended: float = -math.inf  # monotonic time its last run ended (a wake within coalesce_s of it waits: CopyJobs)
    running: bool = False
    wake: bool = False  # modify_job(next_run_time=...) while running: run again as soon as the run ends
    removed: bool = False
    _clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    @property
    def next_run_time(self) -> datetime | None:
        """When it runs next (apscheduler's attribute); None while paused."""
        if self.due is None:
            return None
        return datetime.now(UTC) + timedelta(seconds=max(0.0, self.due - self._clock()))


class CopyJobs:
    """The copy jobs' scheduler (see the module doc): ``workers`` threads, started by :meth:`start`; a wake within
    ``coalesce_s`` of a job's last run waits until ``coalesce_s`` after it."""

    def __init__(self, workers: int, *, name: str = "rlm-copy", clock: Callable[[], float] = time.monotonic,
                 coalesce_s: float = 0.0) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, not {workers}")
        if coalesce_s < 0:
            raise ValueError(f"coalesce_s must be >= 0, not {coalesce_s}")
        self._clock = clock
        self._coalesce_s = coalesce_s
        self._cond = threading.Condition()
        self._jobs: dict[str, CopyJob] = {}
        self._heap: list[tuple[float, int, CopyJob]] = []  # (due, seq, job); stale entries skipped (see _take)
        self._seq = itertools.count()
        self._stopping = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        self._started = False

    # --------------------------------------------------------------------------------------------- lifecycle
    def start(self) -> CopyJobs:
        with self._cond:
            if not self._started:
                self._started = True
                for t in self._threads:
                    t.start()
        return self

    @property
    def running(self) -> bool:
        """Started and not shut down."""
        return self._started and not self._stopping

    def shutdown(self, wait: bool = True, timeout_s: float | None = None) -> bool:
        """No run starts from now on; with ``wait``, join the workers (the runs going on end first), at most
        ``timeout_s`` in all. True when every worker ended."""
        with self._cond:
            self._stopping = True
            self._heap.clear()
            self._cond.notify_all()
        if not wait or not self._started:
            return True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        for t in self._threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._threads)

    # ------------------------------------------------------------------------- apscheduler's calls (Scheduler)
    def add_job(self, func: Callable[..., object], trigger: str = "interval", *, args: Sequence[object] = (),
                id: str, seconds: float, next_run_time: datetime | None = None,  # noqa: A002 - apscheduler's name
                replace_existing: bool = False, **_ignored: Any) -> CopyJob:
        """An interval job (``trigger`` must be ``"interval"``): first run at ``next_run_time`` (None: one interval
        from now)."""
        if trigger != "interval":
            raise ValueError(f"copy jobs are interval jobs, not {trigger!r}")
        job = CopyJob(id, func, tuple(args), float(seconds), _clock=self._clock)
        with self._cond:
            old = self._jobs.get(id)
            if old is not None:
                if not replace_existing:
                    raise KeyError(f"a copy job {id!r} exists already")
                old.removed = True
            self._jobs[id] = job
            now = self._clock()
            self._schedule(job, now + (job.interval_s if next_run_time is None else _from_now(next_run_time)))
        return job

    def remove_job(self, job_id: str) -> None:
        """No further run of the job (KeyError when there is none)."""
        with self._cond:
            job = self._jobs.pop(job_id)
            job.removed = True
            job.due = None

    def pause_job(self, job_id: str) -> CopyJob:
        """No run until :meth:`modify_job` gives it a ``next_run_time`` (KeyError when there is no such job)."""
        with self._cond:
            job = self._jobs[job_id]
            job.due = None
            job.wake = False
            return job

    def modify_job(self, job_id: str, **changes: Any) -> CopyJob:
        """``next_run_time=<datetime>``: its next run then, or earlier if it was due earlier already (a paused job
        resumes); while it runs, as soon as the run ends; either no sooner than ``coalesce_s`` after its last run
        ended (a wake following a run closely waits: the module doc). Only ``next_run_time`` is supported (KeyError
        when there is no such job). A job due and waiting for a worker keeps its place: a partition woken again and
        again (each roll) is not sent to the back of a backlog each time."""
        unknown = set(changes) - {"next_run_time"}
        if unknown:
            raise TypeError(f"copy jobs can change next_run_time only, not {sorted(unknown)}")
        with self._cond:
            job = self._jobs[job_id]
            when = changes.get("next_run_time")
            if when is None:
                job.due = None
                job.wake = False
            elif job.running:
                job.wake = True
            else:
                due = max(self._clock() + _from_now(when), job.ended + self._coalesce_s)
                if job.due is None or due < job.due:
                    self._schedule(job, due)
            return job

    def get_job(self, job_id: str) -> CopyJob | None:
        with self._cond:
            return self._jobs.get(job_id)

    def get_jobs(self) -> list[CopyJob]:
        with self._cond:
            return list(self._jobs.values())

    def due_args(self, limit: int) -> list[Sequence[object]]:
        """The arguments of at most ``limit`` jobs due now and waiting for a worker, the soonest due first (those the
        workers take next): for work a caller does ahead for them in one go (the sidecar asks the cluster for their
        runs' last stable offsets in the request of a run's start, :meth:`rlm.sidecar.Sidecar._run_start`)."""
        with self._cond:
            now = self._clock()
            due = heapq.nsmallest(limit, (e for e in self._heap if e[0] <= now and e[2].due == e[0]
                                          and not e[2].running and not e[2].removed))
            return [job.args for _due, _seq, job in due]

    # ----------------------------------------------------------------------------------------------- workers
    def _schedule(self, job: CopyJob, due: float) -> None:
        """Under the condition: ``job`` runs at ``due``; one waiting worker is told, whatever the job's place in the
        heap (told only for a new earliest, the workers waiting without a deadline slept through a backlog: jobs pushed
        behind one not taken yet woke nobody)."""
        job.due = due
        if self._stopping:
            return
        heapq.heappush(self._heap, (due, next(self._seq), job))
        self._cond.notify()

    def _take(self) -> CopyJob | None:
        """Under the condition: wait for a job due, mark it running and return it; None when shutting down."""
        while not self._stopping:
            now = self._clock()
            heap = self._heap
            while heap:
                due, _seq, job = heap[0]
                if job.removed or job.running or job.due != due:
                    heapq.heappop(heap)  # stale: the job was removed, paused, moved, or is already running
                    continue
                if due > now:
                    break
                heapq.heappop(heap)
                job.running, job.wake = True, False
                return job
            self._cond.wait(None if not heap else heap[0][0] - now)
        return None

    def _work(self) -> None:
        while True:
            with self._cond:
                job = self._take()
                if job is None:
                    return
                started = self._clock()
            try:
                job.func(*job.args)
            except Exception:  # noqa: BLE001 - a job's own failure is its to report; the worker goes on
                log.exception("copy job raised", extra={"job": job.id})
            with self._cond:
                job.running = False
                if job.removed:
                    continue
                now = job.ended = self._clock()
                if job.wake:
                    job.wake = False
                    self._schedule(job, now + self._coalesce_s)
                elif job.due is not None:  # not paused: the first interval tick after the run
                    ticks = max(1, math.ceil((now - started) / job.interval_s)) if job.interval_s > 0 else 1
                    self._schedule(job, started + ticks * job.interval_s)


def _from_now(when: datetime) -> float:
    """Seconds from now until ``when`` (0 when past)."""
    now = datetime.now(when.tzinfo) if when.tzinfo is not None else datetime.now()
    return max(0.0, (when - now).total_seconds())
