"""Cut-through of the broker's Fetch answers through the proxy (:mod:`rlm.listener.upstream.relay`), real broker.

The proxy reaches the broker through a middleman of the test's (:class:`Gate`) that can hold each large answer after
its first bytes, or cut the connection there, or spoil its end. A one-partition answer with records reaches the
client while the rest is held (stored whole before, the client got nothing until the proxy had it all), byte for byte
the broker's own answer to the same request; a connection lost in the middle aborts the client's connection, with
nothing of another answer after the part sent, and so does an answer found malformed once whole; an answer of two
partitions is still stored whole (a later partition's error, for the tier to answer, would come after the first one's
records). The relay alone: fed an answer a few bytes at a time, and writing to a client that has gone.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from prometheus_client import REGISTRY

from devtools.devkafka import KafkaCluster
from rlm.listener import Listener, start_listener
from rlm.listener.protocol.apis import ApiKey
from rlm.listener.protocol.codec import encode_fetch_response, fetch_records_end, new_request
from rlm.listener.protocol.frame import read_header
from rlm.listener.upstream.brokers import _Answers
from rlm.listener.upstream.relay import RELAY_MIN_BYTES, Relay, peer_window
from rlm.sidecar import Sidecar
from tests.rlm.listener.raw_wire import recv_frame
from tests.support.kafka import produce
from tests.support.sidecar import make_settings, only, wait_for

LARGE = 64 * 1024  # answers over this size are the gate's to hold
FIRST = RELAY_MIN_BYTES + 50_000  # the bytes of such an answer the gate passes before holding the rest
RECORDS = 900  # records of ~1 KiB each partition: answers of ~960 KB (held back well past RELAY_MIN_BYTES)
BIG_RECORDS = 15_000  # ~15 MB: ~15 answers of 1 MiB
JAVA_WINDOW = 65536  # the Java consumer's receive.buffer.bytes: a window smaller than an answer paces it


class Gate:
    """A TCP middleman between the proxy and the broker: requests pass as they come; each answer over ``LARGE``
    bytes, while :attr:`hold` is set, passes its first ``FIRST`` bytes, then (:attr:`holding` set) waits for
    :attr:`release` before the rest, or with :attr:`cut` closes both connections instead; with :attr:`mangle` its
    last byte (a v12+ answer's tagged fields' count, 0) says one tagged field follows, and none does."""

    def __init__(self, broker: tuple[str, int]) -> None:
        self.broker = broker
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.hold, self.holding, self.release = threading.Event(), threading.Event(), threading.Event()
        self.cut = self.mangle = False
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            broker = socket.create_connection(self.broker)
            self._socks += [client, broker]
            threading.Thread(target=self._requests, args=(client, broker), daemon=True).start()
            threading.Thread(target=self._answers, args=(broker, client), daemon=True).start()

    @staticmethod
    def _requests(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass

    def _answers(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while (frame := _whole(src)) is not None:
                if len(frame) > LARGE and self.hold.is_set():
                    if self.mangle:
                        frame = frame[:-1] + b"\x01"
                    dst.sendall(frame[:FIRST])
                    self.holding.set()
                    if self.cut:  # shut down: a close alone waits for the other thread's recv on it
                        for sock in (src, dst):
                            sock.shutdown(socket.SHUT_RDWR)
                            sock.close()
                        return
                    self.release.wait(60)
                    frame = frame[FIRST:]
                dst.sendall(frame)
        except OSError:
            pass

    def close(self) -> None:
        self.server.close()
        for s in self._socks:
            s.close()


def _whole(sock: socket.socket) -> bytes | None:
    """One frame, size prefix included, or None at the end."""
    payload = recv_frame(sock)
    return None if payload is None else struct.pack(">i", len(payload)) + payload


@dataclass
class Setup:
    kafka: KafkaCluster
    gate: Gate
    listener: Listener
    topic: str
    topic_id: uuid.UUID
    two: str  # a topic of two partitions, both with records
    big: str  # one partition of BIG_RECORDS: ~1 MiB answers, many

    def proxy(self, window: int | None = JAVA_WINDOW) -> socket.socket:
        """A connection to the proxy; ``window``: its receive buffer (None: the kernel's, autotuned)."""
        sock = socket.socket()
        if window is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, window)
        sock.settimeout(30)
        sock.connect(("127.0.0.1", self.listener.port))
        return sock

    def broker(self) -> socket.socket:
        host, port = self.kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)
        return socket.create_connection((host, int(port)), timeout=30)


