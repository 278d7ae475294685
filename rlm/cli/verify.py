"""``rlm verify [TOPIC]``: every remote segment checked against its index, with a progress bar."""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm

from rlm.cli.context import add_config_arg, add_timeout_arg, open_context
from rlm.tier import to_rsm
from rlmm.api import RemoteLogSegmentState

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="check every remote segment of topics against its index")
    add_config_arg(p)
    add_timeout_arg(p)
    p.add_argument("topics", nargs="+", help="topics to verify")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    bad = 0
    with open_context(args) as ctx:
        segs = []
        for topic in args.topics:
            for tp in ctx.partitions(topic):
                segs += [m for m in ctx.rlmm.list_remote_log_segments(tp)
                         if m.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED]
        total = sum(m.segment_size_bytes for m in segs)
        with tqdm(total=total, unit="B", unit_scale=True, desc="verify", file=sys.stderr,
                  disable=None) as bar:
            for md in segs:
                report = ctx.rsm.verify_copy(to_rsm(md))  # under the key layout the copy recorded
                if not report.ok:
                    bad += 1
                    tqdm.write(str(report), file=sys.stdout)
                bar.update(md.segment_size_bytes)
        print(f"verified {len(segs)} segments: {len(segs) - bad} ok, {bad} bad")
    return 1 if bad else 0
