"""``rlm serve --config FILE``: run the sidecar until SIGTERM/SIGINT, with /metrics and /health, and the history
endpoint (:mod:`rlm.history`) when ``history_listener`` is configured."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

from rlm.authz import NotAuthorizedError, authorization_error, check, serve_needs
from rlm.cli.context import EXIT_NOT_AUTHORIZED
from rlm.config import ConfigError, load_settings

__all__ = ["register", "run"]

log = logging.getLogger("rlm.serve")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the sidecar next to a broker")
    p.add_argument("--config", "-c", required=True, help="YAML config (see config/sidecar.example.yaml)")
    p.set_defaults(func=run)


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
    try:  # the ACLs the sidecar needs, named up front (a refusal inside a client thread would hang or kill it)
        check(settings.kafka.client_config(), serve_needs(settings.metadata.topic,
                                                          settings.metadata.to_be_deleted_topic,
                                                          read_only=settings.mode == "read_only",
                                                          history=settings.history_listener is not None))
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
        sidecar = Sidecar(settings)
    except MetadataTopicMissingError as err:  # read-only: the metadata is someone else's, never created here
        print(f"rlm: {err}", file=sys.stderr)
        return 2
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
            from rlm.history import start_history

            history = start_history(settings, sidecar.rsm)
        stop.wait()
    finally:
        if history is not None:
            history.stop()
        clean = sidecar.stop()
        ops.stop()
    if not clean:
        # A job thread is stuck (logged by stop()): the interpreter would wait for it at exit. Leave now.
        logging.shutdown()
        os._exit(1)
    return 0