@pytest.fixture(scope="module")
def relayed(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    tmp: Path = tmp_path_factory.mktemp("relay")
    tag = uuid.uuid4().hex[:6]
    topic, two = f"relay-{tag}", f"relay-{tag}-two"
    topic_id = uuid.UUID(str(kafka.create_topic(topic, 1)))
    kafka.create_topic(two, 2)
    big = f"relay-{tag}-big"
    kafka.create_topic(big, 1)
    produce(kafka, big, [(f"k{i}".encode(), _big_value(i)) for i in range(BIG_RECORDS)])
    value = b"v" * 1000
    produce(kafka, topic, [(f"k{i}".encode(), value) for i in range(RECORDS)])
    for p in (0, 1):
        produce(kafka, two, [(f"k{i}".encode(), value) for i in range(RECORDS)], partition=p)
    host, port = kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)
    gate = Gate((host, int(port)))
    with ExitStack() as stack:
        stack.callback(gate.close)
        settings = make_settings(kafka, tmp, topics=only(topic), history_listener={
            "host": "127.0.0.1", "port": 0, "proxy": True, "upstream": f"127.0.0.1:{gate.port}",
            "authorization": {"allow_if_no_authorizer": True}})
        sidecar = Sidecar(settings).start()
        stack.callback(sidecar.stop, timeout_s=30)
        listener = start_listener(settings, sidecar.rsm)
        stack.callback(listener.stop)
        yield Setup(kafka, gate, listener, topic, topic_id, two, big)


def _fetch(version: int, topic: str, topic_id: uuid.UUID | None, partitions: list[int], correlation_id: int,
           max_bytes: int = 1 << 20, offset: int = 0) -> tuple[bytes, Any]:
    """A Fetch (no session, no wait) of ``partitions`` from ``offset``, ``max_bytes`` each: its frame and header."""
    frame, _ = new_request(ApiKey.FETCH, version, correlation_id, "t", {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 4 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "topics": [{"topic": topic, "topic_id": topic_id,
                                                                          "partitions": [
            {"partition": p, "fetch_offset": offset, "current_leader_epoch": -1, "log_start_offset": -1,
             "partition_max_bytes": max_bytes} for p in partitions]}]})
    return frame, read_header(frame[4:])


def _big_value(i: int) -> bytes:
    return f"{i:08d}".encode() * 125  # 1000 bytes, its offset's


def test_kafka_java_consumer_reads_every_record_of_relayed_answers_once(relayed: Setup, tmp_path: Path) -> None:
    """Kafka's console consumer (the Java consumer: a 64 KiB receive window, so its answers are relayed) through
    the proxy: every offset once, in order, each value its own."""
    sent = _relayed("sent")
    proc = subprocess.run(relayed.kafka.java_cmd("org.apache.kafka.tools.consumer.ConsoleConsumer", [
        "--bootstrap-server", f"127.0.0.1:{relayed.listener.port}", "--topic", relayed.big, "--partition", "0",
        "--offset", "earliest", "--max-messages", str(BIG_RECORDS), "--timeout-ms", "30000",
        "--formatter-property", "print.offset=true"], heap="512m", log_dir=tmp_path),
        capture_output=True, timeout=150, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    lines = proc.stdout.decode().splitlines()
    assert len(lines) == BIG_RECORDS, (len(lines), lines[-3:])
    for i, line in enumerate(lines):
        offset, _, value = line.partition("\t")
        assert offset == f"Offset:{i}" and value.encode() == _big_value(i), (i, line[:60])
    assert _relayed("sent") > sent  # its answers went through as they came


def test_librdkafka_consumer_reads_every_record_through_the_proxy_once(relayed: Setup) -> None:
    """librdkafka (its window autotuned: answers stored whole, some relayed while the window grows) through the
    proxy: every offset once, in order, each value its own."""
    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{relayed.listener.port}", "group.id": uuid.uuid4().hex,
                         "enable.auto.commit": False, "check.crcs": True})
    try:
        consumer.assign([TopicPartition(relayed.big, 0, 0)])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 120
        while len(got) < BIG_RECORDS and time.monotonic() < deadline:
            for msg in consumer.consume(min(1000, BIG_RECORDS - len(got)), 1.0):
                assert msg.error() is None, msg.error()
                got.append((msg.offset(), msg.value()))
    finally:
        consumer.close()
    assert [o for o, _v in got] == list(range(BIG_RECORDS))
    assert all(v == _big_value(o) for o, v in got)


