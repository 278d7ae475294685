"""The history endpoint's authorization rules without a broker: Kafka's ACL decision (literal, prefixed and wildcard
patterns, DENY over ALLOW, implied operations, hosts, super users, no ACL found), the ACL cache failing closed, and
certificate subjects mapped to principals as Kafka's ``ssl.principal.mapping.rules`` do (the subject string checked
against Java's own ``X500Principal.getName()``). The same rules against the real cluster: ``test_acls.py``."""

from __future__ import annotations

import datetime
import subprocess
import textwrap
import time
from pathlib import Path

import pytest

from rlm.config import HistoryAuthorizationSettings, HistoryTlsSettings
from rlm.listener.authz import (
    DESCRIBE,
    READ,
    Acl,
    AclCache,
    Acls,
    AclsUnavailableError,
    Authorizer,
    Unavailable,
    forwarding_blocked,
)
from rlm.listener.net.principals import NoMatchingRuleError, PrincipalMapper, parse_mapping_rules, subject_dn

ALICE, BOB = "User:alice", "User:bob"


def acl(name: str, op: str = READ, *, principal: str = ALICE, allow: bool = True, prefixed: bool = False,
        host: str = "*") -> Acl:
    return Acl("PREFIXED" if prefixed else "LITERAL", name, principal, host, op, allow)


def allows(acls: list[Acl], topic: str, op: str = READ, principal: str = ALICE, host: str = "10.0.0.1",
           if_none: bool = False) -> bool:
    return Acls(acls).allows(principal, host, op, topic, if_none=if_none)


@pytest.mark.parametrize(("acls", "topic", "op", "expected"), [
    ([acl("orders")], "orders", READ, True),
    ([acl("orders")], "orders-eu", READ, False),  # literal: the exact name only
    ([acl("*")], "anything", READ, True),  # literal wildcard
    ([acl("ord", prefixed=True)], "orders", READ, True),
    ([acl("ord", prefixed=True)], "ord", READ, True),
    ([acl("orders-", prefixed=True)], "orders", READ, False),
    ([acl("orders", DESCRIBE)], "orders", READ, False),  # DESCRIBE does not imply READ
    ([acl("orders", READ)], "orders", DESCRIBE, True),  # READ implies DESCRIBE
    ([acl("orders", "WRITE")], "orders", DESCRIBE, True),
    ([acl("orders", "ALL")], "orders", READ, True),
    ([acl("orders", "DESCRIBE_CONFIGS")], "orders", DESCRIBE, False),
    # DENY over ALLOW, whichever pattern carries which
    ([acl("ord", prefixed=True), acl("orders", allow=False)], "orders", READ, False),
    ([acl("orders"), acl("*", "ALL", allow=False)], "orders", READ, False),
    ([acl("orders"), acl("o", prefixed=True, principal="User:*", allow=False)], "orders", READ, False),
    # a DENY implies nothing: DENY READ leaves a DESCRIBE allowed by ALL
    ([acl("orders", "ALL"), acl("orders", READ, allow=False)], "orders", DESCRIBE, True),
    # another principal's ACLs, wildcard principal
    ([acl("orders", principal=BOB)], "orders", READ, False),
    ([acl("orders", principal="User:*")], "orders", READ, True),
    ([acl("orders", principal=BOB, allow=False), acl("orders")], "orders", READ, True),
    # hosts
    ([acl("orders", host="10.0.0.1")], "orders", READ, True),
    ([acl("orders", host="10.0.0.2")], "orders", READ, False),
    ([acl("orders"), acl("orders", host="10.0.0.1", allow=False)], "orders", READ, False),
])
def test_kafka_acl_decision(acls: list[Acl], topic: str, op: str, expected: bool) -> None:
    assert allows(acls, topic, op) is expected


def test_hosts_are_compared_as_addresses() -> None:
    """Kafka matches a binding's host against Java's ``getHostAddress()``, which writes an IPv6 client in full
    (``0:0:0:0:0:0:0:1``) where Python writes ``::1``: compared as addresses, a DENY the broker applies is applied
    here too (before: not, the tier's read allowed). ``::1`` written in a binding matches as well, which Kafka's
    string comparison would not (refusing more, never less)."""
    assert not allows([acl("orders"), acl("orders", host="0:0:0:0:0:0:0:1", allow=False)], "orders", host="::1")
    assert allows([acl("orders", host="0:0:0:0:0:0:0:1")], "orders", host="::1")
    assert not allows([acl("orders"), acl("orders", host="::1", allow=False)], "orders", host="::1")
    assert not allows([acl("orders"), acl("orders", host="10.0.0.1", allow=False)], "orders", host="::ffff:10.0.0.1")


