"""OffsetForLeaderEpoch through the proxy: epochs the broker forgot are answered from the tier's lineage.

Three brokers (the session's ``kafka_cluster3``), one topic of 3 replicas: a first leader writes epoch E0's records,
leadership moves (reassignment and a preferred election: epoch E1) and the new leader writes more; a sidecar next to
the new leader tiers it all and proxies it. DeleteRecords then puts the broker's log start inside E1: the broker's
leader-epoch checkpoint no longer holds E0, and Kafka answers a request for E0 with its log start offset, not where E0
ended. Through the proxy the answer is the tier's: E0 and the start offset of E1.

Each broker has a proxy listener in front of it, told the others (``history_listener.peers``; those of the other two
brokers need no sidecar: nothing of the topic is led there), so a client never learns a broker's own address. With
the new leader's proxy alone, the consumer reached the other brokers as they were named (its group coordinator, or
another broker a metadata refresh went to while its leader's connection was still down); their Metadata, not
rewritten, gave it the new leader's own address, and it read the broker directly: OFFSET_OUT_OF_RANGE at its first
Fetch, no request through the proxy (librdkafka's debug log; 3 of 16 consumers at load 10-14).

Before a proxy has read the tier (its metadata manager not caught up: :func:`tests.support.held_metadata.held_listener`,
a second proxy of each broker), E0 is OFFSET_NOT_AVAILABLE, which clients retry: the broker's answer (its log start)
would hide a truncation below it, and a consumer whose position claims E0 past its end would skip E1's first offsets.
So is E0 of a second topic whose tier, read, ends at E1's start below the broker's log start (E1's segment not rolled
yet: the range between pending), the tier's lineage holding nothing above E0. A proxy whose tier's bounds cannot be
read (the newest copy corrupt on the filesystem store) answers E0 KAFKA_STORAGE_ERROR, also retried: not the broker's
log start.
"""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import REGISTRY

from devtools.devkafka import KafkaCluster, free_port
from devtools.kafka_streams import compile_app, java_app_cmd
from rlm.config import SidecarSettings
from rlm.listener import Listener, start_listener
from rlm.listener.protocol.codec import ErrorCode
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from rsm.manager import RemoteStorageManager
from tests.rlm.listener.raw_wire import call
from tests.support.clients import consume_until, librdkafka_log
from tests.support.held_metadata import Held, held_listener
from tests.support.kafka import produce
from tests.support.sidecar import PartitionStates, make_settings, reassign, wait_for
from tests.support.stores import index_base, index_keys, unreadable_copy

NODES = (1, 2, 3)
PER_EPOCH = 40
SEGMENT_MS = 300
INTO_E1 = 10  # the broker's log start: this many offsets into the new leader's epoch
JAVA_SOURCE = Path(__file__).resolve().parents[2] / "support" / "java" / "EpochSeek.java"


@dataclass
class Pending:
    """The second topic: E1 still in the new leader's active segment, the broker's log start inside it (``INTO_E1``
    offsets in), so the tier ends at E1's start, below the broker's log start, until E1's segment rolls."""

    topic: str
    tp: TopicIdPartition
    e0: int
    e1_start: int
    sent: dict[int, tuple[bytes, bytes]]


@dataclass
class Epochs:
    kafka: KafkaCluster
    listener: Listener  # the new leader's proxy
    proxies: dict[int, int]  # broker -> its proxy's port
    topic: str
    leader: int  # the new leader, the sidecar's broker
    epochs: tuple[int, int]  # (E0, E1)
    e1_start: int  # E1's first offset
    end: int  # the broker's high watermark
    sent: dict[int, tuple[bytes, bytes]]
    settings_of: Callable[[int, dict[int, int]], SidecarSettings]  # broker, every broker's proxy port -> settings
    rsm: Any
    pending: Pending


