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
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import REGISTRY

from devtools.devkafka import KafkaCluster, free_port
from devtools.kafka_streams import compile_app, java_app_cmd
from rlm.listener import start_listener
from rlm.listener.protocol.codec import ErrorCode
from rsm.manager import RemoteStorageManager
from tests.support.clients import consume_until, librdkafka_log
from tests.support.held_metadata import Held, held_listener
from tests.support.proxy_epochs import INTO_E1, NODES, Epochs, end_offset, forgotten_epochs
from tests.support.sidecar import wait_for
from tests.support.stores import index_base, index_keys, unreadable_copy

pytestmark = pytest.mark.slow

JAVA_SOURCE = Path(__file__).resolve().parents[2] / "support" / "java" / "EpochSeek.java"


@pytest.fixture(scope="module")
def epochs(kafka_cluster3: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Epochs]:
    with forgotten_epochs(kafka_cluster3, tmp_path_factory.mktemp("proxy-epochs")) as e:
        yield e


def test_an_epoch_the_broker_forgot_is_answered_from_the_tiers_lineage(epochs: Epochs) -> None:
    """E0 ended where E1 began; the broker, whose log starts inside E1, says E0 ends at its log start; the proxy says
    where it ended. E1 (the broker's) is the broker's answer through the proxy too."""
    e0, e1 = epochs.epochs
    broker = ("127.0.0.1", epochs.kafka.node(epochs.leader).port)
    proxy = ("127.0.0.1", epochs.listener.port)
    assert end_offset(broker, epochs.topic, e0, e1) == (0, e0, epochs.e1_start + INTO_E1)  # Kafka: its log start
    assert end_offset(proxy, epochs.topic, e0, e1) == (0, e0, epochs.e1_start)  # the tier's lineage
    assert end_offset(proxy, epochs.topic, e1, e1) == end_offset(broker, epochs.topic, e1, e1)


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
            assert end_offset(proxy, epochs.topic, e0, e1) == (ErrorCode.kafka_storage_error, -1, -1)
            assert _unreadable_answers() == before + 1
            assert end_offset(proxy, epochs.topic, e1, e1) == end_offset(broker, epochs.topic, e1, e1)
            assert _unreadable_answers() == before + 1
        assert end_offset(proxy, epochs.topic, e0, e1) == (0, e0, epochs.e1_start)
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
    assert end_offset(broker, epochs.topic, e0, e1) == (0, e0, epochs.e1_start + INTO_E1)  # at its log start
    assert end_offset(proxy, epochs.topic, e0, e1) == (ErrorCode.offset_not_available.value, -1, -1)
    assert end_offset(proxy, epochs.topic, e1, e1) == end_offset(broker, epochs.topic, e1, e1)
    assert not held.caught_up(epochs.topic)  # the premise: held back all along
    held.released.set()
    wait_for(lambda: held.caught_up(epochs.topic), 60, "the held manager to catch up")
    assert end_offset(proxy, epochs.topic, e0, e1) == (0, e0, epochs.e1_start)


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
    """The pending topic (:class:`tests.support.proxy_epochs.Pending`): the tier, read, ends at E1's start, below the
    broker's log start, and its lineage has nothing above E0, so only the broker answers E0: with its log start. The
    range between may yet be tiered (pending: ``hole_confirm_ms`` an hour, nothing staged), and with it E1's start: E0
    is OFFSET_NOT_AVAILABLE, as a Fetch there is."""
    pend = epochs.pending
    tier = epochs.listener.server.router.ctx.tier
    broker = ("127.0.0.1", epochs.kafka.node(epochs.leader).port)
    proxy = ("127.0.0.1", epochs.listener.port)
    tier.refresh([pend.tp])
    t = tier.partition(pend.tp)
    assert t is not None and t.high_watermark == pend.e1_start  # the premise: E1 is not tiered
    assert end_offset(broker, pend.topic, pend.e0, -1) == (0, pend.e0, pend.e1_start + INTO_E1)  # its log start
    assert end_offset(proxy, pend.topic, pend.e0, -1) == (ErrorCode.offset_not_available.value, -1, -1)
