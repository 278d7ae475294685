"""The history endpoint against hostile and careless clients (issue 22), over the network, against the real server.

An in-process sidecar tiers two small topics once (module fixture) on the session broker; each test starts the
endpoint with the settings it needs on a free port of 127.0.0.1 and talks to it with raw sockets (kio encodes and
decodes the messages), since the requests tried here are ones a client library would not send. Every assertion is
on behaviour: an answer with an error code, a closed connection, a partition error, what the store was asked to
read. Self-contained: nothing from ``tests/rlm/listener/conftest.py``.

Topics (``hard-<tag>-<what>``): ``a``, 2 partitions of 3 segments each (batches of 10 records of 1 KB: about 10 KB
per batch, 64 KiB blocks); ``b``, 1 partition of 2 segments, made unreadable by the test that needs it.
"""

from __future__ import annotations

import contextlib
import io
import logging
import socket
import struct
import threading
import time
import typing
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from devtools.devkafka import KafkaCluster
from rlm.config import HistoryListenerSettings, SidecarSettings
from rlm.listener import Listener, start_listener
from rlm.listener.protocol.apis import API_NAMES
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.rlm.listener.raw_wire import call, closed, kstr, recv_frame, request
from tests.support.kafka import produce
from tests.support.sidecar import latest_remote, make_settings, produce_segments, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

USERS = {"alice": f"alice-{uuid.uuid4().hex}"}
SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS = 17, 36, 18
UNSUPPORTED_VERSION = 35


@dataclass
class Tiered:
    kafka: KafkaCluster
    settings: SidecarSettings
    sidecar: Sidecar
    tag: str
    sent: dict[tuple[str, int], dict[int, tuple[bytes, bytes]]]  # (topic, partition) -> offset -> (key, value)

    def topic(self, what: str) -> str:
        return f"hard-{self.tag}-{what}"


@pytest.fixture(scope="module")
def tiered(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiered]:
    tmp = tmp_path_factory.mktemp("history-hardening")
    tag = uuid.uuid4().hex[:6]
    layout = {"a": (2, 3), "b": (1, 2)}  # what -> (partitions, segments per partition)
    ids = {what: kafka.create_topic(f"hard-{tag}-{what}", n, config={"segment.ms": "300"})
           for what, (n, _segs) in layout.items()}
    sent: dict[tuple[str, int], dict[int, tuple[bytes, bytes]]] = {}
    for what, (n, segs) in layout.items():
        for p in range(n):
            sent[(f"hard-{tag}-{what}", p)] = produce_segments(
                kafka, f"hard-{tag}-{what}", rounds=segs, per_round=60, value_size=1000, segment_ms=300,
                partition=p, roll=False, **{"batch.num.messages": 10})
            produce(kafka, f"hard-{tag}-{what}", [(b"__roll__", b"r")], partition=p)  # rolls the last round's
    settings = make_settings(kafka, tmp, topics={"include": [f"hard-{tag}-.*"]})
    sidecar = Sidecar(settings).start()
    try:
        for (topic, p), recs in sent.items():
            tp, end = TopicIdPartition(ids[topic.rsplit("-", 1)[1]], topic, p), max(recs)
            wait_for(lambda tp=tp, end=end: latest_remote(sidecar, tp) >= end, 60, f"{tp} to be tiered")
        yield Tiered(kafka, settings, sidecar, tag, sent)
    finally:
        sidecar.stop()


@contextmanager
def endpoint(t: Tiered, rsm: Any = None, **listener: Any) -> Iterator[Listener]:
    """The history endpoint of the tiered topics with these ``history_listener`` settings, on a free port."""
    # The test cluster has no authorizer: its topics are open to every client, as the cluster's own listeners.
    cfg = HistoryListenerSettings(**{"port": 0, "fetch_poll_ms": 50,
                                     "authorization": {"allow_if_no_authorizer": True}, **listener})
    history = start_listener(t.settings.model_copy(update={"history_listener": cfg}), rsm or t.sidecar.rsm)
    try:
        wait_for(lambda: all(t.topic(w) in history.catalog.topics() for w in ("a", "b")), 30, "the topics served")
        yield history
    finally:
        history.stop()


# ------------------------------------------------------------------------------------- raw protocol helpers
def connect(h: Listener) -> socket.socket:
    return socket.create_connection(("127.0.0.1", h.port), timeout=20)


def api_versions_ok(h: Listener) -> bool:
    with connect(h) as s:
        resp = call(s, API_VERSIONS, 0, {})
        return resp is not None and resp.error_code == 0


