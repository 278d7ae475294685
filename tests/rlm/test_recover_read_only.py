"""Read-only against another cluster (issue 13): a second Kafka cluster, where the topic was re-created with a new
id, gets metadata of the first cluster's store (``rlm recover`` into a metadata topic of its own) and serves it in
``mode: read_only`` through ``rlm cat``, the history endpoint and Spark's ``kafka-remote`` source, producing no
record to any topic of either cluster and leaving the store as it was (listing and mtimes). Before recovery,
read-only fails fast on the missing metadata topic instead of creating it.
"""

from __future__ import annotations

import base64
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from devtools.devkafka import KafkaCluster
from rlm.config import SidecarSettings
from rlm.listener import start_listener
from rlm.sidecar import Sidecar
from rlmm.api import MetadataTopicMissingError, TopicIdPartition
from tests.support.kafka import produce
from tests.support.processes import json_lines, ok, rlm
from tests.support.sidecar import latest_remote, make_settings, produce_segments, settings_yaml, store_keys, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.timeout(400)]

Sent = dict[int, tuple[bytes, bytes]]


def end_offsets(kafka: KafkaCluster, *, skip: frozenset[str] = frozenset()) -> dict[tuple[str, int], int]:
    """The high watermark of every partition of every topic of the cluster (internal ones included) but ``skip``."""
    admin = AdminClient(kafka.admin_config())
    topics = {t: md for t, md in admin.list_topics(timeout=30).topics.items() if t not in skip}
    c = Consumer({**kafka.admin_config(), "group.id": f"wm-{uuid.uuid4()}", "enable.auto.commit": False})
    try:
        return {(t, p): c.get_watermark_offsets(TopicPartition(t, p), timeout=30)[1]
                for t, md in topics.items() for p in md.partitions}
    finally:
        c.close()


def mtimes(root: Path) -> dict[str, int]:
    return {k: (root / k).stat().st_mtime_ns for k in store_keys(root)}


