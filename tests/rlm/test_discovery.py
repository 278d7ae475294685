from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer

from devtools.devkafka import KafkaCluster
from rlm.discovery import ClusterView, scan_log_dirs
from tests.support.sidecar import wait_for


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


def test_topic_ids_answer_every_name_explicitly(kafka: KafkaCluster, topic_name: str) -> None:
    """Live id, UNKNOWN_TOPIC_OR_PART for a missing name, and a new id after delete + re-create."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import AdminClient

    old = kafka.create_topic(topic_name)
    view = ClusterView(kafka.admin_config())
    missing = topic_name + "-missing"
    got = view.topic_ids([topic_name, missing])
    assert got[topic_name].topic_id == old and got[topic_name].error_code is None
    assert got[missing].topic_id is None and got[missing].error_code == KafkaError.UNKNOWN_TOPIC_OR_PART

    admin = AdminClient(kafka.admin_config())  # held until its future is answered
    admin.delete_topics([topic_name])[topic_name].result(30)
    deadline = time.monotonic() + 30
    while True:
        try:
            new = kafka.create_topic(topic_name)
            break
        except Exception:  # noqa: BLE001 - the deletion is still being completed
            assert time.monotonic() < deadline, "topic not re-created within 30s"
            time.sleep(0.3)
    assert new != old
    assert view.topic_ids([topic_name])[topic_name].topic_id == new


def test_acl_denied_answers_are_errors_not_absence(kafka_sasl: KafkaCluster, topic_name: str) -> None:
    """A principal without Describe: the all-topics listing silently omits the topic; asked by name it answers
    TOPIC_AUTHORIZATION_FAILED. Without DescribeConfigs the topic's compaction is unknown (None), and
    compacted_topics counts it as compacted (fail closed)."""
    from confluent_kafka import KafkaError
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        AdminClient,
        ResourcePatternType,
        ResourceType,
    )

    from tests.support.fixtures import SASL_PRINCIPAL

    hidden, visible = f"{topic_name}-hidden", f"{topic_name}-visible"
    kafka_sasl.create_topic(hidden)
    visible_id = kafka_sasl.create_topic(visible, config={"cleanup.policy": "delete"})
    admin = AdminClient(kafka_sasl.admin_config())
    # Describe only (no DescribeConfigs) on the visible topic; nothing at all on the hidden one.
    binding = AclBinding(ResourceType.TOPIC, visible, ResourcePatternType.LITERAL, f"User:{SASL_PRINCIPAL}", "*",
                         AclOperation.DESCRIBE, AclPermissionType.ALLOW)
    for fut in admin.create_acls([binding]).values():
        fut.result(30)
    view = ClusterView(kafka_sasl.client_config(SASL_PRINCIPAL))
    listed = view.partitions(None)
    assert (visible, 0) in listed and (hidden, 0) not in listed  # absent, yet alive
    got = view.topic_ids([hidden, visible])
    assert got[hidden].topic_id is None and got[hidden].error_code == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert got[visible].topic_id == visible_id
    with pytest.raises(KafkaException):
        view.partitions([hidden, visible])
    assert set(view.partitions([hidden, visible], skip_unauthorized=True)) == {(visible, 0)}
    assert view.compaction([visible]) == {visible: None}
    assert view.compacted_topics([visible]) == {visible}
    assert ClusterView(kafka_sasl.admin_config()).compaction([visible]) == {visible: False}


def test_admin_calls_counted(kafka: KafkaCluster, topic_name: str) -> None:
    """rlm_cluster_calls counts each admin call once (bench_scale reads them per rolled segment), and
    rlm_list_offsets_partitions the partitions one list_offsets call asks for."""
    from prometheus_client import REGISTRY

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    kafka.create_topic(topic_name, 3)
    view = ClusterView(kafka.admin_config())
    # a topic just made: a partition's leader may not be known yet (CI: 2 of 3 answered); counted from then on
    wait_for(lambda: len(view.stable_offsets_and_epochs([(topic_name, p) for p in range(3)])) == 3, 30,
             "every partition of the new topic to answer ListOffsets")
    before = {c: sample("rlm_cluster_calls_total", call=c) for c in ("list_offsets", "metadata", "describe_topics")}
    asked = sample("rlm_list_offsets_partitions_total")
    assert len(view.stable_offsets_and_epochs([(topic_name, p) for p in range(3)])) == 3
    view.metadata_fingerprint([topic_name])
    view.partitions()  # all topics: one Metadata request for their names, then one DescribeTopics call
    assert {c: sample("rlm_cluster_calls_total", call=c) - v for c, v in before.items()} == {
        "list_offsets": 1, "metadata": 2, "describe_topics": 1}
    assert sample("rlm_list_offsets_partitions_total") - asked == 3


def test_metadata_names_the_leaders_describe_topics_names(kafka: KafkaCluster, topic_name: str) -> None:
    """A full discovery round keeps its answer for the cheap rounds only when its Metadata answer (the fingerprint)
    names the leaders and replicas its DescribeTopics answer names (MetadataAnswer.agrees): from one broker the two
    agree, so rounds on a quiet cluster stay cheap; another leader, or a partition missing, is a disagreement."""
    import dataclasses

    kafka.create_topic(topic_name, 2)
    view = ClusterView(kafka.admin_config())
    wait_for(lambda: all(i.leader == 1 for i in view.partitions([topic_name]).values()), 30, "both leaders known")
    asked = [topic_name, topic_name + "-absent"]
    answer = view.metadata(asked)
    parts = view.partitions([topic_name])
    assert answer.leadership() == {(topic_name, 0): (1, (1,)), (topic_name, 1): (1, (1,))}
    assert answer.fingerprint == view.metadata_fingerprint(asked)
    assert answer.agrees(parts, [topic_name]) and answer.agrees({}, [])
    moved = {**parts, (topic_name, 1): dataclasses.replace(parts[(topic_name, 1)], leader=2)}
    assert not answer.agrees(moved, [topic_name])
    assert not answer.agrees({(topic_name, 0): parts[(topic_name, 0)]}, [topic_name])
    view.close()


def test_a_round_that_reaches_no_broker_starts_the_next_with_a_fresh_client(kafka: KafkaCluster,
                                                                              topic_name: str) -> None:
    """metadata_fingerprint is the first call of every discovery round: when it reaches no broker, the next call
    must not reuse the client (after a broker restart a librdkafka client was seen failing with _TRANSPORT for
    minutes while the broker answered others; a round failing at its first call never reached the calls that replace
    the client). The same for a ListOffsets call none of whose partitions reached a broker; a partition the cluster
    answers with an error (unknown topic) keeps the client."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # (log_level 0: librdkafka prints no "connection refused" lines on stderr)
    view = ClusterView({"bootstrap.servers": f"127.0.0.1:{port}", "log_level": 0}, timeout_s=1.0)
    first = view._admin
    with pytest.raises(KafkaException):
        view.metadata_fingerprint(["t"])
    assert view._admin is not first
    second = view._admin
    assert view.stable_offsets_and_epochs([("t", 0)]) == {}
    assert view._admin is not second
    view.close()

    kafka.create_topic(topic_name, 1)
    live = ClusterView(kafka.admin_config())
    client = live._admin
    assert live.stable_offsets_and_epochs([(topic_name + "-absent", 0)]) == {}
    assert (topic_name, 0) in live.stable_offsets_and_epochs([(topic_name, 0)])
    live.metadata_fingerprint([topic_name])
    assert live._admin is client
    live.close()
