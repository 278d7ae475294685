"""Host-based ACLs through the proxy (:mod:`rlm.listener.upstream.hosts`): the broker judges a forwarded request by
the proxy's address, so the proxy refuses a client whose principal has a binding naming the client's address or
the proxy's; "the Kafka listener gives nobody more than the cluster's own ACLs would".

On the SASL_PLAINTEXT/PLAIN cluster (``kafka_sasl``: KRaft's StandardAuthorizer, ``super.users`` the cluster's
admin, which is the sidecar's principal here), PLAIN passed through. The proxy reaches the broker from 127.0.0.1;
clients connect from 127.0.0.2 (loopback has the whole of 127/8), raw requests (kio) where the exact answer
matters. One live topic, three principals (ACLs made for the module, deleted after it):

- ``reader``: READ on the topic from anywhere, DENY READ from 127.0.0.2;
- ``viewer``: READ on the topic from 127.0.0.1 only (the proxy's address as the broker sees it);
- ``rlm``: READ on the topic from anywhere, DENY READ from 10.9.8.7 (a third host, neither address).

The listener's ACL view is fetched at start and again only when a test says so (``acl_cache_ttl_ms`` an hour), so
"within a refresh" is one call. The decision's rules without a broker: ``test_acl_rules.py``; its keeping per
connection: the tests at the end.
"""

from __future__ import annotations

import logging
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from prometheus_client import REGISTRY

from devtools.devkafka import ADMIN_USER, KafkaCluster
from rlm.config import HistoryAuthorizationSettings, KafkaSettings
from rlm.listener import Listener, start_listener
from rlm.listener.authz import Acl, AclCache, AclsUnavailableError, Authorizer
from rlm.listener.upstream.hosts import REFUSED_MESSAGE, UNAVAILABLE_MESSAGE, HostCheck
from rlm.sidecar import Sidecar
from tests.rlm.listener.raw_wire import call, closed, fetch, list_offsets, only_partition
from tests.support.fixtures import SASL_PRINCIPAL, SASL_READER, SASL_VIEWER
from tests.support.kafka import grant, produce, revoke
from tests.support.sidecar import make_settings

CLIENT_HOST, PROXY_HOST, THIRD_HOST = "127.0.0.2", "127.0.0.1", "10.9.8.7"
TOPIC_AUTHORIZATION_FAILED, SASL_AUTHENTICATION_FAILED = 29, 58
SASL_HANDSHAKE, SASL_AUTHENTICATE, CREATE_ACLS, DELETE_ACLS = 17, 36, 30, 31
USER, LITERAL, DESCRIBE_TOKENS, ALLOW = 7, 3, 14, 3  # Kafka's ResourceType, PatternType, AclOperation, permission
LATEST = -1


def _acl(topic: str, user: str, host: str, allow: bool = True) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{user}", host, AclOperation.READ,
                      AclPermissionType.ALLOW if allow else AclPermissionType.DENY)


