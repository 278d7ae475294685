"""History endpoint benchmark: a Java consumer reading history from the endpoint, from Kafka's own tiered storage,
and from a broker's local log. Same records, same machine, same client.

    ./dev bench bench_history [--gib 1] [--segment-mib 64] [--repeat 3] [--partition-fetch-mib N]
                              [--consumer-property K=V ...] [--py-spy FILE] [--endpoint-only]
                              [--compare-before COMMIT] [--head-patch FILE] [--variant KEY=JSON ...]
                              [--clients N [--clients-through head|before|patched] [--client-property K=V ...]]
                              [--s3-latency [--store-variant JSON ...] [--latency-arg=--first-byte-median-ms=27 ...]]

One broker (KRaft, 127.0.0.1) runs with Kafka's tiered storage enabled and Kafka's ``LocalTieredStorage`` (from the
``kafka-storage`` test jar) as its RemoteStorageManager, as in ``bench_sidecar``. Three topics of one partition get
the same records (``--gib`` each; 1 KiB values, keys, no compression by default):

- ``sidecar``: tiered by the sidecar (in-process, filesystem store), then the topic's retention cut to one byte so
  the broker deletes every rolled segment; read through the history endpoint (:func:`rlm.listener.start_listener`,
  started once the sidecar has stopped in a child process of its own, ``history_child.py``, so that process's CPU
  and memory are the endpoint's alone);
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

CPU is the server process's, user + system, from ``/proc/<pid>/stat`` at the window's ends: the endpoint's child
process (its asyncio loop, worker threads, and its metadata, catalog and ACL refreshers) or the broker's JVM. The
consumer's own CPU (whole process, from ``wait4``) is shown beside it. ``--endpoint-only`` leaves out the two broker
topics (a third of the set-up).

``--compare-before COMMIT`` checks COMMIT out in a git worktree (removed at the end) and starts its endpoint too, in
a child process with ``PYTHONPATH`` on the worktree (checked: the ``rlm`` it imported), each endpoint with a metadata
cache of its own caught up from the same metadata topic, over the same store: the same records through this tree's
endpoint and the older one's, taking turns (the order of the sources reversed every other round), on the same
machine. The settings are this tree's less what the old tree does not know (``history_listener.authorization``).
To see what the issue-22 bounds cost: ``--compare-before 3bf8c9d^``, the commit before the first of them. This
tree's endpoint then runs from a worktree of HEAD too (the commit, not files being edited in this checkout).
``--variant KEY=JSON`` adds an endpoint of this tree with one ``history_listener`` setting changed, to see what one
bound costs (``socket_send_buffer_bytes=-1``: the kernel's send buffer, auto-tuned); ``--head-patch FILE`` one of HEAD
with a patch applied (what a fix changes).

``--s3-latency`` (issue 25): the sidecar's store is S3 with real S3's latency instead of the filesystem: s3proxy
behind ``devtools/s3latency.py`` (``bench/emulated_s3.py``; ``--latency-arg`` passed to the emulator as is), the
tiering and every endpoint's reads through it. ``--store-variant JSON`` adds an endpoint of this tree with those
``store`` fields changed (a JSON object, repeatable); with ``--s3-latency`` and none given, the one-connection
figure: ``{"read_ahead_bytes": 0, "block_cache_bytes": 0}`` (one GET at a time, no block kept between Fetches),
next to the store's defaults (S3: 64 MiB read ahead, 64 MiB block cache). Each endpoint process has its own
storage manager, so its read-ahead budget and block cache are its own.

``--clients N``: after the single-client reads, N confluent-kafka consumers (librdkafka), a process each, read the
whole sidecar topic from offset 0 through one endpoint at once (``--clients-through``: this tree's by default),
started together once all are created.
Processes, not threads: 50 librdkafka consumers in one Python process would share one GIL for the per-message
work, and 50 JVMs of Kafka's console consumer (about 300 MiB and a JIT each) would starve 2 cores; the clients'
memory is apart from the endpoint's either way. The endpoint's RSS is read before, every 100 ms meanwhile (and its
``VmHWM``, reset through ``/proc/<pid>/clear_refs`` at the start), and 2 s after; also the total and per-client
throughput, the endpoint's CPU, the peak of ``rlm_history_queued_response_bytes`` (the answer bytes it holds for
clients), and the kernel's send buffers of its client sockets (``ss -tm``: ``socket_send_buffer_bytes`` each, doubled
by the kernel; kernel memory, not in the RSS).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench_sidecar import kafka_tiered_storage_config, set_topic_config, wait_until  # noqa: E402
from emulated_s3 import EmulatedS3  # noqa: E402

MiB = 1024 * 1024
GiB = 1024 * MiB
VALUE_BYTES = 1024
TICKS = os.sysconf("SC_CLK_TCK")
POSITION_RESET = b"Resetting offset for partition"  # the consumer's INFO line once ListOffsets answered
ONE_CONNECTION = '{"read_ahead_bytes": 0, "block_cache_bytes": 0}'  # one GET at a time, nothing kept (issue 25)


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14, 15 of proc(5))


def cpu_by_thread_group(pid: int) -> dict[str, float]:
    """User + system CPU seconds so far of a process's live threads, by group: ``librdkafka`` (threads named
    ``rdk:*``: the endpoint's Kafka clients, i.e. the metadata consumer, the catalog's and the ACL cache's admin
    clients) and ``python`` (the rest: event loop, workers, refreshers). Threads that ended are not counted."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm, rest = (task / "stat").read_text().split("(", 1)[1].rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()
        group = "librdkafka" if comm.startswith("rdk:") else "python"
        out[group] = out.get(group, 0.0) + (int(fields[11]) + int(fields[12])) / TICKS
    return out


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
    server_cpu_groups: dict[str, float] = field(default_factory=dict)  # server CPU by thread group (see above)


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
    groups: dict[str, float] = {}  # server CPU by thread group then
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
                        groups.update(cpu_by_thread_group(server_pid))
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
    end_groups = cpu_by_thread_group(server_pid)
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
    return Run(records, end_wall - t0, end - started, end_cpu - c0, usage.ru_utime + usage.ru_stime,
               server_cpu_groups={k: v - groups.get(k, 0.0) for k, v in end_groups.items()})


class Endpoint:
    """A history endpoint in a child process (``history_child.py endpoint``) serving the ``rlm`` of ``tree``: this
    checkout, or an older commit's git worktree. Its process is the endpoint alone: CPU and RSS are read from it."""

    def __init__(self, name: str, tree: Path, settings: dict, work: Path) -> None:
        self.name, self.tree = name, tree
        path = work / f"endpoint-{uuid.uuid4().hex[:6]}.json"
        path.write_text(json.dumps(settings))
        env = {**os.environ, "PYTHONPATH": str(tree)}
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "history_child.py"), "endpoint", str(path)],
                                     cwd=tree, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line:
            raise RuntimeError(f"endpoint {name} exited {self.proc.wait()} before listening")
        started = json.loads(line)
        if Path(started["rlm"]).resolve() != (tree / "rlm").resolve():
            self.stop()
            raise RuntimeError(f"endpoint {name} imported {started['rlm']}, not {tree / 'rlm'}")
        self.port: int = started["port"]
        self.pid = self.proc.pid

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def command(self, cmd: str) -> dict | None:
        self.proc.stdin.write(cmd + "\n")  # type: ignore[union-attr]
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return json.loads(self.proc.stdout.readline()) if cmd == "stats" else None  # type: ignore[union-attr]

    def wait_serving(self, topic: str, records: int) -> None:
        """Until ListOffsets latest of ``topic`` partition 0 through the endpoint is ``records`` or more (its
        metadata manager has caught up from the metadata topic)."""
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "bench-history-probe"})
        try:
            def serving() -> bool:
                try:
                    return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=5)[1] >= records
                except Exception:  # noqa: BLE001 - not served yet
                    return False
            wait_until(serving, 300, f"endpoint {self.name} to serve {records} records of {topic}", 0.5)
        finally:
            c.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()  # type: ignore[union-attr]
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def proc_status_kib(pid: int, key: str) -> int:
    """A ``/proc/<pid>/status`` value in KiB (``VmRSS``, ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


SKMEM = re.compile(r"skmem:\(([^)]*)\)")


def socket_send_memory(port: int) -> tuple[int, int, int]:
    """(sockets, bytes queued in their kernel send buffers, their SO_SNDBUF as the kernel set it, summed) over the
    endpoint's established client sockets (local port ``port``), from ``ss -tm``. Summed, not the largest times
    the sockets: the listener raises the buffers of some connections only (``SEND_BUFFER_RAISED_BYTES``)."""
    out = subprocess.run(["ss", "-tmnH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=False).stdout
    n = queued = sndbuf = 0
    for m in SKMEM.finditer(out):
        fields = dict(re.match(r"([a-z_]+)(\d+)", f).groups() for f in m.group(1).split(","))  # type: ignore[union-attr]
        n += 1
        queued += int(fields.get("w", 0))
        sndbuf += int(fields.get("tb", 0))
    return n, queued, sndbuf


@dataclass
class ClientsRun:
    clients: int
    records: int            # per client
    window_s: float         # the first client's assign -> the last client's last record
    client_rates: list[float]  # MiB/s of each client
    endpoint_cpu_s: float
    clients_cpu_s: float
    rss_kib: tuple[int, int, int, int]  # before, peak sampled every 100 ms, VmHWM since before, after
    queued_peak_bytes: float | None     # rlm_history_queued_response_bytes, peak (sampled at 100 ms)
    sockets_peak: int
    socket_queued_peak_bytes: int       # the kernel's send buffers of the endpoint's client sockets, summed, peak
    sndbuf_bytes: int                   # SO_SNDBUF as the kernel set it (twice what was asked), summed, peak


def read_with_clients(endpoint: Endpoint, n: int, topic: str, records: int, read_bytes: float,
                      properties: list[str]) -> ClientsRun:
    """``n`` confluent-kafka consumers, a process each, read ``records`` records of ``topic`` through ``endpoint`` at
    once (started together once every one is created); the endpoint's RSS is sampled every 100 ms meanwhile."""
    cmd = [sys.executable, str(ROOT / "bench" / "history_child.py"), "consume", endpoint.bootstrap, topic,
           str(records), *properties]
    procs = [subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
                raise RuntimeError(f"a client exited {p.wait()} before it was ready")
        endpoint.command("watch")
        endpoint.command("stats")  # resets the queued peak
        time.sleep(1.0)
        pid = endpoint.pid
        rss_before = proc_status_kib(pid, "VmRSS")
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS now (proc(5))
        peak = [rss_before]
        sock = [0, 0, 0]
        done = threading.Event()

        def sample_rss() -> None:
            while not done.wait(0.1):
                peak[0] = max(peak[0], proc_status_kib(pid, "VmRSS"))

        def sample_sockets() -> None:
            while not done.wait(0.5):
                s, q, b = socket_send_memory(endpoint.port)
                sock[0], sock[1], sock[2] = max(sock[0], s), max(sock[1], q), max(sock[2], b)

        samplers = [threading.Thread(target=f, daemon=True) for f in (sample_rss, sample_sockets)]
        for t in samplers:
            t.start()
        cpu0 = cpu_seconds(pid)
        for p in procs:
            p.stdin.write("go\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        results, clients_cpu = [], 0.0
        for p in procs:
            line = p.stdout.read()  # type: ignore[union-attr]
            _pid, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            if p.returncode != 0 or not line.strip():
                raise RuntimeError(f"a client exited {p.returncode}")
            results.append(json.loads(line))
            clients_cpu += usage.ru_utime + usage.ru_stime
        cpu1 = cpu_seconds(pid)
        hwm = proc_status_kib(pid, "VmHWM")
        done.set()
        for t in samplers:
            t.join(5)
        time.sleep(2.0)
        rss_after = proc_status_kib(pid, "VmRSS")
        queued = endpoint.command("stats")["queued_peak_bytes"]  # type: ignore[index]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    window = max(r["end"] for r in results) - min(r["start"] for r in results)
    return ClientsRun(n, records, window, [read_bytes / MiB / (r["end"] - r["start"]) for r in results],
                      cpu1 - cpu0, clients_cpu, (rss_before, peak[0], hwm, rss_after),
                      queued, sock[0], sock[1], sock[2])


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
                    help="record each endpoint's last read with py-spy (on PATH) into this file (collapsed stacks; "
                         "the other endpoints' into FILE.1, FILE.2, ... in the order they are listed)")
    ap.add_argument("--compare-before", metavar="COMMIT", default=None,
                    help="also read through the endpoint of COMMIT (a git worktree of it, its own child process), "
                         "taking turns with this tree's")
    ap.add_argument("--variant", action="append", default=[], metavar="KEY=JSON",
                    help="one more endpoint of this tree with history_listener.KEY set to the JSON value (repeatable), "
                         "e.g. socket_send_buffer_bytes=-1, to see what one bound costs")
    ap.add_argument("--head-patch", type=Path, default=None, metavar="FILE",
                    help="one more endpoint: HEAD with this patch applied (git apply, in a worktree of its own)")
    ap.add_argument("--endpoint-only", action="store_true",
                    help="no Kafka tiered / local topics: only the endpoint(s) are read")
    ap.add_argument("--clients", type=int, default=0, metavar="N",
                    help="after the single-client reads, N confluent-kafka consumers (a process each) read the whole "
                         "sidecar topic through one endpoint at once; its RSS is sampled every 100 ms")
    ap.add_argument("--clients-through", choices=["head", "before", "patched"], default="head",
                    help="the endpoint the --clients read through: this tree's, --compare-before's, --head-patch's")
    ap.add_argument("--client-property", action="append", default=[], metavar="KEY=VALUE",
                    help="a librdkafka setting of the --clients consumers (repeatable)")
    ap.add_argument("--s3-latency", action="store_true",
                    help="the sidecar's store on s3proxy behind the S3 latency emulator (devtools/s3latency.py) "
                         "instead of the filesystem")
    ap.add_argument("--latency-arg", action="append", default=[],
                    help="with --s3-latency: passed to devtools.s3latency as is, e.g. "
                         "--latency-arg=--bandwidth-mb-per-s=60")
    ap.add_argument("--store-variant", action="append", default=[], metavar="JSON",
                    help="one more endpoint of this tree with these store fields changed (a JSON object, "
                         "repeatable); with --s3-latency and none given: "
                         + ONE_CONNECTION)
    args = ap.parse_args()
    store_variants = [json.loads(v) for v in args.store_variant]
    if args.s3_latency and not store_variants:
        store_variants = [json.loads(ONE_CONNECTION)]

    logging.basicConfig(level=logging.WARNING)
    from devtools.devkafka import KafkaCluster
    from rlm.config import SidecarSettings
    from rlm.sidecar import Sidecar
    from rlmm.api import PartitionNotServedError, TopicIdPartition
    from rsm.log.partition import PartitionDir

    work = Path(tempfile.mkdtemp(prefix="bench-history-"))
    stack = contextlib.ExitStack()  # the emulated S3 (--s3-latency): stopped after the endpoints
    results: dict[str, list[Run]] = {}
    worktree: Path | None = None
    trees: list[Path] = []  # git worktrees made here, removed at the end
    clients_run: ClientsRun | None = None
    memory: dict[str, tuple[int, int]] = {}
    try:
        def checkout(rev: str) -> Path:
            tree = Path(tempfile.mkdtemp(prefix="wt-bench-"))
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree), rev],
                           check=True, capture_output=True)
            trees.append(tree)
            return tree
        head_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True, check=True).stdout.strip()
        head_tree = ROOT
        if args.compare_before:
            old_rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", args.compare_before],
                                     capture_output=True, text=True, check=True).stdout.strip()
            worktree = checkout(old_rev)
            head_tree = checkout(head_rev)  # HEAD as committed: not files others are editing in this checkout
        patched_tree = None
        if args.head_patch:
            patched_tree = checkout(head_rev)
            subprocess.run(["git", "-C", str(patched_tree), "apply", str(args.head_patch.resolve())], check=True)
        kafka_remote = work / "kafka-remote"
        kafka_remote.mkdir()
        s3 = stack.enter_context(EmulatedS3(work / "s3proxy", bucket="bench-history",
                                            latency_args=args.latency_arg)) if args.s3_latency else None
        if s3 is not None:
            print(s3.describe(), file=sys.stderr)
        with KafkaCluster(brokers=1, broker_config=kafka_tiered_storage_config(kafka_remote), heap="1g") as kc:
            seg = {"segment.bytes": str(args.segment_mib * MiB), "retention.ms": "-1", "retention.bytes": "-1"}
            ours, theirs, local = "history-sidecar", "history-kafka-tiered", "history-local"
            topic_id = kc.create_topic(ours, 1, config=seg)
            topics = [ours]
            if not args.endpoint_only:
                kc.create_topic(theirs, 1, config={**seg, "remote.storage.enable": "true"})
                kc.create_topic(local, 1, config=seg)
                topics += [theirs, local]
            t0 = time.perf_counter()
            n = produce(kc.bootstrap_servers, topics, int(args.gib * GiB), args.codec)
            print(f"produced {n:,} records x {len(topics)} topics in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
            pdirs = {t: kc.log_dir() / f"{t}-0" for t in topics}
            ends = {t: PartitionDir(d).rolled_ranges()[-1][1] for t, d in pdirs.items()}
            rolled = PartitionDir(pdirs[ours]).rolled_ranges()
            bytes_per_record = sum((pdirs[ours] / f"{base:020d}.log").stat().st_size
                                   for base, _ in rolled) / (rolled[-1][1] + 1)

            # The sidecar tiers ours; then the broker's local copy of it goes.
            tag = uuid.uuid4().hex[:8]
            raw = {
                "broker_id": 1, "log_dirs": [str(d) for d in kc.node(1).log_dirs],
                "staging_dir": str(work / "staging"),
                "kafka": {"bootstrap_servers": kc.bootstrap_servers},
                "store": s3.store() if s3 else {"store": "fs", "root_path": str(work / "sidecar-remote")},
                "metadata": {"topic": f"__rlm_md_{tag}", "partitions": 3, "replication_factor": 1,
                             "state_dir": str(work / "sidecar-state"), "to_be_deleted_topic": f"__rlm_tbd_{tag}"},
                "tasks": {"copy_interval_ms": 500, "discovery_interval_ms": 500},
                "topics": {"include": [ours]},
                "retention": [{"pattern": ".*", "retention_ms": -1, "retention_bytes": -1}],
                "history_listener": {"host": "127.0.0.1", "port": 0,
                                     "authorization": {"allow_if_no_authorizer": True}},  # dev cluster: no authorizer
                "listen": {"host": "127.0.0.1", "port": 0}, "log_format": "text", "log_level": "WARNING"}
            settings = SidecarSettings(**raw)
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

            if not args.endpoint_only:
                def kafka_tiered() -> bool:  # LocalTieredStorage: <offset>-<uuid>.<type>, every type once remote
                    types: dict[str, set[str]] = {}
                    for p in kafka_remote.rglob("*"):
                        if p.is_file():
                            stem, _, suffix = p.name.rpartition(".")
                            types.setdefault(stem, set()).add(suffix)
                    need = {"log", "index", "timeindex", "leader_epoch_checkpoint"}
                    return sum(need <= t for t in types.values()) >= len(PartitionDir(pdirs[theirs]).rolled_ranges())
                wait_until(kafka_tiered, 1200, "Kafka's tiered storage to copy every rolled segment", 0.5)
                set_topic_config(kc.bootstrap_servers, theirs, {"local.retention.ms": "1000"})
            set_topic_config(kc.bootstrap_servers, ours, {"retention.bytes": "1"})
            for t in [ours] if args.endpoint_only else [ours, theirs]:
                wait_until(lambda t=t: not PartitionDir(pdirs[t]).rolled_ranges(), 300,
                           f"the broker to delete {t}'s rolled segments locally", 0.5)
            records = min(ends.values()) + 1
            read_bytes = records * bytes_per_record  # the log bytes of the records read (estimate)

            # Each endpoint: a child process, its own metadata cache (state dir) caught up from the metadata topic.
            def endpoint_settings(label: str, old: bool, store: dict | None = None, **extra: object) -> dict:
                listener = {k: v for k, v in raw["history_listener"].items() if not (old and k == "authorization")}
                listener.update(extra)
                return {**raw, "history_listener": listener, "store": {**raw["store"], **(store or {})},
                        "metadata": {**raw["metadata"], "state_dir": str(work / f"state-{label}")}}
            store_note = ", store defaults" if store_variants else ""
            endpoints = [Endpoint(f"history endpoint, HEAD {head_rev}{store_note}", head_tree,
                                  endpoint_settings("head", False), work)]
            try:
                if patched_tree is not None:
                    endpoints.append(Endpoint(f"endpoint HEAD + {args.head_patch.name}", patched_tree,
                                              endpoint_settings("patched", False), work))
                for i, variant in enumerate(args.variant):
                    key, _, value = variant.partition("=")
                    endpoints.append(Endpoint(f"endpoint HEAD, {key}={value}", head_tree,
                                              endpoint_settings(f"variant{i}", False, **{key: json.loads(value)}),
                                              work))
                for i, variant in enumerate(store_variants):
                    label = ", ".join(f"{k}={json.dumps(v)}" for k, v in variant.items())
                    endpoints.append(Endpoint(f"endpoint HEAD, store {label}", head_tree,
                                              endpoint_settings(f"store{i}", False, store=variant), work))
                if worktree is not None:
                    endpoints.append(Endpoint(f"history endpoint, {old_rev} (before)", worktree,
                                              endpoint_settings("old", True), work))
                for ep in endpoints:
                    ep.wait_serving(ours, records)
                broker_pid = kc.node(1).process.pid  # type: ignore[union-attr]
                sources: list[tuple[str, str, str, int, Endpoint | None]] = [
                    (ep.name, ep.bootstrap, ours, ep.pid, ep) for ep in endpoints]
                if not args.endpoint_only:
                    sources += [("broker, Kafka tiered storage", kc.bootstrap_servers, theirs, broker_pid, None),
                                ("broker, local log", kc.bootstrap_servers, local, broker_pid, None)]
                load = [os.getloadavg()[0]]
                for r in range(args.repeat):
                    for name, bootstrap, topic, pid, ep in sources if r % 2 == 0 else sources[::-1]:
                        spy = None
                        if args.py_spy and ep is not None and r == args.repeat - 1:
                            out = args.py_spy if ep is endpoints[0] else args.py_spy.with_name(
                                f"{args.py_spy.name}.{endpoints.index(ep)}")
                            spy = subprocess.Popen([shutil.which("py-spy") or "py-spy", "record", "-p", str(pid),
                                                    "-o", str(out), "-f", "raw", "-r", "250"],
                                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                            time.sleep(1.0)
                        before = ep.command("stats") if ep else None
                        run = consume(kc, bootstrap, topic, records, pid, args.partition_fetch_mib, work,
                                      args.consumer_property)
                        if ep and before:
                            after = ep.command("stats")
                            run.fetches = int(after["fetches"] - before["fetches"])  # type: ignore[index]
                            run.fetch_s = after["fetch_s"] - before["fetch_s"]  # type: ignore[index]
                        if spy is not None:
                            spy.send_signal(2)
                            spy.wait(60)
                        results.setdefault(name, []).append(run)
                        print(f"  {name}: {run.window_s:.2f}s ({run.total_s:.2f}s with JVM start), server CPU "
                              f"{run.server_cpu_s:.2f}s (" + ", ".join(
                                  f"{k} {v:.2f}s" for k, v in sorted(run.server_cpu_groups.items())) + ")",
                              file=sys.stderr)
                load.append(os.getloadavg()[0])
                memory = {ep.name: (proc_status_kib(ep.pid, "VmRSS"), proc_status_kib(ep.pid, "VmHWM"))
                          for ep in endpoints}
                clients_ep = {"head": endpoints[0], "before": endpoints[-1] if worktree else endpoints[0],
                              "patched": endpoints[1] if patched_tree else endpoints[0]}[args.clients_through]
                if args.clients:
                    print(f"  {args.clients} clients reading through {clients_ep.name} ...", file=sys.stderr)
                    clients_run = read_with_clients(clients_ep, args.clients, ours, records, read_bytes,
                                                    args.client_property)
            finally:
                for ep in endpoints:
                    ep.stop()
    finally:
        stack.close()
        shutil.rmtree(work, ignore_errors=True)
        for tree in trees:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)

    gib_read = read_bytes / GiB
    best = {name: min(runs, key=lambda x: x.window_s) for name, runs in results.items()}
    ref = {label: read_bytes / MiB / best[name].window_s for label, name in
           (("Kafka remote", "broker, Kafka tiered storage"), ("local", "broker, local log")) if name in best}
    head = (f"{'source':44} {'MiB/s':>8} {'seconds':>8}" + "".join(f" {'vs ' + k:>16}" for k in ref)
            + f" {'server CPU s/GiB':>17} {'client CPU s/GiB':>17}  every run: MiB/s (server CPU s/GiB)")
    print()
    print(head)
    for name, run in best.items():
        rate = read_bytes / MiB / run.window_s
        every = ", ".join(f"{read_bytes / MiB / x.window_s:.0f} ({x.server_cpu_s / gib_read:.2f})"
                          for x in results[name])
        print(f"{name:44} {rate:>8,.0f} {run.window_s:>8.2f}" + "".join(f" {rate / v:>15.2f}x" for v in ref.values())
              + f" {run.server_cpu_s / gib_read:>17.2f} {run.client_cpu_s / gib_read:>17.2f}  {every}")
    extra = "".join(f", {c}" for c in args.consumer_property)
    print(f"\n{records:,} records ({gib_read:.2f} GiB of log), {VALUE_BYTES} B values, codec {args.codec}, "
          f"{args.segment_mib} MiB segments, 1 partition; Kafka's console consumer, max.partition.fetch.bytes "
          f"{args.partition_fetch_mib or 1} MiB{extra}; best of {args.repeat}, sources taking turns (order reversed "
          f"every other round); {os.cpu_count()} cores. Server CPU: the endpoint's child process / the broker's JVM "
          f"(/proc/<pid>/stat); client CPU: the consumer's JVM, start-up included. Load average (1 min) before / after "
          f"the reads: {load[0]:.1f} / {load[1]:.1f}.")
    if worktree is not None:
        def median(runs: list[Run], field: str) -> float:
            return statistics.median(getattr(x, field) for x in runs)
        old, bo = results[endpoints[-1].name], best[endpoints[-1].name]
        for ep in endpoints[:-1]:
            new, bn = results[ep.name], best[ep.name]
            print(f"{ep.name} vs {old_rev}: throughput {bo.window_s / bn.window_s:.3f}x, endpoint CPU "
                  f"{bn.server_cpu_s / bo.server_cpu_s:.3f}x (best runs); throughput "
                  f"{median(old, 'window_s') / median(new, 'window_s'):.3f}x, endpoint CPU "
                  f"{median(new, 'server_cpu_s') / median(old, 'server_cpu_s'):.3f}x (medians).")
    for ep in endpoints:
        ob = best[ep.name]
        if ob.fetches:
            print(f"{ep.name}, best run: {ob.fetches} Fetch requests, {ob.fetch_s / ob.fetches * 1e3:.2f} ms each to "
                  f"answer (frame read to response built), {ob.window_s / ob.fetches * 1e3:.2f} ms per "
                  f"request-response cycle (the consumer has one Fetch in flight per broker).")
    for name, (rss, hwm) in memory.items():
        print(f"{name}: RSS {rss / 1024:.0f} MiB after the single-client reads, {hwm / 1024:.0f} MiB at its peak "
              f"(VmHWM, since it started).")
    if clients_run is not None:
        c = clients_run
        rates = sorted(c.client_rates)
        before, peak, hwm, after = (k / 1024 for k in c.rss_kib)
        served = c.clients * read_bytes
        print(f"\n{c.clients} clients at once through {clients_ep.name}: confluent-kafka consumers, a process each "
              f"(librdkafka defaults{''.join(', ' + p for p in args.client_property)}), each reading all "
              f"{c.records:,} records ({gib_read:.2f} GiB) from offset 0")
        print(f"{'endpoint RSS MiB: before':>34} {before:8.0f}   peak (100 ms samples) {peak:8.0f}   VmHWM {hwm:8.0f}"
              f"   after {after:8.0f}   peak - before {max(peak, hwm) - before:6.0f}")
        print(f"{'throughput MiB/s: total':>34} {served / MiB / c.window_s:8.0f}   ({c.clients} x {gib_read:.2f} GiB "
              f"in {c.window_s:.1f} s); per client min / median / max {rates[0]:.1f} / "
              f"{statistics.median(rates):.1f} / {rates[-1]:.1f}")
        print(f"{'endpoint CPU s':>34} {c.endpoint_cpu_s:8.1f}   ({c.endpoint_cpu_s / (served / GiB):.2f} "
              f"s/GiB served); clients' CPU {c.clients_cpu_s:.1f} s")
        q = "n/a" if c.queued_peak_bytes is None else f"{c.queued_peak_bytes / MiB:.1f}"
        print(f"{'queued answer bytes peak MiB':>34} {q:>8}   (rlm_history_queued_response_bytes, 100 ms samples)")
        print(f"{'kernel send buffers':>34} {c.socket_queued_peak_bytes / MiB:8.1f}   MiB queued at peak over "
              f"{c.sockets_peak} client sockets (ss -tm, 0.5 s samples); their SO_SNDBUF as set by the kernel, "
              f"summed: at most {c.sndbuf_bytes / MiB:.1f} MiB of kernel memory, not in the RSS")


if __name__ == "__main__":
    main()
