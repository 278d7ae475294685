"""Cluster chaos for the sidecar (issue 9): 3 brokers, one ``rlm serve`` per broker, continuous produce, random events.

    .venv/bin/python scripts/chaos.py --minutes 10 [--seed 9] [--partitions 2] [--keep]

Under continuous produce (acks=all, idempotent; every acknowledged record remembered) it runs, at random:

- ``elect``: a preferred-leader election of every partition (moves leadership back after restarts and moves);
- ``move``: a reassignment reordering the replicas (Kafka's reassignment tool), then a preferred-leader election:
  leadership moves, usually while the old leader's copy is in flight (copies are throttled by the store's
  ``copy_rate_bytes_per_second``, so one runs most of the time);
- ``restart``: a broker (2 or 3; node 1 is the only controller) stopped, gracefully or with SIGKILL, and started
  again a few seconds later;
- ``kill``: a sidecar SIGKILLed (``rlm serve`` runs as a subprocess) and restarted.

Segments roll on time with jitter (``segment.ms`` / ``segment.jitter.ms``), so replicas roll at different
offsets. At the end it quiesces (no more events, every broker and sidecar up, producer stopped, the last segments
rolled, tiering caught up) and the invariant checker (``tests/rlm/invariants.py``) asserts per partition: one
contiguous remote chain from offset 0, no offset served twice, every record read equal to what was produced,
nothing acknowledged missing, staging empty, and after one GC pass nothing orphaned. It prints the rounds and
events survived and the checker's report; exit status 1 when an invariant is violated.

``tests/rlm/test_chaos.py`` runs it for ~1.5 minutes of events in the suite.
"""

from __future__ import annotations

import argparse
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from confluent_kafka.admin import NewTopic  # noqa: E402

from devtools.devkafka import KafkaCluster  # noqa: E402
from rlmm.api import TopicIdPartition  # noqa: E402
from tests.rlm.invariants import InvariantChecker, Report  # noqa: E402
from tests.rlm.sidecar_util import (  # noqa: E402
    AckedProducer,
    PartitionStates,
    make_settings,
    only,
    reassign,
    settings_yaml,
    wait_for,
)

SEGMENT_MS = 800
STALL_S = 120  # the catch-up after the events fails when tiering does not move for this long
JITTER_MS = 600


