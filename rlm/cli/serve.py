"""``rlm serve --config FILE``: run the sidecar until SIGTERM/SIGINT, with /metrics and /health, and the history
endpoint (:mod:`rlm.listener`) when ``history_listener`` is configured.

At start it reaches the cluster first (``--timeout``, :func:`rlm.cli.context.reach_cluster`): one that does not answer
ends it with one line naming the bootstrap servers and exit code 6. A stop takes at most ``--stop-timeout`` seconds
(:data:`DEFAULT_STOP_TIMEOUT_S`), whether or not the cluster still answers: a job still running then (a copy, or a
discovery round waiting on a broker that is gone) is abandoned, exactly as a crash would leave it (a copy left
COPY_SEGMENT_STARTED and its objects are cleaned up by the next start), and the process exits 1.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
import threading
from typing import TYPE_CHECKING

from rlm.authz import NotAuthorizedError, authorization_error, check, serve_needs
from rlm.cli.context import (
    EXIT_NOT_AUTHORIZED,
    EXIT_UNREACHABLE,
    ClusterUnreachableError,
    add_timeout_arg,
    cluster_errors,
    reach_cluster,
)
from rlm.config import ConfigError, load_settings

if TYPE_CHECKING:
    from rlm.config import SidecarSettings
    from rlm.sidecar import Sidecar

__all__ = ["DEFAULT_STOP_TIMEOUT_S", "register", "run"]

log = logging.getLogger("rlm.serve")

DEFAULT_STOP_TIMEOUT_S = 5.0  # SIGTERM -> exit, at most
CLOSE_S = 2.0  # of the stop budget, kept for closing the clients and the cache once the jobs ended or were abandoned


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive number of seconds")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the sidecar next to a broker",
                       epilog=f"exit codes: 0 stopped cleanly; 1 stopped with a job abandoned when the stop timeout "
                              "ran out (left as after a crash: the next start cleans it up); 2 bad config; "
                              f"{EXIT_NOT_AUTHORIZED} the principal lacks an ACL; {EXIT_UNREACHABLE} the Kafka cluster "
                              "did not answer at start within --timeout")
    p.add_argument("--config", "-c", required=True, help="YAML config (see config/sidecar.example.yaml)")
    add_timeout_arg(p)
    p.add_argument("--stop-timeout", type=_positive_seconds, default=DEFAULT_STOP_TIMEOUT_S, metavar="SECONDS",
                   help=f"on SIGTERM/SIGINT, exit within this long (default {DEFAULT_STOP_TIMEOUT_S:g}): a copy in "
                        "flight finishes if it can by then, else it is left as after a crash (the next start cleans "
                        "it up) and the exit code is 1")
    p.set_defaults(func=run)


def _stop_within(sidecar: Sidecar, budget_s: float) -> bool:
    """``sidecar.stop()`` bounded by ``budget_s`` in all: the jobs get the budget less :data:`CLOSE_S`, closing the
    rest. True when everything stopped and closed in time; False when a job or a close was abandoned (logged)."""
    done: list[bool] = []
    stopper = threading.Thread(target=lambda: done.append(sidecar.stop(timeout_s=max(0.5, budget_s - CLOSE_S))),
                               name="rlm-stop", daemon=True)
    stopper.start()
    stopper.join(budget_s)
    if not done:
        log.error("stop not finished within --stop-timeout: exiting, what is in flight is left as after a crash",
                  extra={"stop_timeout_s": budget_s})
    return bool(done and done[0])


def raise_open_files_limit(needed: int) -> tuple[int, int]:
    """Raise this process's soft limit of open files to its hard limit, as the JVM does for Kafka's broker
    (``-XX:+MaxFDLimit``, on by default): a soft limit of 1,024, the default of many systems, is less than the
    listener's ``max_connections`` (1,000, each with its own connection to the broker as a proxy) and the files a
    copy holds open (up to ``tasks.copy_workers`` x 16 segments x 5 files in place, :mod:`rlm.tasks.in_place`)
    together. A hard limit below ``needed`` is logged (a WARNING naming both), not refused: connections past it are
    refused and copies retried. Returns the (soft, hard) limits before the raise."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < needed:
        log.warning("the hard limit of open files is below what the configuration may use: raise it (ulimit -Hn, "
                    "LimitNOFILE, the container's nofile)", extra={"hard_limit": hard, "needed": needed})
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            log.info("open files limit raised to the hard limit", extra={"from": soft, "to": hard})
        except (ValueError, OSError) as err:  # e.g. an unlimited hard limit the kernel caps (nr_open)
            log.warning("open files limit not raised", extra={"soft_limit": soft, "hard_limit": hard,
                                                              "error": str(err)})
    return soft, hard


