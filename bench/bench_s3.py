"""The storage manager on S3 latency (issue 25): side by side with boto3's transfer manager, in one run.

    .venv/bin/python bench/bench_s3.py [--size-mib 256] [--reads 60] [--repeat 2] [--outlier-rate 0]
        [--read-ahead 0,default] [--upload-memory 32MiB,default]
        [--latency-arg=--first-byte-median-ms=27 ...]

s3proxy (a real S3 server over a directory, ``devtools/s3proxy.py``) behind the latency-emulating proxy
(``devtools/s3latency.py``, run as its own process so its pacing does not share our interpreter; both started by
``bench/emulated_s3.py``, as ``bench_history`` and ``bench_spark`` start them: first byte lognormal
median 27 ms sigma 0.6 floor 10 ms, PUT 60 ms + 20 ms/MiB, 88 MB/s per connection, unless ``--latency-arg`` says
otherwise). A segment of ``--size-mib`` is built from synthetic record batches (64 KiB, valid CRC-32C) with sparse
offset/time indexes, as ``bench_rsm`` builds them. Rows, each the best of ``--repeat`` runs taking turns:

- copy: ``RemoteStorageManager.copy_log_segment_data`` (the store from ``RsmConfig``: its defaults, and one row per
  ``--upload-memory`` variant: default 32 MiB, i.e. 3 parts of 8 MiB in flight as before issue 25) vs boto3
  ``upload_file`` of the same three files (``TransferConfig`` defaults), with the parts in flight and the most part
  buffers one put held;
- sequential read of the copied segment as a consumer catching up reads it (what ``rlm cat`` and the history
  endpoint do, through ``rsm``'s public API: ``open_segment(md).batches(start, end)``, every batch in order, on a new
  manager: cold index) vs ``download_fileobj`` of the same data object (defaults) to ``/dev/null``; one row per
  ``--read-ahead`` variant (default: off, i.e. one streamed GET as before issue 25, and the store's default), with
  the peak bytes read ahead;
- the same read one block at a time through a new handle each, as the history endpoint's Fetches read: block cache
  (``block_cache_bytes``) off and on (the store's default);
- the filesystem store: the same read with read-ahead off (its default) and on (64 MiB), page cache warm;
- random cold read: one batch at a random position (``fetch_log_segment``), a new manager each time: p50 / p99 and
  requests per read;
- random read with the index cached (one manager, its index loaded: one ranged GET per read), hedged GETs off and
  on (``hedge_share``) taking turns on the same positions, against the issue's target (p50 <= 1.3x one first byte
  plus a block's transfer); run with ``--outlier-rate 0.02`` to see hedging at work.

Requests per GiB come from the store's own counts (``store.requests``, and ``rsm_store_requests_total`` from the
process's metrics, printed side by side) and, for boto3, from a ``before-send`` hook on its client.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import struct
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

MiB = 1024 * 1024
GiB = 1024 * MiB


# ------------------------------------------------------------------------------------------------ the segment

def _varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)  # zigzag
    out = bytearray()
    while True:
        b = z & 0x7F
        z >>= 7
        if z:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def synthetic_batches(count: int, records: int = 16, value_bytes: int = 4000, seed: int = 1) -> list[bytes]:
    """``count`` uncompressed v2 record batches of ``records`` records each (about 64 KiB), valid CRC-32C."""
    from rsm.log.batch import batch_crc

    rng = random.Random(seed)
    out = []
    ts = 1_700_000_000_000
    for _ in range(count):
        recs = bytearray()
        for i in range(records):
            value = rng.randbytes(value_bytes)
            body = (b"\x00" + _varint(0) + _varint(i) + _varint(-1) + _varint(len(value)) + value + _varint(0))
            recs += _varint(len(body)) + body
        tail = struct.pack(">hiqqqhii", 0, records - 1, ts, ts, -1, -1, -1, records)
        after_len = struct.pack(">ibI", 0, 2, 0) + tail + recs
        data = bytearray(struct.pack(">qi", 0, len(after_len)) + after_len)
        data[17:21] = struct.pack(">I", batch_crc(data))
        out.append(bytes(data))
    return out


# ------------------------------------------------------------------------------------------------- the runs

def parse_size(text: str) -> int:
    """``0``, ``4096``, ``16MiB``, ``512KiB``: bytes."""
    for unit, mult in (("MiB", MiB), ("KiB", 1024)):
        if text.endswith(unit):
            return int(float(text[:-len(unit)]) * mult)
    return int(text)


def sequential_read(rsm, md) -> tuple[int, int]:
    """Every batch of the copy, in order, as a consumer catching up reads it (``rlm cat``, the history endpoint:
    ``open_segment(md).batches``); (bytes of batches, peak bytes the process's read-ahead held, sampled per batch)."""
    from rsm.format.readahead import read_ahead_bytes

    n = peak = 0
    for _h, data in rsm.open_segment(md).batches(md.start_offset, md.end_offset_inclusive):
        n += len(data)
        peak = max(peak, read_ahead_bytes())
    return n, peak


def fetch_like_read(rsm, md) -> tuple[int, int]:
    """Every batch of the copy, one block a read through a new handle each (as the history endpoint's Fetches read
    when a Fetch asks for about a block); (bytes of batches, peak bytes the manager's block cache held, cached or
    being fetched ahead, sampled per block)."""
    n = peak = 0
    for block in range(len(rsm.reader(md).ledger.blocks)):
        for _h, data in rsm.open_segment(md).batches(md.start_offset, md.end_offset_inclusive, first_block=block,
                                                     last_block=block):
            n += len(data)
        peak = max(peak, rsm.block_cache.size_bytes if rsm.block_cache is not None else 0)
    return n, peak


class Boto3Counter:
    """Counts the HTTP requests a boto3 client sends, by operation (``before-send``: retries included)."""

    def __init__(self, client) -> None:
        from collections import Counter

        self.counts: Counter[str] = Counter()
        client.meta.events.register("before-send.s3.*", self._count)

    def _count(self, event_name: str = "", **_: object) -> None:
        self.counts[event_name.rsplit(".", 1)[-1]] += 1

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)


