"""The history endpoint applies the cluster's own ACLs (issue 22), on the SASL cluster with KRaft's
StandardAuthorizer (``kafka_sasl``): the endpoint serves a principal what the cluster's listeners would, no more.

One sidecar (as the cluster's super user) tiers four small topics once; each test starts the endpoint with the
settings it needs and reads through it with confluent-kafka (``assign``) and with raw requests (kio) where the
exact answer matters. Principals are the endpoint's own SASL users (``User:alice-<tag>``...) or client
certificates mapped by ``principal_mapping_rules``; the ACLs about them are created on the cluster with
confluent-kafka's admin client. Names carry a tag per module run: the session cluster keeps its ACLs. The same
rules without a broker, and the subject string against Java's: ``test_acl_rules.py``.
"""

from __future__ import annotations

import logging
import socket
import ssl
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from devtools.devkafka import KafkaCluster
from rlm.config import HistoryListenerSettings, KafkaSettings, SidecarSettings
from rlm.listener import Listener, authz, start_listener
from rlm.listener.authz import AclCache, Acls, ClusterAcls
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.rlm.listener.pki import Pki, make_pki
from tests.rlm.listener.raw_wire import call, plain_login
from tests.support.fixtures import SASL_READER
from tests.support.kafka import grant, produce
from tests.support.sidecar import latest_remote, make_settings, produce_segments, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TOPIC_AUTHORIZATION_FAILED = 29
METADATA, LIST_OFFSETS, FETCH = 3, 2, 1
TTL_MS = 2000  # the ACL cache's TTL in these tests (refreshed every second)


@dataclass
class Tier:
    kafka: KafkaCluster
    settings: SidecarSettings
    sidecar: Sidecar
    tag: str
    sent: dict[str, dict[int, tuple[bytes, bytes]]]  # topic -> offset -> (key, value), all tiered
    users: dict[str, str]  # the endpoint's SASL users -> passwords

    def topic(self, what: str) -> str:
        return f"acl-{self.tag}-{what}"

    def user(self, who: str) -> str:
        return f"{who}-{self.tag}"


@pytest.fixture(scope="module")
def tier(kafka_sasl: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tier]:
    kc, tag = kafka_sasl, uuid.uuid4().hex[:6]
    tmp = tmp_path_factory.mktemp("history-acls")
    topics = {w: f"acl-{tag}-{w}" for w in ("a", "b", "pre-c", "d")}
    ids = {w: kc.create_topic(t, 1, config={"segment.ms": "300"}) for w, t in topics.items()}
    sent = {t: produce_segments(kc, t, rounds=2, per_round=20, segment_ms=300, roll=False, **kc.security_config())
            for t in topics.values()}
    for t in topics.values():  # one more record rolls the segment of the last round
        produce(kc, t, [(b"__roll__", b"r")], **kc.security_config())
    settings = make_settings(kc, tmp, topics={"include": [f"acl-{tag}-.*"]})
    settings = settings.model_copy(update={"kafka": KafkaSettings(bootstrap_servers=kc.bootstrap_servers,
                                                                  client=kc.security_config())})
    sidecar = Sidecar(settings).start()
    try:
        for w, t in topics.items():
            tp, end = TopicIdPartition(ids[w], t, 0), max(sent[t])
            wait_for(lambda tp=tp, end=end: latest_remote(sidecar, tp) >= end, 90, f"{t} to be tiered")
        users = {f"{who}-{tag}": f"{who}-{uuid.uuid4().hex}" for who in ("alice", "bob", "carol")}
        yield Tier(kc, settings, sidecar, tag, sent, users)
    finally:
        sidecar.stop()


@contextmanager
def endpoint(t: Tier, *, kafka_user: str | None = None, **listener: Any) -> Iterator[Listener]:
    """The endpoint with SASL PLAIN (the tier's users) unless ``listener`` says otherwise, ACLs cached for
    ``TTL_MS``; it describes the cluster's ACLs as the super user, or as ``kafka_user``."""
    cfg = HistoryListenerSettings(**{"port": 0, "fetch_poll_ms": 50, "fetch_max_wait_ms": 100,
                                     "sasl": {"mechanisms": ["PLAIN"], "users": t.users},
                                     "authorization": {"acl_cache_ttl_ms": TTL_MS}, **listener})
    update: dict[str, Any] = {"history_listener": cfg}
    if kafka_user is not None:
        update["kafka"] = KafkaSettings(bootstrap_servers=t.kafka.bootstrap_servers,
                                        client=t.kafka.security_config(kafka_user))
    history = start_listener(t.settings.model_copy(update=update), t.sidecar.rsm, rlmm=t.sidecar.rlmm)
    try:
        wait_for(lambda: all(t.topic(w) in history.catalog.topics() for w in ("a", "b", "pre-c", "d")), 30,
                 "the topics served")
        yield history
    finally:
        history.stop()


