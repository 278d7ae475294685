"""Which topics a listener client may read: the cluster's own ACLs, applied as Kafka's authorizer does.

The endpoint serves what the cluster's listeners would serve the same principal (:mod:`~rlm.listener.net.principals`),
no more: Fetch needs READ on the topic, Metadata and ListOffsets DESCRIBE (which READ, WRITE, DELETE and ALTER
imply). The decision is Kafka's ``StandardAuthorizer``'s, for topic resources:

1. a principal in ``super_users`` is allowed;
2. the ACLs whose pattern matches the topic: LITERAL of its name, LITERAL ``*``, and PREFIXED of any prefix of
   its name; of those, the ones for this principal or ``User:*``, from this host or ``*`` (hosts compared as
   addresses, :func:`same_address`: Kafka compares strings, Java's ``0:0:0:0:0:0:0:1`` with the binding's, where
   Python writes the client's ``::1``);
3. a matching DENY of the operation (or ALL) refuses, whatever allows it (DENY over ALLOW; a DENY implies
   nothing: DENY READ does not refuse DESCRIBE);
4. a matching ALLOW of the operation, of ALL, or of an operation implying it, allows;
5. no ACL at all on the topic (of any principal): ``allow_everyone_if_no_acl_found``; otherwise refused.

The ACLs come from the cluster: :class:`AclCache` asks DescribeAcls for every ACL binding, as the sidecar's own Kafka
principal (which needs DESCRIBE on the cluster), every ``acl_cache_ttl_ms / 2`` on a thread of its own, so no
request waits for it, through one admin client kept between refreshes (:class:`ClusterAcls`). It fails closed:
ACLs not refreshed for ``acl_cache_ttl_ms`` (the principal may not describe them, the cluster is unreachable) refuse
every topic, counted (``rlm_history_authorizations{result="unavailable"}``) and logged once until they can be fetched
again. A cluster without an authorizer (DescribeAcls answers SECURITY_DISABLED) allows everything only with
``allow_if_no_authorizer``.

Of the other resources' bindings (groups, transactional ids, the cluster...) only those naming a host (not ``*``)
are kept, for the proxy (:func:`forwarding_blocked`): the broker judges a forwarded request by the address it sees,
the proxy's, so such a binding of a client's principal naming the client's address or the proxy's would be applied
to the wrong client (:mod:`rlm.listener.upstream.hosts`).
"""

from __future__ import annotations

import functools
import ipaddress
import threading
import time
from collections import OrderedDict, defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from confluent_kafka.admin import AdminClient
from prometheus_client import Counter, Gauge

from rlm.config import HistoryAuthorizationSettings
from rlm.logs import limited_logger

__all__ = ["DESCRIBE", "READ", "Acl", "AclCache", "Acls", "AclsUnavailableError", "Authorizer", "ClusterAcls",
           "Unavailable", "forwarding_blocked", "same_address"]

log = limited_logger(__name__)

READ, DESCRIBE, ALL = "READ", "DESCRIBE", "ALL"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
TOPIC = "TOPIC"
# An ALLOW of any of these allows the key (Kafka's AclEntry.supportedOperations / implied operations).
IMPLIED_BY = {DESCRIBE: {DESCRIBE, READ, "WRITE", "DELETE", "ALTER", ALL}, READ: {READ, ALL}}
LOGGED_DENIALS = 10_000  # (principal, operation, topic) remembered as logged

AUTHORIZATIONS = Counter("rlm_history_authorizations", "Topic authorization decisions of the history endpoint",
                         ["operation", "result"])  # result: allowed, denied, unavailable
ACL_REFRESHES = Counter("rlm_history_acl_refreshes", "DescribeAcls calls of the history endpoint", ["result"])
ACL_AGE = Gauge("rlm_history_acl_age_seconds", "Age of the ACLs the history endpoint applies (-1: none yet)")