def _produce(kafka: KafkaCluster, topic: str, tag: str, sent: dict[int, tuple[bytes, bytes]], batch: int = 10
             ) -> list[int]:
    recs = [(f"{tag}-{i}".encode(), f"{tag}-value-{i}".encode() * 3) for i in range(PER_EPOCH)]
    offsets = [off for _p, off in produce(kafka, topic, recs, acks="all", **{"batch.num.messages": batch})]
    sent.update(zip(offsets, recs, strict=True))
    return offsets


@pytest.fixture(scope="module")
def epochs(kafka_cluster3: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Epochs]:
    kafka = kafka_cluster3
    tmp: Path = tmp_path_factory.mktemp("proxy-epochs")
    tag = uuid.uuid4().hex[:6]
    topic, pending_topic = f"proxy-epochs-{tag}", f"proxy-epochs-pending-{tag}"
    tid = kafka.create_topic(topic, 1, replication_factor=3, config={"segment.ms": str(SEGMENT_MS)})
    tid2 = kafka.create_topic(pending_topic, 1, replication_factor=3, config={"segment.ms": str(SEGMENT_MS)})
    states = PartitionStates(kafka)
    firsts = {states.leader(topic), states.leader(pending_topic)}
    sent: dict[int, tuple[bytes, bytes]] = {}
    sent2: dict[int, tuple[bytes, bytes]] = {}
    _produce(kafka, topic, "e0", sent)
    _produce(kafka, pending_topic, "e0", sent2)
    time.sleep(SEGMENT_MS / 1000 + 0.05)
    new = next(n for n in NODES if n not in firsts)
    reassign(kafka, {(t, 0): [new, *(n for n in NODES if n != new)] for t in (topic, pending_topic)}, tmp)
    wait_for(lambda: all(states.elect(t, [0]) and states.leader(t) == new for t in (topic, pending_topic)), 60,
             f"node {new} to lead")
    e1_start = _produce(kafka, topic, "e1", sent)[0]
    e1_start2 = _produce(kafka, pending_topic, "e1", sent2, batch=PER_EPOCH)[0]  # one append: no roll inside E1
    time.sleep(SEGMENT_MS / 1000 + 0.05)
    (end,) = _produce(kafka, topic, "roll", sent)[-1:]  # rolls E1's segment: the tier ends before these
    end += 1
    ports = {n: free_port() for n in NODES}
    metadata: dict[str, str] = {}

    # one store and metadata topic; each proxy (on ``ports``, by broker) told the others
    def settings_of(n: int, ports: dict[int, int] = ports) -> SidecarSettings:
        proxy = {"host": "127.0.0.1", "port": ports[n], "proxy": True,
                 "authorization": {"allow_if_no_authorizer": True},
                 "peers": {m: f"127.0.0.1:{ports[m]}" for m in NODES if m != n},
                 "hole_confirm_ms": 3_600_000}  # the pending topic's range below the log start stays pending
        return make_settings(kafka, tmp, node_id=n, topics={"include": [topic, pending_topic]}, metadata=metadata,
                             history_listener=proxy)
    settings = settings_of(new)
    metadata.update(topic=settings.metadata.topic, to_be_deleted_topic=settings.metadata.to_be_deleted_topic)
    sidecar = Sidecar(settings).start()
    listeners: list[Listener] = []
    try:
        listener = start_listener(settings, sidecar.rsm)
        listeners.append(listener)
        listeners += [start_listener(settings_of(n), sidecar.rsm) for n in NODES if n != new]
        tier = listener.server.router.ctx.tier
        tp = TopicIdPartition(tid, topic, 0)

        def tiered() -> Any:
            tier.refresh([tp])
            t = tier.partition(tp)
            return t if t is not None and t.high_watermark > e1_start + INTO_E1 else None
        t = wait_for(tiered, 60, f"{tp} tiered past {e1_start + INTO_E1}")
        pairs = (t.epoch_of(0), t.epoch_of(e1_start))
        assert pairs[0] < pairs[1] and t.epoch_of(e1_start - 1) == pairs[0], pairs
        tp2 = TopicIdPartition(tid2, pending_topic, 0)

        def e0_tiered() -> Any:
            tier.refresh([tp2])
            t = tier.partition(tp2)
            return t if t is not None and t.high_watermark >= e1_start2 else None
        t2 = wait_for(e0_tiered, 60, f"{tp2}'s E0 tiered")
        assert t2.high_watermark == e1_start2, t2.high_watermark  # E1's segment is the broker's active one
        admin = AdminClient(kafka.admin_config())
        for fut in admin.delete_records([TopicPartition(topic, 0, e1_start + INTO_E1),
                                         TopicPartition(pending_topic, 0, e1_start2 + INTO_E1)]).values():
            fut.result(30)
        yield Epochs(kafka, listener, ports, topic, new, pairs, e1_start, end, sent, settings_of, sidecar.rsm,
                     Pending(pending_topic, tp2, t2.epoch_of(0), e1_start2, sent2))
    finally:
        for li in listeners:
            li.stop()
        sidecar.stop()


