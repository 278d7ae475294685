"""Issue 13's scenario, end to end on the 3-broker cluster: tier several topics with one sidecar per broker (a
leadership move in between, remote retention already applied to the oldest segments), lose the metadata topic
and every sidecar's state dir, ``rlm recover``, then read every remaining record back byte-exact through all three
readers: ``rlm cat`` (its own process), the Spark ``kafka-remote`` source and the history endpoint (a
confluent-kafka consumer, ``assign()``). Expired segments are not resurrected: neither in the recovered metadata,
nor in any reader, nor in the store.

What recovery rebuilt is compared with what the original metadata said (``rlm ls --json`` before the loss) and with
what the producer's delivery reports said, never with recovery's own view.
"""

from __future__ import annotations

import base64
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devtools.devkafka import KafkaCluster
from rlm.config import SidecarSettings
from rlm.listener import start_listener
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from rsm.manager import RemoteStorageManager
from tests.support.kafka import produce
from tests.support.processes import json_lines, ok, rlm
from tests.support.sidecar import (
    PartitionStates,
    latest_remote,
    make_settings,
    produce_segments,
    reassign,
    remote_segments,
    settings_yaml,
    store_keys,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.timeout(300)]

SEGMENT_MS = 400
HOUR_MS = 3_600_000
Sent = dict[int, tuple[bytes, bytes]]  # offset -> (key, value)


def _roll(kafka: KafkaCluster, topic: str, partition: int, sent: Sent) -> None:
    """One record after ``segment.ms``: the segment holding what was produced before rolls (and can be tiered)."""
    time.sleep(SEGMENT_MS / 1000 + 0.05)
    [(_, off)] = produce(kafka, topic, [(b"__roll__", b"r")], partition=partition)
    sent[off] = (b"__roll__", b"r")


def _create(admin: AdminClient, states: PartitionStates, topic: str, assignment: list[list[int]]) -> uuid.UUID:
    admin.create_topics([NewTopic(topic, len(assignment), replica_assignment=assignment,
                                  config={"segment.ms": str(SEGMENT_MS)})])[topic].result(30)
    for p, replicas in enumerate(assignment):
        wait_for(lambda p=p, n=replicas[0]: states.leader(topic, p) == n, 60, f"node {replicas[0]} to lead {topic}-{p}")
    return wait_for(lambda: states.topic_id(topic), 30, "the topic id")


def _ls(topic: str, config: Path) -> list[dict[str, Any]]:
    return json_lines(ok(rlm("ls", topic, "--json", config=config)))


def _cat(topic: str, partition: int, config: Path) -> Sent:
    rows = json_lines(ok(rlm("cat", topic, str(partition), config=config)))
    return {r["offset"]: (base64.b64decode(r["key"]), base64.b64decode(r["value"])) for r in rows}


