"""Remote retention against the real broker: by time and by size, from the sidecar's own rules, oldest first,
and never following the broker's log start offset."""

from __future__ import annotations

import time
from pathlib import Path

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.support.kafka import broker_watermarks, set_topic_config
from tests.support.sidecar import (
    RecordingRsm,
    assert_contiguous,
    assert_readable,
    latest_remote,
    make_settings,
    only,
    produce_segments,
    remote_segments,
    wait_for,
)


def start(settings, rsm: RecordingRsm | None = None) -> tuple[Sidecar, RecordingRsm]:  # type: ignore[no-untyped-def]
    rsm = rsm or RecordingRsm(settings.store)
    rsm.deleted = []
    return Sidecar(settings, rsm=rsm).start(), rsm


def test_remote_retention_by_time_then_size_oldest_first(kafka: KafkaCluster, topic_name: str,
                                                          tmp_path: Path) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300", "retention.ms": "-1"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    old_ms = int(time.time() * 1000) - 3 * 3600 * 1000
    old = produce_segments(kafka, topic_name, 3, 100, segment_ms=300, timestamp_ms=old_ms, roll=False)
    new = produce_segments(kafka, topic_name, 4, 100, segment_ms=300)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name))
    sidecar, rsm = start(settings)
    try:
        wait_for(lambda: latest_remote(sidecar, tp) >= max(new), 60, "every offset remote")
        before = remote_segments(sidecar, tp)
    finally:
        sidecar.stop()
    assert_contiguous(before)
    old_segs = [s for s in before if s.max_timestamp_ms < old_ms + 60_000]
    assert old_segs and old_segs[-1].end_offset_inclusive >= max(old)
    assert rsm.deleted == []  # unlimited retention deletes nothing

    # Time: the operator sets 1 h and restarts; every segment whose newest record is older goes, oldest first.
    by_time = settings.model_copy(update={"retention": [
        settings.retention[0].model_copy(update={"retention_ms": 3600 * 1000})]})
    sidecar, rsm = start(by_time, rsm)
    try:
        wait_for(lambda: len(rsm.deleted) >= len(old_segs), 60, "the old segments to expire")
        time.sleep(1.5)  # a few more expiration runs: nothing else goes
        after_time = remote_segments(sidecar, tp)
    finally:
        sidecar.stop()
    assert rsm.deleted == [s.start_offset for s in old_segs]
    assert [s.remote_log_segment_id for s in after_time] == [s.remote_log_segment_id
                                                            for s in before[len(old_segs):]]
    assert_contiguous(after_time, first_offset=old_segs[-1].end_offset_inclusive + 1)
    assert not any(s.max_timestamp_ms < old_ms + 60_000 for s in after_time)

    # Size: keep at most the two newest segments' bytes; the older ones go, oldest first.
    keep = after_time[-2:]
    limit = sum(s.segment_size_bytes for s in keep)
    by_size = settings.model_copy(update={"retention": [
        settings.retention[0].model_copy(update={"retention_bytes": limit})]})
    sidecar, rsm = start(by_size, rsm)
    try:
        wait_for(lambda: len(rsm.deleted) >= len(after_time) - 2, 60, "the oldest segments to go by size")
        time.sleep(1.5)
        after_size = remote_segments(sidecar, tp)
        got = {r.offset: (r.key, r.value) for r in sidecar.reader.read(tp, keep[0].start_offset)}
    finally:
        sidecar.stop()
    assert rsm.deleted == [s.start_offset for s in after_time[:-2]]
    assert [s.remote_log_segment_id for s in after_size] == [s.remote_log_segment_id for s in keep]
    assert sum(s.segment_size_bytes for s in after_size) <= limit
    assert {o: kv for o, kv in new.items() if o >= keep[0].start_offset} == {o: got[o] for o in got if o in new}


def test_broker_log_start_offset_is_never_followed(kafka: KafkaCluster, topic_name: str, tmp_path: Path) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    sent = produce_segments(kafka, topic_name, 5, 150, segment_ms=300)
    sidecar, rsm = start(make_settings(kafka, tmp_path, topics=only(topic_name)))
    try:
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 60, "every offset remote")
        before = [s.remote_log_segment_id for s in remote_segments(sidecar, tp)]
        # Short local retention: the broker deletes its copies and moves its log start offset forward.
        set_topic_config(kafka, topic_name, retention_ms="500", local_retention_ms="500")
        wait_for(lambda: broker_watermarks(kafka, topic_name)[0] > max(sent), 90,
                 "the broker to delete every rolled local segment")
        time.sleep(2.0)  # several expiration runs after the log start offset moved
        segs = remote_segments(sidecar, tp)
        # All still there. Retention may also have rolled and deleted the active segment (the one holding the
        # rolling record): the sidecar stages such a segment from its .deleted files and tiers it after the rest.
        assert [s.remote_log_segment_id for s in segs][:len(before)] == before
        assert rsm.deleted == []
        assert_contiguous(segs)
        assert_readable(sidecar, tp, sent)
    finally:
        sidecar.stop()


def test_segments_retention_deleted_are_not_copied_again(kafka: KafkaCluster, topic_name: str,
                                                          tmp_path: Path) -> None:
    # Remote retention of 1 byte: every segment goes as soon as it is remote. The broker keeps its local copies
    # (local retention unlimited): the copier must not tier them a second time once the metadata no longer lists
    # them.
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300", "retention.ms": "-1"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    sent = produce_segments(kafka, topic_name, 4, 100, segment_ms=300)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name),
                             retention=[{"pattern": ".*", "retention_ms": -1, "retention_bytes": 1}])
    sidecar, rsm = start(settings)
    try:
        wait_for(lambda: rsm.copied and max(rsm.copied) > max(sent) - 100 and len(rsm.deleted) >= len(rsm.copied)
                 and remote_segments(sidecar, tp) == [], 60, "every segment copied and then expired")
        copied_once = list(rsm.copied)
        time.sleep(3.0)  # ten copy runs and six expiration runs more
        assert rsm.copied == copied_once, "segments deleted by retention were copied again"
        assert len(set(rsm.copied)) == len(rsm.copied) and sorted(rsm.copied) == rsm.copied
        assert rsm.deleted == rsm.copied  # each copied once, deleted once, oldest first
    finally:
        sidecar.stop()
    # A restart does not forget it: the metadata lists no segment now, the copy watermark in the state dir does.
    sidecar, again = start(settings)
    try:
        wait_for(lambda: sidecar.health()[1]["leading"] == 1, 30, "the restarted sidecar to lead the partition")
        time.sleep(3.0)
        assert again.copied == [], "a restarted sidecar copied segments retention had deleted"
    finally:
        sidecar.stop()