def _paced(sock: socket.socket, frame: bytes) -> None:
    """Two Fetches on ``sock``, their answers read: with a small window, the client's path has held back the second
    (the first went to a send buffer the listener raises for the next: the transport held its rest)."""
    for _ in range(2):
        sock.sendall(frame)
        assert recv_frame(sock) is not None


def _relayed(result: str) -> float:
    return REGISTRY.get_sample_value("rlm_history_proxy_relayed_answers_total", {"result": result}) or 0.0


def _held(gate: Gate, *, cut: bool = False, mangle: bool = False) -> None:
    gate.holding.clear()
    gate.release.clear()
    gate.cut, gate.mangle = cut, mangle
    gate.hold.set()


def _open(gate: Gate) -> None:
    gate.hold.clear()
    gate.cut = gate.mangle = False
    gate.release.set()


@pytest.mark.parametrize("version", [11, 16])
def test_a_one_partition_answer_reaches_the_client_before_the_proxy_has_it_whole(relayed: Setup,
                                                                                   version: int) -> None:
    gate = relayed.gate
    frame, _header = _fetch(version, relayed.topic, relayed.topic_id, [0], 41)
    with relayed.broker() as direct:
        direct.sendall(frame)
        expected = _whole(direct)
    assert expected is not None and len(expected) > LARGE
    with relayed.proxy() as sock:
        _paced(sock, frame)
        sent = _relayed("sent")
        _held(gate)
        try:
            sock.sendall(frame)
            assert gate.holding.wait(30), "the broker's answer never reached the gate"
            sock.settimeout(10)
            early = sock.recv(1 << 20)  # the rest is held by the gate: only a relay can have sent these
            assert early and expected.startswith(early), len(early)
            assert len(early) <= FIRST
        finally:
            _open(gate)
        sock.settimeout(30)
        rest = b""
        while len(early) + len(rest) < len(expected):
            chunk = sock.recv(1 << 20)
            assert chunk, "connection closed"
            rest += chunk
        assert early + rest == expected  # byte for byte the broker's answer, the client's correlation id
    # counted once the proxy has walked it whole: up to its records' end (all of it before v12) it may be the client's
    # before that
    wait_for(lambda: _relayed("sent") == sent + 1, 10, "the relayed answer counted")


def test_answers_of_changing_sizes_are_the_brokers_byte_for_byte(relayed: Setup) -> None:
    """Relayed or stored whole, in a buffer of their own or one an earlier answer gave back (Upstream.recycle):
    every answer the proxy passes on is the broker's."""
    asks = [(16, [0], 300_000, 0), (11, [0], 100_000, 7), (16, [0], 250_000, 31), (11, [0], 70_000, 0),
            (16, [0], 1 << 20, 3), (11, [0, 1], 200_000, 0), (16, [0], 120_000, 290), (16, [0], 90_000, 5)]
    with relayed.proxy() as proxied, relayed.broker() as direct:
        for i, (version, parts, max_bytes, offset) in enumerate(asks):
            topic = relayed.two if len(parts) > 1 else relayed.topic
            frame, _header = _fetch(version, topic, relayed.topic_id if version >= 13 else None, parts, 100 + i,
                                    max_bytes, offset)
            direct.sendall(frame)
            proxied.sendall(frame)
            assert recv_frame(proxied) == recv_frame(direct), (version, parts, max_bytes, offset)


