"""The sidecar as a principal of an authenticated cluster (SASL/PLAIN, KRaft's StandardAuthorizer): losing
Describe on a topic never purges its remote data; a real deletion does, after the grace period; a topic deleted
and re-created under the same name has its old id purged, not the new one; a topic whose config the principal
may not read is not tiered (its compaction is unknown), but one the history listener serves stays served when its
config can no longer be read."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

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
from rlm import metrics
from rlm.config import KafkaSettings, SidecarSettings
from rlm.listener import start_listener
from rlm.listener.tier.catalog import ServedTopic
from rlm.sidecar import Sidecar
from rlmm.api import PartitionNotServedError, RemotePartitionDeleteState, TopicIdPartition
from tests.support.fixtures import SASL_PRINCIPAL
from tests.support.kafka import grant
from tests.support.sidecar import (
    assert_readable,
    latest_remote,
    make_settings,
    only,
    produce_segments,
    remote_segments,
    store_keys,
    wait_for,
)

PRINCIPAL = f"User:{SASL_PRINCIPAL}"
GRACE_MS = 2000
ROUNDS = 3


def _binding(rtype: ResourceType, name: str, op: AclOperation,
             pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> AclBinding:
    return AclBinding(rtype, name, pattern, PRINCIPAL, "*", op, AclPermissionType.ALLOW)


def revoke_topic(kc: KafkaCluster, topic: str) -> None:
    """Every ACL of the principal on ``topic`` (literal): it loses Describe (which Read/Write/All imply)."""
    admin = AdminClient(kc.admin_config())
    flt = AclBindingFilter(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, PRINCIPAL, None,
                           AclOperation.ANY, AclPermissionType.ANY)
    for fut in admin.delete_acls([flt]).values():
        assert fut.result(30), f"no ACL of {PRINCIPAL} on {topic} to delete"


def sidecar_rights(kc: KafkaCluster, settings: SidecarSettings) -> None:
    """What the sidecar needs besides its topics' ACLs: the cluster (create its topics, idempotent writes), its
    consumer groups, its metadata and to-be-deleted topics."""
    grant(kc, _binding(ResourceType.BROKER, "kafka-cluster", AclOperation.ALL),
          _binding(ResourceType.GROUP, "*", AclOperation.ALL),
          _binding(ResourceType.TOPIC, settings.metadata.topic, AclOperation.ALL),
          _binding(ResourceType.TOPIC, settings.metadata.to_be_deleted_topic, AclOperation.ALL))


def acl_settings(kc: KafkaCluster, tmp_path: Path, *topics: str, **overrides: Any) -> SidecarSettings:
    settings = make_settings(kc, tmp_path, topics={"include": [only(t)["include"][0] for t in topics]},
                             tasks={"purge_grace_ms": GRACE_MS, "purge_rounds": ROUNDS}, **overrides)
    settings = settings.model_copy(update={"kafka": KafkaSettings(
        bootstrap_servers=kc.bootstrap_servers, client=kc.security_config(SASL_PRINCIPAL))})
    sidecar_rights(kc, settings)
    return settings


def produce(kc: KafkaCluster, topic: str, rounds: int = 3) -> dict[int, tuple[bytes, bytes]]:
    """``rounds`` segments, as the admin; a last one-record append rolls the last of them (produce_segments'
    own roll would produce without the security settings)."""
    from tests.support.kafka import produce as produce_records

    sent = produce_segments(kc, topic, rounds, 100, segment_ms=300, roll=False, **kc.security_config())
    produce_records(kc, topic, [(b"__roll__", b"r")], **kc.security_config())
    return sent


def delete_state(sidecar: Sidecar, tp: TopicIdPartition) -> RemotePartitionDeleteState | None:
    try:
        md = sidecar.rlmm.remote_partition_delete_metadata(tp)
    except PartitionNotServedError:
        return None
    return md.state if md is not None else None


def unauthorized_count(topic: str) -> float:
    return metrics.PURGE_CHECK_UNAUTHORIZED.labels(topic)._value.get()


def delete_topic(kc: KafkaCluster, topic: str) -> None:
    admin = AdminClient(kc.admin_config())
    admin.delete_topics([topic], operation_timeout=30)[topic].result(60)


def recreate_topic(kc: KafkaCluster, topic: str, timeout_s: float = 30.0, **kwargs: Any) -> uuid.UUID:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return kc.create_topic(topic, **kwargs)
        except Exception:  # noqa: BLE001 - TOPIC_ALREADY_EXISTS while the deletion completes
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


def test_lost_describe_never_purges_a_real_delete_does(kafka_sasl: KafkaCluster, topic_name: str,
                                                        tmp_path: Path) -> None:
    kc = kafka_sasl
    tp = TopicIdPartition(kc.create_topic(topic_name, config={"segment.ms": "300"}), topic_name, 0)
    grant(kc, _binding(ResourceType.TOPIC, topic_name, AclOperation.ALL))
    sent = produce(kc, topic_name)
    settings = acl_settings(kc, tmp_path, topic_name)
    root = Path(settings.store.root_path)
    with Sidecar(settings) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 60, "the topic to be remote")
        segs = [s.remote_log_segment_id for s in remote_segments(sidecar, tp)]
        keys = {k for k in store_keys(root) if str(tp.topic_id) in k}
        assert segs and keys

        # The principal loses Describe: the all-topics listing omits the topic, by name it is refused.
        counted = unauthorized_count(topic_name)
        revoke_topic(kc, topic_name)
        time.sleep(2 * GRACE_MS / 1000 + 1)  # about a dozen discovery rounds, well beyond the grace period
        assert delete_state(sidecar, tp) is None
        assert tp in sidecar.known.all()
        assert {k for k in store_keys(root) if str(tp.topic_id) in k} == keys
        assert sidecar.deletions.pending() == {}
        wait_for(lambda: unauthorized_count(topic_name) >= counted + 3 * ROUNDS, 30,
                 "the refused deleted-topic checks to be counted")

        # Describe back: the same remote segments are served, every record intact.
        grant(kc, _binding(ResourceType.TOPIC, topic_name, AclOperation.ALL))
        wait_for(lambda: [s.remote_log_segment_id for s in remote_segments(sidecar, tp)][:len(segs)] == segs,
                 30, "the topic to be served again")
        assert_readable(sidecar, tp, sent, what="remote data after Describe was lost and regained")

        # Really deleted (the ACL outlives the topic, so the name answers UNKNOWN_TOPIC_OR_PART): purged, but
        # not before the grace period.
        deleted_at = time.monotonic()
        delete_topic(kc, topic_name)
        wait_for(lambda: delete_state(sidecar, tp) == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED, 60,
                 "the deleted topic to be purged")
        assert time.monotonic() - deleted_at >= GRACE_MS / 1000
        wait_for(lambda: tp not in sidecar.known.all(), 30, "the purged partition to be forgotten")
        assert not {k for k in store_keys(root) if str(tp.topic_id) in k}


def test_recreated_topic_purges_the_old_id_only(kafka_sasl: KafkaCluster, topic_name: str,
                                                 tmp_path: Path) -> None:
    kc = kafka_sasl
    old = TopicIdPartition(kc.create_topic(topic_name, config={"segment.ms": "300"}), topic_name, 0)
    grant(kc, _binding(ResourceType.TOPIC, topic_name, AclOperation.ALL))
    sent_old = produce(kc, topic_name)
    settings = acl_settings(kc, tmp_path, topic_name)
    root = Path(settings.store.root_path)
    with Sidecar(settings) as sidecar:
        wait_for(lambda: latest_remote(sidecar, old) >= max(sent_old), 60, "the old topic to be remote")
        assert {k for k in store_keys(root) if str(old.topic_id) in k}

        delete_topic(kc, topic_name)
        new = TopicIdPartition(recreate_topic(kc, topic_name, config={"segment.ms": "300"}), topic_name, 0)
        assert new.topic_id != old.topic_id
        sent_new = produce(kc, topic_name)

        wait_for(lambda: delete_state(sidecar, old) == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED, 60,
                 "the old topic id to be purged")
        wait_for(lambda: latest_remote(sidecar, new) >= max(sent_new), 60, "the new topic to be remote")
        time.sleep(2 * GRACE_MS / 1000)  # rounds beyond the grace period: the new id stays
        assert delete_state(sidecar, new) is None
        assert new in sidecar.known.all() and old not in sidecar.known.all()
        assert not {k for k in store_keys(root) if str(old.topic_id) in k}
        assert {k for k in store_keys(root) if str(new.topic_id) in k}
        assert_readable(sidecar, new, sent_new, what="the re-created topic's own records")


def test_topic_whose_config_cannot_be_read_is_not_tiered(kafka_sasl: KafkaCluster, topic_name: str,
                                                          tmp_path: Path) -> None:
    """DescribeConfigs refused for a compacted topic: its compaction is unknown, so it is not tiered (before,
    a failed DescribeConfigs counted as "not compacted"). A topic the principal may fully read is tiered."""
    kc = kafka_sasl
    compacted, plain = f"{topic_name}-c", f"{topic_name}-p"
    c_tp = TopicIdPartition(kc.create_topic(compacted, config={"segment.ms": "300", "cleanup.policy": "compact"}),
                            compacted, 0)
    p_tp = TopicIdPartition(kc.create_topic(plain, config={"segment.ms": "300"}), plain, 0)
    grant(kc, _binding(ResourceType.TOPIC, plain, AclOperation.ALL),
          _binding(ResourceType.TOPIC, compacted, AclOperation.DESCRIBE),
          _binding(ResourceType.TOPIC, compacted, AclOperation.READ))
    sent_c = produce(kc, compacted)
    sent_p = produce(kc, plain)
    settings = acl_settings(kc, tmp_path, compacted, plain)
    with Sidecar(settings) as sidecar:
        wait_for(lambda: latest_remote(sidecar, p_tp) >= max(sent_p), 60, "the plain topic to be remote")
        time.sleep(1.5)  # several more discovery rounds
        assert sent_c and remote_segments(sidecar, c_tp) == []
        assert c_tp not in sidecar.known.all()
        assert sidecar.leadership.get(compacted, 0) is None


def test_a_served_topic_whose_config_can_no_longer_be_read_stays_served(kafka_sasl: KafkaCluster, topic_name: str,
                                                                         tmp_path: Path) -> None:
    """The history listener's catalog, as the sidecar's principal: a topic it serves whose DESCRIBE_CONFIGS is then
    revoked (DESCRIBE and READ kept) has an unknown compaction at the next refresh; it stays served as it was (before,
    it was dropped: its history answered OFFSET_OUT_OF_RANGE, a consumer group sent back to ``auto.offset.reset``, and
    its metadata no longer followed) until its config can be read again. A topic never served is not served while
    its config is unknown."""
    kc = kafka_sasl
    late = f"{topic_name}-late"
    tid = kc.create_topic(topic_name, config={"segment.ms": "300"})
    kc.create_topic(late, config={"segment.ms": "300"})
    grant(kc, _binding(ResourceType.TOPIC, topic_name, AclOperation.ALL))
    settings = acl_settings(kc, tmp_path, topic_name, late, history_listener={"host": "127.0.0.1", "port": 0})
    grant(kc, _binding(ResourceType.TOPIC, late, AclOperation.DESCRIBE))
    with Sidecar(settings) as sidecar:
        listener = start_listener(settings, sidecar.rsm)
        try:
            catalog = listener.server.router.ctx.catalog
            served = ServedTopic(topic_name, tid, (0,))
            assert catalog.by_name(topic_name) == served and catalog.by_name(late) is None
            revoke_topic(kc, topic_name)
            grant(kc, _binding(ResourceType.TOPIC, topic_name, AclOperation.DESCRIBE),
                  _binding(ResourceType.TOPIC, topic_name, AclOperation.READ))
            assert wait_for(lambda: catalog.view.compaction([topic_name]) == {topic_name: None}, 30,
                            "DescribeConfigs of the topic refused")
            assert catalog.refresh()
            assert catalog.by_name(topic_name) == served and catalog.by_id(tid) == served
            assert catalog.by_name(late) is None
            grant(kc, _binding(ResourceType.TOPIC, late, AclOperation.ALL))
            assert wait_for(lambda: catalog.refresh() and catalog.by_name(late) is not None, 30,
                            "the late topic served once its config is known")
        finally:
            listener.stop()


def test_a_served_topic_left_out_of_the_listing_stays_served_for_a_grace(kafka_sasl: KafkaCluster, topic_name: str,
                                                                         tmp_path: Path) -> None:
    """The history listener's catalog, as the sidecar's principal: a topic it serves whose every ACL of the principal
    is then revoked (no DESCRIBE: the listing leaves it out, as a broker still loading the cluster's metadata after a
    restart answers UNKNOWN_TOPIC_OR_PARTITION) stays served as it was (before, it was dropped at the next refresh:
    its history answered OFFSET_OUT_OF_RANGE, a consumer group reset, its metadata no longer followed) until it has
    been missing for the grace; then it is dropped; listed again, it is served again."""
    kc = kafka_sasl
    tid = kc.create_topic(topic_name, config={"segment.ms": "300"})
    grant(kc, _binding(ResourceType.TOPIC, topic_name, AclOperation.ALL))
    settings = acl_settings(kc, tmp_path, topic_name, history_listener={"host": "127.0.0.1", "port": 0})
    with Sidecar(settings) as sidecar:
        listener = start_listener(settings, sidecar.rsm)
        try:
            catalog = listener.server.router.ctx.catalog
            served = ServedTopic(topic_name, tid, (0,))
            assert catalog.by_name(topic_name) == served
            revoke_topic(kc, topic_name)
            wait_for(lambda: (topic_name, 0) not in catalog.view.partitions(None, skip_unauthorized=True), 30,
                     "the topic left out of the principal's listing")
            assert catalog.refresh()
            assert catalog.by_name(topic_name) == served and catalog.by_id(tid) == served
            catalog.absent_grace_s = 0.0  # the grace is over
            assert catalog.refresh()
            assert catalog.by_name(topic_name) is None and catalog.by_id(tid) is None
            grant(kc, _binding(ResourceType.TOPIC, topic_name, AclOperation.ALL))
            assert wait_for(lambda: catalog.refresh() and catalog.by_name(topic_name) == served, 30,
                            "the topic served again once listed")
        finally:
            listener.stop()
