"""RemoteStorageManager benchmark: copy and read, side by side with the plain tools, in one run.

    .venv/bin/python bench/bench_rsm.py [--size-mib 2048] [--s3-size-mib 512] [--reads 50]

1. A real broker writes a few MiB of record batches; a large segment is built from them by repeating the
   batches with rewritten base offsets (the CRC-32C does not cover the base offset, so every batch stays
   valid), plus sparse offset/time indexes as Kafka writes them (an entry per ~4 KiB).
2. Copy to the filesystem store vs ``cp`` of the same files; copy to S3 vs boto3 ``upload_file`` of the same
   files, on two S3 servers over HTTP: moto (a mock) and s3proxy (a real S3 server over a directory,
   ``devtools/s3proxy.py``). Each copy runs in a fresh subprocess that reports its wall time and
   its peak RSS above idle (``VmHWM`` - ``VmRSS`` before the copy, from ``/proc/self/status``).
3. Random-offset reads (one whole batch at a random position), cold (new manager: empty index cache) and
   warm: store requests per read and latency.
4. Encryption at rest on vs off (``store.encryption``, AES-256-GCM per block): copy to the filesystem store (with
   and without fsync), a whole-segment sequential read and random reads (``--encryption-only`` runs just this).
"""

from __future__ import annotations

import argparse
import atexit
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
                              config=Config(s3={"addressing_style": "path"},
                                            request_checksum_calculation="when_required",
                                            response_checksum_validation="when_required"))
    md = RemoteSegmentMetadata(uuid.UUID(args["segment_id"]), uuid.UUID(int=7), "bench-rsm", 0, 0,
                               args["last_offset"])
    data = LogSegmentData(files[0], files[1], files[2], None, None, b"0\n1\n0 0\n")
    idle_kib = _proc_status_kib("VmRSS")
    t0 = time.perf_counter()
    c0 = time.process_time()
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
    elif kind in ("fs-rsm-enc", "fs-rsm-enc-nofsync"):
        store = FileSystemStore(args["dest"], fsync=kind == "fs-rsm-enc")
        RemoteStorageManager(_encrypted_config(args["key_file"]), store).copy_log_segment_data(md, data)
    elif kind in ("s3-enc-off", "s3-enc-on"):
        store = S3Store(args["bucket"], endpoint_url=args["endpoint"], region_name="us-east-1")
        cfg = _encrypted_config(args["key_file"]) if kind == "s3-enc-on" else RsmConfig()
        RemoteStorageManager(cfg, store).copy_log_segment_data(md, data)
    elif kind == "upload_file":
        for f in files:
            client.upload_file(str(f), args["bucket"], f"plain/{args['segment_id']}/{f.name}",
                               Config=TransferConfig())
    elif kind == "s3-rsm":
        store = S3Store(args["bucket"], client=client, part_size_bytes=8 * MiB)
        RemoteStorageManager(RsmConfig(store="s3", bucket=args["bucket"]), store).copy_log_segment_data(md, data)
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "cpu_seconds": time.process_time() - c0,
            "peak_above_idle_mib": (_proc_status_kib("VmHWM") - idle_kib) / 1024}


def run_worker(args: dict) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", json.dumps(args)], check=True,
                         capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------- reading

def random_reads(store, md, positions: list[tuple[int, int]], n: int, config=None) -> dict:
    from rsm.manager import RemoteStorageManager, RsmConfig

    rng = random.Random(5)
    picks = [positions[rng.randrange(len(positions))] for _ in range(n)]
    out = {}
    for mode in ("cold", "warm"):
        warm = RemoteStorageManager(config or RsmConfig(), store)
        if mode == "warm":
            warm.reader(md)  # load the index once
        reqs, lat = [], []
        for start, end in picks:
            rsm = RemoteStorageManager(config or RsmConfig(), store) if mode == "cold" else warm
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


# ------------------------------------------------------------------------------------------- encryption at rest

def _encrypted_config(key_file: str):
    from rsm.manager import RsmConfig

    return RsmConfig(encryption={"enabled": True, "active_key_id": "bench", "key_file": key_file})


