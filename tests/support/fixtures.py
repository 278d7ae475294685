"""The session fixtures for the real systems the tests run against, as a pytest plugin (``tests/conftest.py`` loads it).

- ``kafka``: one real Apache Kafka broker (KRaft) on 127.0.0.1, started once per session, its log tasks (retention)
  running from its start (``devtools.devkafka.LOG_TASKS_FROM_START``). If it cannot start the fixture raises, so
  every test that needs it errors: broker tests never skip (CI included).
- ``kafka_cluster3``: a 3-broker cluster for leadership tests (started on first use).
- ``kafka_sasl``: a 1-broker cluster with SASL_PLAINTEXT/PLAIN and KRaft's StandardAuthorizer (started on first
  use): ``admin_config()`` is the super user's client configuration, ``client_config(SASL_PRINCIPAL)`` (and
  ``security_config(SASL_PRINCIPAL)``) the principal's, who starts with no ACLs; ``SASL_READER`` is a second
  one, never granted anything on the cluster resource (tests grant it topic and group ACLs only), ``SASL_VIEWER``
  a third, a read-only sidecar's.
- ``kafka_sasl_ssl``: the same over SASL_SSL (SCRAM-SHA-512, TLS with a CA generated at start; started on first
  use): ``client_config(SCRAM_PRINCIPAL)`` carries ``ssl.ca.location`` as well.
- ``kafka_big``: a 1-broker cluster taking records up to 230 MiB (:func:`tests.support.bigrecord.big_record_cluster`;
  started on first use): the large-record modules share it.
- ``s3_endpoint``: moto's S3 server on 127.0.0.1, spoken to through boto3 over HTTP (fault injection uses it).
- ``s3proxy_endpoint``: s3proxy, a real S3 server over a directory, on 127.0.0.1 (jars via Maven, cached in
  ``.cache/s3proxy/``); like the broker it never skips. ``s3_server`` runs a test once per server (moto, s3proxy).
- ``spark``: a local SparkSession with ``kafka-remote`` registered (started on first use).
- ``topic_name``: a unique topic name per test (uuid suffix), so tests never see each other's data.

Every Kafka JVM of the suite runs the ``quick`` profile (``RLM_KAFKA_JVM``, see :mod:`devtools.devkafka`): the
serial collector and C1 alone, about half the CPU of a broker's start; the tests move little data and start dozens.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devtools.devkafka import JVM_PROFILES, LOG_TASKS_FROM_START, KafkaCluster, KafkaStartError

__all__ = ["SASL_PRINCIPAL", "SASL_READER", "SASL_VIEWER", "SCRAM_PRINCIPAL"]

SASL_PRINCIPAL = "rlm"  # the kafka_sasl cluster's non-super user
SASL_READER = "reader"  # another, never granted anything on the cluster (only topic and group ACLs)
SASL_VIEWER = "viewer"  # a third: a read-only sidecar's principal (its tests grant it DESCRIBE on the cluster)
SCRAM_PRINCIPAL = "rlm"  # the kafka_sasl_ssl cluster's non-super user

os.environ.setdefault("RLM_KAFKA_JVM", "quick")  # also the default of the brokers the tests start themselves


def _running(cluster: KafkaCluster, what: str) -> Iterator[KafkaCluster]:
    """Start ``cluster`` (failing every test that needs it, never skipping, when it cannot start), yield it, stop
    it. ``RLM_TEST_PRINT_BROKER_LOG`` prints the brokers' log tails first."""
    try:
        cluster.start()
    except KafkaStartError as err:
        pytest.fail(f"{what} did not start (tests never skip it): {err}", pytrace=False)
    try:
        yield cluster
    finally:
        if os.environ.get("RLM_TEST_PRINT_BROKER_LOG"):
            print(cluster.tail_logs())
        cluster.stop()


def _password(user: str) -> str:
    return f"{user}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(autouse=True)
