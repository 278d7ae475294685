"""What the sidecar and its commands need from Kafka's authorizer, checked up front with one clear error.

Kafka answers a refused request with ``TOPIC_AUTHORIZATION_FAILED`` (or ``CLUSTER_`` / ``GROUP_``), which names
neither the operation nor, in a librdkafka log line, always the resource; and a refusal deep inside a client thread
(the metadata manager's idempotent producer, its consumer) surfaces as a hang or a dead thread. So before starting,
``rlm serve``, the operator commands and the Spark source's driver ask the broker what the principal may do
(DescribeTopics and DescribeCluster with ``include_authorized_operations``) and fail with
:class:`NotAuthorizedError`::

    not authorized: READ on topic __remote_log_metadata for principal User:reader

The broker computes those operation sets with the ACLs' implications (``ALL`` implies every operation, ``READ``
and ``WRITE`` imply ``DESCRIBE``), so a grant of ``ALL`` passes every check here.

What each caller needs (README, "Authenticated clusters"):

- the operator commands (``ls``, ``cat``, ``offsets``, ``verify``, ``gc``), Spark, the history endpoint and
  ``mode: read_only``: ``DESCRIBE``, ``DESCRIBE_CONFIGS`` and ``READ`` on the metadata topic (their metadata manager
  is read-only: no producer, so no WRITE right); ``DESCRIBE`` on each topic named (checked when it is described);
  ``DESCRIBE`` on groups prefixed ``rlmm-`` (not checked: librdkafka looks up the coordinator of the metadata
  consumer's throw-away group, and only warns when refused);
- ``rlm serve``: ``DESCRIBE``, ``DESCRIBE_CONFIGS``, ``READ`` and ``WRITE`` on the metadata topic, ``DESCRIBE``,
  ``READ`` and ``WRITE`` on the to-be-deleted topic, ``CREATE`` (on the cluster or the topic) while one of them
  does not exist yet, ``READ`` on the cleaner's group (``rlm-cleaner``, ``rlm-cleaner.<topic>`` for a to-be-deleted
  topic other than the default; not checked) and ``DESCRIBE`` on groups prefixed ``rlmm-``. The tiered topics need
  ``DESCRIBE`` and ``DESCRIBE_CONFIGS``; without them a topic is not
  tiered (logged), which is not an error of the whole sidecar. ``DESCRIBE`` on the cluster is not needed
  (DescribeCluster answers without it), except by the history endpoint;
- a history endpoint (``history_listener``, either mode): ``DESCRIBE`` on the cluster, to read the cluster's ACLs
  (DescribeAcls) that authorize its clients (:mod:`rlm.listener.authz`).

Checked here: the topics' operations. A topic that does not exist yet is not checked (Kafka describes no
operations of an absent topic, and ``CREATE`` may be granted on its name): creating it fails with the broker's
TOPIC_AUTHORIZATION_FAILED, which :func:`authorization_error` turns into one line. A check that cannot get an
answer (broker unreachable, timeout) does not fail: the command goes on and reports its own error, as it did
without the check.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rlm.errors import RlmError

__all__ = ["Need", "NotAuthorizedError", "authorization_error", "check", "principal_of", "reader_needs",
           "serve_needs"]

log = logging.getLogger(__name__)

CLUSTER = "kafka-cluster"  # the cluster resource's name in Kafka's ACLs


class NotAuthorizedError(RlmError):
    """The principal lacks an ACL the command needs: grant ``operation`` on ``resource_type`` ``resource_name``
    to ``principal`` (``kafka-acls --add --allow-principal ... --operation ...``) and run it again."""

    def __init__(self, operation: str, resource_type: str, resource_name: str, principal: str, *,
                 why: str = "") -> None:
        self.operation = operation
        self.resource_type = resource_type
        self.resource_name = resource_name
        self.principal = principal
        text = f"not authorized: {operation} on {resource_type} {resource_name} for principal {principal}"
        if why:
            text += f": {why}"
        super().__init__(text)


@dataclass(frozen=True, slots=True)
class Need:
    """One operation on one resource (``topic`` or ``cluster``)."""

    resource_type: str
    name: str
    operation: str
    why: str = ""


def principal_of(client_config: Mapping[str, Any]) -> str:
    """``User:<sasl.username>``, the principal Kafka's SASL authenticators give a client, or a description."""
    user = client_config.get("sasl.username")
    return f"User:{user}" if user else "(this client's principal)"


def reader_needs(md_topic: str) -> list[Need]:
    """What reading the metadata topic needs (operator commands, ``mode: read_only``)."""
    why = "the metadata manager reads the metadata topic"
    return [Need("topic", md_topic, "DESCRIBE", why), Need("topic", md_topic, "DESCRIBE_CONFIGS", why),
            Need("topic", md_topic, "READ", why)]


def serve_needs(md_topic: str, tbd_topic: str, *, read_only: bool, history: bool = False) -> list[Need]:
    """What ``rlm serve`` needs (see the module docstring); ``history``: a history endpoint is configured, which
    reads the cluster's ACLs (DescribeAcls needs DESCRIBE on the cluster)."""
    out: list[Need] = []
    if history:
        out.append(Need("cluster", CLUSTER, "DESCRIBE", "the history endpoint reads the cluster's ACLs "
                                                        "(DescribeAcls) to authorize its clients"))
    if read_only:
        return out + reader_needs(md_topic)
    for topic, role in ((md_topic, "metadata topic"), (tbd_topic, "to-be-deleted topic")):
        ops = ("DESCRIBE", "DESCRIBE_CONFIGS", "READ", "WRITE") if topic == md_topic else ("DESCRIBE", "READ",
                                                                                            "WRITE")
        out += [Need("topic", topic, op, f"the sidecar reads and writes its {role}") for op in ops]
    return out


