"""The one place a :class:`~rlmm.topic_manager.TopicBasedRlmmConfig` is built.

Two kinds of callers: the sidecar, its CLI and the history endpoint (:func:`sidecar_rlmm_config`, from
:class:`rlm.config.SidecarSettings`; :func:`make_rlmm` builds the manager of it) and the Spark source's driver
(:func:`rlmm_config` with what its options and the cluster say). Both hand over a whole confluent-kafka client
configuration, ``bootstrap.servers`` included; the metadata manager takes the bootstrap apart and passes the rest
(security, ``sasl.*``, ``ssl.*``) to its admin, producer and consumer: as a :class:`~rlm.kafka_secrets.RedactedConfig`,
so the config's repr (in a log line or a traceback) masks the secrets.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rlm.config import SidecarSettings
from rlm.kafka_secrets import RedactedConfig
from rlm.state import MetadataCacheUser, StateDir
from rlmm.topic_manager import TopicBasedRemoteLogMetadataManager, TopicBasedRlmmConfig

__all__ = ["make_rlmm", "rlmm_config", "sidecar_rlmm_config"]


def rlmm_config(client: Mapping[str, Any], *, topic: str, num_partitions: int, replication_factor: int,
                cache_dir: Path, broker_id: int = -1, serve_all: bool = False, **tuning: Any) -> TopicBasedRlmmConfig:
    """The metadata manager's config. ``client`` is a client configuration with ``bootstrap.servers``;
    ``replication_factor`` (with ``num_partitions``) is what the topic is created with if it does not exist yet;
    ``tuning`` sets other fields of :class:`TopicBasedRlmmConfig` (``write_timeout_s``, ``tombstone_delay_ms`` ...)."""
    if "bootstrap.servers" not in client:
        raise ValueError("the metadata manager's client configuration has no bootstrap.servers")
    return TopicBasedRlmmConfig(
        bootstrap_servers=str(client["bootstrap.servers"]),
        cache_dir=Path(cache_dir),
        broker_id=broker_id,
        topic=topic,
        num_partitions=num_partitions,
        replication_factor=replication_factor,
        serve_all=serve_all,
        client_config=RedactedConfig({k: v for k, v in client.items() if k != "bootstrap.servers"}),
        **tuning,
    )


def sidecar_rlmm_config(settings: SidecarSettings, *, serve_all: bool = False, cache_dir: Path | None = None,
                        cache_for: MetadataCacheUser = "sidecar", create_topic: bool | None = None,
                        read_only: bool | None = None, kafka_timeout_s: float | None = None) -> TopicBasedRlmmConfig:
    """From the sidecar's settings; the cache is ``cache_for``'s in ``metadata.state_dir`` (:class:`rlm.state.StateDir`:
    the sidecar, the CLI and the history endpoint each have one) unless ``cache_dir`` names another.

    ``create_topic``: whether a missing metadata topic is created; by default not in ``mode: read_only`` (the
    metadata is someone else's: a missing topic fails fast, :class:`~rlmm.api.MetadataTopicMissingError`).
    ``read_only``: a manager that never writes (no producer: a principal that only reads needs no WRITE right);
    by default in ``mode: read_only``. The operator commands that read, the history endpoint and Spark ask for one.
    ``kafka_timeout_s``: how long each of the manager's waits on the cluster may take (default: the manager's, 30 s);
    the command line passes its ``--timeout``."""
    md = settings.metadata
    if create_topic is None:
        create_topic = settings.mode != "read_only"
    if read_only is None:
        read_only = settings.mode == "read_only"
    return rlmm_config(
        settings.kafka.client_config(),
        topic=md.topic,
        num_partitions=md.partitions,
        replication_factor=md.replication_factor,
        cache_dir=cache_dir or StateDir(md.state_dir).metadata_cache(cache_for),
        broker_id=settings.broker_id,
        serve_all=serve_all,
        write_timeout_s=md.write_timeout_ms / 1000,
        tombstone_delay_ms=md.tombstone_delay_ms,
        create_topic=create_topic,
        read_only=read_only,
        **({} if kafka_timeout_s is None else {"kafka_timeout_s": kafka_timeout_s}),
    )


def make_rlmm(settings: SidecarSettings, *, serve_all: bool = False, cache_dir: Path | None = None,
              cache_for: MetadataCacheUser = "sidecar", create_topic: bool | None = None,
              read_only: bool | None = None, kafka_timeout_s: float | None = None,
              ) -> TopicBasedRemoteLogMetadataManager:
    """The metadata manager of these settings (:func:`sidecar_rlmm_config`: its cache is ``cache_for``'s in the state
    dir unless ``cache_dir``; in ``mode: read_only`` a missing metadata topic raises
    :class:`~rlmm.api.MetadataTopicMissingError` unless ``create_topic``, and the manager never writes unless
    ``read_only=False``)."""
    return TopicBasedRemoteLogMetadataManager(sidecar_rlmm_config(
        settings, serve_all=serve_all, cache_dir=cache_dir, cache_for=cache_for, create_topic=create_topic,
        read_only=read_only, kafka_timeout_s=kafka_timeout_s))
