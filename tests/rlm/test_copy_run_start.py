"""A copy run's start asks the cluster for the copy jobs waiting behind it too (``Sidecar._run_start``, issue 26),
through ``rlm serve``'s copy jobs against the real broker."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import rlm.sidecar
from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.support.kafka import produce
from tests.support.sidecar import assert_contiguous, assert_readable, latest_remote, make_settings, only, wait_for

pytestmark = pytest.mark.slow

PARTITIONS = 12


def test_the_runs_of_jobs_waiting_together_share_one_request_for_their_start(
        kafka: KafkaCluster, topic_name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twelve caught-up partitions roll at once; one copy worker, held at the first run's start until the other eleven
    jobs wait behind it. That run's start asks the cluster for all twelve partitions in one request, and the eleven runs
    after it start from those answers: 13 requests in all (that one and a fence per run), where each run asked for
    its own start before (24). Every partition's segment is copied once, contiguous and byte-exact."""
    # the answers asked ahead are used while fresh (5 s): eleven runs on one worker of a loaded CI machine took longer
    # (17 requests, the late runs asking again), so the age is not what this test measures
    monkeypatch.setattr(rlm.sidecar, "RUN_START_MAX_AGE_S", 300.0)
    topic_id = kafka.create_topic(topic_name, PARTITIONS, config={"segment.ms": "300"})
    tps = [TopicIdPartition(topic_id, topic_name, p) for p in range(PARTITIONS)]
    # one worker; no expiration job, which asks the cluster for the leader epoch too (one partition a request)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name),
                             tasks={"copy_workers": 1, "expiration_interval_ms": 3_600_000})
    with Sidecar(settings) as sidecar:
        wait_for(lambda: sidecar.leadership.sleeping() == PARTITIONS, 60, "every copy job asleep (caught up)")
        fetched: list[set[tuple[str, int]]] = []
        coalescer = sidecar._stable_offsets
        fetch = coalescer._fetch

        def recording(keys):  # type: ignore[no-untyped-def]
            fetched.append(set(keys))
            return fetch(keys)

        gate = threading.Event()
        run = sidecar.leadership._run

        def held(led):  # type: ignore[no-untyped-def]
            if not gate.is_set():  # the first run: until the others wait behind it for the one worker
                wait_for(lambda: len(sidecar._copy_jobs.due_args(64)) == PARTITIONS - 1, 30, "the other jobs due")
                gate.set()
            return run(led)

        coalescer._fetch = recording  # type: ignore[method-assign]
        sidecar.leadership._run = held  # type: ignore[method-assign]
        sent: dict[int, dict[int, tuple[bytes, bytes]]] = {}
        for p in range(PARTITIONS):
            recs = [(f"k{p}-{i}".encode(), f"v{p}-{i}".encode() * 20) for i in range(50)]
            sent[p] = {off: rec for (_p, off), rec in zip(produce(kafka, topic_name, recs, partition=p), recs,
                                                             strict=True)}
        time.sleep(0.4)  # older than segment.ms: the next append rolls each partition's segment
        for p in range(PARTITIONS):
            produce(kafka, topic_name, [(b"__roll__", b"r")], partition=p)
        wait_for(lambda: all(latest_remote(sidecar, tp) >= 49 for tp in tps), 90, "every partition's segment copied")
        wait_for(lambda: sidecar.leadership.sleeping() == PARTITIONS, 30, "every copy job asleep again")
        for tp in tps:
            segs = sidecar.reader.segments(tp)
            assert_contiguous(segs)
            assert [(s.start_offset, s.end_offset_inclusive) for s in segs] == [(0, 49)]
            assert_readable(sidecar, tp, sent[tp.partition])
    assert fetched[0] == {(topic_name, p) for p in range(PARTITIONS)}, fetched
    assert len(fetched) == 1 + PARTITIONS, fetched  # without the answers asked ahead: 2 x PARTITIONS
