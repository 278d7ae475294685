"""Security of the history endpoint (issue 11): TLS, SASL PLAIN and SCRAM-SHA-512, and the start-up refusal of an
unauthenticated listener other hosts can reach.

Against the real broker: an in-process sidecar tiers a small topic once (module fixture); each test starts the
endpoint with one security set-up on a free port of 127.0.0.1 and reads the tier with confluent-kafka (``assign``),
and, for SCRAM, with Kafka's Java console consumer. Certificates (a CA, the endpoint's, a client's) are made here
with ``cryptography``. Self-contained: nothing from ``tests/rlm/listener/conftest.py``.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition

from devtools.devkafka import KafkaCluster
from rlm.config import ConfigError, HistoryListenerSettings, SidecarSettings, load_settings
from rlm.listener import Listener, start_listener
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.rlm.listener.pki import Pki, make_pki
from tests.rlm.listener.raw_wire import closed, kstr, recv_frame, request
from tests.support.sidecar import latest_remote, make_settings, only, produce_segments, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ALICE, ALICE_PW = "alice", f"alice-{uuid.uuid4().hex}"
BOB, BOB_PW = "bob,=x", f"bob-{uuid.uuid4().hex}"  # SCRAM escapes ',' and '=' in names: exercised by bob
WRONG_PW = f"wrong-{uuid.uuid4().hex}"
USERS = {ALICE: ALICE_PW, BOB: BOB_PW}


@dataclass
class Tiered:
    kafka: KafkaCluster
    settings: SidecarSettings
    sidecar: Sidecar
    topic: str
    sent: dict[int, tuple[bytes, bytes]]  # offset -> (key, value), every offset tiered


@pytest.fixture(scope="module")
def tiered(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiered]:
    tmp = tmp_path_factory.mktemp("history-security")
    topic = f"hist-sec-{uuid.uuid4().hex[:8]}"
    topic_id = kafka.create_topic(topic, 1, config={"segment.ms": "300"})
    sent = produce_segments(kafka, topic, rounds=3, per_round=100, segment_ms=300)
    settings = make_settings(kafka, tmp, topics=only(topic))
    sidecar = Sidecar(settings).start()
    try:
        tp = TopicIdPartition(topic_id, topic, 0)
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 60, "every produced offset to be tiered")
        yield Tiered(kafka, settings, sidecar, topic, sent)
    finally:
        sidecar.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@contextmanager
def endpoint(t: Tiered, **listener: Any) -> Iterator[Listener]:
    """The history endpoint of the tiered topic with these ``history_listener`` settings, on a free port."""
    # The test cluster has no authorizer: its topics are open to every client, as the cluster's own listeners.
    cfg = HistoryListenerSettings(**{"port": 0, "fetch_poll_ms": 50,
                                     "authorization": {"allow_if_no_authorizer": True}, **listener})
    history = start_listener(t.settings.model_copy(update={"history_listener": cfg}), t.sidecar.rsm)
    try:
        yield history
    finally:
        history.stop()


def sasl(mechanism: str, user: str, password: str, protocol: str = "SASL_PLAINTEXT") -> dict[str, Any]:
    return {"security.protocol": protocol, "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": password}


def consume(t: Tiered, port: int, conf: dict[str, Any], *, timeout_s: float = 30.0,
            want: int | None = None) -> tuple[dict[int, tuple[bytes, bytes]], list[KafkaError]]:
    """Read partition 0 from offset 0 with ``assign`` until ``want`` records (default: every tiered one; 0: until
    the first error) or ``timeout_s``; returns (offset -> (key, value), the client's errors)."""
    errors: list[KafkaError] = []
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": f"g-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "error_cb": errors.append, "reconnect.backoff.ms": 200,
                  "reconnect.backoff.max.ms": 1000, **conf})
    got: dict[int, tuple[bytes, bytes]] = {}
    want = len(t.sent) if want is None else want
    try:
        c.assign([TopicPartition(t.topic, 0, 0)])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and (len(got) < want if want else not errors):
            for m in c.consume(500, timeout=0.5):
                if m.error() is None:
                    got[m.offset()] = (m.key(), m.value())
                elif m.error().code() != KafkaError._PARTITION_EOF:
                    errors.append(m.error())
    finally:
        c.close()
    return got, errors