def allow(t: Tier, who: str, name: str, op: AclOperation = AclOperation.READ, *, prefixed: bool = False,
          deny: bool = False) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, name, ResourcePatternType.PREFIXED if prefixed else
                      ResourcePatternType.LITERAL, who, "*", op,
                      AclPermissionType.DENY if deny else AclPermissionType.ALLOW)


def sasl(t: Tier, who: str) -> dict[str, Any]:
    user = t.user(who)
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": user,
            "sasl.password": t.users[user]}


def consume(h: Listener, conf: dict[str, Any], topic: str, want: int, timeout_s: float = 20.0
            ) -> tuple[dict[int, tuple[bytes, bytes]], list[int]]:
    """Read ``topic`` partition 0 from offset 0 through the endpoint until ``want`` records or the first error;
    returns (offset -> (key, value), the error codes seen). (librdkafka retries a topic it may not describe
    silently: refusals are asserted with raw requests.)"""
    errors: list[int] = []
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{h.port}", "group.id": f"g-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "error_cb": lambda e: errors.append(e.code()), **conf})
    got: dict[int, tuple[bytes, bytes]] = {}
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and len(got) < want and not errors:
            for m in c.consume(500, timeout=0.5):
                if m.error() is None:
                    got[m.offset()] = (m.key(), m.value())
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    errors.append(m.error().code())
    finally:
        c.close()
    return got, errors


@contextmanager
def raw(t: Tier, h: Listener, who: str) -> Iterator[socket.socket]:
    s = socket.create_connection(("127.0.0.1", h.port), timeout=20)
    user = t.user(who)
    try:
        assert plain_login(s, user, t.users[user])
        yield s
    finally:
        s.close()


def metadata_names(s: socket.socket, topics: list[str] | None = None) -> dict[str, int]:
    resp = call(s, METADATA, 4, {"topics": None if topics is None else [{"name": n} for n in topics],
                                 "allow_auto_topic_creation": False})
    return {m.name: m.error_code for m in resp.topics}


def fetch_errors(s: socket.socket, topics: list[str]) -> dict[str, int]:
    resp = call(s, FETCH, 4, {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 2**20,
                              "isolation_level": 0, "topics": [
                                  {"topic": n, "partitions": [{"partition": 0, "fetch_offset": 0,
                                                               "partition_max_bytes": 2**20}]} for n in topics]})
    return {r.topic: r.partitions[0].error_code for r in resp.responses}


def list_offsets_errors(s: socket.socket, topics: list[str]) -> dict[str, int]:
    resp = call(s, LIST_OFFSETS, 1, {"replica_id": -1, "topics": [
        {"name": n, "partitions": [{"partition_index": 0, "timestamp": -2}]} for n in topics]})
    return {r.name: r.partitions[0].error_code for r in resp.topics}