class PartBufferPeak:
    """The part buffers each S3 put allocates (:class:`rsm.store.upload.PartBuffers`, reused within a put: what it
    holds at most), recorded by a subclass installed in place of the module's class."""

    def __init__(self) -> None:
        from rsm.store import upload

        self.puts: list[tuple[upload.PartBuffers, int]] = []
        peak = self

        class Counted(upload.PartBuffers):
            def take(self) -> bytearray:
                buf = super().take()
                if not peak.puts or peak.puts[-1][0] is not self:
                    peak.puts.append((self, 0))
                peak.puts[-1] = (self, self.allocated_bytes)
                return buf

        upload.PartBuffers = Counted  # type: ignore[misc]

    def most(self, since: int) -> int:
        """The most bytes one put since ``len(puts) == since`` held."""
        return max((n for _, n in self.puts[since:]), default=0)


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0)}





def _status_kib(field: str) -> int:
    """A ``/proc/self/status`` value in KiB (``VmRSS``, ``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def _reset_peak_rss() -> int:
    """Resets this process's peak RSS (``VmHWM := VmRSS``, proc(5) ``clear_refs``) and returns ``VmRSS`` in KiB."""
    Path("/proc/self/clear_refs").write_text("5")
    return _status_kib("VmRSS")


def _prom_all() -> dict[str, int]:
    from prometheus_client import REGISTRY

    out: dict[str, int] = {}
    for metric in REGISTRY.collect():
        if metric.name == "rsm_store_requests":
            for s in metric.samples:
                if s.name == "rsm_store_requests_total" and s.labels.get("store") == "s3":
                    out[s.labels["kind"]] = int(s.value)
    return out


