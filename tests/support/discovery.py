"""Discovery without a broker: a sidecar's settings pointing at no cluster, made-up partition dirs and a fake
:class:`rlm.discovery.ClusterView` whose answers the test writes (tests/rlm/test_discovery_rounds.py,
tests/rlm/test_discovery_idle.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlm.config import SidecarSettings
from rlm.discovery import ClusterView, MetadataAnswer, PartitionInfo, TopicLookup
from tests.support.batches import write_partition_metadata

__all__ = ["BROKER", "FakeView", "fake_partition_dir", "offline_settings", "partition_info"]

BROKER = 1  # the sidecar's broker id: a partition whose leader is BROKER is led here


def fake_partition_dir(log_dir: Path, topic: str, partition: int, topic_id: uuid.UUID | None) -> Path:
    """A partition dir as the broker leaves it: ``partition.metadata`` with ``topic_id`` (None: not written yet)."""
    path = log_dir / f"{topic}-{partition}"
    path.mkdir(parents=True)
    if topic_id is not None:
        write_partition_metadata(path, topic_id)
    return path


def partition_info(topic: str, topic_id: uuid.UUID, partition: int, leader: int) -> PartitionInfo:
    """The cluster's answer for one partition led by ``leader``, replicated on brokers 1, 2 and 3."""
    return PartitionInfo(topic, topic_id, partition, leader, (1, 2, 3))


def offline_settings(tmp_path: Path, **overrides: Any) -> SidecarSettings:
    """Settings of broker :data:`BROKER`'s sidecar under ``tmp_path`` (log dir ``logs``, an fs store), whose
    bootstrap server nothing listens on: every real cluster call fails, the test gives it a :class:`FakeView`."""
    raw: dict[str, Any] = {
        "broker_id": BROKER,
        "log_dirs": [str(tmp_path / "logs")],
        "staging_dir": str(tmp_path / "staging"),
        "kafka": {"bootstrap_servers": "127.0.0.1:9"},  # nothing listens: every real cluster call would fail
        "store": {"store": "fs", "root_path": str(tmp_path / "remote")},
        "metadata": {"topic": "__rlm_md", "partitions": 1, "replication_factor": 1,
                     "state_dir": str(tmp_path / "state"), "to_be_deleted_topic": "__rlm_tbd"},
        "retention": [{"pattern": ".*", "retention_ms": -1, "retention_bytes": -1}],
        **overrides,
    }
    return SidecarSettings(**raw)


class FakeView:
    """The cluster's answers of a :class:`ClusterView`, made up: ``infos`` for the partitions, a delete policy for
    every topic's config, the topic ids of ``infos``."""

    compaction = ClusterView.compaction

    def __init__(self, infos: dict[tuple[str, int], PartitionInfo]) -> None:
        self.infos = infos

    def partitions(self, topics: Iterable[str] | None = None, *,
                   skip_unauthorized: bool = False) -> dict[tuple[str, int], PartitionInfo]:
        names = set(topics or ())
        return {k: v for k, v in self.infos.items() if k[0] in names}

    def topic_configs(self, topics: Iterable[str]) -> dict[str, dict[str, str | None] | None]:
        return {t: {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"} for t in topics}

    def topic_ids(self, topics: Iterable[str]) -> dict[str, TopicLookup]:
        ids = {info.topic: info.topic_id for info in self.infos.values()}
        return {t: TopicLookup(t, topic_id=ids[t]) for t in topics}

    def cluster_id(self) -> str:
        return "fake"

    def metadata(self, topics: Iterable[str]) -> MetadataAnswer:
        answered = tuple((name, None, tuple(sorted((k[1], v.leader, v.replicas, None)
                                                   for k, v in self.infos.items() if k[0] == name)))
                         for name in sorted(set(topics)))
        return MetadataAnswer(answered, hash(answered))

    def metadata_fingerprint(self, topics: Iterable[str]) -> int:
        return self.metadata(topics).fingerprint

    def close(self) -> None:
        pass
