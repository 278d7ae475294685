"""``bench/bench_rlmm.py --bootstrap-servers``: the part of the bench that talks to a cluster it did not start."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_rlmm.py"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_rlmm_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_running_cluster_creates_the_topic(kafka, topic_name: str) -> None:
    """The topic is created on the running cluster (the admin client once went away with the call that made it, and
    the request failed with ``_DESTROY``: "Broker handle destroyed for termination"), and reads back empty."""
    bench = _bench()
    assert bench.existing_events(kafka.bootstrap_servers, topic_name) is None
    bench._RunningCluster(kafka.bootstrap_servers).create_topic(topic_name, 3, 1, {"cleanup.policy": "compact"})
    assert bench.existing_events(kafka.bootstrap_servers, topic_name) == 0
