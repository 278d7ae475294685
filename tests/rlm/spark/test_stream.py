"""``readStream.format("kafka-remote")`` against the real broker and an in-process sidecar tiering while the query
runs: every record exactly once (byte-exact, every codec), segments tiered while the query runs, a restart from the
checkpoint, a partition added mid-stream, ``maxOffsetsPerTrigger`` per micro-batch with ``Trigger.AvailableNow``,
``failOnDataLoss`` both ways after remote retention deleted segments the query had not read, and read_committed."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewPartitions

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlm.spark.source import HEADERS_DDL, KAFKA_SCHEMA_DDL
from rlmm.api import TopicIdPartition
from tests.support.sidecar import latest_remote, make_settings, remote_segments, wait_for
from tests.support.spark import PER_ROUND, Env, Record, TieredData, start, stream


@pytest.fixture(scope="module")
def env(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tag = uuid.uuid4().hex[:8]
    tmp = tmp_path_factory.mktemp("spark-stream")
    # the loss topic keeps ~2 segments remote (a segment is ~30 KB): older ones are deleted by remote retention
    settings = make_settings(kafka, tmp, topics={"include": [f"stream-{tag}-.*"]},
                             retention=[{"pattern": f"stream-{tag}-loss", "retention_ms": -1,
                                         "retention_bytes": 70_000},
                                        {"pattern": ".*", "retention_ms": -1, "retention_bytes": -1}])
    options = {"kafka.bootstrap.servers": kafka.bootstrap_servers, "metadata.topic": settings.metadata.topic,
               "store": "fs", "store.root_path": str(tmp / "remote")}
    with Sidecar(settings) as sidecar:
        yield Env(kafka, sidecar, tag, options)


def sink(spark: Any, out: Path) -> dict[tuple[int, int], Record]:
    """(partition, offset) -> record of the file sink (its committed files only); fails on an offset twice."""
    if not (out / "_spark_metadata").exists():
        return {}
    rows = spark.read.schema(f"{KAFKA_SCHEMA_DDL}, {HEADERS_DDL}").parquet(str(out)).collect()
    got: dict[tuple[int, int], Record] = {}
    for r in rows:
        k = (r["partition"], r["offset"])
        assert k not in got, f"offset {k} delivered twice"
        hdrs = tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in r["headers"])
        got[k] = (None if r["key"] is None else bytes(r["key"]), None if r["value"] is None else bytes(r["value"]),
                  hdrs)
    return got


def wait_sink(spark: Any, out: Path, query: Any, want: dict[tuple[int, int], Record], what: str) -> None:
    """Until the sink holds as many records as ``want`` (the query's metadata consumer may be a moment behind the
    sidecar's), then exactly them."""
    deadline = time.monotonic() + 90
    while True:
        query.processAllAvailable()
        got = sink(spark, out)
        if len(got) >= len(want):
            break
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {len(got)} of {len(want)} records"
        time.sleep(0.5)
    assert got == want


@pytest.mark.slow
def test_stream_delivers_tiered_records_exactly_once_across_a_restart(spark: Any, env: Env, tmp_path: Path) -> None:
    topic = f"stream-{env.tag}-main"
    env.create(topic, 2)
    env.round(topic, 2)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    q = start(stream(spark, env, topic), out, ckpt)
    try:
        wait_sink(spark, out, q, env.tiered(topic), "the first segments in the sink")
        assert len(env.tiered(topic)) >= 2 * PER_ROUND
        env.round(topic, 2)  # tiered while the query runs: the next micro-batches deliver it
        wait_sink(spark, out, q, env.tiered(topic), "segments tiered while the query runs")
    finally:
        q.stop()
    env.round(topic, 2)  # tiered while the query is stopped
    q = start(stream(spark, env, topic), out, ckpt)
    try:
        wait_sink(spark, out, q, env.tiered(topic), "the restarted query to catch up")
        # a partition added while the query runs: picked up from its earliest offset
        admin = AdminClient({"bootstrap.servers": env.kafka.bootstrap_servers})
        admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
        env.round(topic, 3)
        wait_sink(spark, out, q, env.tiered(topic), "the next segments, the new partition's too")
    finally:
        q.stop()
    got = sink(spark, out)
    assert {p for p, _o in got} == {0, 1, 2}
    assert got == env.tiered(topic)  # every tiered record once, byte-exact: no duplicate, no gap


@pytest.mark.slow
def test_subscribe_pattern_picks_up_a_topic_created_while_the_query_runs(spark: Any, env: Env,
                                                                         tmp_path: Path) -> None:
    first, second = f"stream-{env.tag}-pat-a", f"stream-{env.tag}-pat-b"
    env.create(first, 1)
    env.round(first, 1)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    df = (spark.readStream.format("kafka-remote").options(**env.options)
          .option("subscribePattern", f"stream-{env.tag}-pat-.*").option("includeHeaders", "true").load())
    q = start(df, out, ckpt)
    try:
        wait_sink_topics(spark, out, q, {first: env.tiered(first)}, "the first topic")
        env.create(second, 2)  # created, then tiered, while the query runs
        env.round(second, 2)
        env.round(first, 1)
        wait_sink_topics(spark, out, q, {first: env.tiered(first), second: env.tiered(second)},
                         "the new topic's records")
    finally:
        q.stop()


def wait_sink_topics(spark: Any, out: Path, query: Any, want: dict[str, dict[tuple[int, int], Record]],
                     what: str) -> None:
    """Until the sink holds as many records as ``want`` (topic -> (partition, offset) -> record), then exactly
    them, each once."""
    deadline = time.monotonic() + 90
    n = sum(len(w) for w in want.values())
    while True:
        query.processAllAvailable()
        rows = (spark.read.schema(f"{KAFKA_SCHEMA_DDL}, {HEADERS_DDL}").parquet(str(out)).collect()
                if (out / "_spark_metadata").exists() else [])
        if len(rows) >= n:
            break
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {len(rows)} of {n} records"
        time.sleep(0.5)
    got: dict[str, dict[tuple[int, int], Record]] = {}
    for r in rows:
        k = (r["partition"], r["offset"])
        assert k not in got.get(r["topic"], {}), f"{r['topic']} offset {k} delivered twice"
        hdrs = tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in r["headers"])
        got.setdefault(r["topic"], {})[k] = (None if r["key"] is None else bytes(r["key"]),
                                             None if r["value"] is None else bytes(r["value"]), hdrs)
    assert got == want


