"""Reading ``kafka-remote`` with a real SparkSession (batch and streaming), and what a read must return."""

from __future__ import annotations

import random
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlm.spark.options import parse_options
from rlmm.api import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from tests.support.kafka import produce
from tests.support.sidecar import latest_remote, make_settings, remote_segments, wait_for

__all__ = ["CODECS", "PER_ROUND", "SEGMENT_MS", "Env", "Produced", "Record", "TieredData", "collect", "expected",
           "load", "options", "seg", "start", "stream", "tier"]


@dataclass(frozen=True)
class Produced:
    """A record as it was produced (kept under the offset of its delivery report)."""

    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...]
    timestamp_ms: int


@dataclass
class TieredData:
    """A topic produced and tiered for a read: where its tier is and what each partition holds up to the tier's end."""

    topic: str
    options: dict[str, str]                                   # where the remote tier is, for .options(**)
    records: dict[int, dict[int, Produced]] = field(default_factory=dict)   # partition -> offset -> record
    segments: dict[int, int] = field(default_factory=dict)                  # partition -> remote segments
    aborted: set[int] = field(default_factory=set)            # offsets of the aborted transaction's records


def tier(kafka: KafkaCluster, tmp: Path, data: TieredData, topic_id: uuid.UUID, store: dict[str, Any],
         partitions: int) -> None:
    """Run the sidecar until every produced record but the last (the active segment's roll record) is remote."""
    settings = make_settings(kafka, tmp, store=store)
    data.options.update({"kafka.bootstrap.servers": kafka.bootstrap_servers,
                         "metadata.topic": settings.metadata.topic})
    with Sidecar(settings) as sidecar:
        for p in range(partitions):
            tp = TopicIdPartition(topic_id, data.topic, p)
            last = sorted(data.records[p])[-2]
            wait_for(lambda tp=tp, last=last: latest_remote(sidecar, tp) >= last, 120,
                     f"{data.topic}-{p} to be remote up to offset {last}")
            end = latest_remote(sidecar, tp)
            data.records[p] = {o: r for o, r in data.records[p].items() if o <= end}
            data.segments[p] = len(sidecar.reader.segments(tp))

def load(spark: Any, data: TieredData, **options: str) -> Any:
    return spark.read.format("kafka-remote").options(**data.options).options(**options).load()

def collect(df: Any) -> dict[tuple[int, int], tuple]:
    """(partition, offset) -> (key, value, headers, timestamp ms, timestampType), one entry per row."""
    rows = df.selectExpr("*", "unix_millis(timestamp) AS ts_ms").collect()
    out: dict[tuple[int, int], tuple] = {}
    for r in rows:
        hdrs = tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in r["headers"]) \
            if "headers" in r else None
        k = (r["partition"], r["offset"])
        assert k not in out, f"offset {k} returned twice"
        out[k] = (None if r["key"] is None else bytes(r["key"]), None if r["value"] is None else bytes(r["value"]),
                  hdrs, r["ts_ms"], r["timestampType"])
    return out

def expected(data: TieredData, keep=lambda p, o, r: True, headers: bool = True) -> dict[tuple[int, int], tuple]:  # noqa: ANN001
    return {(p, o): (r.key, r.value, r.headers if headers else None, r.timestamp_ms, 0)
            for p, recs in data.records.items() for o, r in recs.items() if keep(p, o, r)}


TP = TopicIdPartition(uuid.UUID(int=3), "orders", 0)

def seg(start: int, end: int) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId(TP, uuid.uuid4()), start, end, 1, 1, 1, 100, ((0, start),),
                                    state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED)

def options(**extra: str):  # noqa: ANN201
    return parse_options({"subscribe": "orders", "kafka.bootstrap.servers": "127.0.0.1:1", "store": "fs",
                          "store.root_path": "/nonexistent", **extra})


SEGMENT_MS = 400

PER_ROUND = 200

CODECS = ("lz4", "zstd", "gzip", "snappy", "none")  # partition i of a topic is produced with codec i + codec_base

Record = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]

class Env:
    def __init__(self, kafka: KafkaCluster, sidecar: Sidecar, tag: str, options: dict[str, str]) -> None:
        self.kafka = kafka
        self.sidecar = sidecar
        self.tag = tag
        self.options = options
        self.topic_ids: dict[str, uuid.UUID] = {}
        self.sent: dict[str, dict[tuple[int, int], Record]] = {}
        self.rnd = random.Random(14)

    def create(self, topic: str, partitions: int) -> None:
        self.topic_ids[topic] = self.kafka.create_topic(topic, partitions, config={"segment.ms": str(SEGMENT_MS),
                                                                                   "retention.ms": "-1"})
        self.sent[topic] = {}

    def round(self, topic: str, partitions: int, per_round: int = PER_ROUND, codec_base: int = 0) -> None:
        """One segment per partition, then tiered: every record of it is remote once this returns (a one-record
        append rolls it; that record, in the active segment, is remote after the next round)."""
        for p in range(partitions):
            recs = []
            for i in range(per_round):
                key = None if i % 13 == 0 else f"k{p}-{i}-{self.rnd.random()}".encode()
                value = None if i % 41 == 7 else self.rnd.randbytes(self.rnd.randint(0, 300))
                headers = [] if i % 4 else [("h", f"x{i}".encode()), ("n", None)]
                recs.append((key, value, headers))
            codec = CODECS[(p + codec_base) % len(CODECS)]
            acks = produce(self.kafka, topic, recs, partition=p, **{"compression.type": codec, "batch.size": 8192})
            for (_p, off), (k, v, h) in zip(acks, recs, strict=True):
                self.sent[topic][(p, off)] = (k, v, tuple(h))
        time.sleep(SEGMENT_MS / 1000 + 0.1)
        for p in range(partitions):
            [(_p, off)] = produce(self.kafka, topic, [(b"__roll__", b"r", [])], partition=p)
            self.sent[topic][(p, off)] = (b"__roll__", b"r", ())
        for p in range(partitions):
            last = max(o for q, o in self.sent[topic] if q == p) - 1
            tp = TopicIdPartition(self.topic_ids[topic], topic, p)
            wait_for(lambda tp=tp, last=last: latest_remote(self.sidecar, tp) >= last, 90,
                     f"{topic}-{p} remote up to {last}")

    def tiered(self, topic: str) -> dict[tuple[int, int], Record]:
        """What was sent and is remote now (from the earliest remote offset to the latest tiered one)."""
        out = {}
        for (p, o), r in self.sent[topic].items():
            segs = remote_segments(self.sidecar, TopicIdPartition(self.topic_ids[topic], topic, p))
            if segs and segs[0].start_offset <= o <= segs[-1].end_offset_inclusive:
                out[(p, o)] = r
        return out

def stream(spark: Any, env: Env, topic: str, **options: str) -> Any:
    return (spark.readStream.format("kafka-remote").options(**env.options)
            .option("subscribe", topic).option("includeHeaders", "true").options(**options).load())

def start(df: Any, out: Path, checkpoint: Path, **trigger: Any) -> Any:
    w = df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(checkpoint))
    return (w.trigger(**trigger) if trigger else w.trigger(processingTime="500 milliseconds")).start()
