"""Streaming offload (PIP-76, issue 12) against the real broker: topics whose ``segment.ms`` is an hour, so the broker
never rolls while the test runs, tiered within seconds from the active segment."""

from __future__ import annotations

import random
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import NewTopic

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlmm.api import RemoteLogSegmentState, TopicIdPartition
from tests.support.kafka import partition_dir, produce, set_topic_config
from tests.support.processes import b64, json_lines, ok, rlm, serve
from tests.support.sidecar import (
    AckedProducer,
    PartitionStates,
    RecordingRsm,
    assert_contiguous,
    assert_readable,
    latest_remote,
    make_settings,
    only,
    reassign,
    remote_segments,
    settings_yaml,
    store_keys,
    wait_for,
)
from tests.support.txn import TxnProducer

HOUR_MS = "3600000"
NO_ROLL = {"segment.ms": HOUR_MS, "segment.bytes": str(1 << 30)}  # the dev broker's default segment.bytes is 1 MiB
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


class RangeRecordingRsm(RecordingRsm):
    """Also remembers the offset ranges of the offload segments it copies."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.ranges: list[tuple[int, int]] = []

    def copy_log_range(self, segment_metadata, range_data, **kw):  # type: ignore[no-untyped-def]
        self.ranges.append((segment_metadata.start_offset, segment_metadata.end_offset_inclusive))
        return super().copy_log_range(segment_metadata, range_data, **kw)


def streaming(topic: str, **rule: Any) -> list[dict[str, Any]]:
    return [{"pattern": topic, "mode": "streaming", "offload_max_ms": 1500, "poll_interval_ms": 200,
             "offload_max_bytes": 256 * 1024, **rule}]


def local_logs(kafka: KafkaCluster, topic: str, node_id: int = 1) -> list[str]:
    return sorted(p.name for p in partition_dir(kafka, topic, 0, node_id).glob("*.log"))


def send(kafka: KafkaCluster, topic: str, tag: str, n: int, **conf: Any) -> dict[int, tuple[bytes, bytes]]:
    recs = [(f"{tag}-{i}".encode(), (f"{tag}-{i}-".encode() * 30)[: 40 + i % 200]) for i in range(n)]
    return {off: kv for (_p, off), kv in zip(produce(kafka, topic, recs, **conf), recs, strict=True)}


@pytest.mark.slow
def test_every_codec_remote_within_seconds_while_the_broker_never_rolls(kafka: KafkaCluster, topic_name: str,
                                                                        tmp_path: Path) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config=NO_ROLL)
    tp = TopicIdPartition(topic_id, topic_name, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name), offload=streaming(topic_name))
    rsm = RangeRecordingRsm(settings.store)
    sidecar = Sidecar(settings, rsm=rsm).start()
    sent: dict[int, tuple[bytes, bytes]] = {}
    try:
        for codec in CODECS:
            batch = send(kafka, topic_name, codec, 400, **{"compression.type": codec, "linger.ms": 5})
            sent |= batch
            started = time.monotonic()
            wait_for(lambda b=batch: latest_remote(sidecar, tp) >= max(b), 30, f"{codec} records to be remote")
            print(f"{codec}: remote {time.monotonic() - started:.2f} s after the produce returned")
        # The broker has not rolled: everything was offloaded from its active segment.
        assert local_logs(kafka, topic_name) == ["00000000000000000000.log"]
        segs = remote_segments(sidecar, tp)
        assert_contiguous(segs)
        assert all(s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED for s in segs)
        assert all(s.segment_size_bytes <= 256 * 1024 for s in segs)
        assert_readable(sidecar, tp, sent)
        assert rsm.copies == []  # no whole-segment copy
        # Two objects (two PUTs) per offload segment: its data object and its index object.
        assert len(store_keys(tmp_path / "remote")) == 2 * len(segs)

        # The broker now rolls the segment that was offloaded already: nothing of it is copied again.
        set_topic_config(kafka, topic_name, segment_ms="100")
        time.sleep(0.3)
        sent |= send(kafka, topic_name, "after-roll", 5)
        set_topic_config(kafka, topic_name, segment_ms=HOUR_MS)
        wait_for(lambda: len(local_logs(kafka, topic_name)) == 2, 30, "the broker to roll")
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 30, "the records after the roll to be remote")
        time.sleep(1.0)  # a few more polls: nothing else may be copied
        segs = remote_segments(sidecar, tp)
        assert_contiguous(segs)
        assert rsm.ranges == [(s.start_offset, s.end_offset_inclusive) for s in segs]
        assert rsm.copies == []
        assert_readable(sidecar, tp, sent)
    finally:
        sidecar.stop()
    # The operator's commands read offload segments like any others.
    config = tmp_path / "sidecar.yaml"
    config.write_text(settings_yaml(settings))
    out = ok(rlm("verify", topic_name, config=config))
    assert out.strip().splitlines()[-1] == f"verified {len(segs)} segments: {len(segs)} ok, 0 bad", out
    got = json_lines(ok(rlm("cat", topic_name, "0", "--from-offset", "0", config=config)))
    assert {r["offset"]: (r["key"], r["value"]) for r in got} == {o: (b64(k), b64(v)) for o, (k, v) in sent.items()}


def test_transactions_across_offload_segment_boundaries(kafka: KafkaCluster, topic_name: str,
                                                        tmp_path: Path) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config=NO_ROLL)
    tp = TopicIdPartition(topic_id, topic_name, 0)
    # Offload segments of about 2 KiB: every transaction below spans several of them.
    settings = make_settings(kafka, tmp_path, topics=only(topic_name),
                             offload=streaming(topic_name, offload_max_bytes=2048, offload_max_ms=500))
    sidecar = Sidecar(settings).start()
    tx = TxnProducer(kafka, topic_name)
    committed: dict[int, tuple[bytes, bytes]] = {}
    aborted: dict[int, tuple[bytes, bytes]] = {}
    try:
        for r in range(3):
            for commit, into in ((True, committed), (False, aborted)):
                tx.p.begin_transaction()
                first = None
                for part in range(4):  # four flushes: four batches of the transaction
                    got = tx.send(f"{'c' if commit else 'a'}{r}-{part}", 20)
                    into |= got
                    first = min(got) if first is None else first
                    time.sleep(0.3)  # offload polls meanwhile: nothing of the open transaction may go remote
                    assert latest_remote(sidecar, tp) < first
                (tx.p.commit_transaction if commit else tx.p.abort_transaction)(30)
        committed |= send(kafka, topic_name, "plain", 10)
        wait_for(lambda: latest_remote(sidecar, tp) >= max(committed), 60, "everything to be remote")
        assert local_logs(kafka, topic_name) == ["00000000000000000000.log"]
        segs = remote_segments(sidecar, tp)
        assert_contiguous(segs)
        # Offload segments start inside aborted and inside committed transactions.
        starts = {s.start_offset for s in segs}
        assert starts & {o for o in aborted if o - 1 in aborted}, "no boundary inside an aborted transaction"
        assert starts & {o for o in committed if o - 1 in committed}, "no boundary inside a committed transaction"
        got = {r.offset: (r.key, r.value) for r in sidecar.reader.read(tp, 0, isolation="read_committed")
               if r.key is not None}
        assert got == committed
        every = {r.offset: (r.key, r.value) for r in sidecar.reader.read(tp, 0) if r.key is not None}
        assert every == committed | aborted
    finally:
        sidecar.stop()


def test_switching_modes_both_ways_leaves_no_gap_or_overlap(kafka: KafkaCluster, topic_name: str,
                                                            tmp_path: Path) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    base = make_settings(kafka, tmp_path, topics=only(topic_name))
    segment_mode = base
    streaming_mode = base.model_copy(update={"offload": [base.offload_for(topic_name).model_copy(
        update={"mode": "streaming", "offload_max_ms": 1000, "poll_interval_ms": 200})]})
    sent: dict[int, tuple[bytes, bytes]] = {}

    def run(settings: Any, what: str, until: int) -> RangeRecordingRsm:
        rsm = RangeRecordingRsm(settings.store)
        with Sidecar(settings, rsm=rsm) as sidecar:
            wait_for(lambda: latest_remote(sidecar, tp) >= until, 60, what)
            assert_contiguous(remote_segments(sidecar, tp))
            assert_readable(sidecar, tp, {o: kv for o, kv in sent.items() if o <= until}, what=what)
        return rsm

    # 1. Segment mode: rolled segments.
    for r in range(3):
        sent |= send(kafka, topic_name, f"seg{r}", 100)
        time.sleep(0.4)
    rolled_end = max(sent)
    sent |= send(kafka, topic_name, "roll", 1)  # rolls the segment holding the third round
    set_topic_config(kafka, topic_name, segment_ms=HOUR_MS)
    first = run(segment_mode, "segment mode to copy the rolled segments", rolled_end)
    assert first.copies and not first.ranges
    # 2. Streaming: the rest of the active segment, from the highest remote offset on.
    sent |= send(kafka, topic_name, "stream", 200)
    second = run(streaming_mode, "streaming to offload the active segment", max(sent))
    assert second.ranges and not second.copies
    assert second.ranges[0][0] == first.copies[-1][1] + 1
    streamed_end = max(sent)
    # 3. Back to segment mode: the broker rolls a segment that straddles the highest remote offset; only what
    # follows it is copied.
    sent |= send(kafka, topic_name, "back", 100)
    set_topic_config(kafka, topic_name, segment_ms="100")
    time.sleep(0.3)
    sent |= send(kafka, topic_name, "roll2", 1)
    set_topic_config(kafka, topic_name, segment_ms=HOUR_MS)
    third = run(segment_mode, "segment mode to copy the rolled straddling segment", max(sent) - 1)
    assert third.copies[0][0] == streamed_end + 1 and not third.ranges


@pytest.mark.slow
def test_sigkill_during_offload_leaves_no_gap_and_no_double_range(kafka: KafkaCluster, topic_name: str,
                                                                   tmp_path: Path) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config=NO_ROLL)
    tp = TopicIdPartition(topic_id, topic_name, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name), log_format="json",
                             offload=streaming(topic_name, offload_max_ms=300, poll_interval_ms=100,
                                               offload_max_bytes=8 * 1024),
                             store={"block_size_bytes": 4096})
    config = tmp_path / "sidecar.yaml"
    config.write_text(settings_yaml(settings))
    sent: dict[int, tuple[bytes, bytes]] = {}
    stop = threading.Event()

    def producer() -> None:  # small batches all along, so the kills land inside offloads
        n = 0
        while not stop.is_set():
            sent.update(send(kafka, topic_name, f"k{n}-{uuid.uuid4().hex[:4]}", 60,
                             **{"batch.size": 2048, "linger.ms": 0}))
            n += 1
            time.sleep(0.05)

    thread = threading.Thread(target=producer, daemon=True)
    thread.start()
    rng = random.Random(12)
    rounds = 8
    try:
        log_path = tmp_path / "serve.log"
        for i in range(rounds):
            proc = serve(config, log_path)
            try:
                # started (1.5-3 s here; more on a loaded machine: once none of the 8 had logged a line within their
                # 3-6 s), then killed at a random moment of its work
                wait_for(lambda i=i: log_path.read_text().count('"sidecar started"') > i, 60,
                         f"serve process {i} to start", interval_s=0.1)
                time.sleep(rng.uniform(1.0, 4.0))
            finally:
                proc.send_signal(signal.SIGKILL)
                proc.wait(30)
    finally:
        stop.set()
        thread.join(30)
    with Sidecar(settings) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 60, "everything remote after the kills")
        segs = sidecar.rlmm.list_remote_log_segments(tp)
        wait_for(lambda: all(s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED
                             for s in sidecar.rlmm.list_remote_log_segments(tp)), 30,
                 "unfinished copies of killed runs to be cleaned up")
        segs = remote_segments(sidecar, tp)
        assert_contiguous(segs)
        assert_readable(sidecar, tp, sent)
        assert local_logs(kafka, topic_name) == ["00000000000000000000.log"]
        assert len(segs) > rounds  # several offload segments per round, some cut by the kills
    log_text = (tmp_path / "serve.log").read_text()
    assert log_text.count('"segment copied"') >= rounds // 2, log_text[-3000:]  # the killed processes offloaded


@pytest.mark.slow
def test_leadership_moves_mid_offload_on_three_brokers(kafka_cluster3: KafkaCluster, topic_name: str,
                                                       tmp_path: Path) -> None:
    """A producer writes all along (acks=all) while leadership moves 2 -> 3 -> 2 by preferred elections: each new
    leader's sidecar continues from the last FINISHED offload segment of its lineage; a copy the old leader had in
    flight is fenced or finished, never doubled."""
    kafka = kafka_cluster3
    states = PartitionStates(kafka)
    # Node 1 is also the controller: leadership moves between nodes 2 and 3.
    states.admin.create_topics([NewTopic(topic_name, 1, replica_assignment=[[2, 3, 1]], config=NO_ROLL)]
                               )[topic_name].result(30)
    wait_for(lambda: states.leader(topic_name) == 2, 30, "node 2 to lead")
    # (a describe that fails transiently answers None: wait for the id, as the other cluster tests do)
    tp = TopicIdPartition(wait_for(lambda: states.topic_id(topic_name), 30, "the topic id"), topic_name, 0)
    tag = uuid.uuid4().hex[:8]
    shared = {"topic": f"__rlm_md_{tag}", "to_be_deleted_topic": f"__rlm_tbd_{tag}", "replication_factor": 3}
    rule = streaming(topic_name, offload_max_ms=700, poll_interval_ms=150, offload_max_bytes=16 * 1024)
    sidecars = {n: Sidecar(make_settings(kafka, tmp_path, node_id=n, topics=only(topic_name), metadata=shared,
                                         offload=rule)) for n in (1, 2, 3)}
    for s in sidecars.values():
        s.start()
    producer = AckedProducer(kafka, topic_name, [0], tag=tag, batch=10, pause_s=0.02).start()
    try:
        for leader, order in ((3, [3, 2, 1]), (2, [2, 3, 1])):
            old = 5 - leader
            wait_for(lambda o=old: producer.last_acked(0) >= 0 and latest_remote(sidecars[o], tp) >= 0, 60,
                     "the current leader's sidecar to offload")
            time.sleep(1.5)  # mid-offload: the producer writes, offload segments close every 0.7 s
            reassign(kafka, {(topic_name, 0): order}, tmp_path / "reassign")

            def leads(ld: int = leader) -> bool:
                if states.leader(topic_name) == ld:
                    return True
                states.elect(topic_name, [0])  # preferred election (the first replica of the new order)
                return states.leader(topic_name) == ld

            wait_for(leads, 90, f"node {leader} to lead", interval_s=1.0)
            mark = producer.last_acked(0)
            wait_for(lambda m=mark, ld=leader: latest_remote(sidecars[ld], tp) >= m, 60,
                     f"node {leader}'s sidecar to offload after the move")
    finally:
        producer.stop()
    try:
        acked = producer.acked[0]
        assert len(acked) > 200 and producer.failed == 0
        for n, sidecar in sidecars.items():
            wait_for(lambda s=sidecar: latest_remote(s, tp) >= max(acked), 60, f"sidecar {n} to see everything")
            segs = remote_segments(sidecar, tp)
            assert_contiguous(segs)
            assert_readable(sidecar, tp, acked, what=f"sidecar {n}")
        segs = remote_segments(sidecars[1], tp)
        assert {2, 3} <= {s.broker_id for s in segs}  # both leaders offloaded
        epochs = [e for s in segs for e, _start in s.segment_leader_epochs]
        assert epochs == sorted(epochs) and len(set(epochs)) >= 3
        for p in partition_dir(kafka, topic_name, 0, 2).parent.glob(f"{topic_name}-0"):
            assert sorted(x.name for x in p.glob("*.log")) == ["00000000000000000000.log"]  # never rolled
    finally:
        for s in sidecars.values():
            s.stop()


def test_retention_deletes_offload_segments_oldest_first_and_gc_keeps_live_ones(kafka: KafkaCluster,
                                                                                 topic_name: str,
                                                                                 tmp_path: Path) -> None:
    """Remote retention by size over offload segments cut from one never-rolled local segment: the oldest go with
    their objects (the local segment's bytes they held), the rest stay readable; GC (no grace) finds no orphan
    and deletes nothing a live segment owns."""
    topic_id = kafka.create_topic(topic_name, 1, config=NO_ROLL)
    tp = TopicIdPartition(topic_id, topic_name, 0)
    limit = 40 * 1024
    settings = make_settings(kafka, tmp_path, topics=only(topic_name),
                             offload=streaming(topic_name, offload_max_bytes=8 * 1024, offload_max_ms=300),
                             retention=[{"pattern": ".*", "retention_ms": -1, "retention_bytes": limit}],
                             tasks={"gc_grace_ms": 0})
    with Sidecar(settings) as sidecar:
        sent: dict[int, tuple[bytes, bytes]] = {}
        for r in range(6):
            sent |= send(kafka, topic_name, f"r{r}", 150, **{"batch.size": 2048, "linger.ms": 0})
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 60, "everything to be offloaded")
        wait_for(lambda: sum(s.segment_size_bytes for s in remote_segments(sidecar, tp)) <= limit, 60,
                 "remote retention to delete the oldest offload segments")
        live = remote_segments(sidecar, tp)
        assert live[0].start_offset > 0 and live[-1].end_offset_inclusive == max(sent)
        assert_contiguous(live, first_offset=None)
        first = live[0].start_offset
        assert_readable(sidecar, tp, {o: kv for o, kv in sent.items() if o >= first}, from_offset=first)
        assert local_logs(kafka, topic_name) == ["00000000000000000000.log"]  # all of it cut from one local segment
        wait_for(lambda: len(store_keys(tmp_path / "remote")) == 2 * len(remote_segments(sidecar, tp)), 30,
                 "the deleted segments' objects to be gone")
        before = store_keys(tmp_path / "remote")
        assert sidecar.collect_garbage() == []
        assert store_keys(tmp_path / "remote") == before