def auth_failed(errors: list[KafkaError]) -> bool:
    return any(e.code() == KafkaError._AUTHENTICATION or "Authentication failed" in e.str() for e in errors)


# ------------------------------------------------------------------------------------- raw protocol helpers
METADATA_V1_ALL = request(3, 1, struct.pack(">i", -1))  # topics: null = all
SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
UNSUPPORTED_VERSION, UNSUPPORTED_SASL_MECHANISM, SASL_AUTHENTICATION_FAILED = 35, 33, 58


# ------------------------------------------------------------------------------------------------- the tests
def test_sasl_plaintext_plain(tiered: Tiered, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    with endpoint(tiered, sasl={"mechanisms": ["PLAIN"], "users": USERS}) as h:
        got, errors = consume(tiered, h.port, sasl("PLAIN", ALICE, ALICE_PW))
        assert got == tiered.sent, errors
        got, errors = consume(tiered, h.port, sasl("PLAIN", BOB, BOB_PW), want=1)
        assert got, errors
        # A wrong password, or SCRAM where only PLAIN is enabled: an authentication error, no record.
        got, errors = consume(tiered, h.port, sasl("PLAIN", ALICE, WRONG_PW), timeout_s=10, want=0)
        assert not got and auth_failed(errors), errors
        got, errors = consume(tiered, h.port, sasl("PLAIN", "mallory", ALICE_PW), timeout_s=10, want=0)
        assert not got and auth_failed(errors), errors
        got, errors = consume(tiered, h.port, sasl("SCRAM-SHA-512", ALICE, ALICE_PW), timeout_s=10, want=0)
        assert not got and errors, errors
        # A client without SASL: the first request that is not ApiVersions closes its connection.
        got, errors = consume(tiered, h.port, {"security.protocol": "PLAINTEXT"}, timeout_s=5, want=0)
        assert not got
        with socket.create_connection(("127.0.0.1", h.port), timeout=10) as s:
            s.sendall(METADATA_V1_ALL)
            assert closed(s)
    # No password reaches the logs, right or wrong: neither the messages nor their extra fields.
    assert "client authenticated" in caplog.text and "authentication failed" in caplog.text
    logged = caplog.text + "".join(repr(vars(r)) for r in caplog.records)
    assert ALICE_PW not in logged and BOB_PW not in logged and WRONG_PW not in logged


def test_sasl_plaintext_scram_sha_512(tiered: Tiered, tmp_path: Path) -> None:
    with endpoint(tiered, sasl={"mechanisms": ["SCRAM-SHA-512", "PLAIN"], "users": USERS}) as h:
        got, errors = consume(tiered, h.port, sasl("SCRAM-SHA-512", ALICE, ALICE_PW))
        assert got == tiered.sent, errors
        got, errors = consume(tiered, h.port, sasl("SCRAM-SHA-512", BOB, BOB_PW), want=1)
        assert got, errors
        got, errors = consume(tiered, h.port, sasl("SCRAM-SHA-512", ALICE, WRONG_PW), timeout_s=10, want=0)
        assert not got and auth_failed(errors), errors
        got, errors = consume(tiered, h.port, sasl("SCRAM-SHA-512", "mallory", WRONG_PW), timeout_s=10, want=0)
        assert not got and auth_failed(errors), errors
        # PLAIN is enabled as well on this listener.
        got, errors = consume(tiered, h.port, sasl("PLAIN", ALICE, ALICE_PW), want=1)
        assert got, errors

        # Kafka's Java console consumer over SCRAM-SHA-512 (assign: --partition).
        props = tmp_path / "consumer.properties"
        props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
                         "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                         f'username="{ALICE}" password="{ALICE_PW}";\n')
        proc = tiered.kafka.run_class("org.apache.kafka.tools.consumer.ConsoleConsumer", [
            "--bootstrap-server", f"127.0.0.1:{h.port}", "--topic", tiered.topic, "--partition", "0",
            "--offset", "earliest", "--max-messages", str(len(tiered.sent)), "--timeout-ms", "30000",
            "--command-config", str(props), "--formatter-property", "print.key=true",
            "--formatter-property", "key.separator=|"], timeout=90)
        lines = [ln for ln in proc.stdout.splitlines() if ln]
        expected = [f"{k.decode()}|{v.decode()}" for _o, (k, v) in sorted(tiered.sent.items())]
        assert lines == expected, (proc.returncode, proc.stderr[-3000:])


def test_sasl_ssl(tiered: Tiered, pki: Pki) -> None:
    tls = {"certfile": str(pki.cert), "keyfile": str(pki.key)}
    with endpoint(tiered, tls=tls, sasl={"mechanisms": ["PLAIN", "SCRAM-SHA-512"], "users": USERS}) as h:
        ca = {"ssl.ca.location": str(pki.ca)}
        for mechanism in ("PLAIN", "SCRAM-SHA-512"):
            got, errors = consume(tiered, h.port, {**sasl(mechanism, ALICE, ALICE_PW, "SASL_SSL"), **ca})
            assert got == tiered.sent, (mechanism, errors)
        got, errors = consume(tiered, h.port, {**sasl("SCRAM-SHA-512", ALICE, WRONG_PW, "SASL_SSL"), **ca},
                              timeout_s=10, want=0)
        assert not got and auth_failed(errors), errors
        got, errors = consume(tiered, h.port, {"security.protocol": "SSL", **ca}, timeout_s=5, want=0)
        assert not got
        # The TLS is real: a client that does not trust the CA fails the handshake.
        got, errors = consume(tiered, h.port, sasl("PLAIN", ALICE, ALICE_PW, "SASL_SSL"), timeout_s=5, want=0)
        assert not got and errors


def test_tls_with_client_certificates(tiered: Tiered, pki: Pki) -> None:
    tls = {"certfile": str(pki.cert), "keyfile": str(pki.key), "cafile": str(pki.ca)}
    # Client certificates authenticate: this listener could bind a non-loopback host without allow_unauthenticated.
    assert HistoryListenerSettings(host="10.1.2.3", tls=tls).authenticated
    with endpoint(tiered, tls=tls) as h:
        mtls = {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca),
                "ssl.certificate.location": str(pki.client_cert), "ssl.key.location": str(pki.client_key)}
        got, errors = consume(tiered, h.port, mtls)
        assert got == tiered.sent, errors
        # No client certificate: the handshake fails, nothing is read.
        got, errors = consume(tiered, h.port, {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca)},
                              timeout_s=5, want=0)
        assert not got and errors
        # Plaintext on the TLS port: nothing either.
        got, _errors = consume(tiered, h.port, {}, timeout_s=3, want=0)
        assert not got
        # ApiVersions lists no SASL API on a listener without SASL.
        ctx = ssl.create_default_context(cafile=str(pki.ca))
        ctx.load_cert_chain(pki.client_cert, pki.client_key)
        with ctx.wrap_socket(socket.create_connection(("127.0.0.1", h.port), timeout=10),
                             server_hostname="127.0.0.1") as s:
            s.sendall(request(18, 0, b""))
            resp = recv_frame(s)
            assert resp is not None
            (n,) = struct.unpack_from(">i", resp, 6)
            keys = {struct.unpack_from(">h", resp, 10 + 6 * i)[0] for i in range(n)}
            assert 1 in keys and SASL_HANDSHAKE not in keys and SASL_AUTHENTICATE not in keys


