"""A sidecar whose local state directory was wiped rebuilds from the metadata topic and re-uploads nothing."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
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


def test_wiped_state_dir_rebuilds_and_uploads_nothing_again(kafka: KafkaCluster, topic_name: str,
                                                            tmp_path: Path) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    sent = produce_segments(kafka, topic_name, 5, 150, segment_ms=300)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name))
    first = RecordingRsm(settings.store)
    with Sidecar(settings, rsm=first) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 60, "every offset remote")
        before = remote_segments(sidecar, tp)
    assert len(first.copies) == len(before) >= 5
    assert_contiguous(before)

    shutil.rmtree(settings.metadata.state_dir)  # the metadata cache, known partitions, GC sightings: all gone
    second = RecordingRsm(settings.store)
    with Sidecar(settings, rsm=second) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 60, "the rebuilt cache to know every segment")
        time.sleep(2.0)  # several copy runs over the same local segments
        assert second.copies == []
        assert [s.remote_log_segment_id for s in remote_segments(sidecar, tp)] == [
            s.remote_log_segment_id for s in before]

        more = produce_segments(kafka, topic_name, 2, 100, segment_ms=300)
        wait_for(lambda: latest_remote(sidecar, tp) >= max(more), 60, "the new segments to be remote")
        after = remote_segments(sidecar, tp)
        assert [s.remote_log_segment_id for s in after[:len(before)]] == [s.remote_log_segment_id for s in before]
        assert second.copies and second.copies[0][0] == before[-1].end_offset_inclusive + 1
        assert second.copies == [(s.start_offset, s.end_offset_inclusive) for s in after[len(before):]]
        assert_contiguous(after)
        assert_readable(sidecar, tp, {**sent, **more})
