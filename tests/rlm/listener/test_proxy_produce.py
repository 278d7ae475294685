"""Issue 24: Produce through the proxy (``history_listener.proxy``) at the broker's versions.

Produce v10+ answers (KIP-951) name the new leader's address (``node_endpoints``, a tagged field, with each
partition answered NOT_LEADER_OR_FOLLOWER), as do Fetch v16+ answers: the proxy gives the address of the sidecar in
front of that broker (``history_listener.peers``), never the broker's, so the client comes back through a proxy.
An answer that names no leader passes as the broker's bytes (:func:`rlm.listener.protocol.codec.produce_names_leaders`
walks to its tagged fields without decoding it). Offering Produce at the broker's versions (v3 to v13 on Kafka 4.x)
lets the broker's ``transaction.version`` 2 (KIP-890, which needs Produce v12+) pass as it is.

- The session broker (``kafka``), one proxy in front of it: ApiVersions through the proxy offers the broker's Produce
  versions and finalized ``transaction.version``; confluent-kafka's idempotent producer (acks=all; librdkafka speaks
  Produce v10+, checked in its protocol log) and a transactional one (one committed and one aborted transaction)
  produce through it, read back from the broker (read_committed).
- ``kafka_cluster3``: a topic of one replica on broker 1; a proxy in front of each broker, each told the others
  (``peers``). Produce (v10 to v13) and Fetch (v16, v17) sent to broker 3's proxy are answered
  NOT_LEADER_OR_FOLLOWER naming broker 1 at broker 1's proxy (broker 3 itself names broker 1's own port), and the
  same Produce sent to that address is written. An idempotent producer whose bootstrap servers are the proxies
  produces while its partition's leadership moves from broker 1 to broker 3: every record is written once, in
  order, and the producer never connects to a broker.
"""

from __future__ import annotations

import io
import re
import socket
import struct
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition, libversion
from confluent_kafka.admin import NewTopic

from devtools.devkafka import KafkaCluster, free_port
from rlm.listener import Listener, start_listener
from rlm.listener.protocol.codec import decode_response, new_request, produce_names_leaders
from rlm.listener.protocol.frame import RequestHeader
from rlm.sidecar import Sidecar
from tests.rlm.listener.raw_wire import recv_frame
from tests.support.batches import batch
from tests.support.clients import librdkafka_log
from tests.support.sidecar import PartitionStates, make_settings, only, reassign, wait_for

PRODUCE, FETCH, API_VERSIONS = 0, 1, 18
NOT_LEADER_OR_FOLLOWER = 6
LEADER, ASKED = 1, 3  # the cluster case: the partition's one replica, and the broker asked (hosts no replica)


def ask(sock: socket.socket, api_key: int, version: int, values: dict[str, Any]) -> tuple[Any, bytes]:
    """A request of any version (flexible ones too) built by kio from ``values``: the decoded answer and its frame
    (without the size prefix)."""
    frame, header = new_request(api_key, version, 11, "t", values)
    sock.sendall(frame)
    answer = recv_frame(sock)
    assert answer is not None, "connection closed"
    assert struct.unpack_from(">i", answer)[0] == 11
    return decode_response(answer, header), answer


def header_of(api_key: int, version: int) -> RequestHeader:
    return RequestHeader(api_key, version, 11, "t", True, 0)


def proxy_listener(stack: ExitStack, kafka: KafkaCluster, tmp: Path, topic: str, *, node_id: int = 1, port: int = 0,
                   peers: dict[int, str] | None = None) -> Listener:
    settings = make_settings(kafka, tmp / f"n{node_id}", node_id=node_id, topics=only(topic), history_listener={
        "host": "127.0.0.1", "port": port, "proxy": True, "peers": peers or {},
        "authorization": {"allow_if_no_authorizer": True}})
    sidecar = Sidecar(settings).start()
    stack.callback(sidecar.stop, timeout_s=30)
    listener = start_listener(settings, sidecar.rsm)
    stack.callback(listener.stop)
    return listener


