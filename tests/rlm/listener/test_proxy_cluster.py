"""Issue 24, the cluster case: 3 brokers, one sidecar each, each with its proxy listener; a consumer group of 2 reads
through the proxies only while leadership of its partitions moves twice and one broker restarts.

Set-up (the session's ``kafka_cluster3``): a topic of 2 partitions, 3 replicas each (partition 0 led by broker 2,
partition 1 by broker 3); three in-process sidecars (same store and metadata topic, own state dirs), each with a
proxy listener on a port chosen beforehand, told the other two (``history_listener.peers``), so Metadata and
FindCoordinator send a client to the proxy in front of each leader and coordinator. ``HISTORY`` records per
partition are produced in three time-rolled segments, tiered, then the brokers give up their start (DeleteRecords to
``LOG_START``, inside the tier): offsets below it exist only remotely. A producer keeps producing (acks=all,
idempotent) from then until the end.

The read: consumer ``a`` subscribes alone (both partitions, from offset 0 in the tier, ``auto.offset.reset=earliest``),
commits, reads on; consumer ``b`` joins (a rebalance: each partition restarts from the last commit, a redelivery).
With both consumers still below the log start (their fetching is held by a gate and small fetch queues), move 1
moves both leaders (reassignment + preferred election); the consumers then read the rest of the history through the
new leaders' proxies (tier reads there), cross into the brokers' logs and tail live data. Broker 3 (leading
partition 0 then) restarts: partition 0's leadership fails over; then move 2 moves both leaders again. The producer
stops; the group reads to the end.

Checked, per partition, on the sequence of deliveries (with the assignments and commits between them): every run of
a consumer on a partition (from an assignment on) is contiguous (+1 each) with the produced key and value; a run
starts either where the partition's deliveries so far end (nothing skipped) or at the partition's last commit (a
redelivery after a rebalance, never elsewhere); the union is exactly 0..end. The leadership moves and the restart
are asserted to have happened (the leaders observed before and after each step).

Before it, on the same set-up: a follower's proxy answers a Fetch below the log start NOT_LEADER_OR_FOLLOWER, not
the follower's OFFSET_OUT_OF_RANGE (see :func:`rlm.listener.tier.boundary.fetch_below_log_start`): the group test met
that path once as a reset to offset 0, from a new leader's OFFSET_NOT_AVAILABLE right after a move.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devtools.devkafka import KafkaCluster, free_port
from rlm.listener import Listener, start_listener
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.rlm.listener.raw_wire import call
from tests.support.kafka import broker_watermarks
from tests.support.sidecar import AckedProducer, PartitionStates, make_settings, only, reassign, wait_for

pytestmark = pytest.mark.slow

NODES = (1, 2, 3)
PARTITIONS = (0, 1)
SEGMENT_MS = 300
ROUNDS, PER_ROUND = 3, 100  # history per partition: three segments of 100 records
HISTORY = ROUNDS * PER_ROUND
LOG_START = {0: HISTORY - 67, 1: HISTORY - 41}  # the brokers' log start after DeleteRecords: inside the tier
INITIAL = {0: [2, 3, 1], 1: [3, 2, 1]}  # replica lists, the first the preferred leader
MOVE_1 = {0: [3, 1, 2], 1: [1, 2, 3]}
RESTARTED = 3  # leads partition 0 after move 1: its restart moves that leadership (to broker 1, next in line)
MOVE_2 = {0: [2, 3, 1], 1: [3, 2, 1]}
LIVE_RATE = 2, 0.05  # the live producer: records per send (one to each partition), pause between sends


@dataclass
class Delivery:
    consumer: str
    partition: int
    offset: int
    key: bytes
    value: bytes


@dataclass
class Group:
    """Two consumers of one group, polled by one thread while the test moves leaders; everything they see goes into
    ``events`` in order: ``("assign"|"revoke", consumer, partitions)``, ``("commit", consumer, partition, offset,
    landed)`` and :class:`Delivery`."""

    bootstrap: str
    topic: str
    group: str = field(default_factory=lambda: f"cluster-{uuid.uuid4().hex[:6]}")
    events: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    consumers: dict[str, Consumer] = field(default_factory=dict)
    gate: threading.Event = field(default_factory=threading.Event)  # set: the consumers consume
    stop: threading.Event = field(default_factory=threading.Event)
    slow: threading.Event = field(default_factory=threading.Event)  # set: a few records a turn (the history lasts)
    committing: threading.Event = field(default_factory=threading.Event)  # set: commits every second
    position: dict[str, dict[int, int]] = field(default_factory=dict)  # consumer -> partition -> next offset
    highest: dict[int, int] = field(default_factory=lambda: dict.fromkeys(PARTITIONS, -1))
    lock: threading.Lock = field(default_factory=threading.Lock)
    failure: BaseException | None = None
    poller: threading.Thread | None = None

    def join(self, name: str) -> None:
        """A new consumer of the group (subscribed on the polling thread's next turn)."""
        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.group, "auto.offset.reset": "earliest",
                      "enable.auto.commit": False, "enable.auto.offset.store": False, "check.crcs": True,
                      "fetch.wait.max.ms": 100, "topic.metadata.refresh.interval.ms": 2000,
                      "session.timeout.ms": 6000, "heartbeat.interval.ms": 1000,
                      # small fetches and queues: a consumer held by the gate stays where it is
                      "queued.min.messages": 1, "queued.max.messages.kbytes": 1, "message.max.bytes": 1000,
                      "fetch.max.bytes": 2048, "max.partition.fetch.bytes": 1024, "fetch.queue.backoff.ms": 5,
                      "reconnect.backoff.max.ms": 1000})
        with self.lock:
            self.position[name] = {}
            self.consumers[name] = c

    def _on_assign(self, name: str) -> Any:
        def cb(_c: Any, parts: list[TopicPartition]) -> None:
            self.events.append(("assign", name, sorted(p.partition for p in parts)))
            self.position[name] = {}
        return cb

    def _on_revoke(self, name: str) -> Any:
        def cb(_c: Any, parts: list[TopicPartition]) -> None:
            self.events.append(("revoke", name, sorted(p.partition for p in parts)))
            self.position[name] = {}
        return cb

    def run(self) -> None:
        subscribed: set[str] = set()
        last_commit = time.monotonic()
        try:
            while not self.stop.is_set():
                with self.lock:
                    consumers = dict(self.consumers)
                for name, c in consumers.items():
                    if name not in subscribed:
                        c.subscribe([self.topic], on_assign=self._on_assign(name), on_revoke=self._on_revoke(name))
                        subscribed.add(name)
                    if not self.gate.is_set():  # held: not polled (heartbeats go on in librdkafka's threads)
                        continue
                    for msg in c.consume(2 if self.slow.is_set() else 50, 0.05):
                        if msg.error() is not None:
                            self.errors.append(f"{name}: {msg.error()}")
                            continue
                        p = msg.partition()
                        self.events.append(Delivery(name, p, msg.offset(), msg.key(), msg.value()))
                        self.position[name][p] = msg.offset() + 1
                        self.highest[p] = max(self.highest[p], msg.offset())
                if self.committing.is_set() and time.monotonic() - last_commit > 1.0:
                    last_commit = time.monotonic()
                    for name, c in consumers.items():
                        self.commit(name, c)
                time.sleep(0.1 if self.slow.is_set() else 0.01)
        except BaseException as err:  # noqa: BLE001 - reported by the test's thread
            self.failure = err

    def commit(self, name: str, c: Consumer) -> None:
        """Commit what ``name`` delivered of the partitions it holds (synchronously); each commit is an event, with
        whether it landed (a failed one may still have: the check accepts either)."""
        for p, offset in sorted(self.position[name].items()):
            try:
                c.commit(offsets=[TopicPartition(self.topic, p, offset)], asynchronous=False)
                landed = True
            except KafkaException as err:
                self.errors.append(f"{name}: commit {p}@{offset}: {err}")
                landed = False
            self.events.append(("commit", name, p, offset, landed))

    def start(self) -> None:
        self.poller = threading.Thread(target=self.run, name="group", daemon=True)
        self.poller.start()

    def close(self) -> None:
        """Stop polling and close the consumers, once (the test's end, or the fixture's teardown after a failure)."""
        self.stop.set()
        if self.poller is not None:
            self.poller.join(30)
        with self.lock:
            consumers, self.consumers = self.consumers, {}
        for c in consumers.values():
            c.close()