def no_traceback(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The log records at ERROR or with a traceback (none expected)."""
    return [f"{r.levelname} {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


# ------------------------------------------------------------------------------------------ r2: SASL states
def test_sasl_handshake_unsupported_version_is_answered(tiered: Tiered, caplog: pytest.LogCaptureFixture,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """SaslHandshake at a version not offered (v2, v3, v32767), before authentication: UNSUPPORTED_VERSION with
    the enabled mechanisms, then the connection closes; nothing is logged at ERROR, no traceback. A bug in the
    SASL path before authentication (injected here) closes the connection with a WARNING line, no traceback."""
    caplog.set_level(logging.INFO)
    with endpoint(tiered, sasl={"mechanisms": ["SCRAM-SHA-512"], "users": USERS}) as h:
        for version in (2, 3, 32767):
            with connect(h) as s:
                s.sendall(request(SASL_HANDSHAKE, version, kstr("SCRAM-SHA-512"), correlation_id=version))
                frame = recv_frame(s)
                assert frame is not None, f"v{version}: closed without an answer"
                correlation_id, error_code = struct.unpack_from(">ih", frame)
                assert (correlation_id, error_code) == (version, UNSUPPORTED_VERSION)
                (n,) = struct.unpack_from(">i", frame, 6)
                assert n == 1 and frame[10:12] == struct.pack(">h", 13) and frame[12:25] == b"SCRAM-SHA-512"
                assert closed(s)
        assert no_traceback(caplog) == []

        from rlm.listener.net.sasl import SaslSession

        def broken(*_args: Any) -> bytes:
            raise RuntimeError("injected bug in the SASL handshake")

        monkeypatch.setattr(SaslSession, "_handshake", broken)
        with connect(h) as s:
            s.sendall(request(SASL_HANDSHAKE, 1, kstr("SCRAM-SHA-512")))
            assert recv_frame(s) is None
        assert no_traceback(caplog) == []
        assert "request before authentication failed" in caplog.text
        assert api_versions_ok(h)  # still serving


# ---------------------------------------------------------------------------------------- r3: SCRAM names
SCRAM_USERS = {"a,b": f"comma-{uuid.uuid4().hex}", "a=2Cb": f"escaped-{uuid.uuid4().hex}",
               "x=3Dy": f"equals-{uuid.uuid4().hex}", "p=q": f"eq-{uuid.uuid4().hex}"}


def scram_login(h: Listener, user: str, password: str) -> socket.socket | None:
    """A SCRAM-SHA-512 exchange over SaslHandshake v1 / SaslAuthenticate v1 by scramp's client (it escapes the
    name as RFC 5802 says, as Kafka's clients do); the authenticated socket, or None when refused."""
    from scramp import ScramClient

    s = connect(h)
    assert call(s, SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"}).error_code == 0
    client = ScramClient(["SCRAM-SHA-512"], user, password)
    first = call(s, SASL_AUTHENTICATE, 1, {"auth_bytes": client.get_client_first().encode()})
    if first is not None and first.error_code == 0:
        client.set_server_first(bytes(first.auth_bytes).decode())
        final = call(s, SASL_AUTHENTICATE, 1, {"auth_bytes": client.get_client_final().encode()})
        if final is not None and final.error_code == 0:
            client.set_server_final(bytes(final.auth_bytes).decode())
            return s
    s.close()
    return None


def test_scram_names_are_unescaped_once(tiered: Tiered, caplog: pytest.LogCaptureFixture) -> None:
    """User names holding ',' or '=' (sent escaped as =2C / =3D) log in with their own password and are the
    principal; a name that holds the escape itself (``a=2Cb``) is another user: ``a,b``'s password does not log
    it in, its own does."""
    caplog.set_level(logging.INFO, logger="rlm.listener.net.sasl")
    with endpoint(tiered, sasl={"mechanisms": ["SCRAM-SHA-512"], "users": SCRAM_USERS}) as h:
        for user, password in SCRAM_USERS.items():
            caplog.clear()
            s = scram_login(h, user, password)
            assert s is not None, f"{user!r} refused with its own password"
            with s:
                meta = call(s, 3, 1, {"topics": None})
                assert meta is not None and tiered.topic("a") in {t.name for t in meta.topics}
            principals = [r.user for r in caplog.records if r.getMessage() == "history endpoint: client authenticated"]
            assert principals == [user]
        # The password of 'a,b' is not the password of 'a=2Cb', nor the reverse; 'x=y' is not 'x=3Dy'.
        assert scram_login(h, "a=2Cb", SCRAM_USERS["a,b"]) is None
        assert scram_login(h, "a,b", SCRAM_USERS["a=2Cb"]) is None
        assert scram_login(h, "x=y", SCRAM_USERS["x=3Dy"]) is None
        # A Kafka client (librdkafka) escapes the same way: 'a=2Cb' reads with its own password.
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": f"127.0.0.1:{h.port}", "group.id": "g", "enable.auto.commit": False,
                      "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                      "sasl.username": "a=2Cb", "sasl.password": SCRAM_USERS["a=2Cb"]})
        try:
            c.assign([TopicPartition(tiered.topic("b"), 0, 0)])
            msgs: list[Any] = []
            for _ in range(40):
                msgs += [m for m in c.consume(100, 0.5) if m.error() is None]
                if msgs:
                    break
            assert msgs, "librdkafka as 'a=2Cb' read nothing"
        finally:
            c.close()


# --------------------------------------------------------------------------------------- r1: metric labels
def test_metric_labels_are_a_closed_set(tiered: Tiered) -> None:
    """Requests of 5,000 api keys the endpoint does not know (and unknown versions of known ones) are each answered
    UNSUPPORTED_VERSION on an open connection, and label no metric with the key: the ``api`` label of every history
    metric is a known API's name or ``other``."""
    from prometheus_client import REGISTRY

    unknown = list(range(1000, 6000)) + [-1, -32768, 32767]
    with endpoint(tiered) as h, connect(h) as s:
        for i, key in enumerate(unknown):
            s.sendall(request(key, i % 7, b"\0" * (i % 5), correlation_id=i))
            frame = recv_frame(s)
            assert frame is not None and struct.unpack_from(">ih", frame) == (i, UNSUPPORTED_VERSION), key
        s.sendall(request(1, 999, b"", correlation_id=5))  # Fetch at a version nobody has
        frame = recv_frame(s)
        assert frame is not None and struct.unpack_from(">ih", frame) == (5, UNSUPPORTED_VERSION)
    allowed = {*API_NAMES.values(), "other"}  # Kafka's client API names: a closed set, whatever ran before
    labels = {(m.name, sample.labels["api"]) for m in REGISTRY.collect() if m.name.startswith("rlm_history_")
              for sample in m.samples if "api" in sample.labels}
    assert {name for name, api in labels if api == "other"}, "the unknown keys were not counted at all"
    assert sorted((name, api) for name, api in labels if api not in allowed) == []


# ------------------------------------------------------------------------------------ r5: Fetch's byte bounds
class CountingRsm:
    """The sidecar's storage manager, recording every read of record batches (``SegmentHandle.batches``: the
    ranged GET of blocks, and their decryption for an encrypted copy) as (topic, partition, first_block)."""

    def __init__(self, rsm: Any) -> None:
        self._rsm = rsm
        self.reads: list[tuple[str, int, int | None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._rsm, name)

    def open_segment(self, md: Any) -> Any:
        return _CountingSegment(self._rsm.open_segment(md), self, md)


class _CountingSegment:
    def __init__(self, seg: Any, owner: CountingRsm, md: Any) -> None:
        self._seg, self._owner, self._md = seg, owner, md

    def __getattr__(self, name: str) -> Any:
        return getattr(self._seg, name)

    def batches(self, *args: Any, **kwargs: Any) -> Any:
        self._owner.reads.append((self._md.topic_name, self._md.partition, kwargs.get("first_block")))
        return self._seg.batches(*args, **kwargs)


def fetch_v4(sock: socket.socket, max_bytes: int, parts: list[tuple[str, int, int, int]]) -> Any:
    """Fetch v4 (max_wait 0, min_bytes 0) of ``(topic, partition, fetch_offset, partition_max_bytes)`` entries as
    given: one topic entry per run of the same topic, duplicates kept."""
    topics: list[dict[str, Any]] = []
    for topic, partition, offset, pmb in parts:
        if not topics or topics[-1]["topic"] != topic:
            topics.append({"topic": topic, "partitions": []})
        topics[-1]["partitions"].append({"partition": partition, "fetch_offset": offset, "log_start_offset": -1,
                                         "partition_max_bytes": pmb})
    return call(sock, 1, 4, {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes,
                             "isolation_level": 0, "topics": topics})


def answered(resp: Any) -> dict[tuple[str, int], list[Any]]:
    """(topic, partition) -> every partition entry of a Fetch response for it."""
    out: dict[tuple[str, int], list[Any]] = {}
    for t in resp.responses:
        for p in t.partitions:
            out.setdefault((t.topic, p.partition_index), []).append(p)
    return out


def base_offsets(records: bytes | None) -> list[int]:
    """The base offset of each record batch in ``records`` (whole batches only)."""
    out, pos, data = [], 0, bytes(records or b"")
    while pos + 12 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        out.append(base)
        pos += 12 + length
    return out


def test_fetch_partitions_are_a_map_and_one_capped_budget(tiered: Tiered) -> None:
    """A partition listed several times is read and answered once, from its last entry; the answer holds at most
    ``fetch_max_bytes`` whatever the client asks (2 GiB here), spent across the partitions; a partition reached with
    no budget left, or with less than a batch header of it, is answered with its bounds and read from nowhere."""
    a, b = tiered.topic("a"), tiered.topic("b")
    end = {k: max(v) + 1 for k, v in tiered.sent.items()}  # the tier's end: the last record produced + 1
    rsm = CountingRsm(tiered.sidecar.rsm)
    cap = 32 * 1024  # about three batches of 10 KB
    with endpoint(tiered, rsm=rsm, fetch_max_bytes=cap) as h, connect(h) as s:
        # warm the tier's bounds: the reads counted below are those of the Fetches
        fetch_v4(s, 1, [(a, 0, 0, 0), (a, 1, 0, 0), (b, 0, 0, 0)])

        # Duplicates: 51 entries of a-0; the last one (offset 50) is the one answered, once, read as if alone.
        rsm.reads.clear()
        alone = answered(fetch_v4(s, 2**31 - 1, [(a, 0, 50, 2**31 - 1)]))[(a, 0)][0]
        reads_alone, _ = list(rsm.reads), rsm.reads.clear()
        resp = fetch_v4(s, 2**31 - 1, [(a, 0, off, 2**31 - 1) for off in [*range(0, 49), 30, 50]])
        got = answered(resp)
        assert list(got) == [(a, 0)] and len(got[(a, 0)]) == 1, {k: len(v) for k, v in got.items()}
        assert base_offsets(got[(a, 0)][0].records)[0] == 50 and got[(a, 0)][0].records == alone.records
        assert rsm.reads == reads_alone

        # 2 GiB asked, per partition too: the answer stays within the server's cap, spent across the partitions.
        # A partition whose next batch turned out larger than the room left is not read again for the same ask.
        asks = [(a, 0, 0, 2**31 - 1), (a, 1, 0, 2**31 - 1), (b, 0, 0, 2**31 - 1)]
        fetch_v4(s, 2**31 - 1, asks)
        rsm.reads.clear()
        got = answered(fetch_v4(s, 2**31 - 1, asks))
        sizes = {k: len(v[0].records or b"") for k, v in got.items()}
        assert 0 < sum(sizes.values()) <= cap, sizes
        assert sizes[(b, 0)] == 0 and got[(b, 0)][0].high_watermark == end[(b, 0)]
        assert {(t, p) for t, p, _blk in rsm.reads} == {k for k, n in sizes.items() if n}, (rsm.reads, sizes)

        # No budget left after the first partition (max_bytes 1: its first batch only): the others are not read.
        rsm.reads.clear()
        resp = fetch_v4(s, 1, [(a, 0, 0, 2**31 - 1), (a, 1, 0, 2**31 - 1), (b, 0, 0, 2**31 - 1)])
        got = answered(resp)
        assert len(base_offsets(got[(a, 0)][0].records)) == 1
        for k in ((a, 1), (b, 0)):
            part = got[k][0]
            assert (part.error_code, part.records or b"", part.high_watermark) == (0, b"", end[k]), k
        assert [(t, p) for t, p, _blk in rsm.reads] == [(a, 0)], rsm.reads

        # A partition whose own budget is below a batch header (60 bytes) is not read either.
        rsm.reads.clear()
        resp = fetch_v4(s, 2**20, [(a, 0, 0, 2**20), (a, 1, 0, 60), (b, 0, 0, 0)])
        got = answered(resp)
        assert got[(a, 0)][0].records and not got[(a, 1)][0].records and not got[(b, 0)][0].records
        assert {(t, p) for t, p, _blk in rsm.reads} == {(a, 0)}, rsm.reads
        assert api_versions_ok(h)


# ------------------------------------------------------------------------- r7: one unreadable copy, one partition
KAFKA_STORAGE_ERROR = 56


def test_an_unreadable_copy_is_that_partitions_error(tiered: Tiered, caplog: pytest.LogCaptureFixture) -> None:
    """Every copy of b-0 corrupted (its index objects): Metadata still answers for every topic (b-0 listed), a
    Fetch of a-0 and b-0 gives a-0 its records and b-0 KAFKA_STORAGE_ERROR, ListOffsets the same; the copy is
    logged once (with its key and the reason) however often it is asked for, and every such answer is counted."""
    from prometheus_client import REGISTRY

    from rsm.manager import RemoteStorageManager

    a, b = tiered.topic("a"), tiered.topic("b")
    root = tiered.settings.store.root_path
    indexes = sorted(root.rglob(f"{b}-*/0/*-index"))
    assert indexes, f"no index object of {b} under {root}"
    saved = {p: p.read_bytes() for p in indexes}

    def count(api: str) -> float:
        return REGISTRY.get_sample_value("rlm_history_unreadable_copies_total", {"api": api}) or 0.0

    rsm = RemoteStorageManager(tiered.settings.store)  # no cache of the copies as they were
    caplog.set_level(logging.INFO)
    try:
        for p, data in saved.items():
            p.write_bytes(data[:16] + bytes(x ^ 0xFF for x in data[16:]))
        before = count("fetch")
        with endpoint(tiered, rsm=rsm) as h, connect(h) as s:
            meta = call(s, 3, 1, {"topics": None})
            assert meta is not None, "Metadata went unanswered"
            listed = {t.name: t for t in meta.topics}
            assert listed[a].error_code == 0 and listed[b].error_code == 0
            assert [p.partition_index for p in listed[b].partitions] == [0]
            for _ in range(3):
                got = answered(fetch_v4(s, 2**20, [(a, 0, 0, 2**20), (b, 0, 0, 2**20)]))
                assert got[(a, 0)][0].error_code == 0 and base_offsets(got[(a, 0)][0].records)[0] == 0
                assert got[(b, 0)][0].error_code == KAFKA_STORAGE_ERROR and not got[(b, 0)][0].records
            offsets = call(s, 2, 1, {"replica_id": -1, "topics": [
                {"name": a, "partitions": [{"partition_index": 0, "timestamp": -2}]},
                {"name": b, "partitions": [{"partition_index": 0, "timestamp": -2}]}]})
            by_topic = {t.name: t.partitions[0] for t in offsets.topics}
            assert (by_topic[a].error_code, by_topic[a].offset) == (0, 0)
            assert by_topic[b].error_code == KAFKA_STORAGE_ERROR
            assert api_versions_ok(h)
    finally:
        for p, data in saved.items():
            p.write_bytes(data)
        rsm.close()
    assert count("fetch") == before + 3
    logged = [r for r in caplog.records if "remote copy cannot be read" in r.getMessage()]
    assert len(logged) == 1, [r.getMessage() for r in logged]
    assert logged[0].key and b in logged[0].key and logged[0].reason and not logged[0].exc_info
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []


# ------------------------------------------------------------------------------ r6: connections and deadlines
def answered_api_versions(s: socket.socket) -> bool:
    try:
        resp = call(s, API_VERSIONS, 0, {})
    except (ConnectionError, TimeoutError):
        return False
    return resp is not None and resp.error_code == 0


@pytest.mark.parametrize("limit", ["max_connections", "max_connections_per_ip"])
def test_connection_limits(tiered: Tiered, limit: str) -> None:
    """500 connections (unauthenticated, from one address) against a limit of 50: 50 are served, every other one is
    closed at once; once one of the 50 closes, a new connection is served."""
    other = "max_connections_per_ip" if limit == "max_connections" else "max_connections"
    with endpoint(tiered, **{limit: 50, other: 1000}) as h:
        socks = [connect(h) for _ in range(500)]
        try:
            served = [s for s in socks if answered_api_versions(s)]
            assert len(served) == 50
            assert all(closed(s) for s in socks if s not in served)
            served[0].close()
            wait_for(lambda: api_versions_ok(h), 20, "a connection to be served once one closed")
        finally:
            for s in socks:
                s.close()


def test_idle_connections_and_partial_frames_are_closed(tiered: Tiered) -> None:
    """``connections_max_idle_ms``: a connection that sends nothing, one that sends part of a frame and stops, and
    one that does not read its answers are closed; one that keeps sending requests is served throughout."""
    with endpoint(tiered, connections_max_idle_ms=500, connection_failed_authentication_delay_ms=0) as h:
        with connect(h) as silent, connect(h) as partial:
            partial.sendall(struct.pack(">i", 100) + b"\0" * 10)
            assert closed(silent) and closed(partial)  # the sockets' timeout is 20 s: the server closed them
        with connect(h) as busy:
            for _ in range(8):  # 0.1 s apart, 0.8 s in all: past the idle limit, never idle for it
                assert answered_api_versions(busy)
                time.sleep(0.1)
        # A client that asks for answers (Fetches of about 60 KB) and never reads them: once they no longer fit the
        # socket buffers, the server waits for the client to take them no longer than the idle limit, then closes.
        from prometheus_client import REGISTRY

        def not_reading() -> float:
            return REGISTRY.get_sample_value("rlm_history_closed_connections_total", {"reason": "not_reading"}) or 0

        before = not_reading()
        a = tiered.topic("a")
        deaf = socket.socket()
        deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        deaf.settimeout(20)
        with deaf:
            deaf.connect(("127.0.0.1", h.port))
            ask = request(1, 4, _fetch_body(a, 0, max_wait_ms=0))
            try:
                for _ in range(400):
                    deaf.sendall(ask)
            except (ConnectionError, TimeoutError):
                pass  # the server closed it while it was still sending
            wait_for(lambda: not_reading() > before, 30, "the server to close a client that does not read")
        assert api_versions_ok(h)


def test_authentication_deadline(tiered: Tiered) -> None:
    """With SASL, a connection that keeps sending ApiVersions but never authenticates is closed at
    ``authentication_timeout_ms``; an authenticated one is not."""
    sasl = {"mechanisms": ["SCRAM-SHA-512"], "users": SCRAM_USERS}
    with endpoint(tiered, sasl=sasl, authentication_timeout_ms=1000) as h:
        authenticated = scram_login(h, "a,b", SCRAM_USERS["a,b"])
        assert authenticated is not None
        with authenticated, connect(h) as stranger:
            for _ in range(200):  # 0.1 s apart: closed after about 1 s
                if not answered_api_versions(stranger):
                    break
                time.sleep(0.1)
            else:
                pytest.fail("an unauthenticated connection was served for 20 s")
            assert closed(stranger)
            meta = call(authenticated, 3, 1, {"topics": None})  # past the deadline, authenticated: served
            assert meta is not None and meta.topics


def test_failed_authentication_is_answered_after_a_delay(tiered: Tiered) -> None:
    """A wrong password gets SASL_AUTHENTICATION_FAILED only after ``connection_failed_authentication_delay_ms``
    (5 s here: nothing comes in the first second), then the connection closes."""
    import select

    sasl = {"mechanisms": ["PLAIN"], "users": USERS}
    with endpoint(tiered, sasl=sasl, connection_failed_authentication_delay_ms=5000) as h, connect(h) as s:
        assert call(s, SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == 0
        s.sendall(request(SASL_AUTHENTICATE, 1, struct.pack(">i", 14) + b"\0alice\0wrong-pw", correlation_id=9))
        readable, _w, _x = select.select([s], [], [], 1.0)
        assert readable == [], "the failure was answered without the delay"
        frame = recv_frame(s)
        assert frame is not None and struct.unpack_from(">ih", frame) == (9, 58)  # SASL_AUTHENTICATION_FAILED
        assert closed(s)


# -------------------------------------------------------------------------- r4: long polls, capped and dropped
def test_fetch_wait_is_capped_and_abandoned_polls_end(tiered: Tiered) -> None:
    """A Fetch at the tier's end asking to wait 24.8 days is answered (empty) after ``fetch_max_wait_ms``; 50
    clients that start a long poll and leave end their polls with their connections (none is left waiting, and
    the tier is no longer polled for them) while another client's ListOffsets is answered."""
    from prometheus_client import REGISTRY

    a = tiered.topic("a")
    end = max(tiered.sent[(a, 0)]) + 1
    with endpoint(tiered) as h, connect(h) as s:
        got = answered(call(s, 1, 4, {"replica_id": -1, "max_wait": 2**31 - 1, "min_bytes": 1, "max_bytes": 2**20,
                                      "isolation_level": 0, "topics": [{"topic": a, "partitions": [
                                          {"partition": 0, "fetch_offset": end, "partition_max_bytes": 2**20}]}]}))
        assert got[(a, 0)][0].error_code == 0 and not got[(a, 0)][0].records

    def waiting() -> float | None:
        return REGISTRY.get_sample_value("rlm_history_waiting_fetches")

    with endpoint(tiered, fetch_max_wait_ms=300_000) as h:
        runs = []
        fetch = h.server.router.fetch  # counted: the tier reads
        h.server.router.fetch = lambda req, *a, **kw: (runs.append(1), fetch(req, *a, **kw))[1]
        poll = request(1, 4, _fetch_body(a, end, max_wait_ms=300_000))
        clients = [connect(h) for _ in range(50)]
        for c in clients:
            c.sendall(poll)
        wait_for(lambda: waiting() == 50, 20, "50 long polls waiting")
        with connect(h) as other:
            offsets = call(other, 2, 1, {"replica_id": -1, "topics": [
                {"name": a, "partitions": [{"partition_index": 0, "timestamp": -1}]}]})
            assert offsets.topics[0].partitions[0].offset == end
        for c in clients:
            c.close()
        wait_for(lambda: waiting() == 0, 20, "the abandoned long polls to end")
        before = len(runs)
        time.sleep(0.5)  # ten poll intervals (50 ms): a poll still running would read the tier again
        assert len(runs) == before
        assert api_versions_ok(h)


def test_long_polls_are_rechecked_together_and_answered_when_the_tier_grows(tiered: Tiered) -> None:
    """200 Fetches wait at the end of a partition's tier (each is one pending object): while nothing new is tiered
    no fetch runs for them, and each tick of the long-poll ticker reads the tier of the one partition they wait on
    once for all of them (one refresh per tick, naming that partition alone), not once per poll. The 100 whose
    clients leave are dropped (no longer waiting, never re-run). When the sidecar tiers a new segment of the
    partition, each of the 100 others is re-run once and answered with the new records."""
    from kio.index import load_response_schema
    from prometheus_client import REGISTRY

    grow = tiered.topic("grow")
    tid = tiered.kafka.create_topic(grow, 1, config={"segment.ms": "300"})
    tp = TopicIdPartition(tid, grow, 0)
    first = produce_segments(tiered.kafka, grow, rounds=1, per_round=20, value_size=100, segment_ms=300)
    wait_for(lambda: latest_remote(tiered.sidecar, tp) >= max(first), 60, f"{tp} to be tiered")
    end = max(first) + 1

    def waiting() -> float | None:
        return REGISTRY.get_sample_value("rlm_history_waiting_fetches")

    def ticks() -> float:
        return REGISTRY.get_sample_value("rlm_history_long_poll_ticks_total") or 0.0

    with endpoint(tiered, fetch_max_wait_ms=300_000, max_connections_per_ip=400) as h:
        wait_for(lambda: grow in h.catalog.topics(), 30, "the new topic served")
        router = h.server.router
        runs: list[int] = []
        refreshes: list[set[Any]] = []
        fetch, refresh = router.fetch, router.ctx.tier.refresh
        router.fetch = lambda req, *a, **kw: (runs.append(1), fetch(req, *a, **kw))[1]
        router.ctx.tier.refresh = lambda tps: (refreshes.append(set(tps)), refresh(tps))[1]
        poll = request(1, 4, _fetch_body(grow, end, max_wait_ms=300_000))
        clients = [connect(h) for _ in range(200)]
        for c in clients:
            c.sendall(poll)
        wait_for(lambda: waiting() == 200, 30, "200 long polls waiting")
        leaving, staying = clients[:100], clients[100:]
        for c in leaving:
            c.close()
        wait_for(lambda: waiting() == 100, 20, "the abandoned long polls to be dropped")

        # Nothing new tiered: the ticks read the partition's bounds, once each, and run no fetch.
        runs_before, refreshes_before, ticks_before = len(runs), len(refreshes), ticks()
        wait_for(lambda: len(refreshes) >= refreshes_before + 5, 20, "five ticks")
        assert len(runs) == runs_before, "a waiting poll re-ran its fetch with nothing new tiered"
        window = refreshes[refreshes_before:]
        assert all(tps == {tp} for tps in window), window
        assert len(window) <= ticks() - ticks_before + 1, "more than one tier refresh per tick"

        # A segment is tiered: each remaining poll is re-run once and answered with it.
        more = produce_segments(tiered.kafka, grow, rounds=1, per_round=20, value_size=100, segment_ms=300)
        assert min(more) == end + 1  # after the roll record at `end`
        wait_for(lambda: latest_remote(tiered.sidecar, tp) >= max(more), 60, f"{tp}'s new segment to be tiered")
        reader = entity_reader(load_response_schema(1, 4))
        for c in staying:
            frame = recv_frame(c)
            assert frame is not None, "a waiting poll was not answered when its partition grew"
            resp, _ = reader(frame, 4)
            got = answered(resp)[(grow, 0)][0]
            assert got.error_code == 0 and base_offsets(got.records)[0] == end
        assert len(runs) == runs_before + 100
        assert waiting() == 0
        for c in staying:
            c.close()
        assert api_versions_ok(h)


def _fetch_body(topic: str, offset: int, *, max_wait_ms: int) -> bytes:
    from rlm.listener.protocol.codec import build

    out = io.BytesIO()
    entity = build(load_request_schema(1, 4), {
        "replica_id": -1, "max_wait": max_wait_ms, "min_bytes": 1, "max_bytes": 2**20, "isolation_level": 0,
        "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": offset,
                                                    "partition_max_bytes": 2**20}]}]})
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


