"""The fence before COPY_SEGMENT_FINISHED, through ``rlm serve``'s copy run against the real broker (issue 26: the fence
no longer reads the local leader-epoch checkpoint again, it asks the cluster's leader alone, after the copy)."""

from __future__ import annotations

import threading
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


def test_a_copy_whose_leader_epoch_moved_during_it_is_removed_and_copied_again(
        kafka: KafkaCluster, topic_name: str, tmp_path: Path) -> None:
    """The cluster answers a newer leader epoch once, to the first fence after the first copy began: that copy is
    deleted from the store and never FINISHED; the next run, under the epoch the cluster answers again, copies the
    same offsets anew, and the remote chain is contiguous and byte-exact."""
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300"})
    sent = produce_segments(kafka, topic_name, 2, 100, segment_ms=300)
    tp = TopicIdPartition(topic_id, topic_name, 0)
    # No expiration job: it asks the cluster for the leader epoch too (Sidecar._leader_epoch, every 500 ms in the
    # tests' settings), and one of its rounds while the first copy ran took the moved epoch meant for the fence
    # (seen in CI under load: the copy then finished, never fenced)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name), tasks={"expiration_interval_ms": 3_600_000})
    rsm = RecordingRsm(settings.store)
    moved = threading.Event()  # set while the first copy runs: the next answer for our partition is epoch + 1
    answered_moved: list[int] = []
    with Sidecar(settings, rsm=rsm) as sidecar:
        coalescer = sidecar._stable_offsets
        fetch = coalescer._fetch

        def moving(keys):  # type: ignore[no-untyped-def]
            got = dict(fetch(keys))
            key = (topic_name, 0)
            if key in got and moved.is_set():
                moved.clear()
                lso, epoch = got[key]
                got[key] = (lso, epoch + 1)
                answered_moved.append(epoch + 1)
            return got

        copy = rsm.copy_log_segment_data

        def copying(segment_metadata, segment_data, **kw):  # type: ignore[no-untyped-def]
            if not rsm.copies:  # the first copy: the leader epoch moves on while it runs (a second: time for any
                moved.set()     # other asker of the epoch to come between it and the fence)
                time.sleep(1.0)
            return copy(segment_metadata, segment_data, **kw)

        coalescer._fetch = moving  # type: ignore[method-assign]
        rsm.copy_log_segment_data = copying  # type: ignore[method-assign]
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 90, "the segments copied after the fenced copy")
        segs = remote_segments(sidecar, tp)
        assert_contiguous(segs)
        assert_readable(sidecar, tp, sent)
    assert len(answered_moved) == 1  # the fence asked the cluster after the copy, and got the moved epoch
    first = rsm.copies[0]
    assert rsm.copies.count(first) >= 2, rsm.copies  # fenced, then copied again
    assert first[0] in rsm.deleted  # the fenced copy's objects removed
