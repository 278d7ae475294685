"""Issue 9: real cluster events against the real 3-broker cluster, one sidecar per broker (own state dir and staging,
the same filesystem store and metadata topic), checked by the invariant checker (tests/rlm/invariants.py):

- leadership moved between replicas whose segments are rolled at different offsets (time-based rolls with
  jitter: each replica draws its own jitter per segment), under continuous produce;
- an unclean leader election: the out-of-sync follower elected, new data at the diverged offsets, the old leader
  truncated;
- a topic deleted and re-created under the same name with different data.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from confluent_kafka.admin import NewTopic

from devtools.devkafka import KafkaCluster
from rlm.config import SidecarSettings, TaskSettings
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.rlm.invariants import InvariantChecker, boundaries_differ, local_bases, staged_files, store_keys_of_topic_id
from tests.support.sidecar import (
    AckedProducer,
    PartitionStates,
    copy_state,
    discovery_state,
    make_settings,
    only,
    print_thread_stacks,
    reassign,
    wait_for,
)

pytestmark = pytest.mark.slow


# --------------------------------------------------------------------------------------------------- helpers
@contextmanager
def sidecars(kafka: KafkaCluster, tmp_path: Path, topic: str, nodes: tuple[int, ...] = (1, 2, 3),
             **overrides: object) -> Iterator[dict[int, Sidecar]]:
    """One in-process sidecar per node: the same store and metadata topic (RF 3), own state and staging dirs."""
    tag = uuid.uuid4().hex[:8]
    shared = {"topic": f"__rlm_md_{tag}", "to_be_deleted_topic": f"__rlm_tbd_{tag}", "replication_factor": 3}
    md = {**shared, **overrides.pop("metadata", {})}  # type: ignore[dict-item]
    running: dict[int, Sidecar] = {}
    try:
        for n in nodes:
            running[n] = Sidecar(make_settings(kafka, tmp_path, node_id=n, topics=only(topic), metadata=md,
                                               **overrides)).start()
        yield running
    finally:
        for s in running.values():
            s.stop(timeout_s=30)


def staging_roots(tmp_path: Path, nodes: tuple[int, ...] = (1, 2, 3)) -> list[Path]:
    return [tmp_path / f"staging-{n}" for n in nodes]


def settings_of(side: dict[int, Sidecar]) -> SidecarSettings:
    return next(iter(side.values())).settings


def create(states: PartitionStates, topic: str, assignment: list[int], config: dict[str, str]) -> uuid.UUID:
    states.admin.create_topics([NewTopic(topic, 1, replica_assignment=[assignment], config=config)])[topic].result(30)
    wait_for(lambda: states.leader(topic) == assignment[0], 60, f"node {assignment[0]} to lead {topic}-0")
    tid = wait_for(lambda: states.topic_id(topic), 30, "the topic id")
    return tid


def rounds(prod: AckedProducer, n: int, per_round: int, pause_s: float) -> None:
    """``n`` rounds of ``per_round`` records, each flushed and followed by a pause (a time-based roll each)."""
    for _ in range(n):
        prod.send(per_round)
        assert prod.producer.flush(60) == 0, "producer did not flush"
        time.sleep(pause_s)


def straddles(bases: list[int], highest: int) -> bool:
    """Whether a local segment (of these base offsets, the last one active) holds both ``highest`` and
    ``highest + 1``: the new leader's first segment to copy starts below the tier's end."""
    return highest >= 0 and bases[0] <= highest and (highest + 1) not in bases


# ------------------------------------------------------------------------------------------------------ A
def test_leadership_moves_between_replicas_rolled_at_different_offsets(
        kafka_cluster3: KafkaCluster, topic_name: str, tmp_path: Path) -> None:
    kafka = kafka_cluster3
    states = PartitionStates(kafka)
    # Time-based rolls with jitter close to segment.ms: each replica rolls at its own offsets.
    # Kafka's default delete delay (the test brokers' is 1 s): rolled segments are copied in place, unstaged
    # (rlm.tasks.in_place), through the moves
    tid = create(states, topic_name, [2, 3, 1], {"segment.ms": "1000", "segment.jitter.ms": "900",
                                                 "min.insync.replicas": "2", "file.delete.delay.ms": "60000"})
    tp = TopicIdPartition(tid, topic_name, 0)
    pdirs = {n: kafka.log_dir(n) / f"{topic_name}-0" for n in (1, 2, 3)}
    prod = AckedProducer(kafka, topic_name, [0], tag=f"A{uuid.uuid4().hex[:4]}", batch=20, pause_s=0.05)
    moves: list[str] = []
    stalled: str | None = None
    with sidecars(kafka, tmp_path, topic_name) as side, \
            InvariantChecker.open(settings_of(side), tmp_path / "checker") as checker:
        checker.follow([tp])
        prod.start()
        try:
            leader = 2
            wait_for(lambda: checker.latest(tp) >= 1000, 60, "node 2's sidecar to tier the first 1000 offsets")
            for new, order in ((3, [3, 2, 1]), (1, [1, 3, 2]), (2, [2, 3, 1])):
                # Move when the new leader's local segment straddles the tier's end, if that comes within 8 s, and
                # once the two replicas' rolls differ below the tier's end (the jitter is random per segment: a
                # few segments in, they can still match; within 30 s they differ).
                start = time.monotonic()
                while True:
                    highest = checker.latest(tp)
                    bases = {n: local_bases(pdirs[n]) for n in (leader, new)}
                    differ = boundaries_differ(bases, bases[new][0], highest)
                    waited = time.monotonic() - start
                    if (differ and (straddles(bases[new], highest) or waited > 8)) or waited > 30:
                        break
                    time.sleep(0.2)
                assert differ, (f"{topic_name}-0: replicas {leader} and {new} rolled at the same offsets up to "
                                f"{highest}: the test needs unaligned rolls ({bases})")
                moves.append(f"{leader}->{new} at remote end {highest} (straddles on {new}: "
                             f"{straddles(bases[new], highest)}, {len(differ)} unaligned boundaries)")
                reassign(kafka, {(topic_name, 0): order}, tmp_path)
                wait_for(lambda n=new: states.elect(topic_name, [0]) and states.leader(topic_name) == n, 60,
                         f"node {new} to lead after the preferred election")
                leader = new
                # Tiering keeps progressing under the new leader: 1000 offsets past the end at the move.
                acked_at_move = prod.last_acked(0)
                target = max(highest, acked_at_move - 200) + 1000
                try:
                    wait_for(lambda t=target: checker.latest(tp) >= t, 30,
                             f"tiering to reach {target} under node {new}")
                except AssertionError:
                    # what stalled: the produce (no new offsets to tier), the copy job (asleep with rolled segments
                    # waiting, or not copying), or the checker's view
                    stalled = (f"after the move {moves[-1]}: the latest remote offset stayed at {checker.latest(tp)}"
                               f" (expected >= {target}); acked {acked_at_move} at the move, "
                               f"{prod.last_acked(0)} now ({prod.failed} failed); node {new}'s staging: "
                               f"{len(staged_files(tmp_path / f'staging-{new}', tp))} files; "
                               f"{copy_state(side[new], tp)}")
                    print_thread_stacks()  # where the sidecars wait (a stall without an error: session 15's CI)
                    break
        finally:
            prod.stop()
        print("moves:", *moves, sep="\n  ")
        print("discovery:", *(f"node {n}: {discovery_state(sc)}" for n, sc in side.items()), sep="\n  ")
        # Roll the last segment (a record after segment.ms) and let tiering catch up.
        last = prod.last_acked(0)
        time.sleep(1.2)
        prod.send(1)
        prod.producer.flush(30)
        if stalled is None:
            try:
                wait_for(lambda: checker.latest(tp) >= last, 60, f"tiering to reach {last}")
            except AssertionError:
                stalled = f"at the end the latest remote offset is {checker.latest(tp)}, expected >= {last}"
        acked = {o: kv for o, kv in prod.acked[0].items() if o <= last}
        report = checker.check(tp, acked, produced=prod.produced, first_offset=0,
                               tiered_through=None if stalled else last, staging_roots=staging_roots(tmp_path),
                               gc=True, wait_s=15)
        print(report)
        assert stalled is None and report.ok, f"moves: {moves}\nstalled: {stalled}\n{report}"


# ------------------------------------------------------------------------------------------------------ B
def test_unclean_leader_election_serves_the_new_lineage(kafka_cluster3: KafkaCluster, topic_name: str,
                                                        tmp_path: Path) -> None:
    kafka = kafka_cluster3
    states = PartitionStates(kafka)
    # Kafka's default delete delay: segments are copied in place, and the truncated generation's files linger as
    # .deleted beside the new lineage's for a minute (rlm.tasks.in_place stages such a segment instead)
    tid = create(states, topic_name, [2, 3], {"segment.ms": "400", "unclean.leader.election.enable": "true",
                                              "min.insync.replicas": "1", "file.delete.delay.ms": "60000"})
    tp = TopicIdPartition(tid, topic_name, 0)
    run = uuid.uuid4().hex[:4]
    lineage_a = AckedProducer(kafka, topic_name, [0], tag=f"A{run}", acks="all")
    lineage_b = AckedProducer(kafka, topic_name, [0], tag=f"B{run}", acks="1")
    lineage_c = AckedProducer(kafka, topic_name, [0], tag=f"C{run}", acks="1")
    stopped: set[int] = set()
    try:
        with sidecars(kafka, tmp_path, topic_name, nodes=(2, 3)) as side, \
                InvariantChecker.open(settings_of(side), tmp_path / "checker") as checker:
            checker.follow([tp])
            rounds(lineage_a, 3, 100, 0.45)
            end_a = lineage_a.last_acked(0)
            # The follower goes away; the leader takes more (acks=1): these offsets will diverge.
            kafka.stop_node(3)
            stopped.add(3)
            wait_for(lambda: states.isr(topic_name) == [2], 60, "node 3 to leave the ISR")
            rounds(lineage_b, 4, 100, 0.45)
            lineage_b.send(1)  # rolls the segment holding the last round
            lineage_b.producer.flush(30)
            end_b = lineage_b.last_acked(0) - 1
            wait_for(lambda: checker.latest(tp) >= end_b, 60, f"node 2's sidecar to tier the diverging offsets "
                                                              f"{end_a + 1}..{end_b}")
            diverged = {o: v for o, vs in checker.values_at(tp).items() for v in vs if o > end_a}
            assert diverged and all(v.split(b"|")[1] == lineage_b.tag.encode() for v in diverged.values()), \
                "the diverging (B) offsets are not remote as produced: the test's premise does not hold"
            # The leader goes away; the out-of-sync follower comes back and is elected, uncleanly.
            kafka.stop_node(2)
            stopped.add(2)
            kafka.start_node(3)
            stopped.discard(3)

            def elected() -> bool:
                if kafka.node(3).process.poll() is not None:
                    raise AssertionError(f"node 3 exited:\n{kafka.tail_logs(40)}")
                if states.leader(topic_name) == 3:
                    return True
                print("unclean election:", states.elect(topic_name, [0], unclean=True))
                return states.leader(topic_name) == 3

            wait_for(elected, 90, "node 3 to be elected (unclean)", interval_s=1.0)
            # New data with different values at the diverged offsets (and beyond them).
            rounds(lineage_c, 6, 100, 0.45)
            start_c = min(lineage_c.acked[0])
            assert start_c == end_a + 1, f"the new lineage starts at {start_c}, expected {end_a + 1}"
            # The old leader comes back and truncates its diverged log.
            kafka.start_node(2)
            stopped.discard(2)
            wait_for(lambda: 2 in states.isr(topic_name), 90, "node 2 to truncate and rejoin the ISR", 1.0)
            time.sleep(0.5)
            lineage_c.send(1)
            lineage_c.producer.flush(30)
            end_c = lineage_c.last_acked(0) - 1
            acked = {**lineage_a.acked[0], **{o: kv for o, kv in lineage_c.acked[0].items() if o <= end_c}}
            stalled = None
            try:
                wait_for(lambda: checker.latest(tp) >= end_c, 60, f"node 3's sidecar to tier up to {end_c}")
            except AssertionError as err:
                stalled = str(err)
            report = checker.check(tp, acked, first_offset=0, tiered_through=end_c,
                                   staging_roots=staging_roots(tmp_path, (2, 3)), gc=True, wait_s=30)
            print(f"lineage A 0..{end_a}, diverged B {end_a + 1}..{end_b} (tiered by node 2), "
                  f"new lineage C {start_c}..{end_c}\n{report}")
            assert stalled is None and report.ok, (
                f"after the unclean election (B offsets {end_a + 1}..{end_b} diverged, C values acknowledged there):"
                f" stalled: {stalled}\n{report}")
    finally:
        for n in sorted(stopped):
            kafka.start_node(n)
        kafka.wait_ready()


# ------------------------------------------------------------------------------------------------------ C
def test_topic_recreated_under_the_same_name(kafka_cluster3: KafkaCluster, topic_name: str,
                                             tmp_path: Path) -> None:
    kafka = kafka_cluster3
    states = PartitionStates(kafka)
    config = {"segment.ms": "300"}
    old_id = create(states, topic_name, [2, 3, 1], config)
    old_tp = TopicIdPartition(old_id, topic_name, 0)
    old = AckedProducer(kafka, topic_name, [0], tag="OLD", acks="all")
    new = AckedProducer(kafka, topic_name, [0], tag="NEW", acks="all")
    # Copies throttled (~1 segment a second), so some of the old topic's segments are staged, not yet copied,
    # when it is deleted.
    store = {"store": "fs", "root_path": str(tmp_path / "remote"), "block_size_bytes": 64 * 1024,
             "copy_rate_bytes_per_second": 15_000}
    root = tmp_path / "remote"
    # The purge waits for proof of deletion over a grace period (tasks.purge_grace_ms, 60 s by default): short here.
    tasks = {"purge_grace_ms": 3000} if "purge_grace_ms" in TaskSettings.model_fields else {}
    with sidecars(kafka, tmp_path, topic_name, store=store, tasks=tasks) as side, \
            InvariantChecker.open(settings_of(side), tmp_path / "checker") as checker:
        checker.follow([old_tp])
        rounds(old, 10, 100, 0.35)  # bases 0, 100, 200 ... (one roll per round)
        wait_for(lambda: checker.latest(old_tp) >= 199, 60, "the first old segments to be remote")
        staged_old = [p for n in (1, 2, 3) for p in staged_files(tmp_path / f"staging-{n}", old_tp)]
        old_remote = checker.latest(old_tp)
        states.admin.delete_topics([topic_name])[topic_name].result(30)

        def recreated() -> uuid.UUID | None:
            try:
                return create(states, topic_name, [2, 3, 1], config)
            except Exception as err:  # noqa: BLE001 - still being deleted
                print("re-create:", err)
                return None

        new_id = wait_for(recreated, 90, "the topic to be re-created", interval_s=1.0)
        assert new_id != old_id
        tp = TopicIdPartition(new_id, topic_name, 0)
        checker.follow([tp])
        rounds(new, 10, 100, 0.35)  # the same bases as the old topic's segments
        time.sleep(0.2)
        new.send(1)
        new.producer.flush(30)
        last = new.last_acked(0) - 1
        stalled = None
        try:
            wait_for(lambda: checker.latest(tp) >= last, 60, f"the re-created topic to be tiered up to {last}")
        except AssertionError as err:
            stalled = str(err)
        report = checker.check(tp, {o: kv for o, kv in new.acked[0].items() if o <= last}, first_offset=0,
                               tiered_through=last, staging_roots=staging_roots(tmp_path), gc=True, wait_s=10)
        print(f"old topic {old_id}: remote up to {old_remote} at the delete, {len(staged_old)} files staged then; "
              f"new topic {new_id}\n{report}")

        # The old topic id's remote data is purged: no object, no live segment, nothing staged.
        def purged() -> list[str]:
            left = [f"object {k}" for k in store_keys_of_topic_id(root, old_id)[:5]]
            try:
                left += [f"segment [{m.start_offset},{m.end_offset_inclusive}] {m.state.name}"
                         for m in checker.all_segments(old_tp)]
            except Exception as err:  # noqa: BLE001
                left.append(f"metadata: {err}")
            left += [f"staged {p}" for n in (1, 2, 3) for p in staged_files(tmp_path / f"staging-{n}", old_tp)]
            return left

        try:
            wait_for(lambda: not purged(), 45, "the old topic id's remote data to be purged")
            left = []
        except AssertionError:
            left = purged()
        assert stalled is None and report.ok and not left, (
            f"re-created {topic_name} (old id {old_id}, new id {new_id}): stalled: {stalled}\n{report}\n"
            f"old topic id not purged: {left[:12]}")