# ----------------------------------------------------------------------------------------- request size bound
def test_request_size_is_bounded_by_socket_request_max_bytes(tiered: Tiered) -> None:
    """``socket_request_max_bytes`` (Kafka's ``socket.request.max.bytes``): a request frame of exactly the bound is
    read and answered (a Metadata request padded with bytes after its body, which are ignored); one byte more
    closes the connection without reading it or answering. Other connections are served."""
    bound = 64 * 1024
    meta = request(3, 1, struct.pack(">i", -1))  # Metadata v1, every topic
    padded = meta[4:] + b"\0" * (bound - len(meta) + 4)
    with endpoint(tiered, socket_request_max_bytes=bound) as h:
        with connect(h) as s:
            s.sendall(struct.pack(">i", len(padded)) + padded)
            frame = recv_frame(s)
            assert frame is not None and struct.unpack_from(">i", frame)[0] == 7
        with connect(h) as s:
            s.sendall(struct.pack(">i", bound + 1) + padded[:4096])  # the size alone decides: the rest never sent
            assert recv_frame(s) is None
        assert api_versions_ok(h)


# ------------------------------------------------------------------- require_encrypted once encryption is enabled
def test_plain_copies_are_refused_once_encryption_is_enabled(tiered: Tiered, tmp_path: Any,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """The tiered copies are plain, as copies made before encryption was enabled (or a plain object put in place of
    an encrypted copy) are. Served by a storage manager with ``store.encryption.enabled`` and ``require_encrypted``
    left to its default, a Fetch of a-0 gets KAFKA_STORAGE_ERROR, and the copy is logged by its key with the reason
    naming ``require_encrypted``; with ``require_encrypted: false`` (the migration flag) the same Fetch gets its
    records."""
    import base64
    import json

    from rsm.manager import RemoteStorageManager, RsmConfig

    a = tiered.topic("a")
    key_file = tmp_path / "keys.json"
    key_file.write_text(json.dumps({"k1": base64.b64encode(bytes(range(32))).decode()}))
    key_file.chmod(0o600)

    def rsm_with(**encryption: Any) -> RemoteStorageManager:
        enc = {"enabled": True, "active_key_id": "k1", "key_file": str(key_file), **encryption}
        return RemoteStorageManager(RsmConfig(**{**tiered.settings.store.model_dump(), "encryption": enc}))

    caplog.set_level(logging.INFO)
    strict, migrating = rsm_with(), rsm_with(require_encrypted=False)
    try:
        assert strict.config.encryption.require_encrypted
        with endpoint(tiered, rsm=strict) as h, connect(h) as s:
            part = answered(fetch_v4(s, 2**20, [(a, 0, 0, 2**20)]))[(a, 0)][0]
            assert part.error_code == KAFKA_STORAGE_ERROR and not part.records
            assert api_versions_ok(h)
        logged = [r for r in caplog.records if "remote copy cannot be read" in r.getMessage()]
        assert logged and a in logged[0].key and "require_encrypted" in logged[0].reason, logged
        with endpoint(tiered, rsm=migrating) as h, connect(h) as s:
            part = answered(fetch_v4(s, 2**20, [(a, 0, 0, 2**20)]))[(a, 0)][0]
            assert part.error_code == 0 and base_offsets(part.records)[0] == 0
    finally:
        strict.close()
        migrating.close()


# --------------------------------------------------------------------------- SASL PLAIN over plaintext, refused
def test_sasl_plain_without_tls_on_a_reachable_host_is_refused(tiered: Tiered, tmp_path: Any) -> None:
    """A listener on a non-loopback host offering SASL PLAIN without TLS (passwords in clear text on the network)
    refuses to start: the config error names ``history_listener.sasl.mechanisms`` and the opt-in key. SCRAM only,
    TLS, or a loopback host start. Opted in (``allow_sasl_plain_without_tls``), it binds every address and PLAIN
    logs in over the network."""
    from rlm.config import ConfigError, load_settings

    plain = {"mechanisms": ["SCRAM-SHA-512", "PLAIN"], "users": {"alice": "pw"}}
    config = tmp_path / "sidecar.yaml"
    config.write_text("broker_id: 1\nlog_dirs: [/var/lib/kafka/data]\nkafka: {bootstrap_servers: 127.0.0.1:9092}\n"
                      "history_listener: {host: 10.1.2.3, sasl: {mechanisms: [PLAIN], users: {alice: pw}}}\n")
    with pytest.raises(ConfigError) as exc:
        load_settings(config)
    assert "history_listener.sasl.mechanisms" in str(exc.value), exc.value
    assert "allow_sasl_plain_without_tls" in str(exc.value) and "history_listener.tls" in str(exc.value)
    with pytest.raises(ValueError, match="history_listener.sasl.mechanisms offers PLAIN"):
        HistoryListenerSettings(host="0.0.0.0", advertised_host="127.0.0.1", sasl=plain)
    HistoryListenerSettings(host="0.0.0.0", advertised_host="127.0.0.1",
                            sasl={**plain, "mechanisms": ["SCRAM-SHA-512"]})
    HistoryListenerSettings(host="0.0.0.0", advertised_host="127.0.0.1", sasl=plain, tls={"certfile": "/c.pem"})
    HistoryListenerSettings(host="127.0.0.1", sasl=plain)

    with endpoint(tiered, host="0.0.0.0", advertised_host="127.0.0.1", sasl={**plain, "users": USERS},
                  allow_sasl_plain_without_tls=True) as h, connect(h) as s:
        assert call(s, SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == 0
        token = b"\0alice\0" + USERS["alice"].encode()
        assert call(s, SASL_AUTHENTICATE, 1, {"auth_bytes": token}).error_code == 0
        meta = call(s, 3, 1, {"topics": None})
        assert meta is not None and tiered.topic("a") in {t.name for t in meta.topics}


# ---------------------------------------------------------------------- r8: large requests off the event loop
def test_a_large_requests_work_does_not_hold_other_connections(tiered: Tiered,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A Fetch of 20,000 partitions (a 320 KB frame): while its decoding is held (made to wait here, as a request
    of millions of partitions would take seconds), and again while the encoding of its answer is held, another
    connection's ApiVersions, Metadata and Fetch are answered. Released, the large Fetch gets its answer. The
    cyclic GC is held off while the large request is worked on (its full collections would hold the GIL, so the
    event loop) and runs again once it is answered."""
    import gc
    import threading

    import rlm.listener.net.server as server

    a = tiered.topic("a")
    big_id = 4242
    held = {"decode": threading.Event(), "encode": threading.Event()}
    reached = {"decode": threading.Event(), "encode": threading.Event()}
    decode, encode = server.decode_request, server.encode_response
    gc_enabled: dict[str, bool] = {}

    def held_decode(frame: bytes, header: Any, **kwargs: Any) -> Any:
        if header.correlation_id == big_id:
            gc_enabled["decode"] = gc.isenabled()
            reached["decode"].set()
            assert held["decode"].wait(60)
        return decode(frame, header, **kwargs)

    def held_encode(header: Any, *args: Any, **kwargs: Any) -> bytes:
        if header.correlation_id == big_id:
            gc_enabled["encode"] = gc.isenabled()
            reached["encode"].set()
            assert held["encode"].wait(60)
        return encode(header, *args, **kwargs)

    monkeypatch.setattr(server, "decode_request", held_decode)
    monkeypatch.setattr(server, "encode_response", held_encode)
    out = io.BytesIO()
    entity = server.build(load_request_schema(1, 4), {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 2**20, "isolation_level": 0,
        "topics": [{"topic": a, "partitions": [{"partition": i % 2, "fetch_offset": 0, "partition_max_bytes": 2**20}
                                               for i in range(20_000)]}]})
    entity_writer(type(entity))(out, entity)
    big = request(1, 4, out.getvalue(), correlation_id=big_id)
    assert len(big) > 300_000
    with endpoint(tiered) as h, connect(h) as other, connect(h) as large:
        other.settimeout(10)  # a held event loop would leave these unanswered: socket.timeout fails the test
        large.sendall(big)
        for stage in ("decode", "encode"):
            assert reached[stage].wait(30), f"the large Fetch never reached its {stage}"
            assert answered_api_versions(other), f"ApiVersions unanswered while the large Fetch's {stage} ran"
            meta = call(other, 3, 1, {"topics": None})
            assert meta is not None and a in {t.name for t in meta.topics}
            got = answered(fetch_v4(other, 2**20, [(a, 0, 0, 2**20)]))
            assert base_offsets(got[(a, 0)][0].records)[0] == 0
            held[stage].set()
        frame = recv_frame(large)
        assert frame is not None and struct.unpack_from(">i", frame)[0] == big_id
        resp, _ = entity_reader(load_response_schema(1, 4))(frame, 4)
        assert {p.partition_index for t in resp.responses for p in t.partitions} == {0, 1}
        assert gc_enabled == {"decode": False, "encode": False}
        wait_for(gc.isenabled, 10, "the GC to run again once the large request is answered")


def test_the_gc_pause_is_bounded() -> None:
    """GcPause: held while any large request is worked on; once held off ``max_s`` in a row, a new large request
    does not hold it (the GC runs again); left alone when something else disabled it."""
    import gc

    from rlm.listener.net.server import GcPause

    assert gc.isenabled()
    pause = GcPause(max_s=3600)
    with pause.held():
        with pause.held():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the first holder still works
    assert gc.isenabled()
    bounded = GcPause(max_s=0)
    with bounded.held():
        assert not gc.isenabled()
        time.sleep(0.01)
        with bounded.held():
            assert gc.isenabled()  # held off past max_s: this request does not hold it
    assert gc.isenabled()
    gc.disable()
    try:
        with pause.held():
            pass
        assert not gc.isenabled()  # not ours to enable
    finally:
        gc.enable()


# -------------------------------------------------------------------- r11: clients that do not read their answers
def test_clients_that_do_not_read_are_held_back_bounded_and_closed(tiered: Tiered) -> None:
    """Four clients pipeline 300 Fetches of a whole partition each and read nothing. Back-pressure: the server stops
    reading their requests once an answer waits for them (far fewer than 300 are served: what the socket buffers,
    ``socket_send_buffer_bytes``, hold). The answers queued to
    them stay within ``queued_max_response_bytes`` (64 KiB here) plus a batch each, while a client that reads still
    gets records (a batch at least); having taken nothing for ``write_timeout_ms`` they are closed (``not_reading``),
    and then a reading client gets whole answers again."""
    from prometheus_client import REGISTRY

    def metric(name: str, labels: dict[str, str] | None = None) -> float:
        return REGISTRY.get_sample_value(name, labels or {}) or 0.0

    a = tiered.topic("a")
    bound, batch = 64 * 1024, 12 * 1024  # a batch of 10 records of 1 KB, with its headers
    before = metric("rlm_history_closed_connections_total", {"reason": "not_reading"})
    with endpoint(tiered, queued_max_response_bytes=bound, write_timeout_ms=5000) as h:
        served = []
        fetch = h.server.router.fetch
        h.server.router.fetch = lambda req, *a, **kw: (served.append(1), fetch(req, *a, **kw))[1]
        ask = request(1, 4, _fetch_body(a, 0, max_wait_ms=0))
        deaf = []
        for _ in range(4):
            d = socket.socket()
            d.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            d.settimeout(20)
            d.connect(("127.0.0.1", h.port))
            d.sendall(ask * 300)  # 300 requests of about 100 bytes: they fit the socket buffers
            deaf.append(d)
        try:
            wait_for(lambda: metric("rlm_history_queued_response_bytes") > bound // 2, 20, "answers to queue up")
            with connect(h) as reader:
                got = answered(fetch_v4(reader, 2**20, [(a, 0, 0, 2**20)]))[(a, 0)][0]
                assert got.error_code == 0 and base_offsets(got.records)[:1] == [0]  # progress, at least a batch
            assert metric("rlm_history_queued_response_bytes") <= bound + 4 * batch
            # each holds in its socket buffers (102400 bytes, doubled by Linux) about 20 answers of a batch at most
            assert len(served) < 4 * 100, f"{len(served)} of 1200 requests served to clients that read nothing"
            wait_for(lambda: metric("rlm_history_closed_connections_total", {"reason": "not_reading"}) >= before + 4,
                     30, "the clients that do not read to be closed")
            for d in deaf:  # what its socket held, then the end (reset or closed; never the 20 s timeout)
                with contextlib.suppress(ConnectionResetError):
                    while d.recv(1 << 16):
                        pass
        finally:
            for d in deaf:
                d.close()
        with connect(h) as reader:
            got = answered(fetch_v4(reader, 2**20, [(a, 0, 0, 2**20)]))[(a, 0)][0]
            assert len(base_offsets(got.records)) > 5  # the whole partition (18 batches) fits 1 MiB again
        assert api_versions_ok(h)


class GatedRsm(CountingRsm):
    """:class:`CountingRsm` whose reads of record batches wait, while :attr:`gate` is set, until ``gate.parties``
    of them are in flight at once (10 s at most): Fetches whose tier reads overlap, whatever the scheduling."""

    gate: threading.Barrier | None = None

    def open_segment(self, md: Any) -> Any:
        return _GatedSegment(self._rsm.open_segment(md), self, md)


class _GatedSegment(_CountingSegment):
    def batches(self, *args: Any, **kwargs: Any) -> Any:
        gate = typing.cast(GatedRsm, self._owner).gate
        if gate is not None:
            with contextlib.suppress(threading.BrokenBarrierError):
                gate.wait(10)
        return super().batches(*args, **kwargs)


def test_a_fetch_holds_of_the_queued_bound_only_what_its_partitions_can_bring(tiered: Tiered) -> None:
    """While its partitions are read, a Fetch holds room of ``queued_max_response_bytes`` (64 KiB here) for its
    answer: no more than its partitions can bring (their ``partition_max_bytes``, 30 KB here), not all of
    ``max_bytes`` (64 KiB). Two consumers' Fetches read at the same time (their reads wait for each other) each get
    what they get alone (two batches of ~12 KB). Holding ``max_bytes`` each, the second found no room left and got
    its first batch only: 8 consumers of 8 x 1 MiB partitions asking 50 MiB (the clients' default) against 256 MiB,
    two of them got 64 KiB answers and one 6 MiB, the answers in all a quarter of the bound."""
    a = tiered.topic("a")
    rsm = GatedRsm(tiered.sidecar.rsm)
    bound, pmb = 64 * 1024, 30_000
    with endpoint(tiered, rsm=rsm, queued_max_response_bytes=bound) as h:
        alone = {}
        for p in (0, 1):
            with connect(h) as s:
                alone[p] = answered(fetch_v4(s, bound, [(a, p, 0, pmb)]))[(a, p)][0].records
        assert all(len(base_offsets(r)) >= 2 for r in alone.values()), {p: base_offsets(r) for p, r in alone.items()}
        rsm.gate = threading.Barrier(2)
        got: dict[int, Any] = {}

        def consumer(p: int) -> None:
            with connect(h) as s:
                got[p] = answered(fetch_v4(s, bound, [(a, p, 0, pmb)]))[(a, p)][0].records

        threads = [threading.Thread(target=consumer, args=(p,)) for p in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not rsm.gate.broken, "the two Fetches' reads did not overlap"
        assert {p: base_offsets(r) for p, r in got.items()} == {p: base_offsets(r) for p, r in alone.items()}
        assert got == alone
        # an answer the socket did not take at once stays counted until the loop hears it was (resume_writing): the
        # client may have read it all a moment before
        wait_for(lambda: h.server.queued_response_bytes() == 0, 10, "nothing to be counted as queued once taken")


def test_an_answer_is_queued_once_and_handed_to_its_transport_a_slice_at_a_time(
        tiered: Tiered, monkeypatch: pytest.MonkeyPatch) -> None:
    """r11 with large answers: an answer is handed to its connection's transport a slice at a time, the next once the
    socket has taken the last, so a client that does not read holds its answer once (counted in
    ``rlm_history_queued_response_bytes``) plus at most a slice in its transport. Before, the transport got the whole
    answer and copied what the socket did not take: the answer was held twice and counted once (r11: 6 clients held
    2 x 159 MiB). Slices here are 16 KiB, the answer (both partitions of ``a``) about 370 KB: a client that reads
    gets the same bytes as an answer written whole; one that does not is closed at ``write_timeout_ms``, and then
    nothing is counted as queued any more (the running total gives back what the socket never took)."""
    import asyncio

    from prometheus_client import REGISTRY

    import rlm.listener.net.server as server

    def metric(name: str, labels: dict[str, str] | None = None) -> float:
        return REGISTRY.get_sample_value(name, labels or {}) or 0.0

    from rlm.listener.protocol.codec import build

    a = tiered.topic("a")
    out = io.BytesIO()
    entity = build(load_request_schema(1, 4), {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 2**20, "isolation_level": 0,
        "topics": [{"topic": a, "partitions": [{"partition": p, "fetch_offset": 0, "partition_max_bytes": 2**20}
                                               for p in (0, 1)]}]})
    entity_writer(type(entity))(out, entity)
    whole = request(1, 4, out.getvalue())
    slice_bytes = 16 * 1024
    # send buffers not raised past socket_send_buffer_bytes (a sliced answer raises them too): a client that does
    # not read gets ~200 KB of the answer into its kernel buffers, the rest queues
    monkeypatch.setattr(server, "SEND_BUFFER_RAISED_BYTES", 102_400)
    before = metric("rlm_history_closed_connections_total", {"reason": "not_reading"})
    with endpoint(tiered, write_timeout_ms=3000) as h:
        loop = h.server._loop
        assert loop is not None

        def transports_hold() -> int:
            """The most any connection's transport holds now (read on the server's event loop)."""
            async def largest() -> int:
                return max((w.transport.get_write_buffer_size() for w in h.server._writers), default=0)
            return asyncio.run_coroutine_threadsafe(largest(), loop).result(10)

        with connect(h) as reader:
            reader.sendall(whole)
            written_whole = recv_frame(reader)
            monkeypatch.setattr(server, "WRITE_SLICE_BYTES", slice_bytes)
            reader.sendall(whole)
            sliced = recv_frame(reader)
        assert written_whole is not None and len(written_whole) > 20 * slice_bytes
        assert sliced == written_whole
        got = answered(entity_reader(load_response_schema(1, 4))(sliced, 4)[0])
        assert all(len(base_offsets(got[(a, p)][0].records)) > 5 for p in (0, 1))
        deaf = socket.socket()
        deaf.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        deaf.settimeout(20)
        with deaf:
            deaf.connect(("127.0.0.1", h.port))
            deaf.sendall(whole)
            # what the kernel's buffers do not take (socket_send_buffer_bytes: 100 KiB, doubled) waits for the client
            wait_for(lambda: metric("rlm_history_queued_response_bytes") > 2 * slice_bytes, 20,
                     "the answer to queue up")
            assert transports_hold() <= slice_bytes
            wait_for(lambda: metric("rlm_history_closed_connections_total", {"reason": "not_reading"}) > before, 30,
                     "the client that does not read to be closed")
            wait_for(lambda: h.server.queued_response_bytes() == 0, 10, "nothing to be counted as queued")
            assert metric("rlm_history_queued_response_bytes") == 0
        assert api_versions_ok(h)


def test_a_reading_clients_send_buffer_is_raised_within_its_share_of_the_queued_bound(tiered: Tiered) -> None:
    """A connection whose answer outgrows ``socket_send_buffer_bytes`` (here both partitions of ``a``, ~370 KB)
    gets SO_SNDBUF ``SEND_BUFFER_RAISED_BYTES`` (fewer event-loop rounds per answer), counted against
    ``queued_max_response_bytes`` (twice it: the kernel's doubling) while the raised buffers stay within their share
    of it, and given back when it closes; with a bound too small for the share, nothing is raised. Either way the
    client gets the same whole answer."""
    import asyncio

    import rlm.listener.net.server as server

    a = tiered.topic("a")
    both = [(a, p, 0, 2**20) for p in (0, 1)]
    cost = 2 * server.SEND_BUFFER_RAISED_BYTES
    answers = []

    def send_buffers(h: Listener) -> list[int]:
        """SO_SNDBUF of the endpoint's client sockets (read on its event loop)."""
        async def read() -> list[int]:
            return [w.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
                    for w in h.server._writers]
        assert h.server._loop is not None
        return asyncio.run_coroutine_threadsafe(read(), h.server._loop).result(10)

    for bound, raised in ((256 * 2**20, cost), (cost * server.SEND_BUFFER_RAISED_SHARE - 1, 0)):
        with endpoint(tiered, queued_max_response_bytes=bound) as h:
            with connect(h) as reader:
                for _ in range(3):
                    got = answered(fetch_v4(reader, 2**21, both))
                    assert all(len(base_offsets(got[(a, p)][0].records)) > 5 for p in (0, 1))
                answers.append(got)
                assert h.server._raised == raised
                assert h.server._fetch_room() <= bound - raised
                assert send_buffers(h) == [2 * server.SEND_BUFFER_RAISED_BYTES if raised else 2 * 102_400]
            wait_for(lambda h=h: h.server._raised == 0, 10, "the raised buffer to be given back")
    assert [[len(p.records) for p in ps] for ps in answers[0].values()] == [
        [len(p.records) for p in ps] for ps in answers[1].values()]


def test_a_send_buffer_is_raised_for_answers_written_a_slice_at_a_time(tiered: Tiered,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer above ``WRITE_SLICE_BYTES`` is written a slice at a time (``_send``: here the slice is made 64 KiB,
    so both partitions of ``a``, ~370 KB, are); it raises the connection's SO_SNDBUF as an answer written whole
    does (a consumer of 8 partitions gets answers of ~8 MiB, all of them sliced: its buffer stayed at
    ``socket_send_buffer_bytes``, ~200 KB taken an event-loop round). The client gets the same whole answer."""
    import asyncio

    import rlm.listener.net.server as server

    monkeypatch.setattr(server, "WRITE_SLICE_BYTES", 64 * 1024)
    a = tiered.topic("a")
    both = [(a, p, 0, 2**20) for p in (0, 1)]
    with endpoint(tiered) as h:
        with connect(h) as reader:
            got = answered(fetch_v4(reader, 2**21, both))
            assert all(len(base_offsets(got[(a, p)][0].records)) > 5 for p in (0, 1))

            async def read() -> list[int]:
                return [w.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
                        for w in h.server._writers]

            assert h.server._loop is not None
            assert asyncio.run_coroutine_threadsafe(read(), h.server._loop).result(10) == [
                2 * server.SEND_BUFFER_RAISED_BYTES]
            assert h.server._raised == 2 * server.SEND_BUFFER_RAISED_BYTES
        wait_for(lambda: h.server._raised == 0, 10, "the raised buffer to be given back")


def test_a_send_buffer_is_raised_by_the_answers_size_up_to_its_max(tiered: Tiered,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Answers larger than ``socket_send_buffer_bytes`` raise the connection's SO_SNDBUF to half their size, within
    ``SEND_BUFFER_RAISED_BYTES`` .. ``SEND_BUFFER_RAISED_MAX_BYTES`` (here 64 KiB .. 1 MiB, so that one partition of
    ``a`` raises it, both partitions raise it further): a consumer of 8 partitions gets ~8 MiB answers, and with
    1 MiB each went to the socket in ~4 rounds of the event loop's. Counted (twice it: the kernel's doubling)
    against ``queued_max_response_bytes`` and given back at close, as before."""
    import asyncio

    import rlm.listener.net.server as server

    monkeypatch.setattr(server, "WRITE_SLICE_BYTES", 64 * 1024)  # written by _send, which raises it before writing
    monkeypatch.setattr(server, "SEND_BUFFER_RAISED_BYTES", 64 * 1024)
    monkeypatch.setattr(server, "SEND_BUFFER_RAISED_MAX_BYTES", 1 << 20)
    a = tiered.topic("a")
    with endpoint(tiered) as h:
        assert h.server._loop is not None

        def send_buffers() -> list[int]:
            async def read() -> list[int]:
                return [w.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
                        for w in h.server._writers]
            return asyncio.run_coroutine_threadsafe(read(), h.server._loop).result(10)  # type: ignore[arg-type]

        with connect(h) as reader:
            seen = []
            for parts in ([(a, 0, 0, 2**20)], [(a, p, 0, 2**20) for p in (0, 1)]):
                got = answered(fetch_v4(reader, 2**21, parts))
                assert all(len(base_offsets(got[(a, p)][0].records)) > 5 for _t, p, _o, _m in parts)
                seen.append(send_buffers())
                assert seen[-1] == [h.server._raised]
        assert 2 * 64 * 1024 < seen[0][0] < seen[1][0] <= 2 * (1 << 20)
        wait_for(lambda: h.server._raised == 0, 10, "the raised buffer to be given back")


def test_a_large_answer_to_a_slow_reader_is_not_copied_into_the_transport(tiered: Tiered,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """An answer above ``WRITE_SLICE_BYTES`` over plaintext (here the slice is made 256 KiB, so both partitions of
    ``a``, ~370 KB, are one) to a client whose socket takes little at a time: the server writes it from the tier's
    buffers as the socket takes it, and copies at most ``QUEUE_AT_MOST_BYTES`` into the transport's buffer at a time
    (handed to the transport a slice at a time, what the socket did not take of each slice was copied there whole,
    then sent from that copy: a consumer of 8 partitions had most of each ~8 MiB answer copied twice). The client
    gets the same whole answer as one reading at once."""
    import asyncio.selector_events

    import rlm.listener.net.server as server
    from rlm.listener.net.vectored import QUEUE_AT_MOST_BYTES

    a = tiered.topic("a")
    both = [(a, p, 0, 2**20) for p in (0, 1)]
    with endpoint(tiered) as h, connect(h) as reader:
        whole = answered(fetch_v4(reader, 2**21, both))
    held: list[int] = []
    transport = asyncio.selector_events._SelectorSocketTransport
    write = transport.write

    def recorded(self: Any, data: Any) -> None:
        write(self, data)
        held.append(self.get_write_buffer_size())

    monkeypatch.setattr(transport, "write", recorded)
    monkeypatch.setattr(server, "WRITE_SLICE_BYTES", 256 * 1024)
    monkeypatch.setattr(server, "SEND_BUFFER_RAISED_BYTES", 4096)
    with endpoint(tiered, socket_send_buffer_bytes=4096) as h:
        with socket.socket() as slow:
            slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: the window stays small
            slow.settimeout(20)
            slow.connect(("127.0.0.1", h.port))
            got = answered(fetch_v4(slow, 2**21, both))
    assert sum(len(p.records or b"") for ps in whole.values() for p in ps) > 256 * 1024
    assert [[bytes(p.records or b"") for p in ps] for ps in got.values()] == [
        [bytes(p.records or b"") for p in ps] for ps in whole.values()]
    assert held and max(held) <= QUEUE_AT_MOST_BYTES


# ------------------------------------------------------------------------------ generated frames (Hypothesis)
def _valid_request(api_key: int, version: int) -> bytes:
    """A request body of ``api_key`` at ``version`` built by kio from empty values (b"" if kio has no schema)."""
    from rlm.listener.protocol.codec import build

    try:
        schema = load_request_schema(api_key, version)
    except Exception:  # noqa: BLE001 - no such api key / version: an empty body
        return b""
    out = io.BytesIO()
    entity = build(schema, {})
    entity_writer(type(entity))(out, entity)
    return out.getvalue()


def test_generated_frames_are_answered_or_close_the_connection(tiered: Tiered,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """Hypothesis sends frames through the real server: valid headers of every api key the endpoint offers (and
    others) at every version (and past them), each with a valid body mutated (bytes flipped, cut, extended) or
    truncated. Each is answered with the request's correlation id (an error code or an answer) or its connection is
    closed; the server keeps serving (ApiVersions on a fresh connection), and nothing is logged at ERROR or with a
    traceback. On a plaintext listener and on a SASL one (before authentication)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from rlm.listener.protocol.apis import API_KEYS, SASL_API_KEYS

    keys = sorted({*API_KEYS, *SASL_API_KEYS, 19, 32, 42, 1000})
    caplog.set_level(logging.INFO)

    frames = st.tuples(
        st.sampled_from(keys), st.integers(-1, 20), st.integers(0, 2**31 - 1),
        st.lists(st.tuples(st.integers(0, 4096), st.integers(0, 255)), max_size=4),  # (position, byte) flips
        st.one_of(st.none(), st.integers(0, 4096)),  # truncate the body at
        st.binary(max_size=16))  # appended

    for listener in ({}, {"sasl": {"mechanisms": ["SCRAM-SHA-512", "PLAIN"], "users": USERS}}):
        with endpoint(tiered, **listener) as h:
            @settings(max_examples=200, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
            @given(frames)
            def one(frame: tuple[int, int, int, list[tuple[int, int]], int | None, bytes]) -> None:
                api_key, version, correlation_id, flips, cut, tail = frame
                body = bytearray(_valid_request(api_key, version))
                for pos, byte in flips:
                    if body:
                        body[pos % len(body)] = byte
                if cut is not None:
                    del body[cut:]
                body += tail
                with connect(h) as s:
                    s.settimeout(10)
                    # then an ApiVersions: a request that gets no answer (Produce with acks=0) is followed by its
                    s.sendall(request(api_key, version, bytes(body), correlation_id)
                              + request(API_VERSIONS, 0, b"", correlation_id ^ 1))
                    got = recv_frame(s)
                    if got is not None and struct.unpack_from(">i", got)[0] == correlation_id ^ 1:
                        assert api_key == 0, (api_key, version)  # only Produce goes unanswered
                        return
                    assert got is None or struct.unpack_from(">i", got)[0] == correlation_id, (api_key, version)

            one()
            assert api_versions_ok(h)
    assert no_traceback(caplog) == []


def test_null_arrays_where_kafka_allows_none_are_bad_requests(tiered: Tiered,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A request whose non-nullable array is sent null (length -1): kio reads it as None where Kafka's parser refuses
    it. Found by the generated frames (a ListOffsets v1 with ``topics`` -1 raised TypeError in its handler: no
    answer, an ERROR with a traceback): now a bad request, answered as one (INVALID_REQUEST where the answer has a
    top-level error code, else empty) for arrays at any depth, while a nullable one (Metadata's topics: every topic)
    is still served; nothing logged at ERROR."""
    from kio.index import load_response_schema
    from kio.serial import entity_reader

    caplog.set_level(logging.INFO)
    invalid_request = 42
    list_offsets_null_topics = struct.pack(">ii", -1, -1)  # v1: replica_id, topics (null)
    # Fetch v7: replica_id, max_wait, min_bytes, max_bytes, isolation_level, session id, session epoch,
    # topics [name, partitions (null)], forgotten topics (empty)
    fetch_null_partitions = (struct.pack(">iiiibiii", -1, 0, 1, 1024, 0, 0, -1, 1) + kstr(tiered.topic("a"))
                             + struct.pack(">ii", -1, 0))
    with endpoint(tiered) as h, connect(h) as s:
        answers = {}
        for key, version, body in ((2, 1, list_offsets_null_topics), (1, 7, fetch_null_partitions)):
            s.sendall(request(key, version, body, correlation_id=key))
            frame = recv_frame(s)
            assert frame is not None and struct.unpack_from(">i", frame)[0] == key
            answers[key], _ = entity_reader(load_response_schema(key, version))(frame, 4)
        assert answers[2].topics == ()
        assert answers[1].error_code == invalid_request and answers[1].responses == ()
        metadata = call(s, 3, 1, {"topics": None})  # nullable: every topic
        assert metadata is not None and {t.name for t in metadata.topics} >= {tiered.topic("a"), tiered.topic("b")}
        assert api_versions_ok(h)
    assert no_traceback(caplog) == []
    assert sum("request does not decode" in r.getMessage() for r in caplog.records) == 2
