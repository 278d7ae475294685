"""The ``rlm`` command line. Each subcommand lives in its own module that exposes ``register(subparsers)``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["main"]

# Modules that add subcommands, in the order ``rlm --help`` lists them.
COMMAND_MODULES = [
    "rlm.cli.demo",
    "rlm.cli.dump_segment",
    "rlm.cli.serve",
    "rlm.cli.ls",
    "rlm.cli.cat",
    "rlm.cli.offsets",
    "rlm.cli.verify",
    "rlm.cli.status",
    "rlm.cli.gc",
    "rlm.cli.recover",
]


def build_parser() -> argparse.ArgumentParser:
    from rlm.cli.context import EXIT_CODES

    parser = argparse.ArgumentParser(
        prog="rlm",
        description="Tiered-storage sidecar for Apache Kafka (KIP-405 remote log manager).",
        epilog=EXIT_CODES,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from rlm.cli.context import EXIT_UNREACHABLE, ClusterUnreachableError

    try:
        return int(args.func(args) or 0)
    except ClusterUnreachableError as err:  # one line naming the bootstrap servers and the cause, no traceback
        print(f"rlm: {err}", file=sys.stderr)
        return EXIT_UNREACHABLE
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        sys.stderr.close()
        return 0
    except Exception as err:
        # A request the broker refused deep inside a client (after the commands' up-front ACL check): one line
        # naming the refusal instead of a traceback (README, "Authenticated clusters").
        from rlm.authz import NotAuthorizedError, authorization_error
        from rlm.cli.context import EXIT_NOT_AUTHORIZED

        message = str(err) if isinstance(err, NotAuthorizedError) else authorization_error(err)
        if message is None:
            raise
        print(f"rlm: {message}", file=sys.stderr)
        return EXIT_NOT_AUTHORIZED


