"""Sidecar benchmark: tiering throughput next to ``cp`` and next to Kafka's own tiered storage; remote reads.

    .venv/bin/python bench/bench_sidecar.py [--total-mib 1024] [--segment-mib 32] [--reads 200]

One broker (KRaft, 127.0.0.1) runs with Kafka's tiered storage enabled system-wide and Kafka's
``LocalTieredStorage`` (from the ``kafka-storage`` test jar) as its RemoteStorageManager. Two topics get the same
records (1 KiB values, no compression), ``--total-mib`` each, in ``--segment-mib`` segments:

1. ``cp`` of the first topic's rolled segment files (.log, .index, .timeindex) into a fresh directory.
2. The sidecar (filesystem store, in-process) backfills the first topic: started after the data is there.
3. Kafka's own tiering backfills the second topic: ``remote.storage.enable=true`` set after the data is there.

Both tiering runs are measured two ways: end to end (sidecar start / config change until the last rolled segment is
remote: includes start-up and task intervals) and the copy window (first to last remote object written, from file
mtimes, scaled by N/(N-1) since the first object's own copy precedes its mtime). Both stores are plain files on
the same disk, so the window compares the copy paths.

Reads: the sidecar's remote reader, sequential over the whole topic and one-batch reads at random offsets (cold: a
new storage manager with an empty index cache per read; warm: one manager); next to Kafka serving the second topic
from its remote tier to a consumer (local segments deleted by ``local.retention.ms``), and next to decoding the
local segment files directly (the floor: no store in the way).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.kafka_tiered import kafka_remote_segments, kafka_tiered_storage_config, set_topic_config  # noqa: E402

MiB = 1024 * 1024
VALUE_BYTES = 1024


def produce(bootstrap: str, topic: str, total_bytes: int) -> int:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 256 * 1024,
                  "compression.type": "none", "queue.buffering.max.kbytes": 256 * 1024, "acks": "1"})
    rng = random.Random(7)
    pool = rng.randbytes(VALUE_BYTES * 64)
    n = total_bytes // (VALUE_BYTES + 40)
    for i in range(n):
        j = i % 63
        while True:
            try:
                p.produce(topic, pool[j * VALUE_BYTES: (j + 1) * VALUE_BYTES + 17], f"k{i}".encode())
                break
            except BufferError:
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    if p.flush(120):
        raise RuntimeError(f"producing to {topic}: messages left undelivered")
    return n


def wait_until(cond, timeout_s: float, what: str, interval_s: float = 0.05):  # noqa: ANN001, ANN201
    deadline = time.monotonic() + timeout_s
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


def copy_window_s(files: list[Path], n_segments: int) -> float:
    mtimes = sorted(f.stat().st_mtime for f in files)
    return (mtimes[-1] - mtimes[0]) * n_segments / max(1, n_segments - 1)


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


# ------------------------------------------------------------------------------------------------------ phases
def bench_cp(pdir: Path, ranges: list[tuple[int, int]], dest: Path) -> float:
    files = [str(pdir / f"{base:020d}{suffix}") for base, _ in ranges for suffix in (".log", ".index", ".timeindex")]
    dest.mkdir()
    t0 = time.perf_counter()
    subprocess.run(["cp", *files, str(dest)], check=True)
    subprocess.run(["sync", "-f", str(dest)], check=True)
    return time.perf_counter() - t0


def sidecar_settings(kc, topic: str, work: Path):  # noqa: ANN001, ANN201
    from rlm.config import SidecarSettings

    tag = uuid.uuid4().hex[:8]
    return SidecarSettings(**{
        "broker_id": 1,
        "log_dirs": [str(d) for d in kc.node(1).log_dirs],
        "staging_dir": str(work / "staging"),
        "kafka": {"bootstrap_servers": kc.bootstrap_servers},
        "store": {"store": "fs", "root_path": str(work / "sidecar-remote")},
        "metadata": {"topic": f"__rlm_md_{tag}", "partitions": 3, "replication_factor": 1,
                     "state_dir": str(work / "sidecar-state"), "to_be_deleted_topic": f"__rlm_tbd_{tag}"},
        "tasks": {"copy_interval_ms": 500, "discovery_interval_ms": 500},
        "topics": {"include": [topic]},
        "retention": [{"pattern": ".*", "retention_ms": -1, "retention_bytes": -1}],
        "listen": {"host": "127.0.0.1", "port": 0},
        "log_format": "text",
    })


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--total-mib", type=int, default=1024, help="data per topic")
    ap.add_argument("--segment-mib", type=int, default=32, help="segment.bytes of both topics")
    ap.add_argument("--reads", type=int, default=200, help="random-offset reads, cold and warm each")
    args = ap.parse_args()

    import logging

    logging.basicConfig(level=logging.WARNING)
    from confluent_kafka import Consumer, TopicPartition

    from devtools.devkafka import KafkaCluster
    from rlm.sidecar import Sidecar
    from rlm.tier import RemoteReader
    from rlmm.api import TopicIdPartition
    from rsm.log.batch import iter_batches_with_bytes
    from rsm.log.partition import PartitionDir
    from rsm.log.records import iter_raw_records
    from rsm.manager import RemoteStorageManager

    work = Path(tempfile.mkdtemp(prefix="bench-sidecar-"))
    rows: list[tuple[str, str, str]] = []
    try:
        kafka_remote = work / "kafka-remote"
        kafka_remote.mkdir()
        with KafkaCluster(brokers=1, broker_config=kafka_tiered_storage_config(kafka_remote),
                          heap="1g") as kc:
            seg_cfg = {"segment.bytes": str(args.segment_mib * MiB), "retention.ms": "-1",
                       "retention.bytes": "-1"}
            ours, theirs = "bench-sidecar", "bench-kafka-tiered"
            topic_id = kc.create_topic(ours, 1, config=seg_cfg)
            kc.create_topic(theirs, 1, config=seg_cfg)
            t0 = time.perf_counter()
            n_records = produce(kc.bootstrap_servers, ours, args.total_mib * MiB)
            produce(kc.bootstrap_servers, theirs, args.total_mib * MiB)
            print(f"produced {n_records} records x 2 topics in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
            pdir_ours = kc.log_dir() / f"{ours}-0"
            pdir_theirs = kc.log_dir() / f"{theirs}-0"
            ranges = PartitionDir(pdir_ours).rolled_ranges()
            ranges_theirs = PartitionDir(pdir_theirs).rolled_ranges()
            seg_bytes = sum((pdir_ours / f"{b:020d}.log").stat().st_size for b, _ in ranges)
            seg_bytes_theirs = sum((pdir_theirs / f"{b:020d}.log").stat().st_size for b, _ in ranges_theirs)
            n_seg = len(ranges)
            last_end = ranges[-1][1]
            print(f"{n_seg} rolled segments, {seg_bytes / MiB:.0f} MiB (ours); {len(ranges_theirs)} segments, "
                  f"{seg_bytes_theirs / MiB:.0f} MiB (Kafka's)", file=sys.stderr)

            # Warm the page cache for everyone: every copy below reads from memory.
            for base, _ in ranges:
                with open(pdir_ours / f"{base:020d}.log", "rb") as f:
                    while f.read(8 * MiB):
                        pass

            # 1. cp
            cp_s = bench_cp(pdir_ours, ranges, work / "cp")
            rows.append(("copy: cp (+ sync)", f"{seg_bytes / MiB / cp_s:,.0f} MB/s", f"{cp_s:.2f} s"))

            # 2. the sidecar
            tp = TopicIdPartition(topic_id, ours, 0)
            settings = sidecar_settings(kc, ours, work)
            t0 = time.perf_counter()
            sidecar = Sidecar(settings).start()
            try:
                wait_until(lambda: (sidecar.reader.latest_offset(tp) or -1) >= last_end
                           if tp in _served(sidecar, tp) else False, 600, "the sidecar to tier every segment")
                e2e = time.perf_counter() - t0
                objs = [p for p in Path(settings.store.root_path).rglob("*") if p.is_file()
                        and ".tmp" not in p.parts]
                window = copy_window_s(objs, n_seg)
                rows.append(("copy: sidecar, end to end", f"{seg_bytes / MiB / e2e:,.0f} MB/s", f"{e2e:.2f} s"))
                rows.append(("copy: sidecar, copy window", f"{seg_bytes / MiB / window:,.0f} MB/s",
                             f"{window:.2f} s"))
                # The storage manager's share (the rest: metadata writes and their read-your-writes waits).
                from prometheus_client import REGISTRY

                rsm_s = REGISTRY.get_sample_value("rlm_copy_seconds_sum") or float("nan")
                rows.append(("copy: sidecar, storage manager only", f"{seg_bytes / MiB / rsm_s:,.0f} MB/s",
                             f"{rsm_s:.2f} s"))

                # Reads through the sidecar's reader (in-process, filesystem store).
                t0 = time.perf_counter()
                count = nbytes = 0
                for r in sidecar.reader.read(tp, 0, to_offset_inclusive=last_end):
                    count += 1
                    nbytes += len(r.value or b"") + len(r.key or b"")
                read_s = time.perf_counter() - t0
                assert count == last_end + 1, (count, last_end)
                rows.append(("read: sidecar reader, sequential",
                             f"{count / read_s:,.0f} rec/s, {seg_bytes / MiB / read_s:,.0f} MB/s",
                             f"{read_s:.2f} s"))
                rng = random.Random(3)
                offsets = [rng.randrange(0, last_end + 1) for _ in range(args.reads)]
                cold, warm = [], []
                for off in offsets:
                    rsm = RemoteStorageManager(settings.store)
                    reader = RemoteReader(sidecar.rlmm, rsm)
                    t0 = time.perf_counter()
                    rec = next(reader.read(tp, off, max_bytes=1))
                    cold.append(time.perf_counter() - t0)
                    assert rec.offset <= off
                reader = RemoteReader(sidecar.rlmm, RemoteStorageManager(settings.store))
                for off in offsets:
                    next(reader.read(tp, off, max_bytes=1))
                for off in offsets:
                    t0 = time.perf_counter()
                    next(reader.read(tp, off, max_bytes=1))
                    warm.append(time.perf_counter() - t0)
                for name, xs in (("cold", cold), ("warm", warm)):
                    rows.append((f"read: sidecar, random offset, {name}",
                                 f"p50 {percentile(xs, 0.5) * 1e3:.2f} ms, p99 {percentile(xs, 0.99) * 1e3:.2f} ms",
                                 f"{len(xs)} reads"))
            finally:
                sidecar.stop()

            # Decoding the same local files directly: the floor under any remote read.
            t0 = time.perf_counter()
            count = 0
            for base, _ in ranges:
                for h, data in iter_batches_with_bytes(pdir_ours / f"{base:020d}.log"):
                    for _r in iter_raw_records(h, data):
                        count += 1
            local_s = time.perf_counter() - t0
            rows.append(("read: local segment files decoded", f"{count / local_s:,.0f} rec/s, "
                         f"{seg_bytes / MiB / local_s:,.0f} MB/s", f"{local_s:.2f} s"))

            # 3. Kafka's own tiered storage
            t0 = time.perf_counter()
            set_topic_config(kc.bootstrap_servers, theirs, {"remote.storage.enable": "true"})
            n_theirs = len(ranges_theirs)

            wait_until(lambda: kafka_remote_segments(kafka_remote) >= n_theirs, 900,
                       "Kafka's tiered storage to copy every segment")
            e2e = time.perf_counter() - t0
            objs = [p for p in kafka_remote.rglob("*") if p.is_file()]
            window = copy_window_s(objs, n_theirs)
            rows.append(("copy: Kafka LocalTieredStorage, end to end",
                         f"{seg_bytes_theirs / MiB / e2e:,.0f} MB/s", f"{e2e:.2f} s"))
            rows.append(("copy: Kafka LocalTieredStorage, copy window",
                         f"{seg_bytes_theirs / MiB / window:,.0f} MB/s", f"{window:.2f} s"))

            # Kafka serving the topic from its remote tier: delete the local copies, then consume from 0.
            set_topic_config(kc.bootstrap_servers, theirs, {"local.retention.ms": "1000"})
            theirs_last = ranges_theirs[-1][1]
            wait_until(lambda: not PartitionDir(pdir_theirs).rolled_ranges(), 300,
                       "the broker to delete the tiered segments locally", 0.5)
            c = Consumer({"bootstrap.servers": kc.bootstrap_servers, "group.id": "bench", "enable.auto.commit": False,
                          "fetch.max.bytes": 64 * MiB, "max.partition.fetch.bytes": 16 * MiB})
            c.assign([TopicPartition(theirs, 0, 0)])
            t0 = time.perf_counter()
            count = 0
            last = -1
            while last < theirs_last:
                for m in c.consume(min(10_000, theirs_last - last), 10):  # consume(n, timeout) waits for n
                    # records or the timeout: no more than are left (asking 10,000 waited up to 10 s at the end)
                    if m.error():
                        raise RuntimeError(str(m.error()))
                    count += 1
                    last = m.offset()
                if time.perf_counter() - t0 > 600:
                    raise TimeoutError("consuming Kafka's remote tier")
            kread_s = time.perf_counter() - t0
            c.close()
            rows.append(("read: Kafka remote tier -> consumer, sequential",
                         f"{count / kread_s:,.0f} rec/s, {seg_bytes_theirs / MiB / kread_s:,.0f} MB/s",
                         f"{kread_s:.2f} s"))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    w = max(len(r[0]) for r in rows)
    w2 = max(len(r[1]) for r in rows)
    print(f"\n{'':<{w}}  {'throughput / latency':<{w2}}  time")
    for name, rate, t in rows:
        print(f"{name:<{w}}  {rate:<{w2}}  {t}")
    print(f"\n{args.total_mib} MiB per topic, {args.segment_mib} MiB segments, {VALUE_BYTES} B values, "
          f"{os.cpu_count()} cores; page cache warm for every copy")


def _served(sidecar, tp) -> set:  # noqa: ANN001
    """{tp} once the sidecar serves the partition's metadata (reads before that raise)."""
    from rlmm.api import PartitionNotServedError

    try:
        sidecar.reader.segments(tp)
        return {tp}
    except PartitionNotServedError:
        return set()


if __name__ == "__main__":
    main()