def _end_offset(address: tuple[str, int], topic: str, epoch: int, current: int) -> tuple[int, int, int]:
    """OffsetForLeaderEpoch v3 (a consumer's: replica id -1): (error code, leader epoch, end offset)."""
    with socket.create_connection(address, timeout=30) as sock:
        resp = call(sock, 23, 3, {"replica_id": -1, "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "current_leader_epoch": current, "leader_epoch": epoch}]}]})
    (t,) = resp.topics
    (p,) = t.partitions
    return p.error_code, p.leader_epoch, p.end_offset


def test_an_epoch_the_broker_forgot_is_answered_from_the_tiers_lineage(epochs: Epochs) -> None:
    """E0 ended where E1 began; the broker, whose log starts inside E1, says E0 ends at its log start; the proxy says
    where it ended. E1 (the broker's) is the broker's answer through the proxy too."""
    e0, e1 = epochs.epochs
    broker = ("127.0.0.1", epochs.kafka.node(epochs.leader).port)
    proxy = ("127.0.0.1", epochs.listener.port)
    assert _end_offset(broker, epochs.topic, e0, e1) == (0, e0, epochs.e1_start + INTO_E1)  # Kafka: its log start
    assert _end_offset(proxy, epochs.topic, e0, e1) == (0, e0, epochs.e1_start)  # the tier's lineage
    assert _end_offset(proxy, epochs.topic, e1, e1) == _end_offset(broker, epochs.topic, e1, e1)


def test_an_epoch_the_broker_forgot_is_a_storage_error_while_the_tier_cannot_be_read(epochs: Epochs,
                                                                                   tmp_path: Path) -> None:
    """The newest copy (E1's segment) with a byte of its index object flipped on the filesystem store: the tier's
    bounds cannot be read. A proxy of the new leader with a storage manager of its own (no copy read before) and
    ``hole_confirm_ms`` 0 answers E0, which the broker answers with its log start, KAFKA_STORAGE_ERROR (retried by
    both client families), counted in ``rlm_history_unreadable_copies_total{api="offset_for_leader_epoch"}``; before,
    the tier was taken for empty, everything below the broker's log start a hole at once, and the broker's log start
    went out as E0's end (a consumer at a position of E0 past its real end passes validation: a truncation hidden).
    E1, which the broker answers from its checkpoint, is its answer, the tier not read. The byte flipped back: E0
    ends where E1 began, the tier's lineage."""
    e0, e1 = epochs.epochs
    settings = epochs.settings_of(epochs.leader, {**epochs.proxies, epochs.leader: free_port()})
    settings = settings.model_copy(update={  # its own metadata cache (the module's proxy holds the leader's)
        "history_listener": settings.history_listener.model_copy(update={"hole_confirm_ms": 0}),
        "metadata": settings.metadata.model_copy(update={"state_dir": tmp_path / "state"})})
    root = settings.store.root_path
    broker = ("127.0.0.1", epochs.kafka.node(epochs.leader).port)
    tp = epochs.listener.server.router.ctx.catalog.by_name(epochs.topic).tp(0)
    newest = max(index_base(k) for k in index_keys(root, tp))
    rsm = RemoteStorageManager(settings.store)
    listener = start_listener(settings, rsm)
    try:
        tier = listener.server.router.ctx.tier
        wait_for(lambda: tier.ready(tp), 30, f"{tp} read by the proxy")
        proxy = ("127.0.0.1", listener.port)
        with unreadable_copy(root, tp, newest):
            before = _unreadable_answers()
            assert _end_offset(proxy, epochs.topic, e0, e1) == (ErrorCode.kafka_storage_error, -1, -1)
            assert _unreadable_answers() == before + 1
            assert _end_offset(proxy, epochs.topic, e1, e1) == _end_offset(broker, epochs.topic, e1, e1)
            assert _unreadable_answers() == before + 1
        assert _end_offset(proxy, epochs.topic, e0, e1) == (0, e0, epochs.e1_start)
    finally:
        listener.stop()
        rsm.close()


def _unreadable_answers() -> float:
    return REGISTRY.get_sample_value("rlm_history_unreadable_copies_total", {"api": "offset_for_leader_epoch"}) or 0.0


def test_a_consumer_validating_an_old_position_reads_on_across_the_leader_change(epochs: Epochs) -> None:
    """A consumer assigned a position inside E0 with its epoch (as after a commit under the old leader) validates it
    against the proxy (OffsetForLeaderEpoch: the current leader epoch is newer) and reads on from it, through E1 and
    the broker's log start, each offset once: no truncation seen. Every connection it opened (librdkafka's
    ``broker`` debug lines) went to a proxy."""
    e0, _e1 = epochs.epochs
    start = epochs.e1_start - 5
    log, lines = librdkafka_log()
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{epochs.listener.port}", "group.id": f"v-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "auto.offset.reset": "error", "fetch.wait.max.ms": 100,
                  "debug": "broker", "log_level": 7}, logger=log)
    try:
        c.assign([TopicPartition(epochs.topic, 0, start, leader_epoch=e0)])
        got = consume_until(c, {(epochs.topic, 0): epochs.end})[(epochs.topic, 0)]
    finally:
        c.close()
    assert [r.offset for r in got] == list(range(start, epochs.end))
    assert all((r.key, r.value) == epochs.sent[r.offset] for r in got)
    connected = {int(m.group(1)) for line in lines for m in re.finditer(r"Connecting to ipv4#127\.0\.0\.1:(\d+)",
                                                                           line)}
    brokers = {epochs.kafka.node(n).port for n in NODES}
    assert connected and connected <= set(epochs.proxies.values()) and not connected & brokers, (
        connected, epochs.proxies, brokers)


