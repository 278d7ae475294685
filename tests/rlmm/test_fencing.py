"""Leader-epoch fencing of copies through the real broker: two managers (an old and a new leader), the zombie's
COPY_SEGMENT_FINISHED refused with CopyFencedError, the same answers after a rebuild from the topic. Fencing as one
manager answers it (and a copy refused once its partition is being deleted) is the contract: test_contract.py."""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace

import pytest

from rlmm import CopyFencedError, InvalidStateTransitionError
from rlmm.api import RemoteLogSegmentState as S
from rlmm.api import TopicIdPartition
from tests.rlmm.helpers import eventually, segment, update


def copy(tp: TopicIdPartition, start: int, end: int, leader_epoch: int | None, broker_id: int):
    return replace(segment(tp, start, end, {max(leader_epoch or 0, 0): start}, broker_id=broker_id),
                   broker_leader_epoch=leader_epoch)


def test_zombie_copy_is_fenced_and_a_rebuild_agrees(rlmm_factory, topic_name: str) -> None:
    tp = TopicIdPartition(uuid.uuid4(), "fenced", 0)
    old_leader = rlmm_factory(topic_name, "old", broker_id=1)
    new_leader = rlmm_factory(topic_name, "new", broker_id=2)
    for m in (old_leader, new_leader):
        m.on_partition_leadership_changes([tp], [])
    zombie = copy(tp, 0, 99, 5, 1)
    old_leader.add_remote_log_segment_metadata(zombie)               # started under epoch 5; leadership moves
    eventually(lambda: new_leader.list_remote_log_segments(tp))
    fresh = copy(tp, 0, 99, 6, 2)
    new_leader.add_remote_log_segment_metadata(fresh)                # the new leader copies the same range
    new_leader.update_remote_log_segment_metadata(update(fresh, S.COPY_SEGMENT_FINISHED, broker_id=2))
    eventually(lambda: old_leader.copy_fence_epoch(tp) == 6)
    with pytest.raises(CopyFencedError, match="epoch 5 refused.*epoch 6") as err:
        old_leader.update_remote_log_segment_metadata(update(zombie, S.COPY_SEGMENT_FINISHED))
    assert isinstance(err.value, InvalidStateTransitionError)
    legacy = copy(tp, 100, 199, None, 1)                           # no epoch (an old writer): never fenced
    old_leader.add_remote_log_segment_metadata(legacy)
    old_leader.update_remote_log_segment_metadata(update(legacy, S.COPY_SEGMENT_FINISHED))
    same = copy(tp, 200, 299, 6, 2)                                # equal epoch: finishes
    new_leader.add_remote_log_segment_metadata(same)
    new_leader.update_remote_log_segment_metadata(update(same, S.COPY_SEGMENT_FINISHED, broker_id=2))

    def answers(m):
        return (sorted((md.start_offset, md.state, md.broker_leader_epoch or -1)
                       for md in m.list_remote_log_segments(tp)),
                m.copy_fence_epoch(tp), m.remote_log_segment_metadata(tp, 6, 50).remote_log_segment_id,
                m.remote_log_size(tp))

    expected = ([(0, S.COPY_SEGMENT_STARTED, 5), (0, S.COPY_SEGMENT_FINISHED, 6), (100, S.COPY_SEGMENT_FINISHED, -1),
                 (200, S.COPY_SEGMENT_FINISHED, 6)], 6, fresh.remote_log_segment_id, 4000)
    assert answers(new_leader) == expected
    eventually(lambda: answers(old_leader) == expected)
    rebuilt = rlmm_factory(topic_name, "rebuilt", broker_id=3)      # a new cache, from the topic's beginning
    rebuilt.on_partition_leadership_changes([], [tp])
    rebuilt.wait_ready([tp])
    assert rebuilt.rebuilt_partitions == [rebuilt.cache.mp_of(tp)]
    assert answers(rebuilt) == expected
    assert rebuilt.cache.dump() == new_leader.cache.dump() == old_leader.cache.dump()


def test_writer_sees_fencing_decided_by_the_topic_order(rlmm_factory, topic_name: str) -> None:
    """The new leader's STARTED lands after the old leader checked its cache but before its FINISHED: the topic
    order decides, every cache refuses the FINISHED, and its writer gets CopyFencedError through read-your-writes."""
    tp = TopicIdPartition(uuid.uuid4(), "raced", 1)
    old_leader = rlmm_factory(topic_name, "old", broker_id=1)
    new_leader = rlmm_factory(topic_name, "new", broker_id=2)
    for m in (old_leader, new_leader):
        m.on_partition_leadership_changes([tp], [])
    zombie = copy(tp, 0, 99, 5, 1)
    old_leader.add_remote_log_segment_metadata(zombie)
    eventually(lambda: new_leader.list_remote_log_segments(tp))

    gate = threading.Event()                # hold the old leader's consumer thread: its cache lags behind the topic
    real_apply = old_leader.cache.apply

    def lagging_apply(records, caught_up):
        gate.wait(30)
        return real_apply(records, caught_up)

    old_leader.cache.apply = lagging_apply
    fresh = copy(tp, 0, 99, 6, 2)
    new_leader.add_remote_log_segment_metadata(fresh)
    assert old_leader.cache.copy_fence_epoch(tp) == 5                # the old leader has not seen epoch 6
    timer = threading.Timer(1.0, gate.set)
    timer.start()
    try:
        with pytest.raises(CopyFencedError, match=r"refused the record at .* offset 2: .*epoch 5 refused.*epoch 6"):
            old_leader.update_remote_log_segment_metadata(update(zombie, S.COPY_SEGMENT_FINISHED))
    finally:
        timer.cancel()
        gate.set()
    skipped = [s for s in old_leader.skipped if s.fenced]
    assert len(skipped) == 1 and skipped[0].reason == "refused" and skipped[0].offset == 2
    eventually(lambda: [s.offset for s in new_leader.skipped if s.fenced] == [2])    # every cache refused it
    assert old_leader.list_remote_log_segments(tp)[0].state == S.COPY_SEGMENT_STARTED
    assert old_leader.remote_log_segment_metadata(tp, 5, 50) is None