@dataclass
class Proxied:
    kafka: KafkaCluster
    listener: Listener
    topic: str
    records: int

    @property
    def proxy(self) -> tuple[str, int]:
        return "127.0.0.1", self.listener.port

    @property
    def broker(self) -> tuple[str, int]:
        host, port = self.kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)
        return host, int(port)

    def connect(self, to: tuple[str, int], source: str = CLIENT_HOST) -> socket.socket:
        return socket.create_connection(to, timeout=30, source_address=(source, 0))

    def authenticate(self, sock: socket.socket, user: str) -> Any:
        """SASL PLAIN (SaslHandshake v1, SaslAuthenticate v0): the SaslAuthenticate answer."""
        assert call(sock, SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == 0
        return call(sock, SASL_AUTHENTICATE, 0, {"auth_bytes": f"\0{user}\0{self.kafka.sasl_users[user]}".encode()})

    def read(self, sock: socket.socket) -> tuple[int, bytes] | None:
        """The topic's Fetch from offset 0: (error code, record bytes); None when the connection was closed."""
        resp = fetch(sock, self.topic, [(0, 0)])
        if resp is None:
            return None
        p = only_partition(resp)
        return int(p.error_code), bytes(p.records or b"")


@pytest.fixture(scope="module")
def proxied(kafka_sasl: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    kc, tmp = kafka_sasl, tmp_path_factory.mktemp("proxy-host-acls")
    topic = f"phost-{uuid.uuid4().hex[:6]}"
    kc.create_topic(topic, 1)
    records = [(f"k{i}".encode(), f"v{i}".encode()) for i in range(3)]
    produce(kc, topic, records, **kc.security_config())
    acls = [_acl(topic, SASL_READER, "*"), _acl(topic, SASL_READER, CLIENT_HOST, allow=False),
            _acl(topic, SASL_VIEWER, PROXY_HOST),
            _acl(topic, SASL_PRINCIPAL, "*"), _acl(topic, SASL_PRINCIPAL, THIRD_HOST, allow=False)]
    grant(kc, *acls)
    settings = make_settings(kc, tmp, topics={"include": [topic]}, history_listener={
        "port": 0, "proxy": True, "sasl": {"mechanisms": ["PLAIN"]},
        "authorization": {"acl_cache_ttl_ms": 3_600_000}})
    settings = settings.model_copy(update={"kafka": KafkaSettings(bootstrap_servers=kc.bootstrap_servers,
                                                                  client=kc.security_config())})
    sidecar = Sidecar(settings).start()
    listener: Listener | None = None
    try:
        listener = start_listener(settings, sidecar.rsm, rlmm=sidecar.rlmm)  # its view fetched once, the ACLs made
        yield Proxied(kc, listener, topic, len(records))
    finally:
        if listener is not None:
            listener.stop()
        sidecar.stop()
        revoke(kc, *acls)


def refused(reason: str = "host_acl") -> float:
    return REGISTRY.get_sample_value("rlm_history_proxy_refused_total", {"reason": reason}) or 0.0


@pytest.mark.kafka
@pytest.mark.slow
def test_a_deny_of_the_clients_host_holds_through_the_proxy(proxied: Proxied) -> None:
    """reader, DENY READ from 127.0.0.2: straight to the broker from there, TOPIC_AUTHORIZATION_FAILED. Through the
    proxy the broker would see 127.0.0.1, which its ALLOW from anywhere covers (before: the records came): the proxy
    refuses the broker's successful authentication, SASL_AUTHENTICATION_FAILED with a message saying why, closes,
    and counts it."""
    p = proxied
    with p.connect(p.broker) as sock:  # the premise: the broker enforces the DENY for this client, directly
        assert p.authenticate(sock, SASL_READER).error_code == 0
        assert p.read(sock) == (TOPIC_AUTHORIZATION_FAILED, b"")
    before = refused()
    with p.connect(p.proxy) as sock:
        answer = p.authenticate(sock, SASL_READER)
        got = p.read(sock) if answer.error_code == 0 else None
        assert got is None, f"read through the proxy what the broker refuses this client directly: {got}"
        assert (answer.error_code, answer.error_message) == (SASL_AUTHENTICATION_FAILED, REFUSED_MESSAGE)
        assert closed(sock)
    assert refused() == before + 1


@pytest.mark.kafka
@pytest.mark.slow
def test_an_allow_of_the_proxys_host_goes_to_no_other_client(proxied: Proxied) -> None:
    """viewer, READ from 127.0.0.1 only: directly from 127.0.0.2, TOPIC_AUTHORIZATION_FAILED; through the proxy from
    127.0.0.2 refused (before: the broker saw the proxy's 127.0.0.1 and the records came). From 127.0.0.1, the
    address the proxy reaches the broker from, the broker judges it as it is: it reads."""
    p = proxied
    with p.connect(p.broker) as sock:
        assert p.authenticate(sock, SASL_VIEWER).error_code == 0
        assert p.read(sock) == (TOPIC_AUTHORIZATION_FAILED, b"")
    with p.connect(p.proxy) as sock:
        answer = p.authenticate(sock, SASL_VIEWER)
        got = p.read(sock) if answer.error_code == 0 else None
        assert got is None, f"read through the proxy what the broker refuses this client directly: {got}"
        assert answer.error_code == SASL_AUTHENTICATION_FAILED and closed(sock)
    with p.connect(p.proxy, source=PROXY_HOST) as sock:
        assert p.authenticate(sock, SASL_VIEWER).error_code == 0
        error, records = p.read(sock) or (None, b"")
        assert error == 0 and int.from_bytes(records[:8], "big") == 0


@pytest.mark.kafka
@pytest.mark.slow
def test_a_principal_whose_bindings_name_no_such_host_reads_as_before(proxied: Proxied) -> None:
    """rlm, READ from anywhere and a DENY of a third host (neither the client's address nor the proxy's): through
    the proxy from 127.0.0.2 it reads the topic and its offsets as directly."""
    p = proxied
    before = refused()
    with p.connect(p.proxy) as sock:
        assert p.authenticate(sock, SASL_PRINCIPAL).error_code == 0
        error, records = p.read(sock) or (None, b"")
        assert error == 0 and int.from_bytes(records[:8], "big") == 0
        end = list_offsets(sock, p.topic, LATEST)
        assert (end.error_code, end.offset) == (0, p.records)
    assert refused() == before


@pytest.mark.kafka
@pytest.mark.slow
def test_a_binding_added_while_connected_stops_forwarding_at_the_next_refresh(proxied: Proxied) -> None:
    """rlm, connected through the proxy from 127.0.0.2 and reading; then a DENY on a group from 127.0.0.2 (any
    resource type counts). Until the listener's view is refreshed its requests go on (the view's TTL bounds that,
    as for topic ACLs); after, its next request closes the connection, unanswered, and a new one is refused at
    authentication. The binding deleted and the view refreshed, it reads again."""
    p = proxied
    group = AclBinding(ResourceType.GROUP, f"{p.topic}-g", ResourcePatternType.LITERAL, f"User:{SASL_PRINCIPAL}",
                       CLIENT_HOST, AclOperation.READ, AclPermissionType.DENY)
    before = refused()
    with p.connect(p.proxy) as sock:
        assert p.authenticate(sock, SASL_PRINCIPAL).error_code == 0
        assert p.read(sock)[0] == 0  # type: ignore[index]
        grant(p.kafka, group)
        try:
            assert p.read(sock)[0] == 0  # type: ignore[index]  # the view has not fetched it yet
            assert p.listener.authorizer.cache.refresh()
            got = p.read(sock)
            assert got is None, f"forwarded after the view saw a binding of the client's host: {got}"
            assert closed(sock)
            assert refused() == before + 1
            with p.connect(p.proxy) as again:
                assert p.authenticate(again, SASL_PRINCIPAL).error_code == SASL_AUTHENTICATION_FAILED
            assert refused() == before + 2
        finally:
            revoke(p.kafka, group)
    assert p.listener.authorizer.cache.refresh()
    with p.connect(p.proxy) as sock:
        assert p.authenticate(sock, SASL_PRINCIPAL).error_code == 0
        assert p.read(sock)[0] == 0  # type: ignore[index]


@pytest.mark.kafka
@pytest.mark.slow
def test_a_binding_of_a_resource_type_librdkafka_cannot_name_counts_and_breaks_nothing(proxied: Proxied) -> None:
    """A USER resource's binding (KIP-373: who may create or describe tokens for a user; librdkafka names types up to
    TRANSACTIONAL_ID only), made by a raw CreateAcls: the view's DescribeAcls of every type still succeeds (else
    every topic would be refused), and the binding, naming 127.0.0.2, refuses rlm from there."""
    p = proxied
    binding = {"resource_type": USER, "resource_name": f"User:{SASL_PRINCIPAL}", "principal": f"User:{SASL_PRINCIPAL}",
               "host": CLIENT_HOST, "operation": DESCRIBE_TOKENS, "permission_type": ALLOW}
    with p.connect(p.broker, source=PROXY_HOST) as admin:
        assert p.authenticate(admin, ADMIN_USER).error_code == 0
        (made,) = call(admin, CREATE_ACLS, 1, {"creations": [{**binding, "resource_pattern_type": LITERAL}]}).results
        assert made.error_code == 0, made.error_message
        try:
            assert p.listener.authorizer.cache.refresh()
            with p.connect(p.proxy) as sock:
                assert p.authenticate(sock, SASL_PRINCIPAL).error_code == SASL_AUTHENTICATION_FAILED
        finally:
            (gone,) = call(admin, DELETE_ACLS, 1, {"filters": [{
                "resource_type_filter": USER, "resource_name_filter": binding["resource_name"],
                "pattern_type_filter": LITERAL, "principal_filter": binding["principal"], "host_filter": CLIENT_HOST,
                "operation": DESCRIBE_TOKENS, "permission_type": ALLOW}]}).filter_results
            assert gone.error_code == 0 and len(gone.matching_acls) == 1
    assert p.listener.authorizer.cache.refresh()
    with p.connect(p.proxy) as sock:
        assert p.authenticate(sock, SASL_PRINCIPAL).error_code == 0


# ------------------------------------------------------------------------------------------------ no broker
CLIENT, PROXY, ALICE = "10.0.0.5", "10.0.0.9", "User:alice"


def test_the_decision_is_kept_per_connection_for_the_acls_it_was_made_on(caplog: pytest.LogCaptureFixture) -> None:
    """Allowed once, a connection is not decided again (the view not even asked) until the view is refreshed or its
    ACLs expire; a binding of the client's host in the next fetch refuses it, counted, logged once per principal
    and address with the binding; ACLs older than the TTL (not fetched again) refuse it as unavailable."""
    answers: list[list[Acl]] = [[]]
    now = [100.0]
    cache = AclCache(lambda: answers[0], ttl_s=10, clock=lambda: now[0])
    assert cache.refresh()
    check = HostCheck(Authorizer(cache, HistoryAuthorizationSettings()))
    conn = SimpleNamespace(local_host=PROXY, forwardable_in=None)
    assert check.refused(ALICE, CLIENT, conn) is None  # type: ignore[arg-type]
    assert conn.forwardable_in == cache.generation
    asked: list[int] = []
    current = cache.current
    cache.current = lambda: asked.append(1) or current()  # type: ignore[method-assign]
    assert check.refused(ALICE, CLIENT, conn) is None  # type: ignore[arg-type]
    assert asked == []

    answers[0] = [Acl("LITERAL", "g", ALICE, CLIENT, "READ", False, "GROUP")]
    assert check.refused(ALICE, CLIENT, conn) is None  # type: ignore[arg-type]  # not fetched yet
    assert cache.refresh()
    before = refused()
    with caplog.at_level(logging.WARNING, logger="rlm.listener.upstream.hosts"):
        assert check.refused(ALICE, CLIENT, conn) == REFUSED_MESSAGE  # type: ignore[arg-type]
        other = SimpleNamespace(local_host=PROXY, forwardable_in=None)
        assert check.refused(ALICE, CLIENT, other) == REFUSED_MESSAGE  # type: ignore[arg-type]
    assert refused() == before + 2
    (line,) = [r for r in caplog.records if r.name == "rlm.listener.upstream.hosts"]
    assert line.binding == f"{ALICE} DENY READ from host {CLIENT} on GROUP LITERAL g"  # type: ignore[attr-defined]
    assert (line.principal, line.host, line.proxy_address) == (ALICE, CLIENT, PROXY)  # type: ignore[attr-defined]

    answers[0] = []
    assert cache.refresh()
    conn = SimpleNamespace(local_host=PROXY, forwardable_in=None)
    assert check.refused(ALICE, CLIENT, conn) is None  # type: ignore[arg-type]
    now[0] += 11  # no fetch since: the view is older than its TTL
    before = refused("unavailable")
    assert check.refused(ALICE, CLIENT, conn) == UNAVAILABLE_MESSAGE  # type: ignore[arg-type]
    assert refused("unavailable") == before + 1
    assert check.refused(ALICE, PROXY, conn) is None  # type: ignore[arg-type]  # the proxy's own address


def test_a_cluster_without_authorizer_is_decided_once_per_refresh() -> None:
    """No ACLs at all (no authorizer): nothing to widen, every client forwarded; the decision kept until the next
    refresh like any other (the failure current() gives does not expire)."""
    def no_authorizer() -> list[Acl]:
        raise AclsUnavailableError("no_authorizer", "SECURITY_DISABLED (test)")

    cache = AclCache(no_authorizer, ttl_s=10)
    assert not cache.refresh()
    check = HostCheck(Authorizer(cache, HistoryAuthorizationSettings()))
    conn = SimpleNamespace(local_host=PROXY, forwardable_in=None)
    assert check.refused(ALICE, CLIENT, conn) is None  # type: ignore[arg-type]
    assert conn.forwardable_in == cache.generation and cache.unchanged_since(cache.generation)
    assert not cache.refresh()
    assert not cache.unchanged_since(conn.forwardable_in)