@pytest.fixture
def held(epochs: Epochs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Held]:
    """A second proxy of each broker, the new leader's first, sharing one metadata manager that has read nothing yet
    (:func:`held_listener`): their tier is empty and not ready until released. Each is told the others' ports, so a
    client that bootstraps from them stays among them: the module's proxies, told each other, would take it to the
    new leader's first proxy, whose tier is read (librdkafka refreshes its metadata when its validation is refused,
    and a broker's proxy it asks names the new leader's proxy by its port: a consumer was seen reading there)."""
    ports = {n: free_port() for n in NODES}
    order = [epochs.leader, *(n for n in NODES if n != epochs.leader)]
    with held_listener([epochs.settings_of(n, ports) for n in order], epochs.rsm, tmp_path / "held-cache",
                       monkeypatch) as h:
        yield h


def _asked() -> float:
    """OffsetForLeaderEpoch and Fetch requests the proxies forwarded to their brokers so far."""
    return sum(REGISTRY.get_sample_value("rlm_history_upstream_requests_total", {"api": api}) or 0.0
               for api in ("offset_for_leader_epoch", "fetch"))


def _until_asked(times: int, c: Consumer) -> None:
    """Poll ``c`` until the proxies forwarded ``times`` more OffsetForLeaderEpoch or Fetch requests (the consumer
    validating its position, or fetching from it); nothing may come meanwhile, neither a record nor an error."""
    asked, deadline = _asked(), time.monotonic() + 60
    while _asked() < asked + times:
        assert time.monotonic() < deadline, "the consumer stopped asking"
        for msg in c.consume(100, 0.2):
            pytest.fail(f"while the tier is not read: {msg.error() or msg.offset()}")


