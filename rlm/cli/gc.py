"""``rlm gc TOPIC... | --all-partitions [--dry-run]``: delete objects no metadata owns (orphans older than the grace
period)."""

from __future__ import annotations

import argparse
import sys

from rlm.cli.context import EXIT_USAGE, add_config_arg, add_timeout_arg, open_context
from rlm.state import StateDir
from rlm.tasks.gc import GarbageCollector

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gc", help="garbage-collect remote objects that no metadata owns")
    add_config_arg(p)
    add_timeout_arg(p)
    p.add_argument("topics", nargs="*", metavar="TOPIC")
    p.add_argument("--all-partitions", action="store_true",
                   help="every partition found by listing the whole store (when GC's state file was lost): those of "
                        "topics on the cluster and of purged topics; others are listed and left alone")
    p.add_argument("--dry-run", action="store_true", help="only list the orphans")
    p.add_argument("--grace-ms", type=int, default=None, help="override tasks.gc_grace_ms")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if bool(args.topics) == args.all_partitions:
        print("rlm gc: name the topics, or --all-partitions (not both)", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)
    with open_context(args) as ctx:
        s = ctx.settings
        gc = GarbageCollector(ctx.rlmm, ctx.rsm,
                              grace_ms=s.tasks.gc_grace_ms if args.grace_ms is None else args.grace_ms,
                              state_path=StateDir(s.metadata.state_dir).gc_orphans)
        if args.all_partitions:
            tps, left = gc.sweep_targets(
                lambda names: {i.topic: i.topic_id for i in ctx.view.partitions(names).values()})
            for tp, why in left:
                print(f"left alone {tp}: {why}")
        else:
            tps = [tp for topic in args.topics for tp in ctx.partitions(topic)]
        keys = gc.run(tps, dry_run=args.dry_run)
        for k in keys:
            print(("orphan " if args.dry_run else "deleted ") + k)
        print(f"{len(keys)} objects {'orphaned' if args.dry_run else 'deleted'}")
    return 0
