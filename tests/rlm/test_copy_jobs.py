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


def test_a_wake_soon_after_a_run_waits_coalesce_s_after_its_end_and_the_wakes_meanwhile_make_one_run() -> None:
    """``coalesce_s``: the first wake after a quiet spell runs at once; a wake less than ``coalesce_s`` after the last
    run ended waits until ``coalesce_s`` after that end, and the wakes meanwhile (a partition rolling again and again)
    make that one run. The test's clock: nothing runs while it stands before the due time, whatever the real time."""
    now = [1000.0]
    jobs = CopyJobs(2, clock=lambda: now[0], coalesce_s=0.3).start()
    try:
        runs: list[float] = []

        def run() -> None:
            runs.append(now[0])
            jobs.pause_job("a")  # caught up: sleeps until woken (Leadership.sleep)

        jobs.add_job(run, "interval", id="a", seconds=3600, next_run_time=datetime.now(UTC))
        _wait(lambda: len(runs) == 1 and not jobs.get_job("a").running)  # type: ignore[union-attr]
        job = jobs.get_job("a")
        assert job is not None and job.ended == 1000.0 and job.due is None
        now[0] = 1000.1
        jobs.modify_job("a", next_run_time=datetime.now(UTC))  # a roll 0.1 after the run ended: put off
        assert job.due == pytest.approx(1000.3)
        now[0] = 1000.2
        for _ in range(3):  # more rolls meanwhile: the same due time
            jobs.modify_job("a", next_run_time=datetime.now(UTC))
        assert job.due == pytest.approx(1000.3)
        time.sleep(0.5)  # the workers look at the clock again (their waits are the clock's deltas, 0.1 here)
        assert runs == [1000.0]
        now[0] = 1000.4
        _wait(lambda: len(runs) == 2)
        _wait(lambda: not job.running)
        time.sleep(0.2)
        assert runs == [1000.0, 1000.4]  # the four wakes: one run
        now[0] = 1010.0  # a quiet spell: the next wake runs at once
        jobs.modify_job("a", next_run_time=datetime.now(UTC))
        assert job.due == 1010.0
        _wait(lambda: len(runs) == 3)
        assert runs[2] == 1010.0
    finally:
        assert jobs.shutdown(wait=True, timeout_s=10)


def test_a_wake_while_the_job_runs_is_put_off_coalesce_s_after_the_run_ends_and_never_lost() -> None:
    now = [2000.0]
    jobs = CopyJobs(2, clock=lambda: now[0], coalesce_s=0.3).start()
    try:
        inside, release = threading.Event(), threading.Event()
        runs: list[float] = []

        def run() -> None:
            runs.append(now[0])
            jobs.pause_job("a")
            if len(runs) == 1:
                inside.set()
                assert release.wait(10)

        jobs.add_job(run, "interval", id="a", seconds=3600, next_run_time=datetime.now(UTC))
        assert inside.wait(10)
        jobs.modify_job("a", next_run_time=datetime.now(UTC))  # a roll during the run (which paused the job)
        now[0] = 2001.0
        release.set()  # the run ends at 2001.0
        job = jobs.get_job("a")
        assert job is not None
        _wait(lambda: not job.running and job.due is not None)
        assert job.ended == 2001.0 and job.due == pytest.approx(2001.3)
        time.sleep(0.5)
        assert runs == [2000.0]
        now[0] = 2001.4
        _wait(lambda: len(runs) == 2)
        assert runs[1] == 2001.4
    finally:
        assert jobs.shutdown(wait=True, timeout_s=10)


def test_neither_removing_a_job_nor_shutting_down_waits_for_a_wake_put_off() -> None:
    """A job put off by an hour (``coalesce_s``): removing it leaves nothing to run, and shutdown joins the workers at
    once (nothing waits for a due time: the workers' wait for it is cut short)."""
    now = [3000.0]
    jobs = CopyJobs(2, clock=lambda: now[0], coalesce_s=3600).start()
    runs: list[str] = []
    for name in "ab":
        jobs.add_job(lambda n=name: runs.append(n) or jobs.pause_job(n), "interval", id=name, seconds=7200,
                     next_run_time=datetime.now(UTC))
    _wait(lambda: len(runs) == 2 and not any(j.running for j in jobs.get_jobs()))
    for name in "ab":
        jobs.modify_job(name, next_run_time=datetime.now(UTC))
        assert jobs.get_job(name).due == 3000.0 + 3600  # type: ignore[union-attr]
    jobs.remove_job("a")
    now[0] = 3000.0 + 3601
    # the workers wait an hour of real time for the clock's due time: a job due now wakes one, which takes the
    # earliest due first (b), then this one
    jobs.add_job(lambda: runs.append("k") or jobs.pause_job("k"), "interval", id="k", seconds=7200,
                 next_run_time=datetime.now(UTC))
    _wait(lambda: len(runs) == 4)
    time.sleep(0.2)
    assert runs == ["a", "b", "b", "k"] or runs == ["b", "a", "b", "k"]  # a removed: not run
    jobs.modify_job("b", next_run_time=datetime.now(UTC))  # put off by another hour of the clock
    assert jobs.shutdown(wait=True, timeout_s=10)
    assert len(runs) == 4


def test_due_args_names_the_jobs_waiting_for_a_worker_soonest_first_not_running_paused_or_later_ones() -> None:
    jobs = CopyJobs(1).start()
    try:
        gate = threading.Event()
        jobs.add_job(lambda _g: gate.wait(10), "interval", id="gate", args=["g"], seconds=3600,
                     next_run_time=datetime.now(UTC))
        _wait(lambda: jobs.get_job("gate").running)  # type: ignore[union-attr]
        for name in "cabd":  # due in this order while the one worker is busy
            jobs.add_job(lambda _n: None, "interval", id=name, args=[name], seconds=3600,
                         next_run_time=datetime.now(UTC))
            time.sleep(0.01)
        jobs.pause_job("d")
        jobs.add_job(lambda _n: None, "interval", id="later", args=["later"], seconds=3600)  # due in an hour
        assert jobs.due_args(64) == [("c",), ("a",), ("b",)]  # not the running one, the paused one, nor "later"
        assert jobs.due_args(2) == [("c",), ("a",)]
        gate.set()
        _wait(lambda: jobs.due_args(64) == [])
    finally:
        assert jobs.shutdown(wait=True, timeout_s=10)
