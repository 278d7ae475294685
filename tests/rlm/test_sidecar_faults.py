"""Faults against the real broker: ``rlm serve`` killed with SIGKILL again and again, the broker stopped for a
while, local retention shorter than the copy interval; and the ops endpoints of ``rlm serve``."""

from __future__ import annotations

import json
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from devtools.devkafka import KafkaCluster, free_port
from rlm.sidecar import Sidecar
from rlmm.api import RemoteLogSegmentState, TopicIdPartition
from rsm.manager import RemoteStorageManager
from tests.support.kafka import produce
from tests.support.processes import http_get, serve
from tests.support.sidecar import (
    assert_contiguous,
    assert_readable,
    copy_state,
    discovery_state,
    latest_remote,
    make_settings,
    only,
    produce_segments,
    remote_segments,
    settings_yaml,
    store_keys,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]


def test_serve_answers_health_and_metrics(kafka: KafkaCluster, topic_name: str, tmp_path: Path) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300"})
    sent = produce_segments(kafka, topic_name, 3, 100, segment_ms=300)
    port = free_port()
    settings = make_settings(kafka, tmp_path, topics=only(topic_name), listen={"host": "127.0.0.1", "port": port})
    config = tmp_path / "sidecar.yaml"
    config.write_text(settings_yaml(settings))
    proc = serve(config, tmp_path / "serve.log")
    try:
        wait_for(lambda: http_get(f"http://127.0.0.1:{port}/health")[0] == 200, 60, "/health to answer 200")
        health = json.loads(http_get(f"http://127.0.0.1:{port}/health")[1])
        assert health["status"] == "ok" and health["last_discovery_ok"] > 0

        def copied() -> bool:
            status, body = http_get(f"http://127.0.0.1:{port}/metrics")
            assert status == 200
            return f'rlm_segments_copied_total{{topic="{topic_name}"}} 3.0' in body.decode()

        wait_for(copied, 60, "rlm_segments_copied_total to count the three segments")
        _status, body = http_get(f"http://127.0.0.1:{port}/metrics")
        text = body.decode()
        for name in ("rlm_bytes_copied_total", "rlm_copy_seconds_bucket", "rlm_copy_lag_segments",
                     "rlm_staging_bytes"):
            assert name in text, name
        assert http_get(f"http://127.0.0.1:{port}/nope")[0] == 404
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    # What the process copied is there for anyone reading the metadata topic.
    with Sidecar(settings) as sidecar:
        tp = TopicIdPartition(topic_id, topic_name, 0)
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 60, "the remote offsets")
        assert_readable(sidecar, tp, sent)


@pytest.mark.slow
def test_sigkill_at_random_moments_loses_nothing(kafka: KafkaCluster, topic_name: str, tmp_path: Path) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    limit = 400_000
    settings = make_settings(
        kafka, tmp_path, topics=only(topic_name),
        tasks={"copy_interval_ms": 200, "expiration_interval_ms": 300, "gc_interval_ms": 1000, "gc_grace_ms": 0},
        retention=[{"pattern": ".*", "retention_ms": -1, "retention_bytes": limit}], log_format="json")
    config = tmp_path / "sidecar.yaml"
    config.write_text(settings_yaml(settings))
    sent: dict[int, tuple[bytes, bytes]] = {}
    stop = threading.Event()

    def producer() -> None:  # a segment every ~0.35 s while the sidecar is killed and restarted
        n = 0
        while not stop.is_set():
            recs = [(f"k{n}-{i}".encode(), (f"v{n}-{i}-".encode() * 200)[:1000]) for i in range(40)]
            for (_p, off), kv in zip(produce(kafka, topic_name, recs), recs, strict=True):
                sent[off] = kv
            n += 1
            time.sleep(0.35)

    feeder = threading.Thread(target=producer, daemon=True)
    feeder.start()
    rng = random.Random(405)
    try:
        for _ in range(5):
            proc = serve(config, tmp_path / "serve.log")
            time.sleep(rng.uniform(2.0, 6.0))  # somewhere in a copy, an expiration, a GC pass
            proc.kill()
            proc.wait(30)
    finally:
        stop.set()
        feeder.join(30)
    produce(kafka, topic_name, [(b"__roll__", b"r")])
    last = max(sent)

    with Sidecar(settings) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= last, 90, "every produced offset to be remote")
        wait_for(lambda: sum(s.segment_size_bytes for s in remote_segments(sidecar, tp)) <= limit, 30,
                 "size retention to catch up")
        wait_for(lambda: all(m.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED
                             for m in sidecar.rlmm.list_remote_log_segments(tp)), 30,
                 "interrupted copies and deletes to be cleaned up")
        segs = remote_segments(sidecar, tp)
        assert_contiguous(segs, first_offset=None)  # no offset range remote twice, no hole
        first = segs[0].start_offset
        # Retention took a prefix, by size; everything after it is remote, byte-exact.
        assert sum(s.segment_size_bytes for s in segs) <= limit
        assert sum(s.segment_size_bytes for s in segs) + 60_000 > limit  # no more than retention asked for
        assert_readable(sidecar, tp, {o: kv for o, kv in sent.items() if o >= first}, first)

        # One GC pass (grace 0) removes whatever the kills left behind: afterwards every object is owned.
        sidecar.gc.run([tp])
        assert sidecar.gc.run([tp], dry_run=True) == []
        owned = {str(s.remote_log_segment_id.id) for s in segs}
        keys = store_keys(Path(settings.store.root_path))
        assert keys and all(any(sid in k for sid in owned) for k in keys), sorted(keys)[:5]
        assert sidecar.staging.staged() == [] or all(
            s.end_offset_inclusive > last for s in sidecar.staging.staged())


