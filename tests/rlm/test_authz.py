"""The up-front ACL check's decisions (rlm.authz), over canned broker answers (the real broker's answers are
exercised end to end in test_secure_cluster.py)."""

from __future__ import annotations

from typing import Any

import pytest

from rlm import authz
from rlm.authz import NotAuthorizedError, authorization_error, check, reader_needs, serve_needs

CONF = {"bootstrap.servers": "127.0.0.1:1", "sasl.username": "bob"}
ALL_TOPIC = frozenset({"DESCRIBE", "DESCRIBE_CONFIGS", "READ", "WRITE", "CREATE", "DELETE", "ALTER"})


class Answers:
    """What DescribeTopics / DescribeCluster would say: topic -> ops (None: does not exist; an exception: no
    answer), cluster ops (None: DESCRIBE on the cluster refused)."""

    topics: dict[str, Any] = {}
    cluster_ops: Any = frozenset()

    def __init__(self, client_config: Any, timeout_s: float) -> None:
        pass

    def topic(self, name: str) -> Any:
        return self.topics[name]

    def cluster(self) -> Any:
        return self.cluster_ops


@pytest.fixture
def answers(monkeypatch: pytest.MonkeyPatch) -> type[Answers]:
    monkeypatch.setattr(authz, "_Answers", Answers)
    Answers.topics, Answers.cluster_ops = {}, frozenset({"DESCRIBE"})
    return Answers


def refused(needs: list[authz.Need]) -> str:
    with pytest.raises(NotAuthorizedError) as err:
        check(CONF, needs)
    return str(err.value)


def test_everything_granted_passes(answers: type[Answers]) -> None:
    answers.topics = {"md": ALL_TOPIC, "tbd": ALL_TOPIC}
    check(CONF, serve_needs("md", "tbd", read_only=False))
    check(CONF, reader_needs("md"))


def test_missing_read_is_named(answers: type[Answers]) -> None:
    answers.topics = {"md": frozenset({"DESCRIBE", "DESCRIBE_CONFIGS", "WRITE"})}
    assert refused(reader_needs("md")) == ("not authorized: READ on topic md for principal User:bob: the metadata "
                                           "manager reads the metadata topic")


def test_no_describe_at_all_is_named_as_describe(answers: type[Answers]) -> None:
    answers.topics = {"md": frozenset()}
    assert refused(reader_needs("md")).startswith("not authorized: DESCRIBE on topic md for principal User:bob")


def test_a_reader_needs_no_write(answers: type[Answers]) -> None:
    """Readers' metadata managers have no producer: neither WRITE nor IDEMPOTENT_WRITE is needed to read."""
    answers.topics = {"md": frozenset({"DESCRIBE", "DESCRIBE_CONFIGS", "READ"})}
    answers.cluster_ops = frozenset()
    check(CONF, reader_needs("md"))
    assert "WRITE on topic md" in refused(serve_needs("md", "md", read_only=False))


@pytest.mark.parametrize("read_only", [False, True])
def test_a_history_endpoint_needs_describe_on_the_cluster(answers: type[Answers], read_only: bool) -> None:
    """The history endpoint reads the cluster's ACLs (DescribeAcls): without DESCRIBE on the cluster it could only
    refuse every topic, so ``rlm serve`` says so before it starts; without an endpoint it is not needed."""
    answers.topics = {"md": ALL_TOPIC, "tbd": ALL_TOPIC}
    answers.cluster_ops = None  # DescribeCluster refused: no DESCRIBE on the cluster
    check(CONF, serve_needs("md", "tbd", read_only=read_only))
    assert refused(serve_needs("md", "tbd", read_only=read_only, history=True)) == (
        "not authorized: DESCRIBE on cluster kafka-cluster for principal User:bob: the history endpoint reads the "
        "cluster's ACLs (DescribeAcls) to authorize its clients")
    answers.cluster_ops = frozenset({"DESCRIBE"})
    check(CONF, serve_needs("md", "tbd", read_only=read_only, history=True))


def test_absent_topic_is_not_checked(answers: type[Answers]) -> None:
    """CREATE may be granted on the topic's name, which Kafka does not describe: creating it will tell."""
    answers.topics = {"md": ALL_TOPIC, "tbd": None}
    answers.cluster_ops = frozenset()
    check(CONF, serve_needs("md", "tbd", read_only=False))


def test_no_answer_skips_the_check(answers: type[Answers]) -> None:
    answers.topics = {"md": TimeoutError("no answer"), "tbd": TimeoutError("no answer")}
    check(CONF, serve_needs("md", "tbd", read_only=False))  # the command reports its own error later


def test_principal_without_sasl_username(answers: type[Answers]) -> None:
    answers.topics = {"md": frozenset({"DESCRIBE"})}
    with pytest.raises(NotAuthorizedError) as err:
        check({"bootstrap.servers": "x:1"}, reader_needs("md"))
    assert "for principal (this client's principal)" in str(err.value)


def test_authorization_error_from_a_client_failure() -> None:
    from confluent_kafka import KafkaError, KafkaException

    inner = KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "Broker: Topic authorization failed"))
    try:
        try:
            raise inner
        except KafkaException as e:
            raise RuntimeError("the metadata consumer thread died") from e
    except RuntimeError as outer:
        msg = authorization_error(outer, CONF)
    assert msg is not None and msg.startswith("not authorized on a topic for principal User:bob "
                                              "(TOPIC_AUTHORIZATION_FAILED)")
    assert authorization_error(RuntimeError("disk full"), CONF) is None
