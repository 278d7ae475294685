"""The topic-based metadata manager against the real broker: two managers, read-your-writes, restarts, readers.

What every metadata manager promises (lifecycle, refusals, lookups, partition deletes, serving) is checked on this
one and on the in-memory one by test_contract.py."""

from __future__ import annotations

import time
import uuid

import pytest

from rlmm.api import (
    ReadYourWritesTimeoutError,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from tests.rlmm.helpers import eventually, segment, update

S = RemoteLogSegmentState


def test_two_managers_see_each_others_writes(rlmm_factory, topic_name: str) -> None:
    """What one manager writes, another on the same topic reads, and both caches end up the same. What a manager
    answers to its own writes (lookups, listing, sizes, deletion) is the contract: test_contract.py."""
    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    leader = rlmm_factory(topic_name, "leader", broker_id=1)
    follower = rlmm_factory(topic_name, "follower", broker_id=2)
    leader.on_partition_leadership_changes([tp], [])
    follower.on_partition_leadership_changes([], [tp])
    leader.wait_ready([tp])

    a = segment(tp, 0, 99, {0: 0})
    leader.add_remote_log_segment_metadata(a)
    leader.update_remote_log_segment_metadata(update(a, S.COPY_SEGMENT_FINISHED, custom=b"rsm"))
    got = leader.remote_log_segment_metadata(tp, 0, 50)
    seen = eventually(lambda: follower.remote_log_segment_metadata(tp, 0, 99))
    assert seen == got

    # the follower writes, the leader sees it
    b = segment(tp, 100, 199, {0: 100, 1: 150}, broker_id=2, size=500)
    follower.add_remote_log_segment_metadata(b)
    follower.update_remote_log_segment_metadata(update(b, S.COPY_SEGMENT_FINISHED, broker_id=2))
    eventually(lambda: leader.remote_log_segment_metadata(tp, 1, 160))
    assert leader.remote_log_segment_metadata(tp, 0, 149).remote_log_segment_id == b.remote_log_segment_id

    # the leader deletes, the follower sees it
    leader.update_remote_log_segment_metadata(update(a, S.DELETE_SEGMENT_STARTED))
    leader.update_remote_log_segment_metadata(update(a, S.DELETE_SEGMENT_FINISHED))
    eventually(lambda: [m.start_offset for m in follower.list_remote_log_segments(tp)] == [100])
    assert follower.cache.dump() == leader.cache.dump()


def test_restart_consumes_no_old_records(rlmm_factory, topic_name: str) -> None:
    tps = [TopicIdPartition(uuid.uuid4(), "big", p) for p in range(4)]
    m = rlmm_factory(topic_name, "c", serve_all=True)
    m.wait_ready(tps)
    n = 0
    for tp in tps:
        for i in range(50):
            md = segment(tp, i * 100, i * 100 + 99, {i // 10: i * 100})
            m.add_remote_log_segment_metadata(md)
            m.update_remote_log_segment_metadata(update(md, S.COPY_SEGMENT_FINISHED))
            n += 2
    assert m.records_consumed == n
    before = m.cache.dump()
    m.close()

    again = rlmm_factory(topic_name, "c", serve_all=True)
    again.wait_ready(tps)
    assert again.records_consumed == 0
    assert again.rebuilt_partitions == [] and sorted(again.resumed_partitions) == list(range(5))
    assert again.cache.dump() == before
    assert again.remote_log_segment_metadata(tps[2], 3, 3050).start_offset == 3000
    md = segment(tps[0], 10_000, 10_099, {9: 10_000})
    again.add_remote_log_segment_metadata(md)
    assert again.records_consumed == 1


def test_close_right_after_a_write_still_resumes(rlmm_factory, topic_name: str) -> None:
    """A manager closed right after its last write (before the consumer saw the end of the partitions again, and
    long before its periodic caught-up mark) still leaves every partition resumable: the restart consumes nothing.
    It used to rebuild the partitions whose end-of-partition event had not come in yet."""
    tps = [TopicIdPartition(uuid.uuid4(), "quick", p) for p in range(4)]
    for round_ in range(3):
        m = rlmm_factory(topic_name, "c", serve_all=True, caught_up_refresh_s=3600)
        m.wait_ready(tps)
        assert m.records_consumed == 0, f"round {round_}"
        assert m.rebuilt_partitions == ([] if round_ else list(range(5)))
        for tp in tps:
            md = segment(tp, round_ * 100, round_ * 100 + 99)
            m.add_remote_log_segment_metadata(md)
            m.update_remote_log_segment_metadata(update(md, S.COPY_SEGMENT_FINISHED))
        m.close()


def test_read_your_writes_timeout_is_clear(rlmm_factory, topic_name: str) -> None:
    tp = TopicIdPartition(uuid.uuid4(), "slow", 0)
    m = rlmm_factory(topic_name, "c", write_timeout_s=1.0)
    m.on_partition_leadership_changes([tp], [])
    real_apply = m.cache.apply

    def slow_apply(records, caught_up):       # the consumer thread falls behind (a stalled disk, say)
        time.sleep(2.5)
        return real_apply(records, caught_up)

    m.cache.apply = slow_apply
    md = segment(tp, 0, 9)
    with pytest.raises(ReadYourWritesTimeoutError, match=r"written at .* offset 0 but the local cache applied only"):
        m.add_remote_log_segment_metadata(md)
    eventually(lambda: m.list_remote_log_segments(tp))            # the write itself is durable and arrives


def test_a_read_only_manager_reads_and_never_writes(rlmm_factory, topic_name: str) -> None:
    """A reader's manager has no producer (a principal that only reads needs no WRITE or IDEMPOTENT_WRITE): it
    follows what a writer writes and refuses every write, naming the topic."""
    from rlmm.api import RemoteLogMetadataError

    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    writer = rlmm_factory(topic_name, "writer", broker_id=1, tombstone_delay_ms=0)
    reader = rlmm_factory(topic_name, "reader", broker_id=1, read_only=True, tombstone_delay_ms=0)
    assert reader._producer is None
    writer.on_partition_leadership_changes([tp], [])
    reader.on_partition_leadership_changes([], [tp])
    a = segment(tp, 0, 99, {0: 0})
    writer.add_remote_log_segment_metadata(a)
    writer.update_remote_log_segment_metadata(update(a, S.COPY_SEGMENT_FINISHED))
    assert eventually(lambda: reader.remote_log_segment_metadata(tp, 0, 50)).remote_log_segment_id == \
        a.remote_log_segment_id
    b = segment(tp, 100, 199, {0: 100})
    with pytest.raises(RemoteLogMetadataError, match=f"metadata manager of {topic_name} is read-only"):
        reader.add_remote_log_segment_metadata(b)
    with pytest.raises(RemoteLogMetadataError, match="read-only"):
        reader.write_segment_metadata_many([b])
    with pytest.raises(RemoteLogMetadataError, match="read-only"):
        reader.put_remote_partition_delete_metadata(
            RemotePartitionDeleteMetadata(tp, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 0, 1))
    assert [m.start_offset for m in writer.list_remote_log_segments(tp)] == [0]  # nothing of b was written
