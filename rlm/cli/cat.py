"""``rlm cat TOPIC PARTITION --from-offset N``: records read from the remote tier, one JSON object per line.

A record too large to hold (a value over ``rsm.log.records.INLINE_VALUE_BYTES`` in a batch stored as fragments,
PDP-43) is written out as it is read: its line is the same JSON, the value encoded and written a chunk at a time
(:func:`write_large`), so ``rlm cat`` holds about a block of it, whatever its size.
"""

from __future__ import annotations

import argparse
import base64
import codecs
import json
import sys
from collections.abc import Callable
from typing import TextIO

from rlm.cli.context import (
    EXIT_NOT_AUTHORIZED,
    EXIT_NOTHING_REMOTE,
    EXIT_OUT_OF_RANGE,
    EXIT_UNREACHABLE,
    add_config_arg,
    add_timeout_arg,
    open_context,
)
from rlm.tier import Isolation, LargeRemoteRecord, OffsetOutOfRangeError

__all__ = ["register", "write_large"]


def _b64(v: bytes | None) -> str | None:
    return None if v is None else base64.b64encode(v).decode()


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cat", help="read records of a partition from the remote tier",
        description="Records of a partition from the remote tier, one JSON object per line: offset, timestamp, key, "
                    "value (base64, or UTF-8 text with --text), headers as [name, base64 value], leader_epoch.",
        epilog=f"exit codes: 0 read; 2 bad arguments/config or no such topic partition; {EXIT_NOTHING_REMOTE} "
               f"nothing of the partition is remote yet; {EXIT_OUT_OF_RANGE} --from-offset is not in the remote tier; "
               f"{EXIT_NOT_AUTHORIZED} the principal lacks an ACL (named); {EXIT_UNREACHABLE} the Kafka cluster did "
               "not answer within --timeout")
    add_config_arg(p)
    add_timeout_arg(p)
    p.add_argument("topic")
    p.add_argument("partition", type=int)
    p.add_argument("--from-offset", type=int, default=None, help="first offset (default: earliest remote)")
    p.add_argument("--max-bytes", type=int, default=None, help="stop after this many batch bytes")
    p.add_argument("--max-records", type=int, default=None)
    p.add_argument("--isolation", choices=list(Isolation), default=Isolation.READ_UNCOMMITTED)
    p.add_argument("--text", action="store_true", help="keys and values as UTF-8 text instead of base64")
    p.set_defaults(func=run)


def write_large(out: TextIO, r: LargeRemoteRecord, enc: Callable[[bytes | None], str | None], text: bool) -> None:
    """Write record ``r``'s line to ``out`` as ``json.dumps`` of the same object would be, its value encoded and
    written a chunk at a time (base64 in runs of whole 3-byte groups; with ``text``, UTF-8 decoded incrementally
    with replacement, escaped as JSON escapes it)."""
    out.write(json.dumps({"offset": r.offset, "timestamp": r.timestamp, "key": enc(r.key)})[:-1] + ', "value": "')
    if text:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        for chunk in r.value_chunks():
            out.write(json.dumps(decoder.decode(chunk))[1:-1])
        out.write(json.dumps(decoder.decode(b"", final=True))[1:-1])
    else:
        carry = b""
        for chunk in r.value_chunks():
            data = carry + bytes(chunk)
            cut = len(data) - len(data) % 3
            out.write(base64.b64encode(data[:cut]).decode())
            carry = data[cut:]
        out.write(base64.b64encode(carry).decode())
    out.write('", ' + json.dumps({"headers": [[k, _b64(v)] for k, v in r.headers()],
                                  "leader_epoch": r.leader_epoch})[1:] + "\n")


def run(args: argparse.Namespace) -> int:
    enc = (lambda v: None if v is None else v.decode("utf-8", "replace")) if args.text else _b64
    with open_context(args) as ctx:
        (tp,) = ctx.partitions(args.topic, args.partition)
        start = args.from_offset if args.from_offset is not None else ctx.reader.earliest_offset(tp)
        if start is None:
            print(f"rlm: {tp.topic}-{tp.partition}: nothing remote yet", file=sys.stderr)
            return EXIT_NOTHING_REMOTE
        try:
            for r in ctx.reader.read(tp, start, max_bytes=args.max_bytes, max_records=args.max_records,
                                     isolation=Isolation(args.isolation), large=True):
                if isinstance(r, LargeRemoteRecord):
                    write_large(sys.stdout, r, enc, args.text)
                    continue
                print(json.dumps({"offset": r.offset, "timestamp": r.timestamp, "key": enc(r.key),
                                  "value": enc(r.value), "headers": [[k, _b64(v)] for k, v in r.headers],
                                  "leader_epoch": r.leader_epoch}))
        except OffsetOutOfRangeError as err:
            print(f"rlm: {err}", file=sys.stderr)
            return EXIT_OUT_OF_RANGE
    return 0
