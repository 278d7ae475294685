"""Issue 21: ``readStream.format("kafka-remote")`` identifies a partition by topic id, against the real broker, an
in-process sidecar tiering as the queries run and a local SparkSession:

- a topic deleted and re-created under the same name while the query runs (the query sees the topic gone first):
  ``failOnDataLoss=true`` fails the query naming the topic, the old and the new topic id; the same checkpoint
  restarted with ``false`` reads the new topic from its earliest offset, none of the old topic's records again;
- the same while the query is stopped (the checkpoint still holds the old topic's offsets): never the new topic at
  the old offsets, with either setting;
- the tier's end moved below what the query read (the partition's last remote segments deleted while the sidecar
  was down, tiered again after): data loss, and with ``false`` the query goes on from the tier's new end.

The offsets' JSON, its old (id-less) form and the decision itself, over a given tier, are at the end (no Spark).
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient

from devtools.devkafka import KafkaCluster
from rlm.rlmm_config import make_rlmm
from rlm.sidecar import Sidecar
from rlm.spark.source import HEADERS_DDL, KAFKA_SCHEMA_DDL
from rlm.tier import to_rsm
from rlmm.api import (
    InvalidStateTransitionError,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from rsm.manager import RemoteStorageManager
from tests.support.sidecar import latest_remote, make_settings, remote_segments, wait_for
from tests.support.spark import Env, Record, start, stream

Row = tuple[int, int, int, Record]  # partition, offset, timestamp (ms), record


def _options(kafka: KafkaCluster, settings: Any, tmp: Path) -> dict[str, str]:
    return {"kafka.bootstrap.servers": kafka.bootstrap_servers, "metadata.topic": settings.metadata.topic,
            "store": "fs", "store.root_path": str(tmp / "remote")}


@pytest.fixture(scope="module")
def env(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tag = uuid.uuid4().hex[:8]
    tmp = tmp_path_factory.mktemp("spark-recreate")
    settings = make_settings(kafka, tmp, topics={"include": [f"recreate-{tag}-.*"]})
    with Sidecar(settings) as sidecar:
        yield Env(kafka, sidecar, tag, _options(kafka, settings, tmp))


def recreate(env: Env, topic: str, partitions: int, *, deleted: bool = False) -> tuple[uuid.UUID, uuid.UUID]:
    """Delete ``topic`` (unless ``deleted`` already) and create it again under the same name (retried while the
    broker still deletes it): (old id, new id)."""
    old_id = env.topic_ids[topic]
    if not deleted:
        delete(env, topic)

    def created() -> bool:
        try:
            env.create(topic, partitions)
        except Exception as err:  # noqa: BLE001 - still being deleted
            print("re-create:", err)
            return False
        return True

    wait_for(created, 60, f"{topic} to be created again", interval_s=0.5)
    new_id = env.topic_ids[topic]
    assert new_id != old_id
    return old_id, new_id


def delete(env: Env, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": env.kafka.bootstrap_servers})
    admin.delete_topics([topic])[topic].result(30)
    wait_for(lambda: topic not in admin.list_topics(timeout=10).topics, 30, f"{topic} to be gone")


def rows(spark: Any, out: Path) -> list[Row]:
    """Every row of the file sink (its committed files only), duplicates kept."""
    if not (out / "_spark_metadata").exists():
        return []
    df = (spark.read.schema(f"{KAFKA_SCHEMA_DDL}, {HEADERS_DDL}").parquet(str(out))
          .selectExpr("partition", "offset", "unix_millis(timestamp) AS ts", "key", "value", "headers"))
    out_rows = []
    for r in df.collect():
        hdrs = tuple((h["key"], None if h["value"] is None else bytes(h["value"])) for h in r["headers"])
        rec = (None if r["key"] is None else bytes(r["key"]), None if r["value"] is None else bytes(r["value"]), hdrs)
        out_rows.append((r["partition"], r["offset"], r["ts"], rec))
    return out_rows


def once(found: list[Row]) -> dict[tuple[int, int], Record]:
    """(partition, offset) -> record; fails on an offset delivered twice."""
    got: dict[tuple[int, int], Record] = {}
    for p, o, _ts, rec in found:
        assert (p, o) not in got, f"offset {(p, o)} delivered twice"
        got[(p, o)] = rec
    return got


def split(found: list[Row], cut_ms: int) -> tuple[dict[tuple[int, int], Record], dict[tuple[int, int], Record]]:
    """The old topic's rows (produced before ``cut_ms``) and the new topic's (at or after it), each offset once."""
    return once([r for r in found if r[2] < cut_ms]), once([r for r in found if r[2] >= cut_ms])


def wait_rows(spark: Any, out: Path, query: Any, n: int, what: str, timeout_s: float = 90) -> list[Row]:
    deadline = time.monotonic() + timeout_s
    while True:
        query.processAllAvailable()
        found = rows(spark, out)
        if len(found) >= n:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {len(found)} of {n} rows"
        time.sleep(0.5)


def recreated_error(topic: str, old_id: uuid.UUID, new_id: uuid.UUID) -> str:
    """What the failed query's error must say: the topic, its old and its new id."""
    return rf"(?s){re.escape(topic)}.*re-?created.*{old_id}.*{new_id}"


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.slow
def test_topic_recreated_while_the_query_runs(spark: Any, env: Env, tmp_path: Path) -> None:
    topic = f"recreate-{env.tag}-live"
    env.create(topic, 2)
    env.round(topic, 2)
    old = env.tiered(topic)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    q = start(stream(spark, env, topic), out, ckpt)
    try:
        assert once(wait_rows(spark, out, q, len(old), "the old topic's records")) == old
        old_id = env.topic_ids[topic]
        delete(env, topic)
        q.processAllAvailable()  # a micro-batch sees the topic gone before it is created again
        time.sleep(0.05)
        cut_ms = int(time.time() * 1000)  # every record of the new topic is at or after it (CreateTime)
        time.sleep(0.05)
        _old_id, new_id = recreate(env, topic, 2, deleted=True)
        env.round(topic, 2, codec_base=2)
        with pytest.raises(Exception, match=recreated_error(topic, old_id, new_id)):
            q.awaitTermination(60)
            pytest.fail(f"the query did not fail after {topic} was re-created; exception: {q.exception()}")
    finally:
        q.stop()
    assert once(rows(spark, out)) == old  # nothing of the new topic at the old topic's offsets
    # failOnDataLoss=false, the same checkpoint: the new topic from its earliest offset, counted, then as it grows
    q = start(stream(spark, env, topic, failOnDataLoss="false"), out, ckpt)
    try:
        new = env.tiered(topic)
        wait_rows(spark, out, q, len(old) + len(new), "the new topic's records")
        env.round(topic, 2, codec_base=2)
        new = env.tiered(topic)
        found = wait_rows(spark, out, q, len(old) + len(new), "the new topic's next records")
    finally:
        q.stop()
    got_old, got_new = split(found, cut_ms)
    assert got_old == old
    assert got_new == new and min(o for _p, o in got_new) == 0  # from the new topic's earliest offset, each once


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.slow
def test_topic_recreated_while_the_query_is_stopped(spark: Any, env: Env, tmp_path: Path) -> None:
    """The checkpoint holds the old topic's offsets; the new topic has more offsets than the old one had, so the
    old offsets exist in it: never read there."""
    topic = f"recreate-{env.tag}-stopped"
    env.create(topic, 1)
    env.round(topic, 1)
    old = env.tiered(topic)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    q = start(stream(spark, env, topic), out, ckpt, availableNow=True)
    assert q.awaitTermination(120) and q.exception() is None
    assert once(rows(spark, out)) == old
    time.sleep(0.05)
    cut_ms = int(time.time() * 1000)
    time.sleep(0.05)
    old_id, new_id = recreate(env, topic, 1)
    for _ in range(3):
        env.round(topic, 1, codec_base=1)
    new = env.tiered(topic)
    assert max(o for _p, o in new) > max(o for _p, o in old) + 100
    q = start(stream(spark, env, topic), out, ckpt, availableNow=True)
    with pytest.raises(Exception, match=recreated_error(topic, old_id, new_id)):
        q.awaitTermination(120)
        pytest.fail(f"the restarted query did not fail after {topic} was re-created: {len(rows(spark, out))} rows")
    assert once(rows(spark, out)) == old
    q = start(stream(spark, env, topic, failOnDataLoss="false"), out, ckpt, availableNow=True)
    assert q.awaitTermination(120) and q.exception() is None
    q = start(stream(spark, env, topic, failOnDataLoss="false"), out, ckpt, availableNow=True)  # its next batch
    assert q.awaitTermination(120) and q.exception() is None
    got_old, got_new = split(rows(spark, out), cut_ms)
    assert got_old == old
    assert got_new == new  # every record of the new topic from its earliest offset, none twice, nothing old


