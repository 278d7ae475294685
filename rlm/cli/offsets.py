"""``rlm offsets TOPIC PARTITION [--timestamp T]``: what ListOffsets would answer for the remote tier."""

from __future__ import annotations

import argparse
import json

from rlm.cli.context import add_config_arg, add_timeout_arg, open_context

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("offsets", help="earliest remote offset, latest tiered offset, timestamp -> offset")
    add_config_arg(p)
    add_timeout_arg(p)
    p.add_argument("topic")
    p.add_argument("partition", type=int)
    p.add_argument("--timestamp", type=int, default=None, help="ms since the epoch: first offset at or after it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with open_context(args) as ctx:
        (tp,) = ctx.partitions(args.topic, args.partition)
        segs = ctx.reader.segments(tp)
        out: dict[str, object] = {
            "topic": tp.topic, "partition": tp.partition,
            "earliest_remote_offset": segs[0].start_offset if segs else None,
            "earliest_leader_epoch": segs[0].epoch_at(segs[0].start_offset) if segs else None,
            "latest_tiered_offset": segs[-1].end_offset_inclusive if segs else None,
            "latest_leader_epoch": segs[-1].epoch_at(segs[-1].end_offset_inclusive) if segs else None,
        }
        if args.timestamp is not None:
            found = ctx.reader.offset_for_timestamp(tp, args.timestamp)
            out["timestamp"] = args.timestamp
            out["offset_for_timestamp"] = found[0] if found else None
            out["leader_epoch_for_timestamp"] = found[1] if found else None
        print(json.dumps(out))
    return 0
