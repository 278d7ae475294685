"""History endpoint benchmark: a Java consumer reading history from the endpoint, from Kafka's own tiered storage,
and from a broker's local log. Same records, same machine, same client.

    ./dev bench bench_history [--gib 1] [--segment-mib 64] [--repeat 3] [--partition-fetch-mib N]
                              [--consumer-property K=V ...] [--py-spy FILE]

One broker (KRaft, 127.0.0.1) runs with Kafka's tiered storage enabled and Kafka's ``LocalTieredStorage`` (from the
``kafka-storage`` test jar) as its RemoteStorageManager, as in ``bench_sidecar``. Three topics of one partition get
the same records (``--gib`` each; 1 KiB values, keys, no compression by default):

- ``sidecar``: tiered by the sidecar (in-process, filesystem store), then the topic's retention cut to one byte so
  the broker deletes every rolled segment; read through the history endpoint (:func:`rlm.history.start_history`,
  started in this process once the sidecar has stopped, so this process's CPU is the endpoint's);
- ``kafka-tiered``: ``remote.storage.enable=true`` from the start; ``local.retention.ms`` cut once every rolled
  segment is remote: the broker serves it from ``LocalTieredStorage``;
- ``local``: a plain topic; the broker serves it from its log.

Each is read from offset 0, the same number of records (every offset all three hold remotely / locally), by Kafka's
console consumer (``--partition 0 --offset earliest``, ``NoOpMessageFormatter``, full JIT, the consumer's default
fetch sizes unless ``--partition-fetch-mib``; ``ConsumerPerformance`` subscribes with a group, which the endpoint
does not serve), ``--repeat`` times, the sources taking turns; the best run counts. The read window starts when the
consumer logs its position reset (``Resetting offset for partition``: after JVM start-up, Metadata and ListOffsets,
before the first Fetch; log timestamps in ms) and ends when the process exits. Stores and local logs were just
written: the page cache is warm for all three.

CPU is the server process's, user + system, from ``/proc/<pid>/stat`` at the window's ends: this Python process
(the endpoint: its asyncio loop and worker threads; nothing else runs in it meanwhile) or the broker's JVM. The
consumer's own CPU (whole process, from ``wait4``) is shown beside it.
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_sidecar import kafka_tiered_storage_config, set_topic_config, wait_until  # noqa: E402

MiB = 1024 * 1024
GiB = 1024 * MiB
VALUE_BYTES = 1024
TICKS = os.sysconf("SC_CLK_TCK")
POSITION_RESET = b"Resetting offset for partition"  # the consumer's INFO line once ListOffsets answered


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14, 15 of proc(5))


def produce(bootstrap: str, topics: list[str], total_bytes: int, codec: str) -> int:
    """The same records, in the same order, to every topic; returns the number of records per topic."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 256 * 1024,
                  "compression.type": codec, "queue.buffering.max.kbytes": 512 * 1024, "acks": "1"})
    rng = random.Random(11)
    pool = rng.randbytes(VALUE_BYTES * 64)
    n = total_bytes // (VALUE_BYTES + 40)
    for i in range(n):
        j = i % 63
        value, key = pool[j * VALUE_BYTES: (j + 1) * VALUE_BYTES], b"key-%010d" % i
        for topic in topics:
            while True:
                try:
                    p.produce(topic, value, key, partition=0)
                    break
                except BufferError:
                    p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    if p.flush(300):
        raise RuntimeError("messages left undelivered")
    return n


@dataclass
class Run:
    records: int
    window_s: float     # the consumer's position reset -> its exit
    total_s: float      # process start -> exit
    server_cpu_s: float
    client_cpu_s: float
    fetches: int = 0    # Fetch requests the endpoint answered (endpoint runs only)
    fetch_s: float = 0  # the time it took answering them, frame read to response built (Fetch waits included)


def fetch_latency() -> tuple[float, float]:
    """(seconds, count) of the endpoint's Fetch answers so far (``rlm_history_request_seconds``)."""
    from prometheus_client import REGISTRY

    labels = {"api": "fetch"}
    return (REGISTRY.get_sample_value("rlm_history_request_seconds_sum", labels) or 0.0,
            REGISTRY.get_sample_value("rlm_history_request_seconds_count", labels) or 0.0)


