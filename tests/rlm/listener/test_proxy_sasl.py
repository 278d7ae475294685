"""SASL through the proxy (issue 24, Security): the broker authenticates each client, through the proxy, and decides
its forwarded requests as the client's own principal; the tier's reads are checked against the cluster's ACLs for the
same principal; the sidecar's own principal carries none of them. Black box, on the SASL_SSL cluster
(``kafka_sasl_ssl``: SCRAM-SHA-512, TLS, KRaft's StandardAuthorizer).

One set-up for the module: two tiered topics, A and B, whose broker log start is then moved inside the tier
(DeleteRecords), so offsets below it exist only remotely. The sidecar runs as the cluster's super user (it could read
everything). Its listener proxies the broker with SASL passed through (``history_listener.sasl`` without users), TLS
towards clients (its own certificate) and towards the broker (``upstream_tls``: the cluster's CA). Two SCRAM users
made for the module: ``reader`` (READ on A only) and ``nobody`` (no ACL). Clients are confluent-kafka and raw requests
(kio) where the exact answer matters. PLAIN is passed through the same way in front of the SASL_PLAINTEXT/PLAIN cluster
(``kafka_sasl``), by a second listener sharing the module's store and metadata manager (live data only there).
"""

from __future__ import annotations

import socket
import ssl
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)
from pydantic import ValidationError
from scramp import ScramClient

from devtools.devkafka import KafkaCluster
from rlm.config import HistoryListenerSettings, KafkaSettings
from rlm.listener import Listener, start_listener
from rlm.listener.net.sasl import plain_user, scram_user
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.rlm.listener.pki import Pki, make_pki
from tests.rlm.listener.raw_wire import call, closed, plain_login
from tests.support.clients import consume_until
from tests.support.fixtures import SASL_READER, SASL_VIEWER
from tests.support.kafka import grant, produce
from tests.support.sidecar import latest_remote, make_settings, produce_segments, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MECHANISM = "SCRAM-SHA-512"
LOG_START = 25  # the broker's log start of A and B after DeleteRecords: inside the tier (2 segments of 20, a roll)
EARLIEST, LATEST = -2, -1
TOPIC_AUTHORIZATION_FAILED, GROUP_AUTHORIZATION_FAILED, SASL_AUTHENTICATION_FAILED = 29, 30, 58
SASL_HANDSHAKE, SASL_AUTHENTICATE, METADATA, LIST_OFFSETS, FETCH = 17, 36, 3, 2, 1


@dataclass
class Proxied:
    kafka: KafkaCluster
    listener: Listener
    pki: Pki
    a: str
    b: str
    sent: dict[int, tuple[bytes, bytes]]  # A: offset -> (key, value)
    users: dict[str, str]  # "reader", "nobody" -> (the SCRAM user, its password)
    names: dict[str, str]
    sidecar_client: dict[str, Any]
    sidecar: Sidecar

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.listener.port}"

    def client(self, who: str, **extra: Any) -> dict[str, Any]:
        """confluent-kafka's settings for ``who`` through the proxy: SASL_SSL, the listener's CA."""
        return {"bootstrap.servers": self.bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanism": MECHANISM,
                "sasl.username": self.names[who], "sasl.password": self.users[who],
                "ssl.ca.location": str(self.pki.ca), **extra}

    def connect(self) -> socket.socket:
        """A raw TLS connection to the listener (not authenticated)."""
        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        return ctx.wrap_socket(socket.create_connection(("127.0.0.1", self.listener.port), timeout=30),
                               server_hostname="127.0.0.1")


