"""What the operator commands (``ls``, ``cat``, ``offsets``, ``verify``, ``gc``) share: config, clients, lookups.

They open their own metadata cache (``<state_dir>/cli-metadata-cache``, kept between runs so the next one
resumes instead of replaying) so they can run next to a live sidecar, whose cache RocksDB keeps locked.

Every command that talks to Kafka takes ``--timeout SECONDS`` (:data:`DEFAULT_TIMEOUT_S`): it first asks the cluster
for one topic's metadata (:func:`reach_cluster`) and gives up after that long, and each later step that waits on the
cluster (the ACL check, the metadata manager's start and assignments, topic lookups) is bounded by it too: a cluster
that stops answering midway ends the command within a few of them. A cluster
that does not answer ends the command with one line, ``rlm: cannot reach the Kafka cluster at <bootstrap servers>:
<cause>``, and exit code :data:`EXIT_UNREACHABLE` (:class:`ClusterUnreachableError`, printed by :func:`rlm.cli.main`).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError

from rlm.authz import NotAuthorizedError, authorization_error, check, principal_of, reader_needs
from rlm.config import ConfigError, SidecarSettings, load_settings
from rlm.discovery import ClusterView
from rlm.tier import RemoteReader
from rlmm.api import ReadYourWritesTimeoutError, TopicIdPartition
from rlmm.topic_manager import TopicBasedRemoteLogMetadataManager
from rsm.api import RemoteStorageManagerApi
from rsm.manager import RemoteStorageManager

__all__ = ["DEFAULT_TIMEOUT_S", "EXIT_CODES", "EXIT_NOTHING_REMOTE", "EXIT_NOT_AUTHORIZED", "EXIT_OUT_OF_RANGE",
           "EXIT_UNREACHABLE", "EXIT_USAGE", "CliContext", "ClusterUnreachableError", "add_config_arg",
           "add_timeout_arg", "cluster_errors", "not_authorized", "open_context", "open_rlmm", "reach_cluster"]

# Exit codes of the commands (README, "Command line"): 0 success, 1 a check failed (verify), and:
EXIT_USAGE = 2  # bad arguments or config, or no such topic partition on the cluster
EXIT_NOTHING_REMOTE = 3  # the partition exists but nothing of it is remote yet
EXIT_OUT_OF_RANGE = 4  # the offset asked for is not in the remote tier
EXIT_NOT_AUTHORIZED = 5  # the principal lacks an ACL (the message names the operation, resource and principal)
EXIT_UNREACHABLE = 6  # the Kafka cluster did not answer within --timeout (the message names its bootstrap servers)

# ``rlm --help`` lists these (and README's "Command line" section says the same).
EXIT_CODES = (
    "exit codes: 0 done; 1 a check failed (verify: a bad segment; status: a partition has a hole; serve: a job "
    "abandoned when its stop timeout ran out; recover: conflicts); "
    f"{EXIT_USAGE} bad arguments or config, or no such topic partition; {EXIT_NOTHING_REMOTE} (cat) nothing of the "
    f"partition is remote yet; {EXIT_OUT_OF_RANGE} (cat) --from-offset is not in the remote tier; "
    f"{EXIT_NOT_AUTHORIZED} the principal lacks an ACL (named); {EXIT_UNREACHABLE} the Kafka cluster did not answer "
    "within --timeout (the message names the bootstrap servers and the cause)")

DEFAULT_TIMEOUT_S = 30.0  # --timeout: how long a command waits for a Kafka cluster that does not answer

# librdkafka's codes for "no answer": the cluster is down, unreachable from here, or refuses the connection's
# security handshake. Other errors (a refused ACL, an unknown topic) are answers and handled where they arise.
_NO_ANSWER_CODES = frozenset({
    KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._TIMED_OUT_QUEUE, KafkaError._ALL_BROKERS_DOWN,
    KafkaError._RESOLVE, KafkaError._MSG_TIMED_OUT, KafkaError._AUTHENTICATION, KafkaError._SSL,
    KafkaError.REQUEST_TIMED_OUT, KafkaError.NETWORK_EXCEPTION,
})


class ClusterUnreachableError(Exception):
    """The Kafka cluster at ``bootstrap_servers`` did not answer a command within its ``--timeout``; raised before
    the command changed anything it could not change again. The operator checks that the brokers run and that this
    host reaches them (``kafka.bootstrap_servers``, the port, a firewall, ``kafka.client`` security settings): the
    message names the servers and librdkafka's last error (connection refused, a name not resolved, a handshake
    failed, timed out)."""

    def __init__(self, bootstrap_servers: str, cause: str) -> None:
        super().__init__(f"cannot reach the Kafka cluster at {bootstrap_servers}: {cause}")
        self.bootstrap_servers = bootstrap_servers
        self.cause = cause


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of seconds")
    return value


def add_timeout_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timeout", type=_seconds, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"give up on a Kafka cluster that does not answer after this long (default "
                        f"{DEFAULT_TIMEOUT_S:g}); exit code {EXIT_UNREACHABLE} then, with one line naming the "
                        "bootstrap servers and the cause")


def _no_answer(err: BaseException) -> str | None:
    """librdkafka's text when ``err`` (or an error it was raised from) says the cluster did not answer; else None."""
    from confluent_kafka import KafkaException

    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError) \
                and e.args[0].code() in _NO_ANSWER_CODES:
            return str(err) if e is not err and str(err) else e.args[0].str()
        if isinstance(e, ReadYourWritesTimeoutError | TimeoutError):  # the metadata cache waited for records
            return str(e) or "timed out"
        e = e.__cause__ or e.__context__
    return None


