"""Leadership moves between the brokers of a 3-broker cluster, one sidecar per broker (own state dir, the same
store and metadata topic): the remote range stays contiguous, no offset is remote twice, every record readable."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import ElectionType, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.support.sidecar import (
    assert_contiguous,
    assert_readable,
    latest_remote,
    make_settings,
    only,
    produce_segments,
    remote_segments,
    wait_for,
)

pytestmark = pytest.mark.slow


class Describer:
    """(topic id, leader, in-sync replicas) of partition 0 of a topic; (None, -1, []) while the brokers do not know
    it yet (just created) or the broker asked does not answer. librdkafka sends DescribeTopics to its idea of the
    controller, possibly the broker just stopped: after a failure the next call uses a fresh client."""

    def __init__(self, config: dict) -> None:
        self.config = {"topic.metadata.refresh.interval.ms": 2000, **config}
        self.admin = AdminClient(self.config)

    def __call__(self, topic: str) -> tuple[uuid.UUID | None, int, list[int]]:
        try:
            desc = self.admin.describe_topics(TopicCollection([topic]), request_timeout=10)[topic].result(15)
        except (KafkaException, TimeoutError) as err:
            print("describe:", err)
            self.admin = AdminClient(self.config)
            return None, -1, []
        tid = desc.topic_id
        msb, lsb = tid.get_most_significant_bits(), tid.get_least_significant_bits()
        p = desc.partitions[0]
        print("describe:", p.leader, [r.id for r in p.isr])
        return (uuid.UUID(int=((msb & (2**64 - 1)) << 64) | (lsb & (2**64 - 1))),
                p.leader.id if p.leader is not None else -1, sorted(r.id for r in p.isr))


def test_leadership_moves_without_gap_or_duplicate(kafka_cluster3: KafkaCluster, topic_name: str,
                                                   tmp_path: Path) -> None:
    kafka = kafka_cluster3
    describe = Describer(kafka.admin_config())
    # Node 1 is also the controller: keep it running; leadership starts on node 2 (first in the assignment).
    describe.admin.create_topics([NewTopic(topic_name, 1, replica_assignment=[[2, 3, 1]],
                                           config={"segment.ms": "300"})])[topic_name].result(30)
    wait_for(lambda: describe(topic_name)[1] == 2, 30, "node 2 to lead")
    topic_id = describe(topic_name)[0]
    tp = TopicIdPartition(topic_id, topic_name, 0)
    tag = uuid.uuid4().hex[:8]
    shared = {"topic": f"__rlm_md_{tag}", "to_be_deleted_topic": f"__rlm_tbd_{tag}", "replication_factor": 3}
    sidecars = {n: Sidecar(make_settings(kafka, tmp_path, node_id=n, topics=only(topic_name), metadata=shared))
                for n in (1, 2, 3)}
    for s in sidecars.values():
        s.start()
    acks = {"acks": "all"}
    try:
        sent = produce_segments(kafka, topic_name, 4, 100, segment_ms=300, **acks)
        wait_for(lambda: latest_remote(sidecars[2], tp) >= max(sent), 60, "node 2's sidecar to copy")

        kafka.stop_node(2)
        try:
            wait_for(lambda: describe(topic_name)[1] in (1, 3), 120, "leadership to move off node 2")
            second = describe(topic_name)[1]
            sent |= produce_segments(kafka, topic_name, 4, 100, segment_ms=300, **acks)
            wait_for(lambda: latest_remote(sidecars[second], tp) >= max(sent), 60,
                     f"node {second}'s sidecar to copy after the move")
        finally:
            kafka.start_node(2)
            kafka.wait_ready()

        def in_sync() -> bool:
            if kafka.node(2).process.poll() is not None:
                raise AssertionError(f"node 2 exited:\n{kafka.tail_logs(40)}")
            return 2 in describe(topic_name)[2]

        wait_for(in_sync, 120, "node 2 back in sync")
        election = describe.admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic_name, 0)])
        for fut in election.result(30).values():
            if fut is not None:
                raise AssertionError(f"preferred election failed: {fut}")
        wait_for(lambda: describe(topic_name)[1] == 2, 30, "node 2 to lead again")
        sent |= produce_segments(kafka, topic_name, 4, 100, segment_ms=300, **acks)
        wait_for(lambda: latest_remote(sidecars[2], tp) >= max(sent), 60, "node 2's sidecar to copy again")

        for n, sidecar in sidecars.items():  # every sidecar follows the partition and sees the same range
            wait_for(lambda s=sidecar: latest_remote(s, tp) >= max(sent), 30, f"sidecar {n} to see every segment")
            segs = remote_segments(sidecar, tp)
            assert_contiguous(segs)
            assert_readable(sidecar, tp, sent, what=f"sidecar {n}")
        segs = remote_segments(sidecars[1], tp)
        assert {2, second} <= {s.broker_id for s in segs}  # both leaders copied
        epochs = [e for s in segs for e, _start in s.segment_leader_epochs]
        assert epochs == sorted(epochs) and len(set(epochs)) >= 3  # three leader epochs, in order
    finally:
        for s in sidecars.values():
            s.stop()
