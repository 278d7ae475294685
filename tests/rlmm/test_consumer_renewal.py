"""A metadata consumer that stops delivering is replaced (rlmm.topic_consumer: the stall guard).

librdkafka's assign()-mode consumer can stop fetching a partition after a broker restart and say nothing
(confluentinc/librdkafka#5153); no way to make it do so on demand is known, so these tests stop the consumer's
fetching with librdkafka's own pause() on the consumer thread: to the task it looks the same, a consumer that polls
and delivers nothing. A write's record, acknowledged by the broker, must then still be read back (the guard renews
the consumer at the offsets applied), with nothing applied twice or skipped; the guard stays quiet while the
consumer delivers.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import TopicPartition

from rlmm.api import RemoteLogSegmentState, TopicIdPartition
from tests.rlmm.helpers import segment, update

pytestmark = [pytest.mark.kafka]


def _pause(task, mp: int) -> None:
    task.call(lambda: task._consumer.pause([TopicPartition(task.topic, mp)]))


def test_a_write_reads_itself_back_through_a_consumer_that_stopped_delivering(rlmm_factory, topic_name: str) -> None:
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    m = rlmm_factory(topic_name, "m", num_partitions=1, write_timeout_s=20.0, stall_renew_s=2.0)
    m.on_partition_leadership_changes([tp], [])
    m.wait_ready([tp])
    task, mp = m._consumer, m.cache.mp_of(tp)
    for i in range(3):   # delivering: the guard says nothing
        m.add_remote_log_segment_metadata(segment(tp, 10 * i, 10 * i + 9))
    assert task.renewals == 0
    applied_before = task.records_applied

    _pause(task, mp)
    late = segment(tp, 30, 39)
    m.add_remote_log_segment_metadata(late)   # without the guard: ReadYourWritesTimeoutError after 20 s
    assert task.renewals == 1
    ids = [s.remote_log_segment_id for s in m.list_remote_log_segments(tp)]
    assert late.remote_log_segment_id in ids and len(ids) == 4
    # each record once: the new consumer started at the next offset to apply, not before it
    assert task.records_applied == applied_before + 1 and task.skipped_records == 0

    # the new consumer delivers: a state change round-trips at once, no second renewal
    m.update_remote_log_segment_metadata(update(late, RemoteLogSegmentState.COPY_SEGMENT_FINISHED))
    assert task.renewals == 1
    assert m.remote_log_segment_metadata(tp, 0, 35).state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED


def test_a_quiet_partition_is_not_a_stall(rlmm_factory, topic_name: str) -> None:
    """No waiter, nothing acknowledged beyond what was applied: a paused, idle partition is left alone (nothing tells
    the guard that records exist)."""
    import time

    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    m = rlmm_factory(topic_name, "m", num_partitions=1, stall_renew_s=0.5)
    m.on_partition_leadership_changes([tp], [])
    m.wait_ready([tp])
    task, mp = m._consumer, m.cache.mp_of(tp)
    m.add_remote_log_segment_metadata(segment(tp, 0, 9))
    _pause(task, mp)
    time.sleep(3.0)
    assert task.renewals == 0