def test_recover_after_losing_metadata_and_state(kafka_cluster3: KafkaCluster, tmp_path: Path,
                                                 spark: Any) -> None:  # noqa: F811 - the imported fixture
    kafka = kafka_cluster3
    t0 = time.monotonic()
    tag = uuid.uuid4().hex[:8]
    a, b = f"scn-{tag}-a", f"scn-{tag}-b"
    admin = AdminClient(kafka.admin_config())
    states = PartitionStates(kafka)
    ids = {a: _create(admin, states, a, [[1, 2, 3], [2, 3, 1]]), b: _create(admin, states, b, [[3, 1, 2]])}
    tps = [(a, 0), (a, 1), (b, 0)]

    # a-0: two rounds of records two hours old (remote retention of `a` is one hour: they expire once tiered),
    # then two of now; a-1 and b-0: three rounds of now. Each round a segment of its own.
    old_ts = int(time.time() * 1000) - 2 * HOUR_MS
    sent: dict[tuple[str, int], Sent] = {tp: {} for tp in tps}
    for r in range(2):  # rolls by record time: 10 s apart
        sent[(a, 0)] |= produce_segments(kafka, a, 1, 100, segment_ms=SEGMENT_MS, roll=False, partition=0,
                                         timestamp_ms=old_ts + r * 10_000)
    expired = set(sent[(a, 0)])
    sent[(a, 0)] |= produce_segments(kafka, a, 2, 100, segment_ms=SEGMENT_MS, roll=False, partition=0)
    for topic, p in [(a, 1), (b, 0)]:
        sent[(topic, p)] |= produce_segments(kafka, topic, 3, 100, segment_ms=SEGMENT_MS, roll=False, partition=p)
    for topic, p in tps:
        _roll(kafka, topic, p, sent[(topic, p)])

    md = {"topic": f"__rlm_md_{tag}", "to_be_deleted_topic": f"__rlm_tbd_{tag}", "replication_factor": 3}
    retention = [{"pattern": re.escape(a), "retention_ms": HOUR_MS, "retention_bytes": -1},
                 {"pattern": ".*", "retention_ms": -1, "retention_bytes": -1}]
    topics = {"include": [re.escape(a), re.escape(b)]}
    settings = {n: make_settings(kafka, tmp_path, node_id=n, topics=topics, metadata=md, retention=retention)
                for n in (1, 2, 3)}
    config = tmp_path / "sidecar-1.yaml"
    config.write_text(settings_yaml(settings[1]))

    def tiered(side: dict[int, Sidecar], topic: str, p: int, through: int) -> bool:
        tp = TopicIdPartition(ids[topic], topic, p)
        return any(latest_remote(s, tp) >= through for s in side.values())

    def first_remote(side: dict[int, Sidecar], tp: TopicIdPartition) -> int:
        segs = remote_segments(side[1], tp)
        return segs[0].start_offset if segs else -1

    side: dict[int, Sidecar] = {}
    try:
        for n in (1, 2, 3):
            side[n] = Sidecar(settings[n]).start()
        for topic, p in tps:  # everything but the roll record (the active segment) is remote
            wait_for(lambda topic=topic, p=p: tiered(side, topic, p, max(sent[(topic, p)]) - 1), 90,
                     f"{topic}-{p} to be tiered")
        a0 = TopicIdPartition(ids[a], a, 0)
        first_kept = min(set(sent[(a, 0)]) - expired)
        wait_for(lambda: first_remote(side, a0) == first_kept, 60, "remote retention to expire a-0's old segments")

        # leadership of a-0 moves from node 1 to node 2; node 2's sidecar tiers what comes next
        reassign(kafka, {(a, 0): [2, 1, 3]}, tmp_path)
        wait_for(lambda: states.elect(a, [0]) and states.leader(a, 0) == 2, 60, "node 2 to lead a-0")
        sent[(a, 0)] |= produce_segments(kafka, a, 2, 100, segment_ms=SEGMENT_MS, roll=False, partition=0)
        _roll(kafka, a, 0, sent[(a, 0)])
        wait_for(lambda: latest_remote(side[2], a0) >= max(sent[(a, 0)]) - 1, 90, "node 2 to tier a-0")
    finally:
        for s in side.values():
            s.stop(timeout_s=30)
    # the roll record of each partition is in its active segment: never tiered
    tiered_sent = {tp: {o: kv for o, kv in s.items() if o != max(s) and not (tp == (a, 0) and o in expired)}
                   for tp, s in sent.items()}
    before = {topic: _ls(topic, config) for topic in (a, b)}
    assert all(r["state"] == "COPY_SEGMENT_FINISHED" for rows in before.values() for r in rows), before
    assert min(r["start_offset"] for r in before[a] if r["partition"] == 0) == first_kept
    assert {r["broker_id"] for r in before[a] if r["partition"] == 0} >= {1, 2}, "a-0 tiered by both leaders"
    n_segments = sum(len(rows) for rows in before.values())
    root = settings[1].store.root_path
    keys_before = store_keys(root)

    # -- the loss: the metadata topic deleted, every sidecar's state dir wiped --------------------------------
    admin.delete_topics([md["topic"]])[md["topic"]].result(30)
    wait_for(lambda: md["topic"] not in admin.list_topics(timeout=10).topics, 60, "the metadata topic to go")
    for s in settings.values():
        shutil.rmtree(s.metadata.state_dir, ignore_errors=True)

    out = ok(rlm("recover", config=config, timeout=180))
    assert f"wrote {n_segments} segments" in out and "0 conflicts" in out and "0 orphans" in out, out
    assert store_keys(root) == keys_before  # recover writes nothing to the store, deletes nothing
    again = ok(rlm("recover", config=config, timeout=180))
    assert "wrote 0 segments" in again and f"{n_segments} already in the metadata" in again, again

    # the recovered chains are the original ones; the expired segments stay gone
    for topic in (a, b):
        assert _ls(topic, config) == before[topic]
    a0_bases = {int(k.rsplit("/", 1)[1][:20]) for k in keys_before if f"{a}-{ids[a]}/0/" in k}
    assert a0_bases and min(a0_bases) == first_kept, "remote retention's deletes are done: nothing expired is stored"

    # rlm cat, its own process: every tiered record byte-exact, nothing of the expired range
    for topic, p in tps:
        assert _cat(topic, p, config) == tiered_sent[(topic, p)], f"rlm cat {topic}-{p}"

    # Spark's kafka-remote source, from the recovered metadata topic
    rows = (spark.read.format("kafka-remote")
            .options(**{"kafka.bootstrap.servers": kafka.bootstrap_servers, "metadata.topic": md["topic"],
                        "store": "fs", "store.root_path": str(root), "subscribe": f"{a},{b}"})
            .load().select("topic", "partition", "offset", "key", "value").collect())
    got: dict[tuple[str, int], Sent] = {tp: {} for tp in tps}
    for r in rows:
        assert r["offset"] not in got[(r["topic"], r["partition"])], f"offset served twice: {r}"
        got[(r["topic"], r["partition"])][r["offset"]] = (bytes(r["key"]), bytes(r["value"]))
    assert got == tiered_sent, "Spark"

    # the history endpoint (a fresh state dir: its own metadata cache), a consumer assigned to every partition
    hs = SidecarSettings(**{**settings[1].model_dump(mode="json", exclude_none=True),
                            "metadata": {**settings[1].model_dump(mode="json")["metadata"],
                                         "state_dir": str(tmp_path / "state-history")},
                            "history_listener": {"host": "127.0.0.1", "port": 0, "fetch_poll_ms": 100,
                                                 "authorization": {"allow_if_no_authorizer": True}}})
    rsm = RemoteStorageManager(hs.store)
    history = start_listener(hs, rsm)
    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{history.port}", "group.id": f"unused-{tag}",
                         "enable.auto.commit": False, "check.crcs": True, "fetch.wait.max.ms": 100,
                         "api.version.request.timeout.ms": 5000})
    try:
        tier = history.server.router.ctx.tier
        for topic, p in tps:
            tp = TopicIdPartition(ids[topic], topic, p)

            def served(tp: TopicIdPartition = tp, end: int = max(tiered_sent[(topic, p)]) + 1) -> bool:
                tier.refresh([tp])
                t = tier.partition(tp)
                return t is not None and t.high_watermark == end
            wait_for(served, 60, f"the endpoint to serve {tp}")
        consumer.assign([TopicPartition(topic, p, min(tiered_sent[(topic, p)])) for topic, p in tps])
        got = {tp: {} for tp in tps}
        deadline = time.monotonic() + 60
        while any(len(got[tp]) < len(tiered_sent[tp]) for tp in tps):
            assert time.monotonic() < deadline, {tp: len(v) for tp, v in got.items()}
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got[(msg.topic(), msg.partition())][msg.offset()] = (msg.key(), msg.value())
        assert got == tiered_sent, "history endpoint"
    finally:
        consumer.close()
        history.stop()
        rsm.close()
    print(f"the scenario took {time.monotonic() - t0:.0f} s")  # about 60 s on an idle 2-core machine