def delete_last_segments(settings: Any, tp: TopicIdPartition, n: int, cache: Path) -> int:
    """Delete the partition's last ``n`` remote segments as the sidecar's deleter does (DELETE_SEGMENT_STARTED,
    the store's objects, DELETE_SEGMENT_FINISHED); returns the tier's end (latest offset + 1) afterwards. The
    sidecar does not tier them again (its copier resumes above its own watermark): a hole remains."""
    rlmm = make_rlmm(settings, cache_dir=cache, read_only=False)
    rsm = RemoteStorageManager(settings.store)
    try:
        rlmm.on_partition_leadership_changes([tp], [])
        rlmm.wait_ready([tp], timeout_s=60)
        segs = sorted((m for m in rlmm.list_remote_log_segments(tp)
                       if m.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED), key=lambda m: m.start_offset)
        assert len(segs) > n
        for md in segs[-n:]:
            for state in (RemoteLogSegmentState.DELETE_SEGMENT_STARTED, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED):
                if state == RemoteLogSegmentState.DELETE_SEGMENT_FINISHED:
                    rsm.delete_log_segment_data(to_rsm(md))
                try:
                    rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
                        md.remote_log_segment_id, int(time.time() * 1000), md.custom_metadata, state, 1))
                except InvalidStateTransitionError:
                    # The sidecar, leader of the partition, finishes a delete it finds started (as after a crash
                    # of the one that started it): it may have done so first (seen in a loaded CI run).
                    if state != RemoteLogSegmentState.DELETE_SEGMENT_FINISHED or any(
                            m.remote_log_segment_id == md.remote_log_segment_id
                            for m in rlmm.list_remote_log_segments(tp)):
                        raise
        return segs[-n - 1].end_offset_inclusive + 1
    finally:
        rsm.close()
        rlmm.close()


