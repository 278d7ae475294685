"""The ``kafka-remote`` source over encrypted copies: the real sidecar tiers with ``store.encryption`` on, Spark's
executors build their storage manager from the store options, read the keys from the key file themselves and
decrypt; every record comes back exactly, and no key material is in the plan."""

from __future__ import annotations

import base64
import json
import random
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from devtools.devkafka import KafkaCluster
from tests.support.kafka import produce
from tests.support.spark import SEGMENT_MS, Produced, TieredData, collect, expected, load, tier

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

KEK = bytes(range(7, 39))


@pytest.fixture(scope="module")
def encrypted_data(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> TieredData:
    topic = f"spark-enc-{uuid.uuid4().hex[:8]}"
    topic_id = kafka.create_topic(topic, 2, config={"segment.ms": str(SEGMENT_MS), "retention.ms": "-1"})
    data = TieredData(topic, {}, records={0: {}, 1: {}})
    base_ts = int(time.time() * 1000) - 3_600_000
    rnd = random.Random(15)
    for round_ in range(3):
        for p in (0, 1):
            recs = [(f"k{p}-{round_}-{i}".encode(), rnd.randbytes(50 + i % 90),
                     [("h", f"{i}".encode())] if i % 5 == 0 else [], base_ts + round_ * 100_000 + i)
                    for i in range(200)]
            acks = produce(kafka, topic, recs, partition=p, **{"compression.type": "lz4", "batch.size": 4096})
            for (_p, off), (k, v, h, ts) in zip(acks, recs, strict=True):
                data.records[p][off] = Produced(k, v, tuple(h), ts)
        time.sleep(SEGMENT_MS / 1000 + 0.2)
    for p in (0, 1):
        ts = base_ts + 3 * 100_000
        [(_p, off)] = produce(kafka, topic, [(b"__roll__", b"r", [], ts)], partition=p)
        data.records[p][off] = Produced(b"__roll__", b"r", (), ts)
    tmp = tmp_path_factory.mktemp("spark-enc")
    key_file = tmp / "keys.json"
    key_file.write_text(json.dumps({"spark-k1": base64.b64encode(KEK).decode()}))
    encryption = {"enabled": True, "active_key_id": "spark-k1", "key_file": str(key_file)}
    store = {"store": "fs", "root_path": str(tmp / "remote"), "block_size_bytes": 4096,
             "encryption": encryption}
    # Spark options are strings: the encryption section goes as JSON (it names the key file, not the keys)
    data.options.update({"store": "fs", "store.root_path": str(tmp / "remote"),
                         "store.encryption": json.dumps({"key_file": str(key_file)})})
    tier(kafka, tmp, data, topic_id, store, 2)
    return data


@pytest.mark.slow
def test_encrypted_copies_read_exactly_in_the_executors(spark: Any, encrypted_data: TieredData) -> None:
    data = encrypted_data
    root = Path(data.options["store.root_path"])
    index = next(root.rglob("*-index")).read_bytes()
    assert int.from_bytes(index[:4], "big") == 0x3D1FE5C1  # the copies really are sealed
    df = load(spark, data, subscribe=data.topic, includeHeaders="true")
    got = collect(df)
    want = expected(data)
    assert len(want) >= 2 * 600 and got == want
    # split into block ranges: several tasks per segment, each opening its blocks on its own
    split = load(spark, data, subscribe=data.topic, maxPartitionBytes=str(8192))
    assert split.rdd.getNumPartitions() > sum(data.segments.values())
    assert collect(split) == expected(data, headers=False)
    plan = df._jdf.queryExecution().toString()
    for form in (base64.b64encode(KEK).decode(), KEK.hex()):
        assert form not in plan


def test_without_the_key_the_read_fails_naming_the_key_id(spark: Any, encrypted_data: TieredData,
                                                          tmp_path: Path) -> None:
    data = encrypted_data
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"spark-k2": base64.b64encode(bytes(32)).decode()}))
    opts = {**data.options, "store.encryption": json.dumps({"key_file": str(other)})}
    with pytest.raises(Exception, match="spark-k1") as exc:
        spark.read.format("kafka-remote").options(**opts).option("subscribe", data.topic).load().collect()
    assert base64.b64encode(KEK).decode() not in str(exc.value)
