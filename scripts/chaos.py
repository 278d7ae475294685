"""Cluster chaos for the sidecar (issue 9): 3 brokers, one ``rlm serve`` per broker, continuous produce, random events.

    .venv/bin/python scripts/chaos.py --minutes 10 [--seed 9] [--partitions 2] [--keep]

Under continuous produce (acks=all, idempotent; every acknowledged record remembered) it runs, at random:

- ``elect``: a preferred-leader election of every partition (moves leadership back after restarts and moves);
- ``move``: a reassignment reordering the replicas (Kafka's reassignment tool), then a preferred-leader election:
  leadership moves, usually while the old leader's copy is in flight (copies are throttled by the store's
  ``copy_rate_bytes_per_second``, so one runs most of the time);
- ``restart``: a broker (2 or 3; node 1 is the only controller) stopped, gracefully or with SIGKILL, and started
  again a few seconds later;
- ``kill``: a sidecar SIGKILLed (``rlm serve`` runs as a subprocess) and restarted;
- ``recreate``: a topic of its own (``<topic>-rc``, one partition, under its own light produce, a producer per
  incarnation) deleted and re-created under the same name, in one of two ways: ``inflight`` (a burst, its segment
  rolled, then deleted while that segment's throttled copy runs) or ``idle`` (its producer stopped, the last
  segment rolled, deleted once tiering caught up: nothing staged, nothing being copied). It is counted by what
  was seen at the delete: ``recreate-inflight`` (a copy STARTED, not finished), ``recreate-backlog`` (segments
  staged, none being copied) or ``recreate-idle``. Besides the random draws, it runs twice on a schedule (an
  ``idle`` at a quarter of the run, an ``inflight`` past half of it), so a short run has both, and its last
  incarnation, checked completely, is the one created while the deleted one's copy was in flight.

Segments roll on time with jitter (``segment.ms`` / ``segment.jitter.ms``), so replicas roll at different
offsets. At the end it quiesces (no more events, every broker and sidecar up, producer stopped, the last segments
rolled, tiering caught up) and the invariant checker (``tests/rlm/invariants.py``) asserts per partition: one
contiguous remote chain from offset 0, no offset served twice, every record read equal to what was produced,
nothing acknowledged missing, staging empty, and after one GC pass nothing orphaned. The re-created topic's last
incarnation is checked the same way (from offset 0, with the records acknowledged to it); every earlier
incarnation's topic id must be purged (the sidecars' ``purge_grace_ms`` is short here): no stored object under it,
no segment left in the metadata, nothing staged. The main topic never sees a delete, so its invariants keep their
meaning. It prints the rounds and events survived and the checker's reports; exit status 1 when an invariant is
violated.

``tests/rlm/test_chaos.py`` runs it for ~1.5 minutes of events in the suite.
"""

from __future__ import annotations

import argparse
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from confluent_kafka.admin import NewTopic  # noqa: E402

from devtools.devkafka import KafkaCluster  # noqa: E402
from rlmm.api import RemoteLogSegmentState, TopicIdPartition  # noqa: E402
from tests.rlm.invariants import InvariantChecker, Report, staged_files, store_keys_of_topic_id  # noqa: E402
from tests.support.sidecar import (  # noqa: E402
    AckedProducer,
    PartitionStates,
    make_settings,
    reassign,
    settings_yaml,
    wait_for,
)

SEGMENT_MS = 800
STALL_S = 120  # the catch-up after the events fails when tiering does not move for this long
JITTER_MS = 600
PURGE_GRACE_MS = 3000  # the sidecars' tasks.purge_grace_ms: a deleted incarnation is purged within the run
PURGE_WAIT_S = 90  # after the catch-up, how long the earlier incarnations may take to be purged
RC_CAUGHT_UP_S = 30  # ``recreate`` idle: how long to wait for tiering to catch up before the delete
RC_COPY_START_S = 20  # ``recreate`` inflight: how long to wait for the burst's copy to start
RC_BURST = 1500  # records of 200 bytes: ~300 KB, several seconds of copy under the throttle