def test_read_only_against_another_clusters_store(kafka: KafkaCluster, tmp_path: Path,
                                                  spark: Any) -> None:  # noqa: F811 - the imported fixture
    # -- cluster 1 tiers a topic of two partitions into the store ---------------------------------------------
    topic = f"ro-{uuid.uuid4().hex[:8]}"
    first_id = kafka.create_topic(topic, 2, config={"segment.ms": "400"})
    sent: dict[int, Sent] = {}
    for p in (0, 1):
        sent[p] = produce_segments(kafka, topic, 3, 100, segment_ms=400, roll=False, partition=p)
        produce(kafka, topic, [(b"__roll__", b"r")], partition=p)  # rolls the last segment; stays local
    settings1 = make_settings(kafka, tmp_path, topics={"include": [re.escape(topic)]})
    with Sidecar(settings1) as sidecar:
        for p in (0, 1):
            tp = TopicIdPartition(first_id, topic, p)
            wait_for(lambda tp=tp, p=p: latest_remote(sidecar, tp) >= max(sent[p]), 90, f"{tp} to be tiered")
    root = settings1.store.root_path
    config1 = tmp_path / "cluster1.yaml"
    config1.write_text(settings_yaml(settings1))
    ls_before = json_lines(ok(rlm("ls", topic, "--json", config=config1)))
    assert len(ls_before) >= 6, ls_before

    # -- cluster 2: the topic re-created there (a new id), read-only settings over cluster 1's store -----------
    with KafkaCluster(base_dir=tmp_path / "kafka2") as kafka2:
        second_id = kafka2.create_topic(topic, 2)
        assert second_id != first_id
        other = f"ro-other-{uuid.uuid4().hex[:8]}"  # cluster 2's own topic, rolled segments: never to be tiered
        other_id = kafka2.create_topic(other, 1, config={"segment.ms": "300"})
        produce_segments(kafka2, other, 3, 50, segment_ms=300)
        tag = uuid.uuid4().hex[:8]
        raw: dict[str, Any] = make_settings(kafka2, tmp_path, topics={"include": [re.escape(topic), re.escape(other)]},
                                            store=settings1.store.model_dump(mode="json", exclude_none=True)
                                            ).model_dump(mode="json", exclude_none=True)
        raw |= {"mode": "read_only",
                "metadata": {**raw["metadata"], "topic": f"__rlm_md_ro_{tag}", "state_dir": str(tmp_path / "state-ro"),
                             "to_be_deleted_topic": f"__rlm_tbd_ro_{tag}"},
                # a sidecar that would expire everything at once and collect garbage with no grace, were it not
                # read-only
                "retention": [{"pattern": ".*", "retention_ms": 1, "retention_bytes": 1}],
                "tasks": {**raw["tasks"], "gc_interval_ms": 1000, "gc_grace_ms": 0, "expiration_interval_ms": 300},
                "history_listener": {"host": "127.0.0.1", "port": 0, "fetch_poll_ms": 100,
                                     "authorization": {"allow_if_no_authorizer": True}}}
        settings2 = SidecarSettings(**raw)
        config2 = tmp_path / "read-only.yaml"
        config2.write_text(settings_yaml(settings2))
        md_topic = settings2.metadata.topic

        # no metadata topic yet: read-only fails fast and creates nothing
        proc = rlm("cat", topic, "0", config=config2)
        assert proc.returncode == 2 and f"metadata topic {md_topic} does not exist" in proc.stderr, proc.stderr
        with pytest.raises(MetadataTopicMissingError, match="does not create it"):
            Sidecar(settings2)
        assert md_topic not in AdminClient(kafka2.admin_config()).list_topics(timeout=30).topics

        # recovery (a deliberate write of cluster 2's metadata topic only) maps the stored id to the new one
        out = ok(rlm("recover", config=config2, timeout=180))
        assert f"-> {topic}-0({second_id})" in out and "0 conflicts" in out, out
        n = int(re.search(r"wrote (\d+) segments", out)[1])
        assert n == len(ls_before), out
        # what cluster 1 listed, segment for segment (ids, offsets, epochs, sizes, times), now under the new id
        assert json_lines(ok(rlm("ls", topic, "--json", config=config2))) == ls_before

        # Cluster 1's __consumer_offsets is not compared: the group coordinator writes there by itself when the
        # static member of cluster 1's own (stopped) sidecar's cleaner expires. Cluster 2's is.
        skip = frozenset({"__consumer_offsets"})
        ends = (end_offsets(kafka, skip=skip), end_offsets(kafka2))
        before = mtimes(root)
        ro = Sidecar(settings2).start()
        history = start_listener(settings2, ro.rsm)
        consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{history.port}", "group.id": f"unused-{tag}",
                             "enable.auto.commit": False, "check.crcs": True, "fetch.wait.max.ms": 100})
        try:
            assert ro.read_only
            for p in (0, 1):
                tp = TopicIdPartition(second_id, topic, p)
                wait_for(lambda tp=tp, p=p: latest_remote(ro, tp) >= max(sent[p]), 60, f"read-only {tp}")
                rows = json_lines(ok(rlm("cat", topic, str(p), config=config2)))
                assert {r["offset"]: (base64.b64decode(r["key"]), base64.b64decode(r["value"])) for r in rows} \
                    == sent[p], f"rlm cat {topic}-{p}"
            tier = history.server.router.ctx.tier

            def served() -> bool:
                tps = [TopicIdPartition(second_id, topic, p) for p in (0, 1)]
                tier.refresh(tps)
                return all((t := tier.partition(tp)) is not None and t.high_watermark == max(sent[tp.partition]) + 1
                           for tp in tps)
            wait_for(served, 60, "the history endpoint to serve the recovered tier")
            consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
            got: dict[int, Sent] = {0: {}, 1: {}}
            deadline = time.monotonic() + 60
            while any(len(got[p]) < len(sent[p]) for p in (0, 1)):
                assert time.monotonic() < deadline, {p: len(v) for p, v in got.items()}
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                assert msg.error() is None, msg.error()
                got[msg.partition()][msg.offset()] = (msg.key(), msg.value())
            assert got == sent, "history endpoint"
            # Spark's kafka-remote source over cluster 2's metadata topic and cluster 1's store
            rows = (spark.read.format("kafka-remote")
                    .options(**{"kafka.bootstrap.servers": kafka2.bootstrap_servers, "metadata.topic": md_topic,
                                "store": "fs", "store.root_path": str(root), "subscribe": topic})
                    .load().select("partition", "offset", "key", "value").collect())
            by_spark: dict[int, Sent] = {0: {}, 1: {}}
            for r in rows:
                by_spark[r["partition"]][r["offset"]] = (bytes(r["key"]), bytes(r["value"]))
            assert len(rows) == sum(len(v) for v in sent.values()) and by_spark == sent, "Spark"
            time.sleep(2.0)  # several discovery, copy, expiration and gc intervals
            assert latest_remote(ro, TopicIdPartition(other_id, other, 0)) == -1
        finally:
            consumer.close()
            history.stop()
            ro.stop()
        assert mtimes(root) == before, "the store's listing and mtimes are unchanged"
        assert (end_offsets(kafka, skip=skip), end_offsets(kafka2)) == ends, "no record produced to any topic"
        assert settings2.metadata.to_be_deleted_topic not in AdminClient(
            kafka2.admin_config()).list_topics(timeout=30).topics
