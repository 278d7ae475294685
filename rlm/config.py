"""Sidecar configuration: a YAML file validated by pydantic, with environment overrides.

Precedence (highest first): environment variables ``RLM_<SECTION>__<FIELD>`` (e.g.
``RLM_KAFKA__BOOTSTRAP_SERVERS``), then the YAML file, then the defaults below. A bad value fails at start
with the field's dotted path (:class:`ConfigError`).

Kafka client settings (security, SASL, TLS) are passed through verbatim to confluent-kafka under
``kafka.client`` using librdkafka's dotted names; secrets there may come from the environment as
``RLM_KAFKA__CLIENT='{"sasl.password": "..."}'``.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from rlm.errors import RlmError
from rlm.kafka_secrets import RedactedConfig, is_secret_client_property, reveal_client_config
from rsm.manager import RsmConfig

__all__ = [
    "ConfigError",
    "HealthSettings",
    "HistoryAuthorizationSettings",
    "HistoryListenerSettings",
    "HistorySaslSettings",
    "HistoryTlsSettings",
    "HistoryUpstreamTlsSettings",
    "KafkaSettings",
    "MetadataSettings",
    "OffloadRule",
    "RetentionRule",
    "SidecarSettings",
    "TaskSettings",
    "TopicSelection",
    "is_loopback",
    "load_settings",
]

log = logging.getLogger(__name__)

SECOND_MS = 1000
HOUR_MS = 3600 * SECOND_MS
DAY_MS = 24 * HOUR_MS
MB = 1024 * 1024


class ConfigError(RlmError, ValueError):
    """The configuration file or environment is invalid; the message names the file and each bad field."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaSettings(_Frozen):
    bootstrap_servers: str = Field(min_length=1, description="host:port[,host:port] of the cluster")
    client: dict[str, str | int | bool | SecretStr] = Field(
        default_factory=dict,
        description="extra librdkafka properties for every client (security.protocol, sasl.*, ssl.*); the values "
                    "of secret ones (sasl.password, ssl.key.password, ...) are never shown",
    )

    @field_validator("client")
    @classmethod
    def _no_owned_keys(cls, v: dict[str, Any]) -> dict[str, Any]:
        owned = {"bootstrap.servers", "group.id", "enable.auto.commit", "isolation.level"}
        bad = sorted(owned & v.keys())
        if bad:
            raise ValueError(f"{', '.join(bad)} are set by the sidecar, not under kafka.client")
        return {k: SecretStr(str(x)) if is_secret_client_property(k) and not isinstance(x, SecretStr) else x
                for k, x in v.items()}

    def client_config(self, **extra: Any) -> dict[str, Any]:
        """The confluent-kafka configuration for one client: bootstrap + pass-through (secrets unwrapped for the
        client; its repr masks them) + ``extra``, its log lines going to our logging (:func:`rlm.logs.kafka_logger`),
        not to stderr."""
        from rlm.logs import kafka_logger

        return RedactedConfig({"bootstrap.servers": self.bootstrap_servers, "logger": kafka_logger(),
                               **reveal_client_config(self.client), **extra})


class MetadataSettings(_Frozen):
    topic: str = "__remote_log_metadata"
    partitions: int = Field(50, ge=1)
    replication_factor: int = Field(3, ge=1, description=(
        "replication factor the metadata and to-be-deleted topics are created with when absent (Kafka's default "
        "for its metadata topic is 3 as well; a single-broker dev cluster needs 1)"))
    state_dir: Path = Field(Path("/var/lib/rlm/state"), description="RocksDB cache of the metadata topic")
    tombstone_delay_ms: int = Field(DAY_MS, ge=0)
    write_timeout_ms: int = Field(30 * SECOND_MS, ge=100)
    to_be_deleted_topic: str = "__remote_segments_to_be_deleted"