def _per_gib(counts: dict[str, int], nbytes: int, kinds: tuple[str, ...]) -> float:
    return sum(counts.get(k, 0) for k in kinds) / (nbytes / GiB)


GETS = ("GetObject", "HeadObject")
PUTS = ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--reads", type=int, default=60, help="random cold reads (twice as many with the index cached)")
    ap.add_argument("--repeat", type=int, default=2, help="runs of each row, taking turns; the best is shown")
    ap.add_argument("--outlier-rate", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--read-ahead", default="0,default",
                    help="sequential-read variants, side by side: read_ahead_bytes values (0 off, 16MiB, ...) or "
                         "'default' (the store's own)")
    ap.add_argument("--upload-memory", default="32MiB,default",
                    help="copy variants, side by side: upload_memory_bytes values (32MiB: 3 parts of 8 MiB in flight, "
                         "as before issue 25), optionally with part_size_bytes after a slash (48MiB/5MiB), or "
                         "'default'")
    ap.add_argument("--latency-arg", action="append", default=[],
                    help="passed to devtools.s3latency as is, e.g. --latency-arg=--bandwidth-mb-per-s=60")
    args = ap.parse_args()

    import boto3
    from bench_rsm import build_segment
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config
    from emulated_s3 import EmulatedS3

    from devtools.s3latency import model_from_argv
    from rsm.api import LogSegmentData, RemoteSegmentMetadata
    from rsm.manager import RemoteStorageManager, RsmConfig

    work = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    bucket = "bench-s3"
    s3 = EmulatedS3(work / "s3proxy", bucket=bucket, seed=args.seed,
                    latency_args=["--outlier-rate", str(args.outlier_rate), *args.latency_arg])
    try:
        print(f"building a {args.size_mib} MiB segment ...", flush=True)
        seg = build_segment(synthetic_batches(48), args.size_mib * MiB, work / "local")
        log_bytes = seg["log"].stat().st_size
        s3.__enter__()
        url = s3.url
        print(s3.describe(), flush=True)
        print(f"load {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f} (1, 5, 15 min)",
              flush=True)

        config = RsmConfig(store="s3", bucket=bucket, endpoint_url=url, region="us-east-1")
        client = boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                              config=Config(s3={"addressing_style": "path"},
                                            request_checksum_calculation="when_required",
                                            response_checksum_validation="when_required"))
        boto_count = Boto3Counter(client)
        files = [seg["log"], seg["index"], seg["timeindex"]]
        copy_bytes = sum(f.stat().st_size for f in files)
        epoch = b"0\n1\n0 0\n"

        def new_md() -> RemoteSegmentMetadata:
            return RemoteSegmentMetadata(uuid.uuid4(), uuid.UUID(int=7), "bench-s3", 0, 0, seg["last_offset"],
                                         segment_size_bytes=log_bytes)

        results: dict[str, list[dict]] = {}
        part_buffers = PartBufferPeak()
        copy_variants: list[tuple[str, dict[str, int]]] = []
        for v in args.upload_memory.split(","):
            memory, _, part = v.partition("/")
            update = {} if memory == "default" else {"upload_memory_bytes": parse_size(memory)}
            if part:
                update["part_size_bytes"] = parse_size(part)
            copy_variants.append(("" if v == "default" else f" upload memory {v}", update))
        read_variants: list[tuple[str, int | None]] = []
        for v in args.read_ahead.split(","):
            read_variants.append(("" if v == "default" else f" read-ahead {v}",
                                  None if v == "default" else parse_size(v)))

        def record(row: str, seconds: float, nbytes: int, counts: dict[str, int], prom: dict[str, int] | None = None,
                   **extra: object) -> None:
            results.setdefault(row, []).append({"seconds": seconds, "bytes": nbytes, "counts": counts, "prom": prom,
                                                **extra})

        copied: RemoteSegmentMetadata | None = None
        for run in range(args.repeat):
            # -- copy ---------------------------------------------------------------------------------------
            for variant, update in copy_variants:
                rsm = RemoteStorageManager(RsmConfig(**{**config.model_dump(), **update}))
                md = new_md()
                before, prom_before, puts = rsm.store.requests.snapshot(), _prom_all(), len(part_buffers.puts)
                idle_kib = _reset_peak_rss()
                t0 = time.perf_counter()
                rsm.copy_log_segment_data(md, LogSegmentData(*files, None, None, epoch))
                record(f"copy/rsm{variant}", time.perf_counter() - t0, copy_bytes,
                       _delta(rsm.store.requests.snapshot(), before), _delta(_prom_all(), prom_before),
                       parts_in_flight=rsm.store.parts_in_flight, part_buffers=part_buffers.most(puts),
                       above_idle=(_status_kib("VmHWM") - idle_kib) * 1024)
                rsm.close()
                copied = copied or md
            before = boto_count.snapshot()
            t0 = time.perf_counter()
            for f in files:
                client.upload_file(str(f), bucket, f"plain/{run}/{f.name}", Config=TransferConfig())
            record("copy/boto3", time.perf_counter() - t0, copy_bytes, _delta(boto_count.snapshot(), before))

            # -- sequential read ----------------------------------------------------------------------------
            for variant, ahead in read_variants:
                # a new manager: the index object is read too (cold)
                rsm = RemoteStorageManager(config.model_copy(update={"read_ahead_bytes": ahead}))
                before, prom_before = rsm.store.requests.snapshot(), _prom_all()
                t0 = time.perf_counter()
                n, peak = sequential_read(rsm, copied)
                seconds = time.perf_counter() - t0
                if n != log_bytes:
                    raise RuntimeError(f"read {n} bytes of batches, the segment has {log_bytes}")
                record(f"read/rsm{variant}", seconds, n, _delta(rsm.store.requests.snapshot(), before),
                       _delta(_prom_all(), prom_before), peak_ahead=peak)
                rsm.close()  # closes the upload pool only: rsm still reads (the data key below)
            # one block a read, a new handle each, as history Fetches read: block cache off and on
            for variant, cache in ((" one block a read, block cache off", 0), (" one block a read", None)):
                rsm = RemoteStorageManager(config.model_copy(update={"block_cache_bytes": cache}))
                before, prom_before = rsm.store.requests.snapshot(), _prom_all()
                t0 = time.perf_counter()
                n, peak = fetch_like_read(rsm, copied)
                seconds = time.perf_counter() - t0
                if n != log_bytes:
                    raise RuntimeError(f"read {n} bytes of batches, the segment has {log_bytes}")
                record(f"read/rsm{variant}", seconds, n, _delta(rsm.store.requests.snapshot(), before),
                       _delta(_prom_all(), prom_before), peak_cache=peak)
                rsm.close()
            data_key = rsm.store_for(rsm.layout_of(copied)).key_prefix + rsm.keys(copied).data(0)
            data_size = rsm.store.head(rsm.keys(copied).data(0)) or 0
            rsm.close()
            before = boto_count.snapshot()
            t0 = time.perf_counter()
            with open(os.devnull, "wb") as sink:
                client.download_fileobj(bucket, data_key, sink, Config=TransferConfig())
            record("read/boto3", time.perf_counter() - t0, data_size, _delta(boto_count.snapshot(), before))

        # -- the filesystem store: the same read, read-ahead off and on (page cache warm) --------------------
        fs_root = work / "fs-store"
        fs_rsm = RemoteStorageManager(RsmConfig(root_path=fs_root, fsync=False))
        fs_md = new_md()
        fs_rsm.copy_log_segment_data(fs_md, LogSegmentData(*files, None, None, epoch))
        for _ in range(args.repeat):
            for variant, ahead in (("", None), (" read-ahead 64MiB", 64 * MiB)):
                rsm = RemoteStorageManager(RsmConfig(root_path=fs_root, read_ahead_bytes=ahead))
                t0 = time.perf_counter()
                n, peak = sequential_read(rsm, fs_md)
                record(f"fs/rsm{variant}", time.perf_counter() - t0, n, {}, peak_ahead=peak)

        # -- random cold reads (one batch at a random position, a new manager each: index + block) -----------
        assert copied is not None
        rng = random.Random(args.seed)
        positions = []
        from rsm.log.batch import iter_batches_with_bytes

        for h, data in iter_batches_with_bytes(seg["log"], verify_crc=False):
            positions.append((h.position, h.position + len(data) - 1))
        lat_ms, reqs = [], []
        for _ in range(args.reads):
            start, end = positions[rng.randrange(len(positions))]
            rsm = RemoteStorageManager(config)
            before = rsm.store.requests.total()
            t0 = time.perf_counter()
            with rsm.fetch_log_segment(copied, start, end) as f:
                got = f.read()
            lat_ms.append((time.perf_counter() - t0) * 1000)
            reqs.append(rsm.store.requests.total() - before)
            rsm.close()
            if len(got) != end - start + 1:
                raise RuntimeError(f"short random read at {start}")

        # -- random reads with the index cached (one manager each, its index loaded): hedging off and on, taking
        # turns on the same positions, so both meet the emulator's outliers alike --------------------------------
        warm = {"hedging off": RemoteStorageManager(config.model_copy(update={"hedge_share": 0.0})),
                "hedged": RemoteStorageManager(config)}
        for rsm in warm.values():
            rsm.reader(copied)  # the index object, cached
        warm_ms: dict[str, list[float]] = {name: [] for name in warm}
        warm_reqs: dict[str, int] = dict.fromkeys(warm, 0)
        for _ in range(2 * args.reads):
            start, end = positions[rng.randrange(len(positions))]
            for name, rsm in warm.items():
                before = rsm.store.requests.total()
                t0 = time.perf_counter()
                with rsm.fetch_log_segment(copied, start, end) as f:
                    got = f.read()
                warm_ms[name].append((time.perf_counter() - t0) * 1000)
                warm_reqs[name] += rsm.store.requests.total() - before
                if len(got) != end - start + 1:
                    raise RuntimeError(f"short random read at {start}")
        hedges = {name: (rsm.store.hedger.hedges, rsm.store.hedger.won) for name, rsm in warm.items()}
        for rsm in warm.values():
            rsm.close()

        # -- the table ------------------------------------------------------------------------------------
        def best(row: str) -> dict:
            return min(results[row], key=lambda r: r["seconds"])

        def mbps(r: dict) -> float:
            return r["bytes"] / r["seconds"] / 1e6

        def all_mbps(row: str) -> str:
            return ", ".join(f"{mbps(r):.0f}" for r in results[row])

        print()
        print(f"segment: {log_bytes / MiB:.0f} MiB .log ({copy_bytes / MiB:.1f} MiB with indexes), "
              f"best of {args.repeat}, MB = 10^6 bytes")
        print("| measure | this project | boto3 transfer manager | ratio |")
        print("|---|---|---|---|")
        rows = [(f"sequential read{v or ' (store default)'} (open_segment().batches vs download_fileobj)",
                 f"read/rsm{v}", "read/boto3") for v, _ in read_variants]
        rows += [(f"sequential read{v} (a new handle per block, as history Fetches)", f"read/rsm{v}", "read/boto3")
                 for v in (" one block a read, block cache off", " one block a read")]
        rows += [(f"copy{v or ' (store default)'} (copy_log_segment_data vs upload_file x3)", f"copy/rsm{v}",
                  "copy/boto3") for v, _ in copy_variants]
        for what, row, other in rows:
            r, b = best(row), best(other)
            peak = f", read-ahead peak {r['peak_ahead'] / MiB:.0f} MiB" if "peak_ahead" in r else ""
            if "peak_cache" in r:
                peak = f", block cache peak {max(x['peak_cache'] for x in results[row]) / MiB:.0f} MiB"
            if "part_buffers" in r:
                peak = (f", {r['parts_in_flight']} parts in flight, part buffers of one put at most "
                        f"{r['part_buffers'] / MiB:.0f} MiB, RSS above idle at most "
                        f"{max(x['above_idle'] for x in results[row]) / MiB:.0f} MiB")
            print(f"| {what} | {mbps(r):.0f} MB/s ({all_mbps(row)}{peak}) | {mbps(b):.0f} MB/s "
                  f"({all_mbps(other)}) | {mbps(r) / mbps(b):.2f}x |")
        r0, r1 = best("fs/rsm"), best("fs/rsm read-ahead 64MiB")
        print(f"| filesystem store, sequential read: default (off) vs read-ahead 64 MiB | {mbps(r0):.0f} MB/s "
              f"({all_mbps('fs/rsm')}) | {mbps(r1):.0f} MB/s ({all_mbps('fs/rsm read-ahead 64MiB')}) | "
              f"{mbps(r0) / mbps(r1):.2f}x |")
        lat_sorted = sorted(lat_ms)
        p99 = lat_sorted[min(len(lat_sorted) - 1, int(0.99 * len(lat_sorted)))]
        print(f"| random cold read, one batch ({args.reads} reads, a new manager each: index + block) | p50 "
              f"{statistics.median(lat_ms):.0f} ms, p99 {p99:.0f} ms, {statistics.mean(reqs):.1f} requests/read "
              f"(max {max(reqs)}) | | |")
        model = model_from_argv(["--seed", str(args.seed), "--outlier-rate", str(args.outlier_rate),
                                 *args.latency_arg])
        target_ms = 1.3 * (model.first_byte_median_ms + config.block_size_bytes / model.bandwidth_bytes_per_s * 1000)
        for name, ms in warm_ms.items():
            ordered = sorted(ms)
            p50, p99 = statistics.median(ms), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
            print(f"| random read, index cached, {name} ({len(ms)} reads) | p50 {p50:.0f} ms, p99 {p99:.0f} ms, "
                  f"max {ordered[-1]:.0f} ms, {warm_reqs[name] / len(ms):.2f} requests/read, hedges "
                  f"{hedges[name][0]} (won {hedges[name][1]}) | target p50 <= 1.3 x (first byte "
                  f"{model.first_byte_median_ms:.0f} ms + a {config.block_size_bytes / MiB:.0f} MiB block's "
                  f"transfer) = {target_ms:.0f} ms | {p50 / target_ms:.2f} of target |")
        print()
        print("| requests per GiB | this project (store.requests) | rsm_store_requests_total | boto3 |")
        print("|---|---|---|---|")
        count_rows = [(f"read{v}: GETs", f"read/rsm{v}", "read/boto3", GETS) for v, _ in read_variants]
        count_rows += [(f"read{v}: GETs", f"read/rsm{v}", "read/boto3", GETS)
                       for v in (" one block a read, block cache off", " one block a read")]
        count_rows += [(f"copy{v}: PUTs", f"copy/rsm{v}", "copy/boto3", PUTS) for v, _ in copy_variants]
        for label, row, other, kinds in count_rows:
            r, b = best(row), best(other)
            print(f"| {label} | {_per_gib(r['counts'], r['bytes'], kinds):.0f} {r['counts']} | "
                  f"{_per_gib(r['prom'], r['bytes'], kinds):.0f} | {_per_gib(b['counts'], b['bytes'], kinds):.0f} "
                  f"{b['counts']} |")
        print(f"load at the end {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} {os.getloadavg()[2]:.1f}")
    finally:
        s3.__exit__()
        print(f"emulator stats: {json.dumps(s3.stats)}")
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
