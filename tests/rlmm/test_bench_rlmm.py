"""``bench/bench_rlmm.py --bootstrap-servers``: the part of the bench that talks to a cluster it did not start."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from confluent_kafka import KafkaError, KafkaException

from tests.support.sidecar import wait_for

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
    # (the topic and its leaders reach the broker's answers a moment after the controller created it)
    assert wait_for(lambda: _events(bench, kafka.bootstrap_servers, topic_name), 30, "the topic's offsets") == [0]


def _events(bench: ModuleType, bootstrap: str, topic: str) -> list[int] | None:
    """``[records in topic]``, or None while it is not listed or its partitions have no leader yet."""
    try:
        n = bench.existing_events(bootstrap, topic)
    except KafkaException as err:
        if err.args[0].code() in (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                                  KafkaError.UNKNOWN_TOPIC_OR_PART):
            return None
        raise
    return None if n is None else [n]