@dataclass
class Incarnation:
    """One life of the re-created topic: its topic id, its producer, what was in flight when it was deleted."""

    n: int
    tp: TopicIdPartition
    producer: AckedProducer
    at_delete: str | None = None  # "inflight", "backlog" or "idle" once deleted; None: the live one
    remote_at_delete: tuple[int, int] = (-1, -1)  # (latest remote offset, last acknowledged) at the delete

    def __str__(self) -> str:
        fate = (f"deleted ({self.at_delete}, remote up to {self.remote_at_delete[0]} of {self.remote_at_delete[1]})"
                if self.at_delete else "live")
        return (f"#{self.n} id {str(self.tp.topic_id)[:8]} {fate}, {self.producer.total_acked()} records "
                f"acknowledged")


@dataclass
class PurgeReport:
    """A deleted incarnation's topic id: what of it is left (stored objects, segments in the metadata, staged
    files); empty when it is purged."""

    tp: TopicIdPartition
    left: list[str]

    @property
    def ok(self) -> bool:
        return not self.left

    def __str__(self) -> str:
        head = f"{self.tp.topic}-{self.tp.partition} (deleted id {self.tp.topic_id})"
        if self.ok:
            return head + ": purged (no object, no segment, nothing staged)"
        return head + f": [purged] NOT purged, {len(self.left)} left:\n  " + "\n  ".join(self.left[:12])


@dataclass
class ChaosResult:
    seconds: float
    rounds: int
    events: Counter
    skipped: Counter
    acked: int
    failed_sends: int
    sidecar_crashes: list[str]
    reports: list[Report | PurgeReport] = field(default_factory=list)
    incarnations: list[str] = field(default_factory=list)  # of the re-created topic, in order
    problems: list[str] = field(default_factory=list)  # quiesce failures (tiering did not catch up...)

    @property
    def ok(self) -> bool:
        return not self.problems and not self.sidecar_crashes and all(r.ok for r in self.reports)

    def summary(self) -> str:
        ev = ", ".join(f"{k} {v}" for k, v in sorted(self.events.items())) or "none"
        sk = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items())) or "none"
        lines = [f"chaos: {self.rounds} rounds in {self.seconds:.0f} s; events survived: {ev} "
                 f"(total {sum(self.events.values())}); skipped: {sk}",
                 f"records acknowledged: {self.acked}, sends failed: {self.failed_sends}"]
        if self.incarnations:
            lines.append(f"re-created topic: {len(self.incarnations)} incarnations: " + "; ".join(self.incarnations))
        lines += [f"sidecar exited on its own: {c}" for c in self.sidecar_crashes]
        lines += [f"quiesce: {p}" for p in self.problems]
        lines += [str(r) for r in self.reports]
        lines.append("RESULT: " + ("every invariant holds" if self.ok else "INVARIANTS VIOLATED"))
        return "\n".join(lines)


class SidecarProcess:
    """``rlm serve --config`` of one broker, killable with SIGKILL."""

    def __init__(self, node: int, config: Path, log: Path) -> None:
        self.node = node
        self.config = config
        self.log = log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "rlm.cli", "serve", "--config", str(self.config)],
                                         cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.running():
            self.proc.kill()  # type: ignore[union-attr]
            self.proc.wait(30)  # type: ignore[union-attr]

    def stop(self) -> None:
        if not self.running():
            return
        self.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        try:
            self.proc.wait(40)  # type: ignore[union-attr]
        except subprocess.TimeoutExpired:
            self.kill()


