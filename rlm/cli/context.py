"""What the operator commands (``ls``, ``cat``, ``offsets``, ``verify``, ``gc``) share: config, clients, lookups.

They open their own metadata cache (``<state_dir>/cli-metadata-cache``, kept between runs so the next one
resumes instead of replaying) so they can run next to a live sidecar, whose cache RocksDB keeps locked.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rlm.authz import NotAuthorizedError, authorization_error, check, principal_of, reader_needs
from rlm.config import ConfigError, SidecarSettings, load_settings
from rlm.discovery import ClusterView
from rlm.reader import RemoteReader
from rlmm.api import TopicIdPartition
from rlmm.topic_manager import TopicBasedRemoteLogMetadataManager
from rsm.api import RemoteStorageManagerApi
from rsm.manager import RemoteStorageManager

__all__ = ["EXIT_NOTHING_REMOTE", "EXIT_NOT_AUTHORIZED", "EXIT_OUT_OF_RANGE", "EXIT_USAGE", "CliContext",
           "add_config_arg", "not_authorized", "open_context"]

# Exit codes of the commands (README, "Command line"): 0 success, 1 a check failed (verify), and:
EXIT_USAGE = 2  # bad arguments or config, or no such topic partition on the cluster
EXIT_NOTHING_REMOTE = 3  # the partition exists but nothing of it is remote yet
EXIT_OUT_OF_RANGE = 4  # the offset asked for is not in the remote tier
EXIT_NOT_AUTHORIZED = 5  # the principal lacks an ACL (the message names the operation, resource and principal)


def not_authorized(err: NotAuthorizedError | str) -> SystemExit:
    """Print ``rlm: not authorized: ...`` and return the SystemExit to raise (exit code 5)."""
    print(f"rlm: {err}", file=sys.stderr)
    return SystemExit(EXIT_NOT_AUTHORIZED)


def add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", "-c", required=True, help="the sidecar's YAML config (as for `rlm serve`)")


@dataclass
class CliContext:
    settings: SidecarSettings
    view: ClusterView
    rlmm: TopicBasedRemoteLogMetadataManager
    rsm: RemoteStorageManagerApi
    reader: RemoteReader

    def partitions(self, topic: str, partition: int | None = None) -> list[TopicIdPartition]:
        """The partitions of ``topic`` (or just ``partition``), served and caught up; exits 2 if unknown, 5 if the
        principal may not describe it."""
        from confluent_kafka import KafkaError, KafkaException

        try:
            infos = self.view.partitions([topic])
        except KafkaException as err:
            if err.args and getattr(err.args[0], "code", lambda: None)() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
                raise not_authorized(NotAuthorizedError(
                    "DESCRIBE", "topic", topic, principal_of(self.settings.kafka.client),
                    why="the command looks up its partitions")) from None
            raise
        tps = sorted((TopicIdPartition(i.topic_id, i.topic, i.partition) for i in infos.values()),
                     key=lambda t: t.partition)
        if partition is not None:
            tps = [t for t in tps if t.partition == partition]
        if not tps:
            what = f"{topic}-{partition}" if partition is not None else topic
            print(f"rlm: {what}: no such topic partition on the cluster", file=sys.stderr)
            raise SystemExit(EXIT_USAGE)
        self.rlmm.on_partition_leadership_changes([], tps)
        self.rlmm.wait_ready(tps, timeout_s=60)
        return tps


@contextmanager
def open_context(args: argparse.Namespace) -> Iterator[CliContext]:
    from rlm.sidecar import make_rlmm
    from rlmm.api import MetadataTopicMissingError

    try:
        settings = load_settings(args.config)
    except ConfigError as err:
        print(f"rlm: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    settings.metadata.state_dir.mkdir(parents=True, exist_ok=True)
    try:  # before any client thread can die of a refusal: one clear error naming the missing ACL
        check(settings.kafka.client_config(), reader_needs(settings.metadata.topic))
    except NotAuthorizedError as err:
        raise not_authorized(err) from None
    try:
        rlmm = make_rlmm(settings, cache_for="cli", read_only=True)
    except MetadataTopicMissingError as err:  # read-only: the metadata is someone else's, never created here
        print(f"rlm: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as err:
        message = authorization_error(err, settings.kafka.client)
        if message is None:
            raise
        raise not_authorized(message) from None
    try:
        rsm = RemoteStorageManager(settings.store)
        view = ClusterView(settings.kafka.client_config())
        try:
            yield CliContext(settings, view, rlmm, rsm, RemoteReader(rlmm, rsm))
        finally:
            view.close()
            rsm.close()
    finally:
        rlmm.close()