def test_sasl_protocol_rules(tiered: Tiered) -> None:
    """Before authentication: ApiVersions lists the SASL APIs; SaslHandshake v0 is refused; an unknown mechanism
    gets UNSUPPORTED_SASL_MECHANISM; each then closes; so do an oversized frame and a request out of turn."""
    with endpoint(tiered, sasl={"mechanisms": ["SCRAM-SHA-512"], "users": USERS}) as h:
        def connect() -> socket.socket:
            return socket.create_connection(("127.0.0.1", h.port), timeout=10)

        with connect() as s:
            s.sendall(request(18, 0, b""))
            resp = recv_frame(s)
            assert resp is not None
            (n,) = struct.unpack_from(">i", resp, 6)
            keys = {struct.unpack_from(">h", resp, 10 + 6 * i)[0] for i in range(n)}
            assert {SASL_HANDSHAKE, SASL_AUTHENTICATE} <= keys
            s.sendall(request(SASL_HANDSHAKE, 0, kstr("SCRAM-SHA-512")))
            resp = recv_frame(s)
            assert resp is not None and struct.unpack_from(">h", resp, 4)[0] == UNSUPPORTED_VERSION
            assert closed(s)
        with connect() as s:
            s.sendall(request(SASL_HANDSHAKE, 1, kstr("GSSAPI")))
            resp = recv_frame(s)
            assert resp is not None and struct.unpack_from(">h", resp, 4)[0] == UNSUPPORTED_SASL_MECHANISM
            assert b"SCRAM-SHA-512" in resp
            assert closed(s)
        with connect() as s:  # SaslAuthenticate before SaslHandshake
            s.sendall(request(SASL_AUTHENTICATE, 1, struct.pack(">i", 3) + b"abc"))
            assert closed(s)
        with connect() as s:  # a bad SCRAM client-first message
            s.sendall(request(SASL_HANDSHAKE, 1, kstr("SCRAM-SHA-512")))
            resp = recv_frame(s)
            assert resp is not None and struct.unpack_from(">h", resp, 4)[0] == 0
            s.sendall(request(SASL_AUTHENTICATE, 1, struct.pack(">i", 5) + b"n,,x="))
            resp = recv_frame(s)
            assert resp is not None and struct.unpack_from(">h", resp, 4)[0] == SASL_AUTHENTICATION_FAILED
            assert closed(s)
        with connect() as s:  # 1 MiB before authentication: more than Kafka's sasl.server.max.receive.size
            s.sendall(struct.pack(">i", 1 << 20) + b"\0" * 64)
            assert closed(s)