def test_before_the_tier_is_read_an_epoch_the_broker_forgot_is_asked_again(epochs: Epochs, held: Held) -> None:
    """Through a proxy whose tier is not read yet (:func:`held`), E0, which the broker answers with its log start (its
    checkpoint no longer holds E0), is OFFSET_NOT_AVAILABLE, not the broker's answer: where E0 ended is the tier's to
    say. E1, which the broker answers from its checkpoint (its log end, above its log start), is the broker's answer.
    Once the manager has read the metadata, E0 is the tier's: it ended where E1 began."""
    e0, e1 = epochs.epochs
    broker = ("127.0.0.1", epochs.kafka.node(epochs.leader).port)
    proxy = ("127.0.0.1", held.listener.port)
    assert _end_offset(broker, epochs.topic, e0, e1) == (0, e0, epochs.e1_start + INTO_E1)  # at its log start
    assert _end_offset(proxy, epochs.topic, e0, e1) == (ErrorCode.offset_not_available.value, -1, -1)
    assert _end_offset(proxy, epochs.topic, e1, e1) == _end_offset(broker, epochs.topic, e1, e1)
    assert not held.caught_up(epochs.topic)  # the premise: held back all along
    held.released.set()
    wait_for(lambda: held.caught_up(epochs.topic), 60, "the held manager to catch up")
    assert _end_offset(proxy, epochs.topic, e0, e1) == (0, e0, epochs.e1_start)


def test_before_the_tier_is_read_a_consumer_validating_an_old_position_waits_then_reads_on_once(
        epochs: Epochs, held: Held) -> None:
    """A consumer assigned a position inside E0 with its epoch, through a proxy whose tier is not read yet, validates
    it again and again (OffsetForLeaderEpoch answered OFFSET_NOT_AVAILABLE), neither reset (``auto.offset.reset=error``
    would raise it) nor reading; once the manager has read the metadata it reads on from its position, each offset
    once. (The broker's answer, E0 ending at its log start, passes this position too: then its Fetches wait.)"""
    e0, _e1 = epochs.epochs
    start = epochs.e1_start - 5
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{held.listener.port}", "group.id": f"h-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "auto.offset.reset": "error", "fetch.wait.max.ms": 100})
    try:
        c.assign([TopicPartition(epochs.topic, 0, start, leader_epoch=e0)])
        _until_asked(4, c)  # validating, or fetching, again and again
        assert not held.caught_up(epochs.topic)  # the premise: held back all along
        held.released.set()
        got = consume_until(c, {(epochs.topic, 0): epochs.end})[(epochs.topic, 0)]
    finally:
        c.close()
    assert [r.offset for r in got] == list(range(start, epochs.end))
    assert all((r.key, r.value) == epochs.sent[r.offset] for r in got)