class Chaos:
    def __init__(self, work_dir: Path, *, seconds: float, seed: int = 9, partitions: int = 2,
                 copy_rate: int = 50_000, produce_pause_s: float = 0.05, out=print) -> None:
        self.work = Path(work_dir)
        self.produce_pause_s = produce_pause_s  # between the main producer's batches of 10 records
        self.seconds = seconds
        self.rng = random.Random(seed)
        self.partitions = list(range(partitions))
        self.copy_rate = copy_rate
        self.out = out
        self.topic = f"chaos-{uuid.uuid4().hex[:8]}"
        self.rc_topic = f"{self.topic}-rc"  # deleted and re-created by ``recreate``; the main topic never is
        self.incarnations: list[Incarnation] = []
        # ``recreate`` on a schedule besides the random draws: (seconds into the events, variant). The in-flight one
        # last: the incarnation it creates is the one a short run checks completely (tiered while, or right after,
        # the deleted one's copy was in flight).
        self.schedule = [(0.25 * seconds, "idle"), (0.55 * seconds, "inflight")]
        self.watcher: InvariantChecker | None = None  # the re-created topic's remote state during the events
        self.kafka: KafkaCluster | None = None
        self.tag = uuid.uuid4().hex[:8]
        self.events: Counter = Counter()
        self.skipped: Counter = Counter()
        self.crashes: list[str] = []
        self.t0 = time.monotonic()

    def say(self, msg: str) -> None:
        self.out(f"[{time.monotonic() - self.t0:7.1f}s] {msg}")

    # ------------------------------------------------------------------------------------------------ run
    def run(self) -> ChaosResult:
        self.work.mkdir(parents=True, exist_ok=True)
        kafka = self.kafka = KafkaCluster(brokers=3)
        sidecars: dict[int, SidecarProcess] = {}
        prod: AckedProducer | None = None
        try:
            kafka.start()
            self.say(f"cluster up: {kafka.bootstrap_servers}; topic {self.topic}, partitions {self.partitions}")
            states = PartitionStates(kafka)
            n = len(self.partitions)
            assignment = [[(p + i) % 3 + 1 for i in range(3)] for p in self.partitions]
            # Kafka's default delete delay (the test brokers' is 1 s) on the main topic: its rolled segments are
            # copied in place, unstaged (rlm.tasks.in_place), through every event; the re-created topic keeps the
            # brokers' 1 s, so its segments are staged at once, as before
            states.admin.create_topics([NewTopic(self.topic, n, replica_assignment=assignment, config={
                "segment.ms": str(SEGMENT_MS), "segment.jitter.ms": str(JITTER_MS), "min.insync.replicas": "2",
                "file.delete.delay.ms": "60000",
            })])[self.topic].result(30)
            desc = wait_for(lambda: (d := states.describe(self.topic)) and len(d[1]) == n
                            and all(v[0] >= 0 for v in d[1].values()) and d, 60, "the chaos topic's leaders")
            tps = {p: TopicIdPartition(desc[0], self.topic, p) for p in self.partitions}
            tag = self.tag
            shared = {"topic": f"__rlm_md_{tag}", "to_be_deleted_topic": f"__rlm_tbd_{tag}", "replication_factor": 3}
            settings = {}
            for node in (1, 2, 3):
                settings[node] = make_settings(
                    kafka, self.work, node_id=node, metadata=shared,
                    topics={"include": [re.escape(self.topic), re.escape(self.rc_topic)]},
                    store={"store": "fs", "root_path": str(self.work / "remote"), "block_size_bytes": 64 * 1024,
                           "copy_rate_bytes_per_second": self.copy_rate},
                    tasks={"copy_interval_ms": 300, "discovery_interval_ms": 300, "expiration_interval_ms": 1000,
                           "gc_interval_ms": 5000, "gc_grace_ms": 5000, "purge_grace_ms": PURGE_GRACE_MS},
                    log_format="json")
                cfg = self.work / f"sidecar-{node}.yaml"
                cfg.write_text(settings_yaml(settings[node]))
                sidecars[node] = SidecarProcess(node, cfg, self.work / f"sidecar-{node}.log")
                sidecars[node].start()
            prod = AckedProducer(kafka, self.topic, self.partitions, tag=f"x{tag[:4]}", value_size=200, batch=10,
                                 pause_s=self.produce_pause_s, acks="all", **{"enable.idempotence": True}).start()
            with InvariantChecker.open(settings[1], self.work / "watcher") as self.watcher:
                self._create_rc(states)
                rounds = self._events(kafka, states, sidecars)
            self.watcher = None
            problems = self._quiesce(kafka, states, sidecars, prod)
            last = {p: prod.last_acked(p) for p in self.partitions}
            reports = self._check(settings[1], tps, prod, problems)
            result = ChaosResult(time.monotonic() - self.t0, rounds, self.events, self.skipped, prod.total_acked(),
                                 prod.failed, self.crashes, reports=reports, problems=problems,
                                 incarnations=[str(i) for i in self.incarnations])
            self.say(f"last acknowledged offsets: {last}")
            return result
        finally:
            if prod is not None:
                prod._stop.set()
            for inc in self.incarnations:
                inc.producer._stop.set()
            for sc in sidecars.values():
                sc.stop()
            kafka.stop()

    # --------------------------------------------------------------------------------------------- events
    def _watch_sidecars(self, sidecars: dict[int, SidecarProcess]) -> None:
        for sc in sidecars.values():
            if sc.proc is not None and sc.proc.poll() is not None:
                self.crashes.append(f"sidecar {sc.node} exited with {sc.proc.returncode} (log {sc.log})")
                self.say(f"sidecar {sc.node} exited with {sc.proc.returncode}: restarted")
                sc.start()

    def _events(self, kafka: KafkaCluster, states: PartitionStates, sidecars: dict[int, SidecarProcess]) -> int:
        deadline = time.monotonic() + self.seconds
        rounds = 0
        time.sleep(3.0)  # let the first segments roll and copies start
        while time.monotonic() < deadline:
            rounds += 1
            self._watch_sidecars(sidecars)
            variant = None
            if self.schedule and time.monotonic() >= deadline - self.seconds + self.schedule[0][0]:
                kind, variant = "recreate", self.schedule.pop(0)[1]
            else:
                kind = self.rng.choices(["move", "elect", "restart", "kill", "recreate"], weights=[3, 2, 1, 2, 0.5])[0]
            try:
                if kind == "recreate":
                    done = self._recreate(states, variant or self.rng.choice(["inflight", "idle"]))
                else:
                    done = getattr(self, f"_{kind}")(kafka, states, sidecars)
            except Exception as err:  # noqa: BLE001 - an event that could not be carried out is skipped, logged
                self.say(f"{kind}: failed: {type(err).__name__}: {str(err).strip().splitlines()[:2]}")
                done = False
            # An event may name what it turned out to be (``recreate-inflight``...).
            (self.events if done else self.skipped)[done if isinstance(done, str) else kind] += 1
            if variant and not done:  # a scheduled re-create that did not happen is tried again a little later
                self.schedule.insert(0, (time.monotonic() - (deadline - self.seconds) + 5.0, variant))
            time.sleep(self.rng.uniform(0.5, 3.0))
        return rounds

    def _move(self, kafka: KafkaCluster, states: PartitionStates, sidecars: dict) -> bool:
        p = self.rng.choice(self.partitions)
        d = states.describe(self.topic)
        if not d:
            return False
        leader, replicas, isr = d[1][p]
        choices = [n for n in isr if n != leader]
        if not choices:
            self.say(f"move: partition {p} has no other in-sync replica (isr {isr}): skipped")
            return False
        new = self.rng.choice(choices)
        order = [new] + [r for r in replicas if r != new]
        reassign(kafka, {(self.topic, p): order}, self.work / "reassign")
        res = states.elect(self.topic, [p])
        ok = states.leader(self.topic, p) == new
        if not ok:
            time.sleep(1.0)
            ok = states.leader(self.topic, p) == new
        self.say(f"move: partition {p} {leader} -> {new} ({'done' if ok else f'not done: {res}'})")
        return ok

    def _elect(self, kafka: KafkaCluster, states: PartitionStates, sidecars: dict) -> bool:
        """A preferred-leader election of every partition (leadership goes back to the first replica, if it is in
        sync: after a restart or a reassignment it usually is not the leader)."""
        before = states.describe(self.topic)
        res = states.elect(self.topic, self.partitions)
        after = states.describe(self.topic)
        if not before or not after:
            return False
        moved = {p: (before[1][p][0], after[1][p][0]) for p in self.partitions if before[1][p][0] != after[1][p][0]}
        self.say(f"elect: preferred leaders; moved {moved or 'nothing'} ({ {p: e for p, e in res.items() if e} })")
        return bool(moved)

    def _restart(self, kafka: KafkaCluster, states: PartitionStates, sidecars: dict) -> bool:
        d = states.describe(self.topic)
        if not d or any(len(v[2]) < 3 for v in d[1].values()):
            self.say("restart: a partition is under-replicated: skipped")
            return False
        node = self.rng.choice([2, 3])
        kill = self.rng.random() < 0.3
        kafka.stop_node(node, kill=kill)
        down = self.rng.uniform(2.0, 5.0)
        self.say(f"restart: broker {node} {'killed' if kill else 'stopped'}, down for {down:.1f} s")
        time.sleep(down)
        kafka.start_node(node)
        return True

    def _kill(self, kafka: KafkaCluster, states: PartitionStates, sidecars: dict) -> bool:
        node = self.rng.choice([1, 2, 3])
        sidecars[node].kill()
        down = self.rng.uniform(0.3, 3.0)
        self.say(f"kill: sidecar {node} SIGKILLed, restarted after {down:.1f} s")
        time.sleep(down)
        sidecars[node].start()
        return True

    # ------------------------------------------------------------------------------------ the re-created topic
    def _rc_staged(self, tp: TopicIdPartition) -> list[Path]:
        return [f for n in (1, 2, 3) for f in staged_files(self.work / f"staging-{n}", tp)]

    def _in_flight(self, tp: TopicIdPartition) -> str:
        """What of ``tp`` is between the broker and the store now: ``inflight`` (a copy STARTED, not finished),
        ``backlog`` (segments staged, none being copied) or ``idle``."""
        assert self.watcher is not None
        try:
            started = [s for s in self.watcher.all_segments(tp)
                       if s.state == RemoteLogSegmentState.COPY_SEGMENT_STARTED]
        except Exception:  # noqa: BLE001 - not served (yet): nothing seen started
            started = []
        return "inflight" if started else "backlog" if self._rc_staged(tp) else "idle"

    @staticmethod
    def _roll(producer: AckedProducer) -> int:
        """Stop ``producer``, then one record after ``segment.ms``: the segment holding the records acknowledged so
        far rolls. Returns the last of them (the offset that tiering must reach)."""
        producer.stop(flush_s=30)
        last = producer.last_acked(0)
        time.sleep((SEGMENT_MS + 200) / 1000)
        producer.send(1)
        producer.producer.flush(30)
        return last

    def _create_rc(self, states: PartitionStates) -> Incarnation:
        """Create (again) the re-created topic, wait for its leader and its new topic id; a producer of its own."""
        assert self.kafka is not None and self.watcher is not None
        n = len(self.incarnations) + 1
        first = n % 3 + 1  # the leader moves between incarnations
        assignment = [[first, first % 3 + 1, (first + 1) % 3 + 1]]
        old = {i.tp.topic_id for i in self.incarnations}

        def new_id() -> uuid.UUID | None:
            d = states.describe(self.rc_topic)
            return d[0] if d and d[0] not in old and d[1].get(0, (-1,))[0] >= 0 else None

        def created() -> uuid.UUID | None:
            try:
                states.admin.create_topics([NewTopic(self.rc_topic, 1, replica_assignment=assignment, config={
                    "segment.ms": str(SEGMENT_MS), "segment.jitter.ms": str(JITTER_MS), "min.insync.replicas": "2",
                })])[self.rc_topic].result(30)
            except Exception as err:  # noqa: BLE001 - the deleted one is still there (or the create did go through)
                self.say(f"recreate: create {self.rc_topic}: {str(err).strip()[:160]}")
            return self._within(new_id, 20)

        tid = wait_for(created, 90, f"{self.rc_topic} to be created (again)", interval_s=1.0)
        tp = TopicIdPartition(tid, self.rc_topic, 0)
        prod = AckedProducer(self.kafka, self.rc_topic, [0], tag=f"r{n}{self.tag[:4]}", value_size=200, batch=2,
                             pause_s=0.2, acks="all", **{"enable.idempotence": True}).start()
        inc = Incarnation(n, tp, prod)
        self.incarnations.append(inc)  # recorded first: a watcher that fails below must not lose the incarnation

        def followed() -> bool:
            try:
                self.watcher.follow([tp])
                return True
            except Exception as err:  # noqa: BLE001 - a broker restarting under the watcher's read: again
                self.say(f"recreate: following {self.rc_topic} #{n}: {type(err).__name__}: {str(err)[:160]}")
                return False

        wait_for(followed, 90, f"the watcher to follow {self.rc_topic} #{n}", interval_s=1.0)
        self.say(f"recreate: {self.rc_topic} incarnation #{n} created, id {tid}, replicas {assignment[0]}")
        return inc

    @staticmethod
    def _within(cond: Callable[[], Any], timeout_s: float) -> Any:
        """``cond``'s first true value within ``timeout_s``, or None (not raising)."""
        try:
            return wait_for(cond, timeout_s, "condition", interval_s=0.5)
        except AssertionError:
            return None

    def _recreate(self, states: PartitionStates, variant: str) -> str | bool:
        """Delete the re-created topic's live incarnation and create it again under the same name (a new topic id,
        a new producer). ``inflight``: a burst, its segment rolled, the delete as soon as its copy started;
        ``idle``: the producer stopped, the last segment rolled, the delete once tiering caught up. Returns the
        event's name by what was seen at the delete (``recreate-inflight``, ``-backlog``, ``-idle``)."""
        assert self.watcher is not None
        live = [i for i in self.incarnations if i.at_delete is None]
        if not live:  # the last re-create failed after its delete
            self._create_rc(states)
            return False
        cur = live[-1]
        tp = cur.tp
        if variant == "inflight":
            cur.producer.stop(flush_s=30)
            cur.producer.send(RC_BURST)
            last = self._roll(cur.producer)
            started = self._within(lambda: self._in_flight(tp) == "inflight", RC_COPY_START_S)
            self.say(f"recreate: burst to {self.rc_topic} up to {last}; a copy "
                     f"{'started' if started else f'not started within {RC_COPY_START_S} s'}")
        else:
            last = self._roll(cur.producer)
            deadline = time.monotonic() + RC_CAUGHT_UP_S
            while time.monotonic() < deadline and not (self.watcher.latest(tp) >= last
                                                       and self._in_flight(tp) == "idle"):
                time.sleep(0.5)
            self.say(f"recreate: {self.rc_topic} tiered up to {self.watcher.latest(tp)} of {last}")
        cur.at_delete = self._in_flight(tp)
        cur.remote_at_delete = (self.watcher.latest(tp), last)
        states.admin.delete_topics([self.rc_topic])[self.rc_topic].result(30)
        self.say(f"recreate: {self.rc_topic} incarnation #{cur.n} deleted ({cur.at_delete}; remote up to "
                 f"{self.watcher.latest(tp)}, {len(self._rc_staged(tp))} files staged)")
        try:
            self._create_rc(states)
        except Exception as err:  # noqa: BLE001 - the delete happened: the event counts; the next round creates
            self.say(f"recreate: creating {self.rc_topic} again failed ({type(err).__name__}: {str(err)[:160]}); "
                     "the next recreate creates it")
        return f"recreate-{cur.at_delete}"

    # -------------------------------------------------------------------------------------------- quiesce
    def _quiesce(self, kafka: KafkaCluster, states: PartitionStates, sidecars: dict,
                 prod: AckedProducer) -> list[str]:
        problems: list[str] = []
        self.say("quiesce: events stopped; every broker and sidecar up")
        for node in (1, 2, 3):
            kafka.start_node(node)
        kafka.wait_ready()
        self._watch_sidecars(sidecars)
        try:
            wait_for(lambda: (d := states.describe(self.topic)) and all(len(v[2]) == 3 for v in d[1].values()),
                     90, "every replica back in sync", interval_s=1.0)
        except AssertionError as err:
            problems.append(str(err))
        prod.stop()
        self.last = {p: prod.last_acked(p) for p in self.partitions}
        live = [i for i in self.incarnations if i.at_delete is None]
        if live:
            live[-1].producer.stop()
            self.rc_last = live[-1].producer.last_acked(0)
        else:
            problems.append(f"{self.rc_topic}: no live incarnation at the end (its last re-create failed)")
        time.sleep((SEGMENT_MS + 200) / 1000)
        prod.send(len(self.partitions))  # one record per partition: rolls the segment holding the last records
        prod.producer.flush(60)
        if live:
            live[-1].producer.send(1)
            live[-1].producer.producer.flush(60)
        self.say(f"quiesce: producers stopped; tiering must reach {self.last}"
                 + (f", {self.rc_topic} #{live[-1].n} {self.rc_last}" if live else ""))
        return problems

    def _check(self, settings, tps: dict[int, TopicIdPartition], prod: AckedProducer,
               problems: list[str]) -> list[Report | PurgeReport]:
        reports: list[Report | PurgeReport] = []
        live = [i for i in self.incarnations if i.at_delete is None]
        deleted = [i for i in self.incarnations if i.at_delete is not None]
        # tiering must reach: the main topic's partitions, and the re-created topic's live incarnation
        last = {tp: self.last[p] for p, tp in tps.items()}
        if live:
            last[live[-1].tp] = self.rc_last
        staging = [self.work / f"staging-{n}" for n in (1, 2, 3)]
        with InvariantChecker.open(settings, self.work / "checker") as checker:
            checker.follow([*last, *(i.tp for i in deleted)])
            # Tiering catches up on a backlog that grows with the run (the copy throttle is below the produce rate,
            # so a copy runs most of the time): wait while it progresses. A stall (no partition's latest remote
            # offset moving for STALL_S) fails it, and so does the cap, which grows with the run's length.
            cap_s = 180 + 2 * self.seconds
            start = moved = time.monotonic()
            behind = dict(last)
            seen = {tp: checker.latest(tp) for tp in behind}
            while behind:
                for tp in list(behind):
                    latest = checker.latest(tp)
                    if latest >= behind[tp]:
                        del behind[tp]
                    elif latest > seen[tp]:
                        seen[tp], moved = latest, time.monotonic()
                now = time.monotonic()
                stalled, capped = now - moved > STALL_S, now - start > cap_s
                if behind and (stalled or capped):
                    why = f"no progress for {STALL_S}s" if stalled else f"still behind after {cap_s:.0f}s"
                    problems += [f"{tp.topic}-{tp.partition} not tiered up to {to}: {why} (latest remote "
                                 f"{checker.latest(tp)})" for tp, to in behind.items()]
                    break
                if behind:
                    time.sleep(1.0)
            self.say("quiesce: tiering caught up; checking (one GC pass each)")
            for p, tp in tps.items():
                acked = {o: kv for o, kv in prod.acked[p].items() if o <= self.last[p]}
                reports.append(checker.check(tp, acked, produced=prod.produced, first_offset=0,
                                             tiered_through=self.last[p], staging_roots=staging, gc=True, wait_s=10))
            if live:  # the re-created topic's last incarnation: tiered completely and exactly, from offset 0
                rc = live[-1].producer
                acked = {o: kv for o, kv in rc.acked[0].items() if o <= self.rc_last}
                reports.append(checker.check(live[-1].tp, acked, produced=rc.produced, first_offset=0,
                                             tiered_through=self.rc_last, staging_roots=staging, gc=True,
                                             wait_s=10))
            # Every earlier incarnation's topic id purged (the purge waits purge_grace_ms after the proof).
            root = self.work / "remote"

            def left(tp: TopicIdPartition) -> list[str]:
                out = [f"object {k}" for k in store_keys_of_topic_id(root, tp.topic_id)]
                try:
                    out += [f"segment [{m.start_offset},{m.end_offset_inclusive}] {m.state.name}"
                            for m in checker.all_segments(tp)]
                except Exception as err:  # noqa: BLE001 - reported
                    out.append(f"metadata: {type(err).__name__}: {err}")
                return out + [f"staged {f}" for f in self._rc_staged(tp)]

            if deleted:
                self._within(lambda: not any(left(i.tp) for i in deleted), PURGE_WAIT_S)
                reports += [PurgeReport(i.tp, left(i.tp)) for i in deleted]
        return reports


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long events run (then quiesce and check)")
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--copy-rate", type=int, default=50_000, help="copy throttle per sidecar, bytes/s")
    ap.add_argument("--produce-pause", type=float, default=0.05,
                    help="seconds between the main producer's batches of 10 records (higher: less to catch up)")
    ap.add_argument("--work-dir", type=Path, default=None, help="default: a temp dir (removed unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (sidecar logs, store, staging)")
    args = ap.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="rlm-chaos-"))
    chaos = Chaos(work, seconds=args.minutes * 60, seed=args.seed, partitions=args.partitions,
                  copy_rate=args.copy_rate, produce_pause_s=args.produce_pause, out=lambda m: print(m, flush=True))
    try:
        result = chaos.run()
    finally:
        if not args.keep and args.work_dir is None:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"work dir kept: {work}")
    print(result.summary())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