def test_local_retention_shorter_than_copy_interval(kafka: KafkaCluster, topic_name: str,
                                                     tmp_path: Path) -> None:
    # The broker deletes a rolled segment within ~1-2 s (retention check 1 s, file delete delay 1 s); the
    # sidecar copies every 4 s: only staging keeps the bytes alive.
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300", "retention.ms": "500"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name), tasks={"copy_interval_ms": 4000})
    with Sidecar(settings) as sidecar:
        wait_for(lambda: sidecar.health()[1]["leading"] == 1, 30, "the sidecar to lead the partition")
        sent = produce_segments(kafka, topic_name, 8, 100, segment_ms=300)
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 60, "every produced offset to be remote")
        segs = remote_segments(sidecar, tp)
        assert_contiguous(segs)
        assert_readable(sidecar, tp, sent)


@pytest.mark.slow
def test_broker_stopped_for_a_while(kafka: KafkaCluster, topic_name: str, tmp_path: Path) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    sent = produce_segments(kafka, topic_name, 3, 100, segment_ms=300)
    with Sidecar(make_settings(kafka, tmp_path, topics=only(topic_name))) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 60, "the first segments to be remote")
        kafka.stop_node(1)
        try:
            wait_for(lambda: sidecar.last_error is not None and "discovery" in sidecar.last_error, 60,
                     "the sidecar to notice the broker is gone", detail=lambda: discovery_state(sidecar))
            time.sleep(5.0)  # the sidecar keeps waiting
        finally:
            kafka.start_node(1)
            kafka.wait_ready()
        sent |= produce_segments(kafka, topic_name, 3, 100, segment_ms=300)
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 90, f"the sidecar to catch up to {max(sent)} "
                 "after the broker", detail=lambda: f"remote up to {latest_remote(sidecar, tp)}; "
                 f"{copy_state(sidecar, tp)}; {discovery_state(sidecar)}")
        assert sidecar.health()[0]
        segs = remote_segments(sidecar, tp)
        assert_contiguous(segs)
        assert_readable(sidecar, tp, sent)


class BlockingRsm(RemoteStorageManager):
    """The real storage manager whose copies wait for ``release``: a copy job stuck in a call without a timeout."""

    entered: threading.Event
    release: threading.Event

    def copy_log_segment_data(self, segment_metadata, data, **kw):  # type: ignore[no-untyped-def]
        self.entered.set()
        self.release.wait(120)
        return super().copy_log_segment_data(segment_metadata, data, **kw)


def test_stop_does_not_wait_forever_for_a_stuck_job(kafka: KafkaCluster, topic_name: str, tmp_path: Path) -> None:
    kafka.create_topic(topic_name, 1, config={"segment.ms": "300"})
    produce_segments(kafka, topic_name, 2, 50, segment_ms=300)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name))
    rsm = BlockingRsm(settings.store)
    rsm.entered, rsm.release = threading.Event(), threading.Event()
    sidecar = Sidecar(settings, rsm=rsm).start()
    try:
        assert rsm.entered.wait(60), "no copy started"
        t0 = time.monotonic()
        assert sidecar.stop(timeout_s=2.0) is False  # the stuck copy is abandoned, reported
        assert time.monotonic() - t0 < 20
    finally:
        rsm.release.set()
        sidecar.stop()