@pytest.mark.kafka
@pytest.mark.spark
@pytest.mark.slow
def test_tier_end_below_the_checkpointed_offset_is_data_loss(spark: Any, kafka: KafkaCluster,
                                                             tmp_path: Path) -> None:
    """The partition's last remote segments deleted after the query read them (as an unclean election's new lineage
    replaces the tier's end): the tier now ends below the checkpointed offset."""
    tag = uuid.uuid4().hex[:8]
    settings = make_settings(kafka, tmp_path, topics={"include": [f"tierend-{tag}-.*"]})
    env = Env(kafka, Sidecar(settings).start(), tag, _options(kafka, settings, tmp_path))
    try:
        topic = f"tierend-{tag}-t"
        env.create(topic, 1)
        for _ in range(3):
            env.round(topic, 1)
        before = env.tiered(topic)
        out, ckpt = tmp_path / "out", tmp_path / "ckpt"
        q = start(stream(spark, env, topic), out, ckpt, availableNow=True)
        assert q.awaitTermination(120) and q.exception() is None
        assert once(rows(spark, out)) == before
        read_to = max(o for _p, o in before) + 1  # the checkpointed offset: the next one to read
        tp = TopicIdPartition(env.topic_ids[topic], topic, 0)
        tier_end = delete_last_segments(settings, tp, 2, tmp_path / "cut-cache")
        assert tier_end < read_to
        wait_for(lambda: latest_remote(env.sidecar, tp) == tier_end - 1, 30, "the sidecar to see the tier's new end")
        q = start(stream(spark, env, topic), out, ckpt, availableNow=True)
        with pytest.raises(Exception, match=rf"{topic}-0: the remote tier now ends at offset {tier_end - 1}, below "
                                            rf"offset {read_to}"):
            q.awaitTermination(120)
            pytest.fail("the query did not fail")
        q = start(stream(spark, env, topic, failOnDataLoss="false"), out, ckpt, availableNow=True)
        assert q.awaitTermination(120) and q.exception() is None
        ends = [json.loads(p.sources[0].endOffset) for p in q.recentProgress if p.sources and p.sources[0].endOffset]
        assert ends and ends[-1][topic]["0"] == tier_end  # goes on from the tier's new end, not stuck at read_to
        # more is tiered (above the hole the deletion left): the query reads it, it does not wait for read_to
        env.round(topic, 1)
        after = env.tiered(topic)
        q = start(stream(spark, env, topic, failOnDataLoss="false"), out, ckpt, availableNow=True)
        assert q.awaitTermination(120) and q.exception() is None
        got = once(rows(spark, out))
        assert {k: r for k, r in got.items() if k[1] < read_to} == before
        assert {k: r for k, r in got.items() if k[1] >= read_to} == {k: r for k, r in after.items()
                                                                     if k[1] >= read_to}
        assert len(got) > len(before)
        assert remote_segments(env.sidecar, tp)[-1].end_offset_inclusive == max(o for _p, o in after)
    finally:
        env.sidecar.stop()