def _log_allowance_full() -> None:
    """Each test starts with the listener's per-line log allowance full (:data:`rlm.logs.CLIENT_LINES` is one per
    process: a test counting the listener's lines would otherwise depend on what the tests before it logged)."""
    from rlm.logs import CLIENT_LINES

    CLIENT_LINES.reset()




@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaCluster]:
    yield from _running(KafkaCluster(brokers=1, broker_config=LOG_TASKS_FROM_START), "the Kafka broker")


@pytest.fixture(scope="session")
def kafka_cluster3() -> Iterator[KafkaCluster]:
    yield from _running(KafkaCluster(brokers=3), "the 3-broker Kafka cluster")


@pytest.fixture(scope="session")
def kafka_sasl() -> Iterator[KafkaCluster]:
    users = {u: _password(u) for u in (SASL_PRINCIPAL, SASL_READER, SASL_VIEWER)}
    yield from _running(KafkaCluster(brokers=1, sasl_users=users), "the SASL/ACL Kafka cluster")


@pytest.fixture(scope="session")
def kafka_sasl_ssl() -> Iterator[KafkaCluster]:
    """SASL_SSL (SCRAM-SHA-512 over TLS, a CA made at start), StandardAuthorizer; see devtools.devkafka."""
    yield from _running(KafkaCluster(brokers=1, sasl_users={SCRAM_PRINCIPAL: f"scram-{uuid.uuid4().hex}"},
                                     sasl_mechanism="SCRAM-SHA-512", tls=True), "the SASL_SSL Kafka cluster")


@pytest.fixture(scope="session")
def kafka_big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    from tests.support.bigrecord import big_record_cluster  # it imports this module

    yield from big_record_cluster(tmp_path_factory.mktemp("kafka-big"))


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return f"{base}-{uuid.uuid4().hex[:8]}"


def _aws_test_credentials() -> None:
    """The dummy credentials both S3 servers accept (moto takes any; s3proxy checks these)."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """An S3 endpoint on 127.0.0.1 (moto server); yields its URL. Credentials are dummies moto accepts."""
    from moto.server import ThreadedMotoServer

    _aws_test_credentials()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3proxy_endpoint() -> Iterator[str]:
    """s3proxy, a real S3 API server over a directory (devtools/s3proxy.py), on 127.0.0.1; yields its URL. It
    checks request signatures against the default credentials (``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``,
    the dummies moto gets too). If it cannot start, every test that needs it fails: never skipped (CI included)."""
    from devtools.s3proxy import S3ProxyServer, S3ProxyStartError

    _aws_test_credentials()
    server = S3ProxyServer(identity=os.environ["AWS_ACCESS_KEY_ID"], credential=os.environ["AWS_SECRET_ACCESS_KEY"])
    try:
        server.start()
    except S3ProxyStartError as err:
        pytest.fail(f"s3proxy did not start (tests never skip it): {err}", pytrace=False)
    try:
        yield server.endpoint_url
    finally:
        server.stop()


@pytest.fixture(params=["moto", "s3proxy"])
def s3_server(request: pytest.FixtureRequest) -> str:
    """Each S3 server in turn (the test runs once per server): moto's mock, then s3proxy; yields the URL."""
    return request.getfixturevalue("s3_endpoint" if request.param == "moto" else "s3proxy_endpoint")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local SparkSession: ``local[2]``, workers on this interpreter, modest memory, Python filter pushdown on,
    ``kafka-remote`` registered; its JVM on the ``quick`` options of the brokers (start and a small job: 14-17 vs
    27-32 CPU s)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    _aws_test_credentials()  # the executors' boto3 talks to moto
    from pyspark.sql import SparkSession

    from rlm.spark import register

    session = (SparkSession.builder.master("local[2]").appName("rlm-spark-tests")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.driver.memory", "1g")
               .config("spark.driver.extraJavaOptions", " ".join(JVM_PROFILES["quick"]))
               .config("spark.sql.shuffle.partitions", "2")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.python.filterPushdown.enabled", "true")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    try:
        yield session
    finally:
        session.stop()
