"""Session fixtures for the real systems the tests run against.

- ``kafka``: one real Apache Kafka broker (KRaft) on 127.0.0.1, started once per session. If it cannot start
  the fixture raises, so every test that needs it errors: broker tests never skip (CI included).
- ``kafka_cluster3``: a 3-broker cluster for leadership tests (started on first use).
- ``kafka_sasl``: a 1-broker cluster with SASL_PLAINTEXT/PLAIN and KRaft's StandardAuthorizer (started on first
  use): ``admin_config()`` is the super user's client configuration, ``client_config(SASL_PRINCIPAL)`` (and
  ``security_config(SASL_PRINCIPAL)``) the principal's, who starts with no ACLs.
- ``s3_endpoint``: moto's S3 server on 127.0.0.1, spoken to through boto3 over HTTP.
- ``topic_name``: a unique topic name per test (uuid suffix), so tests never see each other's data.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from devtools.devkafka import KafkaCluster, KafkaStartError


@pytest.fixture(scope="session")
def kafka() -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(brokers=1)
    try:
        cluster.start()
    except KafkaStartError as err:
        pytest.fail(f"the Kafka broker did not start (tests never skip it): {err}", pytrace=False)
    try:
        yield cluster
    finally:
        if os.environ.get("RLM_TEST_PRINT_BROKER_LOG"):
            print(cluster.tail_logs())
        cluster.stop()


@pytest.fixture(scope="session")
def kafka_cluster3() -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(brokers=3)
    try:
        cluster.start()
    except KafkaStartError as err:
        pytest.fail(f"the 3-broker Kafka cluster did not start: {err}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


SASL_PRINCIPAL = "rlm"  # the kafka_sasl cluster's non-super user


@pytest.fixture(scope="session")
def kafka_sasl() -> Iterator[KafkaCluster]:
    cluster = KafkaCluster(brokers=1, sasl_users={SASL_PRINCIPAL: f"{SASL_PRINCIPAL}-{uuid.uuid4().hex[:12]}"})
    try:
        cluster.start()
    except KafkaStartError as err:
        pytest.fail(f"the SASL/ACL Kafka cluster did not start: {err}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    base = "".join(c if c.isalnum() else "-" for c in request.node.name)[:60]
    return f"{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """An S3 endpoint on 127.0.0.1 (moto server); yields its URL. Credentials are dummies moto accepts."""
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