# --------------------------------------------------------------- topic ids in the offsets, over a given tier (no Spark)
OLD, NEW = uuid.UUID(int=1), uuid.UUID(int=2)


def _seg(topic_id: uuid.UUID, topic: str, p: int, start_: int, end: int) -> Any:
    from rlmm.api import RemoteLogSegmentId, RemoteLogSegmentMetadata

    tp = TopicIdPartition(topic_id, topic, p)
    return RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.uuid4()), start_, end, 1, 1, 1, 100,
                                    ((0, start_),), state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED)


def _reader(cluster: dict[str, uuid.UUID], tier: dict[tuple[str, int], list[Any]], **options: str) -> Any:
    """A stream reader over a given cluster (topic -> id) and tier."""
    from rlm.spark.options import parse_options
    from rlm.spark.stream import KafkaRemoteStreamReader

    class Fixed(KafkaRemoteStreamReader):
        def _tier(self) -> dict[tuple[str, int], list[Any]]:
            self._ids = dict(cluster)
            return {k: v for k, v in tier.items() if k[0] in cluster}

        def _storage(self) -> Any:
            return None  # small segments of read_uncommitted: planning reads nothing

    return Fixed(parse_options({"subscribe": "t", "kafka.bootstrap.servers": "127.0.0.1:1", "store": "fs",
                                "store.root_path": "/nonexistent", **options}))