def consume(kc, bootstrap: str, topic: str, records: int, server_pid: int, fetch_mib: int | None,  # noqa: ANN001
            work: Path, properties: list[str] = ()) -> Run:  # type: ignore[assignment]
    """Kafka's console consumer reading ``records`` records of partition 0 from offset 0. The read window starts
    when the consumer logs its position reset to offset 0 (after Metadata and ListOffsets, before the first Fetch);
    the server's CPU is sampled then from a thread watching the consumer's log."""
    args = ["--bootstrap-server", bootstrap, "--topic", topic, "--partition", "0", "--offset", "earliest",
            "--max-messages", str(records), "--timeout-ms", "60000",
            "--formatter", "org.apache.kafka.tools.consumer.NoOpMessageFormatter"]
    if fetch_mib:
        args += ["--command-property", f"max.partition.fetch.bytes={fetch_mib * MiB}",
                 "--command-property", f"fetch.max.bytes={max(50, fetch_mib) * MiB}"]
    for prop in properties:
        args += ["--command-property", prop]
    log_dir = work / f"consumer-{uuid.uuid4().hex[:6]}"
    log_dir.mkdir()
    log = log_dir / "broker.log"  # config/kafka-log4j2.xml: INFO, "[yyyy-MM-dd HH:mm:ss,SSS] LEVEL message"
    cmd = kc.java_cmd("org.apache.kafka.tools.consumer.ConsoleConsumer", args, heap="1g", log_dir=log_dir,
                      tool=False)
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    mark: list[tuple[float, float]] = []  # (wall clock of the reset, server CPU then)
    done = threading.Event()

    def watch() -> None:
        pos = 0
        while not done.is_set() and not mark:
            if log.exists():
                with open(log, "rb") as f:
                    f.seek(pos)
                    chunk = f.read()
                for line in chunk.splitlines():
                    if POSITION_RESET in line:
                        cpu = cpu_seconds(server_pid)
                        stamp = line[1:line.index(b"]")].decode()
                        mark.append((datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp(), cpu))
                        return
                pos += len(chunk) - len(chunk.rsplit(b"\n", 1)[-1])
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    stderr = proc.stderr.read()  # type: ignore[union-attr]
    _pid, status, usage = os.wait4(proc.pid, 0)
    end_wall, end_cpu, end = time.time(), cpu_seconds(server_pid), time.monotonic()
    proc.returncode = os.waitstatus_to_exitcode(status)
    done.set()
    watcher.join(10)
    err = stderr.decode(errors="replace")
    if proc.returncode != 0 or not mark:
        raise RuntimeError(f"console consumer on {topic} exited {proc.returncode} (position reset logged: "
                           f"{bool(mark)}):\n{err[-3000:]}")
    got = next((int(w) for ln in err.splitlines() if "Processed a total of" in ln for w in ln.split() if w.isdigit()),
               -1)
    if got != records:
        raise RuntimeError(f"console consumer on {topic} read {got} records, expected {records}:\n{err[-3000:]}")
    t0, c0 = mark[0]
    return Run(records, end_wall - t0, end - started, end_cpu - c0, usage.ru_utime + usage.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0, help="data per topic (GiB)")
    ap.add_argument("--segment-mib", type=int, default=64, help="segment.bytes of every topic")
    ap.add_argument("--codec", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    ap.add_argument("--repeat", type=int, default=3, help="reads per source; the best counts")
    ap.add_argument("--partition-fetch-mib", type=int, default=None,
                    help="the consumer's max.partition.fetch.bytes (default: the client's, 1 MiB)")
    ap.add_argument("--consumer-property", action="append", default=[], metavar="KEY=VALUE",
                    help="a consumer setting for every read (repeatable), e.g. check.crcs=false")
    ap.add_argument("--py-spy", type=Path, default=None,
                    help="record the endpoint's last read with py-spy (on PATH) into this file (collapsed stacks)")
    args = ap.parse_args()

    logging.basicConfig(level=logging.WARNING)
    from devtools.devkafka import KafkaCluster
    from rlm.config import SidecarSettings
    from rlm.history import start_history
    from rlm.sidecar import Sidecar
    from rlmm.api import PartitionNotServedError, TopicIdPartition
    from rsm.log.partition import PartitionDir
    from rsm.manager import RemoteStorageManager

    work = Path(tempfile.mkdtemp(prefix="bench-history-"))
    results: dict[str, list[Run]] = {}
    try:
        kafka_remote = work / "kafka-remote"
        kafka_remote.mkdir()
        with KafkaCluster(brokers=1, broker_config=kafka_tiered_storage_config(kafka_remote), heap="1g") as kc:
            seg = {"segment.bytes": str(args.segment_mib * MiB), "retention.ms": "-1", "retention.bytes": "-1"}
            ours, theirs, local = "history-sidecar", "history-kafka-tiered", "history-local"
            topic_id = kc.create_topic(ours, 1, config=seg)
            kc.create_topic(theirs, 1, config={**seg, "remote.storage.enable": "true"})
            kc.create_topic(local, 1, config=seg)
            t0 = time.perf_counter()
            n = produce(kc.bootstrap_servers, [ours, theirs, local], int(args.gib * GiB), args.codec)
            print(f"produced {n:,} records x 3 topics in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
            pdirs = {t: kc.log_dir() / f"{t}-0" for t in (ours, theirs, local)}
            ends = {t: PartitionDir(d).rolled_ranges()[-1][1] for t, d in pdirs.items()}

            # The sidecar tiers ours; then the broker's local copy of it goes.
            tag = uuid.uuid4().hex[:8]
            settings = SidecarSettings(**{
                "broker_id": 1, "log_dirs": [str(d) for d in kc.node(1).log_dirs],
                "staging_dir": str(work / "staging"),
                "kafka": {"bootstrap_servers": kc.bootstrap_servers},
                "store": {"store": "fs", "root_path": str(work / "sidecar-remote")},
                "metadata": {"topic": f"__rlm_md_{tag}", "partitions": 3, "replication_factor": 1,
                             "state_dir": str(work / "sidecar-state"), "to_be_deleted_topic": f"__rlm_tbd_{tag}"},
                "tasks": {"copy_interval_ms": 500, "discovery_interval_ms": 500},
                "topics": {"include": [ours]},
                "retention": [{"pattern": ".*", "retention_ms": -1, "retention_bytes": -1}],
                "history_listener": {"host": "127.0.0.1", "port": 0,
                                     "authorization": {"allow_if_no_authorizer": True}},  # dev cluster: no authorizer
                "listen": {"host": "127.0.0.1", "port": 0}, "log_format": "text", "log_level": "WARNING"})
            tp = TopicIdPartition(topic_id, ours, 0)
            t0 = time.perf_counter()
            sidecar = Sidecar(settings).start()
            try:
                def tiered() -> bool:
                    try:
                        return (sidecar.reader.latest_offset(tp) or -1) >= ends[ours]
                    except PartitionNotServedError:
                        return False
                wait_until(tiered, 1200, "the sidecar to tier every rolled segment", 0.5)
            finally:
                sidecar.stop()
            print(f"sidecar tiered {ends[ours] + 1:,} records in {time.perf_counter() - t0:.1f}s", file=sys.stderr)

            def kafka_tiered() -> bool:  # LocalTieredStorage: <offset>-<uuid>.<type>, every type once remote
                types: dict[str, set[str]] = {}
                for p in kafka_remote.rglob("*"):
                    if p.is_file():
                        stem, _, suffix = p.name.rpartition(".")
                        types.setdefault(stem, set()).add(suffix)
                need = {"log", "index", "timeindex", "leader_epoch_checkpoint"}
                return sum(need <= t for t in types.values()) >= len(PartitionDir(pdirs[theirs]).rolled_ranges())
            wait_until(kafka_tiered, 1200, "Kafka's tiered storage to copy every rolled segment", 0.5)
            set_topic_config(kc.bootstrap_servers, ours, {"retention.bytes": "1"})
            set_topic_config(kc.bootstrap_servers, theirs, {"local.retention.ms": "1000"})
            for t in (ours, theirs):
                wait_until(lambda t=t: not PartitionDir(pdirs[t]).rolled_ranges(), 300,
                           f"the broker to delete {t}'s rolled segments locally", 0.5)
            records = min(ends.values()) + 1
            rolled = PartitionDir(pdirs[local]).rolled_ranges()
            log_bytes = sum((pdirs[local] / f"{base:020d}.log").stat().st_size for base, _ in rolled)
            read_bytes = records * log_bytes / (rolled[-1][1] + 1)  # the log bytes of the records read (estimate)

            history = start_history(settings, RemoteStorageManager(settings.store))
            try:
                endpoint = f"127.0.0.1:{history.port}"
                broker_pid = kc.node(1).process.pid  # type: ignore[union-attr]
                sources = [("history endpoint (sidecar tier)", endpoint, ours, os.getpid()),
                           ("broker, Kafka tiered storage", kc.bootstrap_servers, theirs, broker_pid),
                           ("broker, local log", kc.bootstrap_servers, local, broker_pid)]
                load = [os.getloadavg()[0]]
                for r in range(args.repeat):
                    for name, bootstrap, topic, pid in sources:
                        spy = None
                        if args.py_spy and pid == os.getpid() and r == args.repeat - 1:
                            spy = subprocess.Popen([shutil.which("py-spy") or "py-spy", "record", "-p", str(pid),
                                                    "-o", str(args.py_spy), "-f", "raw", "-r", "250"],
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                            time.sleep(1.0)
                        before = fetch_latency()
                        run = consume(kc, bootstrap, topic, records, pid, args.partition_fetch_mib, work,
                                      args.consumer_property)
                        if pid == os.getpid():
                            after = fetch_latency()
                            run.fetches = int(after[1] - before[1])
                            run.fetch_s = after[0] - before[0]
                        if spy is not None:
                            spy.send_signal(2)
                            spy.wait(60)
                        results.setdefault(name, []).append(run)
                        print(f"  {name}: {run.window_s:.2f}s ({run.total_s:.2f}s with JVM start), server CPU "
                              f"{run.server_cpu_s:.2f}s", file=sys.stderr)
                load.append(os.getloadavg()[0])
            finally:
                history.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    gib_read = read_bytes / GiB
    best = {name: min(runs, key=lambda x: x.window_s) for name, runs in results.items()}
    local_rate = read_bytes / MiB / best["broker, local log"].window_s
    remote_rate = read_bytes / MiB / best["broker, Kafka tiered storage"].window_s
    head = (f"{'source':34} {'MiB/s':>8} {'seconds':>8} {'vs Kafka remote':>16} {'vs local':>9} "
            f"{'server CPU s/GiB':>17} {'client CPU s/GiB':>17}")
    print()
    print(head)
    for name, run in best.items():
        rate = read_bytes / MiB / run.window_s
        print(f"{name:34} {rate:>8,.0f} {run.window_s:>8.2f} {rate / remote_rate:>15.2f}x {rate / local_rate:>8.2f}x "
              f"{run.server_cpu_s / gib_read:>17.2f} {run.client_cpu_s / gib_read:>17.2f}")
    extra = "".join(f", {c}" for c in args.consumer_property)
    print(f"\n{records:,} records ({gib_read:.2f} GiB of log), {VALUE_BYTES} B values, codec {args.codec}, "
          f"{args.segment_mib} MiB segments, 1 partition; Kafka's console consumer, max.partition.fetch.bytes "
          f"{args.partition_fetch_mib or 1} MiB{extra}; best of {args.repeat}; {os.cpu_count()} cores. Server CPU: the "
          f"endpoint's Python process / the broker's JVM (/proc/<pid>/stat); client CPU: the consumer's JVM, "
          f"start-up included. Load average (1 min) before / after the reads: {load[0]:.1f} / {load[1]:.1f}.")
    ob = best["history endpoint (sidecar tier)"]
    if ob.fetches:
        print(f"Endpoint, best run: {ob.fetches} Fetch requests, {ob.fetch_s / ob.fetches * 1e3:.2f} ms each to answer "
              f"(frame read to response built), {ob.window_s / ob.fetches * 1e3:.2f} ms per request-response cycle "
              f"(the consumer has one Fetch in flight per broker).")


if __name__ == "__main__":
    main()
