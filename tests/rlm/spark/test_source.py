"""The ``kafka-remote`` source against segments the real broker wrote and the real sidecar tiered (S3 over HTTP
and the filesystem store): every record back exactly, offset and time ranges, read_committed, pushdown, splits."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rlm.spark.options import SparkSourceError, parse_options
from tests.support.kafka import CODECS
from tests.support.spark import Produced, TieredData, collect, expected, load


@pytest.mark.slow
def test_every_record_of_every_codec_comes_back_exactly(spark: Any, codec_data: TieredData) -> None:
    df = load(spark, codec_data, subscribe=codec_data.topic, includeHeaders="true")
    assert df.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    got = collect(df)
    want = expected(codec_data)
    assert len(want) >= len(CODECS) * 900  # every produced record of the rounds is remote
    assert got == want
    assert {r["topic"] for r in df.select("topic").distinct().collect()} == {codec_data.topic}
    # one input partition per remote segment
    assert df.rdd.getNumPartitions() == sum(codec_data.segments.values())


def test_schema_matches_sparks_kafka_source_without_headers(spark: Any, codec_data: TieredData) -> None:
    df = load(spark, codec_data, subscribe=codec_data.topic)
    assert df.schema.simpleString() == ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
                                        "timestamp:timestamp,timestampType:int>")
    assert collect(df.where("partition = 3")) == expected(codec_data, lambda p, o, r: p == 3, headers=False)


def test_offset_ranges_return_exactly_the_rows_in_range(spark: Any, codec_data: TieredData) -> None:
    t = codec_data.topic
    starting = {t: {"1": 150, "2": -2, "4": 620}}
    ending = {t: {"1": 700, "2": 333, "4": -1}}
    df = load(spark, codec_data, assign=json.dumps({t: [1, 2, 4]}), startingOffsets=json.dumps(starting),
              endingOffsets=json.dumps(ending), includeHeaders="true")
    bounds = {1: (150, 700), 2: (0, 333), 4: (620, 10**9)}
    want = expected(codec_data, lambda p, o, r: p in bounds and bounds[p][0] <= o < bounds[p][1])
    got = collect(df)
    assert got == want
    assert min(o for p, o in got if p == 1) == 150 and max(o for p, o in got if p == 1) == 699


def test_starting_timestamp_starts_at_the_first_record_at_or_after_it(spark: Any, codec_data: TieredData) -> None:
    recs = codec_data.records[0]
    offsets = sorted(recs)
    # a timestamp in the middle, just before a record that is earlier than its predecessor (not monotonic)
    o = next(o for o in offsets[len(offsets) // 2:]
             if o + 1 in recs and recs[o + 1].timestamp_ms < recs[o].timestamp_ms)
    target = recs[o].timestamp_ms
    want_start = {p: min(o for o, r in sorted(codec_data.records[p].items()) if r.timestamp_ms >= target)
                  for p in codec_data.records}
    df = load(spark, codec_data, subscribe=codec_data.topic, startingTimestamp=str(target), includeHeaders="true")
    got = collect(df)
    assert got == expected(codec_data, lambda p, o, r: o >= want_start[p])
    # records after the start with an earlier timestamp are returned too (ListOffsets semantics)
    assert any(v[3] < target for v in got.values())


def test_read_committed_drops_the_aborted_transaction(spark: Any, txn_data: TieredData) -> None:
    produced = txn_data.records[0]
    assert len(txn_data.aborted) == 100
    committed = collect(load(spark, txn_data, subscribe=txn_data.topic, **{"isolation.level": "read_committed"}))
    want = {(0, o): (r.key, r.value, None, r.timestamp_ms, 0) for o, r in produced.items()
            if o not in txn_data.aborted}
    assert committed == want
    uncommitted = collect(load(spark, txn_data, subscribe=txn_data.topic))
    assert uncommitted == {(0, o): (r.key, r.value, None, r.timestamp_ms, 0) for o, r in produced.items()}
    # control records (the transaction markers) occupy offsets, but never come back
    offsets = sorted(o for _p, o in uncommitted)
    markers = set(range(offsets[0], offsets[-1] + 1)) - set(offsets)
    assert len(markers) >= 2


def test_pushed_filters_prune_before_reading_and_rows_are_exact(spark: Any, codec_data: TieredData) -> None:
    all_parts = load(spark, codec_data, subscribe=codec_data.topic, pushFilters="true").rdd.getNumPartitions()
    df = load(spark, codec_data, subscribe=codec_data.topic, pushFilters="true", includeHeaders="true").where(
        "partition = 2 AND offset >= 320 AND offset < 580")
    assert df.rdd.getNumPartitions() < all_parts
    assert df.rdd.getNumPartitions() <= codec_data.segments[2]
    assert collect(df) == expected(codec_data, lambda p, o, r: p == 2 and 320 <= o < 580)
    # time: the first round's segments are pruned away
    recs = codec_data.records[4]
    cut = recs[sorted(recs)[700]].timestamp_ms
    from datetime import UTC, datetime

    cut_dt = datetime.fromtimestamp(cut / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
    dft = load(spark, codec_data, subscribe=codec_data.topic, pushFilters="true").where(
        f"partition = 4 AND timestamp >= TIMESTAMP '{cut_dt}'")
    assert dft.rdd.getNumPartitions() < codec_data.segments[4]
    assert collect(dft) == expected(codec_data, lambda p, o, r: p == 4 and r.timestamp_ms >= cut, headers=False)


@pytest.mark.slow
def test_large_segments_split_into_block_ranges(spark: Any, codec_data: TieredData) -> None:
    df = load(spark, codec_data, subscribe=codec_data.topic, maxPartitionBytes=str(20_000),
              includeHeaders="true")
    assert df.rdd.getNumPartitions() > sum(codec_data.segments.values())
    assert collect(df) == expected(codec_data)


def test_bad_options_name_the_option() -> None:
    with pytest.raises(SparkSourceError, match="subscribe, subscribePattern, assign"):
        parse_options({"kafka.bootstrap.servers": "x:1"})
    with pytest.raises(SparkSourceError, match="startingOffsets"):
        parse_options({"subscribe": "t", "kafka.bootstrap.servers": "x:1", "startingOffsets": "{bad"})
    with pytest.raises(SparkSourceError, match="kafka.bootstrap.servers"):
        parse_options({"subscribe": "t"})
    with pytest.raises(SparkSourceError, match="store.block_size_bytes"):
        parse_options({"subscribe": "t", "kafka.bootstrap.servers": "x:1", "store.block_size_bytes": "-1"})
    with pytest.raises(SparkSourceError, match="isolation.level"):
        parse_options({"subscribe": "t", "kafka.bootstrap.servers": "x:1", "isolation.level": "dirty"})


def test_unknown_topic_fails_with_its_name(spark: Any, codec_data: TieredData) -> None:
    with pytest.raises(Exception, match="no-such-topic-405"):
        load(spark, codec_data, subscribe="no-such-topic-405").count()


_ = Produced  # re-exported for readers of this module
