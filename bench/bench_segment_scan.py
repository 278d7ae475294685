"""Segment scan and record decode vs a raw sequential read of the same file, side by side in one run.

    .venv/bin/python bench/bench_segment_scan.py [--size-mb 256] [--codec lz4] [--path SEGMENT.log]

Without --path it writes a segment of valid v2 batches (aiokafka's batch builder; a few template batches
repeated with rewritten base offsets, which the CRC does not cover) into a temp dir and deletes it after.
Every number is warm: the file is read once first so it sits in the page cache, then each method runs
--repeat times and the best run is reported (the machine is shared and noisy). With --cold, two more rows
time a raw read and a CRC scan right after evicting this file (only) from the page cache. Targets (DESIGN.md section 7):
scan with CRC >= 0.8x raw read; record decode >= 2M records/s/core.
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rsm.log import decode_records, iter_batches_with_bytes, iter_raw_records, scan_batches  # noqa: E402
from rsm.log.batch import CHUNK_BYTES, Codec  # noqa: E402

MB = 1024 * 1024


def make_segment(path: Path, size_bytes: int, codec: Codec, records_per_batch: int, value_bytes: int) -> int:
    from aiokafka.record._crecords.default_records import DefaultRecordBatchBuilder

    rng = random.Random(7)
    words = [rng.randbytes(8).hex().encode() for _ in range(64)]
    templates = []
    for _ in range(4):
        b = DefaultRecordBatchBuilder(2, int(codec), 0, -1, -1, -1, 1 << 30)
        for i in range(records_per_batch):
            value = b" ".join(rng.choice(words) for _ in range(value_bytes // 17 + 1))[:value_bytes]
            headers = [("trace", rng.randbytes(8))] if i % 10 == 0 else []
            b.append(i, 1_700_000_000_000 + i, f"user-{rng.randrange(10_000)}".encode(), value, headers)
        templates.append(bytes(b.build()))
    written = offset = 0
    with open(path, "wb", buffering=8 * MB) as f:
        i = 0
        while written < size_bytes:
            batch = bytearray(templates[i % 4])
            struct.pack_into(">q", batch, 0, offset)
            f.write(batch)
            written += len(batch)
            offset += records_per_batch
            i += 1
    return offset


def raw_read(path: Path) -> tuple[int, int]:
    buf = bytearray(CHUNK_BYTES)
    n = 0
    with open(path, "rb", buffering=0) as f:
        while got := f.readinto(buf):
            n += got
    return n, 0


def scan(path: Path, verify: bool) -> tuple[int, int]:
    n = r = 0
    for h in scan_batches(path, verify_crc=verify):
        n += h.size_bytes
        r += h.record_count
    return n, r


def decode_raw(path: Path) -> tuple[int, int]:
    n = r = 0
    for h, data in iter_batches_with_bytes(path):
        n += h.size_bytes
        for _ in iter_raw_records(h, data):
            r += 1
    return n, r


def decode_dataclass(path: Path) -> tuple[int, int]:
    n = r = 0
    for h, data in iter_batches_with_bytes(path):
        n += h.size_bytes
        r += len(decode_records(h, data))
    return n, r


def evict(path: Path) -> None:
    """Drop this one file from the page cache (posix_fadvise DONTNEED; affects nobody else's files)."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def cold(fn: Callable[[], tuple[int, int]], path: Path) -> tuple[float, int, int]:
    evict(path)
    t0 = time.perf_counter()
    n, r = fn()
    return time.perf_counter() - t0, n, r


def best(fn: Callable[[], tuple[int, int]], repeat: int) -> tuple[float, int, int]:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        n, r = fn()
        times.append(time.perf_counter() - t0)
    return min(times), n, r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", type=Path, help="an existing .log segment (default: generate one)")
    ap.add_argument("--size-mb", type=int, default=256)
    ap.add_argument("--codec", choices=[c.name.lower() for c in Codec], default="lz4")
    ap.add_argument("--records-per-batch", type=int, default=200)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cold", action="store_true",
                    help="also time raw read and CRC scan cold (this file evicted from the page cache first)")
    ap.add_argument("--skip-dataclass", action="store_true", help="skip the (slower) Record dataclass decode")
    args = ap.parse_args()

    tmp = None
    path = args.path
    if path is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-segment-")
        path = Path(tmp.name) / "00000000000000000000.log"
        t0 = time.perf_counter()
        n = make_segment(path, args.size_mb * MB, Codec[args.codec.upper()], args.records_per_batch,
                         args.value_bytes)
        print(f"generated {path.stat().st_size / MB:.0f} MiB, {n:,} records ({args.codec}, "
              f"{args.records_per_batch} records/batch, {args.value_bytes} B values) in "
              f"{time.perf_counter() - t0:.1f}s")
    try:
        size = path.stat().st_size
        raw_read(path)  # warm the page cache: every number below is a warm read
        rows = []
        t_raw, n, _ = best(lambda: raw_read(path), args.repeat)
        rows.append(("raw sequential read (readinto)", t_raw, n, 0))
        t, n, r = best(lambda: scan(path, True), args.repeat)
        rows.append(("header scan + CRC-32C", t, n, r))
        t, n, r = best(lambda: scan(path, False), args.repeat)
        rows.append(("header scan, no CRC", t, n, r))
        t, n, r = best(lambda: decode_raw(path), args.repeat)
        rows.append(("decode records (iter_raw_records)", t, n, r))
        if not args.skip_dataclass:
            t, n, r = best(lambda: decode_dataclass(path), max(1, args.repeat - 1))
            rows.append(("decode records (decode_records -> Record)", t, n, r))
        if args.cold:
            t_cold, n, _ = cold(lambda: raw_read(path), path)
            rows.append(("COLD raw sequential read", t_cold, n, 0))
            t, n, r = cold(lambda: scan(path, True), path)
            rows.append(("COLD header scan + CRC-32C (x cold raw)", t, n, r, t_cold))
        print(f"file {path} ({size / MB:.0f} MiB), warm page cache, best of {args.repeat}, read buffer "
              f"{CHUNK_BYTES // 1024} KiB, python {sys.version.split()[0]}, {os.cpu_count()} cpus")
        print(f"{'method':44} {'seconds':>8} {'MB/s':>9} {'x raw':>7} {'Mrecords/s':>11}")
        for name, t, n, r, *base in rows:
            recs = f"{r / t / 1e6:11.2f}" if r else f"{'':11}"
            ref = base[0] if base else (t if name.startswith("COLD raw") else t_raw)
            print(f"{name:44} {t:8.3f} {n / t / MB:9.0f} {ref / t:7.2f} {recs}")
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