class TaskSettings(_Frozen):
    copy_interval_ms: int = Field(30 * SECOND_MS, ge=100)
    expiration_interval_ms: int = Field(5 * 60 * SECOND_MS, ge=100)
    gc_interval_ms: int = Field(HOUR_MS, ge=1000)
    gc_grace_ms: int = Field(DAY_MS, ge=0)
    purge_grace_ms: int = Field(60 * SECOND_MS, ge=0, description=(
        "a deleted topic's remote data is purged only after its deletion was proven (the name unknown, or "
        "answering another topic id) on purge_rounds consecutive discovery rounds spanning at least this long"))
    purge_rounds: int = Field(3, ge=1, le=1000)
    discovery_interval_ms: int = Field(10 * SECOND_MS, ge=100)
    rescan_interval_ms: int = Field(60 * SECOND_MS, ge=1000, description=(
        "the safety net behind the log dirs' filesystem notifications: every partition directory is listed (a roll "
        "whose event was missed is found), and a discovery round describes every topic and reads their configs "
        "even when the cluster's metadata did not change"))
    copy_workers: int = Field(6, ge=1, le=64, description=(
        "threads running copy runs (rlm.tasks.dispatch.CopyJobs: the copy jobs' own pool, apart from the periodic "
        "jobs'); 6 is what copy runs could use of the shared pool before (2 + 4): a burst's copy runs wait on the "
        "metadata topic, the store and fsyncs more than they compute"))
    copy_coalesce_ms: int = Field(2 * SECOND_MS, ge=0, le=10 * 60 * SECOND_MS, description=(
        "a copy job woken (its partition rolled) less than this after its last run ended waits until this long "
        "after it, so that segments rolled one after the other are copied in one run (a run's metadata writes and "
        "ListOffsets calls shared by its segments); the first roll after a quiet spell is copied at once. 0: every "
        "wake runs at once"))
    copy_settle_ms: int = Field(5 * SECOND_MS, ge=0, le=60 * SECOND_MS, description=(
        "a copy job woken by a change of its partition directory (a roll) runs this long after the wake, not at "
        "once, so that the rolls that follow within it are copied in the same run (a run's metadata writes, fence "
        "and listings shared by its segments); a later wake does not put the run off further: a roll is copied at "
        "most this long later than without it. 0: a wake runs at once"))

    @model_validator(mode="before")
    @classmethod
    def _retired(cls, data: Any) -> Any:
        """Unknown keys are refused (``extra="forbid"``), except ``cleaner_interval_ms``: once a setting here, never
        read (the cleaner is a consumer on its own thread, with its own backoff). It is dropped with a warning, so
        that a file or environment written for an older version still loads."""
        if isinstance(data, dict) and "cleaner_interval_ms" in data:
            log.warning("config: tasks.cleaner_interval_ms is no longer a setting (the cleaner runs on its own "
                        "thread): ignored; remove it")
            data = {k: v for k, v in data.items() if k != "cleaner_interval_ms"}
        return data


def _regex(v: str) -> str:
    try:
        re.compile(v)
    except re.error as err:
        raise ValueError(f"not a regular expression: {err}") from err
    return v


class RetentionRule(_Frozen):
    """Remote retention for the topics whose name fully matches ``pattern`` (first matching rule wins).

    ``-1`` means unlimited. These are the sidecar's own settings: the topic's ``retention.*`` govern only the
    broker's local data in sidecar mode, and the broker's log start offset is never followed.
    """

    pattern: str = ".*"
    retention_ms: int = Field(7 * DAY_MS, ge=-1)
    retention_bytes: int = Field(-1, ge=-1)

    @field_validator("pattern")
    @classmethod
    def _regex(cls, v: str) -> str:
        return _regex(v)


class OffloadRule(_Frozen):
    """How the topics whose name fully matches ``pattern`` are tiered (first matching rule wins; no rule matches:
    ``segment``). See :mod:`rlm.tasks.offload`.

    ``segment``: whole local segments once the broker rolls them (remote lag is ``segment.ms`` / ``segment.bytes``).
    ``streaming`` (PIP-76): committed data is cut into offload segments of at most ``offload_max_bytes``, each
    remote at most ``offload_max_ms`` after its first batch was committed (plus ``poll_interval_ms`` and the copy),
    whatever the broker's rolls. Switching a topic between modes (a restart with another rule) leaves no gap and no
    overlap.
    """

    pattern: str = ".*"
    mode: Literal["segment", "streaming"] = "segment"
    offload_max_bytes: int = Field(64 * 1024 * 1024, ge=1024, le=1024 * 1024 * 1024, description=(
        "bytes of record batches per offload segment (PIP-76 maxSizePerOffloadSegmentMbytes; at most 1 GiB: Kafka's "
        "segment size is an int32)"))
    offload_max_ms: int = Field(60 * SECOND_MS, ge=100, description=(
        "an offload segment is copied this long after its first batch was seen committed "
        "(PIP-76 maxOffloadSegmentRolloverTimeMinutes)"))
    poll_interval_ms: int = Field(SECOND_MS, ge=50, le=60 * SECOND_MS, description=(
        "how often the leader's sidecar looks for newly committed data (streaming mode)"))

    @field_validator("pattern")
    @classmethod
    def _regex(cls, v: str) -> str:
        return _regex(v)