def files_needed(settings: SidecarSettings) -> int:
    """Open files the sidecar may use at once with ``settings`` (:func:`raise_open_files_limit`): 256 for its
    clients, store, cache and logs, the copies' files in place, and two per listener connection as a proxy (one
    otherwise)."""
    from rlm.tasks.copier import COPY_BATCH_SEGMENTS

    files = 256 + settings.tasks.copy_workers * COPY_BATCH_SEGMENTS * 5
    listener = settings.history_listener
    if listener is not None:
        files += listener.max_connections * (2 if listener.proxy else 1)
    return files


def run(args: argparse.Namespace) -> int:
    from rlm.http import OpsServer
    from rlm.logs import setup_logging
    from rlm.sidecar import Sidecar
    from rlmm.api import MetadataTopicMissingError

    try:
        settings = load_settings(args.config)
    except ConfigError as err:
        print(f"rlm: {err}", file=sys.stderr)
        return 2
    setup_logging(settings.log_level, settings.log_format)
    raise_open_files_limit(files_needed(settings))
    try:
        with cluster_errors(settings.kafka.bootstrap_servers):
            reach_cluster(settings.kafka.client_config(), args.timeout)
    except ClusterUnreachableError as err:
        log.error("cannot start: %s", err)
        return EXIT_UNREACHABLE
    try:  # the ACLs the sidecar needs, named up front (a refusal inside a client thread would hang or kill it)
        check(settings.kafka.client_config(), serve_needs(settings.metadata.topic,
                                                          settings.metadata.to_be_deleted_topic,
                                                          read_only=settings.mode == "read_only",
                                                          history=settings.history_listener is not None),
              timeout_s=args.timeout)
    except NotAuthorizedError as err:
        log.error("cannot start: %s", err)
        return EXIT_NOT_AUTHORIZED
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal received: shutting down", extra={"signal": signal.Signals(signum).name})
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        with cluster_errors(settings.kafka.bootstrap_servers):  # the cluster gone since reach_cluster
            sidecar = Sidecar(settings)
    except MetadataTopicMissingError as err:  # read-only: the metadata is someone else's, never created here
        print(f"rlm: {err}", file=sys.stderr)
        return 2
    except ClusterUnreachableError as err:
        log.error("cannot start: %s", err)
        return EXIT_UNREACHABLE
    except Exception as err:
        message = authorization_error(err, settings.kafka.client)  # e.g. creating its topics was refused
        if message is None:
            raise
        log.error("cannot start: %s", message)
        return EXIT_NOT_AUTHORIZED
    ops = OpsServer(settings.listen.host, settings.listen.port, sidecar.health, sidecar.liveness).start()
    log.info("listening", extra={"host": settings.listen.host, "port": ops.port})
    sidecar.start()
    history = None
    try:
        if settings.history_listener is not None:
            from rlm.listener import start_listener
            from rlm.tasks.staging import staged_ranges, staging_roots

            # as a proxy, a range below the broker's log start that this sidecar holds staged is never a hole
            roots = list(staging_roots(settings.log_dirs, settings.staging_dir).values())
            history = start_listener(settings, sidecar.rsm, staged=functools.partial(staged_ranges, roots))
        stop.wait()
    finally:
        if history is not None:
            history.stop()
        clean = _stop_within(sidecar, args.stop_timeout)
        ops.stop()
    if not clean:
        # A job thread or a close is stuck (logged): the interpreter would wait for it at exit. Leave now; what was
        # in flight is left as after a crash.
        logging.shutdown()
        os._exit(1)
    return 0