@pytest.fixture(scope="module")
def proxied(kafka_sasl_ssl: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    kc, tag = kafka_sasl_ssl, uuid.uuid4().hex[:6]
    tmp: Path = tmp_path_factory.mktemp("proxy-sasl")
    a, b = f"psasl-{tag}-a", f"psasl-{tag}-b"
    ids = {t: kc.create_topic(t, 1, config={"segment.ms": "300"}) for t in (a, b)}
    sent = {t: produce_segments(kc, t, rounds=2, per_round=20, segment_ms=300, roll=False, **kc.security_config())
            for t in (a, b)}
    for t in (a, b):  # one more record rolls the segment of the last round: the tier ends at 40
        sent[t].update({o: (b"__roll__", b"r") for _p, o in produce(kc, t, [(b"__roll__", b"r")],
                                                                     **kc.security_config())})
    pki = make_pki(tmp)
    settings = make_settings(kc, tmp, topics={"include": [a, b]}, history_listener={
        "port": 0, "proxy": True, "fetch_max_wait_ms": 100, "sasl": {"mechanisms": [MECHANISM]},
        "tls": {"certfile": str(pki.cert), "keyfile": str(pki.key)},
        "upstream_tls": {"cafile": str(kc.ca_file)}, "authorization": {"acl_cache_ttl_ms": 2000}})
    sidecar_client = kc.security_config()  # the cluster's super user: it may read every topic
    settings = settings.model_copy(update={"kafka": KafkaSettings(bootstrap_servers=kc.bootstrap_servers,
                                                                  client=sidecar_client)})
    sidecar = Sidecar(settings).start()
    listener: Listener | None = None
    try:
        for t in (a, b):
            tp, end = TopicIdPartition(ids[t], t, 0), max(sent[t]) - 1  # the roll record stays local
            wait_for(lambda tp=tp, end=end: latest_remote(sidecar, tp) >= end, 90, f"{t} tiered")
        listener = start_listener(settings, sidecar.rsm, rlmm=sidecar.rlmm)
        wait_for(lambda: {a, b} <= set(listener.catalog.topics()), 30, "the topics served")
        admin = AdminClient(kc.admin_config())
        for fut in admin.delete_records([TopicPartition(t, 0, LOG_START) for t in (a, b)]).values():
            fut.result(30)
        names = {who: f"{who}-{tag}" for who in ("reader", "nobody")}
        users = {who: f"{who}-{uuid.uuid4().hex}" for who in names}
        for who, name in names.items():
            kc.add_scram_user(name, users[who])
        grant(kc, AclBinding(ResourceType.TOPIC, a, ResourcePatternType.LITERAL, f"User:{names['reader']}", "*",
                             AclOperation.READ, AclPermissionType.ALLOW))
        # The broker applies it at once, the listener's ACL cache within its TTL.
        wait_for(lambda: listener.authorizer.allowed(f"User:{names['reader']}", "127.0.0.1", "READ", [a]), 30,
                 "the listener's ACL cache to see reader's READ on A")
        yield Proxied(kc, listener, pki, a, b, sent[a], users, names, sidecar_client, sidecar)
    finally:
        if listener is not None:
            listener.stop()
        sidecar.stop()


def scram_login(sock: socket.socket, user: str, password: str) -> int:
    """SCRAM-SHA-512 over SaslHandshake v1 / SaslAuthenticate v1: the error code of the last answer (0: the broker,
    through the proxy, authenticated ``user``); the server's signature is checked, so the broker answered."""
    assert call(sock, SASL_HANDSHAKE, 1, {"mechanism": MECHANISM}).error_code == 0
    scram = ScramClient([MECHANISM], user, password)
    first = call(sock, SASL_AUTHENTICATE, 1, {"auth_bytes": scram.get_client_first().encode()})
    if first.error_code != 0:
        return int(first.error_code)
    scram.set_server_first(first.auth_bytes.decode())
    final = call(sock, SASL_AUTHENTICATE, 1, {"auth_bytes": scram.get_client_final().encode()})
    if final.error_code == 0:
        scram.set_server_final(final.auth_bytes.decode())  # raises unless the broker knew the password
    return int(final.error_code)


def list_offsets(sock: socket.socket, topic: str, timestamp: int) -> tuple[int, int]:
    (t,) = call(sock, LIST_OFFSETS, 5, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1,
                                        "timestamp": timestamp}]}]}).topics
    (p,) = t.partitions
    return int(p.error_code), int(p.offset)