@contextmanager
def cluster_errors(bootstrap_servers: str) -> Iterator[None]:
    """Turn an error that says the cluster did not answer into :class:`ClusterUnreachableError`; others pass."""
    try:
        yield
    except (ClusterUnreachableError, SystemExit, KeyboardInterrupt):
        raise
    except Exception as err:
        cause = _no_answer(err)
        if cause is None:
            raise
        raise ClusterUnreachableError(bootstrap_servers, cause) from None


def reach_cluster(client_config: Mapping[str, Any], timeout_s: float) -> None:
    """Ask the cluster for one topic's metadata (any topic: no ACL needed to be told it is unknown or denied);
    raise :class:`ClusterUnreachableError` naming the bootstrap servers and librdkafka's last error when no broker
    answers within ``timeout_s``. Its client's log lines are kept back (librdkafka logs every failed connect): the
    error says it once."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    bootstrap = str(client_config.get("bootstrap.servers", "?"))
    errors: list[KafkaError] = []
    quiet = logging.Logger("rlm.cli.reach")  # not registered: nothing propagates, nothing is printed
    quiet.addHandler(logging.NullHandler())
    admin = AdminClient({**client_config, "logger": quiet, "error_cb": errors.append})
    try:
        admin.list_topics("__rlm_reach", timeout=timeout_s)
    except KafkaException as err:
        admin.poll(0)  # the error callbacks are served on poll
        detail = [e.str() for e in errors if e.code() != KafkaError._ALL_BROKERS_DOWN]
        last = detail[-1] if detail else err.args[0].str() if err.args else str(err)
        raise ClusterUnreachableError(bootstrap, f"no answer within {timeout_s:g}s; last error: {last}") from None
    finally:
        admin.poll(0)


def open_rlmm(settings: SidecarSettings, timeout_s: float, **kwargs: Any) -> TopicBasedRemoteLogMetadataManager:
    """The metadata manager of these settings (:func:`rlm.rlmm_config.make_rlmm` with ``kwargs``), each of its waits
    on the cluster bounded by ``timeout_s``."""
    from rlm.rlmm_config import make_rlmm

    return make_rlmm(settings, kafka_timeout_s=timeout_s, **kwargs)


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
        from confluent_kafka import KafkaException

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
    """Config, the cluster reached (``args.timeout``), ACLs checked, the metadata manager, the store and the cluster
    view; exits 2 on a bad config, 5 on a missing ACL, raises :class:`ClusterUnreachableError` (exit 6) when the
    cluster does not answer, here or in the command's body."""
    from rlmm.api import MetadataTopicMissingError

    try:
        settings = load_settings(args.config)
    except ConfigError as err:
        print(f"rlm: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    settings.metadata.state_dir.mkdir(parents=True, exist_ok=True)
    client = settings.kafka.client_config()
    with cluster_errors(settings.kafka.bootstrap_servers):
        reach_cluster(client, args.timeout)
        try:  # before any client thread can die of a refusal: one clear error naming the missing ACL
            check(client, reader_needs(settings.metadata.topic), timeout_s=args.timeout)
        except NotAuthorizedError as err:
            raise not_authorized(err) from None
        try:
            rlmm = open_rlmm(settings, args.timeout, cache_for="cli", read_only=True)
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
            view = ClusterView(client, timeout_s=args.timeout)
            try:
                yield CliContext(settings, view, rlmm, rsm, RemoteReader(rlmm, rsm))
            finally:
                view.close()
                rsm.close()
        finally:
            rlmm.close()
