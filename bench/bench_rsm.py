"""RemoteStorageManager benchmark: copy and read, side by side with the plain tools, in one run.

    .venv/bin/python bench/bench_rsm.py [--size-mib 2048] [--s3-size-mib 512] [--reads 50]

1. A real broker writes a few MiB of record batches; a large segment is built from them by repeating the
   batches with rewritten base offsets (the CRC-32C does not cover the base offset, so every batch stays
   valid), plus sparse offset/time indexes as Kafka writes them (an entry per ~4 KiB).
2. Copy to the filesystem store vs ``cp`` of the same files; copy to S3 (moto server) vs boto3
   ``upload_file`` of the same files. Each copy runs in a fresh subprocess that reports its wall time and
   its peak RSS above idle (``VmHWM`` - ``VmRSS`` before the copy, from ``/proc/self/status``).
3. Random-offset reads (one whole batch at a random position), cold (new manager: empty index cache) and
   warm: store requests per read and latency.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024


def _proc_status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


# --------------------------------------------------------------------------------------------- segment making

def broker_batches(workdir: Path) -> list[bytes]:
    """Record batches a real broker wrote (about 3 MiB, 64 KiB producer batches)."""
    from confluent_kafka import Producer

    from devtools.devkafka import KafkaCluster
    from rsm.log.batch import iter_batches_with_bytes
    from rsm.log.partition import PartitionDir

    with KafkaCluster(brokers=1, broker_config={"log.flush.interval.messages": "100000"}) as kc:
        topic = "bench-rsm"
        kc.create_topic(topic, 1, config={"segment.bytes": str(4 * MiB)})
        p = Producer({"bootstrap.servers": kc.bootstrap_servers, "linger.ms": 20, "batch.size": 65536,
                      "compression.type": "none"})
        rng = random.Random(1)
        for i in range(12_000):
            value = (b"%08d " % i) + bytes(rng.getrandbits(8) for _ in range(24)) * 20
            while True:
                try:
                    p.produce(topic, key=b"key-%d" % (i % 100), value=value, partition=0)
                    break
                except BufferError:
                    p.poll(0.05)
        p.flush(60)
        del p  # close the producer before the broker stops
        pdir = next(d / f"{topic}-0" for d in kc.node(1).log_dirs)
        out = []
        for seg in PartitionDir(pdir).segments():
            for _, data in iter_batches_with_bytes(seg.log_path):
                out.append(bytes(data))
    return out


def build_segment(batches: list[bytes], size_bytes: int, directory: Path) -> dict[str, Path]:
    """A ``.log`` of ~``size_bytes`` from ``batches`` repeated, plus sparse ``.index``/``.timeindex``."""
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "00000000000000000000.log"
    index = bytearray()
    tindex = bytearray()
    offset = 0
    pos = 0
    since_index = 0
    with open(log, "wb") as f:
        while pos < size_bytes:
            for b in batches:
                last_delta = struct.unpack_from(">i", b, 23)[0]
                max_ts = struct.unpack_from(">q", b, 35)[0]
                if since_index >= 4096 or pos == 0:
                    index += struct.pack(">ii", offset, pos)
                    tindex += struct.pack(">qi", max_ts, offset)
                    since_index = 0
                f.write(struct.pack(">q", offset))
                f.write(memoryview(b)[8:])
                offset += last_delta + 1
                pos += len(b)
                since_index += len(b)
                if pos >= size_bytes:
                    break
    (directory / "00000000000000000000.index").write_bytes(index)
    (directory / "00000000000000000000.timeindex").write_bytes(tindex)
    return {"log": log, "index": directory / "00000000000000000000.index",
            "timeindex": directory / "00000000000000000000.timeindex", "last_offset": offset - 1}


# ------------------------------------------------------------------------------------------------ the workers

def worker(args: dict) -> dict:
    """Runs in a subprocess: one copy; reports seconds and peak RSS above idle."""
    import boto3
    from boto3.s3.transfer import TransferConfig
    from botocore.config import Config

    from rsm.api import LogSegmentData, RemoteSegmentMetadata
    from rsm.manager import RemoteStorageManager, RsmConfig
    from rsm.store.fs import FileSystemStore
    from rsm.store.s3 import S3Store

    files = [Path(args["log"]), Path(args["index"]), Path(args["timeindex"])]
    kind = args["kind"]
    client = None
    if kind in ("s3-rsm", "upload_file"):
        client = boto3.client("s3", endpoint_url=args["endpoint"], region_name="us-east-1",
                              config=Config(request_checksum_calculation="when_required",
                                            response_checksum_validation="when_required"))
    md = RemoteSegmentMetadata(uuid.UUID(args["segment_id"]), uuid.UUID(int=7), "bench-rsm", 0, 0,
                               args["last_offset"])
    data = LogSegmentData(files[0], files[1], files[2], None, None, b"0\n1\n0 0\n")
    idle_kib = _proc_status_kib("VmRSS")
    t0 = time.perf_counter()
    if kind == "cp":
        subprocess.run(["cp", *map(str, files), args["dest"]], check=True)
    elif kind == "cp+fsync":
        subprocess.run(["cp", *map(str, files), args["dest"]], check=True)
        for f in files:
            fd = os.open(Path(args["dest"]) / f.name, os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
    elif kind in ("fs-rsm", "fs-rsm-nofsync"):
        store = FileSystemStore(args["dest"], fsync=kind == "fs-rsm")
        RemoteStorageManager(RsmConfig(), store).copy_log_segment_data(md, data)
    elif kind == "upload_file":
        for f in files:
            client.upload_file(str(f), args["bucket"], f"plain/{args['segment_id']}/{f.name}",
                               Config=TransferConfig())
    elif kind == "s3-rsm":
        store = S3Store(args["bucket"], client=client, part_size_bytes=8 * MiB)
        RemoteStorageManager(RsmConfig(store="s3", bucket=args["bucket"]), store).copy_log_segment_data(md, data)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "peak_above_idle_mib": (_proc_status_kib("VmHWM") - idle_kib) / 1024}


def run_worker(args: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(args)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------- reading

def random_reads(store, md, positions: list[tuple[int, int]], n: int) -> dict:
    from rsm.manager import RemoteStorageManager, RsmConfig

    rng = random.Random(5)
    picks = [positions[rng.randrange(len(positions))] for _ in range(n)]
    out = {}
    for mode in ("cold", "warm"):
        warm = RemoteStorageManager(RsmConfig(), store)
        if mode == "warm":
            warm.reader(md)  # load the index once
        reqs, lat = [], []
        for start, end in picks:
            rsm = RemoteStorageManager(RsmConfig(), store) if mode == "cold" else warm
            before = store.requests.total()
            t0 = time.perf_counter()
            with rsm.fetch_log_segment(md, start, end) as f:
                got = f.read()
            lat.append(time.perf_counter() - t0)
            reqs.append(store.requests.total() - before)
            if len(got) != end - start + 1:
                raise RuntimeError(f"short read at {start}")
        out[mode] = {"requests_max": max(reqs), "requests_mean": statistics.mean(reqs),
                     "p50_ms": statistics.median(lat) * 1000, "max_ms": max(lat) * 1000}
    return out


def throttle_accuracy(rate: float, seconds: float, threads: int = 4) -> list[tuple[str, float, float]]:
    """Threads draw 64 KiB at a time from one shared throttle; the rate halves halfway. (phase, want, got)."""
    import threading

    from rsm.throttle import Throttle

    t = Throttle("bench", rate)
    passed = [0]
    lock = threading.Lock()
    stop = threading.Event()

    def run() -> None:
        while not stop.is_set():
            t.acquire(65536)
            with lock:
                passed[0] += 65536

    workers = [threading.Thread(target=run, daemon=True) for _ in range(threads)]
    t.acquire(int(rate))  # drain the initial burst so the phases measure the steady rate
    for w in workers:
        w.start()
    out = []
    for phase, r in (("full rate", rate), ("rate halved at run time", rate / 2)):
        t.set_rate(r)
        with lock:
            start_bytes = passed[0]
        t0 = time.monotonic()
        time.sleep(seconds / 2)
        with lock:
            got = (passed[0] - start_bytes) / (time.monotonic() - t0)
        out.append((phase, r, got))
    stop.set()
    t.set_rate(None)
    for w in workers:
        w.join()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mib", type=int, default=2048, help="the large segment (filesystem, memory)")
    ap.add_argument("--s3-size-mib", type=int, default=512, help="the segment copied to S3 (moto)")
    ap.add_argument("--reads", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2, help="best of N for each copy")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--throttle-seconds", type=float, default=30.0, help="length of the throttle accuracy run")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(json.loads(a.worker))))
        return

    import boto3
    from botocore.config import Config
    from moto.server import ThreadedMotoServer

    from rsm.api import RemoteSegmentMetadata
    from rsm.log.batch import scan_batches
    from rsm.store.fs import FileSystemStore
    from rsm.store.s3 import S3Store

    work = Path(a.workdir or tempfile.mkdtemp(prefix="bench-rsm-"))
    print(f"work dir {work}; producing batches with a real broker ...", flush=True)
    batches = broker_batches(work)
    print(f"{len(batches)} broker batches, {sum(map(len, batches)) / MiB:.1f} MiB; building segments ...",
          flush=True)
    big = build_segment(batches, a.size_mib * MiB, work / "big")
    mid = build_segment(batches, a.s3_size_mib * MiB, work / "mid")
    big_bytes = sum(Path(big[k]).stat().st_size for k in ("log", "index", "timeindex"))
    mid_bytes = sum(Path(mid[k]).stat().st_size for k in ("log", "index", "timeindex"))

    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          config=Config(request_checksum_calculation="when_required"))
    client.create_bucket(Bucket="bench")

    rows = []

    def best(kind: str, seg: dict, extra: dict) -> dict:
        results = []
        for _ in range(a.rounds):
            dest = work / f"dest-{uuid.uuid4().hex[:6]}"
            dest.mkdir()
            args = {"kind": kind, "log": str(seg["log"]), "index": str(seg["index"]),
                    "timeindex": str(seg["timeindex"]), "last_offset": seg["last_offset"], "dest": str(dest),
                    "segment_id": str(uuid.uuid4()), "endpoint": endpoint, "bucket": "bench", **extra}
            results.append(run_worker(args))
            shutil.rmtree(dest, ignore_errors=True)
        return min(results, key=lambda r: r["seconds"])

    print("copying ...", flush=True)
    fs = {k: best(k, big, {}) for k in ("cp", "cp+fsync", "fs-rsm", "fs-rsm-nofsync")}
    s3 = {k: best(k, mid, {}) for k in ("upload_file", "s3-rsm")}
    for k, r in fs.items():
        rows.append((k, big_bytes, r))
    for k, r in s3.items():
        rows.append((k, mid_bytes, r))

    print(f"\n{'copy':<16}{'bytes':>12}{'seconds':>10}{'MiB/s':>10}{'peak RSS above idle MiB':>26}")
    for k, n, r in rows:
        print(f"{k:<16}{n:>12}{r['seconds']:>10.2f}{n / MiB / r['seconds']:>10.0f}{r['peak_above_idle_mib']:>26.1f}")
    print(f"\nfs store vs cp (throughput ratio, target >= 0.9): with fsync "
          f"{fs['cp']['seconds'] / fs['fs-rsm']['seconds']:.2f}x of cp, "
          f"{fs['cp+fsync']['seconds'] / fs['fs-rsm']['seconds']:.2f}x of cp+fsync; without fsync "
          f"{fs['cp']['seconds'] / fs['fs-rsm-nofsync']['seconds']:.2f}x of cp")
    print(f"S3 vs upload_file (target >= 0.8): {s3['upload_file']['seconds'] / s3['s3-rsm']['seconds']:.2f}x")
    print(f"copy memory, {a.size_mib} MiB segment to fs: {fs['fs-rsm']['peak_above_idle_mib']:.1f} MiB above idle "
          f"(target < 64); {a.s3_size_mib} MiB to S3: {s3['s3-rsm']['peak_above_idle_mib']:.1f} MiB")

    # random reads over the segment copied to each store
    positions = [(h.position, h.end_position - 1) for h in scan_batches(mid["log"], verify_crc=False)]
    md = RemoteSegmentMetadata(uuid.uuid4(), uuid.UUID(int=7), "bench-rsm", 0, 0, mid["last_offset"])
    from rsm.api import LogSegmentData
    from rsm.manager import RemoteStorageManager, RsmConfig

    data = LogSegmentData(Path(mid["log"]), Path(mid["index"]), Path(mid["timeindex"]), None, None, b"0\n0\n")
    stores = {"fs": FileSystemStore(work / "reads-fs"),
              "s3": S3Store("bench", client=client)}
    print(f"\n{'random read':<14}{'mode':<6}{'req max':>9}{'req mean':>10}{'p50 ms':>9}{'max ms':>9}")
    for name, store in stores.items():
        RemoteStorageManager(RsmConfig(), store).copy_log_segment_data(md, data)
        res = random_reads(store, md, positions, a.reads)
        for mode, r in res.items():
            print(f"{name:<14}{mode:<6}{r['requests_max']:>9}{r['requests_mean']:>10.2f}{r['p50_ms']:>9.2f}"
                  f"{r['max_ms']:>9.2f}")
    # context: what the endpoint itself costs for one 4 MiB ranged GET (the size of one block)
    data_key = RemoteStorageManager(RsmConfig(), stores["s3"]).keys(md).data(0)
    size = stores["s3"].head(data_key)
    lat = []
    rng = random.Random(9)
    for _ in range(min(a.reads, 20)):
        start = rng.randrange(0, size - 4 * MiB)
        t0 = time.perf_counter()
        rng_header = f"bytes={start}-{start + 4 * MiB - 1}"
        body = client.get_object(Bucket="bench", Key=data_key, Range=rng_header)["Body"].read()
        lat.append(time.perf_counter() - t0)
        assert len(body) == 4 * MiB
    print(f"{'s3 raw GET':<14}{'4MiB':<6}{1:>9}{1:>10.2f}{statistics.median(lat) * 1000:>9.2f}{max(lat) * 1000:>9.2f}")
    print("(targets: cold <= 2 requests, warm 1; one read = one whole batch at a random position, 4 MiB blocks;"
          " 's3 raw GET' is boto3 get_object of one 4 MiB range, for scale)")
    server.stop()
    shutil.rmtree(work, ignore_errors=True)

    print(f"\nthrottle: 4 threads, 64 KiB acquires, {a.throttle_seconds:.0f} s (target: within 5%)")
    print(f"{'phase':<26}{'MiB/s set':>10}{'MiB/s got':>11}{'error %':>9}")
    for phase, want, got in throttle_accuracy(50 * MiB, a.throttle_seconds):
        print(f"{phase:<26}{want / MiB:>10.1f}{got / MiB:>11.2f}{(got - want) / want * 100:>9.2f}")


if __name__ == "__main__":
    main()
