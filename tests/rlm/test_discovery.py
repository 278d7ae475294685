from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Producer

from rlm.devkafka import KafkaCluster
from rlm.discovery import ClusterView, scan_log_dirs


def test_scan_log_dirs_ignores_future_delete_and_files(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in ("t.x-y-0", "t.x-y-1.0123abcd-future", "gone-3.abc-delete", "noise"):
        (a / d).mkdir(parents=True)
    (b / "t.x-y-1").mkdir(parents=True)
    (a / "t-5").write_text("a file, not a partition")
    found = scan_log_dirs([a, b, tmp_path / "missing"])
    assert sorted(found) == [("t.x-y", 0), ("t.x-y", 1)]
    assert found[("t.x-y", 1)].path == b / "t.x-y-1"


def test_cluster_view_against_broker(kafka: KafkaCluster, topic_name: str) -> None:
    tid = kafka.create_topic(topic_name, 2)
    compacted = topic_name + "-c"
    kafka.create_topic(compacted, 1, config={"cleanup.policy": "compact"})
    view = ClusterView(kafka.admin_config())
    parts = view.partitions([topic_name, compacted])
    assert parts[(topic_name, 0)].topic_id == tid and parts[(topic_name, 1)].leader == 1
    assert view.compacted_topics([topic_name, compacted]) == {compacted}
    local = scan_log_dirs([kafka.log_dir()])
    assert (topic_name, 0) in local and (topic_name, 1) in local

    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": topic_name})
    producer.init_transactions()
    producer.begin_transaction()
    for _ in range(5):
        producer.produce(topic_name, b"v", partition=0)
    producer.flush()
    # An open transaction holds the last stable offset at its first offset.
    assert view.last_stable_offsets([(topic_name, 0)]) == {(topic_name, 0): 0}
    producer.commit_transaction()
    deadline = time.monotonic() + 20
    while view.last_stable_offsets([(topic_name, 0)])[(topic_name, 0)] != 6:  # 5 records + commit marker
        assert time.monotonic() < deadline, "LSO did not advance after commit"
        time.sleep(0.2)
