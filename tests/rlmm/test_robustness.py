"""Bad records are skipped and counted; the cache refuses foreign directories, rebuilds caches of another rlmm format;
stale caches rebuild."""

from __future__ import annotations

import logging
import time
import uuid

import pytest
from confluent_kafka import Producer
from prometheus_client import REGISTRY

from rlmm import serde
from rlmm.api import MetadataCacheFormatError, RemoteLogSegmentState, TopicIdPartition
from rlmm.cache import FORMAT_VERSION, MetadataCache
from tests.rlmm.helpers import eventually, segment, update

S = RemoteLogSegmentState


def _skipped(reason: str) -> float:
    return REGISTRY.get_sample_value("rlmm_skipped_records_total", {"reason": reason}) or 0.0


def test_garbage_and_unknown_api_keys_are_skipped_and_counted(kafka, rlmm_factory, topic_name: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    m = rlmm_factory(topic_name, "c", num_partitions=3)
    m.on_partition_leadership_changes([tp], [])
    mp = m.cache.mp_of(tp)
    good = segment(tp, 0, 9)
    m.add_remote_log_segment_metadata(good)
    corrupt0, refused0 = _skipped("corrupt"), _skipped("refused")

    orphan = segment(tp, 10, 19)
    bad = [
        (b"k", b"\xff\xff\xff"),                                           # not even a frame
        (b"k", bytes.fromhex("01070000112233")),                           # unknown api key 7
        (b"k", serde.encode(good)[:-5]),                                   # truncated
        (b"k", serde.encode(update(orphan, S.COPY_SEGMENT_FINISHED))),     # unknown segment: refused
        (b"k", serde.encode(update(good, S.DELETE_SEGMENT_FINISHED))),     # STARTED -> DELETE_FINISHED: refused
        (b"short-key", None),                                              # a tombstone with a foreign key
    ]
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for key, value in bad:
        p.produce(topic_name, key=key, value=value, partition=mp)
    assert p.flush(30) == 0
    caplog.set_level(logging.ERROR, logger="rlmm.topic_consumer")

    eventually(lambda: m.skipped_records == len(bad))
    assert [s.reason for s in m.skipped] == ["corrupt", "corrupt", "corrupt", "refused", "refused", "corrupt"]
    assert [s.offset for s in m.skipped] == list(range(1, 1 + len(bad)))
    assert "unknown api key 7" in m.skipped[1].error
    assert _skipped("corrupt") - corrupt0 == 4 and _skipped("refused") - refused0 == 2
    assert f"metadata partition {mp} offset 2 skipped" in caplog.text

    # still serving, state untouched by the bad records
    assert m.list_remote_log_segments(tp)[0].state == S.COPY_SEGMENT_STARTED
    m.update_remote_log_segment_metadata(update(good, S.COPY_SEGMENT_FINISHED))
    assert m.remote_log_segment_metadata(tp, 0, 5).state == S.COPY_SEGMENT_FINISHED


def test_cache_format_key_checked_on_open(tmp_path) -> None:
    c = MetadataCache(tmp_path / "db", topic="__remote_log_metadata", num_partitions=50)
    c.close()
    with pytest.raises(MetadataCacheFormatError, match="delete the directory"):
        MetadataCache(tmp_path / "db", topic="other-topic", num_partitions=50)
    with pytest.raises(MetadataCacheFormatError, match="partitions"):
        MetadataCache(tmp_path / "db", topic="__remote_log_metadata", num_partitions=10)
    MetadataCache(tmp_path / "db", topic="__remote_log_metadata", num_partitions=50).close()


def test_cache_of_another_rlmm_format_is_rebuilt_on_open(tmp_path) -> None:
    """A cache written by another rlmm format (format 1 kept an index by epoch, table 0x12) is never read as this
    one: opened, it is destroyed and created empty (no state, no progress: every partition rebuilds from the
    topic)."""
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    c = MetadataCache(tmp_path / "db", topic="__remote_log_metadata", num_partitions=50)
    mp = c.mp_of(tp)
    md = segment(tp, 0, 9)
    c.apply([(mp, 0, b"k", serde.encode(md))], {mp: 1})
    c.db[b"\x12stale-index-key"] = b""
    c.db[b"\x00format"] = b"rlmm-cache-1"
    c.close()
    c = MetadataCache(tmp_path / "db", topic="__remote_log_metadata", num_partitions=50)
    assert c.rebuilt_format == b"rlmm-cache-1"
    assert c.progress(mp) is None and c.segments(tp) == [] and c.dump() == {}
    assert c.db[b"\x00format"] == FORMAT_VERSION
    c.apply([(mp, 0, b"k", serde.encode(md))], {mp: 1})
    c.close()
    c = MetadataCache(tmp_path / "db", topic="__remote_log_metadata", num_partitions=50)   # now as written
    assert c.rebuilt_format is None and c.segments(tp) == [md] and c.segments(tp, 0) == [md]
    c.close()


def test_away_longer_than_delete_retention_rebuilds(rlmm_factory, topic_name: str) -> None:
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    cfg = {"num_partitions": 1, "topic_config": {"delete.retention.ms": "1500"}}
    m = rlmm_factory(topic_name, "c", serve_all=True, **cfg)
    for i in range(5):
        md = segment(tp, i * 10, i * 10 + 9)
        m.add_remote_log_segment_metadata(md)
        m.update_remote_log_segment_metadata(update(md, S.COPY_SEGMENT_FINISHED))
    m.wait_ready([tp])
    time.sleep(0.3)
    before = m.cache.dump()
    m.close()
    quick = rlmm_factory(topic_name, "c", serve_all=True, **cfg)
    quick.wait_ready([tp])
    assert quick.records_consumed == 0 and quick.resumed_partitions == [0]
    quick.close()
    time.sleep(2.0)                                       # away longer than delete.retention.ms
    late = rlmm_factory(topic_name, "c", serve_all=True, **cfg)
    late.wait_ready([tp])
    assert late.rebuilt_partitions == [0] and late.records_consumed == 10
    assert late.cache.dump() == before