# ------------------------------------------------------------------------------------------------- the tests
def test_acl_refreshes_keep_one_admin_client(kafka_sasl: KafkaCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ACL cache asks the cluster through one admin client, kept from one refresh to the next: a client a
    refresh started ~4 librdkafka threads (and a SASL handshake) every ``acl_cache_ttl_ms / 2`` and destroyed them,
    ~1 thread a second in a listener serving nothing else. Each refresh still asks the cluster afresh: an ACL
    granted after one refresh is in the next. (The clients are counted by a subclass of the real one: every
    request goes to the broker.)"""
    kc, tag = kafka_sasl, uuid.uuid4().hex[:6]
    granting = AdminClient(kc.admin_config())  # made before the count starts
    made: list[object] = []

    class Counted(AdminClient):  # type: ignore[misc]
        def __init__(self, conf: dict[str, Any]) -> None:
            made.append(conf.get("bootstrap.servers"))
            super().__init__(conf)

    monkeypatch.setattr(authz, "AdminClient", Counted)
    source = ClusterAcls(KafkaSettings(bootstrap_servers=kc.bootstrap_servers,
                                       client=kc.security_config()).client_config())
    cache = AclCache(source, 10, close=source.close)
    try:
        for i in range(4):
            topic = f"keep-{tag}-{i}"
            binding = AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:keep-{tag}", "*",
                                 AclOperation.READ, AclPermissionType.ALLOW)
            for fut in granting.create_acls([binding]).values():
                fut.result(30)

            def seen(topic: str = topic) -> bool:
                assert cache.refresh(), cache.current()
                acls = cache.current()
                return isinstance(acls, Acls) and bool(acls.on(topic))
            wait_for(seen, 30, f"the ACL on {topic} in a refresh")
        assert made == [kc.bootstrap_servers], f"{len(made)} admin clients for the refreshes, not one"
    finally:
        cache.stop()


def test_read_on_a_not_b(tier: Tier) -> None:
    """Alice may READ ``a`` (a literal ACL): she reads every tiered record of it; ``b`` is TOPIC_AUTHORIZATION_FAILED
    for Fetch and ListOffsets, and Metadata of all topics lists ``a`` alone. A topic that does not exist answers the
    same as one she may not see (nothing is told of it). Bob, with no ACL, sees no topic at all."""
    a, b = tier.topic("a"), tier.topic("b")
    alice = f"User:{tier.user('alice')}"
    grant(tier.kafka, allow(tier, alice, a))
    with endpoint(tier) as h:
        got, errors = consume(h, sasl(tier, "alice"), a, want=len(tier.sent[a]))
        assert got == tier.sent[a], errors
        nowhere = tier.topic("nowhere")
        with raw(tier, h, "alice") as s:
            assert {n for n in metadata_names(s) if n.startswith(f"acl-{tier.tag}-")} == {a}
            assert metadata_names(s, [a, b, nowhere]) == {a: 0, b: TOPIC_AUTHORIZATION_FAILED,
                                                           nowhere: TOPIC_AUTHORIZATION_FAILED}
            assert fetch_errors(s, [a, b, nowhere]) == {a: 0, b: TOPIC_AUTHORIZATION_FAILED,
                                                        nowhere: TOPIC_AUTHORIZATION_FAILED}
            assert list_offsets_errors(s, [a, b]) == {a: 0, b: TOPIC_AUTHORIZATION_FAILED}
        with raw(tier, h, "bob") as s:
            assert not [n for n in metadata_names(s) if n.startswith(f"acl-{tier.tag}-")]
            assert fetch_errors(s, [a]) == {a: TOPIC_AUTHORIZATION_FAILED}


def test_describe_lists_but_does_not_read(tier: Tier) -> None:
    """DESCRIBE on ``d``: listed in Metadata, its offsets answered, its records refused (READ is needed)."""
    d = tier.topic("d")
    grant(tier.kafka, allow(tier, f"User:{tier.user('carol')}", d, AclOperation.DESCRIBE))
    with endpoint(tier) as h, raw(tier, h, "carol") as s:
        assert metadata_names(s, [d]) == {d: 0}
        assert list_offsets_errors(s, [d]) == {d: 0}
        assert fetch_errors(s, [d]) == {d: TOPIC_AUTHORIZATION_FAILED}


def test_prefixed_acl_and_deny_over_allow(tier: Tier) -> None:
    """A PREFIXED ALLOW on ``acl-<tag>-`` lets bob read every tiered topic of the module but ``b``, on which a
    literal DENY wins."""
    prefix, b = f"acl-{tier.tag}-", tier.topic("b")
    bob = f"User:{tier.user('bob')}"
    grant(tier.kafka, allow(tier, bob, prefix, prefixed=True), allow(tier, bob, b, deny=True))
    with endpoint(tier) as h:
        c = tier.topic("pre-c")
        got, errors = consume(h, sasl(tier, "bob"), c, want=len(tier.sent[c]))
        assert got == tier.sent[c], errors
        with raw(tier, h, "bob") as s:
            assert fetch_errors(s, [tier.topic(w) for w in ("a", "b", "pre-c", "d")]) == {
                tier.topic("a"): 0, b: TOPIC_AUTHORIZATION_FAILED, c: 0, tier.topic("d"): 0}


def test_removed_acl_takes_effect_within_the_ttl(tier: Tier) -> None:
    """Carol reads ``pre-c`` while she has READ on it; once the ACL is deleted on the cluster she is refused within
    the cache's TTL (2 s here; waited for up to 2 s more for the refresh under load), on the same connection."""
    c = tier.topic("pre-c")
    carol = f"User:{tier.user('carol')}"
    grant(tier.kafka, allow(tier, carol, c))
    with endpoint(tier) as h, raw(tier, h, "carol") as s:
        assert fetch_errors(s, [c]) == {c: 0}
        admin = AdminClient(tier.kafka.admin_config())
        flt = AclBindingFilter(ResourceType.TOPIC, c, ResourcePatternType.LITERAL, carol, None,
                               AclOperation.ANY, AclPermissionType.ANY)
        for fut in admin.delete_acls([flt]).values():
            assert fut.result(30), "the ACL to delete"
        wait_for(lambda: fetch_errors(s, [c]) == {c: TOPIC_AUTHORIZATION_FAILED}, (TTL_MS + 2000) / 1000,
                 "the removed ACL to take effect")


def test_client_certificate_mapped_to_a_principal(tier: Tier, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Mutual TLS, no SASL: the certificate ``CN=Dora-<tag>,OU=history,O=rlm`` is ``User:dora-<tag>`` by the rule
    ``RULE:^CN=([^,]*),OU=history,.*$/$1/L`` and reads ``a`` by that principal's ACL, not ``b``; a certificate no
    rule matches (``OU=other``) is refused at once."""
    dora = f"Dora-{tier.tag}"
    pki: Pki = make_pki(tmp_path_factory.mktemp("acl-pki"),
                        clients=(f"CN={dora},OU=history,O=rlm", f"CN=eve-{tier.tag},OU=other,O=rlm"))
    a, b = tier.topic("a"), tier.topic("b")
    grant(tier.kafka, allow(tier, f"User:{dora.lower()}", a))
    tls = {"certfile": str(pki.cert), "keyfile": str(pki.key), "cafile": str(pki.ca),
           "principal_mapping_rules": ["RULE:^CN=([^,]*),OU=history,.*$/$1/L"]}
    with endpoint(tier, sasl=None, tls=tls) as h:
        (dora_cert, dora_key), (eve_cert, eve_key) = pki.clients.values()
        conf = {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca)}
        got, errors = consume(h, {**conf, "ssl.certificate.location": str(dora_cert),
                                  "ssl.key.location": str(dora_key)}, a, want=len(tier.sent[a]))
        assert got == tier.sent[a], errors
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        ctx.load_cert_chain(str(dora_cert), str(dora_key))
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", h.port), timeout=20),
                             server_hostname="127.0.0.1") as s:
            assert fetch_errors(s, [a, b]) == {a: 0, b: TOPIC_AUTHORIZATION_FAILED}
        refused_before = _closed("principal_mapping")
        got, errors = consume(h, {**conf, "ssl.certificate.location": str(eve_cert),
                                  "ssl.key.location": str(eve_key)}, a, want=1, timeout_s=5)
        assert got == {} and errors, "a certificate no rule maps must not read"
        assert _closed("principal_mapping") > refused_before


def test_sidecar_that_cannot_describe_acls_fails_closed(tier: Tier, caplog: pytest.LogCaptureFixture) -> None:
    """The endpoint's own Kafka principal (``reader``: DESCRIBE and DESCRIBE_CONFIGS on the topics, to serve them;
    nothing on the cluster) cannot
    describe the ACLs: every topic is refused, even to a principal the ACLs allow, counted and logged once (not per
    request), and the endpoint keeps answering."""
    from rlm.listener.authz import AUTHORIZATIONS

    a = tier.topic("a")
    grant(tier.kafka, allow(tier, f"User:{tier.user('alice')}", a),
          allow(tier, f"User:{SASL_READER}", f"acl-{tier.tag}-", AclOperation.DESCRIBE, prefixed=True),
          allow(tier, f"User:{SASL_READER}", f"acl-{tier.tag}-", AclOperation.DESCRIBE_CONFIGS, prefixed=True))
    caplog.set_level(logging.INFO, logger="rlm.listener")
    before = AUTHORIZATIONS.labels("READ", "unavailable")._value.get()
    with endpoint(tier, kafka_user=SASL_READER) as h, raw(tier, h, "alice") as s:
        for _ in range(3):
            assert fetch_errors(s, [a]) == {a: TOPIC_AUTHORIZATION_FAILED}
        assert not [n for n in metadata_names(s) if n.startswith(f"acl-{tier.tag}-")]
    assert AUTHORIZATIONS.labels("READ", "unavailable")._value.get() - before == 3
    lines = [r for r in caplog.records if "cannot fetch the cluster's ACLs" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.ERROR, [r.getMessage() for r in lines]
    assert "DESCRIBE on the cluster" in lines[0].__dict__["error"]


def _closed(reason: str) -> float:
    from rlm.listener.net.server import CLOSED

    return CLOSED.labels(reason)._value.get()