def test_no_acl_found_follows_the_setting_only_when_no_acl_names_the_topic() -> None:
    assert allows([], "orders") is False
    assert allows([], "orders", if_none=True) is True
    # An ACL of another principal on the topic is "an ACL found": alice is refused even with if_none.
    assert allows([acl("orders", principal=BOB)], "orders", if_none=True) is False
    assert allows([acl("payments")], "orders", if_none=True) is True


# ------------------------------------------------------------------ host-based ACLs through the proxy
CLIENT, PROXY, THIRD = "10.0.0.5", "10.0.0.9", "10.0.0.7"  # the client's address, the proxy's towards the broker


def bound(resource_type: str, name: str, host: str, *, principal: str = ALICE, op: str = "READ",
          allow: bool = True) -> Acl:
    return Acl("LITERAL", name, principal, host, op, allow, resource_type)


@pytest.mark.parametrize(("acls", "blocked"), [
    ([], False),
    ([acl("orders"), acl("orders", principal="User:*", allow=False)], False),  # host *: the same from anywhere
    ([acl("orders", host=CLIENT, allow=False)], True),  # a DENY of the client's host the broker would not see
    ([acl("orders", host=PROXY)], True),  # an ALLOW of the proxy's host it would give every client of the proxy
    ([acl("orders", host=PROXY, principal="User:*")], True),
    ([acl("orders", host=CLIENT, principal="User:*", allow=False)], True),
    ([acl("orders", host=CLIENT, principal=BOB, allow=False)], False),  # another principal's
    ([acl("orders", host=THIRD, allow=False), acl("orders", host=THIRD)], False),  # a third host: neither address
    ([bound("GROUP", "g", CLIENT, allow=False)], True),  # any resource type
    ([bound("BROKER", "kafka-cluster", PROXY, op="IDEMPOTENT_WRITE")], True),  # the cluster (librdkafka's name)
    ([bound("TRANSACTIONAL_ID", "tx", CLIENT, principal="User:*", op="WRITE")], True),
    ([bound("UNKNOWN", "alice", PROXY, op="CREATE_TOKENS")], True),  # a type librdkafka has no name for
    ([bound("GROUP", "g", "*", allow=False)], False),
    ([acl("orders", host=f"::ffff:{CLIENT}", allow=False)], True),  # the client's address, written as IPv6
    ([acl("orders", host="client.example", allow=False)], False),  # a name: Kafka matches addresses only
])
def test_which_bindings_keep_the_proxy_from_forwarding_a_principal(acls: list[Acl], blocked: bool) -> None:
    """A binding of the principal or User:*, on any resource, allow or deny, naming the client's address or the
    proxy's (which the broker sees instead): the broker would not judge the client's requests as its own."""
    got = forwarding_blocked(Acls(acls), ALICE, CLIENT, PROXY)
    assert got == (next(a for a in acls if a.host not in ("*", THIRD)) if blocked else None)


def test_forwarding_from_the_proxys_own_address_is_faithful() -> None:
    """A client at the address the proxy reaches the broker from is seen by the broker where it is: any binding
    applies to it as it would directly (``0:0:0:0:0:0:0:1``, as Java writes it, is ``::1``)."""
    acls = Acls([acl("orders", host=PROXY, allow=False), acl("orders", host="::1", allow=False)])
    assert forwarding_blocked(acls, ALICE, PROXY, PROXY) is None
    assert forwarding_blocked(acls, ALICE, "0:0:0:0:0:0:0:1", "::1") is None
    assert forwarding_blocked(acls, ALICE, "127.0.0.1", "::1") == acl("orders", host="::1", allow=False)


def test_forwarding_fails_closed_without_acls_or_without_the_proxys_address() -> None:
    """No ACLs to look in (not fetched within the TTL): refused; the cluster without an authorizer has no ACLs, so
    the broker allows every request from anywhere and nothing is widened; the proxy's address unknown: refused."""
    failed, none = Unavailable("error", "DescribeAcls failed"), Unavailable("no_authorizer", "SECURITY_DISABLED")
    assert forwarding_blocked(failed, ALICE, CLIENT, PROXY) is failed
    assert forwarding_blocked(failed, ALICE, PROXY, PROXY) is None  # the same address: nothing to widen
    assert forwarding_blocked(none, ALICE, CLIENT, PROXY) is None
    assert isinstance(forwarding_blocked(Acls([]), ALICE, CLIENT, None), Unavailable)