def fetch(sock: socket.socket, topic: str, offset: int) -> tuple[int, bytes]:
    """A Fetch v11 of ``topic``'s partition 0 from ``offset``: (error code, record bytes)."""
    resp = call(sock, FETCH, 11, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "topics": [{"topic": topic, "partitions": [
            {"partition": 0, "fetch_offset": offset, "current_leader_epoch": -1, "log_start_offset": -1,
             "partition_max_bytes": 1 << 20}]}]})
    (t,) = resp.responses
    (p,) = t.partitions
    return int(p.error_code), bytes(p.records or b"")


def base_offset(records: bytes) -> int:
    return int.from_bytes(records[:8], "big")


def test_a_principal_reads_what_its_acls_allow_history_included_and_nothing_else(proxied: Proxied) -> None:
    """reader (READ on A): A's tier below the broker's log start, the broker's log, EARLIEST = the tier's 0; B
    refused on the tier and on live offsets alike. A principal the broker did not authenticate sends nothing."""
    p = proxied
    with p.connect() as sock:
        # Before the broker said yes, nothing but ApiVersions and SASL: a Metadata closes the connection unanswered.
        assert call(sock, METADATA, 1, {"topics": None}) is None
    with p.connect() as sock:
        assert scram_login(sock, p.names["reader"], p.users["reader"]) == 0
        error, records = fetch(sock, p.a, 0)  # below the broker's log start: the tier, READ for reader checked
        assert error == 0 and base_offset(records) == 0
        error, records = fetch(sock, p.a, LOG_START + 5)  # the broker's
        assert error == 0 and base_offset(records) <= LOG_START + 5
        assert list_offsets(sock, p.a, EARLIEST) == (0, 0)
        assert list_offsets(sock, p.a, LATEST) == (0, max(p.sent) + 1)
        assert fetch(sock, p.b, 0)[0] == TOPIC_AUTHORIZATION_FAILED  # history
        assert fetch(sock, p.b, LOG_START)[0] == TOPIC_AUTHORIZATION_FAILED  # live
        assert list_offsets(sock, p.b, EARLIEST)[0] == TOPIC_AUTHORIZATION_FAILED
        assert list_offsets(sock, p.b, LATEST)[0] == TOPIC_AUTHORIZATION_FAILED


def test_the_sidecars_principal_carries_no_clients_request(proxied: Proxied) -> None:
    """nobody (no ACL) reads nothing through the proxy, neither the tier nor the broker's log, although the
    sidecar's own principal, which runs the proxy, reads A from the broker."""
    p = proxied
    own = Consumer({**p.sidecar_client, "bootstrap.servers": p.kafka.bootstrap_servers, "group.id": "probe"})
    try:
        assert own.get_watermark_offsets(TopicPartition(p.a, 0), timeout=15) == (LOG_START, max(p.sent) + 1)
    finally:
        own.close()
    with p.connect() as sock:
        assert scram_login(sock, p.names["nobody"], p.users["nobody"]) == 0
        assert fetch(sock, p.a, 0)[0] == TOPIC_AUTHORIZATION_FAILED
        assert fetch(sock, p.a, LOG_START)[0] == TOPIC_AUTHORIZATION_FAILED
        assert list_offsets(sock, p.a, LATEST)[0] == TOPIC_AUTHORIZATION_FAILED


def test_a_wrong_password_is_refused_by_the_broker(proxied: Proxied) -> None:
    p = proxied
    with p.connect() as sock:
        assert scram_login(sock, p.names["reader"], "not-the-password") == SASL_AUTHENTICATION_FAILED
        assert closed(sock)  # the broker closes its connection, the proxy the client's
    errors: list[KafkaError] = []
    c = Consumer(p.client("reader", **{"sasl.password": "not-the-password", "group.id": "wrong",
                                        "error_cb": errors.append}))
    try:
        wait_for(lambda: c.poll(0.2) is None and any(e.code() == KafkaError._AUTHENTICATION for e in errors), 20,
                 "the authentication error")  # error_cb is served by poll()
    finally:
        c.close()


