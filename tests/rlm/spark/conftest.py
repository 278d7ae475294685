"""Spark tests: remote segments the real broker wrote, tiered by the real sidecar (the ``spark`` session
fixture is in ``tests/support/fixtures.py``).

- ``codec_data``: topic with 5 partitions, partition i produced with codec i (none, gzip, snappy, lz4, zstd):
  keys (some null), values (random bytes, some null, a few of 9000 bytes), headers (some with null values; none
  in the second round), explicit timestamps
  (not monotonic); small producer batches; several segments per partition, of several 16 KiB blocks, tiered to S3
  (moto over HTTP). What was produced is kept with the offsets from the producer's delivery reports.
- ``txn_data``: one partition with a committed, an aborted and a committed transaction, tiered to the filesystem
  store.
"""

from __future__ import annotations

import random
import time
import uuid

import pytest
from confluent_kafka import Producer

from devtools.devkafka import KafkaCluster
from tests.support.kafka import CODECS, produce
from tests.support.spark import Produced, TieredData, tier

ROUNDS = 3
PER_ROUND = 300
SEGMENT_MS = 400
ROUND_MS = 100_000  # record time between rounds: each round is a segment of its own


@pytest.fixture(scope="session")
def codec_data(kafka: KafkaCluster, s3_endpoint: str, tmp_path_factory: pytest.TempPathFactory) -> TieredData:
    topic = f"spark-codecs-{uuid.uuid4().hex[:8]}"
    n = len(CODECS)
    topic_id = kafka.create_topic(topic, n, config={"segment.ms": str(SEGMENT_MS), "retention.ms": "-1"})
    rnd = random.Random(405)
    base_ts = int(time.time() * 1000) - 3_600_000
    data = TieredData(topic, {})
    for p in range(n):
        data.records[p] = {}
    for round_ in range(ROUNDS):
        for p, codec in enumerate(CODECS):
            recs = []
            for i in range(PER_ROUND):
                idx = round_ * PER_ROUND + i
                key = None if i % 11 == 0 else f"k{p}-{idx}".encode()
                value = None if i % 37 == 5 else rnd.randbytes(9000 if i % 97 == 50 else rnd.randint(0, 400))
                # round 1 has no headers: its batches take the executors' columnar decode (rlm.spark.columns),
                # the others' the record-by-record one
                headers = [] if i % 3 or round_ == 1 else [("h1", f"x{idx}".encode()), ("h2", None), ("h1", b"")]
                # a round spans < segment.ms of record time (the broker rolls on record time); not monotonic
                ts = base_ts + round_ * ROUND_MS + i - (25 if idx % 7 == 0 else 0)
                recs.append((key, value, headers, ts))
            acks = produce(kafka, topic, recs, partition=p, **{"compression.type": codec, "batch.size": 8192})
            for (_p, off), (k, v, h, ts) in zip(acks, recs, strict=True):
                data.records[p][off] = Produced(k, v, tuple(h), ts)
        time.sleep(SEGMENT_MS / 1000 + 0.2)
    for p in range(n):  # rolls the segment holding the last round; this record stays local (active segment)
        # the broker rolls on record time: this timestamp is segment.ms past the last round's max timestamp
        ts = base_ts + ROUNDS * ROUND_MS
        [(_p, off)] = produce(kafka, topic, [(b"__roll__", b"r", [], ts)], partition=p)
        data.records[p][off] = Produced(b"__roll__", b"r", (), ts)
    bucket = f"spark-{uuid.uuid4().hex[:8]}"
    store = {"store": "s3", "bucket": bucket, "endpoint_url": s3_endpoint, "create_bucket": True,
             "block_size_bytes": 16 * 1024}  # several blocks per segment: block-range splits
    data.options.update({"store": "s3", "store.bucket": bucket, "store.endpoint_url": s3_endpoint})
    tier(kafka, tmp_path_factory.mktemp("spark-codecs"), data, topic_id, store, n)
    return data


@pytest.fixture(scope="session")
def txn_data(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> TieredData:
    topic = f"spark-txn-{uuid.uuid4().hex[:8]}"
    topic_id = kafka.create_topic(topic, 1, config={"segment.ms": str(SEGMENT_MS), "retention.ms": "-1"})
    data = TieredData(topic, {}, records={0: {}})
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"tx-{topic}",
                         "linger.ms": 5})
    producer.init_transactions(30)
    for n_txn, commit in enumerate((True, False, True)):
        producer.begin_transaction()
        batch: list[tuple[int, Produced]] = []

        def cb(err, msg, rec_list=batch) -> None:  # noqa: ANN001
            if err is not None:
                raise RuntimeError(f"delivery failed: {err}")
            rec_list.append((msg.offset(), Produced(msg.key(), msg.value(), (), msg.timestamp()[1])))

        for i in range(100):
            producer.produce(topic, key=f"t{n_txn}-{i}".encode(), value=f"v{n_txn}-{i}".encode() * 3,
                             partition=0, on_delivery=cb)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
            data.aborted.update(off for off, _r in batch)
        data.records[0].update(batch)
    time.sleep(SEGMENT_MS / 1000 + 0.2)
    [(_p, off)] = produce(kafka, topic, [(b"__roll__", b"r")])
    data.records[0][off] = Produced(b"__roll__", b"r", (), 0)
    tmp = tmp_path_factory.mktemp("spark-txn")
    store = {"store": "fs", "root_path": str(tmp / "remote"), "block_size_bytes": 64 * 1024}
    data.options.update({"store": "fs", "store.root_path": str(tmp / "remote")})
    tier(kafka, tmp, data, topic_id, store, 1)
    return data