def test_the_walk_to_a_produce_answers_tagged_fields_agrees_with_kio() -> None:
    """:func:`produce_names_leaders` against kio's encoding of every Produce answer version it knows: two topics,
    partitions with and without record errors, error messages and a ``current_leader``; with and without
    ``node_endpoints``; a truncated answer raises (the real broker's answers are in the tests below)."""
    from kio.index import load_response_schema
    from kio.serial import entity_writer

    from rlm.listener.protocol.codec import build
    from rlm.listener.protocol.frame import BadRequestError

    checked = 0
    for version in range(3, 14):
        rtype = load_response_schema(PRODUCE, version)
        for named in (False, True):
            if named and version < 10:
                continue
            partitions = [{"index": i, "error_code": NOT_LEADER_OR_FOLLOWER if i % 2 else 0, "base_offset": 7 * i,
                           "record_errors": [{"batch_index": j, "batch_index_error_message": "bad" if j else None}
                                             for j in range(i % 3)],
                           "error_message": "moved" if i % 2 else None,
                           **({"current_leader": {"leader_id": 2, "leader_epoch": 5}} if named and i % 2 else {})}
                          for i in range(5)]
            body = build(rtype, {"responses": [
                {"name": f"topic-{t}", "topic_id": uuid.uuid4(), "partition_responses": partitions}
                for t in range(2)], "throttle_time_ms": 3,
                "node_endpoints": [{"node_id": 2, "host": "b2", "port": 9092, "rack": None}] if named else ()})
            out = io.BytesIO()
            out.write(struct.pack(">i", 11) + (b"\0" if rtype.__flexible__ else b""))  # response header
            entity_writer(rtype)(out, body)
            frame = out.getvalue()
            header = RequestHeader(PRODUCE, version, 11, "t", bool(rtype.__flexible__), 0)
            assert decode_response(frame, header) == body, version  # the frame is the answer kio reads
            assert produce_names_leaders(frame, header) is named, (version, named)
            if version >= 10 and not named:
                with pytest.raises(BadRequestError):
                    produce_names_leaders(frame[:-1], header)
            checked += 1
    assert checked == 15


# ------------------------------------------------------------------------------------------- one broker
@dataclass
class Single:
    kafka: KafkaCluster
    topic: str
    listener: Listener

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.listener.port}"


@pytest.fixture(scope="module")
def single(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Single]:
    topic = f"proxy-produce-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, 2)
    with ExitStack() as stack:
        yield Single(kafka, topic, proxy_listener(stack, kafka, tmp_path_factory.mktemp("proxy-produce"), topic))


def _api_versions(port: int) -> Any:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        body, _frame = ask(sock, API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})
    assert body.error_code == 0
    return body


def test_produce_and_transaction_version_are_offered_as_the_broker_gives_them(single: Single) -> None:
    """The broker's Produce versions (up to v13 on Kafka 4.3) and its finalized ``transaction.version`` (2: the
    proxy said 1 while it offered Produce below v12, commit a71ddb1) pass through the proxy's ApiVersions."""
    broker = _api_versions(single.kafka.node(1).port)
    ours = _api_versions(single.listener.port)

    def produce(body: Any) -> tuple[int, int]:
        (k,) = [k for k in body.api_keys if k.api_key == PRODUCE]
        return int(k.min_version), int(k.max_version)

    def txn_version(body: Any) -> int:
        (f,) = [f for f in body.finalized_features if f.name == "transaction.version"]
        return int(f.max_version_level)

    assert produce(broker)[1] >= 12 and txn_version(broker) >= 2  # the premise: a broker with Transactions V2
    assert produce(ours) == produce(broker)
    assert txn_version(ours) == txn_version(broker)


def _produce_versions(lines: list[str]) -> set[int]:
    """The Produce versions librdkafka sent, from its ``protocol`` debug lines ("Sent ProduceRequest (v11, ...")."""
    return {int(m.group(1)) for line in lines for m in re.finditer(r"Sent ProduceRequest \(v(\d+)", line)}


def _read_committed(kafka: KafkaCluster, topic: str, partition: int, start: int, end: int) -> list[tuple[bytes, bytes]]:
    """The records of ``partition`` in [start, end) a read_committed consumer of the broker gets."""
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"g-{uuid.uuid4().hex[:6]}",
                  "isolation.level": "read_committed", "enable.auto.commit": False})
    out: list[tuple[bytes, bytes]] = []
    try:
        c.assign([TopicPartition(topic, partition, start)])

        def done() -> bool:
            for msg in c.consume(100, 0.2):
                assert msg.error() is None, msg.error()
                if msg.offset() < end:
                    out.append((msg.key(), msg.value()))
            return c.position([TopicPartition(topic, partition)])[0].offset >= end
        wait_for(done, 30, f"{topic}/{partition} read up to {end}")
    finally:
        c.close()
    return out


def test_an_idempotent_producer_with_acks_all_produces_through_the_proxy(single: Single) -> None:
    """confluent-kafka's idempotent producer (acks=all), the proxy its only bootstrap server: it speaks Produce v10+,
    every record is acknowledged and the broker holds each once, in order."""
    log, lines = librdkafka_log()
    p = Producer({"bootstrap.servers": single.bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                  "debug": "protocol", "log_level": 7}, logger=log)
    acked: dict[int, tuple[bytes, bytes]] = {}

    def cb(err: Any, msg: Any) -> None:
        assert err is None, err
        acked[msg.offset()] = (msg.key(), msg.value())

    for i in range(200):
        p.produce(single.topic, key=f"k{i}".encode(), value=f"v{i}".encode() * 3, partition=1, on_delivery=cb)
    assert p.flush(60) == 0 and len(acked) == 200
    p.poll(0)
    versions = _produce_versions(lines)
    print(f"librdkafka {libversion()[0]} sent Produce {sorted(versions)} through the proxy")
    assert versions and min(versions) >= 10, versions  # KIP-951's answers, the ones the proxy may rewrite
    first = min(acked)
    assert sorted(acked) == list(range(first, first + 200))
    assert _read_committed(single.kafka, single.topic, 1, first, first + 200) == [acked[o] for o in sorted(acked)]