@dataclass
class ChaosResult:
    seconds: float
    rounds: int
    events: Counter
    skipped: Counter
    acked: int
    failed_sends: int
    sidecar_crashes: list[str]
    reports: list[Report] = field(default_factory=list)
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
                 copy_rate: int = 50_000, out=print) -> None:
        self.work = Path(work_dir)
        self.seconds = seconds
        self.rng = random.Random(seed)
        self.partitions = list(range(partitions))
        self.copy_rate = copy_rate
        self.out = out
        self.topic = f"chaos-{uuid.uuid4().hex[:8]}"
        self.events: Counter = Counter()
        self.skipped: Counter = Counter()
        self.crashes: list[str] = []
        self.t0 = time.monotonic()

    def say(self, msg: str) -> None:
        self.out(f"[{time.monotonic() - self.t0:7.1f}s] {msg}")

    # ------------------------------------------------------------------------------------------------ run
    def run(self) -> ChaosResult:
        self.work.mkdir(parents=True, exist_ok=True)
        kafka = KafkaCluster(brokers=3)
        sidecars: dict[int, SidecarProcess] = {}
        prod: AckedProducer | None = None
        try:
            kafka.start()
            self.say(f"cluster up: {kafka.bootstrap_servers}; topic {self.topic}, partitions {self.partitions}")
            states = PartitionStates(kafka)
            n = len(self.partitions)
            assignment = [[(p + i) % 3 + 1 for i in range(3)] for p in self.partitions]
            states.admin.create_topics([NewTopic(self.topic, n, replica_assignment=assignment, config={
                "segment.ms": str(SEGMENT_MS), "segment.jitter.ms": str(JITTER_MS), "min.insync.replicas": "2",
            })])[self.topic].result(30)
            desc = wait_for(lambda: (d := states.describe(self.topic)) and len(d[1]) == n
                            and all(v[0] >= 0 for v in d[1].values()) and d, 60, "the chaos topic's leaders")
            tps = {p: TopicIdPartition(desc[0], self.topic, p) for p in self.partitions}
            tag = uuid.uuid4().hex[:8]
            shared = {"topic": f"__rlm_md_{tag}", "to_be_deleted_topic": f"__rlm_tbd_{tag}", "replication_factor": 3}
            settings = {}
            for node in (1, 2, 3):
                settings[node] = make_settings(
                    kafka, self.work, node_id=node, topics=only(self.topic), metadata=shared,
                    store={"store": "fs", "root_path": str(self.work / "remote"), "block_size_bytes": 64 * 1024,
                           "copy_rate_bytes_per_second": self.copy_rate},
                    tasks={"copy_interval_ms": 300, "discovery_interval_ms": 300, "expiration_interval_ms": 1000,
                           "gc_interval_ms": 5000, "gc_grace_ms": 5000},
                    log_format="json")
                cfg = self.work / f"sidecar-{node}.yaml"
                cfg.write_text(settings_yaml(settings[node]))
                sidecars[node] = SidecarProcess(node, cfg, self.work / f"sidecar-{node}.log")
                sidecars[node].start()
            prod = AckedProducer(kafka, self.topic, self.partitions, tag=f"x{tag[:4]}", value_size=200, batch=10,
                                 pause_s=0.05, acks="all", **{"enable.idempotence": True}).start()
            rounds = self._events(kafka, states, sidecars)
            problems = self._quiesce(kafka, states, sidecars, prod)
            last = {p: prod.last_acked(p) for p in self.partitions}
            reports = self._check(settings[1], tps, prod, problems)
            result = ChaosResult(time.monotonic() - self.t0, rounds, self.events, self.skipped, prod.total_acked(),
                                 prod.failed, self.crashes, reports, problems)
            self.say(f"last acknowledged offsets: {last}")
            return result
        finally:
            if prod is not None:
                prod._stop.set()
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
            kind = self.rng.choices(["move", "elect", "restart", "kill"], weights=[3, 2, 1, 2])[0]
            try:
                done = getattr(self, f"_{kind}")(kafka, states, sidecars)
            except Exception as err:  # noqa: BLE001 - an event that could not be carried out is skipped, logged
                self.say(f"{kind}: failed: {type(err).__name__}: {str(err).strip().splitlines()[:2]}")
                done = False
            (self.events if done else self.skipped)[kind] += 1
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
        time.sleep((SEGMENT_MS + 200) / 1000)
        prod.send(len(self.partitions))  # one record per partition: rolls the segment holding the last records
        prod.producer.flush(60)
        self.say(f"quiesce: producer stopped; tiering must reach {self.last}")
        return problems

    def _check(self, settings, tps: dict[int, TopicIdPartition], prod: AckedProducer,
               problems: list[str]) -> list[Report]:
        reports = []
        with InvariantChecker.open(settings, self.work / "checker") as checker:
            checker.follow(tps.values())
            # Tiering catches up on a backlog that grows with the run (the copy throttle is below the produce rate,
            # so a copy runs most of the time): wait while it progresses. A stall (no partition's latest remote
            # offset moving for STALL_S) fails it, and so does the cap, which grows with the run's length.
            cap_s = 180 + 2 * self.seconds
            start = moved = time.monotonic()
            behind = dict(tps)
            seen = {p: checker.latest(tp) for p, tp in behind.items()}
            while behind:
                for p, tp in list(behind.items()):
                    latest = checker.latest(tp)
                    if latest >= self.last[p]:
                        del behind[p]
                    elif latest > seen[p]:
                        seen[p], moved = latest, time.monotonic()
                now = time.monotonic()
                stalled, capped = now - moved > STALL_S, now - start > cap_s
                if behind and (stalled or capped):
                    why = f"no progress for {STALL_S}s" if stalled else f"still behind after {cap_s:.0f}s"
                    problems += [f"partition {p} not tiered up to {self.last[p]}: {why} (latest remote "
                                 f"{checker.latest(tp)})" for p, tp in behind.items()]
                    break
                if behind:
                    time.sleep(1.0)
            self.say("quiesce: tiering caught up; checking (one GC pass each)")
            for p, tp in tps.items():
                acked = {o: kv for o, kv in prod.acked[p].items() if o <= self.last[p]}
                reports.append(checker.check(tp, acked, produced=prod.produced, first_offset=0,
                                             tiered_through=self.last[p],
                                             staging_roots=[self.work / f"staging-{n}" for n in (1, 2, 3)],
                                             gc=True, wait_s=10))
        return reports


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0, help="how long events run (then quiesce and check)")
    ap.add_argument("--seed", type=int, default=9)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--copy-rate", type=int, default=50_000, help="copy throttle per sidecar, bytes/s")
    ap.add_argument("--work-dir", type=Path, default=None, help="default: a temp dir (removed unless --keep)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (sidecar logs, store, staging)")
    args = ap.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="rlm-chaos-"))
    chaos = Chaos(work, seconds=args.minutes * 60, seed=args.seed, partitions=args.partitions,
                  copy_rate=args.copy_rate, out=lambda m: print(m, flush=True))
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