class TopicSelection(_Frozen):
    include: list[str] = Field(default_factory=lambda: [".*"], description="regexes of topics to tier")
    exclude: list[str] = Field(default_factory=list, description="regexes of topics never tiered")
    paused: list[str] = Field(default_factory=list, description="regexes of topics whose copying is paused")

    @field_validator("include", "exclude", "paused")
    @classmethod
    def _regexes(cls, v: list[str]) -> list[str]:
        for p in v:
            try:
                re.compile(p)
            except re.error as err:
                raise ValueError(f"{p!r} is not a regular expression: {err}") from err
        return v

    def tiered(self, topic: str) -> bool:
        if topic.startswith("__"):
            return False  # internal topics are never tiered
        return any(re.fullmatch(p, topic) for p in self.include) and not any(
            re.fullmatch(p, topic) for p in self.exclude
        )

    def is_paused(self, topic: str) -> bool:
        return any(re.fullmatch(p, topic) for p in self.paused)


class HealthSettings(_Frozen):
    """When ``/health`` says not ready (see :mod:`rlm.health`)."""

    min_retention_margin_ms: int = Field(60 * SECOND_MS, ge=0, description=(
        "not ready when the broker's local retention will reach a led partition's oldest segment that is neither "
        "tiered nor staged within this long"))
    store_failures: int = Field(3, ge=1, description="not ready after this many failed store requests in a row")
    broker_stale_ms: int = Field(60 * SECOND_MS, ge=100, description=(
        "not ready when no discovery round succeeded for this long (and at least 6 discovery intervals): the "
        "broker or the cluster is unreachable"))


class ListenSettings(_Frozen):
    host: str = "127.0.0.1"
    port: int = Field(9464, ge=0, le=65535)


class HistoryTlsSettings(_Frozen):
    """TLS of the history endpoint (the ``SSL`` / ``SASL_SSL`` security protocols for its clients). The files are
    read when the endpoint starts; a file that cannot be loaded fails the start naming its field."""

    certfile: Path = Field(description="the endpoint's certificate chain (PEM), leaf first")
    keyfile: Path | None = Field(None, description="its private key (PEM); default: inside certfile")
    keyfile_password: SecretStr | None = Field(None, description="password of an encrypted keyfile")
    cafile: Path | None = Field(None, description=(
        "CA certificates (PEM) that client certificates must chain to; set, every client must present one "
        "(mutual TLS, which counts as authentication); unset, clients are not asked for one"))
    min_version: Literal["TLSv1.2", "TLSv1.3"] = "TLSv1.2"
    ciphers: str | None = Field(None, description="OpenSSL cipher list for TLS 1.2 (default: OpenSSL's)")
    principal_mapping_rules: list[str] = Field(default_factory=lambda: ["DEFAULT"], min_length=1, description=(
        "how a client certificate's subject (RFC 2253, e.g. CN=reader,OU=ops,O=example) becomes the principal "
        "User:<name> whose ACLs apply, first matching rule wins: Kafka's ssl.principal.mapping.rules, one rule per "
        "item (RULE:pattern/replacement/[LU], or DEFAULT: the whole subject). A certificate no rule matches is "
        "refused (its connection closed), as Kafka refuses it"))

    @field_validator("principal_mapping_rules")
    @classmethod
    def _rules(cls, v: list[str]) -> list[str]:
        from rlm.listener.net.principals import parse_mapping_rules  # the one parser (errors name the rule)

        parse_mapping_rules(v)
        return v

    @property
    def client_auth(self) -> bool:
        return self.cafile is not None