def test_a_group_reads_history_into_live_data_and_commits_with_its_own_group_acl(proxied: Proxied) -> None:
    """reader's consumer: assign() A from 0, through the tier into the broker's log, each offset once; its group is
    refused (GROUP_AUTHORIZATION_FAILED: the broker's answer, for reader) until reader has READ on the group, then
    its commit lands on the broker, and a subscribe() consumer of the group resumes there."""
    p = proxied
    group = f"{p.a}-group"
    end = max(p.sent) + 1
    c = Consumer(p.client("reader", **{"group.id": group, "enable.auto.commit": False, "fetch.wait.max.ms": 100}))
    try:
        c.assign([TopicPartition(p.a, 0, 0)])
        got, refused = _read_assigned(c, end)
        assert [o for o, _rec in got] == list(range(end))
        assert all(rec == p.sent[o] for o, rec in got)
        assert refused  # the group's coordinator, looked up for an assign()ed consumer too, is refused to reader
    finally:
        c.close()
    # A commit (OffsetCommit, the admin API's, through the proxy as reader) is refused by the broker.
    as_reader = AdminClient({k: v for k, v in p.client("reader").items()})
    (fut,) = as_reader.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
        group, [TopicPartition(p.a, 0, end)])]).values()
    with pytest.raises(KafkaException) as exc:
        fut.result(30)
    assert exc.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED
    grant(p.kafka, AclBinding(ResourceType.GROUP, group, ResourcePatternType.LITERAL,
                              f"User:{p.names['reader']}", "*", AclOperation.READ, AclPermissionType.ALLOW))
    c = Consumer(p.client("reader", **{"group.id": group, "enable.auto.commit": False}))
    try:
        c.assign([TopicPartition(p.a, 0, end)])
        c.commit(offsets=[TopicPartition(p.a, 0, end)], asynchronous=False)
    finally:
        c.close()
    admin = AdminClient(p.kafka.admin_config())
    (fut,) = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)]).values()
    assert {tp.partition: tp.offset for tp in fut.result(30).topic_partitions if tp.topic == p.a} == {0: end}
    recs = [(b"live", f"live-{i}".encode()) for i in range(5)]
    live = {o: rec for (_p, o), rec in zip(produce(p.kafka, p.a, recs, **p.kafka.security_config()), recs,
                                           strict=True)}
    c = Consumer(p.client("reader", **{"group.id": group, "enable.auto.commit": False, "fetch.wait.max.ms": 100,
                                        "session.timeout.ms": 6000}))
    try:
        c.subscribe([p.a])
        got_live = consume_until(c, {(p.a, 0): max(live) + 1}, timeout_s=60)[(p.a, 0)]
        assert {r.offset: (r.key, r.value) for r in got_live} == live
    finally:
        c.close()


def _read_assigned(c: Consumer, end: int, timeout_s: float = 60.0) -> tuple[list[tuple[int, tuple[bytes, bytes]]],
                                                                            bool]:
    """The records of an assign()ed consumer up to ``end`` (offset, (key, value)), in order received, and whether
    its group was refused (GROUP_AUTHORIZATION_FAILED: librdkafka looks the group's coordinator up for an assign()
    consumer too). Any other error fails."""
    got: list[tuple[int, tuple[bytes, bytes]]] = []
    refused = False
    deadline = time.monotonic() + timeout_s
    while not got or got[-1][0] < end - 1:
        assert time.monotonic() < deadline, f"timed out at {got[-1][0] if got else None}"
        for msg in c.consume(500, 0.5):
            if msg.error() is not None:
                assert msg.error().code() == KafkaError.GROUP_AUTHORIZATION_FAILED, msg.error()
                refused = True
                continue
            got.append((msg.offset(), (msg.key(), msg.value())))
    return got, refused


