"""The ``kafka-remote`` source over offload segments (streaming offload, issue 12): cut from a never-rolled local
segment, each its own input partition (or block ranges of one), every record back exactly."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.support.kafka import produce
from tests.support.sidecar import latest_remote, make_settings, only, remote_segments, wait_for
from tests.support.spark import Produced, TieredData, collect, expected, load

pytestmark = pytest.mark.slow


def test_offload_segments_read_exactly(spark: Any, kafka: KafkaCluster, tmp_path: Path) -> None:
    topic = f"spark-offload-{uuid.uuid4().hex[:8]}"
    topic_id = kafka.create_topic(topic, 1, config={"segment.ms": "3600000", "segment.bytes": str(1 << 30)})
    tp = TopicIdPartition(topic_id, topic, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic), store={"block_size_bytes": 4 * 1024},
                             offload=[{"pattern": topic, "mode": "streaming", "offload_max_bytes": 8 * 1024,
                                       "offload_max_ms": 500, "poll_interval_ms": 100}])
    data = TieredData(topic, {"kafka.bootstrap.servers": kafka.bootstrap_servers,
                              "metadata.topic": settings.metadata.topic, "store": "fs",
                              "store.root_path": str(settings.store.root_path)})
    data.records[0] = {}
    ts = 1_700_000_000_000
    for n, codec in enumerate(("zstd", "none", "lz4")):
        recs = [(f"k{n}-{i}".encode(), (f"{codec}-{i}-".encode() * 20)[: 30 + i % 300], [], ts + n * 1000 + i)
                for i in range(500)]
        for (_p, off), (k, v, _h, t) in zip(produce(kafka, topic, recs, **{"compression.type": codec,
                                                                          "batch.size": 4096}), recs, strict=True):
            data.records[0][off] = Produced(k, v, (), t)
    with Sidecar(settings) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= max(data.records[0]), 120, "everything offloaded")
        n_segments = len(remote_segments(sidecar, tp))
    assert n_segments > 3
    df = load(spark, data, subscribe=topic, includeHeaders="true")
    assert collect(df) == expected(data)
