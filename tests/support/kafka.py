"""Helpers for tests that make the real broker write segments: produce, roll, find the files, keep them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from devtools.devkafka import KafkaCluster
from rsm.api import EpochEntry, LogSegmentData, RemoteSegmentMetadata
from rsm.log.batch import BatchHeader

__all__ = ["CODECS", "ROLL_KEY", "BrokerSegment", "broker_watermarks", "grant", "partition_dir", "produce",
           "revoke", "roll_and_wait", "rolled_logs", "set_topic_config"]

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")  # the producer's compression.type values
ROLL_KEY = b"__roll__"  # the key of the one-byte filler records appended to roll a segment


@dataclass(frozen=True)
class BrokerSegment:
    """A rolled segment the broker wrote (files copied aside so retention cannot take them)."""

    topic_name: str
    topic_id: uuid.UUID
    base_offset: int
    end_offset_inclusive: int
    data: LogSegmentData
    batches: tuple[BatchHeader, ...]

    def metadata(self, segment_id: uuid.UUID | None = None) -> RemoteSegmentMetadata:
        epochs = sorted({b.partition_leader_epoch for b in self.batches})
        return RemoteSegmentMetadata(
            remote_segment_id=segment_id or uuid.uuid4(), topic_id=self.topic_id, topic_name=self.topic_name,
            partition=0, start_offset=self.base_offset, end_offset_inclusive=self.end_offset_inclusive,
            max_timestamp_ms=max(b.max_timestamp for b in self.batches),
            segment_size_bytes=self.data.log_path.stat().st_size,
            broker_id=1, event_timestamp_ms=1_700_000_000_000,
            segment_leader_epochs=tuple(EpochEntry(e, self.base_offset) for e in epochs))


def broker_watermarks(kafka: KafkaCluster, topic: str, partition: int = 0) -> tuple[int, int]:
    """(log start offset, high watermark) of the broker's own log."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "probe"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)
    finally:
        c.close()


def partition_dir(kafka: KafkaCluster, topic: str, partition: int = 0, node_id: int = 1) -> Path:
    for d in kafka.node(node_id).log_dirs:
        p = d / f"{topic}-{partition}"
        if p.is_dir():
            return p
    raise FileNotFoundError(f"no directory for {topic}-{partition} on node {node_id}")


def rolled_logs(pdir: Path) -> list[Path]:
    """The rolled (immutable) ``.log`` files of a partition directory: all but the highest base offset."""
    logs = sorted(pdir.glob("*.log"))
    return logs[:-1]


def produce(kafka: KafkaCluster, topic: str, records: Iterable[tuple], *, partition: int = 0,
            **producer_config: object) -> list[tuple[int, int]]:
    """Produce ``(key, value[, headers[, timestamp_ms]])`` tuples; return (partition, offset) per record."""
    conf = {"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5, **producer_config}
    producer = Producer(conf)
    results: list[tuple[int, int] | None] = []

    def on_delivery(idx: int):
        def cb(err, msg):
            if err is not None:
                raise RuntimeError(f"delivery failed: {err}")
            results[idx] = (msg.partition(), msg.offset())
        return cb

    for i, rec in enumerate(records):
        key, value, *rest = rec
        headers = rest[0] if rest else None
        ts = rest[1] if len(rest) > 1 else 0
        results.append(None)
        while True:
            try:
                producer.produce(topic, value=value, key=key, headers=headers, partition=partition,
                                 timestamp=ts or 0, on_delivery=on_delivery(i))
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(60) != 0:
        raise RuntimeError("producer did not flush within 60s")
    if any(r is None for r in results):
        raise RuntimeError("some records were not acknowledged")
    return results  # type: ignore[return-value]


def roll_and_wait(kafka: KafkaCluster, topic: str, partition: int = 0, *, rolled: int = 1,
                  segment_ms: int = 200, timeout: float = 60.0) -> list[Path]:
    """Make the broker roll until ``rolled`` segments are immutable; return their ``.log`` paths.

    The topic must have been created with ``segment.ms`` <= ``segment_ms``: a segment rolls on the first append
    after it is that old, so this appends a one-byte filler record (key ``ROLL_KEY``) until enough rolled.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pdir = partition_dir(kafka, topic, partition)
        logs = rolled_logs(pdir)
        if len(logs) >= rolled:
            return logs
        time.sleep(segment_ms / 1000)
        produce(kafka, topic, [(ROLL_KEY, b"r")], partition=partition)
    raise TimeoutError(f"{topic}-{partition} did not roll {rolled} segments within {timeout}s")


def grant(kc: KafkaCluster, *bindings: Any) -> None:
    """Create ACLs (confluent-kafka ``AclBinding``s) as the cluster's super user."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(kc.admin_config())
    for fut in admin.create_acls(list(bindings)).values():
        fut.result(30)


def revoke(kc: KafkaCluster, *bindings: Any) -> None:
    """Delete ACLs (confluent-kafka ``AclBinding``s, each matched exactly) as the cluster's super user."""
    from confluent_kafka.admin import AclBindingFilter, AdminClient

    admin = AdminClient(kc.admin_config())
    filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                                b.permission_type) for b in bindings]
    for fut in admin.delete_acls(filters).values():
        fut.result(30)


def set_topic_config(kafka: KafkaCluster, topics: str | list[str], **configs: str) -> None:
    """Set topic configs on the cluster (incremental alter): ``segment_ms="100"`` sets ``segment.ms``."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient(kafka.admin_config())
    res = [ConfigResource(ConfigResource.Type.TOPIC, t, incremental_configs=[
        ConfigEntry(name.replace("_", "."), v, incremental_operation=AlterConfigOpType.SET)
        for name, v in configs.items()]) for t in ([topics] if isinstance(topics, str) else topics)]
    for fut in admin.incremental_alter_configs(res).values():
        fut.result(30)
