"""Issue 21: no wait of the metadata manager blocks on a metadata partition it no longer consumes.

A fenced copy's clean-up once waited its full write timeout for its own record to come back, because discovery had
stopped serving the partition (its topic was deleted) and unassigned the metadata partition between the write and
the read-your-writes wait: ``applied only up to -2``. Against the real broker:

- a partition stopped while a write to it is in flight: the write still reads itself back (the metadata partition
  is held while a write uses it);
- a wait on a metadata partition that is not consumed fails at once with :class:`PartitionNotServedError`, naming
  the partition, instead of timing out.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from rlmm.api import PartitionNotServedError, RemoteLogSegmentState, TopicIdPartition
from tests.rlmm.helpers import segment, update

pytestmark = [pytest.mark.kafka]


class _StopOnDelivery:
    """The manager's producer, calling ``before_ack`` on the writer's thread when a record is acknowledged and
    before the writer sees the acknowledgement: the window between a write and its read-your-writes wait."""

    def __init__(self, inner: Any, before_ack: Any) -> None:
        self._inner = inner
        self._before_ack = before_ack

    def produce(self, *args: Any, on_delivery: Any = None, **kwargs: Any) -> None:
        def cb(err: Any, msg: Any) -> None:
            self._before_ack()
            if on_delivery is not None:
                on_delivery(err, msg)

        self._inner.produce(*args, on_delivery=cb, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def test_a_partition_stopped_during_a_write_still_reads_the_write_back(rlmm_factory, topic_name: str) -> None:
    tp = TopicIdPartition(uuid.uuid4(), "doomed", 0)
    m = rlmm_factory(topic_name, "m", write_timeout_s=8.0)
    m.on_partition_leadership_changes([tp], [])
    m.wait_ready([tp])
    md = segment(tp, 0, 99)
    m.add_remote_log_segment_metadata(md)
    stops = []
    # discovery stops serving the partition (its topic deleted) while the clean-up's write is in flight
    m._producer.client = _StopOnDelivery(m._producer.client, lambda: stops.append(m.on_stop_partitions([tp])))
    m.update_remote_log_segment_metadata(update(md, RemoteLogSegmentState.DELETE_SEGMENT_STARTED))
    assert stops, "the stop did not happen during the write"
    assert m.cache.segment(tp, md.remote_log_segment_id.id).state == RemoteLogSegmentState.DELETE_SEGMENT_STARTED
    # a later write (the rest of the clean-up) works too, and the manager goes on serving other partitions
    m.update_remote_log_segment_metadata(update(md, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED))
    other = TopicIdPartition(uuid.uuid4(), "other", 0)
    m.on_partition_leadership_changes([other], [])
    m.add_remote_log_segment_metadata(segment(other, 0, 9))
    assert [s.start_offset for s in m.list_remote_log_segments(other)] == [0]


def test_a_batch_write_survives_a_stop_too(rlmm_factory, topic_name: str) -> None:
    tps = [TopicIdPartition(uuid.uuid4(), "doomed", p) for p in range(3)]
    m = rlmm_factory(topic_name, "m", write_timeout_s=8.0)
    m.on_partition_leadership_changes(tps, [])
    m.wait_ready(tps)
    m._producer.client = _StopOnDelivery(m._producer.client, lambda: m.on_stop_partitions(tps))
    mds = [segment(tp, 0, 9) for tp in tps]
    assert m.write_segment_metadata_many(mds) == [None, None, None]
    for md in mds:
        assert m.cache.segment(md.topic_id_partition, md.remote_log_segment_id.id) is not None


def test_waiting_on_a_partition_not_consumed_fails_at_once_naming_it(rlmm_factory, topic_name: str) -> None:
    served = TopicIdPartition(uuid.uuid4(), "served", 0)
    m = rlmm_factory(topic_name, "m", num_partitions=50)
    m.on_partition_leadership_changes([served], [])
    m.wait_ready([served])
    never = TopicIdPartition(uuid.uuid4(), "never", 0)
    while m.cache.mp_of(never) == m.cache.mp_of(served):
        never = TopicIdPartition(uuid.uuid4(), "never", 0)
    with pytest.raises(PartitionNotServedError, match=f"{topic_name}-{m.cache.mp_of(never)}"):
        m.wait_ready([never], timeout_s=600)
    m.on_stop_partitions([served])
    with pytest.raises(PartitionNotServedError, match="not consumed"):
        m.wait_ready([served], timeout_s=600)
