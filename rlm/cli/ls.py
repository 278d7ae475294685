"""``rlm ls TOPIC [PARTITION]``: the remote segments, with offsets, times, sizes and states."""

from __future__ import annotations

import argparse
import json

from rlm.cli.context import add_config_arg, add_timeout_arg, open_context

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ls", help="list remote segments of a topic (offsets, times, sizes, states)")
    add_config_arg(p)
    add_timeout_arg(p)
    p.add_argument("topic")
    p.add_argument("partition", nargs="?", type=int)
    p.add_argument("--json", action="store_true", help="one JSON object per segment")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    with open_context(args) as ctx:
        rows = []
        for tp in ctx.partitions(args.topic, args.partition):
            for md in ctx.rlmm.list_remote_log_segments(tp):
                rows.append({
                    "topic": tp.topic, "partition": tp.partition, "start_offset": md.start_offset,
                    "end_offset": md.end_offset_inclusive, "max_timestamp_ms": md.max_timestamp_ms,
                    "size_bytes": md.segment_size_bytes, "state": md.state.name,
                    "leader_epochs": [list(e) for e in md.segment_leader_epochs],
                    "broker_id": md.broker_id, "segment_id": str(md.remote_log_segment_id.id),
                })
        if args.json:
            for r in rows:
                print(json.dumps(r))
        else:
            print(f"{'PARTITION':>9} {'START':>12} {'END':>12} {'BYTES':>12} {'MAX_TIMESTAMP_MS':>16}  STATE")
            for r in rows:
                print(f"{r['partition']:>9} {r['start_offset']:>12} {r['end_offset']:>12} {r['size_bytes']:>12} "
                      f"{r['max_timestamp_ms']:>16}  {r['state']}")
    return 0
