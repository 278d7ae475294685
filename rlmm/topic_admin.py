"""Admin of the metadata topic: find it or create it (compacted), wait until every partition has a leader, and read
what the consumer task needs to know of it (its partition count and ``delete.retention.ms``).

The one job of :class:`rlmm.topic_manager.TopicBasedRemoteLogMetadataManager` that runs only when it starts (Kafka's
``TopicBasedRemoteLogMetadataManager.initializeResources``). A manager configured not to create the topic (a reader
of metadata it does not own) gets :class:`MetadataTopicMissingError` instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from rlmm.api import MetadataTopicMissingError, MetadataWriteError

__all__ = ["MetadataTopic", "ensure_metadata_topic"]

log = logging.getLogger(__name__)

@dataclass(frozen=True, slots=True)
class MetadataTopic:
    """The metadata topic as found: its name, partition count and ``delete.retention.ms``."""

    name: str
    num_partitions: int
    delete_retention_ms: int


def ensure_metadata_topic(client_config: Mapping[str, object], topic: str, *, create: bool, num_partitions: int,
                          replication_factor: int, topic_config: Mapping[str, str], timeout_s: float = 30.0,
                          ) -> MetadataTopic:
    """Find ``topic`` (or create it with ``cleanup.policy=compact`` plus ``topic_config`` when ``create``), wait until
    every partition has a leader, and describe it; ``timeout_s`` bounds each of these waits on the cluster. A
    partition count other than ``num_partitions`` is used as found (logged). Raises :class:`MetadataTopicMissingError`
    (absent and not ``create``) or :class:`MetadataWriteError`."""
    admin = AdminClient(dict(client_config))
    where = client_config.get("bootstrap.servers")
    md = admin.list_topics(topic, timeout=timeout_s).topics.get(topic)
    if (md is None or md.error is not None) and not create:
        why = "does not exist" if md is None or md.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART \
            else f"cannot be described ({md.error})"
        raise MetadataTopicMissingError(
            f"metadata topic {topic} {why} on {where}, and this manager does not create it "
            "(it reads metadata it does not own): check the topic name and the cluster, or create the topic "
            "(rebuild it from the store) first")
    if md is None or md.error is not None:
        fut = admin.create_topics([NewTopic(topic, num_partitions, replication_factor,
                                            config={"cleanup.policy": "compact", **topic_config})])[topic]
        try:
            fut.result(timeout_s)
        except KafkaException as err:
            if err.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise MetadataWriteError(f"cannot create metadata topic {topic}: {err}") from err
    deadline = time.monotonic() + timeout_s
    while True:
        md = admin.list_topics(topic, timeout=min(10.0, timeout_s)).topics.get(topic)
        if md is not None and md.error is None and md.partitions and all(
                p.leader >= 0 for p in md.partitions.values()):
            break
        if time.monotonic() > deadline:
            raise MetadataWriteError(f"metadata topic {topic} has no leaders after {timeout_s:g}s")
        time.sleep(0.1)
    n = len(md.partitions)
    if n != num_partitions:
        log.warning("metadata topic %s has %d partitions, configured %d: using %d", topic, n, num_partitions, n)
    return MetadataTopic(topic, n, _delete_retention_ms(admin, topic, timeout_s))


def _delete_retention_ms(admin: AdminClient, topic: str, timeout_s: float) -> int:
    """The topic's ``delete.retention.ms``. Right after another manager created the topic, a broker whose metadata has
    not caught up yet answers UNKNOWN_TOPIC_OR_PART: retry for ``timeout_s``."""
    res = ConfigResource(ResourceType.TOPIC, topic)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            entries = admin.describe_configs([res])[res].result(timeout_s)
            return int(entries["delete.retention.ms"].value)
        except KafkaException as err:
            code = err.args[0].code() if err.args and isinstance(err.args[0], KafkaError) else None
            if code != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise MetadataWriteError(f"cannot describe metadata topic {topic}: {err}") from err
            time.sleep(0.2)
