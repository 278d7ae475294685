"""ListOffsets through the proxy for a principal the broker lets DESCRIBE the topic and the listener's ACL view does
not (:func:`rlm.listener.tier.boundary._served_partitions_changed`), on the SASL_PLAINTEXT/PLAIN cluster
(``kafka_sasl``: KRaft's StandardAuthorizer, ``super.users`` the cluster's admin), SASL passed through: the broker
decides the forwarded request as the client's own principal.

One topic, tiered, its broker log start then moved inside the tier (DeleteRecords), so the broker answers EARLIEST
with an offset past what the tier holds. Before, that answer went out unchanged to such a principal (the view
refusing DESCRIBE, the tier was not asked): a consumer reset to it would never read the tier's offsets. Now it is
OFFSET_NOT_AVAILABLE, which clients ask again, until the view allows the principal: then the tier's log start. The
same function decides OffsetForLeaderEpoch (Kafka also answers it for CLUSTER_ACTION on the cluster); its answers:
``test_boundary_acl_view.py`` (one broker has no forgotten epoch to ask).
"""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from devtools.devkafka import ADMIN_USER, KafkaCluster
from rlm.config import KafkaSettings
from rlm.listener import Listener, start_listener
from rlm.listener.authz import DESCRIBE
from rlm.listener.protocol.codec import ErrorCode
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.rlm.listener.raw_wire import EARLIEST, list_offsets, plain_login
from tests.support.fixtures import SASL_VIEWER
from tests.support.kafka import ROLL_KEY, grant, produce
from tests.support.sidecar import latest_remote, make_settings, produce_segments, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

LOG_START = 25  # the broker's after DeleteRecords: inside the tier (2 segments of 20, a roll)
LATEST = -1


@dataclass
class Proxied:
    kafka: KafkaCluster
    listener: Listener
    topic: str

    def connect(self, user: str) -> socket.socket:
        """A connection to the proxy, ``user`` authenticated by the broker through it."""
        sock = socket.create_connection(("127.0.0.1", self.listener.port), timeout=30)
        assert plain_login(sock, user, self.kafka.sasl_users[user])
        return sock

    def may_describe(self, user: str) -> bool:
        """Whether the listener's ACL view lets ``user`` DESCRIBE the topic."""
        return bool(self.listener.authorizer.allowed(f"User:{user}", "127.0.0.1", DESCRIBE, [self.topic]))


@pytest.fixture(scope="module")
def proxied(kafka_sasl: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proxied]:
    kc, tmp = kafka_sasl, tmp_path_factory.mktemp("proxy-acl-view")
    topic = f"pacl-{uuid.uuid4().hex[:6]}"
    tid = kc.create_topic(topic, 1, config={"segment.ms": "300"})
    sent = produce_segments(kc, topic, rounds=2, per_round=20, segment_ms=300, roll=False, **kc.security_config())
    produce(kc, topic, [(ROLL_KEY, b"r")], **kc.security_config())  # rolls the last round's segment
    # the view fetched once at start: its TTL an hour, it is not fetched again unless a test says so
    settings = make_settings(kc, tmp, topics={"include": [topic]}, history_listener={
        "port": 0, "proxy": True, "sasl": {"mechanisms": ["PLAIN"]},
        "authorization": {"acl_cache_ttl_ms": 3_600_000}})
    settings = settings.model_copy(update={"kafka": KafkaSettings(bootstrap_servers=kc.bootstrap_servers,
                                                                  client=kc.security_config())})
    sidecar = Sidecar(settings).start()
    listener: Listener | None = None
    try:
        tp = TopicIdPartition(tid, topic, 0)
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 90, f"{topic} tiered")
        listener = start_listener(settings, sidecar.rsm, rlmm=sidecar.rlmm)
        wait_for(lambda: topic in set(listener.catalog.topics()), 30, "the topic served")
        wait_for(lambda: listener.server.router.ctx.tier.ready(tp), 30, "the tier read")
        admin = AdminClient(kc.admin_config())
        for fut in admin.delete_records([TopicPartition(topic, 0, LOG_START)]).values():
            fut.result(30)
        yield Proxied(kc, listener, topic)
    finally:
        if listener is not None:
            listener.stop()
        sidecar.stop()


def _earliest(sock: socket.socket, topic: str) -> tuple[int, int]:
    p = list_offsets(sock, topic, EARLIEST)
    return int(p.error_code), int(p.offset)


def test_the_brokers_super_user_not_in_super_users_is_asked_again_not_given_the_brokers_log_start(
        proxied: Proxied) -> None:
    """The cluster's admin, a super user of the broker's (``super.users``) and not of the listener's (``super_users``
    empty, no ACL of it): the broker answers EARLIEST with its log start; through the proxy it is
    OFFSET_NOT_AVAILABLE, not that log start (before: (0, 25), past the tier's 0..24)."""
    p = proxied
    assert not p.may_describe(ADMIN_USER)  # the premise: the view refuses it
    with p.connect(ADMIN_USER) as sock:
        assert _earliest(sock, p.topic) == (ErrorCode.offset_not_available, -1)
        assert int(list_offsets(sock, p.topic, LATEST).error_code) == 0  # answered by the broker: not refused


def test_a_grant_the_view_has_not_fetched_is_asked_again_then_answered_from_the_tier(proxied: Proxied) -> None:
    """viewer, granted DESCRIBE on the topic after the view was fetched: the broker answers it at once, EARLIEST
    with its log start; through the proxy OFFSET_NOT_AVAILABLE (before: (0, 25)) until the view is fetched again,
    then the tier's log start, 0."""
    p = proxied
    assert not p.may_describe(SASL_VIEWER)
    grant(p.kafka, AclBinding(ResourceType.TOPIC, p.topic, ResourcePatternType.LITERAL, f"User:{SASL_VIEWER}", "*",
                              AclOperation.DESCRIBE, AclPermissionType.ALLOW))
    with p.connect(SASL_VIEWER) as sock:
        wait_for(lambda: int(list_offsets(sock, p.topic, LATEST).error_code) == 0, 30, "the broker to apply the grant")
        assert not p.may_describe(SASL_VIEWER)  # the premise: the view has not fetched it
        assert _earliest(sock, p.topic) == (ErrorCode.offset_not_available, -1)
        assert p.listener.authorizer.cache.refresh()
        assert p.may_describe(SASL_VIEWER)
        assert _earliest(sock, p.topic) == (0, 0)