def test_other_resources_bindings_stay_out_of_topic_decisions() -> None:
    """A GROUP binding named like a topic decides nothing about the topic (only host-based ones are kept)."""
    acls = [acl("orders"), bound("GROUP", "orders", CLIENT, allow=False)]
    assert Acls(acls).allows(ALICE, CLIENT, READ, "orders", if_none=False)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_cache_fails_closed_once_the_acls_are_older_than_the_ttl() -> None:
    clock = FakeClock()
    answers: list[list[Acl] | AclsUnavailableError] = [[acl("orders")]]

    def fetch() -> list[Acl]:
        a = answers[0]
        if isinstance(a, AclsUnavailableError):
            raise a
        return a

    cache = AclCache(fetch, ttl_s=10, clock=clock)
    auth = Authorizer(cache, HistoryAuthorizationSettings(acl_cache_ttl_ms=10_000))
    assert cache.refresh()
    assert auth.allowed(ALICE, "h", READ, ["orders", "other"]) == {"orders"}
    answers[0] = AclsUnavailableError("error", "CLUSTER_AUTHORIZATION_FAILED")
    clock.now += 6
    assert not cache.refresh()
    assert auth.allowed(ALICE, "h", READ, ["orders"]) == {"orders"}  # 6 s old: still applied
    clock.now += 5
    assert auth.allowed(ALICE, "h", READ, ["orders"]) == set()  # 11 s old: every topic refused
    answers[0] = [acl("orders"), acl("other")]
    assert cache.refresh()
    assert auth.allowed(ALICE, "h", READ, ["orders", "other"]) == {"orders", "other"}


def test_stop_closes_the_source_after_its_last_refresh() -> None:
    """The cache's source (ClusterAcls: its admin client) is let go by stop(), once the refresh thread has ended:
    never while a refresh may still use it."""
    events: list[str] = []

    def fetch() -> list[Acl]:
        events.append("fetch")
        return []

    cache = AclCache(fetch, ttl_s=0.02, close=lambda: events.append("close")).start()
    while events.count("fetch") < 3:
        time.sleep(0.01)
    cache.stop()
    assert events[-1] == "close" and events.count("close") == 1, events


def test_nothing_fetched_yet_refuses_everything() -> None:
    def fail() -> list[Acl]:
        raise AclsUnavailableError("error", "broker unreachable")

    auth = Authorizer(AclCache(fail, 10), HistoryAuthorizationSettings())
    assert auth.allowed(ALICE, "h", DESCRIBE, ["orders"]) == set()


@pytest.mark.parametrize(("allow_if_no_authorizer", "expected"), [(False, set()), (True, {"orders"})])
def test_a_cluster_without_authorizer_is_open_only_when_configured(allow_if_no_authorizer: bool,
                                                                   expected: set[str]) -> None:
    def no_authorizer() -> list[Acl]:
        raise AclsUnavailableError("no_authorizer", "SECURITY_DISABLED")

    settings = HistoryAuthorizationSettings(allow_if_no_authorizer=allow_if_no_authorizer)
    cache = AclCache(no_authorizer, 10, allow_if_no_authorizer=allow_if_no_authorizer)
    cache.refresh()
    assert Authorizer(cache, settings).allowed(ALICE, "h", READ, ["orders"]) == expected


def test_super_users_need_no_acl_even_when_acls_are_unavailable() -> None:
    def fail() -> list[Acl]:
        raise AclsUnavailableError("error", "down")

    auth = Authorizer(AclCache(fail, 10), HistoryAuthorizationSettings(super_users=["User:admin"]))
    assert auth.allowed("User:admin", "h", READ, ["a", "b"]) == {"a", "b"}
    assert auth.allowed(ALICE, "h", READ, ["a"]) == set()


def test_super_users_must_be_principals() -> None:
    with pytest.raises(ValueError, match="super user 'admin' is not a principal"):
        HistoryAuthorizationSettings(super_users=["admin"])


# ---------------------------------------------------------------------------------------------- principals
@pytest.mark.parametrize(("rules", "dn", "name"), [
    (["DEFAULT"], "CN=reader,OU=ops,O=example", "CN=reader,OU=ops,O=example"),
    (["RULE:^CN=(.*?),OU=(.*?),O=.*$/$1@$2/"], "CN=reader,OU=ops,O=example", "reader@ops"),
    (["RULE:^CN=(.*?),OU=ops,.*$/$1/U", "DEFAULT"], "CN=Reader,OU=ops,O=x", "READER"),
    (["RULE:^CN=(.*?),OU=ops,.*$/$1/L", "DEFAULT"], "CN=Reader,OU=dev,O=x", "CN=Reader,OU=dev,O=x"),
    (["RULE:^CN=([^,]*),.*$/$1/L"], "CN=A,O=x", "a"),
    ([r"RULE:^CN=(.*)\/(.*)$/$2\/$1/"], "CN=a/b", "b/a"),  # \/ is a slash
    (["RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L"], "OU=x,CN=Host.Example,O=y", "host.example"),  # Kafka's doc
])
def test_principal_mapping_rules_as_kafka(rules: list[str], dn: str, name: str) -> None:
    assert PrincipalMapper(rules).name(dn) == name