def test_a_transactional_producer_commits_and_aborts_through_the_proxy(single: Single) -> None:
    """A transactional producer through the proxy: a committed transaction's records are read (read_committed)
    from the broker, an aborted one's are not."""
    p = Producer({"bootstrap.servers": single.bootstrap, "transactional.id": f"txn-{uuid.uuid4().hex}",
                  "linger.ms": 5})
    p.init_transactions(30)
    offsets: dict[str, list[int]] = {"yes": [], "no": []}
    for tag, commit in (("yes", True), ("no", False)):
        p.begin_transaction()

        def cb(err: Any, msg: Any, tag: str = tag) -> None:
            assert err is None, err
            offsets[tag].append(msg.offset())

        for i in range(20):
            p.produce(single.topic, key=f"{tag}{i}".encode(), value=b"x" * 10, partition=0, on_delivery=cb)
        assert p.flush(30) == 0
        (p.commit_transaction if commit else p.abort_transaction)(30)
    assert len(offsets["yes"]) == len(offsets["no"]) == 20
    end = max(offsets["no"]) + 2  # past the abort marker
    got = _read_committed(single.kafka, single.topic, 0, min(offsets["yes"]), end)
    assert got == [(f"yes{i}".encode(), b"x" * 10) for i in range(20)]


# ------------------------------------------------------------------------------------------- three brokers
@dataclass
class Moved:
    kafka: KafkaCluster
    topic: str
    topic_id: uuid.UUID
    listeners: dict[int, Listener]  # broker -> the proxy in front of it
    states: PartitionStates
    tmp: Path


@pytest.fixture(scope="module")
def moved(kafka_cluster3: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moved]:
    kafka, tmp = kafka_cluster3, tmp_path_factory.mktemp("proxy-produce-3")
    topic = f"proxy-produce-3-{uuid.uuid4().hex[:6]}"
    states = PartitionStates(kafka)
    states.admin.create_topics([NewTopic(topic, 1, replica_assignment=[[LEADER]])])[topic].result(30)
    wait_for(lambda: states.leader(topic, 0) == LEADER, 60, "the leader")
    tid = wait_for(lambda: states.topic_id(topic), 30, "the topic id")
    ports = {n: free_port() for n in (1, 2, 3)}
    with ExitStack() as stack:
        listeners = {n: proxy_listener(stack, kafka, tmp, topic, node_id=n, port=ports[n], peers={
            m: f"127.0.0.1:{ports[m]}" for m in ports if m != n}) for n in ports}
        yield Moved(kafka, topic, tid, listeners, states, tmp)


def _produce_values(version: int, topic: str, topic_id: uuid.UUID, tag: bytes) -> dict[str, Any]:
    return {"transactional_id": None, "acks": -1, "timeout": 30_000, "topic_data": [{
        "name": topic, "topic_id": topic_id, "partition_data": [{
            "index": 0, "records": batch(0, [tag + b"-0", tag + b"-1"])}]}]}


def test_a_produce_answer_naming_the_leader_names_its_proxy(moved: Moved) -> None:
    """Produce v10 to v13 sent to the proxy of a broker that is not the leader: NOT_LEADER_OR_FOLLOWER naming the
    leader at its proxy's address (the broker names its own); the same Produce sent there is written. A written
    answer has no tagged fields: it passes as the broker's bytes."""
    leader_broker = ("127.0.0.1", moved.kafka.node(LEADER).port)
    leader_proxy = ("127.0.0.1", moved.listeners[LEADER].port)
    for version in (10, 11, 12, 13):
        values = _produce_values(version, moved.topic, moved.topic_id, f"v{version}".encode())
        with socket.create_connection(("127.0.0.1", moved.kafka.node(ASKED).port), timeout=30) as sock:
            kafkas, frame = ask(sock, PRODUCE, version, values)
        assert produce_names_leaders(frame, header_of(PRODUCE, version))
        assert [(e.node_id, e.host, e.port) for e in kafkas.node_endpoints] == [(LEADER, *leader_broker)]  # premise
        with socket.create_connection(("127.0.0.1", moved.listeners[ASKED].port), timeout=30) as sock:
            ours, _frame = ask(sock, PRODUCE, version, values)
        (t,) = ours.responses
        (p,) = t.partition_responses
        assert p.error_code == NOT_LEADER_OR_FOLLOWER and p.current_leader.leader_id == LEADER, (version, p)
        assert [(e.node_id, e.host, e.port) for e in ours.node_endpoints] == [(LEADER, *leader_proxy)], version
        with socket.create_connection(leader_proxy, timeout=30) as sock:
            written, frame = ask(sock, PRODUCE, version, values)
        (t,) = written.responses
        (p,) = t.partition_responses
        assert p.error_code == 0 and p.base_offset >= 0 and not written.node_endpoints, (version, p)
        assert not produce_names_leaders(frame, header_of(PRODUCE, version))