def test_max_offsets_per_trigger_bounds_each_batch_under_available_now(spark: Any, env: Env,
                                                                        tmp_path: Path) -> None:
    topic = f"stream-{env.tag}-limit"
    env.create(topic, 2)
    env.round(topic, 2, codec_base=3)
    env.round(topic, 2, codec_base=3)
    want = env.tiered(topic)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    q = start(stream(spark, env, topic, maxOffsetsPerTrigger="300"), out, ckpt, availableNow=True)
    assert q.awaitTermination(120), "Trigger.AvailableNow did not stop"
    assert q.exception() is None
    assert sink(spark, out) == want
    spans = []
    for prog in q.recentProgress:
        if not prog.sources or prog.sources[0].endOffset is None:
            continue
        s = (json.loads(prog.sources[0].startOffset) if prog.sources[0].startOffset else None) or {}
        e = json.loads(prog.sources[0].endOffset)
        span = sum(o - s.get(topic, {}).get(p, o) for p, o in e.get(topic, {}).items() if p != "topicId")
        if prog.numInputRows:
            spans.append(span)
            assert prog.numInputRows <= 300
    assert spans and all(s <= 300 for s in spans), spans
    assert len(spans) >= len(want) // 300


@pytest.mark.slow
def test_starting_timestamp_starts_each_partition_at_its_first_record_at_or_after_it(spark: Any, env: Env,
                                                                                     tmp_path: Path) -> None:
    topic = f"stream-{env.tag}-ts"
    env.create(topic, 2)
    env.round(topic, 2)
    time.sleep(0.05)
    cut_ms = int(time.time() * 1000)  # every record produced from here on is at or after it (CreateTime: now)
    before = set(env.sent[topic])
    time.sleep(0.05)
    env.round(topic, 2)
    env.round(topic, 2)
    want = {k: r for k, r in env.tiered(topic).items() if k not in before}
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    q = start(stream(spark, env, topic, startingTimestamp=str(cut_ms)), out, ckpt, availableNow=True)
    assert q.awaitTermination(120), "Trigger.AvailableNow did not stop"
    assert q.exception() is None
    got = sink(spark, out)
    assert got == want and {p for p, _o in got} == {0, 1}