class AclsUnavailableError(Exception):
    """The cluster's ACLs could not be fetched (``reason``: ``no_authorizer`` or ``error``)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Unavailable:
    """Why there are no ACLs to apply (``reason``: ``no_authorizer`` or ``error``)."""

    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class Acl:
    """One ACL binding, as DescribeAcls gives it."""

    pattern_type: str  # LITERAL or PREFIXED
    name: str
    principal: str
    host: str
    operation: str  # READ, DESCRIBE, ALL, WRITE...
    allow: bool
    # librdkafka's names: TOPIC, GROUP, BROKER (Kafka's cluster resource), TRANSACTIONAL_ID, UNKNOWN (those it has
    # no name for: delegation tokens, users)
    resource_type: str = TOPIC


class Acls:
    """The ACLs of one DescribeAcls answer: those on topics indexed by name and prefix (one lookup per prefix of a
    topic), and those of any resource naming a host (not ``*``) by principal."""

    def __init__(self, acls: Iterable[Acl]) -> None:
        self._literal: dict[str, list[Acl]] = defaultdict(list)
        self._prefixed: dict[str, list[Acl]] = defaultdict(list)
        self._hosted: dict[str, list[Acl]] = defaultdict(list)
        for acl in acls:
            if acl.host != WILDCARD:
                self._hosted[acl.principal].append(acl)
            if acl.resource_type == TOPIC:  # its host as an address (same_address), for allows()
                keyed = acl if acl.host == WILDCARD else replace(acl, host=_address_key(acl.host))
                (self._prefixed if acl.pattern_type == "PREFIXED" else self._literal)[acl.name].append(keyed)

    def naming_hosts(self, principal: str, hosts: Iterable[str]) -> list[Acl]:
        """The bindings of ``principal`` or ``User:*``, on any resource, whose host is one of ``hosts`` (compared as
        addresses: :func:`same_address`)."""
        keys = {_address_key(h) for h in hosts}
        return [acl for p in (principal, WILDCARD_PRINCIPAL) for acl in self._hosted.get(p, ())
                if _address_key(acl.host) in keys]

    def on(self, topic: str) -> list[Acl]:
        """Every ACL whose pattern matches ``topic``."""
        found = [*self._literal.get(topic, ()), *self._literal.get(WILDCARD, ())]
        if self._prefixed:
            for i in range(1, len(topic) + 1):
                found.extend(self._prefixed.get(topic[:i], ()))
        return found

    def allows(self, principal: str, host: str, operation: str, topic: str, *, if_none: bool) -> bool:
        # compared as addresses (same_address): Kafka's hosts are Java's getHostAddress(), ours Python's
        return self.allows_from(principal, _address_key(host), operation, topic, if_none=if_none)

    def allows_from(self, principal: str, address: str, operation: str, topic: str, *, if_none: bool) -> bool:
        """:meth:`allows` for a host already written as :func:`same_address` compares it (once a request, not once
        a topic: 0.15-0.25 us a lookup)."""
        matching = self.on(topic)
        if not matching:
            return if_none
        allowed = False
        for acl in matching:
            if acl.principal not in (principal, WILDCARD_PRINCIPAL) or acl.host not in (address, WILDCARD):
                continue
            if not acl.allow:
                if acl.operation in (operation, ALL):
                    return False  # DENY wins
            elif acl.operation in IMPLIED_BY[operation]:
                allowed = True
        return allowed


def forwarding_blocked(acls: Acls | Unavailable, principal: str, client_host: str, proxy_host: str | None
                       ) -> Acl | Unavailable | None:
    """What keeps the broker from judging ``principal``'s requests from ``client_host`` as it would judge them from
    there, when they reach it from ``proxy_host`` (the proxy's address as the broker sees it; None: not known): a
    binding of the principal or ``User:*``, on any resource, allow or deny, whose host is either address (the
    broker would apply one of the proxy's host, not one of the client's); or no ACLs to look in (fail closed). None
    when nothing does: the two addresses are the same, no binding names either (one of a third host matches
    neither), or the cluster has no authorizer (no ACLs at all: the broker allows every request from anywhere)."""
    if proxy_host is None:
        return Unavailable("error", "the proxy's address towards the broker is not known")
    if same_address(client_host, proxy_host):
        return None
    if isinstance(acls, Unavailable):
        return None if acls.reason == "no_authorizer" else acls
    found = acls.naming_hosts(principal, (client_host, proxy_host))
    return found[0] if found else None


def same_address(a: str, b: str) -> bool:
    """Whether two hosts are one address: as IP addresses where both are (``::ffff:10.0.0.5`` is ``10.0.0.5``,
    ``0:0:0:0:0:0:0:1`` is ``::1``: Java writes a client's address in full, Python in short), else as strings."""
    return _address_key(a) == _address_key(b)


@functools.lru_cache(maxsize=4096)  # clients' addresses and the bindings' hosts: once each, not once a request
def _address_key(host: str) -> str:
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])  # without an IPv6 scope (fe80::1%eth0)
    except ValueError:
        return host
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return str(ip)


