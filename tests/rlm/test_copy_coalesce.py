"""Rolls that follow each other closely are copied in one copy run (``tasks.copy_coalesce_ms``, issue 26): against
the real broker, counted by ``rlm_copy_run_segments`` (the scheduler's semantics: ``tests/rlm/test_copy_jobs.py``)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from rlm.tasks.dispatch import CopyJobs
from rlm.tasks.leadership import Leadership, Led
from rlm.tasks.staging import Staging
from rlmm.api import TopicIdPartition
from rlmm.memory import InMemoryRemoteLogMetadataManager
from tests.support.discovery import fake_partition_dir, offline_settings


def _wait(cond: Any, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_roll_seen_during_a_caught_up_run_is_copied_coalesce_s_after_it_not_in_place(tmp_path: Path) -> None:
    """A caught-up run during which the directory changed does not sleep: it asks the scheduler for another run, which
    ``coalesce_s`` puts off until that long after the run ended (so the rolls that follow are copied with it), then
    the job sleeps. Before, the run went again in place at once (a partition rolling quickly: a segment a run). The
    scheduler's clock is the test's: nothing runs while it stands before the due time."""
    now = [1000.0]
    scheduler = CopyJobs(2, clock=lambda: now[0], coalesce_s=0.3).start()
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    path = fake_partition_dir(tmp_path / "logs", "t", 0, tp.topic_id)
    runs: list[float] = []

    def run(led: Led) -> bool:
        runs.append(now[0])
        if len(runs) == 1:
            leadership.wake({path})  # the stage job saw a roll while the run went
        return True  # caught up

    leadership = Leadership(offline_settings(tmp_path, tasks={"copy_interval_ms": 3_600_000}), scheduler,
                            rlmm=InMemoryRemoteLogMetadataManager(), rsm=None,  # type: ignore[arg-type]
                            staging=Staging({tmp_path / "logs": tmp_path / "staging"}), deleter=object(),  # type: ignore[arg-type]
                            run=run)
    try:
        assert leadership.serve({tp: path}, set())
        led = leadership.get("t", 0)
        assert led is not None
        job = scheduler.get_job(led.job_id)
        assert job is not None
        _wait(lambda: len(runs) == 1 and not job.running)
        assert job.due == pytest.approx(1000.3) and not led.asleep  # put off, not paused
        time.sleep(0.5)
        assert runs == [1000.0]  # not again in place
        now[0] = 1000.4
        _wait(lambda: leadership.sleeping() == 1)
        assert runs == [1000.0, 1000.4] and job.due is None  # the run asked for, then asleep
    finally:
        leadership.stop()
        assert scheduler.shutdown(wait=True, timeout_s=10)


def _runs() -> tuple[float, float, float]:
    """(copy runs, those that copied nothing, segments copied) so far, in this process."""
    def value(name: str, labels: dict[str, str] | None = None) -> float:
        return REGISTRY.get_sample_value(name, labels or {}) or 0.0
    return (value("rlm_copy_run_segments_count"), value("rlm_copy_run_segments_bucket", {"le": "0.0"}),
            value("rlm_copy_run_segments_sum"))


@pytest.mark.kafka
def test_rolls_in_quick_succession_are_copied_in_fewer_runs(kafka, topic_name: str, tmp_path: Path) -> None:  # noqa: ANN001
    """A caught-up partition rolls four times within a second or two (one roll each ~200 ms, the stage job looking
    every 300 ms). With ``copy_coalesce_ms`` 5 s the first roll is copied at once and the ones following it wait
    until 5 s after that run: at most two runs copy the four segments (without, each roll woke a run of its own:
    four runs of one segment)."""
    from rlm.sidecar import Sidecar
    from tests.support.kafka import roll_and_wait
    from tests.support.sidecar import make_settings, only, wait_for

    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "200"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name),
                             tasks={"copy_interval_ms": 3_600_000, "discovery_interval_ms": 300,
                                    "copy_coalesce_ms": 5_000})
    with Sidecar(settings) as sidecar:
        wait_for(lambda: sidecar.leadership.sleeping() == 1, 60, "the copy job to find the partition caught up")
        runs0, empty0, segments0 = _runs()
        roll_and_wait(kafka, topic_name, rolled=4)  # one filler record a segment: offsets 0..3 rolled
        wait_for(lambda: (sidecar.reader.latest_offset(tp) or -1) >= 3, 60, "the four rolled segments to be remote")
        runs, empty, segments = _runs()
    copying = (runs - runs0) - (empty - empty0)
    assert segments - segments0 == 4
    assert 1 <= copying <= 2, f"{copying} runs copied the 4 segments"


def test_a_wake_runs_the_job_copy_settle_ms_after_it_and_a_later_wake_does_not_put_it_off(tmp_path: Path) -> None:
    """``copy_settle_ms``: a sleeping job woken by a change of its directory runs that long after the wake, not at
    once (the rolls that follow within it are copied in the same run); a second wake meanwhile keeps the first one's
    time (a roll waits at most the settle window more). The scheduler's clock is the test's."""
    now = [1000.0]
    scheduler = CopyJobs(2, clock=lambda: now[0]).start()
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    path = fake_partition_dir(tmp_path / "logs", "t", 0, tp.topic_id)
    runs: list[float] = []

    def run(led: Led) -> bool:
        runs.append(now[0])
        return True  # caught up: the job sleeps

    leadership = Leadership(offline_settings(tmp_path, tasks={"copy_interval_ms": 3_600_000, "copy_settle_ms": 3_000}),
                            scheduler, rlmm=InMemoryRemoteLogMetadataManager(), rsm=None,  # type: ignore[arg-type]
                            staging=Staging({tmp_path / "logs": tmp_path / "staging"}), deleter=object(),  # type: ignore[arg-type]
                            run=run)
    try:
        assert leadership.serve({tp: path}, set())
        _wait(lambda: leadership.sleeping() == 1)  # the first run (a new job runs at once), then asleep
        assert runs == [1000.0]
        led = leadership.get("t", 0)
        job = scheduler.get_job(led.job_id) if led is not None else None
        assert job is not None
        now[0] = 1010.0
        assert leadership.wake({path}) == [led]
        assert job.due == pytest.approx(1013.0, abs=0.05)  # settle window: 3 s after the wake
        now[0] = 1012.0
        leadership.wake({path})  # another roll meanwhile: the run is not put off
        assert job.due == pytest.approx(1013.0, abs=0.05)
        time.sleep(0.3)
        assert runs == [1000.0]
        now[0] = 1013.1
        _wait(lambda: len(runs) == 2 and leadership.sleeping() == 1)
        assert runs == [1000.0, 1013.1]
    finally:
        leadership.stop()
        assert scheduler.shutdown(wait=True, timeout_s=10)


@pytest.mark.kafka
def test_rolls_within_the_settle_window_are_copied_in_one_run(kafka, topic_name: str, tmp_path: Path) -> None:  # noqa: ANN001
    """A caught-up partition rolls four times within a second or two (the stage job looking every 300 ms). With
    ``copy_settle_ms`` 5 s the first roll's wake runs the copy 5 s later, and that one run copies the four segments
    (without it, and without coalescing, each stage round that saw a roll ran a copy of its own)."""
    from rlm.sidecar import Sidecar
    from tests.support.kafka import roll_and_wait
    from tests.support.sidecar import make_settings, only, wait_for

    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "200"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name),
                             tasks={"copy_interval_ms": 3_600_000, "discovery_interval_ms": 300,
                                    "copy_coalesce_ms": 0, "copy_settle_ms": 5_000})
    with Sidecar(settings) as sidecar:
        wait_for(lambda: sidecar.leadership.sleeping() == 1, 60, "the copy job to find the partition caught up")
        runs0, empty0, segments0 = _runs()
        started = time.monotonic()
        roll_and_wait(kafka, topic_name, rolled=4)  # one filler record a segment: offsets 0..3 rolled
        rolled_s = time.monotonic() - started
        wait_for(lambda: (sidecar.reader.latest_offset(tp) or -1) >= 3, 60, "the four rolled segments to be remote")
        runs, empty, segments = _runs()
    copying = (runs - runs0) - (empty - empty0)
    assert segments - segments0 == 4
    assert copying == 1, f"{copying} runs copied the 4 segments (rolled within {rolled_s:.1f} s)"