@pytest.mark.slow
def test_fail_on_data_loss_after_retention_deleted_unread_segments(spark: Any, env: Env, tmp_path: Path) -> None:
    topic = f"stream-{env.tag}-loss"
    env.create(topic, 1)
    env.round(topic, 1)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    q = start(stream(spark, env, topic), out, ckpt, availableNow=True)
    assert q.awaitTermination(120)
    first = sink(spark, out)
    assert first and first == env.tiered(topic)
    read_to = max(o for _p, o in first)
    # the query is stopped; more is tiered and remote retention deletes the segments it has not read
    tp = TopicIdPartition(env.topic_ids[topic], topic, 0)
    for _ in range(4):
        env.round(topic, 1)
    wait_for(lambda: remote_segments(env.sidecar, tp)[0].start_offset > read_to + 1, 60,
             "remote retention to delete unread segments")
    q = start(stream(spark, env, topic), out, ckpt, availableNow=True)
    with pytest.raises(Exception, match=rf"{topic}-0: offsets {read_to + 1} to \d+ were removed by remote "
                                        "retention before this query read them") as failed:
        q.awaitTermination(120)
    assert sink(spark, out) == first
    q = start(stream(spark, env, topic, failOnDataLoss="false"), out, ckpt, availableNow=True)
    assert q.awaitTermination(120)
    assert q.exception() is None
    lost_to = int(str(failed.value).split(f"offsets {read_to + 1} to ")[1].split()[0])
    got = sink(spark, out)
    assert {k: r for k, r in got.items() if k[1] <= read_to} == first
    after = {k: r for k, r in got.items() if k[1] > read_to}
    resumed_at = min(o for _p, o in after)  # the earliest remote offset when the batch was planned
    assert resumed_at > lost_to
    latest = latest_remote(env.sidecar, tp)
    assert after == {k: r for k, r in env.sent[topic].items() if resumed_at <= k[1] <= latest}  # nothing twice


def test_read_committed_stream_drops_the_aborted_transaction(spark: Any, txn_data: TieredData,
                                                             tmp_path: Path) -> None:
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    df = (spark.readStream.format("kafka-remote").options(**txn_data.options).option("subscribe", txn_data.topic)
          .option("includeHeaders", "true").option("isolation.level", "read_committed").load())
    q = start(df, out, ckpt, availableNow=True)
    assert q.awaitTermination(120)
    assert q.exception() is None
    got = {k: (key, value) for k, (key, value, _h) in sink(spark, out).items()}
    assert len(txn_data.aborted) == 100
    want = {(0, o): (r.key, r.value) for o, r in txn_data.records[0].items() if o not in txn_data.aborted}
    # Up to the tier's last stable offset: the last transaction's records only when its COMMIT marker is tiered
    # too (the broker may roll between its records and the marker: then it is still open at the tier's end).
    assert len(got) >= 100 and not any(o in txn_data.aborted for _p, o in got)
    end = max(o for _p, o in got)
    assert got == {k: v for k, v in want.items() if k[1] <= end}
    assert len(got) in (len(want), len(want) - 100)  # the first transaction, or the first and the last


# ---------------------------------------------------------------- offsets and limits, over a given tier (no Spark)
def _seg(topic: str, p: int, start_: int, end: int) -> Any:
    from rlmm.api import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState

    tp = TopicIdPartition(uuid.UUID(int=7), topic, p)
    return RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.uuid4()), start_, end, 1, 1, 1, 100,
                                    ((0, start_),), state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED)


def _reader(tier: dict[tuple[str, int], list[Any]], **options: str) -> Any:
    from rlm.spark.options import parse_options
    from rlm.spark.stream import KafkaRemoteStreamReader

    class Fixed(KafkaRemoteStreamReader):
        def _tier(self) -> dict[tuple[str, int], list[Any]]:
            return tier

        def _storage(self) -> Any:
            return None  # small segments of read_uncommitted: planning reads nothing

    return Fixed(parse_options({"subscribe": "t", "kafka.bootstrap.servers": "127.0.0.1:1", "store": "fs",
                                "store.root_path": "/nonexistent", **options}))