@dataclass
class Cluster:
    kafka: KafkaCluster
    topic: str
    tid: uuid.UUID
    listeners: dict[int, Listener]
    states: PartitionStates
    prod: AckedProducer  # every record produced (the history's and the live ones)
    tmp: Path
    started: float  # when the set-up began (time.monotonic)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{li.port}" for li in self.listeners.values())

    def leaders(self) -> dict[int, int]:
        d = self.states.describe(self.topic)
        return {p: d[1][p][0] for p in PARTITIONS} if d else {}

    def isr(self) -> dict[int, list[int]]:
        d = self.states.describe(self.topic)
        return {p: d[1][p][2] for p in PARTITIONS} if d else {}


@pytest.fixture(scope="module")
def cluster(kafka_cluster3: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The topic, three sidecars with proxy listeners that know each other, the history tiered, the brokers' log
    start moved past its start."""
    kafka, tmp = kafka_cluster3, tmp_path_factory.mktemp("proxy-cluster")
    started = time.monotonic()
    topic = f"proxy-cluster-{uuid.uuid4().hex[:6]}"
    states = PartitionStates(kafka)
    states.admin.create_topics([NewTopic(topic, len(PARTITIONS), replica_assignment=[INITIAL[p] for p in PARTITIONS],
                                         config={"segment.ms": str(SEGMENT_MS)})])[topic].result(30)
    wait_for(lambda: all(states.leader(topic, p) == INITIAL[p][0] for p in PARTITIONS), 60, "the initial leaders")
    tid = wait_for(lambda: states.topic_id(topic), 30, "the topic id")
    tag = uuid.uuid4().hex[:8]
    shared = {"topic": f"__rlm_md_{tag}", "to_be_deleted_topic": f"__rlm_tbd_{tag}", "replication_factor": 3}
    ports = {n: free_port() for n in NODES}
    prod = AckedProducer(kafka, topic, list(PARTITIONS), tag=f"c{tag[:4]}", value_size=60,
                         **{"enable.idempotence": True, "batch.num.messages": 10})
    with ExitStack() as stack:
        listeners: dict[int, Listener] = {}
        for n in NODES:
            settings = make_settings(kafka, tmp, node_id=n, topics=only(topic), metadata=shared,
                                     history_listener={
                                         "host": "127.0.0.1", "port": ports[n], "proxy": True,
                                         "peers": {m: f"127.0.0.1:{ports[m]}" for m in NODES if m != n},
                                         "authorization": {"allow_if_no_authorizer": True}})
            sidecar = Sidecar(settings).start()
            stack.callback(sidecar.stop, timeout_s=30)
            listeners[n] = start_listener(settings, sidecar.rsm)
            stack.callback(listeners[n].stop)
        for _ in range(ROUNDS):  # the history: one segment per round and partition
            prod.send(PER_ROUND * len(PARTITIONS))
            assert prod.producer.flush(60) == 0
            time.sleep(SEGMENT_MS / 1000 + 0.05)
        prod.send(len(PARTITIONS))  # rolls the last round's segments
        assert prod.producer.flush(60) == 0 and prod.failed == 0
        for p in PARTITIONS:
            tp = TopicIdPartition(tid, topic, p)
            wait_for(lambda tp=tp: all(tier_end(li, tp) >= HISTORY for li in listeners.values()), 60,
                     f"{tp} tiered up to {HISTORY}, seen by every listener")
        admin = AdminClient(kafka.admin_config())
        for fut in admin.delete_records([TopicPartition(topic, p, o) for p, o in LOG_START.items()]).values():
            fut.result(30)
        for p, o in LOG_START.items():
            assert broker_watermarks(kafka, topic, p)[0] == o
        yield Cluster(kafka, topic, tid, listeners, states, prod, tmp, started)


def tier_end(listener: Listener, tp: TopicIdPartition) -> int:
    tier = listener.server.router.ctx.tier
    tier.refresh([tp])
    t = tier.partition(tp)
    return t.high_watermark if t is not None else -1


def check_partition(events: list[Any], p: int, end: int, value_of: Any) -> dict[str, int]:
    """The check of the module's docstring for partition ``p`` (``end``: its high watermark at the end); returns
    counts (runs, redelivered offsets)."""
    delivered = -1  # the highest offset delivered so far
    commits: list[tuple[int, bool]] = []  # (offset, landed) in order
    run: dict[str, int | None] = {}  # consumer -> the next offset of its run on p (None: a new run starts)
    runs = redelivered = 0
    seen: set[int] = set()
    for i, e in enumerate(events):
        if isinstance(e, tuple):
            if e[0] in ("assign", "revoke") and p in e[2]:
                run[e[1]] = None
            elif e[0] == "commit" and e[2] == p:
                commits.append((e[3], e[4]))
            continue
        if e.partition != p:
            continue
        expected = run.get(e.consumer)
        if expected is None:  # a run starts: where the deliveries end, or at the last commit (a redelivery)
            landed = [i for i, (_o, ok) in enumerate(commits) if ok]
            # the last commit that landed and those after it that may have (no commit yet: earliest, the tier's 0)
            restart = {o for o, _ok in commits[landed[-1]:]} if landed else {0, *(o for o, _ok in commits)}
            assert e.offset == delivered + 1 or (e.offset in restart and e.offset <= delivered + 1), (
                f"partition {p}: {e.consumer} started a run at {e.offset}; delivered up to {delivered}, commits "
                f"{commits[-5:]}")
            runs += 1
            redelivered += delivered + 1 - e.offset
        else:
            assert e.offset == expected, (f"partition {p}: {e.consumer} delivered {e.offset} after {expected - 1}: "
                                          f"{_around(events, i, p)}")
        run[e.consumer] = e.offset + 1
        delivered = max(delivered, e.offset)
        seen.add(e.offset)
        assert (e.key, e.value) == value_of(p, e.offset, e.key), f"partition {p} offset {e.offset}"
    assert seen == set(range(end)), f"partition {p}: missing {sorted(set(range(end)) - seen)[:20]}"
    return {"runs": runs, "redelivered": redelivered}


def _around(events: list[Any], i: int, p: int) -> list[Any]:
    """The events of partition ``p`` just before ``events[i]`` (for a failure's message)."""
    def of_p(e: Any) -> bool:
        return (e.partition == p if isinstance(e, Delivery) else
                (p in e[2] if e[0] != "commit" else e[2] == p))
    near = [(e.consumer, e.offset) if isinstance(e, Delivery) else e for e in events[:i + 1] if of_p(e)]
    return near[-12:]


def test_a_followers_proxy_sends_a_fetch_below_the_log_start_to_the_leader(cluster: Cluster) -> None:
    """A follower serves a consumer's Fetch (v11+, KIP-392) and answers one below its log start OFFSET_OUT_OF_RANGE,
    but not ListOffsets (NOT_LEADER_OR_FOLLOWER): its proxy cannot learn the bounds, and passes the ListOffsets error
    on, so the client goes to the leader's proxy; the broker's OFFSET_OUT_OF_RANGE would send a consumer group back to
    ``auto.offset.reset`` from a position the tier holds (a new leader's ListOffsets answers OFFSET_NOT_AVAILABLE for
    a moment after a move: the same path, the one the group test met). The leader's proxy serves it from the tier."""
    follower = INITIAL[0][1]
    leader = cluster.states.leader(cluster.topic, 0)
    assert leader == INITIAL[0][0]
    with socket.create_connection(("127.0.0.1", cluster.kafka.node(follower).port), timeout=30) as sock:
        kafkas = _fetch_one(sock, cluster.topic, 0, 5)
    assert kafkas.error_code == 1  # the follower's own answer: OFFSET_OUT_OF_RANGE
    with socket.create_connection(("127.0.0.1", cluster.listeners[follower].port), timeout=30) as sock:
        ours = _fetch_one(sock, cluster.topic, 0, 5)
    assert ours.error_code == 6 and not ours.records  # NOT_LEADER_OR_FOLLOWER
    with socket.create_connection(("127.0.0.1", cluster.listeners[leader].port), timeout=30) as sock:
        tiers = _fetch_one(sock, cluster.topic, 0, 5)
    assert tiers.error_code == 0 and tiers.records and tiers.log_start_offset == 0


def _fetch_one(sock: socket.socket, topic: str, partition: int, offset: int) -> Any:
    """A consumer's Fetch v11 (no session, no wait, rack ""): its one partition's answer."""
    resp = call(sock, 1, 11, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "topics": [{"topic": topic, "partitions": [
            {"partition": partition, "fetch_offset": offset, "current_leader_epoch": -1, "log_start_offset": -1,
             "partition_max_bytes": 1 << 20}]}]})
    assert resp.error_code == 0
    (t,) = resp.responses
    (p,) = t.partitions
    return p


@pytest.fixture
def group(cluster: Cluster) -> Iterator[Group]:
    g = Group(cluster.bootstrap, cluster.topic)
    yield g
    g.close()


def test_a_group_reads_through_three_proxies_across_leader_moves_and_a_broker_restart(cluster: Cluster,
                                                                                      group: Group) -> None:
    """The module's docstring: the read, the moves, the restart; the check per partition (:func:`check_partition`),
    the group's last commits on the broker, each partition's leader changed at least twice, and a redelivery."""
    kafka, topic_name, prod, tmp_path, started = cluster.kafka, cluster.topic, cluster.prod, cluster.tmp, \
        cluster.started
    live = threading.Event()  # set: the live producer produces (at a steady rate: AckedProducer.start's is
    # bounded only by the delivery reports, which end its pauses)

    def produce_live() -> None:
        while live.is_set():
            prod.send(LIVE_RATE[0])
            prod.producer.poll(0)
            time.sleep(LIVE_RATE[1])
    steps: list[str] = []

    def step(what: str) -> None:
        steps.append(f"{time.monotonic() - started:5.1f}s {what}")
        print(steps[-1], flush=True)
    restarted = False
    moved: list[tuple[dict[int, int], dict[int, int]]] = []  # (leaders before, after) of each move and the restart
    admin = AdminClient(kafka.admin_config())
    step("set-up done: history tiered, the brokers' log start moved")
    live.set()
    producer = threading.Thread(target=produce_live, name="live", daemon=True)
    producer.start()
    try:
        group.join("a")
        group.slow.set()
        group.committing.set()
        group.gate.set()
        group.start()
        # a alone: both partitions from 0; commits (every second) while it reads on
        wait_for(lambda: all(group.highest[p] >= 40 for p in PARTITIONS), 30, "a to read 40 offsets of each")
        wait_for(lambda: any(e[0] == "commit" and e[4] for e in group.events if isinstance(e, tuple)), 15,
                 "a commit")
        group.committing.clear()  # a reads on past its commits: the rebalance redelivers from them
        mark = dict(group.highest)
        wait_for(lambda: all(group.highest[p] >= mark[p] + 5 for p in PARTITIONS), 30, "a to read past its commits")
        step(f"a read {dict(group.highest)}")
        group.join("b")  # the rebalance: redelivery from the last commit
        wait_for(lambda: sum(1 for e in group.events if isinstance(e, tuple) and e[0] == "assign"
                             and e[2]) >= 3, 30, "a and b to share the partitions")
        group.committing.set()
        wait_for(lambda: all(any(isinstance(e, Delivery) and e.consumer == c for e in group.events[-200:])
                             for c in "ab"), 30, "both to deliver")
        step(f"a and b read {dict(group.highest)}")
        group.gate.clear()
        time.sleep(0.3)
        below = {p: group.highest[p] for p in PARTITIONS}
        assert all(below[p] < LOG_START[p] - 10 for p in PARTITIONS), f"the history read too fast: {below}"

        # Each step records the leaders its wait saw, not a describe made after it: a describe is answered by any
        # broker, and one that has not caught up yet (the restarted one) gives the leaders before the step.
        before = cluster.leaders()
        target = {p: MOVE_1[p][0] for p in PARTITIONS}
        reassign(kafka, {(topic_name, p): MOVE_1[p] for p in PARTITIONS}, tmp_path / "move-1")
        wait_for(lambda: cluster.states.elect(topic_name, list(PARTITIONS)) is not None
                 and cluster.leaders() == target, 60, "move 1's leaders")
        moved.append((before, target))
        step(f"move 1 at {below}: {before} -> {moved[-1][1]}")
        group.slow.clear()
        group.gate.set()
        wait_for(lambda: all(group.highest[p] >= LOG_START[p] + 30 for p in PARTITIONS), 60,
                 "both partitions read across the log start (through the new leaders' proxies)")
        step(f"across the log start {dict(group.highest)}")

        before = moved[-1][1]
        kafka.stop_node(RESTARTED)
        try:
            seen: dict[int, int] = {}

            def left() -> bool:
                seen.clear()
                seen.update(cluster.leaders())
                return seen.get(0, RESTARTED) not in (RESTARTED, -1)

            wait_for(left, 60, f"partition 0's leadership to leave broker {RESTARTED}")
            moved.append((before, dict(seen)))
            step(f"broker {RESTARTED} stopped at {dict(group.highest)}: {before} -> {moved[-1][1]}")
            time.sleep(2)  # the group reads on without it
        finally:
            kafka.start_node(RESTARTED)
            kafka.wait_ready()
            restarted = True
        wait_for(lambda: all(len(i) == 3 for i in cluster.isr().values()) if cluster.isr() else False, 90,
                 f"broker {RESTARTED} back in sync")
        step(f"broker {RESTARTED} back at {dict(group.highest)}")

        before = moved[-1][1]
        target = {p: MOVE_2[p][0] for p in PARTITIONS}
        reassign(kafka, {(topic_name, p): MOVE_2[p] for p in PARTITIONS}, tmp_path / "move-2")
        wait_for(lambda: cluster.states.elect(topic_name, list(PARTITIONS)) is not None
                 and cluster.leaders() == target, 60, "move 2's leaders")
        moved.append((before, target))
        step(f"move 2 at {dict(group.highest)}: {before} -> {moved[-1][1]}")
        mark = dict(group.highest)
        wait_for(lambda: all(group.highest[p] >= mark[p] + 20 for p in PARTITIONS), 30,
                 "the group to read on after move 2")
    finally:
        live.clear()
        producer.join(30)
        prod.stop()
        if restarted:  # the shared cluster as found: every partition led by its preferred replica again
            _prefer_leaders(kafka)
    ends = {p: broker_watermarks(kafka, topic_name, p)[1] for p in PARTITIONS}
    try:
        wait_for(lambda: group.failure is not None or all(group.highest[p] >= ends[p] - 1 for p in PARTITIONS),
                 60, f"the group to read up to {ends} (it read {group.highest})")
    finally:
        group.stop.set()
        assert group.poller is not None
        group.poller.join(30)
    assert group.failure is None, group.failure
    with group.lock:
        for name, c in group.consumers.items():
            group.commit(name, c)
    group.close()
    committed = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group.group)])[
        group.group].result(30)

    def value_of(p: int, offset: int, key: bytes) -> tuple[bytes, bytes]:
        if offset in prod.acked[p]:
            return prod.acked[p][offset]
        return key, prod.produced[key]  # written, its acknowledgement lost (a restart)

    print(f"errors seen by the group ({len(group.errors)}):", *group.errors[:30], sep="\n  ")
    counts = {p: check_partition(group.events, p, ends[p], value_of) for p in PARTITIONS}
    assert {tp.partition: tp.offset for tp in committed.topic_partitions} == ends  # the last commits landed
    changes = {p: sum(1 for before, after in moved if before[p] != after[p]) for p in PARTITIONS}
    assert restarted and all(n >= 2 for n in changes.values()), (changes, steps)  # each leader moved twice or more
    assert all(c["redelivered"] > 0 for c in counts.values()), counts  # the rebalance redelivered from the commit
    print(f"total {time.monotonic() - started:.1f}s; ends {ends}; {counts}; leader changes {changes}",
          *steps, sep="\n  ")


def _prefer_leaders(kafka: KafkaCluster) -> None:
    """A preferred election of every partition of the cluster (the restart moved other tests' leaders too)."""
    from confluent_kafka import ElectionType

    admin = AdminClient(kafka.admin_config())
    try:
        admin.elect_leaders(ElectionType.PREFERRED, None).result(30)
    except KafkaException as err:  # ELECTION_NOT_NEEDED is an error of the whole call when nothing moves
        print("preferred election:", err)
