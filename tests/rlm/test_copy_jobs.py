"""The copy jobs' scheduler (:mod:`rlm.tasks.dispatch`): apscheduler's interval-job contract as the leadership
registry uses it (one run at a time, pause, wake, remove), on a fixed pool of workers. No broker needed."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from rlm.tasks.dispatch import CopyJobs


def _wait(cond: Any, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def jobs() -> Any:
    j = CopyJobs(3).start()
    yield j
    assert j.shutdown(wait=True, timeout_s=10)


def test_an_interval_job_runs_now_then_every_interval(jobs: CopyJobs) -> None:
    times: list[float] = []
    jobs.add_job(lambda: times.append(time.monotonic()), "interval", id="a", seconds=0.2,
                 next_run_time=datetime.now(UTC))
    _wait(lambda: len(times) >= 3)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(g >= 0.15 for g in gaps), gaps  # one run per interval, not back to back


def test_one_run_of_a_job_at_a_time_and_a_wake_while_it_runs_runs_it_again_after(jobs: CopyJobs) -> None:
    """A job due (its interval, a wake) while it runs is not started a second time beside it; a wake during the run
    is not lost: the job runs again once the run ends (apscheduler skipped it and waited an interval)."""
    inside = threading.Event()
    release = threading.Event()
    running = []
    peak = []
    runs = []

    def run() -> None:
        running.append(1)
        peak.append(len(running))
        runs.append(1)
        if len(runs) == 1:
            inside.set()
            assert release.wait(10)
        running.pop()

    jobs.add_job(run, "interval", id="a", seconds=3600, next_run_time=datetime.now(UTC))
    assert inside.wait(10)
    for _ in range(5):
        jobs.modify_job("a", next_run_time=datetime.now(UTC))
    time.sleep(0.2)
    assert len(runs) == 1  # no second run beside the first, though three workers are free
    release.set()
    _wait(lambda: len(runs) == 2)
    time.sleep(0.2)
    assert len(runs) == 2 and max(peak) == 1  # the five wakes made one run, after the first


def test_jobs_due_together_run_on_every_worker_at_once() -> None:
    """Three jobs due at the same time, three workers waiting: all three run at once. Each job pushed wakes a worker;
    told only when a job was the heap's new earliest, the two workers waiting without a deadline slept while one ran
    the jobs one by one (what a burst's backlog of woken partitions met). A clock of the test's: the three are due at
    the very same time."""
    now = [1000.0]
    jobs = CopyJobs(3, clock=lambda: now[0]).start()
    try:
        time.sleep(0.2)  # the three workers wait (an empty heap: no deadline)
        inside = threading.Barrier(4)

        def run(name: str) -> None:
            jobs.pause_job(name)  # once
            inside.wait(10)

        for name in "abc":
            jobs.add_job(run, "interval", args=[name], id=name, seconds=0.1)  # each due at 1000.1
        now[0] = 1001.0
        inside.wait(10)  # BrokenBarrierError unless the three run at the same time
    finally:
        assert jobs.shutdown(wait=True, timeout_s=10)


def test_a_job_paused_by_its_own_run_stays_paused_until_woken(jobs: CopyJobs) -> None:
    runs = []

    def run() -> None:
        runs.append(1)
        jobs.pause_job("a")  # as a caught-up copy run does (Leadership.sleep)

    jobs.add_job(run, "interval", id="a", seconds=0.05, next_run_time=datetime.now(UTC))
    _wait(lambda: len(runs) == 1)
    time.sleep(0.3)  # six intervals
    job = jobs.get_job("a")
    assert len(runs) == 1 and job is not None and job.next_run_time is None
    jobs.modify_job("a", next_run_time=datetime.now(UTC))
    _wait(lambda: len(runs) == 2)
    time.sleep(0.3)
    assert len(runs) == 2


def test_a_removed_job_runs_no_more_and_a_replaced_one_runs_its_new_function(jobs: CopyJobs) -> None:
    old, new = [], []
    jobs.add_job(lambda: old.append(1), "interval", id="a", seconds=0.05, next_run_time=datetime.now(UTC))
    _wait(lambda: len(old) >= 2)
    jobs.add_job(lambda: new.append(1), "interval", id="a", seconds=0.05, next_run_time=datetime.now(UTC),
                 replace_existing=True)
    n = len(old)
    _wait(lambda: len(new) >= 2)
    assert len(old) <= n + 1  # (a run of the old one may have been starting)
    with pytest.raises(KeyError):
        jobs.add_job(lambda: None, "interval", id="a", seconds=1)
    jobs.remove_job("a")
    m = len(new)
    time.sleep(0.3)
    assert len(new) <= m + 1 and jobs.get_job("a") is None and jobs.get_jobs() == []
    with pytest.raises(KeyError):
        jobs.remove_job("a")
    with pytest.raises(KeyError):
        jobs.pause_job("a")


def test_due_jobs_run_oldest_due_first_a_wake_keeps_a_waiting_job_s_place_and_a_failing_job_keeps_its_interval(
) -> None:
    jobs = CopyJobs(1).start()
    try:
        order: list[str] = []
        gate = threading.Event()
        jobs.add_job(lambda: gate.wait(10), "interval", id="gate", seconds=3600, next_run_time=datetime.now(UTC))
        _wait(lambda: jobs.get_job("gate").running)  # type: ignore[union-attr]
        for name in "cab":  # woken in this order while the one worker is busy
            jobs.add_job(lambda n=name: order.append(n), "interval", id=name, seconds=3600,
                         next_run_time=datetime.now(UTC))
            time.sleep(0.01)
        jobs.modify_job("c", next_run_time=datetime.now(UTC))  # woken again while it waits: it keeps its place
        fails = []

        def failing() -> None:
            fails.append(1)
            raise RuntimeError("a copy run's own failure")

        jobs.add_job(failing, "interval", id="f", seconds=0.05, next_run_time=datetime.now(UTC))
        gate.set()
        _wait(lambda: len(fails) >= 3)
        assert order == ["c", "a", "b"]
    finally:
        assert jobs.shutdown(wait=True, timeout_s=10)


def test_shutdown_lets_the_runs_going_on_end_and_starts_no_more() -> None:
    jobs = CopyJobs(2).start()
    inside, release = threading.Event(), threading.Event()
    runs = []

    def run() -> None:
        runs.append(1)
        inside.set()
        release.wait(10)

    jobs.add_job(run, "interval", id="a", seconds=0.01, next_run_time=datetime.now(UTC))
    assert inside.wait(10)
    assert not jobs.shutdown(wait=True, timeout_s=0.2)  # the run still goes: not joined within the bound
    assert not jobs.running
    release.set()
    assert jobs.shutdown(wait=True, timeout_s=10)
    assert runs == [1]
    jobs.add_job(run, "interval", id="b", seconds=0.01, next_run_time=datetime.now(UTC))  # added after: never runs
    time.sleep(0.1)
    assert runs == [1]