def test_a_broker_connection_lost_in_the_middle_aborts_the_clients(relayed: Setup) -> None:
    gate = relayed.gate
    frame, _header = _fetch(16, relayed.topic, relayed.topic_id, [0], 43)
    aborted = _relayed("aborted")
    with relayed.proxy() as sock:
        _paced(sock, frame)
        _held(gate, cut=True)
        try:
            sock.sendall(frame)
            assert gate.holding.wait(30)
            sock.settimeout(30)
            got = b""
            while True:
                try:
                    chunk = sock.recv(1 << 20)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                got += chunk
        finally:
            _open(gate)
        size = struct.unpack_from(">i", got)[0]
        assert 0 < len(got) <= FIRST < size  # part of the answer, then the connection ended: never a whole frame
    wait_for(lambda: _relayed("aborted") == aborted + 1, 10, "the aborted relay counted")
    with relayed.proxy() as sock:  # a new connection reads it whole
        sock.sendall(frame)
        answer = recv_frame(sock)
        assert answer is not None and len(answer) > LARGE


def test_an_answer_found_malformed_once_whole_resets_the_clients(relayed: Setup,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A relayed answer whose walk fails once it is whole (the broker's answer malformed: its last tagged-field
    count says one more follows) cannot be taken back: the client's connection is reset, counted aborted and logged
    with the broker and the reason (until session 24 it was closed after the rest of what was queued for it, not
    counted); a new connection reads the answer whole."""
    gate = relayed.gate
    frame, _header = _fetch(16, relayed.topic, relayed.topic_id, [0], 45)
    aborted = _relayed("aborted")
    with relayed.proxy() as sock:
        _paced(sock, frame)
        _held(gate, mangle=True)
        try:
            sock.sendall(frame)
            assert gate.holding.wait(30)
            sock.settimeout(10)
            got = sock.recv(1 << 20)  # relayed while the gate holds the rest
            assert got
        finally:
            _open(gate)
        sock.settimeout(30)
        with pytest.raises(ConnectionResetError):
            while chunk := sock.recv(1 << 20):
                got += chunk
        assert len(got) < struct.unpack_from(">i", got)[0] + 4  # never the whole answer
    wait_for(lambda: _relayed("aborted") == aborted + 1, 10, "the aborted relay counted")
    lines = [r for r in caplog.records if r.name == "rlm.listener.upstream.relay"]
    assert [(r.levelname, r.broker, "truncated" in r.reason) for r in lines] == [  # type: ignore[attr-defined]
        ("WARNING", f"127.0.0.1:{gate.port}", True)]
    with relayed.proxy() as sock:
        sock.sendall(frame)
        answer = recv_frame(sock)
        assert answer is not None and len(answer) > LARGE


def test_an_answer_a_client_takes_at_once_is_stored_whole(relayed: Setup) -> None:
    """A client whose window takes an answer whole (the kernel's autotuning, as librdkafka leaves it) gets no
    relayed answer: its pieces would cost both ends CPU and save nothing."""
    gate = relayed.gate
    frame, _header = _fetch(16, relayed.topic, relayed.topic_id, [0], 49)
    with relayed.proxy(window=None) as sock:
        for _ in range(3):  # the window grows as it reads
            _paced(sock, frame)
        assert recv_frame(_stored_whole(gate, sock, frame)) is not None


def test_an_answer_of_two_partitions_is_stored_whole(relayed: Setup) -> None:
    gate = relayed.gate
    frame, _header = _fetch(11, relayed.two, None, [0, 1], 47)
    with relayed.proxy() as sock:
        _paced(sock, frame)
        answer = recv_frame(_stored_whole(gate, sock, frame))
        assert answer is not None and struct.unpack_from(">i", answer)[0] == 47 and len(answer) > 2 * RECORDS * 1000


def _stored_whole(gate: Gate, sock: socket.socket, frame: bytes) -> socket.socket:
    """``frame`` sent on ``sock`` while the gate holds the broker's answer after its first bytes: nothing reaches the
    client before the answer is whole, none counted as relayed; ``sock``, its answer to be read."""
    sent = _relayed("sent")
    _held(gate)
    try:
        sock.sendall(frame)
        assert gate.holding.wait(30)
        sock.settimeout(1.0)
        with pytest.raises(TimeoutError):
            sock.recv(1)
    finally:
        _open(gate)
    sock.settimeout(30)
    assert _relayed("sent") == sent
    return sock


# ------------------------------------------------------------------------------------------- the parts alone
class _Transport:
    """What a relay writes to: its writes kept."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.aborted = False

    def write(self, data: Any) -> None:
        self.written += data

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted

    def get_extra_info(self, name: str) -> Any:
        return None


def _answer(version: int, records: bytes, partitions: int = 1, correlation_id: int = 5) -> tuple[bytes, Any]:
    """A Fetch answer (size prefix included; our encoding, kio's bytes: test_proxy_fetch_walk) and its request's
    header."""
    frame, _ = new_request(ApiKey.FETCH, version, correlation_id, "t", {"topics": []})
    header = read_header(frame[4:])
    values = {"throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [
        {"topic": "t", "topic_id": uuid.uuid4(), "partitions": [
            {"partition_index": i, "error_code": 0, "high_watermark": 10, "last_stable_offset": 10,
             "log_start_offset": 0, "aborted_transactions": [{"producer_id": 3, "first_offset": 1}],
             "preferred_read_replica": -1, "records": records} for i in range(partitions)]}]}
    return encode_fetch_response(header, values), header


@pytest.mark.parametrize("version", [4, 11, 12, 16, 18])
@pytest.mark.parametrize("chunk", [7, 100, 4096, 1 << 20])
def test_the_relay_sends_the_records_end_as_they_come_and_the_rest_is_the_callers(version: int, chunk: int) -> None:
    async def run() -> None:
        records = bytes(range(256)) * (3 * RELAY_MIN_BYTES // 256 + 5)
        answer, header = _answer(version, records)
        end = fetch_records_end(answer[4:], header)
        assert end is not None and answer[4 + end - len(records):4 + end] == records
        client = header._replace(correlation_id=99)
        transport = _Transport()
        relay = Relay(transport, client)  # type: ignore[arg-type]
        relay.upstream_id = 5
        answers = _Answers(max_response_bytes=1 << 22)
        answers.relay = relay
        pos = 0
        while pos < len(answer):
            buf = answers.get_buffer(-1)
            n = min(chunk, len(buf), len(answer) - pos)
            buf[:n] = answer[pos:pos + n]
            answers.buffer_updated(n)
            pos += n
            # never ahead of what came, never past the records, RELAY_MIN_BYTES at least a write but the last
            assert len(transport.written) <= min(pos, 4 + end)
            assert min(pos, 4 + end) - len(transport.written) < RELAY_MIN_BYTES or chunk > RELAY_MIN_BYTES
        frame = answers.answer()
        assert isinstance(frame, bytearray)
        assert relay.sent == 4 + end == len(transport.written)
        done = relay.finished(frame)
        assert done is not None and len(done) == len(answer)
        whole = bytes(transport.written) + bytes(done.rest())
        assert whole == answer[:4] + struct.pack(">i", 99) + answer[8:]  # the client's correlation id

    asyncio.run(run())


def test_answers_the_relay_must_not_send_early() -> None:
    async def run() -> None:
        large = b"x" * (3 * RELAY_MIN_BYTES)
        cases = [_answer(16, large, partitions=2), _answer(16, b""), _answer(16, large, correlation_id=6),
                 _answer(16, b"x" * (RELAY_MIN_BYTES - 100))]  # two partitions, no records, out of turn, small
        for answer, header in cases:
            relay = Relay(_Transport(), header)  # type: ignore[arg-type]
            relay.upstream_id = 5
            answers = _Answers(max_response_bytes=1 << 22)
            answers.relay = relay
            for at in range(0, len(answer), 5000):  # as it comes: never whole when first seen
                buf = answers.get_buffer(-1)
                n = min(5000, len(answer) - at)
                buf[:n] = answer[at:at + n]
                answers.buffer_updated(n)
            assert relay.sent == 0 and not relay.transport.written  # type: ignore[attr-defined]
            assert relay.finished(bytearray(answer)) is None

    asyncio.run(run())


def test_a_clients_window_smaller_than_an_answer_is_told_apart() -> None:
    """:func:`peer_window` on loopback, the largest seen over five 1 MiB answers read as they come: a 64 KiB
    receive buffer (the Java consumer's) stays under one answer; the kernel's autotuned window grows past it."""
    def reader(sock: socket.socket) -> None:
        while sock.recv(1 << 20):
            pass

    with socket.create_server(("127.0.0.1", 0)) as server:
        largest = {}
        for window in (JAVA_WINDOW, None):
            with socket.socket() as client:
                if window is not None:
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, window)
                client.connect(server.getsockname())
                sender, _ = server.accept()
                with sender:
                    sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 << 20)
                    threading.Thread(target=reader, args=(client,), daemon=True).start()
                    seen = []
                    for _ in range(5):
                        sender.sendall(b"x" * (1 << 20))
                        seen.append(peer_window(sender))
                        time.sleep(0.05)  # read whole before the next
                    assert all(w is not None for w in seen), seen
                    largest[window] = max(w for w in seen if w is not None)
        assert largest[JAVA_WINDOW] < RELAY_MIN_BYTES < 1 << 20 < largest[None], largest
    assert peer_window(None) is None