class HistorySaslSettings(_Frozen):
    """SASL of the history endpoint (``SASL_PLAINTEXT``, or ``SASL_SSL`` with ``tls``), users from the config.

    Passwords are :class:`~pydantic.SecretStr` (never shown by repr, str or logs); they may come from the
    environment, e.g. ``RLM_HISTORY_LISTENER__SASL__USERS__alice=...`` (names from environment variables are
    lower-cased) or ``RLM_HISTORY_LISTENER__SASL__USERS='{"Alice": "..."}'``. The endpoint keeps only SCRAM
    credentials derived from them (salted, ``scram_iterations`` rounds), for both mechanisms.

    As a proxy (``history_listener.proxy``) the listener keeps no users: SASL is passed through to the broker, which
    authenticates each client with its own credentials (:class:`rlm.listener.net.sasl.SaslPassThrough`); ``users``
    is then left out, and ``mechanisms`` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) are those the proxy lets through."""

    mechanisms: list[Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]] = Field(
        default_factory=lambda: ["SCRAM-SHA-512"], min_length=1,
        description="mechanisms offered: PLAIN sends the password itself, use it with TLS only; SCRAM-SHA-256 as a "
                    "proxy only (the endpoint keeps SCRAM-SHA-512 credentials)")
    users: dict[str, SecretStr] | None = Field(None, min_length=1, description=(
        "user name -> password (the endpoint; required there). As a proxy: none, the broker checks passwords"))
    scram_iterations: int = Field(4096, ge=4096, le=16384, description=(
        "PBKDF2 rounds of the SCRAM credentials (Kafka's clients refuse fewer than 4096; brokers allow 16384)"))

    @field_validator("mechanisms")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a mechanism is listed twice")
        return v

    @field_validator("users")
    @classmethod
    def _users(cls, v: dict[str, SecretStr] | None) -> dict[str, SecretStr] | None:
        for name, password in (v or {}).items():
            if not name or "\0" in name:
                raise ValueError(f"user name {name!r} is empty or holds a NUL character")
            if not password.get_secret_value():
                raise ValueError(f"user {name!r} has an empty password")
        return v


class HistoryUpstreamTlsSettings(_Frozen):
    """TLS from a proxying listener to its broker, whose listener speaks ``SSL`` or ``SASL_SSL``: the proxy is the
    client there, and checks the broker's certificate as Kafka's clients do (``ssl.ca.location``,
    ``ssl.endpoint.identification.algorithm=https``)."""

    cafile: Path | None = Field(None, description=(
        "CA certificates (PEM) the broker's certificate must chain to (default: the system's)"))
    check_hostname: bool = Field(True, description=(
        "the broker's certificate must name the upstream host (Kafka's ssl.endpoint.identification.algorithm=https, "
        "its default); false is Kafka's empty setting"))