def test_plain_is_passed_through_as_well(proxied: Proxied, kafka_sasl: KafkaCluster, tmp_path: Path) -> None:
    """PLAIN, on the SASL_PLAINTEXT/PLAIN cluster (``kafka_sasl``): a second proxy listener in front of its broker
    (the module's store and metadata manager; the topic here is live only). The broker checks the password; reader
    (READ on the topic) reads it, viewer (no ACL on it) gets TOPIC_AUTHORIZATION_FAILED; a wrong password is
    refused."""
    kc, topic = kafka_sasl, proxied.a.removesuffix("-a") + "-plain"
    kc.create_topic(topic, 1)
    recs = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(3)]
    produce(kc, topic, recs, **kc.security_config())
    grant(kc, AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{SASL_READER}", "*",
                         AclOperation.READ, AclPermissionType.ALLOW))
    settings = make_settings(kc, tmp_path, history_listener={
        "port": 0, "proxy": True, "sasl": {"mechanisms": ["PLAIN"]}, "authorization": {"acl_cache_ttl_ms": 2000}})
    settings = settings.model_copy(update={"kafka": KafkaSettings(bootstrap_servers=kc.bootstrap_servers,
                                                                  client=kc.security_config())})
    listener = start_listener(settings, proxied.sidecar.rsm, rlmm=proxied.sidecar.rlmm)
    try:
        def connect() -> socket.socket:
            return socket.create_connection(("127.0.0.1", listener.port), timeout=30)

        with connect() as sock:
            assert plain_login(sock, SASL_READER, kc.sasl_users[SASL_READER])
            assert list_offsets(sock, topic, LATEST) == (0, len(recs))
            error, records = fetch(sock, topic, 0)
            assert error == 0 and base_offset(records) == 0
        with connect() as sock:
            assert plain_login(sock, SASL_VIEWER, kc.sasl_users[SASL_VIEWER])
            assert fetch(sock, topic, 0)[0] == TOPIC_AUTHORIZATION_FAILED
            assert list_offsets(sock, topic, LATEST)[0] == TOPIC_AUTHORIZATION_FAILED
        with connect() as sock:
            assert not plain_login(sock, SASL_READER, "not-the-password")
            assert closed(sock)
    finally:
        listener.stop()


# ------------------------------------------------------------------------------------------------ no broker
def test_proxy_sasl_config() -> None:
    """As a proxy, sasl has no users (the broker checks passwords) and may pass SCRAM-SHA-256; upstream_tls is the
    proxy's only; client certificates stay refused (their identity cannot reach the broker)."""
    s = HistoryListenerSettings(proxy=True, sasl={"mechanisms": ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]},
                                upstream_tls={"cafile": "/ca.pem"})
    assert s.upstream_security_protocol == "SASL_SSL"
    assert HistoryListenerSettings(proxy=True, sasl={}).upstream_security_protocol == "SASL_PLAINTEXT"
    assert HistoryListenerSettings(proxy=True).upstream_security_protocol == "PLAINTEXT"
    for bad, says in (({"proxy": True, "sasl": {"users": {"a": "pw"}}}, "remove users"),
                      ({"sasl": {}}, "needs users"),
                      ({"sasl": {"mechanisms": ["SCRAM-SHA-256"], "users": {"a": "pw"}}}, "SCRAM-SHA-256"),
                      ({"upstream_tls": {}}, "set proxy: true"),
                      ({"proxy": True, "tls": {"certfile": "/c.pem", "cafile": "/ca.pem"}}, "tls.cafile")):
        with pytest.raises(ValidationError, match=says):
            HistoryListenerSettings(**bad)


@pytest.mark.parametrize(("token", "user"), [
    (b"\0alice\0pw", "alice"), (b"alice\0alice\0pw", "alice"),
    (b"bob\0alice\0pw", None),  # another authzid: Kafka refuses it
    (b"\0alice\0pw\0", None), (b"\0\0pw", None), (b"\0\xff\0pw", None)])
def test_plain_user_as_kafka_reads_it(token: bytes, user: str | None) -> None:
    assert plain_user(token) == user


@pytest.mark.parametrize(("message", "user"), [
    (b"n,,n=alice,r=abc", "alice"), (b"n,,n=a=2Cb=3Dc,r=abc", "a,b=c"), (b"n,a=alice,n=alice,r=abc", "alice"),
    (b"n,a=bob,n=alice,r=abc", None),  # another authzid
    (b"n,,n=alice,r=abc,tokenauth=true", None),  # a delegation token: its owner is not the name
    (b"n,,n=a=2Xb,r=abc", None), (b"y,,n=alice,r=abc", None), (b"n,,n=al\xc3\xa9,r=abc", None)])
def test_scram_user_as_kafka_reads_it(message: bytes, user: str | None) -> None:
    assert scram_user(message) == user