def test_offsets_limits_and_partitions_coming_and_going() -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

    tier = {("t", 0): [_seg("t", 0, 100, 999)], ("t", 1): [_seg("t", 1, 0, 99)]}
    r = _reader(tier, maxOffsetsPerTrigger="100", startingOffsets='{"t": {"0": 500}}')
    assert r.getDefaultReadLimit() == ReadMaxRows(100)
    start_ = r.initialOffset()
    assert start_ == {"t": {"0": 500, "1": 0}}  # partitions the JSON does not name start at earliest
    # the limit is spread over the partitions by their backlog (500 and 100 offsets)
    assert r.latestOffset(start_, ReadMaxRows(60)) == {"t": {"0": 550, "1": 10}}
    assert r.latestOffset(start_, ReadAllAvailable()) == {"t": {"0": 1000, "1": 100}}
    assert r.reportLatestOffset() == {"t": {"0": 1000, "1": 100}}  # what that call saw
    # a new partition enters at its earliest offset, read from the next micro-batch on; a deleted one leaves
    tier[("t", 2)] = [_seg("t", 2, 40, 59)]
    del tier[("t", 1)]
    end = r.latestOffset({"t": {"0": 1000, "1": 100}}, ReadAllAvailable())
    assert end == {"t": {"0": 1000, "2": 40}}
    assert r.partitions({"t": {"0": 1000, "1": 100}}, end) == []
    assert r.latestOffset(end, ReadAllAvailable()) == {"t": {"0": 1000, "2": 60}}
    # minOffsetsPerTrigger holds a micro-batch back until enough is tiered
    m = _reader({("t", 0): [_seg("t", 0, 0, 9)]}, minOffsetsPerTrigger="50")
    assert m.getDefaultReadLimit() == ReadMinRows(50)
    assert m.latestOffset({"t": {"0": 0}}, ReadMinRows(50)) == {"t": {"0": 0}}
    assert m.latestOffset({"t": {"0": 0}}, ReadMinRows(5)) == {"t": {"0": 10}}
    # Trigger.AvailableNow: what is tiered later is not read
    tier2 = {("t", 0): [_seg("t", 0, 0, 9)]}
    a = _reader(tier2)
    a.prepareForTriggerAvailableNow()
    tier2[("t", 0)].append(_seg("t", 0, 10, 19))
    assert a.latestOffset({"t": {"0": 0}}, ReadAllAvailable()) == {"t": {"0": 10}}


def test_offsets_removed_by_retention_fail_or_are_skipped_and_counted() -> None:
    from rlm.spark.executor import DataLossError

    tier = {("t", 0): [_seg("t", 0, 300, 399)]}
    with pytest.raises(DataLossError, match=r"t-0: offsets 200 to 299 were removed by remote retention"):
        _reader(tier).partitions({"t": {"0": 200}}, {"t": {"0": 400}})
    r = _reader(tier, failOnDataLoss="false")
    slices = r.partitions({"t": {"0": 200}}, {"t": {"0": 400}})
    assert [(s.from_offset, s.to_offset_inclusive) for s in slices] == [(300, 399)]
    assert r.lost_offsets == 100


def test_a_tier_ending_below_what_was_read_fails_or_goes_back_counted() -> None:
    """An unclean election replaced the tier's end [500, 999] by a shorter lineage ending at 599: the query read up
    to 1000 already. Before, the partition stalled silently until the tier grew past 1000 again."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from rlm.spark.executor import DataLossError

    tier = {("t", 0): [_seg("t", 0, 0, 499), _seg("t", 0, 500, 599)]}
    with pytest.raises(DataLossError, match=r"t-0: the remote tier now ends at offset 599, below offset 1000"):
        _reader(tier).latestOffset({"t": {"0": 1000}}, ReadAllAvailable())
    r = _reader(tier, failOnDataLoss="false")
    assert r.latestOffset({"t": {"0": 1000}}, ReadAllAvailable()) == {"t": {"0": 600}}
    assert r.lost_offsets == 400
    assert r.partitions({"t": {"0": 1000}}, {"t": {"0": 600}}) == []
    tier[("t", 0)].append(_seg("t", 0, 600, 649))  # the new lineage grows: read from the tier's end on
    assert r.latestOffset({"t": {"0": 600}}, ReadAllAvailable()) == {"t": {"0": 650}}


def test_a_segment_removed_between_planning_and_reading_fails_the_task_or_is_skipped(tmp_path: Path) -> None:
    from rlm.spark.executor import DataLossError, SegmentSlice, read_slice
    from rlm.tier import to_rsm
    from rsm.manager import RsmConfig

    store = RsmConfig(store="fs", root_path=str(tmp_path)).model_dump(mode="json")  # the segment is not in it
    md = to_rsm(_seg("t", 0, 0, 99))
    with pytest.raises(DataLossError, match=r"t-0: offsets 0 to 99 .* were removed by remote retention"):
        list(read_slice(SegmentSlice(md, 0, 99, None, None, None, (), False, False, store, True)))
    assert list(read_slice(SegmentSlice(md, 0, 99, None, None, None, (), False, False, store, False))) == []