def test_a_fetch_answer_naming_the_leader_names_its_proxy(moved: Moved) -> None:
    """Fetch v16 and v17 (topic ids, KIP-951) to the proxy of a broker that is not the leader: NOT_LEADER_OR_FOLLOWER
    naming the leader at its proxy's address, not the broker's."""
    leader_broker = ("127.0.0.1", moved.kafka.node(LEADER).port)
    leader_proxy = ("127.0.0.1", moved.listeners[LEADER].port)
    values = {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
              "session_id": 0, "session_epoch": -1, "rack_id": "", "topics": [{
                  "topic_id": moved.topic_id, "partitions": [{
                      "partition": 0, "fetch_offset": 0, "current_leader_epoch": -1, "log_start_offset": -1,
                      "partition_max_bytes": 1 << 20}]}]}
    for version in (16, 17):
        for port, want in ((moved.kafka.node(ASKED).port, leader_broker), (moved.listeners[ASKED].port, leader_proxy)):
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                body, _frame = ask(sock, FETCH, version, values)
            (t,) = body.responses
            (p,) = t.partitions
            assert p.error_code == NOT_LEADER_OR_FOLLOWER and p.current_leader.leader_id == LEADER, (version, p)
            assert [(e.node_id, e.host, e.port) for e in body.node_endpoints] == [(LEADER, *want)], (version, port)


def test_a_producer_follows_a_leader_move_through_the_proxies(moved: Moved) -> None:
    """confluent-kafka's idempotent producer (acks=all), the proxies its bootstrap servers, produces to a
    partition (replicas 1 and 3) whose leadership moves from broker 1 to broker 3 between two rounds: each record is
    written once, in order, and every connection it opened (librdkafka's ``broker`` debug lines) went to a proxy."""
    kafka = moved.kafka
    topic = f"proxy-produce-move-{uuid.uuid4().hex[:6]}"
    moved.states.admin.create_topics([NewTopic(topic, 1, replica_assignment=[[LEADER, ASKED]])])[topic].result(30)
    wait_for(lambda: moved.states.leader(topic, 0) == LEADER and len(moved.states.isr(topic, 0)) == 2, 60,
             "the leader and its follower in sync")
    log, lines = librdkafka_log()
    p = Producer({"bootstrap.servers": ",".join(f"127.0.0.1:{li.port}" for li in moved.listeners.values()),
                  "enable.idempotence": True, "acks": "all", "linger.ms": 5, "debug": "broker,protocol",
                  "log_level": 7, "topic.metadata.refresh.interval.ms": 600_000}, logger=log)
    acked: dict[int, bytes] = {}

    def cb(err: Any, msg: Any) -> None:
        assert err is None, err
        acked[msg.offset()] = msg.value()

    def send(tag: str) -> None:
        for i in range(100):
            p.produce(topic, value=f"{tag}-{i}".encode(), partition=0, on_delivery=cb)
        assert p.flush(60) == 0

    send("before")
    reassign(kafka, {(topic, 0): [ASKED, LEADER]}, moved.tmp / "move")
    wait_for(lambda: moved.states.elect(topic, [0]) is not None and moved.states.leader(topic, 0) == ASKED, 60,
             f"broker {ASKED} to lead")
    send("after")
    p.poll(0)
    assert [acked[o] for o in sorted(acked)] == [f"{t}-{i}".encode() for t in ("before", "after") for i in range(100)]
    assert sorted(acked) == list(range(200))
    connected = {int(m.group(1)) for line in lines for m in re.finditer(r"Connecting to ipv4#127\.0\.0\.1:(\d+)",
                                                                           line)}
    brokers = {kafka.node(n).port for n in (1, 2, 3)}
    proxies = {li.port for li in moved.listeners.values()}
    assert connected and connected <= proxies and not connected & brokers, (connected, proxies, brokers)
    print(f"Produce versions {sorted(_produce_versions(lines))}; not-leader answers: "
          f"{sum('Not leader for partition' in line for line in lines)}; connected to {sorted(connected)}")