def test_an_aborted_relay_closes_the_client_only_once_part_went() -> None:
    answer, header = _answer(16, b"x" * (2 * RELAY_MIN_BYTES))
    relay = Relay(_Transport(), header)  # type: ignore[arg-type]
    relay.upstream_id = 5
    relay.advance(bytearray(answer), RELAY_MIN_BYTES - 1)  # what came is sent once RELAY_MIN_BYTES have
    relay.abort("test", "127.0.0.1:9092")
    assert relay.sent == 0 and not relay.transport.aborted  # type: ignore[attr-defined]
    relay.advance(bytearray(answer), RELAY_MIN_BYTES + 100)
    assert relay.sent == RELAY_MIN_BYTES + 100
    aborted, closed = _relayed("aborted"), _relayed("closed")
    relay.abort("test", "127.0.0.1:9092")
    assert relay.transport.aborted  # type: ignore[attr-defined]
    relay.abort("test", "127.0.0.1:9092")  # the client's connection closed already: not aborted again, nor counted so
    assert (_relayed("aborted"), _relayed("closed")) == (aborted + 1, closed + 1)


def test_a_client_gone_mid_relay_is_written_no_more(caplog: pytest.LogCaptureFixture) -> None:
    """The client resets its connection after the first piece of its answer went: the relay writes to its transport
    no more (asyncio logs "socket.send() raised exception." at each write to a lost connection from the fifth on:
    at 6 of the 10 here until session 24), and the answer is counted closed, not sent."""
    async def run() -> None:
        accepted: asyncio.Queue[asyncio.StreamWriter] = asyncio.Queue()

        async def serve(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await accepted.put(writer)

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        client = socket.create_connection(server.sockets[0].getsockname()[:2])
        writer = await accepted.get()
        answer, header = _answer(16, b"x" * (10 * RELAY_MIN_BYTES))
        relay = Relay(writer.transport, header)  # type: ignore[arg-type]
        relay.upstream_id = 5
        frame = bytearray(answer)
        relay.advance(frame, RELAY_MIN_BYTES)
        assert relay.sent == RELAY_MIN_BYTES
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset
        await asyncio.sleep(0.1)
        assert writer.transport.is_closing()  # the premise: asyncio has seen it
        for have in [*range(2 * RELAY_MIN_BYTES, len(frame), RELAY_MIN_BYTES), len(frame)]:
            relay.advance(frame, have)
            await asyncio.sleep(0)
        assert relay.sent == RELAY_MIN_BYTES
        closed, sent = _relayed("closed"), _relayed("sent")
        done = relay.finished(frame)
        assert done is not None and (_relayed("closed"), _relayed("sent")) == (closed + 1, sent)
        writer.close()
        server.close()
        await server.wait_closed()

    caplog.set_level(logging.WARNING, logger="asyncio")
    asyncio.run(run())
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []
