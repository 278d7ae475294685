"""Metadata manager benchmark: bootstrap apply rate, warm restart, lookup latency, vs. a replay-into-a-dict baseline.

What runs (one process, side by side, one table at the end):

1. apply-only: ``--apply-events`` pre-encoded records (COPY_SEGMENT_STARTED + COPY_SEGMENT_FINISHED per segment)
   applied straight into :class:`rlmm.cache.MetadataCache` (no Kafka), vs. decoding the same records with
   ``rlmm.serde.decode`` into a Python dict (what Kafka's own in-memory cache does).
2. through Kafka: ``--segments`` segments (2 events each) produced to a compacted topic on a local broker
   (``devtools.devkafka.KafkaCluster``); a fresh ``TopicBasedRemoteLogMetadataManager`` bootstraps from it (consumer +
   apply + RocksDB), vs. a plain consumer replaying the topic into a dict.
3. warm restart of that manager (same cache dir): time to ready and records consumed, vs. the dict baseline, which
   must replay everything again on every start.
4. lookups ``remote_log_segment_metadata(tp, epoch, offset)`` at random: p50/p99 (best of 3 rounds, the machine
   is shared), vs. bisect over per-epoch sorted lists in the dict.

Targets (DESIGN.md section 7): >= 100k events/s applied, warm restart with 1M segments <= 2 s, lookup p99 <= 100 us.

    .venv/bin/python bench/bench_rlmm.py                  # 1M segments = 2M events through the broker
    .venv/bin/python bench/bench_rlmm.py --segments 50000 # quick
    .venv/bin/python bench/bench_rlmm.py --compare c58c58c --segments 50000   # apply-only: that revision vs this

``--bootstrap-servers HOST:PORT`` uses a running cluster instead of starting one: its ``__remote_log_metadata`` topic
is produced only when it does not hold ``--segments`` segments' events yet (a 10 M run produces for ~10 minutes: a
second run against the same broker skips that).

``--compare REV`` runs the apply-only phase (``--apply-events``) in child processes, this checkout's ``rlmm`` and
REV's (``git archive``) taking turns ``--compare-rounds`` times, and prints the median CPU per event of each: on a
shared machine, CPU time side by side is the comparison that holds (wall time follows the load).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import gc
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devtools/ lives in the checkout, not the package
_OTHER_RLMM = "BENCH_RLMM_PACKAGE_ROOT"   # --compare's children: where another revision's rlmm is
if os.environ.get(_OTHER_RLMM):
    sys.path.insert(0, os.environ[_OTHER_RLMM])

from devtools.devkafka import KafkaCluster  # noqa: E402
from rlmm import serde  # noqa: E402
from rlmm.api import (  # noqa: E402
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from rlmm.cache import MetadataCache  # noqa: E402
from rlmm.keys import KeyKind, encode_key  # noqa: E402
from rlmm.partitioner import metadata_partition  # noqa: E402
from rlmm.topic_manager import TopicBasedRemoteLogMetadataManager, TopicBasedRlmmConfig  # noqa: E402

__all__: list[str] = []

S = RemoteLogSegmentState
SEGMENT_SPAN = 1000          # offsets per segment
SEGMENTS_PER_EPOCH = 100
ROUNDS = 3


def user_partitions(n_topics: int, n_parts: int) -> list[TopicIdPartition]:
    rnd = random.Random(1)
    return [TopicIdPartition(uuid.UUID(int=rnd.getrandbits(128)), f"topic-{t}", p)
            for t in range(n_topics) for p in range(n_parts)]


def events(tps: list[TopicIdPartition], segments: int, num_partitions: int):
    """(metadata partition, key, value) per event, segment k of each partition at offsets [k*1000, k*1000+999]."""
    rnd = random.Random(2)
    for i in range(segments):
        tp = tps[i % len(tps)]
        k = i // len(tps)
        sid = RemoteLogSegmentId(tp, uuid.UUID(int=rnd.getrandbits(128)))
        md = RemoteLogSegmentMetadata(sid, k * SEGMENT_SPAN, k * SEGMENT_SPAN + SEGMENT_SPAN - 1,
                                      1_700_000_000_000 + k, 1, 1_700_000_000_000 + k, 1 << 20,
                                      ((k // SEGMENTS_PER_EPOCH, k * SEGMENT_SPAN),), None)
        up = RemoteLogSegmentMetadataUpdate(sid, 1_700_000_000_001 + k, None, S.COPY_SEGMENT_FINISHED, 1)
        mp = metadata_partition(tp.topic_id, tp.partition, num_partitions)
        yield mp, encode_key(KeyKind.SEGMENT, tp.topic_id, tp.partition, sid.id, 0), serde.encode(md)
        yield mp, encode_key(KeyKind.SEGMENT, tp.topic_id, tp.partition, sid.id, 1), serde.encode(up)


class DictBaseline:
    """Kafka-style: decode every record into objects, keep them in dicts, bisect for floor lookups."""

    def __init__(self) -> None:
        self.by_id: dict = {}
        self.epochs: dict = {}       # (tp, epoch) -> (sorted epoch start offsets, [(end, md)])

    def apply(self, value: bytes) -> None:
        md = serde.decode(value)
        if isinstance(md, RemoteLogSegmentMetadata):
            self.by_id[md.remote_log_segment_id] = md
            return
        old = self.by_id[md.remote_log_segment_id]
        new = old.with_update(md)
        self.by_id[md.remote_log_segment_id] = new
        if new.state == S.COPY_SEGMENT_FINISHED:
            for epoch, start in new.segment_leader_epochs:
                starts, items = self.epochs.setdefault((new.topic_id_partition, epoch), ([], []))
                i = bisect.bisect(starts, start)
                starts.insert(i, start)
                items.insert(i, (new.epoch_end_offset(epoch), new))

    def lookup(self, tp: TopicIdPartition, epoch: int, offset: int):
        entry = self.epochs.get((tp, epoch))
        if entry is None:
            return None
        i = bisect.bisect(entry[0], offset) - 1
        if i < 0:
            return None
        end, md = entry[1][i]
        return md if offset <= end else None


def cpu_s() -> float:
    """CPU seconds of this process, every thread (the consumer's, librdkafka's and RocksDB's background ones)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def rss_mib(field: str = "VmRSS") -> float:
    """Resident memory of this process now, MiB: ``VmRSS`` (all), ``RssAnon`` (heap: memtables, block cache,
    librdkafka's queues, Python) or ``RssFile`` (file pages mapped: RocksDB's tables, read through mmap)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def thread_cpu_s() -> dict[int, tuple[str, float]]:
    """CPU seconds of each live thread of this process by id, with its kind: ``rocksdb`` (RocksDB's flush and
    compaction pool, ``rocksdb:*``), ``librdkafka`` (``rdk:*``) or ``python`` (the rest: the metadata consumer thread,
    the main thread waiting on it)."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:        # ended meanwhile
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        fields = stat.rsplit(")", 1)[1].split()
        kind = "rocksdb" if comm.startswith("rocksdb") else "librdkafka" if comm.startswith("rdk:") else "python"
        out[int(task.name)] = (kind, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def cpu_by_kind(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds spent between two :func:`thread_cpu_s` snapshots, summed by kind (threads live at the second)."""
    out = {"python": 0.0, "rocksdb": 0.0, "librdkafka": 0.0}
    for tid, (kind, cpu) in after.items():
        out[kind] += cpu - before.get(tid, (kind, 0.0))[1]
    return out


def du_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / (1 << 20)


def pct(samples_ns: list[int], q: float) -> float:
    s = sorted(samples_ns)
    return s[min(len(s) - 1, int(q * len(s)))] / 1000


def bench_apply_only(tps, n_events: int, tmp: Path, with_dict: bool = True) -> dict:
    recs = [(mp, off, key, value) for off, (mp, key, value) in enumerate(events(tps, n_events // 2, 50))]
    cache = MetadataCache(tmp / "apply-only", topic="bench", num_partitions=50)
    t0, c0 = time.perf_counter(), time.process_time()
    for i in range(0, len(recs), 10_000):
        out = cache.apply(recs[i:i + 10_000], {})
        if out.skipped:
            raise RuntimeError(out.skipped[0])
    t_cache, c_cache = time.perf_counter() - t0, time.process_time() - c0
    cache.close()
    n = len(recs)
    if not with_dict:
        return {"events": n, "cache_eps": n / t_cache, "cache_cpu_eps": n / c_cache}
    base = DictBaseline()
    t0, c0 = time.perf_counter(), time.process_time()
    for _mp, _off, _key, value in recs:
        base.apply(value)
    t_dict, c_dict = time.perf_counter() - t0, time.process_time() - c0
    return {"events": n, "cache_eps": n / t_cache, "dict_eps": n / t_dict, "cache_cpu_eps": n / c_cache,
            "dict_cpu_eps": n / c_dict}


def produce_all(kafka: KafkaCluster, topic: str, tps, segments: int) -> int:
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 20, "batch.size": 1_000_000,
                  "compression.type": "lz4", "enable.idempotence": True, "queue.buffering.max.messages": 500_000})
    n = 0
    for mp, key, value in events(tps, segments, 50):
        while True:
            try:
                p.produce(topic, value=value, key=key, partition=mp)
                break
            except BufferError:
                p.poll(0.05)
        n += 1
        if n % 10_000 == 0:
            p.poll(0)
    if p.flush(300) != 0:
        raise RuntimeError("producer did not flush")
    return n


def existing_events(bootstrap: str, topic: str) -> int | None:
    """Records in ``topic`` of a running cluster (end offsets summed), or None when it does not exist."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"b-{uuid.uuid4()}"})
    try:
        md = c.list_topics(topic, timeout=30).topics.get(topic)
        if md is None or md.error is not None:
            return None
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in md.partitions)
    finally:
        c.close()


class _RunningCluster:
    """A cluster started elsewhere (``--bootstrap-servers``), with the part of ``KafkaCluster`` the bench uses."""

    def __init__(self, bootstrap_servers: str) -> None:
        self.bootstrap_servers = bootstrap_servers

    def create_topic(self, name: str, partitions: int, replication_factor: int, config: dict[str, str]) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic
        # the client held until the result is in: a temporary one is destroyed (and its request failed with
        # _DESTROY, "Broker handle destroyed for termination") as soon as create_topics returns
        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        fs = admin.create_topics([NewTopic(name, partitions, replication_factor, config=config)])
        fs[name].result(60)


def replay_into_dict(kafka: KafkaCluster, topic: str, total: int) -> tuple[float, DictBaseline]:
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"b-{uuid.uuid4()}",
                  "enable.auto.commit": False, "enable.partition.eof": False})
    c.assign([TopicPartition(topic, mp, 0) for mp in range(50)])
    base = DictBaseline()
    seen = 0
    t0 = time.perf_counter()
    while seen < total:
        # no more than are left: consume(n, timeout) returns once n records came or the timeout passed, so asking
        # 10,000 waited out the whole second after the last record (7fac721)
        for m in c.consume(min(10_000, total - seen), timeout=1.0):
            if m.error() is None:
                base.apply(m.value())
                seen += 1
            elif m.error().code() != KafkaError._PARTITION_EOF:
                raise RuntimeError(m.error())
    dt = time.perf_counter() - t0
    c.close()
    return dt, base


def apply_only_child(n_events: int) -> None:
    """``--child-apply``: the apply-only phase alone, CPU microseconds per event on stdout (for ``--compare``)."""
    import rlmm.cache
    tmp = Path(tempfile.mkdtemp(prefix="bench-rlmm-child-"))
    try:
        r = bench_apply_only(user_partitions(20, 50), n_events, tmp, with_dict=False)
        print(f"{rlmm.cache.__file__} {1e6 / r['cache_cpu_eps']:.3f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def compare(rev: str, n_events: int, rounds: int) -> list[tuple[str, str, str, str]]:
    """This checkout's apply-only CPU per event vs REV's, children taking turns; medians."""
    root = Path(__file__).resolve().parents[1]
    old = Path(tempfile.mkdtemp(prefix="bench-rlmm-rev-"))
    try:
        archive = subprocess.run(["git", "-C", str(root), "archive", rev, "rlmm"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        cpu: dict[str, list[float]] = {"this": [], rev: []}
        for i in range(rounds):
            for name, pkg in (("this", None), (rev, old)):
                env = {**os.environ, _OTHER_RLMM: str(pkg)} if pkg else {**os.environ, _OTHER_RLMM: ""}
                out = subprocess.run([sys.executable, __file__, "--child-apply", str(n_events)], env=env,
                                     capture_output=True, text=True, check=True).stdout.split()
                if pkg and not out[0].startswith(str(pkg)):
                    raise RuntimeError(f"the child imported {out[0]}, not REV's rlmm")
                cpu[name].append(float(out[1]))
                print(f"  compare round {i + 1}: {name} {out[1]} us CPU/event", flush=True)
    finally:
        shutil.rmtree(old, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in cpu.items()}
    return [(f"apply-only CPU per event, median of {rounds} (us): this vs {rev}", f"{med['this']:.2f}",
             f"{med[rev]:.2f} ({rev})", ""),
            ("  as events/CPU-s", f"{1e6 / med['this']:,.0f}", f"{1e6 / med[rev]:,.0f} ({rev})", ">= 100,000")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", type=int, default=1_000_000, help="segments through Kafka (2 events each)")
    ap.add_argument("--apply-events", type=int, default=400_000, help="events for the apply-only run")
    ap.add_argument("--lookups", type=int, default=100_000)
    ap.add_argument("--skip-dict-replay", action="store_true", help="skip the (slow) dict replay through Kafka")
    ap.add_argument("--compare", metavar="REV", help="also time the apply-only phase of git revision REV's rlmm")
    ap.add_argument("--compare-rounds", type=int, default=5)
    ap.add_argument("--compare-only", action="store_true", help="with --compare: that alone, no broker")
    ap.add_argument("--bootstrap-servers", help="a running cluster to use (its topic is reused when complete)")
    ap.add_argument("--child-apply", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_apply:
        apply_only_child(args.child_apply)
        return
    tps = user_partitions(20, 50)            # 1000 user partitions
    load0 = os.getloadavg()[0]
    tmp = Path(tempfile.mkdtemp(prefix="bench-rlmm-"))
    rows: list[tuple[str, str, str, str]] = []
    try:
        print(f"apply-only: {args.apply_events:,} events into RocksDB vs. decode into a dict ...", flush=True)
        r = bench_apply_only(tps, args.apply_events, tmp)
        rows.append(("apply rate, records straight into the cache (events/s, wall)", f"{r['cache_eps']:,.0f}",
                     f"{r['dict_eps']:,.0f}", ">= 100,000"))
        rows.append(("apply rate, records straight into the cache (events/CPU-s)", f"{r['cache_cpu_eps']:,.0f}",
                     f"{r['dict_cpu_eps']:,.0f}", ">= 100,000"))
        if args.compare:
            print(f"compare: apply-only, this checkout vs {args.compare}, {args.compare_rounds} rounds ...", flush=True)
            rows += compare(args.compare, args.apply_events, args.compare_rounds)
            if args.compare_only:
                print_table(rows)
                return

        # no fsync per message (the dev default): this measures the metadata path, not the disk
        cluster = contextlib.nullcontext(_RunningCluster(args.bootstrap_servers)) if args.bootstrap_servers else \
            KafkaCluster(brokers=1, heap="1g", broker_config={"log.flush.interval.messages": str(2**63 - 1)})
        with cluster as kafka:
            topic = "__remote_log_metadata"
            have = existing_events(kafka.bootstrap_servers, topic) if args.bootstrap_servers else None
            if have == 2 * args.segments:
                total = have
                print(f"reusing the topic's {total:,} events ({args.segments:,} segments)", flush=True)
            elif have is not None:
                raise SystemExit(f"{topic} holds {have:,} events, not {2 * args.segments:,}: use another cluster")
            else:
                kafka.create_topic(topic, 50, 1, {"cleanup.policy": "compact"})
                t0 = time.perf_counter()
                total = produce_all(kafka, topic, tps, args.segments)
                print(f"produced {total:,} events ({args.segments:,} segments) in {time.perf_counter() - t0:.1f}s",
                      flush=True)
            cfg = TopicBasedRlmmConfig(kafka.bootstrap_servers, tmp / "cache", topic=topic, num_partitions=50,
                                       replication_factor=1, serve_all=True)
            rss0, anon0 = rss_mib(), rss_mib("RssAnon")
            threads0 = thread_cpu_s()
            t0, c0 = time.perf_counter(), cpu_s()
            m = TopicBasedRemoteLogMetadataManager(cfg)
            m.wait_ready(tps, timeout_s=3600)
            t_boot, c_boot = time.perf_counter() - t0, cpu_s() - c0
            split = cpu_by_kind(threads0, thread_cpu_s())
            rss_boot, anon_boot, file_boot = rss_mib(), rss_mib("RssAnon"), rss_mib("RssFile")
            if m.records_applied != total or m.skipped_records:
                raise RuntimeError(f"applied {m.records_applied} of {total}, skipped {m.skipped_records}")
            print(f"bootstrap through Kafka: {t_boot:.1f}s", flush=True)
            if args.skip_dict_replay:
                t_dict, base = float("nan"), None
            else:
                t_dict, base = replay_into_dict(kafka, topic, total)
                print(f"dict replay through Kafka: {t_dict:.1f}s", flush=True)
            rows.append(("bootstrap through Kafka: consume + apply (events/s)", f"{total / t_boot:,.0f}",
                         f"{total / t_dict:,.0f}", ">= 100,000"))
            rows.append(("bootstrap through Kafka (events per CPU-s of the process)", f"{total / c_boot:,.0f}", "-",
                         ""))
            # The consumer thread applies every record and holds the GIL doing it (rocksdict's writes included): the
            # wall rate is at most 1 / its CPU per event, reached only with a core to itself (session 13, 10 M
            # segments: 7.0-7.2 us, ~140 k/s; it had 39-48% of a core on the shared machine)
            rows.append(("  CPU per event (us): python threads (the consumer's) / RocksDB's pool / librdkafka",
                         " / ".join(f"{1e6 * split[k] / total:.2f}" for k in ("python", "rocksdb", "librdkafka")),
                         "-", ""))
            rows.append(("  share of a core the python threads had during the bootstrap",
                         f"{split['python'] / t_boot:.0%}", "-", ""))
            rows.append(("RSS after bootstrap, above the process before it (MiB)", f"{rss_boot - rss0:,.0f}",
                         "-", ""))
            rows.append(("  of which heap (RssAnon) / file pages mapped (RssFile, all of the process)",
                         f"{anon_boot - anon0:,.0f} / {file_boot:,.0f}", "-", ""))
            t0 = time.perf_counter()
            m.cache.wait_for_compaction()
            rows.append((f"  after the background compaction ({time.perf_counter() - t0:.0f} s more): all / heap "
                         "above before it (MiB)", f"{rss_mib() - rss0:,.0f} / {rss_mib('RssAnon') - anon0:,.0f}",
                         "-", ""))
            rows.append(("cache on disk after bootstrap and compaction (MiB)", f"{du_mib(tmp / 'cache'):,.0f}", "-",
                         ""))
            m.close()

            t0 = time.perf_counter()
            m = TopicBasedRemoteLogMetadataManager(cfg)
            m.wait_ready(tps, timeout_s=600)
            t_warm = time.perf_counter() - t0
            rows.append((f"warm restart with {args.segments:,} segments (s)", f"{t_warm:.2f}",
                         f"{t_dict:.2f} (full replay)", "<= 2"))
            rows.append(("  records consumed on warm restart", f"{m.records_consumed:,}", f"{total:,}", "0"))

            rnd = random.Random(3)
            per_tp = args.segments // len(tps)
            queries = []
            for _ in range(args.lookups):
                tp = rnd.choice(tps)
                k = rnd.randrange(per_tp)
                queries.append((tp, k // SEGMENTS_PER_EPOCH, k * SEGMENT_SPAN + rnd.randrange(SEGMENT_SPAN)))
            lat, lat_dict = [], []
            now = time.perf_counter_ns
            # The dict baseline keeps millions of objects alive in this process; without freezing them, every
            # cyclic-GC pass over them lands in some lookup's latency (ours allocate, the baseline's do not).
            gc.collect()
            gc.freeze()
            # The machine is shared: each side runs ROUNDS times over the same queries and keeps its best round
            # (by p99), as timeit keeps its best repeat.
            rounds: list[list[int]] = []
            c0 = cpu_s()
            for _ in range(ROUNDS):
                cur = []
                for tp, epoch, offset in queries:
                    t = now()
                    md = m.remote_log_segment_metadata(tp, epoch, offset)
                    cur.append(now() - t)
                    if md is None or not md.start_offset <= offset <= md.end_offset_inclusive:
                        raise RuntimeError(f"lookup {tp} {epoch} {offset} -> {md}")
                rounds.append(cur)
            c_look = cpu_s() - c0
            lat = min(rounds, key=lambda r: pct(r, 0.99))
            if base is not None:
                rounds = []
                for _ in range(ROUNDS):
                    cur = []
                    for tp, epoch, offset in queries:
                        t = now()
                        base.lookup(tp, epoch, offset)
                        cur.append(now() - t)
                    rounds.append(cur)
                lat_dict = min(rounds, key=lambda r: pct(r, 0.99))
            dp50 = f"{pct(lat_dict, 0.5):.1f}" if lat_dict else "-"
            dp99 = f"{pct(lat_dict, 0.99):.1f}" if lat_dict else "-"
            rows.append(("lookup latency p50 (us)", f"{pct(lat, 0.5):.1f}", dp50, ""))
            rows.append(("lookup latency p99 (us)", f"{pct(lat, 0.99):.1f}", dp99, "<= 100"))
            rows.append(("  lookup mean (us)", f"{statistics.fmean(lat) / 1000:.1f}",
                         f"{statistics.fmean(lat_dict) / 1000:.1f}" if lat_dict else "-", ""))
            rows.append(("  lookup CPU per lookup, all rounds (us)", f"{c_look / (ROUNDS * len(queries)) * 1e6:.1f}",
                         "-", ""))
            rows.append(("RSS of the process after the lookups: all / heap / file pages (MiB)",
                         f"{rss_mib():,.0f} / {rss_mib('RssAnon'):,.0f} / {rss_mib('RssFile'):,.0f}", "-", ""))
            m.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f} (at the start: {load0:.1f}); rates per CPU-s are "
          "what to compare on a shared machine")

    print_table(rows)


def print_table(rows: list[tuple[str, str, str, str]]) -> None:
    w = max(len(r[0]) for r in rows)
    print()
    print(f"{'measure':<{w}}  {'rlmm (RocksDB)':>16}  {'dict replay':>22}  {'target':>10}")
    for name, ours, theirs, target in rows:
        print(f"{name:<{w}}  {ours:>16}  {theirs:>22}  {target:>10}")


if __name__ == "__main__":
    main()
