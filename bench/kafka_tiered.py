"""Kafka's own tiered storage for the benchmarks: broker configuration with ``LocalTieredStorage``, topic configs,
and how far it has copied.

``LocalTieredStorage`` (from the ``kafka-storage`` test jar, on the broker's class path in ``devtools/devkafka``)
is Kafka's reference RemoteStorageManager: plain files under ``rsm.config.dir``. Used by ``bench_sidecar`` (its
tiering next to ours), ``bench_spark`` (Spark's ``kafka`` source reading the broker's remote tier), ``bench_proxy``
and ``bench_scale`` (the burst of every partition rolling at once, the broker's CPU while its RLM copies it).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["kafka_remote_segments", "kafka_tiered_storage_config", "set_topic_config"]

# The files LocalTieredStorage writes for every copied segment: <offset>-<segment uuid>.<type>.
_SEGMENT_FILES = {"log", "index", "timeindex", "leader_epoch_checkpoint", "snapshot"}


def kafka_tiered_storage_config(remote_dir: Path, task_interval_ms: int = 500) -> dict[str, str]:
    """Broker settings: Kafka's tiered storage on, ``LocalTieredStorage`` under ``remote_dir``, Kafka's topic-based
    metadata manager, a remote log manager task interval of ``task_interval_ms`` (500 ms; Kafka's default is 30 s:
    ``bench_scale`` runs it at its sidecar's copy interval, as each partition's copy task runs that often)."""
    return {
        "remote.log.storage.system.enable": "true",
        "remote.log.storage.manager.class.name": "org.apache.kafka.server.log.remote.storage.LocalTieredStorage",
        "remote.log.storage.manager.class.path": "",
        "remote.log.storage.manager.impl.prefix": "rsm.config.",
        "rsm.config.dir": str(remote_dir),
        "remote.log.metadata.manager.impl.prefix": "rlmm.config.",
        "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
        "rlmm.config.remote.log.metadata.topic.num.partitions": "5",
        "remote.log.metadata.manager.listener.name": "PLAINTEXT",
        "remote.log.manager.task.interval.ms": str(task_interval_ms),
        "log.flush.interval.messages": "1000000",
    }


def set_topic_config(bootstrap: str, topic: str, configs: dict[str, str]) -> None:
    """Set (incrementally) topic configs, e.g. ``remote.storage.enable`` or ``local.retention.ms``."""
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": bootstrap})
    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in configs.items()])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(30)


def kafka_remote_segments(remote_dir: Path) -> int:
    """How many segments ``LocalTieredStorage`` holds complete (all their files written) under ``remote_dir``
    (``<topic id>-<partition>-<topic>/<segment id>.<file type>``)."""
    types: dict[Path, set[str]] = {}
    for p in remote_dir.rglob("*"):
        if p.is_file():
            stem, _, suffix = p.name.rpartition(".")
            types.setdefault(p.parent / stem, set()).add(suffix)
    return sum(_SEGMENT_FILES <= t for t in types.values())