class ClusterAcls:
    """Every topic ACL of the cluster and every other binding naming a host, by one DescribeAcls (of any resource
    type) as the principal of ``client_config``, through one admin client kept from one refresh to the next
    (:meth:`__call__`, on :class:`AclCache`'s thread only).

    One client, not one a refresh: a client a refresh started 4 librdkafka threads (6 with 3 brokers) and a
    connection (a SASL handshake) every ``acl_cache_ttl_ms / 2`` and destroyed them, ~1 thread a second in a
    listener serving nothing else. A request without an answer (the broker it asked went away, a timeout) drops the
    client: the next refresh bootstraps a fresh one, as :class:`rlm.discovery.ClusterView` does (librdkafka keeps
    sending to the broker it chose until its next metadata refresh). An answer that refuses keeps it."""

    def __init__(self, client_config: Mapping[str, Any], timeout_s: float = 10.0) -> None:
        # Metadata (and with it the broker the admin requests go to) refreshed every 10 s, not librdkafka's 5 min,
        # as ClusterView's: a client kept between refreshes must notice a stopped broker.
        self._config = {"topic.metadata.refresh.interval.ms": 10_000, **client_config,
                        "socket.timeout.ms": int(timeout_s * 1000)}
        self.timeout_s = timeout_s
        self._admin: Any = None

    def __call__(self) -> list[Acl]:
        """The cluster's topic ACLs now, and its other bindings that name a host (:class:`Acls`). Raises
        :class:`AclsUnavailableError`.

        librdkafka (2.16 at least) drops DescribeAcls' top-level error: a principal without DESCRIBE on the cluster,
        and a cluster without an authorizer (SECURITY_DISABLED), both get an empty list, which would read as "no ACL
        at all". So the principal's cluster operations are checked first (DescribeCluster with its authorized
        operations: DESCRIBE is what DescribeAcls needs), and an empty list is taken as "no authorizer" only when
        the broker's ``authorizer.class.name`` is empty (DescribeConfigs; a broker that will not say is taken to
        have one: its ACLs, none, apply)."""
        if self._admin is None:
            self._admin = AdminClient(self._config)
        admin = self._admin
        try:
            return self._describe(admin)
        finally:
            admin.poll(0)  # its log lines, queued until a poll, handed to our logging (rlm.logs.kafka_logger)

    def close(self) -> None:
        """Let go of the admin client (librdkafka destroys it: its threads end, its connections close)."""
        if self._admin is not None:
            self._admin.poll(0)
        self._admin = None

    def _unanswered(self, what: str, err: Exception) -> AclsUnavailableError:
        """A request that got no answer (or an error for one): the next refresh starts with a fresh client."""
        self._admin = None
        return AclsUnavailableError("error", f"{what} failed: {err}")

    def _describe(self, admin: Any) -> list[Acl]:
        from confluent_kafka.admin import (
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ConfigResource,
            ResourcePatternType,
            ResourceType,
        )

        timeout_s = self.timeout_s
        try:
            cluster = admin.describe_cluster(include_authorized_operations=True,
                                             request_timeout=timeout_s).result(timeout_s + 5)
        except Exception as err:  # noqa: BLE001 - unreachable, timed out, refused: the ACLs are unavailable
            raise self._unanswered("DescribeCluster", err) from None
        ops = {op.name for op in cluster.authorized_operations or ()}
        if not ops & {DESCRIBE, ALL}:
            raise AclsUnavailableError("error", "the sidecar's Kafka principal may not describe the cluster's ACLs: "
                                                "grant it DESCRIBE on the cluster")
        # every resource type in one request: the topics' bindings, and the others' naming a host (for the proxy)
        flt = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                               AclPermissionType.ANY)
        try:
            bindings = admin.describe_acls(flt, request_timeout=timeout_s).result(timeout_s + 5)
        except Exception as err:  # noqa: BLE001
            raise self._unanswered("DescribeAcls", err) from None
        if not bindings and cluster.nodes:
            resource = ConfigResource(ResourceType.BROKER, str(cluster.nodes[0].id))
            try:
                (future,) = admin.describe_configs([resource], request_timeout=timeout_s).values()
                entry = future.result(timeout_s + 5).get("authorizer.class.name")
            except Exception:  # noqa: BLE001 - not told: an authorizer is assumed (fails closed)
                entry = None
            if entry is not None and not entry.value:
                raise AclsUnavailableError("no_authorizer", "the cluster has no authorizer (authorizer.class.name "
                                                            "is empty)")
        return [Acl(b.resource_pattern_type.name, b.name, b.principal, b.host, b.operation.name,
                    b.permission_type.name == "ALLOW", b.restype.name) for b in bindings
                if b.restype.name == TOPIC or b.host != WILDCARD]