# ----------------------------------------------------------------------------------------- configuration
BASE = """
broker_id: 1
log_dirs: [/var/lib/kafka/data]
kafka: {bootstrap_servers: 127.0.0.1:9092}
"""


def load(tmp_path: Path, history: str) -> SidecarSettings:
    p = tmp_path / "sidecar.yaml"
    p.write_text(BASE + history)
    return load_settings(p)


@pytest.mark.parametrize("history", [
    "history_listener: {host: 0.0.0.0, advertised_host: reader.example}",
    "history_listener: {host: 10.1.2.3}",
    "history_listener: {host: reader.example, tls: {certfile: /c.pem}}",  # TLS alone does not authenticate
])
def test_unauthenticated_non_loopback_listener_refused(tmp_path: Path, history: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, history)
    msg = str(exc.value)
    assert "history_listener" in msg and "allow_unauthenticated" in msg and "history_listener.sasl" in msg


@pytest.mark.parametrize("history", [
    "history_listener: {}",  # 127.0.0.1
    "history_listener: {host: localhost}",
    "history_listener: {host: '::1'}",
    "history_listener: {host: 0.0.0.0, advertised_host: r.example, allow_unauthenticated: true}",
    "history_listener: {host: 10.1.2.3, sasl: {users: {a: pw}}}",
    "history_listener: {host: 10.1.2.3, tls: {certfile: /c.pem, cafile: /ca.pem}}",
])
def test_listener_allowed(tmp_path: Path, history: str) -> None:
    assert load(tmp_path, history).history_listener is not None