def test_offsets_carry_the_topic_id_and_an_old_checkpoint_resumes() -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    tier = {("t", 0): [_seg(OLD, "t", 0, 0, 99)], ("t", 1): [_seg(OLD, "t", 1, 0, 9)]}
    r = _reader({"t": OLD}, tier)
    assert json.dumps(r.initialOffset()) == json.dumps({"t": {"0": 0, "1": 0, "topicId": str(OLD)}})
    # offsets checkpointed before ids were added: accepted as they are, the next ones carry the id
    assert r.latestOffset({"t": {"0": 50, "1": 10}}, ReadAllAvailable()) == {"t": {"0": 100, "1": 10,
                                                                                   "topicId": str(OLD)}}
    assert [(s.from_offset, s.to_offset_inclusive) for s in r.partitions({"t": {"0": 50, "1": 10}},
                                                                          {"t": {"0": 100, "1": 10}})] == [(50, 99)]
    assert r.reportLatestOffset() == {"t": {"0": 100, "1": 10, "topicId": str(OLD)}}
    from rlm.spark.options import SparkSourceError

    with pytest.raises(SparkSourceError, match=r"topic t with topicId 'nope', not a topic id"):
        r.latestOffset({"t": {"0": 50, "topicId": "nope"}}, ReadAllAvailable())


def test_a_recreated_topic_fails_or_is_read_from_its_earliest_offset(caplog: pytest.LogCaptureFixture) -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from rlm.spark.executor import DataLossError

    tier = {("t", 0): [_seg(NEW, "t", 0, 5, 49)]}  # the new topic (its first offsets already expired remotely)
    start_ = {"t": {"0": 30, "topicId": str(OLD)}}  # the old topic's: offset 30 exists in the new one
    with pytest.raises(DataLossError, match=rf"t: the topic was deleted and re-created .*id {OLD}.*id {NEW}"):
        _reader({"t": NEW}, tier).latestOffset(start_, ReadAllAvailable())
    with pytest.raises(DataLossError, match=rf"{OLD}.*{NEW}"):  # a planned batch replayed after a restart
        _reader({"t": NEW}, tier).partitions(start_, {"t": {"0": 40, "topicId": str(OLD)}})
    r = _reader({"t": NEW}, tier, failOnDataLoss="false")
    with caplog.at_level(logging.WARNING, logger="rlm.spark.stream"):
        end = r.latestOffset(start_, ReadAllAvailable())
    assert end == {"t": {"0": 5, "topicId": str(NEW)}}  # enters at the new topic's earliest offset
    assert r.partitions(start_, end) == []  # nothing read of it at the old offsets, no retention loss either
    assert r.data_losses == 1 and r.lost_offsets == 0
    assert any(rec.levelno == logging.WARNING and str(OLD) in rec.getMessage() and str(NEW) in rec.getMessage()
               for rec in caplog.records)
    assert r.latestOffset(end, ReadAllAvailable()) == {"t": {"0": 50, "topicId": str(NEW)}}
    assert [(s.from_offset, s.to_offset_inclusive) for s in r.partitions(end, {"t": {"0": 50, "topicId": str(NEW)}})
            ] == [(5, 49)]
    # the same re-creation seen again (a replayed batch): counted once
    assert r.partitions(start_, {"t": {"0": 40, "topicId": str(OLD)}}) == []
    assert r.data_losses == 1


def test_a_deleted_topic_keeps_its_offsets_so_that_its_recreation_is_seen() -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from rlm.spark.executor import DataLossError

    old = {("t", 0): [_seg(OLD, "t", 0, 0, 99)]}
    r = _reader({}, old)  # deleted: not on the cluster
    start_ = {"t": {"0": 100, "topicId": str(OLD)}}
    assert r.latestOffset(start_, ReadAllAvailable()) == start_
    assert r.partitions(start_, start_) == []
    with pytest.raises(DataLossError, match=rf"{OLD}.*{NEW}"):
        _reader({"t": NEW}, {("t", 0): [_seg(NEW, "t", 0, 0, 149)]}).latestOffset(start_, ReadAllAvailable())
    # a topic the options no longer select leaves the offsets
    assert _reader({}, old, subscribe="u").latestOffset(start_, ReadAllAvailable()) == {}