class AclCache:
    """The cluster's ACLs (:class:`Acls`), refreshed every ``ttl_s / 2`` on a thread; :meth:`current` is what to
    apply."""

    def __init__(self, fetch: Callable[[], list[Acl]], ttl_s: float, *, allow_if_no_authorizer: bool = False,
                 clock: Callable[[], float] = time.monotonic, close: Callable[[], None] | None = None) -> None:
        self._fetch = fetch
        self._close = close  # called by stop(), once the refresh thread has ended (ClusterAcls.close)
        self.ttl_s = ttl_s
        self.allow_if_no_authorizer = allow_if_no_authorizer  # (for the log line)
        self._clock = clock
        self._lock = threading.Lock()
        self._acls: Acls | None = None
        self._fetched_at = -float("inf")
        # Bumped by every refresh: what current() gives may change only with it, or at _fresh_until (the ACLs it gives
        # expire). The proxy keeps a connection's decision for one generation (unchanged_since), read without the
        # lock on every forwarded request (current(), taking it, was 0.75-0.83 us a call: rlm.listener.upstream.hosts).
        self.generation = 0
        self._fresh_until = -float("inf")
        self._failure: Unavailable | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> AclCache:
        """Fetch once now (a failure is not raised: the ACLs are unavailable until a refresh succeeds), then
        every ``ttl_s / 2`` on a daemon thread."""
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="rlm-history-acls", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self._close is not None and (self._thread is None or not self._thread.is_alive()):
            self._close()

    def _run(self) -> None:
        while not self._stop.wait(self.ttl_s / 2):
            self.refresh()

    def refresh(self) -> bool:
        try:
            acls = Acls(self._fetch())
        except AclsUnavailableError as err:
            ACL_REFRESHES.labels(err.reason).inc()
            failure = Unavailable(err.reason, str(err))  # (the exception itself, with its traceback, is not kept)
            with self._lock:
                first = self._failure is None or self._failure.reason != failure.reason
                self._failure = failure
                if self._acls is None or self._clock() - self._fetched_at > self.ttl_s:
                    self._fresh_until = float("inf")  # current() gives this failure until the next refresh
                self.generation += 1
            if first:
                self._log_failure(failure)
            self._age()
            return False
        ACL_REFRESHES.labels("ok").inc()
        with self._lock:
            recovered = self._failure is not None
            self._acls, self._fetched_at, self._failure = acls, self._clock(), None
            self._fresh_until = self._fetched_at + self.ttl_s
            self.generation += 1
        if recovered:
            log.info("history endpoint: the cluster's ACLs are fetched again")
        self._age()
        return True

    def _log_failure(self, err: Unavailable) -> None:
        extra = {"reason": err.reason, "error": err.message}
        if err.reason == "no_authorizer" and self.allow_if_no_authorizer:
            log.info("history endpoint: the cluster has no authorizer: every client may read every tiered topic "
                     "(history_listener.authorization.allow_if_no_authorizer)", extra=extra)
        elif err.reason == "no_authorizer":
            log.error("history endpoint: the cluster has no authorizer (no ACLs to apply): every topic is refused "
                      "(TOPIC_AUTHORIZATION_FAILED). Set history_listener.authorization.allow_if_no_authorizer: true "
                      "to let every client read every tiered topic, as the cluster's own listeners do", extra=extra)
        else:
            log.error("history endpoint: cannot fetch the cluster's ACLs (the sidecar's principal needs DESCRIBE on "
                      "the cluster); once the last ones fetched are acl_cache_ttl_ms old, every topic is refused "
                      "(TOPIC_AUTHORIZATION_FAILED) until they can be (logged once; rlm_history_acl_refreshes)",
                      extra=extra)

    def _age(self) -> None:
        ACL_AGE.set(-1 if self._acls is None else self._clock() - self._fetched_at)

    def unchanged_since(self, generation: int) -> bool:
        """Whether :meth:`current` still gives what it gave after :attr:`generation` was ``generation`` (read before
        that call): no refresh since, and the ACLs it gave not expired. Without the lock (a refresh racing with it
        counts from the next call)."""
        return generation == self.generation and self._clock() <= self._fresh_until

    def current(self) -> Acls | Unavailable:
        """The ACLs to apply, or why there are none (none fetched within the TTL). Returned, not raised: this runs
        for every request, and one stored exception raised again and again would keep every raising frame (and
        the records it held) alive in its traceback."""
        with self._lock:
            if self._acls is not None and self._clock() - self._fetched_at <= self.ttl_s:
                return self._acls
            failure = self._failure
        return failure if failure is not None else Unavailable("error", "the ACLs are older than acl_cache_ttl_ms")


@functools.cache
def _decisions(operation: str, result: str) -> Any:
    """The child of :data:`AUTHORIZATIONS` for an operation and result, looked up once (both are of closed sets:
    ``labels()`` on every Fetch's check cost more than the check)."""
    return AUTHORIZATIONS.labels(operation, result)


class Authorizer:
    """The endpoint's decisions: which of some topics a principal may READ or DESCRIBE."""

    def __init__(self, cache: AclCache, settings: HistoryAuthorizationSettings) -> None:
        self.cache = cache
        self.settings = settings
        self._super = frozenset(settings.super_users)
        self._logged: OrderedDict[tuple[str, str, str], None] = OrderedDict()
        self._logged_lock = threading.Lock()

    @classmethod
    def of_cluster(cls, client_config: Mapping[str, Any], settings: HistoryAuthorizationSettings) -> Authorizer:
        source = ClusterAcls(client_config)
        cache = AclCache(source, settings.acl_cache_ttl_ms / 1000,
                         allow_if_no_authorizer=settings.allow_if_no_authorizer, close=source.close)
        return cls(cache, settings)

    def start(self) -> Authorizer:
        self.cache.start()
        return self

    def stop(self) -> None:
        self.cache.stop()

    def allowed(self, principal: str, host: str, operation: str, topics: Iterable[str]) -> set[str]:
        """The topics of ``topics`` that ``principal`` connected from ``host`` may ``operation``."""
        names = set(topics)
        if not names:
            return set()
        if principal in self._super:
            _decisions(operation, "allowed").inc(len(names))
            return names
        acls = self.cache.current()
        if isinstance(acls, Unavailable):
            if acls.reason == "no_authorizer" and self.settings.allow_if_no_authorizer:
                _decisions(operation, "allowed").inc(len(names))
                return names
            _decisions(operation, "unavailable").inc(len(names))
            return set()
        if_none = self.settings.allow_everyone_if_no_acl_found
        address = _address_key(host)
        ok = {t for t in names if acls.allows_from(principal, address, operation, t, if_none=if_none)}
        if ok:
            _decisions(operation, "allowed").inc(len(ok))
        if len(ok) < len(names):
            _decisions(operation, "denied").inc(len(names) - len(ok))
            self._log_denied(principal, host, operation, names - ok)
        return ok

    def _log_denied(self, principal: str, host: str, operation: str, topics: set[str]) -> None:
        """Logged once per principal, operation and topic (a client retrying would write a line per request)."""
        new = []
        with self._logged_lock:
            for t in sorted(topics):
                key = (principal, operation, t)
                if key not in self._logged:
                    self._logged[key] = None
                    new.append(t)
            while len(self._logged) > LOGGED_DENIALS:
                self._logged.popitem(last=False)
        if new:
            log.info("history endpoint: not authorized by the cluster's ACLs (logged once per principal, "
                     "operation and topic)", extra={"principal": principal, "host": host, "operation": operation,
                                                    "topics": new})