class HistoryAuthorizationSettings(_Frozen):
    """Who may read which topic through the history endpoint: the cluster's own ACLs, as Kafka's authorizer
    applies them to the same principal (``User:<SASL name>``, the mapped certificate subject, or
    ``User:ANONYMOUS``). READ on a topic lets a client fetch it, DESCRIBE (which READ implies) list it and its
    offsets. The ACLs are fetched with DescribeAcls by the sidecar's own Kafka principal (which needs DESCRIBE on
    the cluster) every ``acl_cache_ttl_ms / 2``; when none could be fetched for ``acl_cache_ttl_ms`` every topic
    is refused (TOPIC_AUTHORIZATION_FAILED): it fails closed."""

    acl_cache_ttl_ms: int = Field(10_000, ge=1000, le=3_600_000, description=(
        "how old the ACLs used may be: an ACL added or removed on the cluster applies within this time; ACLs not "
        "refreshed for this long refuse every topic"))
    super_users: list[str] = Field(default_factory=list, description=(
        "principals that may read every topic without ACLs (Kafka's super.users; e.g. User:admin)"))
    allow_everyone_if_no_acl_found: bool = Field(False, description=(
        "a topic no ACL names (literal, prefixed or *) may be read by anyone (Kafka's "
        "allow.everyone.if.no.acl.found, false by default)"))
    allow_if_no_authorizer: bool = Field(False, description=(
        "the cluster has no authorizer (DescribeAcls answers SECURITY_DISABLED): every client may read every "
        "tiered topic, as the cluster's own listeners allow. Unset, such a cluster's topics are refused"))

    @field_validator("super_users")
    @classmethod
    def _principals(cls, v: list[str]) -> list[str]:
        for p in v:
            kind, sep, name = p.partition(":")
            if not sep or not kind or not name:
                raise ValueError(f"super user {p!r} is not a principal: write it as Kafka does, e.g. User:admin")
        return v


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for an IPv6 address) as (host, port); ValueError says what is wrong."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r} is not host:port")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    """``host`` names this machine only (localhost, 127.0.0.0/8, ::1): nothing else can connect to it."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class HistoryListenerSettings(_Frozen):
    """The Kafka-protocol history endpoint (:mod:`rlm.listener`): any Kafka client reads the remote tier here.

    Security: it binds 127.0.0.1 unless told otherwise. A listener any other host can reach must authenticate its
    clients, by ``sasl`` or by client certificates (``tls.cafile``), or it refuses to start unless
    ``allow_unauthenticated: true`` says that anyone who reaches it may read every tiered topic. TLS without client
    certificates encrypts but does not authenticate."""

    host: str = Field("127.0.0.1", description="address to bind; 127.0.0.1 unless clients elsewhere need it")
    port: int = Field(9095, ge=0, le=65535, description="0: any free port (tests)")
    advertised_host: str | None = Field(None, description="host clients are told to connect to (default: host)")
    workers: int = Field(8, ge=1, le=256, description="threads reading the store for requests")
    fetch_poll_ms: int = Field(200, ge=10, description=(
        "how often the partitions waiting Fetches (long polls) wait on are looked at for newly tiered data: once "
        "for all of them; only the polls whose partitions grew are fetched again"))
    fetch_max_bytes: int = Field(57_671_680, ge=1024, description=(
        "the most record bytes one Fetch answer carries, whatever the client asks (Kafka's broker fetch.max.bytes "
        "and its default, 55 MiB); the first batch of the first partition with data is sent even if larger"))
    socket_request_max_bytes: int = Field(104_857_600, ge=1024, le=2**31 - 1, description=(
        "the largest request frame read; a larger size prefix closes the connection unread (Kafka's "
        "socket.request.max.bytes and its default, 100 MiB). Before SASL authentication 512 KiB at most, as "
        "Kafka's sasl.server.max.receive.size"))
    fetch_max_wait_ms: int = Field(500, ge=0, le=300_000, description=(
        "the longest a Fetch waits for data, whatever max_wait the client asks (a cap as Kafka's "
        "replica.fetch.wait.max.ms, whose default it takes: the Java consumer and librdkafka ask 500 by default)"))
    connections_max_idle_ms: int = Field(600_000, ge=100, description=(
        "a connection with no request for this long (or that takes this long to send one) is closed "
        "(Kafka's connections.max.idle.ms and its default, 10 min)"))
    socket_send_buffer_bytes: int = Field(102_400, ge=-1, description=(
        "SO_SNDBUF of the clients' sockets: what the kernel holds of an answer a client has not read yet; -1: the "
        "OS's (Kafka's socket.send.buffer.bytes and its default). A connection whose answers outgrow it gets 1 MiB, "
        "or half its largest answer up to 4 MiB, while the buffers so raised, counted against "
        "queued_max_response_bytes, stay within a quarter of it"))
    write_timeout_ms: int = Field(30_000, ge=100, description=(
        "a connection whose queued answer has not been read at all for this long is closed, as is one that has not "
        "taken a whole answer within connections_max_idle_ms (no Kafka equivalent: 30 s)"))
    queued_max_response_bytes: int = Field(268_435_456, ge=65_536, description=(
        "answer bytes queued to all clients at once (those that read slowly or not at all): a Fetch answer carries "
        "no more records than what is left of it (still the first batch, so that consumers progress). No Kafka "
        "equivalent: 256 MiB"))
    queued_max_request_bytes: int = Field(268_435_456, ge=65_536, description=(
        "request bytes held for all clients at once: a request frame over 64 KiB is read once it fits (before "
        "SASL authentication it takes from an eighth of this beside it, and its connection is closed instead of "
        "waiting when that is full), so clients that send part of a large "
        "request and stop cannot make the sidecar hold more than this (Kafka's queued.max.request.bytes, whose "
        "default is unbounded: 256 MiB here)"))
    authentication_timeout_ms: int = Field(30_000, ge=100, description=(
        "with sasl, a connection not authenticated this long after it was accepted is closed; also the TLS "
        "handshake's limit (no Kafka equivalent: 30 s)"))
    max_connections: int = Field(1000, ge=1, description=(
        "connections served at once; more are closed as soon as accepted (Kafka's max.connections, whose "
        "default is unbounded: 1000 here)"))
    max_connections_per_ip: int = Field(200, ge=1, description=(
        "connections served at once from one address; more are closed as soon as accepted (Kafka's "
        "max.connections.per.ip, whose default is unbounded: 200 here)"))
    connection_failed_authentication_delay_ms: int = Field(100, ge=0, description=(
        "a failed SASL authentication is answered (and its connection closed) this long after it failed, to "
        "slow down password guessing (Kafka's connection.failed.authentication.delay.ms and its default)"))
    tls: HistoryTlsSettings | None = Field(None, description="serve over TLS (SSL / SASL_SSL)")
    sasl: HistorySaslSettings | None = Field(None, description="require SASL authentication")
    authorization: HistoryAuthorizationSettings = Field(
        default_factory=HistoryAuthorizationSettings, description="which topics a client may read: the cluster's ACLs")
    allow_unauthenticated: bool = Field(False, description=(
        "let a listener on a non-loopback host start without SASL or client certificates"))
    allow_sasl_plain_without_tls: bool = Field(False, description=(
        "let a listener on a non-loopback host offer SASL PLAIN without tls: every client's password then crosses "
        "the network in clear text (Kafka allows it on SASL_PLAINTEXT; we refuse unless told)"))
    proxy: bool = Field(False, description=(
        "the listener proxies the broker this sidecar runs next to: every request is forwarded to it, except what "
        "the tier answers (below the broker's log start: Fetch, ListOffsets EARLIEST and by timestamp, "
        "OffsetForLeaderEpoch) and the broker addresses "
        "in Metadata / FindCoordinator / DescribeCluster, replaced by the sidecars' (peer_address, peers). Off: "
        "the history endpoint, serving the tier alone"))
    hole_confirm_ms: int = Field(30_000, ge=0, le=3_600_000, description=(
        "proxy: how long a range below the broker's log start that the tier does not hold, and that nothing "
        "staged for tiering covers, must have been seen before it is a hole (then the broker's answers stand: a "
        "Fetch there OFFSET_OUT_OF_RANGE, ListOffsets EARLIEST its log start, a timestamp lookup the tier has no "
        "answer to and OffsetForLeaderEpoch of an epoch the tier has nothing above its own answer); until then "
        "these four are OFFSET_NOT_AVAILABLE and clients ask again. It covers the moment between a copy's staging "
        "released and the listener's metadata manager and tier view reading the copy, and a rolled segment not "
        "staged yet"))
    upstream: str | None = Field(None, description=(
        "proxy: host:port of the broker's listener this sidecar forwards to, speaking upstream_security_protocol "
        "(default: the address the cluster's metadata gives for broker_id, when the sidecar's own Kafka client "
        "speaks that protocol)"))
    peer_address: str | None = Field(None, description=(
        "proxy: the listener address of the sidecar in front of each other broker, as a template of {node_id} "
        "and {host} (the broker's advertised host), e.g. '{host}:9095' or 'rlm-{node_id}.kafka.svc:9095'. A "
        "broker neither this nor peers names keeps its own address (clients then read it directly: no history; and "
        "its Metadata gives them every broker's own address, this one's too: a consumer group then reads without "
        "history, and is reset by OFFSET_OUT_OF_RANGE below the log start). Name every broker"))
    peers: dict[int, str] = Field(default_factory=dict, description=(
        "proxy: broker node id -> host:port of the sidecar listener in front of it (before peer_address)"))
    upstream_tls: HistoryUpstreamTlsSettings | None = Field(None, description=(
        "proxy: the broker's listener speaks TLS (SSL, or SASL_SSL with sasl): how the proxy checks its certificate"))

    @field_validator("upstream")
    @classmethod
    def _upstream(cls, v: str | None) -> str | None:
        if v is not None:
            split_host_port(v)
        return v

    @field_validator("peers")
    @classmethod
    def _peers(cls, v: dict[int, str]) -> dict[int, str]:
        for node_id, address in v.items():
            try:
                split_host_port(address)
            except ValueError as err:
                raise ValueError(f"peers.{node_id}: {err}") from None
        return v

    @field_validator("peer_address")
    @classmethod
    def _peer_address(cls, v: str | None) -> str | None:
        if v is None:
            return v
        if "{node_id}" not in v and "{host}" not in v:
            raise ValueError(f"{v!r} names neither {{node_id}} nor {{host}}: every broker would get the same sidecar")
        try:
            split_host_port(v.format(node_id=1, host="broker-1"))
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(f"{v!r} is not a host:port template of {{node_id}} and {{host}}: {err}") from None
        return v

    @model_validator(mode="after")
    def _proxy_security(self) -> HistoryListenerSettings:
        sasl = self.sasl
        if not self.proxy:
            if self.upstream_tls is not None:
                raise ValueError("history_listener.upstream_tls is the proxy's TLS to its broker: set proxy: true, "
                                 "or remove upstream_tls")
            if sasl is not None and not sasl.users:
                raise ValueError("history_listener.sasl.users: the endpoint authenticates its clients itself and "
                                 "needs users (name: password)")
            if sasl is not None and "SCRAM-SHA-256" in sasl.mechanisms:
                raise ValueError("history_listener.sasl.mechanisms: SCRAM-SHA-256 is passed through by a proxy only; "
                                 "the endpoint offers SCRAM-SHA-512 and PLAIN")
            return self
        if sasl is not None and sasl.users:
            raise ValueError(
                "history_listener.sasl.users with proxy: a proxy passes SASL through to its broker, which "
                "authenticates each client with the cluster's credentials; remove users (and their passwords)")
        if self.tls is not None and self.tls.client_auth:
            raise ValueError(
                "history_listener.proxy with history_listener.tls.cafile (client certificates): a certificate's "
                "identity cannot be passed on to the broker, so the client's requests would reach it under another "
                "principal; authenticate clients with sasl (passed through to the broker), or remove tls.cafile")
        return self

    @model_validator(mode="after")
    def _delay_below_idle(self) -> HistoryListenerSettings:
        if self.connection_failed_authentication_delay_ms >= self.connections_max_idle_ms:
            raise ValueError("connection_failed_authentication_delay_ms must be below connections_max_idle_ms "
                             "(as Kafka requires)")
        return self

    @model_validator(mode="after")
    def _advertised(self) -> HistoryListenerSettings:
        if self.advertised_host is None and self.host in ("0.0.0.0", "::", ""):
            raise ValueError("advertised_host must be set when host binds every address")
        return self

    @model_validator(mode="after")
    def _authenticated(self) -> HistoryListenerSettings:
        if is_loopback(self.host) or self.authenticated or self.allow_unauthenticated:
            return self
        raise ValueError(
            f"history_listener.host {self.host!r} is reachable from other hosts but clients are not authenticated: "
            "configure history_listener.sasl (or history_listener.tls.cafile for client certificates), or set "
            "history_listener.allow_unauthenticated: true to serve every tiered topic to anyone who connects")

    @model_validator(mode="after")
    def _plain_over_tls(self) -> HistoryListenerSettings:
        if (self.sasl is None or "PLAIN" not in self.sasl.mechanisms or self.tls is not None or is_loopback(self.host)
                or self.allow_sasl_plain_without_tls):
            return self
        raise ValueError(
            f"history_listener.sasl.mechanisms offers PLAIN on {self.host!r}, reachable from other hosts, without "
            "TLS: passwords would cross the network in clear text. Configure history_listener.tls (SASL_SSL), or "
            "offer SCRAM-SHA-512 only, or set history_listener.allow_sasl_plain_without_tls: true")

    @property
    def authenticated(self) -> bool:
        """Clients prove who they are: SASL, or TLS client certificates."""
        return self.sasl is not None or (self.tls is not None and self.tls.client_auth)

    @property
    def upstream_security_protocol(self) -> str:
        """As a proxy, what its broker's listener speaks: SASL when the listener's clients authenticate with SASL
        (passed through), TLS with ``upstream_tls``."""
        return ("SASL_" if self.sasl is not None else "") + ("SSL" if self.upstream_tls is not None else "PLAINTEXT")

    @property
    def security_protocol(self) -> str:
        """Kafka's name for what the listener speaks (what clients set as ``security.protocol``)."""
        return ("SASL_" if self.sasl is not None else "") + ("SSL" if self.tls is not None else "PLAINTEXT")

    @property
    def advertised(self) -> str:
        return self.advertised_host or self.host


