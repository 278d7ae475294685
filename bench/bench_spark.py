"""Spark over the remote tier (``kafka-remote``) vs Spark's own Kafka source reading the broker, from its local log
and from Kafka's own remote tier: same records, same cores, one run, one table.

Starts one real broker with Kafka's tiered storage on (``LocalTieredStorage``, ``bench/kafka_tiered.py``) and
produces the same ``--records`` records (``--value-bytes`` random values, keys, one codec, ``--partitions``
partitions) into two topics:

- ``bench-spark``: the real sidecar tiers every rolled segment to the filesystem store; the broker keeps its local
  log (Kafka's tiered storage off for this topic);
- ``bench-spark-kt``: Kafka's tiered storage copies every rolled segment, then ``local.retention.ms`` expires the
  local copies, so the broker serves those offsets from its remote tier.

Batch rows run the same aggregation (``count(*)``, ``sum(length(value))``, ``sum(length(key))``, ``max(offset)``,
``max(timestamp)``: every column of every record is materialized) over the same offsets (per partition, up to
the end of what both tiers hold) with

- ``kafka-remote``: the driver plans from the metadata topic, executors read the store;
- ``kafka-remote`` encrypted: the same records tiered a second time by the sidecar, with the store's encryption at
  rest on (``store.encryption``, a key file written into the temp dir), into its own store and metadata topic; the
  same options plus ``store.encryption`` (the key file's path): the overhead of encryption on the read, in % of
  wall and CPU time next to the plain row (and, from one tiering run each, on the sidecar's copy);
- ``kafka`` (Spark's source, ``spark-sql-kafka-0-10``) on ``bench-spark``: executors fetch from the local log;
- ``kafka`` on ``bench-spark-kt``: executors fetch, the broker reads its remote tier;
- the floor: prebuilt Arrow batches of the same row counts through Spark's Python data source path.

Streaming rows drain the whole backlog with ``maxOffsetsPerTrigger`` micro-batches (``Trigger.AvailableNow``,
``noop`` sink): ``readStream.format("kafka-remote")`` next to Spark's ``kafka`` source in streaming mode on both
topics (its backlog also holds the active segment's few records, which are not tiered: compare records/s).

Spark's connector is resolved with Maven (``devtools/spark_kafka.py``) from ``config/spark-kafka-pom.xml`` into
``.cache/spark-kafka/`` at the installed pyspark's version, or the newest Maven Central has (printed). Each batch
source runs once per round, ``--repeat`` rounds; the best run counts. ``--only-remote`` runs only the two
``kafka-remote`` batch rows (plain and encrypted): one topic, no Kafka-tiered copy, no connector, no streaming.

``--s3-latency`` (issue 25; with ``--only-remote``): the sidecar tiers into S3 with real S3's latency instead of the
filesystem (s3proxy behind ``devtools/s3latency.py``, ``bench/emulated_s3.py``; ``--latency-arg`` passed to the
emulator as is) and the rows are ``kafka-remote`` with the store's defaults (S3: 64 MiB read ahead per reader) vs the
one-connection figure, ``store.read_ahead_bytes=0`` and ``store.block_cache_bytes=0`` (one GET at a time per
executor task): the executors' reads, each against its own one-connection figure. No encrypted row then.
Usage::

    .venv/bin/python bench/bench_spark.py [--records 2000000] [--partitions 2] [--codec lz4] [--cores 2]
        [--repeat 4] [--only-remote [--s3-latency [--latency-arg=--first-byte-median-ms=27 ...]]]
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402

from bench.emulated_s3 import EmulatedS3  # noqa: E402
from bench.kafka_tiered import kafka_remote_segments, kafka_tiered_storage_config, set_topic_config  # noqa: E402
from devtools.devkafka import KafkaCluster  # noqa: E402
from devtools.spark_kafka import spark_kafka_jars  # noqa: E402
from rlm.config import SidecarSettings  # noqa: E402
from rlm.sidecar import Sidecar  # noqa: E402
from rlmm.api import PartitionNotServedError, TopicIdPartition  # noqa: E402
from tests.support.sidecar import make_settings, wait_for  # noqa: E402


def produce(kafka: KafkaCluster, topic: str, partitions: int, n: int, value_bytes: int, codec: str) -> None:
    rnd = random.Random(7)
    values = [rnd.randbytes(value_bytes) for _ in range(1024)]
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 20, "batch.size": 1 << 20,
                  "compression.type": codec, "queue.buffering.max.messages": 1_000_000, "acks": "1"})
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=values[i & 1023], key=b"key-%d" % i, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
        if i & 0xFFFF == 0:
            p.poll(0)
    if p.flush(120) != 0:
        raise SystemExit("producer did not flush")


def latest_remote(sidecar: Sidecar, tp: TopicIdPartition) -> int:
    try:
        v = sidecar.reader.latest_offset(tp)
    except PartitionNotServedError:
        return -1
    return -1 if v is None else v


def broker_end(kafka: KafkaCluster, topic: str, partition: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "bench"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[1]
    finally:
        c.close()


AGG = ["count(*) AS n", "sum(length(value)) AS value_bytes", "sum(length(key)) AS key_bytes",
       "max(offset) AS max_offset", "max(timestamp) AS max_ts", "count(DISTINCT partition) AS partitions"]


def floor_source(slices: list[int], value_bytes: int):  # noqa: ANN201
    """A Python data source with the kafka-remote schema whose readers yield one prebuilt Arrow batch (sliced) per
    input partition: no I/O, no decode. Its time is what Spark's Python data source path itself costs."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class Part(InputPartition):
        def __init__(self, rows: int) -> None:
            self.rows = rows

    class Reader(DataSourceReader):
        def partitions(self):  # noqa: ANN202
            return [Part(n) for n in slices]

        def read(self, part):  # noqa: ANN001, ANN202
            import pyarrow as pa

            from rlm.spark.executor import BATCH_ROWS, arrow_schema

            n = min(BATCH_ROWS, part.rows)
            value = bytes(value_bytes)
            batch = pa.RecordBatch.from_arrays([
                pa.array([b"key-%d" % i for i in range(n)], pa.binary()), pa.array([value] * n, pa.binary()),
                pa.array(["bench-spark"] * n, pa.string()), pa.array([0] * n, pa.int32()),
                pa.array(range(n), pa.int64()),
                pa.array([1_700_000_000_000_000] * n, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                pa.array([0] * n, pa.int32())], schema=arrow_schema(False))
            left = part.rows
            while left > 0:
                b = batch.slice(0, min(left, n))
                left -= b.num_rows
                yield b

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "kafka-remote-floor"

        def schema(self):  # noqa: ANN202
            return arrow_schema_ddl()

        def reader(self, schema):  # noqa: ANN001, ANN202
            return Reader()

    return Floor


def arrow_schema_ddl() -> str:
    return ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
            "timestampType int")


def tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds (user + system, reaped children included) of this process and all its descendants: the Spark
    JVM, its Python workers and the broker (Linux ``/proc``). Unlike wall time, it barely moves with the load of
    other work on the machine."""
    root = os.getpid() if root is None else root
    cpu: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone
        fields = stat[stat.rindex(")") + 2:].split()  # state ppid ... utime(11) stime cutime cstime
        cpu[int(d)] = sum(int(x) for x in fields[11:15])
        children.setdefault(int(fields[1]), []).append(int(d))
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += cpu.get(pid, 0)
        stack += children.get(pid, [])
    return total / os.sysconf("SC_CLK_TCK")


def timed(df) -> tuple[float, dict, float]:  # noqa: ANN001
    """(wall seconds, the aggregate row, CPU seconds of the whole process tree) of one run of AGG over ``df``."""
    c0 = tree_cpu_s()
    t0 = time.perf_counter()
    row = df.selectExpr(*AGG).collect()[0].asDict()
    return time.perf_counter() - t0, row, tree_cpu_s() - c0


def best_of_rounds(sources: list[tuple[str, object]], repeat: int, expect_n: int,
                   runs: list[list[tuple[float, dict, float]]] | None = None) -> list[tuple[float, dict, float]]:
    """Run every source once per round, ``repeat`` rounds (JIT warm-up and the machine's load are shared alike):
    per source (best wall seconds, the aggregate row, least CPU seconds). Every run is appended to ``runs`` (one
    list per source) when given."""
    if runs is None:
        runs = []
    runs[:] = [[] for _ in sources]
    for _ in range(repeat):
        for i, (name, df) in enumerate(sources):
            secs, row, cpu = timed(df)
            if row["n"] != expect_n:
                raise SystemExit(f"{name} returned {row['n']} records, expected {expect_n}")
            runs[i].append((secs, row, cpu))
            print(f"  {name}: {secs:.2f}s, {cpu:.2f} CPU s, load {os.getloadavg()[0]:.1f}", flush=True)
    return [(min(r[0] for r in rs), rs[-1][1], min(r[2] for r in rs)) for rs in runs]



def drain(df, checkpoint: Path, name: str) -> tuple[float, int, int, float]:  # noqa: ANN001
    """Run a streaming query over ``df`` with Trigger.AvailableNow into the noop sink: (seconds, records,
    micro-batches with records, CPU seconds)."""
    c0 = tree_cpu_s()
    t0 = time.perf_counter()
    q = (df.writeStream.format("noop").trigger(availableNow=True)
         .option("checkpointLocation", str(checkpoint)).start())
    q.awaitTermination()
    secs = time.perf_counter() - t0
    cpu = tree_cpu_s() - c0
    if q.exception() is not None:
        raise SystemExit(f"{name}: {q.exception()}")
    counts = [p.numInputRows for p in q.recentProgress if p.numInputRows]
    print(f"  {name}: {sum(counts):,} records in {len(counts)} micro-batches, {secs:.2f}s, {cpu:.2f} CPU s, "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
    return secs, sum(counts), len(counts), cpu


def active_base(kafka: KafkaCluster, topic: str, partition: int) -> int:
    """The base offset of the partition's active (newest local) segment."""
    logs = sorted((kafka.node(1).log_dirs[0] / f"{topic}-{partition}").glob("*.log"))
    return int(logs[-1].name[:20])


def store_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


def local_segments(kafka: KafkaCluster, topic: str, partition: int) -> int:
    return len(list((kafka.node(1).log_dirs[0] / f"{topic}-{partition}").glob("*.log")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--codec", default="lz4", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--segment-bytes", type=int, default=16 << 20)
    ap.add_argument("--max-offsets-per-trigger", type=int, default=250_000, help="streaming rows")
    ap.add_argument("--only-remote", action="store_true",
                    help="only the kafka-remote batch rows, plain and encrypted (encryption overhead)")
    ap.add_argument("--s3-latency", action="store_true",
                    help="with --only-remote: the store on s3proxy behind the S3 latency emulator; kafka-remote with "
                         "the store's defaults vs read-ahead off")
    ap.add_argument("--latency-arg", action="append", default=[],
                    help="with --s3-latency: passed to devtools.s3latency as is, e.g. "
                         "--latency-arg=--bandwidth-mb-per-s=60")
    args = ap.parse_args()
    only = args.only_remote
    if args.s3_latency and not only:
        raise SystemExit("--s3-latency needs --only-remote (the broker rows do not read the sidecar's store)")

    import pyspark

    connector, jars = "", []
    if not only:
        try:
            connector, jars = spark_kafka_jars(pyspark.__version__)
        except RuntimeError as err:
            raise SystemExit(str(err)) from None
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    kafka_remote = tmp / "kafka-remote"
    kafka_remote.mkdir()
    s3 = EmulatedS3(tmp / "s3proxy", bucket="bench-spark", latency_args=args.latency_arg) if args.s3_latency else None
    if s3 is not None:
        s3.__enter__()
        print(s3.describe(), flush=True)
    kafka = KafkaCluster(brokers=1, broker_config=kafka_tiered_storage_config(kafka_remote), heap="1g")
    kafka.start()
    spark = None
    try:
        topic, kt_topic = "bench-spark", "bench-spark-kt"
        seg_cfg = {"segment.bytes": str(args.segment_bytes), "retention.ms": "-1", "retention.bytes": "-1"}
        topic_id = kafka.create_topic(topic, args.partitions, config=seg_cfg)
        topics = [topic]
        if not only:
            kafka.create_topic(kt_topic, args.partitions, config={**seg_cfg, "remote.storage.enable": "true"})
            topics.append(kt_topic)
        t0 = time.perf_counter()
        for t in topics:
            produce(kafka, t, args.partitions, args.records, args.value_bytes, args.codec)
        print(f"produced {args.records:,} records x {len(topics)} topics in {time.perf_counter() - t0:.1f}s",
              flush=True)
        tps = [TopicIdPartition(topic_id, topic, p) for p in range(args.partitions)]
        # The key file of the encrypted store: one random KEK (only its path goes into any configuration)
        key_file = tmp / "keys.json"
        key_file.write_text(json.dumps({"bench-k1": base64.b64encode(os.urandom(32)).decode()}))
        key_file.chmod(0o600)
        encryption = {"enabled": True, "active_key_id": "bench-k1", "key_file": str(key_file)}

        def tier(root: Path, store: dict) -> tuple[SidecarSettings, dict[int, int], float, float]:
            """Tier every rolled segment of ``topic`` with a new sidecar (its own store root under ``root`` and
            its own metadata topic): (settings, per-partition remote end, seconds, CPU seconds of all processes;
            the broker and the sidecar's polling intervals included)."""
            where = {"root_path": str(root / "remote")} if s3 is None else {**s3.store(key_prefix=f"{root.name}/"),
                                                                            "root_path": None}
            settings = make_settings(kafka, root, store={"store": "fs", **where, "block_size_bytes": 4 << 20,
                                                         **store}, topics={"include": [topic]})
            c0, t0 = tree_cpu_s(), time.perf_counter()
            car = Sidecar(settings).start()
            try:
                # every rolled segment tiered: the remote end is the start of the active segment - 1
                for tp in tps:
                    base = active_base(kafka, topic, tp.partition)
                    wait_for(lambda tp=tp, b=base: latest_remote(car, tp) >= b - 1, 600,
                             f"{tp} to be tiered up to {base - 1}")
                secs, cpu = time.perf_counter() - t0, tree_cpu_s() - c0
                return settings, {tp.partition: latest_remote(car, tp) + 1 for tp in tps}, secs, cpu
            finally:
                car.stop()

        settings, ours_end, tier_s, tier_cpu = tier(tmp, {})
        enc_root = tmp / "encrypted"
        if s3 is None:
            enc_settings, enc_end, enc_tier_s, enc_tier_cpu = tier(enc_root, {"encryption": encryption})
            index = next((enc_root / "remote").rglob("*-index")).read_bytes()
            if int.from_bytes(index[:4], "big") != 0x3D1FE5C1:
                raise SystemExit("the encrypted store's copies are not encrypted (index object magic)")
        else:  # the S3 rows compare read-ahead, not encryption
            enc_settings, enc_end, enc_tier_s, enc_tier_cpu = settings, ours_end, tier_s, tier_cpu
        print(f"sidecar tiering (one run each, polling included): plain {tier_s:.2f}s, {tier_cpu:.2f} CPU s; "
              f"encrypted {enc_tier_s:.2f}s, {enc_tier_cpu:.2f} CPU s", flush=True)
        ends = {p: min(ours_end[p], enc_end[p]) for p in ours_end}
        rolled, kt_end = 0, dict(ends)
        if not only:
            # Kafka's tiered storage: every rolled segment copied, then the local copies expired
            rolled = sum(local_segments(kafka, kt_topic, p) - 1 for p in range(args.partitions))
            wait_for(lambda: kafka_remote_segments(kafka_remote) >= rolled, 900,
                     f"Kafka's tiered storage to copy {rolled} segments of {kt_topic}")
            set_topic_config(kafka.bootstrap_servers, kt_topic, {"local.retention.ms": "1000"})
            wait_for(lambda: all(local_segments(kafka, kt_topic, p) == 1 for p in range(args.partitions)), 600,
                     f"the broker to delete the tiered segments of {kt_topic} locally", 0.5)
            kt_end = {p: active_base(kafka, kt_topic, p) for p in range(args.partitions)}
            ends = {p: min(ends[p], kt_end[p]) for p in ends}
        tiered = sum(ends.values())
        if tiered == 0:
            raise SystemExit("no segment rolled: produce more records (--records) or lower --segment-bytes")
        objects = (f"{len(list((tmp / 'remote').rglob('*')))} objects" if s3 is None else
                   f"{len(s3.server.client().list_objects_v2(Bucket=s3.bucket).get('Contents', []))} S3 objects")
        print(f"tiered {tiered:,} records in every tier (sidecar store: {objects}, "
              f"{sum(ours_end.values()):,} records; encrypted: {sum(enc_end.values()):,} records; "
              f"Kafka's: {rolled} segments, {sum(kt_end.values()):,} records); broker holds "
              f"{sum(broker_end(kafka, topic, p) for p in ends):,}", flush=True)

        os.environ["PYSPARK_PYTHON"] = sys.executable
        from pyspark.sql import SparkSession

        from rlm.spark import register

        builder = (SparkSession.builder.master(f"local[{args.cores}]").appName("bench-spark")
                   .config("spark.pyspark.python", sys.executable)
                   .config("spark.driver.memory", "2g")
                   .config("spark.ui.enabled", "false"))
        if jars:
            builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
        spark = builder.getOrCreate()
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        remote_opts = {"subscribe": topic, "kafka.bootstrap.servers": kafka.bootstrap_servers,
                       "metadata.topic": settings.metadata.topic, "store": "fs",
                       "store.root_path": str(tmp / "remote")}
        if s3 is not None:  # executors rebuild the store from these (rlm.spark.options: store.<RsmConfig field>)
            remote_opts = {**{k: v for k, v in remote_opts.items() if not k.startswith("store")},
                           **{("store" if k == "store" else f"store.{k}"): str(v)
                              for k, v in s3.store(key_prefix=f"{tmp.name}/").items()}}

        def ending(t: str) -> str:
            return json.dumps({t: {str(p): e for p, e in ends.items()}})

        remote = spark.read.format("kafka-remote").options(**remote_opts).option("endingOffsets", ending(topic)).load()
        # Spark options are strings: the encryption section goes as JSON (the key file's path, never the keys)
        enc_opts = {**remote_opts, "metadata.topic": enc_settings.metadata.topic,
                    "store.root_path": str(enc_root / "remote"),
                    "store.encryption": json.dumps({"key_file": str(key_file)})}
        remote_enc = (spark.read.format("kafka-remote").options(**enc_opts)
                      .option("endingOffsets", ending(topic)).load())
        remote_name, enc_name = "kafka-remote (sidecar's remote tier)", "kafka-remote encrypted (AES-256-GCM)"

        batch_runs: list[list[tuple[float, dict, float]]] = []  # every run of every batch source, by round

        def overhead(rows: list[tuple[str, int, float, float, str]]) -> None:
            by = {name: (secs, cpu) for name, _, secs, cpu, _ in rows}
            (ps, pc), (es, ec) = by[remote_name], by[enc_name]
            # the same, round by round (the two reads run back to back in each round), round 1 (warm-up) left out
            paired = [(e[0] / p[0], e[2] / p[2]) for p, e in list(zip(*batch_runs[:2], strict=True))[1:]]
            med = (f"; median of the per-round ratios (rounds 2-{len(batch_runs[0])}): "
                   f"{(statistics.median(w for w, _ in paired) - 1) * 100:+.0f}% wall, "
                   f"{(statistics.median(c for _, c in paired) - 1) * 100:+.0f}% CPU") if paired else ""
            print(f"\nencryption overhead, kafka-remote batch read: {es:.2f} vs {ps:.2f} s = "
                  f"{(es / ps - 1) * 100:+.0f}% wall, {ec:.2f} vs {pc:.2f} CPU s = {(ec / pc - 1) * 100:+.0f}% CPU "
                  f"(best of each){med} (goal < 15%)")
            print(f"encryption overhead, sidecar tiering (one run each, polling included): {enc_tier_s:.2f} vs "
                  f"{tier_s:.2f} s = {(enc_tier_s / tier_s - 1) * 100:+.0f}% wall, {enc_tier_cpu:.2f} vs "
                  f"{tier_cpu:.2f} CPU s = {(enc_tier_cpu / tier_cpu - 1) * 100:+.0f}% CPU; store bytes "
                  f"{store_bytes(enc_root / 'remote'):,} vs {store_bytes(tmp / 'remote'):,}")

        if s3 is not None:
            one_opts = {**remote_opts, "store.read_ahead_bytes": "0", "store.block_cache_bytes": "0"}
            remote_one = (spark.read.format("kafka-remote").options(**one_opts)
                          .option("endingOffsets", ending(topic)).load())
            names = ["kafka-remote on S3 latency, store defaults", "kafka-remote on S3 latency, read-ahead off"]
            results = best_of_rounds(list(zip(names, [remote, remote_one], strict=True)), args.repeat, tiered)
            if results[0][1] != results[1][1]:
                raise SystemExit(f"the sources disagree: {results[0][1]} vs {results[1][1]}")
            print()
            print(f"{args.records:,} records x {args.value_bytes} B values, codec {args.codec}, {args.partitions} "
                  f"partitions, local[{args.cores}], pyspark {pyspark.__version__}, {os.cpu_count()} cores, best of "
                  f"{args.repeat} rounds, load {os.getloadavg()[0]:.1f}; {s3.describe()}")
            pages = s3.server.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket,
                                                                                 Prefix=f"{tmp.name}/")
            stored = sum(o["Size"] for page in pages for o in page.get("Contents", []))  # data and index objects
            print(f"{'source':44} {'records':>10} {'seconds':>8} {'records/s':>11} {'MB/s':>6} {'CPU s':>7}")
            notes = ["64 MiB of ranged GETs ahead per reader", "store.read_ahead_bytes=0, store.block_cache_bytes=0: "
                     "one GET at a time (the one-connection figure)"]
            for name, (secs, _row, cpu), note in zip(names, results, notes, strict=True):
                print(f"{name:44} {tiered:>10,} {secs:>8.2f} {tiered / secs:>11,.0f} {stored / secs / 1e6:>6.0f} "
                      f"{cpu:>7.2f}  {note}")
            print(f"read-ahead on / off: {results[1][0] / results[0][0]:.2f}x the records/s; MB/s: the store's "
                  f"{stored / 1e6:.0f} MB (every tiered segment, a little more than the records read) per second")
            return
        if only:
            results = best_of_rounds([(remote_name, remote), (enc_name, remote_enc)], args.repeat, tiered, batch_runs)
            if results[0][1] != results[1][1]:
                raise SystemExit(f"the sources disagree: {results[0][1]} vs {results[1][1]}")
            rows = [(remote_name, tiered, results[0][0], results[0][2], "executors read the store"),
                    (enc_name, tiered, results[1][0], results[1][2], "executors decrypt (key file)")]
            print()
            print(f"{args.records:,} records x {args.value_bytes} B values, codec {args.codec}, {args.partitions} "
                  f"partitions, local[{args.cores}], pyspark {pyspark.__version__}, {os.cpu_count()} cores, best of "
                  f"{args.repeat} rounds, load {os.getloadavg()[0]:.1f}")
            print(f"{'source':44} {'records':>10} {'seconds':>8} {'records/s':>11} {'CPU s':>7}")
            for name, n, secs, cpu, note in rows:
                print(f"{name:44} {n:>10,} {secs:>8.2f} {n / secs:>11,.0f} {cpu:>7.2f}  {note}")
            overhead(rows)
            return

        def broker(t: str):  # noqa: ANN202
            return (spark.read.format("kafka").option("subscribe", t)
                    .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
                    .option("startingOffsets", "earliest").option("endingOffsets", ending(t)).load())

        # The executor's code alone, in this process, one core, no Spark: where the source's time goes.
        from rlm.spark.executor import read_slice
        from rlm.spark.options import parse_options
        from rlm.spark.planning import plan_slices

        opts = parse_options({**remote_opts, "endingOffsets": ending(topic)})
        t0 = time.perf_counter()
        slices = plan_slices(opts)
        plan_s = time.perf_counter() - t0
        t0, c0 = time.perf_counter(), time.process_time()
        n_alone = sum(b.num_rows for sl in slices for b in read_slice(sl))
        alone_s, alone_cpu = time.perf_counter() - t0, time.process_time() - c0
        if n_alone != tiered:
            raise SystemExit(f"read_slice returned {n_alone} records, expected {tiered}")
        # Spark's Python data source path alone: the same number of rows in the same slices, from memory.
        spark.dataSource.register(floor_source(
            [min(sl.to_offset_inclusive, sl.segment.end_offset_inclusive)
             - max(sl.from_offset, sl.segment.start_offset) + 1 for sl in slices], args.value_bytes))
        names = [remote_name, enc_name, f"kafka {connector} (broker, local log)",
                 f"kafka {connector} (broker, Kafka-tiered)", "floor: same rows from memory"]
        notes = ["executors read the store", "executors decrypt (key file)", "", "LocalTieredStorage, local expired",
                 "Spark's Python data source path, no I/O"]
        dfs = [remote, remote_enc, broker(topic), broker(kt_topic), spark.read.format("kafka-remote-floor").load()]
        results = best_of_rounds(list(zip(names, dfs, strict=True)), args.repeat, tiered, batch_runs)
        rows: list[tuple[str, int, float, float, str]] = [  # name, records, seconds, CPU seconds, note
            (name, tiered, secs, cpu, note) for name, (secs, _, cpu), note in zip(names, results, notes, strict=True)]
        r_remote, r_enc, r_local, r_kt = (r[1] for r in results[:4])
        if r_remote != r_local or r_enc != r_remote:
            raise SystemExit(f"the sources disagree: {r_remote} vs {r_enc} vs {r_local}")
        same = ("n", "value_bytes", "key_bytes", "max_offset", "partitions")  # the tiered copy has its own timestamps
        if any(r_remote[k] != r_kt[k] for k in same):
            raise SystemExit(f"the sources disagree: {r_remote} vs {r_kt}")

        # Streaming: drain the backlog in maxOffsetsPerTrigger micro-batches.
        mopt = str(args.max_offsets_per_trigger)
        streams = [
            ("stream: kafka-remote", spark.readStream.format("kafka-remote").options(**remote_opts)
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", mopt).load()),
            *((f"stream: kafka {connector} ({where})", spark.readStream.format("kafka").option("subscribe", t)
               .option("kafka.bootstrap.servers", kafka.bootstrap_servers).option("startingOffsets", "earliest")
               .option("maxOffsetsPerTrigger", mopt).load())
              for t, where in ((topic, "local log"), (kt_topic, "Kafka-tiered"))),
        ]
        drains: list[list[tuple[float, int, int, float]]] = [[] for _ in streams]
        for r in range(args.repeat):  # rounds, as for the batch rows; each query from its own new checkpoint
            for i, (name, df) in enumerate(streams):
                drains[i].append(drain(df, tmp / f"checkpoint-{r}-{i}", name))
        for (name, _), runs in zip(streams, drains, strict=True):
            secs, n, batches, _ = min(runs)
            rows.append((name, n, secs, min(x[3] for x in runs),
                         f"{batches} micro-batches of <= {args.max_offsets_per_trigger:,}"))

        print()
        print(f"{args.records:,} records x {args.value_bytes} B values, codec {args.codec}, {args.partitions} "
              f"partitions, local[{args.cores}], pyspark {pyspark.__version__}, {os.cpu_count()} cores, load "
              f"{os.getloadavg()[0]:.1f}")
        rate = {name: n / secs for name, n, secs, _, _ in rows}
        cpu_rate = {name: n / cpu for name, n, _, cpu, _ in rows}
        local, kt = rows[2][0], rows[3][0]
        print(f"{'source':44} {'records':>10} {'seconds':>8} {'records/s':>11} {'/local':>7} {'/tiered':>8} "
              f"{'CPU s':>7} {'/local':>7} {'/tiered':>8}")
        for name, n, secs, cpu, note in rows:
            print(f"{name:44} {n:>10,} {secs:>8.2f} {n / secs:>11,.0f} {rate[name] / rate[local]:>6.2f}x "
                  f"{rate[name] / rate[kt]:>7.2f}x {cpu:>7.2f} {cpu_rate[name] / cpu_rate[local]:>6.2f}x "
                  f"{cpu_rate[name] / cpu_rate[kt]:>7.2f}x  {note}")
        print(f"{'read_slice alone, 1 core, no Spark':44} {n_alone:>10,} {alone_s:>8.2f} {n_alone / alone_s:>11,.0f}"
              f"{'':17} {alone_cpu:>7.2f}{'':17}  + {plan_s:.2f}s planning {len(slices)} slices")
        print("(ratios: records/s over the kafka source's records/s, wall time and CPU time of every process: Spark's "
              "JVM, its Python workers, the broker)")
        sr = [r[0] for r in rows if r[0].startswith("stream:")]
        print(f"\nkafka-remote batch: {rate[remote_name] / rate[local]:.2f}x Spark's kafka source on the local log "
              f"(goal 2x), {rate[remote_name] / rate[kt]:.2f}x on Kafka-tiered data (goal 3x); streaming: "
              f"{rate[sr[0]] / rate[sr[1]]:.2f}x / {rate[sr[0]] / rate[sr[2]]:.2f}x")
        overhead(rows)
    finally:
        if spark is not None:
            spark.stop()
        kafka.stop()
        if s3 is not None:
            s3.__exit__()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
