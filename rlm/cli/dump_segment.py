"""``rlm dump-segment PATH [--records]``: a segment's batches (and records) as JSON lines, streamed.

One object per line: ``{"type": "batch", ...}`` per batch, and with ``--records`` a ``{"type": "record", ...}``
per record after its batch (key, value and header values base64, ``null`` when absent). A corrupt or truncated
file ends the output with exit status 1 and one line on stderr naming the file and byte position.
"""

from __future__ import annotations

import argparse
import base64
import json
import sys

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dump-segment", help="print a segment's record batches (and records) as JSON lines")
    p.add_argument("path", help="a .log segment file")
    p.add_argument("--records", action="store_true", help="also print every record after its batch")
    p.add_argument("--no-crc", action="store_true", help="do not verify batch CRCs")
    p.add_argument("--zero-tail-ok", action="store_true",
                   help="accept a zero-filled preallocated tail (active segment with file.preallocate=true)")
    p.set_defaults(func=run)


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode("ascii")


def run(args: argparse.Namespace) -> int:
    from rsm.log import LogFormatError, iter_batches_with_bytes, iter_raw_records

    out = sys.stdout
    dumps = json.dumps
    verify = not args.no_crc
    try:
        for h, data in iter_batches_with_bytes(args.path, verify_crc=verify, zero_tail_ok=args.zero_tail_ok):
            out.write(dumps({
                "type": "batch", "base_offset": h.base_offset, "last_offset": h.last_offset,
                "position": h.position, "size": h.size_bytes, "records": h.record_count,
                "codec": h.codec.name.lower(), "crc_ok": True if verify else None, "transactional": h.is_transactional,
                "control": h.is_control, "max_timestamp": h.max_timestamp, "base_timestamp": h.base_timestamp,
                "leader_epoch": h.partition_leader_epoch, "producer_id": h.producer_id,
            }) + "\n")
            if args.records:
                for r in iter_raw_records(h, data, path=args.path):
                    out.write(dumps({
                        "type": "record", "offset": r.offset, "timestamp": r.timestamp, "key": _b64(r.key),
                        "value": _b64(r.value), "headers": [[k, _b64(v)] for k, v in r.headers],
                    }) + "\n")
    except LogFormatError as err:
        out.flush()
        print(f"rlm dump-segment: {err}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        raise
    except OSError as err:
        out.flush()
        print(f"rlm dump-segment: {args.path}: {err.strerror or err}", file=sys.stderr)
        return 1
    return 0