def encryption_overhead(work: Path, seg: dict, rounds: int, reads: int, s3_endpoint: str | None = None) -> None:
    """Encryption on vs off, interleaved round by round (the box is shared: best of ``rounds`` for each): copy to
    the fs store with and without fsync (each in a fresh process), a sequential read of the whole segment and
    random reads; with ``s3_endpoint`` (moto) a copy and a sequential read over S3 too (best of 3); wall and CPU
    seconds (this process's user + system), and the overhead (target < 15%)."""
    import base64

    from rsm.api import LogSegmentData, RemoteSegmentMetadata
    from rsm.log.batch import scan_batches
    from rsm.manager import RemoteStorageManager, RsmConfig
    from rsm.store.fs import FileSystemStore
    from rsm.store.s3 import S3Store

    key_file = work / "bench-keys.json"
    key_file.write_text(json.dumps({"bench": base64.b64encode(os.urandom(32)).decode()}))
    key_file.chmod(0o600)  # else every process warns that others can read it
    size = sum(Path(seg[k]).stat().st_size for k in ("log", "index", "timeindex"))
    log_bytes = Path(seg["log"]).stat().st_size
    configs = {"plain": RsmConfig(), "encrypted": _encrypted_config(str(key_file))}
    md = RemoteSegmentMetadata(uuid.uuid4(), uuid.UUID(int=7), "bench-rsm", 0, 0, seg["last_offset"])
    data = LogSegmentData(Path(seg["log"]), Path(seg["index"]), Path(seg["timeindex"]), None, None, b"0\n0\n")
    stores = {}
    for name, cfg in configs.items():
        stores[name] = FileSystemStore(work / f"enc-reads-{name}", fsync=False)
        RemoteStorageManager(cfg, stores[name]).copy_log_segment_data(md, data)
    best: dict[str, tuple[float, float]] = {}
    peak: dict[str, float] = {}  # the copy's peak RSS above idle, MiB (the most of any round)

    def keep(label: str, wall: float, cpu: float) -> None:
        w, c = best.get(label, (float("inf"), float("inf")))
        best[label] = (min(w, wall), min(c, cpu))

    for _ in range(rounds):
        for kind in ("fs-rsm-nofsync", "fs-rsm-enc-nofsync", "fs-rsm", "fs-rsm-enc"):
            dest = work / f"enc-dest-{uuid.uuid4().hex[:6]}"
            dest.mkdir()
            r = run_worker({"kind": kind, "log": str(seg["log"]), "index": str(seg["index"]),
                            "timeindex": str(seg["timeindex"]), "last_offset": seg["last_offset"],
                            "dest": str(dest), "segment_id": str(uuid.uuid4()), "key_file": str(key_file)})
            shutil.rmtree(dest, ignore_errors=True)
            keep(kind, r["seconds"], r["cpu_seconds"])
            peak[kind] = max(peak.get(kind, 0.0), r["peak_above_idle_mib"])
        for name, cfg in configs.items():
            rsm = RemoteStorageManager(cfg, stores[name])
            t0, c0 = time.perf_counter(), time.process_time()
            n = 0
            with rsm.fetch_log_segment(md, 0) as f:
                while chunk := f.read(8 * MiB):
                    n += len(chunk)
            keep(f"read {name}", time.perf_counter() - t0, time.process_time() - c0)
            if n != log_bytes:
                raise RuntimeError(f"sequential read of {name}: {n} bytes, expected {log_bytes}")
    rows = [("copy, no fsync", "fs-rsm-nofsync", "fs-rsm-enc-nofsync", size),
            ("copy, fsync", "fs-rsm", "fs-rsm-enc", size),
            ("sequential read", "read plain", "read encrypted", log_bytes)]
    if s3_endpoint is not None:
        import boto3

        boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket="bench-enc")
        s3 = S3Store("bench-enc", endpoint_url=s3_endpoint, region_name="us-east-1")
        for _ in range(min(rounds, 3)):
            for kind, name in (("s3-enc-off", "plain"), ("s3-enc-on", "encrypted")):
                sid = uuid.uuid4()
                r = run_worker({"kind": kind, "log": str(seg["log"]), "index": str(seg["index"]),
                                "timeindex": str(seg["timeindex"]), "last_offset": seg["last_offset"],
                                "segment_id": str(sid), "key_file": str(key_file), "endpoint": s3_endpoint,
                                "bucket": "bench-enc"})
                keep(kind, r["seconds"], r["cpu_seconds"])
                m = RemoteSegmentMetadata(sid, uuid.UUID(int=7), "bench-rsm", 0, 0, seg["last_offset"])
                rsm = RemoteStorageManager(configs[name], s3)
                t0, c0 = time.perf_counter(), time.process_time()
                with rsm.fetch_log_segment(m, 0) as f:
                    while f.read(8 * MiB):
                        pass
                keep(f"s3 read {name}", time.perf_counter() - t0, time.process_time() - c0)
                rsm.delete_log_segment_data(m)
        rows += [("copy to S3 (moto)", "s3-enc-off", "s3-enc-on", size),
                 ("sequential read, S3 (moto)", "s3 read plain", "s3 read encrypted", log_bytes)]
    positions = [(h.position, h.end_position - 1) for h in scan_batches(seg["log"], verify_crc=False)]
    randoms = {name: random_reads(stores[name], md, positions, reads, cfg) for name, cfg in configs.items()}
    for name in configs:
        shutil.rmtree(work / f"enc-reads-{name}", ignore_errors=True)

    def pct(plain: float, enc: float) -> str:
        return f"{(enc - plain) / plain * 100:+.0f}%"

    print(f"\nencryption at rest, {size / MiB:.0f} MiB segment, fs store, best of {rounds} interleaved "
          f"(target: overhead < 15%)")
    print(f"{'measure':<28}{'plain MiB/s':>12}{'encrypted':>10}{'wall':>7}{'plain CPU s':>13}{'encrypted':>10}"
          f"{'CPU':>7}")
    for label, plain, enc, n in rows:
        (pw, pc), (ew, ec) = best[plain], best[enc]
        print(f"{label:<28}{n / MiB / pw:>12.0f}{n / MiB / ew:>10.0f}{pct(pw, ew):>7}{pc:>13.2f}{ec:>10.2f}"
              f"{pct(pc, ec):>7}")
    print(f"copy memory above idle (most of any round), no fsync: plain {peak['fs-rsm-nofsync']:.1f} MiB, "
          f"encrypted {peak['fs-rsm-enc-nofsync']:.1f} MiB")
    print(f"{'random read':<14}{'mode':<6}{'req max':>9}{'p50 ms plain':>14}{'encrypted':>11}")
    for mode in ("cold", "warm"):
        rp, re_ = randoms["plain"][mode], randoms["encrypted"][mode]
        print(f"{'':<14}{mode:<6}{re_['requests_max']:>9}{rp['p50_ms']:>14.2f}{re_['p50_ms']:>11.2f}")
    print("(random read: one batch; encrypted, the whole 4 MiB block is read and authenticated, plain stops after"
          " the batch)")


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
    ap.add_argument("--s3-size-mib", type=int, default=512, help="the segment copied to S3 (moto, s3proxy)")
    ap.add_argument("--reads", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2, help="best of N for each copy")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--throttle-seconds", type=float, default=30.0, help="length of the throttle accuracy run")
    ap.add_argument("--encryption-only", action="store_true", help="only the encryption on/off rows")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(json.loads(a.worker))))
        return

    import boto3
    from botocore.config import Config
    from moto.server import ThreadedMotoServer

    from devtools.s3proxy import S3ProxyServer
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
    if a.encryption_only:
        import logging

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
        moto.start()
        host, port = moto.get_host_and_port()
        encryption_overhead(work, mid, a.rounds, a.reads, f"http://{host}:{port}")
        moto.stop()
        shutil.rmtree(work, ignore_errors=True)
        return

    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0)
    server.start()
    host, port = server.get_host_and_port()
    s3proxy = S3ProxyServer(identity=os.environ["AWS_ACCESS_KEY_ID"], credential=os.environ["AWS_SECRET_ACCESS_KEY"])
    s3proxy.start()
    atexit.register(s3proxy.stop)  # the java process goes with this one, even when a step fails
    endpoints = {"moto": f"http://{host}:{port}", "s3proxy": s3proxy.endpoint_url}
    clients = {name: boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                                  config=Config(s3={"addressing_style": "path"},
                                                request_checksum_calculation="when_required",
                                                response_checksum_validation="when_required"))
               for name, url in endpoints.items()}
    for c in clients.values():
        c.create_bucket(Bucket="bench")

    rows = []

    def best(kind: str, seg: dict, extra: dict) -> dict:
        results = []
        for _ in range(a.rounds):
            dest = work / f"dest-{uuid.uuid4().hex[:6]}"
            dest.mkdir()
            args = {"kind": kind, "log": str(seg["log"]), "index": str(seg["index"]),
                    "timeindex": str(seg["timeindex"]), "last_offset": seg["last_offset"], "dest": str(dest),
                    "segment_id": str(uuid.uuid4()), "bucket": "bench", **extra}
            results.append(run_worker(args))
            shutil.rmtree(dest, ignore_errors=True)
        return min(results, key=lambda r: r["seconds"])

    print("copying ...", flush=True)
    fs = {k: best(k, big, {}) for k in ("cp", "cp+fsync", "fs-rsm", "fs-rsm-nofsync")}
    s3 = {f"{name} {k}": best(k, mid, {"endpoint": url}) for name, url in endpoints.items()
          for k in ("upload_file", "s3-rsm")}
    for k, r in fs.items():
        rows.append((k, big_bytes, r))
    for k, r in s3.items():
        rows.append((k, mid_bytes, r))

    print(f"\n{'copy':<22}{'bytes':>12}{'seconds':>10}{'MiB/s':>10}{'peak RSS above idle MiB':>26}")
    for k, n, r in rows:
        print(f"{k:<22}{n:>12}{r['seconds']:>10.2f}{n / MiB / r['seconds']:>10.0f}{r['peak_above_idle_mib']:>26.1f}")
    print(f"\nfs store vs cp (throughput ratio, target >= 0.9): with fsync "
          f"{fs['cp']['seconds'] / fs['fs-rsm']['seconds']:.2f}x of cp, "
          f"{fs['cp+fsync']['seconds'] / fs['fs-rsm']['seconds']:.2f}x of cp+fsync; without fsync "
          f"{fs['cp']['seconds'] / fs['fs-rsm-nofsync']['seconds']:.2f}x of cp")
    for name in endpoints:
        print(f"S3 vs upload_file on {name} (target >= 0.8): "
              f"{s3[f'{name} upload_file']['seconds'] / s3[f'{name} s3-rsm']['seconds']:.2f}x")
    print(f"copy memory, {a.size_mib} MiB segment to fs: {fs['fs-rsm']['peak_above_idle_mib']:.1f} MiB above idle "
          f"(target < 64); {a.s3_size_mib} MiB to S3: "
          + ", ".join(f"{s3[f'{name} s3-rsm']['peak_above_idle_mib']:.1f} MiB ({name})" for name in endpoints))

    encryption_overhead(work, mid, a.rounds, a.reads)

    # random reads over the segment copied to each store
    positions = [(h.position, h.end_position - 1) for h in scan_batches(mid["log"], verify_crc=False)]
    md = RemoteSegmentMetadata(uuid.uuid4(), uuid.UUID(int=7), "bench-rsm", 0, 0, mid["last_offset"])
    from rsm.api import LogSegmentData
    from rsm.manager import RemoteStorageManager, RsmConfig

    data = LogSegmentData(Path(mid["log"]), Path(mid["index"]), Path(mid["timeindex"]), None, None, b"0\n0\n")
    stores = {"fs": FileSystemStore(work / "reads-fs"),
              **{f"s3 {name}": S3Store("bench", client=c) for name, c in clients.items()}}
    print(f"\n{'random read':<14}{'mode':<6}{'req max':>9}{'req mean':>10}{'p50 ms':>9}{'max ms':>9}")
    for name, store in stores.items():
        RemoteStorageManager(RsmConfig(), store).copy_log_segment_data(md, data)
        res = random_reads(store, md, positions, a.reads)
        for mode, r in res.items():
            print(f"{name:<14}{mode:<6}{r['requests_max']:>9}{r['requests_mean']:>10.2f}{r['p50_ms']:>9.2f}"
                  f"{r['max_ms']:>9.2f}")
    # context: what the endpoint itself costs for one 4 MiB ranged GET (the size of one block)
    for name, client in clients.items():
        data_key = RemoteStorageManager(RsmConfig(), stores[f"s3 {name}"]).keys(md).data(0)
        size = stores[f"s3 {name}"].head(data_key)
        lat = []
        rng = random.Random(9)
        for _ in range(min(a.reads, 20)):
            start = rng.randrange(0, size - 4 * MiB)
            t0 = time.perf_counter()
            rng_header = f"bytes={start}-{start + 4 * MiB - 1}"
            body = client.get_object(Bucket="bench", Key=data_key, Range=rng_header)["Body"].read()
            lat.append(time.perf_counter() - t0)
            assert len(body) == 4 * MiB
        label = f"{name} raw"
        print(f"{label:<14}{'GET':<6}{1:>9}{1:>10.2f}{statistics.median(lat) * 1000:>9.2f}{max(lat) * 1000:>9.2f}")
    print("(targets: cold <= 2 requests, warm 1; one read = one whole batch at a random position, 4 MiB blocks;"
          " 'raw GET' is boto3 get_object of one 4 MiB range, for scale)")
    server.stop()
    s3proxy.stop()
    shutil.rmtree(work, ignore_errors=True)

    print(f"\nthrottle: 4 threads, 64 KiB acquires, {a.throttle_seconds:.0f} s (target: within 5%)")
    print(f"{'phase':<26}{'MiB/s set':>10}{'MiB/s got':>11}{'error %':>9}")
    for phase, want, got in throttle_accuracy(50 * MiB, a.throttle_seconds):
        print(f"{phase:<26}{want / MiB:>10.1f}{got / MiB:>11.2f}{(got - want) / want * 100:>9.2f}")


if __name__ == "__main__":
    main()
