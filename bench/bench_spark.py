"""Spark over the remote tier (``kafka-remote``) vs Spark's own Kafka source reading the broker: same records,
same cores, one run, one table.

Starts one real broker, produces ``--records`` records into ``--partitions`` partitions (``--value-bytes`` random
values, keys, one codec), lets the real sidecar tier every rolled segment to the filesystem store, then runs
the same aggregation (``count(*)``, ``sum(length(value))``, ``sum(length(key))``, ``max(offset)``,
``max(timestamp)``: every column of every record is materialized) over exactly the tiered offsets with

- ``kafka-remote``: the driver plans from the metadata topic, executors read the store;
- ``kafka`` (Spark's source, ``spark-sql-kafka-0-10``): executors fetch from the broker.

Spark's connector is resolved with Maven (``devtools/spark_kafka.py``) from ``config/spark-kafka-pom.xml`` into
``.cache/spark-kafka/`` at the installed pyspark's version, or the newest Maven Central has (printed). Each source
runs ``--repeat`` times; the best run counts. Usage::

    .venv/bin/python bench/bench_spark.py [--records 2000000] [--partitions 2] [--codec lz4] [--cores 2]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Producer  # noqa: E402

from devtools.devkafka import KafkaCluster  # noqa: E402
from devtools.spark_kafka import spark_kafka_jars  # noqa: E402
from rlm.sidecar import Sidecar  # noqa: E402
from rlmm.api import PartitionNotServedError, TopicIdPartition  # noqa: E402
from tests.rlm.sidecar_util import make_settings, wait_for  # noqa: E402


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


def timed(df) -> tuple[float, dict]:  # noqa: ANN001
    t0 = time.perf_counter()
    row = df.selectExpr(*AGG).collect()[0].asDict()
    return time.perf_counter() - t0, row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--codec", default="lz4", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--segment-bytes", type=int, default=16 << 20)
    args = ap.parse_args()

    import pyspark

    try:
        connector, jars = spark_kafka_jars(pyspark.__version__)
    except RuntimeError as err:
        raise SystemExit(str(err)) from None
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    kafka = KafkaCluster(brokers=1)
    kafka.start()
    sidecar = None
    spark = None
    try:
        topic = "bench-spark"
        topic_id = kafka.create_topic(topic, args.partitions, config={
            "segment.bytes": str(args.segment_bytes), "retention.ms": "-1"})
        t0 = time.perf_counter()
        produce(kafka, topic, args.partitions, args.records, args.value_bytes, args.codec)
        print(f"produced {args.records:,} records in {time.perf_counter() - t0:.1f}s", flush=True)
        settings = make_settings(kafka, tmp, store={"store": "fs", "root_path": str(tmp / "remote"),
                                                    "block_size_bytes": 4 << 20})
        sidecar = Sidecar(settings).start()
        tps = [TopicIdPartition(topic_id, topic, p) for p in range(args.partitions)]
        # every rolled segment tiered: the remote end is the start of the active segment - 1
        for tp in tps:
            logs = sorted((kafka.node(1).log_dirs[0] / f"{topic}-{tp.partition}").glob("*.log"))
            active_base = int(logs[-1].name[:20])
            wait_for(lambda tp=tp, b=active_base: latest_remote(sidecar, tp) >= b - 1, 600,
                     f"{tp} to be tiered up to {active_base - 1}")
        ends = {tp.partition: latest_remote(sidecar, tp) + 1 for tp in tps}
        sidecar.stop()
        sidecar = None
        tiered = sum(ends.values())
        if tiered == 0:
            raise SystemExit("no segment rolled: produce more records (--records) or lower --segment-bytes")
        print(f"tiered {tiered:,} records ({len(list((tmp / 'remote').rglob('*')))} objects); "
              f"broker holds {sum(broker_end(kafka, topic, p) for p in ends):,}", flush=True)

        os.environ["PYSPARK_PYTHON"] = sys.executable
        from pyspark.sql import SparkSession

        from rlm.spark import register

        spark = (SparkSession.builder.master(f"local[{args.cores}]").appName("bench-spark")
                 .config("spark.pyspark.python", sys.executable)
                 .config("spark.jars", ",".join(str(j) for j in jars))
                 .config("spark.driver.memory", "2g")
                 .config("spark.ui.enabled", "false")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        ending = json.dumps({topic: {str(p): e for p, e in ends.items()}})
        remote = (spark.read.format("kafka-remote").option("subscribe", topic)
                  .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
                  .option("metadata.topic", settings.metadata.topic)
                  .option("store", "fs").option("store.root_path", str(tmp / "remote"))
                  .option("endingOffsets", ending).load())
        broker = (spark.read.format("kafka").option("subscribe", topic)
                  .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
                  .option("startingOffsets", "earliest").option("endingOffsets", ending).load())
        results = {}
        for name, df in (("kafka-remote (store)", remote), (f"kafka {connector} (broker)", broker)):
            best = None
            for _ in range(args.repeat):
                secs, row = timed(df)
                if row["n"] != tiered:
                    raise SystemExit(f"{name} returned {row['n']} records, expected {tiered}")
                best = secs if best is None else min(best, secs)
            results[name] = (best, row)
            print(f"  {name}: best {best:.2f}s of {args.repeat}", flush=True)
        # The executor's code alone, in this process, one core, no Spark: where the source's time goes.
        from rlm.spark.executor import read_slice
        from rlm.spark.options import parse_options
        from rlm.spark.planning import plan_slices

        opts = parse_options({"subscribe": topic, "kafka.bootstrap.servers": kafka.bootstrap_servers,
                              "metadata.topic": settings.metadata.topic, "store": "fs",
                              "store.root_path": str(tmp / "remote"), "endingOffsets": ending})
        t0 = time.perf_counter()
        slices = plan_slices(opts)
        plan_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        n_alone = sum(b.num_rows for sl in slices for b in read_slice(sl))
        alone_s = time.perf_counter() - t0
        if n_alone != tiered:
            raise SystemExit(f"read_slice returned {n_alone} records, expected {tiered}")
        # Spark's Python data source path alone: the same number of rows in the same slices, from memory.
        spark.dataSource.register(floor_source(
            [min(sl.to_offset_inclusive, sl.segment.end_offset_inclusive)
             - max(sl.from_offset, sl.segment.start_offset) + 1 for sl in slices], args.value_bytes))
        floor_df = spark.read.format("kafka-remote-floor").load()
        floor_s = None
        for _ in range(args.repeat):
            secs, frow = timed(floor_df)
            floor_s = secs if floor_s is None else min(floor_s, secs)
        rows = list(results.values())
        if rows[0][1] != rows[1][1]:
            raise SystemExit(f"the sources disagree: {rows[0][1]} vs {rows[1][1]}")
        print()
        print(f"{args.records:,} records x {args.value_bytes} B values, codec {args.codec}, {args.partitions} "
              f"partitions, local[{args.cores}], pyspark {pyspark.__version__}")
        print(f"{'source':32} {'records':>12} {'seconds':>9} {'records/s':>12} {'vs kafka':>9}")
        base = rows[1][0]
        for name, (secs, row) in results.items():
            print(f"{name:32} {row['n']:>12,} {secs:>9.2f} {row['n'] / secs:>12,.0f} {base / secs:>8.2f}x")
        print(f"{'floor: same rows from memory':32} {frow['n']:>12,} {floor_s:>9.2f} {frow['n'] / floor_s:>12,.0f} "
              f"{base / floor_s:>8.2f}x  (Spark's Python data source path, no I/O, no decode)")
        print(f"{'read_slice alone, 1 core':32} {n_alone:>12,} {alone_s:>9.2f} {n_alone / alone_s:>12,.0f} "
              f"{'':>9}  (+ {plan_s:.2f}s planning {len(slices)} slices)")
    finally:
        if spark is not None:
            spark.stop()
        if sidecar is not None:
            sidecar.stop()
        kafka.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