def _code(err: BaseException) -> int | None:
    arg = err.args[0] if err.args else None
    return arg.code() if hasattr(arg, "code") else None


def _operations(ops: Any) -> frozenset[str]:
    """librdkafka's list of authorized operations; None when the broker's answer is the empty set (asked for)."""
    return frozenset(op.name for op in (ops or ()))


class _Answers:
    """The principal's authorized operations, asked once per resource through one AdminClient."""

    def __init__(self, client_config: Mapping[str, Any], timeout_s: float) -> None:
        from confluent_kafka.admin import AdminClient

        self._admin = AdminClient(dict(client_config))
        self._timeout_s = timeout_s
        self._topics: dict[str, frozenset[str] | None | BaseException] = {}
        self._cluster: frozenset[str] | None | BaseException | bool = False  # False: not asked yet

    def cluster(self) -> frozenset[str] | None | BaseException:
        """The cluster operations; None: DESCRIBE on the cluster refused; an exception: no answer."""
        from confluent_kafka import KafkaError

        if self._cluster is False:
            try:
                res = self._admin.describe_cluster(include_authorized_operations=True,
                                                   request_timeout=self._timeout_s).result(self._timeout_s + 5)
                self._cluster = _operations(res.authorized_operations)
            except Exception as err:  # noqa: BLE001 - kept as the answer
                self._cluster = None if _code(err) == KafkaError.CLUSTER_AUTHORIZATION_FAILED else err
        return self._cluster  # type: ignore[return-value]

    def topic(self, name: str) -> frozenset[str] | None | BaseException:
        """The topic's operations; empty: the principal may not even DESCRIBE it; None: it does not exist; an
        exception: no answer."""
        from confluent_kafka import KafkaError, TopicCollection

        if name not in self._topics:
            try:
                futures = self._admin.describe_topics(TopicCollection([name]), include_authorized_operations=True,
                                                      request_timeout=self._timeout_s)
                desc = futures[name].result(self._timeout_s + 5)
                self._topics[name] = _operations(desc.authorized_operations)
            except Exception as err:  # noqa: BLE001 - kept as the answer
                code = _code(err)
                if code == KafkaError.UNKNOWN_TOPIC_OR_PART:
                    self._topics[name] = None
                elif code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                    self._topics[name] = frozenset()  # not even DESCRIBE
                else:
                    self._topics[name] = err
        return self._topics[name]


def check(client_config: Mapping[str, Any], needs: Iterable[Need], *, timeout_s: float = 15.0) -> None:
    """Raise :class:`NotAuthorizedError` for the first of ``needs`` the broker says the principal lacks.

    Needs that cannot be checked (no answer, a topic that does not exist yet) are skipped, logged at debug
    level."""
    principal = principal_of(client_config)
    answers = _Answers(client_config, timeout_s)
    for need in needs:
        if need.resource_type == "cluster":
            ops = answers.cluster()
            if isinstance(ops, BaseException):
                log.debug("authorization check skipped: no answer", extra={"need": repr(need), "error": str(ops)})
                continue
            if ops is None:  # DescribeCluster itself refused
                if need.operation == "DESCRIBE":
                    raise NotAuthorizedError("DESCRIBE", "cluster", need.name, principal, why=need.why)
                continue  # cannot tell
            if need.operation not in ops and "ALL" not in ops:
                raise NotAuthorizedError(need.operation, "cluster", need.name, principal, why=need.why)
            continue
        ops = answers.topic(need.name)
        if isinstance(ops, BaseException):
            log.debug("authorization check skipped: no answer", extra={"need": repr(need), "error": str(ops)})
            continue
        if ops is None:  # absent: whoever creates it meets the broker's own refusal (authorization_error)
            continue
        if need.operation in ops:
            continue
        if not ops:  # DescribeTopics refused: the principal may not even DESCRIBE it
            raise NotAuthorizedError("DESCRIBE", "topic", need.name, principal, why=need.why)
        raise NotAuthorizedError(need.operation, "topic", need.name, principal, why=need.why)


_RESOURCE_OF_CODE = {"TOPIC_AUTHORIZATION_FAILED": "topic", "GROUP_AUTHORIZATION_FAILED": "group",
                     "CLUSTER_AUTHORIZATION_FAILED": "cluster", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED":
                     "transactional id"}


def authorization_error(err: BaseException, client_config: Mapping[str, Any] | None = None) -> str | None:
    """For an error a refused request caused somewhere inside (a KafkaException, or an error whose text carries
    the code), a one-line message naming the refused resource kind, the principal and librdkafka's reason; else
    None. The operation is not in Kafka's answer: the up-front :func:`check` names it where it can."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        text = str(e)
        for code, resource in _RESOURCE_OF_CODE.items():
            if code in text:
                who = principal_of(client_config or {})
                return f"not authorized on a {resource} for principal {who} ({code}): {text}"
        e = e.__cause__ or e.__context__
    return None
