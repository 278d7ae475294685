"""A metadata consumer that stops delivering is replaced (rlmm.topic_consumer: the stall guard).

librdkafka's assign()-mode consumer can stop fetching a partition after a broker restart and say nothing
(confluentinc/librdkafka#5153); no way to make it do so on demand is known, so these tests stop the consumer's
fetching with librdkafka's own pause() on the consumer thread: to the task it looks the same, a consumer that polls
and delivers nothing. A write's record, acknowledged by the broker, must then still be read back (the guard renews
the consumer at the offsets applied), with nothing applied twice or skipped; the guard stays quiet while the
consumer delivers.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import TopicPartition

import rlmm.topic_consumer
from rlmm.api import RemoteLogSegmentState, TopicIdPartition
from tests.rlmm.helpers import eventually, segment, update

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


def test_records_another_writer_wrote_reach_a_consumer_that_stopped_delivering(
        rlmm_factory, topic_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No waiter here: the records come from another manager (another sidecar). The high watermark, looked at every
    HIGH_WATERMARK_CHECK_S, stays above what was applied over two looks: renewed, the reader catches up."""
    monkeypatch.setattr(rlmm.topic_consumer, "HIGH_WATERMARK_CHECK_S", 1.0)
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    reader = rlmm_factory(topic_name, "reader", num_partitions=1)
    writer = rlmm_factory(topic_name, "writer", num_partitions=1)
    for m in (reader, writer):
        m.on_partition_leadership_changes([tp], [])
        m.wait_ready([tp])
    task, mp = reader._consumer, reader.cache.mp_of(tp)
    first = segment(tp, 0, 9)
    writer.add_remote_log_segment_metadata(first)
    eventually(lambda: len(reader.list_remote_log_segments(tp)) == 1)
    time.sleep(2.5)   # caught up over a few looks: no renewal
    assert task.renewals == 0

    _pause(task, mp)
    second = segment(tp, 10, 19)
    writer.add_remote_log_segment_metadata(second)
    # without the look at the high watermark: never there (nothing waits for it on the reader)
    eventually(lambda: len(reader.list_remote_log_segments(tp)) == 2, 20)
    assert task.renewals == 1 and task.skipped_records == 0
    assert [s.remote_log_segment_id for s in reader.list_remote_log_segments(tp)] == [
        first.remote_log_segment_id, second.remote_log_segment_id]


def test_a_quiet_partition_is_not_a_stall(rlmm_factory, topic_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """No waiter, nothing beyond what was applied: a paused, idle partition is left alone."""
    monkeypatch.setattr(rlmm.topic_consumer, "HIGH_WATERMARK_CHECK_S", 1.0)
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    m = rlmm_factory(topic_name, "m", num_partitions=1, stall_renew_s=0.5)
    m.on_partition_leadership_changes([tp], [])
    m.wait_ready([tp])
    task, mp = m._consumer, m.cache.mp_of(tp)
    m.add_remote_log_segment_metadata(segment(tp, 0, 9))
    _pause(task, mp)
    time.sleep(3.0)
    assert task.renewals == 0


def test_wait_caught_up_waits_for_what_the_topic_holds_now(rlmm_factory, topic_name: str) -> None:
    """wait_ready stays true after a partition's first catch-up; wait_caught_up waits for the records written since
    (here held back by a consumer that stopped delivering, until the guard renews it)."""
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    reader = rlmm_factory(topic_name, "reader", num_partitions=1, stall_renew_s=2.0)
    writer = rlmm_factory(topic_name, "writer", num_partitions=1)
    for m in (reader, writer):
        m.on_partition_leadership_changes([tp], [])
        m.wait_ready([tp])
    _pause(reader._consumer, reader.cache.mp_of(tp))
    written = segment(tp, 0, 9)
    writer.add_remote_log_segment_metadata(written)
    reader.wait_ready([tp])
    assert reader.list_remote_log_segments(tp) == []   # ready, and stale
    reader.wait_caught_up([tp], timeout_s=20)
    assert [s.remote_log_segment_id for s in reader.list_remote_log_segments(tp)] == [written.remote_log_segment_id]