def test_before_the_tier_is_read_a_truncation_below_the_log_start_is_not_hidden(epochs: Epochs, held: Held) -> None:
    """A consumer whose position claims E0 past where E0 ended (E1's start + 3, as one that read E0 records a new
    leader never had would hold) validates it through a proxy whose tier is not read yet. The broker's answer (E0 ends
    at its log start, E1's start + 10) would pass it, and it would read on from there once the tier is read (its
    Fetches wait until then), never reading E1's first three offsets; it validates again instead. Once the manager
    has read the metadata, the tier's answer (E0 ended at E1's start) shows the truncation, and the consumer reads
    from E1's start (librdkafka seeks to the end offset given; ``auto.offset.reset=earliest`` would start it at 0):
    every offset from there once."""
    e0, _e1 = epochs.epochs
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{held.listener.port}", "group.id": f"t-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100})
    try:
        c.assign([TopicPartition(epochs.topic, 0, epochs.e1_start + 3, leader_epoch=e0)])
        _until_asked(4, c)
        assert not held.caught_up(epochs.topic)  # the premise: held back all along
        held.released.set()
        got = consume_until(c, {(epochs.topic, 0): epochs.end})[(epochs.topic, 0)]
    finally:
        c.close()
    assert [r.offset for r in got] == list(range(epochs.e1_start, epochs.end))
    assert all((r.key, r.value) == epochs.sent[r.offset] for r in got)


def test_before_the_tier_is_read_kafkas_java_consumer_waits_then_sees_the_truncation(
        epochs: Epochs, held: Held, tmp_path: Path) -> None:
    """The truncation above through Kafka's own KafkaConsumer (``tests/support/java/EpochSeek.java``: seek() with
    the epoch, ``auto.offset.reset=earliest``): while the proxies' tier is not read it validates again
    (``OffsetsForLeaderEpochUtils`` retries OFFSET_NOT_AVAILABLE) and reads nothing; once it is, it seeks to where E0
    ended (E1's start) and reads every offset from there once."""
    classes = compile_app(JAVA_SOURCE)
    e0, _e1 = epochs.epochs
    cmd = java_app_cmd(classes, "EpochSeek", [f"127.0.0.1:{held.listener.port}", epochs.topic, "0",
                                              str(epochs.e1_start + 3), str(e0), str(epochs.end), "earliest", "120000"])
    lines: list[str] = []
    with open(tmp_path / "java.log", "wb") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True)
        assert proc.stdout is not None
        reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
        reader.start()
        try:
            asked, deadline = _asked(), time.monotonic() + 90
            while _asked() < asked + 4:  # validating, or fetching, again and again
                assert time.monotonic() < deadline and proc.poll() is None, (proc.returncode, lines)
                time.sleep(0.1)
            assert lines == []  # nothing read while the tier is not read
            assert not held.caught_up(epochs.topic)  # the premise: held back all along
            held.released.set()
            proc.wait(150)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join(10)
    assert proc.returncode == 0, (lines[-3:], (tmp_path / "java.log").read_text(errors="replace")[-4000:])
    records = [line.rstrip("\n").split("\t")[1:] for line in lines if line.startswith("RECORD")]
    assert [int(o) for o, _k in records] == list(range(epochs.e1_start, epochs.end))
    assert all(bytes.fromhex(k) == epochs.sent[int(o)][0] for o, k in records)


def test_an_epoch_whose_end_is_not_tiered_yet_is_asked_again(epochs: Epochs) -> None:
    """The pending topic (:class:`Pending`): the tier, read, ends at E1's start, below the broker's log start, and its
    lineage has nothing above E0, so only the broker answers E0: with its log start. The range between may yet be
    tiered (pending: ``hole_confirm_ms`` an hour, nothing staged), and with it E1's start: E0 is OFFSET_NOT_AVAILABLE,
    as a Fetch there is."""
    pend = epochs.pending
    tier = epochs.listener.server.router.ctx.tier
    broker = ("127.0.0.1", epochs.kafka.node(epochs.leader).port)
    proxy = ("127.0.0.1", epochs.listener.port)
    tier.refresh([pend.tp])
    t = tier.partition(pend.tp)
    assert t is not None and t.high_watermark == pend.e1_start  # the premise: E1 is not tiered
    assert _end_offset(broker, pend.topic, pend.e0, -1) == (0, pend.e0, pend.e1_start + INTO_E1)  # its log start
    assert _end_offset(proxy, pend.topic, pend.e0, -1) == (ErrorCode.offset_not_available.value, -1, -1)