@pytest.mark.parametrize(("history", "field"), [
    ("history_listener: {sasl: {mechanisms: [GSSAPI], users: {a: pw}}}", "history_listener.sasl.mechanisms"),
    ("history_listener: {sasl: {users: {}}}", "history_listener.sasl.users"),
    ("history_listener: {sasl: {users: {a: ''}}}", "history_listener.sasl.users"),
    ("history_listener: {sasl: {users: {a: pw}, scram_iterations: 100}}", "history_listener.sasl.scram_iterations"),
    ("history_listener: {tls: {keyfile: /k.pem}}", "history_listener.tls.certfile"),
])
def test_bad_security_field_is_named(tmp_path: Path, history: str, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load(tmp_path, history)
    assert field in str(exc.value)


def test_tls_file_that_cannot_load_is_named(tiered: Tiered, tmp_path: Path) -> None:
    (tmp_path / "bad.pem").write_text("not a certificate")
    with pytest.raises(ConfigError) as exc, endpoint(tiered, tls={"certfile": str(tmp_path / "bad.pem")}):
        pass
    assert "history_listener.tls.certfile" in str(exc.value)


def test_passwords_are_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                              caplog: pytest.LogCaptureFixture) -> None:
    """Passwords from the file or the environment (RLM_HISTORY_LISTENER__SASL__USERS__<name>) never show in repr,
    str, dumps or logs."""
    env_pw = f"env-{uuid.uuid4().hex}"
    monkeypatch.setenv("RLM_HISTORY_LISTENER__SASL__USERS__carol", env_pw)
    caplog.set_level(logging.DEBUG)
    s = load(tmp_path, f"history_listener:\n  sasl: {{users: {{{ALICE}: {ALICE_PW}}}}}\n")
    cfg = s.history_listener
    assert cfg is not None and cfg.sasl is not None
    assert cfg.sasl.users["carol"].get_secret_value() == env_pw  # the environment's user is merged in
    assert cfg.sasl.users[ALICE].get_secret_value() == ALICE_PW
    for text in (repr(s), str(s), repr(cfg), str(cfg.sasl), s.model_dump_json(), str(s.model_dump()), caplog.text):
        assert ALICE_PW not in text and env_pw not in text

    from rlm.listener.net.sasl import SaslAuthenticator

    auth = SaslAuthenticator(cfg.sasl)
    assert auth.credentials.check_plain("carol", env_pw) and not auth.credentials.check_plain("carol", ALICE_PW)
    assert ALICE_PW not in repr(vars(auth.credentials)) and env_pw not in repr(vars(auth.credentials))


def test_scram_credentials() -> None:
    """SCRAM names are looked up as given (scramp has unescaped ``=2C`` and ``=3D`` once already: issue 22, r3;
    ``test_hardening.test_scram_names_are_unescaped_once``); an unknown user gets a salt as long as a real one
    and the same one every time (a client cannot tell unknown users from wrong passwords by the salt)."""
    from pydantic import SecretStr

    from rlm.listener.net.sasl import ScramCredentials

    creds = ScramCredentials({ALICE: SecretStr(ALICE_PW), BOB: SecretStr(BOB_PW)})
    assert BOB in creds and creds.lookup(BOB)[1] != creds.lookup("mallory")[1]  # the real stored key
    assert creds.lookup("bob=2C=3Dx")[1] == creds.lookup("mallory")[1]  # no second unescaping: an unknown name
    assert creds.lookup("mallory")[0] == creds.lookup("mallory")[0] != creds.lookup("trudy")[0]
    assert len(creds.lookup("mallory")[0]) == len(creds.lookup(ALICE)[0])
    assert creds.check_plain(ALICE, ALICE_PW) and creds.check_plain(BOB, BOB_PW)
    assert not creds.check_plain(ALICE, BOB_PW) and not creds.check_plain("mallory", ALICE_PW)