class SidecarSettings(BaseSettings):
    """The whole sidecar configuration (see ``config/sidecar.example.yaml``)."""

    model_config = SettingsConfigDict(env_prefix="RLM_", env_nested_delimiter="__", frozen=True, extra="forbid")

    broker_id: int = Field(ge=0)
    log_dirs: list[Path] = Field(min_length=1, description="the broker's log.dirs")
    staging_dir: Path | None = Field(
        None, description="hard-link staging area; must be on the same filesystem as the log dirs, outside them "
                          "(default: beside each log dir, <its parent>/.rlm-staging/<its name>)")
    staging_max_bytes: int = Field(
        0, ge=0, description="bound of each log dir's staging area in bytes; 0: unbounded. Past it a newly rolled "
                             "segment is not staged (what is staged is copied first; a segment the broker then "
                             "deletes is reported as a gap). An empty area always takes one segment")
    kafka: KafkaSettings
    store: RsmConfig = Field(default_factory=lambda: RsmConfig(store="fs", root_path=Path("/var/lib/rlm/remote")))
    metadata: MetadataSettings = MetadataSettings()
    tasks: TaskSettings = TaskSettings()
    topics: TopicSelection = TopicSelection()
    retention: list[RetentionRule] = Field(default_factory=lambda: [RetentionRule()])
    offload: list[OffloadRule] = Field(default_factory=list, description=(
        "per-topic tiering mode (first matching rule wins; none: segment mode)"))
    listen: ListenSettings = ListenSettings()
    health: HealthSettings = HealthSettings()
    history_listener: HistoryListenerSettings | None = Field(
        None, description="serve the remote tier over the Kafka protocol (off unless set)")
    mode: Literal["normal", "read_only"] = Field(
        "normal", description="read_only: serve reads of a store and metadata topic this sidecar does not own (e.g. "
                              "another cluster's tier): it never copies, expires, deletes, collects garbage, purges "
                              "or writes metadata")
    log_format: Literal["json", "text"] = "json"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _log_dirs_distinct(self) -> SidecarSettings:
        if len(set(self.log_dirs)) != len(self.log_dirs):
            raise ValueError("log_dirs lists a directory twice")
        return self

    def offload_for(self, topic: str) -> OffloadRule:
        for rule in self.offload:
            if re.fullmatch(rule.pattern, topic):
                return rule
        return OffloadRule(pattern=re.escape(topic))

    def retention_for(self, topic: str) -> RetentionRule:
        for rule in self.retention:
            if re.fullmatch(rule.pattern, topic):
                return rule
        return RetentionRule(pattern=re.escape(topic), retention_ms=-1, retention_bytes=-1)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Environment beats the file (passed as init kwargs), so an operator can override one field.
        return env_settings, init_settings


def load_settings(path: Path | str, **overrides: Any) -> SidecarSettings:
    """Read and validate a YAML config file; raise :class:`ConfigError` naming the file and the bad fields."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from err
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping, found {type(raw).__name__}")
    raw.update(overrides)
    try:
        return SidecarSettings(**raw)
    except ValidationError as err:
        lines = []
        for e in err.errors():
            field = ".".join(str(x) for x in e["loc"]) or "(top level)"
            lines.append(f"  {field}: {e['msg']}")
        raise ConfigError(f"{path}: invalid configuration:\n" + "\n".join(lines)) from None
