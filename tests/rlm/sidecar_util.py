"""Building a sidecar against the test broker: settings with short intervals, a per-test metadata topic."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlm.config import SidecarSettings
from rlm.devkafka import KafkaCluster

__all__ = ["make_settings", "wait_for"]


def make_settings(kafka: KafkaCluster, tmp_path: Path, node_id: int = 1, **overrides: Any) -> SidecarSettings:
    tag = uuid.uuid4().hex[:8]
    raw: dict[str, Any] = {
        "broker_id": node_id,
        "log_dirs": [str(d) for d in kafka.node(node_id).log_dirs],
        "staging_dir": str(tmp_path / f"staging-{node_id}"),
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "store": {"store": "fs", "root_path": str(tmp_path / "remote"), "block_size_bytes": 64 * 1024},
        "metadata": {"topic": f"__rlm_md_{tag}", "partitions": 3, "replication_factor": 1,
                     "state_dir": str(tmp_path / f"state-{node_id}"), "tombstone_delay_ms": 1000,
                     "to_be_deleted_topic": f"__rlm_tbd_{tag}"},
        "tasks": {"copy_interval_ms": 300, "expiration_interval_ms": 500, "discovery_interval_ms": 300,
                  "gc_interval_ms": 3_600_000, "gc_grace_ms": 0, "cleaner_interval_ms": 300},
        "retention": [{"pattern": ".*", "retention_ms": -1, "retention_bytes": -1}],
        "listen": {"host": "127.0.0.1", "port": 0},
        "log_format": "text",
    }
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(raw.get(k), dict):
            raw[k] = {**raw[k], **v}
        else:
            raw[k] = v
    return SidecarSettings(**raw)


def wait_for(cond: Callable[[], Any], timeout_s: float = 60.0, what: str = "condition",
             interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)
