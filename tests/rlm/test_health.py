"""``/health`` tells the operator the truth (rlm.health): the retention margin, a missing log dir, a store that
refuses every request, a stopped broker; ``/health/live`` stays up for all of them. Real broker, real sidecar,
real HTTP."""

from __future__ import annotations

import json
import math
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from devtools.devkafka import KafkaCluster
from rlm.http import OpsServer
from rlm.sidecar import Sidecar
from tests.support.kafka import produce
from tests.support.processes import http_get
from tests.support.sidecar import make_settings, wait_for


def _health(ops: OpsServer, path: str = "/health") -> tuple[int, dict[str, Any]]:
    status, body = http_get(f"http://127.0.0.1:{ops.port}{path}")
    return status, json.loads(body) if body else {}


def _serving(sidecar: Sidecar) -> OpsServer:
    return OpsServer("127.0.0.1", 0, sidecar.health, sidecar.liveness).start()


def test_margin_and_health_react_to_local_retention_shorter_than_the_copy_interval(
        kafka: KafkaCluster, tmp_path: Path) -> None:
    short, long_ = f"short-{uuid.uuid4().hex[:6]}", f"long-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(short, 1, config={"retention.ms": "20000", "segment.ms": "300"})
    kafka.create_topic(long_, 1)
    # The copy interval (10 min) is far longer than the short topic's local retention (20 s).
    settings = make_settings(kafka, tmp_path, tasks={"copy_interval_ms": 600_000},
                             topics={"include": [short, long_]}, health={"min_retention_margin_ms": 60_000})
    sidecar = Sidecar(settings).start()
    ops = _serving(sidecar)
    try:
        wait_for(lambda: sidecar.health()[1]["leading"] == 2, 60, "the sidecar to lead both partitions")
        produce(kafka, short, [(b"k", b"v" * 100)] * 50)
        produce(kafka, long_, [(b"k", b"v" * 100)] * 50)

        def margins() -> tuple[float | None, float | None]:
            return (REGISTRY.get_sample_value("rlm_retention_margin_seconds", {"topic": short, "partition": "0"}),
                    REGISTRY.get_sample_value("rlm_retention_margin_seconds", {"topic": long_, "partition": "0"}))

        wait_for(lambda: None not in margins() and margins()[0] < 60, 60, "the short topic's margin")
        m_short, m_long = margins()
        assert 0 < m_short <= 20, m_short  # the active segment, just written: about retention.ms from now
        assert m_long > 6 * 24 * 3600, m_long  # 7 days of default retention
        status, body = _health(ops)
        assert status == 503
        check = body["checks"]["retention_margin"]
        assert not check["ok"] and list(check["below_min"]) == [str(t) for t in sidecar.margins if t.topic == short]
        assert body["checks"]["log_dirs"]["ok"] and body["checks"]["store"]["ok"] and body["checks"]["broker"]["ok"]
        assert _health(ops, "/health/live")[0] == 200
        bytes_margin = REGISTRY.get_sample_value("rlm_retention_margin_bytes", {"topic": short, "partition": "0"})
        assert bytes_margin == math.inf  # no retention.bytes
    finally:
        ops.stop()
        sidecar.stop()


def test_missing_log_dir_and_refusing_store(kafka: KafkaCluster, tmp_path: Path) -> None:
    missing = tmp_path / "no-such-log-dir"
    settings = make_settings(kafka, tmp_path, topics={"include": ["none-of-these"]})
    settings = settings.model_copy(update={"log_dirs": [*settings.log_dirs, missing]})
    sidecar = Sidecar(settings).start()  # starts without the log dir (documented): it is not ready
    ops = _serving(sidecar)
    root = Path(settings.store.root_path)
    try:
        wait_for(lambda: sidecar.last_discovery_ok, 60, "a discovery round")
        status, body = _health(ops)
        assert status == 503
        assert body["checks"]["log_dirs"] == {"ok": False, "problems": {str(missing): "missing"}}
        assert REGISTRY.get_sample_value("rlm_log_dir_ok", {"log_dir": str(missing)}) in (0.0, None)
        wait_for(lambda: REGISTRY.get_sample_value("rlm_log_dir_ok", {"log_dir": str(missing)}) == 0.0, 30,
                 "the log dir gauge")
        missing.mkdir()
        wait_for(lambda: _health(ops)[0] == 200, 30, "ready once the log dir exists")

        # The store refuses every request: its root replaced by a file.
        shutil.rmtree(root)
        root.write_text("not a directory")
        wait_for(lambda: _health(ops)[0] == 503, 30, "not ready after three failed store probes")
        store = _health(ops)[1]["checks"]["store"]
        assert not store["ok"] and store["failures_in_a_row"] >= 3
        assert "is not a writable directory" in store["last_error"], store
        assert _health(ops, "/health/live")[0] == 200
        root.unlink()
        root.mkdir()
        wait_for(lambda: _health(ops)[0] == 200, 30, "ready again once the store answers")
    finally:
        ops.stop()
        sidecar.stop()


@pytest.mark.slow
def test_stopped_broker_makes_the_sidecar_not_ready(tmp_path: Path) -> None:
    with KafkaCluster(base_dir=tmp_path / "kafka") as cluster:
        settings = make_settings(cluster, tmp_path, health={"broker_stale_ms": 2000})
        sidecar = Sidecar(settings).start()
        ops = _serving(sidecar)
        try:
            wait_for(lambda: _health(ops)[0] == 200, 60, "ready with the broker up")
            cluster.stop_node(1)
            wait_for(lambda: _health(ops)[0] == 503, 60, "not ready with the broker stopped")
            broker = _health(ops)[1]["checks"]["broker"]
            assert not broker["ok"] and "discovery" in broker["reason"], broker
            assert _health(ops, "/health/live")[0] == 200  # alive: a restart would not bring the broker back
        finally:
            ops.stop()
            sidecar.stop(timeout_s=30)


def test_a_metadata_manager_failure_in_discovery_is_a_failed_round(kafka: KafkaCluster, topic_name: str,
                                                                   tmp_path: Path) -> None:
    """The metadata manager may fail to start following a partition (its metadata partition's offsets unreadable
    while a broker restarts): that discovery round fails like any other (a warning, /health's reason), it does not
    escape to the scheduler as an exception, and the next round leads the partition."""
    from rlmm.api import MetadataWriteError

    kafka.create_topic(topic_name, 1, config={"segment.ms": "300"})
    sidecar = Sidecar(make_settings(kafka, tmp_path, topics={"include": [topic_name]}))
    real = sidecar.rlmm.on_partition_leadership_changes
    failures = [MetadataWriteError("cannot read the offsets of __rlm_md-0: _DESTROY_BROKER")]

    def flaky(leaders, followers):  # type: ignore[no-untyped-def]
        if failures:
            raise failures.pop()
        return real(leaders, followers)

    sidecar.rlmm.on_partition_leadership_changes = flaky  # type: ignore[method-assign]
    try:
        sidecar.discover()  # raised before: apscheduler logged 'Job "Sidecar.discover" raised an exception'
        assert "_DESTROY_BROKER" in (sidecar.last_error or "") and sidecar.health()[1]["leading"] == 0
        assert sidecar.last_discovery_ok is None
        sidecar.discover()
        assert sidecar.health()[1]["leading"] == 1 and sidecar.last_discovery_ok is not None
    finally:
        sidecar.stop(10)