def test_a_subject_no_rule_matches_is_refused() -> None:
    with pytest.raises(NoMatchingRuleError, match="O=x"):
        PrincipalMapper(["RULE:^CN=(.*)$/$1/"]).name("O=x")


@pytest.mark.parametrize(("rule", "message"), [
    ("FOO", "neither DEFAULT nor RULE"),
    ("RULE:^CN=(.*$/$1/", "does not compile"),
    ("RULE:^CN=(.*)$/$2/", "names group 2"),
])
def test_bad_rules_fail_the_config_naming_the_field(rule: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_mapping_rules([rule])
    with pytest.raises(ValueError, match="principal_mapping_rules"):
        HistoryTlsSettings(certfile=Path("/c.pem"), principal_mapping_rules=[rule])


JAVA_DN = textwrap.dedent("""\
    import java.io.FileInputStream;
    import java.security.cert.CertificateFactory;
    import java.security.cert.X509Certificate;
    public class Dn {
        public static void main(String[] a) throws Exception {
            X509Certificate c = (X509Certificate) CertificateFactory.getInstance("X.509")
                .generateCertificate(new FileInputStream(a[0]));
            System.out.print(c.getSubjectX500Principal().getName());
        }
    }
    """)


def test_subject_is_written_as_java_writes_it(tmp_path: Path) -> None:
    """The name the rules see is the one Kafka's do: Java's X500Principal.getName() (RFC 2253), run on the same
    certificate: reversed RDNs, escapes, a multi-valued RDN, and an attribute without a keyword (hex DER)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    subject = x509.Name([
        x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.COUNTRY_NAME, "US")]),
        x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Acme, Inc.")]),
        x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "ops"),
                                        x509.NameAttribute(NameOID.LOCALITY_NAME, "Paris")]),
        x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.EMAIL_ADDRESS, "r@example.org")]),
        x509.RelativeDistinguishedName([x509.NameAttribute(NameOID.COMMON_NAME, "reader+1 <x>;y")]),
    ])
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .sign(key, hashes.SHA256()))
    der = cert.public_bytes(serialization.Encoding.DER)
    (tmp_path / "c.der").write_bytes(der)
    (tmp_path / "Dn.java").write_text(JAVA_DN)
    java = subprocess.run(["java", str(tmp_path / "Dn.java"), str(tmp_path / "c.der")], capture_output=True,
                          text=True, timeout=120, check=True).stdout
    assert subject_dn(der) == java, (subject_dn(der), java)


def test_refused_requests_keep_nothing_alive() -> None:
    """While the ACLs are unavailable every request is refused; each refusal must let its caller's objects go (a
    stored exception raised again on every request kept each raising frame, and through it the Fetch's records,
    alive in its traceback: 1.5 GiB after one client read 0.9 GiB, measured by bench_history)."""
    import gc
    import weakref

    def fail() -> list[Acl]:
        raise AclsUnavailableError("error", "DescribeAcls refused (test)")

    class Records:  # stands in for a Fetch answer's record bytes, held by the caller while it authorizes
        pass

    for allow_if_no_authorizer, reason in ((False, "error"), (True, "no_authorizer")):
        def fetch_like(auth: Authorizer) -> weakref.ref[Records]:
            records = Records()
            auth.allowed(ALICE, "h", READ, ["orders"])
            return weakref.ref(records)

        def no_authorizer() -> list[Acl]:
            raise AclsUnavailableError("no_authorizer", "SECURITY_DISABLED (test)")

        cache = AclCache(fail if reason == "error" else no_authorizer, 10,
                         allow_if_no_authorizer=allow_if_no_authorizer)
        cache.refresh()
        auth = Authorizer(cache, HistoryAuthorizationSettings(allow_if_no_authorizer=allow_if_no_authorizer))
        gc.disable()  # only reference counts free them (the endpoint holds the GC off during large requests)
        try:
            refs = [fetch_like(auth) for _ in range(3)]
            assert [r() for r in refs] == [None, None, None], reason
        finally:
            gc.enable()
