"""The RemoteLogMetadataManager contract (``rlmm/api.py``), run on every implementation: the in-memory reference
(``rlmm/memory.py``, no broker) and the topic-based manager (the real broker; one metadata topic and one manager per
module, each test on partitions of its own, a manager of its own only where the test is about serving or closing).

What only the topic-based manager does (two managers on one topic, restarts, rebuilds, compaction, a lagging consumer,
read-only readers) is in ``test_manager.py``, ``test_fencing.py`` and their neighbours.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest

from rlmm.api import (
    CopyFencedError,
    InvalidStateTransitionError,
    PartitionNotServedError,
    RemoteLogMetadataError,
    RemoteLogMetadataManager,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
    UnknownSegmentError,
)
from rlmm.memory import InMemoryRemoteLogMetadataManager
from tests.rlmm.helpers import segment, update

S = RemoteLogSegmentState
P = RemotePartitionDeleteState
Factory = Callable[[], RemoteLogMetadataManager]


@pytest.fixture(scope="module", params=["memory", pytest.param("topic", marks=pytest.mark.kafka)])
def make(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Factory]:
    """Makes managers of one implementation; the topic-based ones share one metadata topic (created once)."""
    made: list[RemoteLogMetadataManager] = []
    if request.param == "memory":
        def new() -> RemoteLogMetadataManager:
            made.append(InMemoryRemoteLogMetadataManager())
            return made[-1]
    else:
        from rlmm.topic_manager import TopicBasedRemoteLogMetadataManager, TopicBasedRlmmConfig

        kafka = request.getfixturevalue("kafka")
        topic = f"__rlmm_contract_{uuid.uuid4().hex[:8]}"
        caches = tmp_path_factory.mktemp("contract")

        def new() -> RemoteLogMetadataManager:
            made.append(TopicBasedRemoteLogMetadataManager(TopicBasedRlmmConfig(
                bootstrap_servers=kafka.bootstrap_servers, cache_dir=caches / str(len(made)), topic=topic,
                num_partitions=5, replication_factor=1)))
            return made[-1]
    yield new
    for m in made:
        m.close()


@pytest.fixture(scope="module")
def shared(make: Factory) -> RemoteLogMetadataManager:
    return make()


@pytest.fixture
def m(shared: RemoteLogMetadataManager) -> RemoteLogMetadataManager:
    """The module's manager, for a test that uses partitions of its own (:func:`served`)."""
    return shared


def served(m: RemoteLogMetadataManager, name: str, partition: int = 0) -> TopicIdPartition:
    tp = TopicIdPartition(uuid.uuid4(), name, partition)
    m.on_partition_leadership_changes([tp], [])
    m.wait_ready([tp])
    return tp


def finished(m: RemoteLogMetadataManager, md: RemoteLogSegmentMetadata) -> RemoteLogSegmentMetadata:
    m.add_remote_log_segment_metadata(md)
    m.update_remote_log_segment_metadata(update(md, S.COPY_SEGMENT_FINISHED))
    return md


def copy(tp: TopicIdPartition, start: int, end: int, leader_epoch: int | None, broker_id: int = 1,
         ) -> RemoteLogSegmentMetadata:
    """A copy started under broker leader epoch ``leader_epoch`` (None: a writer without fencing)."""
    return replace(segment(tp, start, end, {max(leader_epoch or 0, 0): start}, broker_id=broker_id),
                   broker_leader_epoch=leader_epoch)


# ---------------------------------------------------------------------------------------------- lifecycle
def test_a_segments_lifecycle_as_its_writer_reads_it(m: RemoteLogMetadataManager) -> None:
    """COPY_SEGMENT_STARTED -> FINISHED -> DELETE_SEGMENT_STARTED -> FINISHED, each visible when the call returns."""
    tp = served(m, "orders")
    a = segment(tp, 0, 99, {0: 0})
    m.add_remote_log_segment_metadata(a)
    assert [md.remote_log_segment_id for md in m.list_remote_log_segments(tp)] == [a.remote_log_segment_id]
    assert m.remote_log_segment_metadata(tp, 0, 50) is None     # not readable before COPY_SEGMENT_FINISHED
    assert m.highest_offset_for_epoch(tp, 0) is None
    m.update_remote_log_segment_metadata(update(a, S.COPY_SEGMENT_FINISHED, custom=b"rsm"))
    got = m.remote_log_segment_metadata(tp, 0, 50)
    assert got is not None and got.state == S.COPY_SEGMENT_FINISHED and got.custom_metadata == b"rsm"
    assert got.remote_log_segment_id == a.remote_log_segment_id and got.broker_id == 1
    assert m.highest_offset_for_epoch(tp, 0) == 99
    # deletion: no longer served for reads once DELETE_SEGMENT_STARTED, gone after FINISHED
    m.update_remote_log_segment_metadata(update(a, S.DELETE_SEGMENT_STARTED))
    assert m.remote_log_segment_metadata(tp, 0, 50) is None
    assert m.highest_offset_for_epoch(tp, 0) is None
    assert m.list_remote_log_segments(tp)[0].state == S.DELETE_SEGMENT_STARTED
    assert m.remote_log_size(tp) == 1000                        # still counted: its data is not deleted yet
    m.update_remote_log_segment_metadata(update(a, S.DELETE_SEGMENT_FINISHED))
    assert m.list_remote_log_segments(tp) == [] and m.remote_log_size(tp) == 0
    with pytest.raises(UnknownSegmentError, match="no such segment"):   # fully deleted: unknown
        m.update_remote_log_segment_metadata(update(a, S.DELETE_SEGMENT_FINISHED))


def test_retries_are_idempotent(m: RemoteLogMetadataManager) -> None:
    """A repeated state is allowed; adding an id again while COPY_SEGMENT_STARTED replaces it."""
    tp = served(m, "retry")
    a = segment(tp, 0, 99)
    m.add_remote_log_segment_metadata(a)
    longer = replace(a, end_offset_inclusive=149, segment_size_bytes=1500)
    m.add_remote_log_segment_metadata(longer)
    assert [(md.end_offset_inclusive, md.segment_size_bytes) for md in m.list_remote_log_segments(tp)] == [(149, 1500)]
    for state in (S.COPY_SEGMENT_FINISHED, S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED,
                  S.DELETE_SEGMENT_FINISHED):
        m.update_remote_log_segment_metadata(update(a, state))
    assert m.list_remote_log_segments(tp) == []


def test_every_segment_transition_allowed_or_refused_as_the_diagram_says(m: RemoteLogMetadataManager) -> None:
    """For each (from, to) of the segment states: the update is applied exactly when the diagram allows it, and a
    refusal is InvalidStateTransitionError naming the segment and both states, leaving the segment as it was."""
    tp = served(m, "diagram")
    path = [S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED]
    for i, src in enumerate([S.COPY_SEGMENT_STARTED, *path]):
        for dst in (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED):
            md = segment(tp, 0, 9)
            m.add_remote_log_segment_metadata(md)
            for step in path[:i]:
                m.update_remote_log_segment_metadata(update(md, step))
            if src.can_transition_to(dst):
                m.update_remote_log_segment_metadata(update(md, dst))
                expected = [] if dst == S.DELETE_SEGMENT_FINISHED else [dst]
            else:
                with pytest.raises(InvalidStateTransitionError) as err:
                    m.update_remote_log_segment_metadata(update(md, dst))
                assert f"{src.name} -> {dst.name}" in str(err.value)
                assert str(md.remote_log_segment_id.id) in str(err.value)
                expected = [src]
            now = [s.state for s in m.list_remote_log_segments(tp) if s.remote_log_segment_id ==
                   md.remote_log_segment_id]
            assert now == expected, (src, dst)
            if now and now[0] != S.COPY_SEGMENT_STARTED:   # an id known in another state cannot start again
                with pytest.raises(InvalidStateTransitionError, match=f"{now[0].name} -> COPY_SEGMENT_STARTED"):
                    m.add_remote_log_segment_metadata(md)


def test_invalid_transitions_refused_with_names(m: RemoteLogMetadataManager) -> None:
    tp = served(m, "t", 3)
    a = segment(tp, 0, 9)
    m.add_remote_log_segment_metadata(a)
    with pytest.raises(InvalidStateTransitionError) as err:
        m.update_remote_log_segment_metadata(update(a, S.DELETE_SEGMENT_FINISHED))
    assert str(a.remote_log_segment_id.id) in str(err.value)
    assert "COPY_SEGMENT_STARTED -> DELETE_SEGMENT_FINISHED" in str(err.value)
    m.update_remote_log_segment_metadata(update(a, S.COPY_SEGMENT_FINISHED))
    m.update_remote_log_segment_metadata(update(a, S.COPY_SEGMENT_FINISHED))    # a retry is fine
    with pytest.raises(InvalidStateTransitionError, match="COPY_SEGMENT_FINISHED -> COPY_SEGMENT_STARTED"):
        m.add_remote_log_segment_metadata(a)
    with pytest.raises(UnknownSegmentError):
        m.update_remote_log_segment_metadata(update(segment(tp, 10, 19), S.COPY_SEGMENT_FINISHED))
    with pytest.raises(ValueError, match="COPY_SEGMENT_STARTED"):
        m.add_remote_log_segment_metadata(a.with_update(update(a, S.COPY_SEGMENT_FINISHED)))


# ------------------------------------------------------------------------------------------------ lookups
def test_lookups_by_leader_epoch(m: RemoteLogMetadataManager) -> None:
    """The segment holding an offset under an epoch, the highest offset of an epoch, listing and sizes by epoch."""
    tp = served(m, "orders")
    a = finished(m, segment(tp, 0, 99, {0: 0}))
    b = finished(m, segment(tp, 100, 199, {0: 100, 1: 150}, broker_id=2, size=500))
    assert m.remote_log_segment_metadata(tp, 0, 99).remote_log_segment_id == a.remote_log_segment_id
    assert m.remote_log_segment_metadata(tp, 1, 160).remote_log_segment_id == b.remote_log_segment_id
    assert m.remote_log_segment_metadata(tp, 0, 149).remote_log_segment_id == b.remote_log_segment_id
    assert m.remote_log_segment_metadata(tp, 0, 150) is None       # offset 150 belongs to epoch 1
    assert m.remote_log_segment_metadata(tp, 1, 200) is None
    assert m.remote_log_segment_metadata(tp, 2, 160) is None
    assert m.highest_offset_for_epoch(tp, 0) == 149
    assert m.highest_offset_for_epoch(tp, 1) == 199
    assert m.highest_offset_for_epoch(tp, 5) is None
    assert [md.start_offset for md in m.list_remote_log_segments(tp)] == [0, 100]
    assert [md.start_offset for md in m.list_remote_log_segments(tp, 1)] == [100]
    assert m.remote_log_size(tp) == 1500 and m.remote_log_size(tp, 1) == 500
    started = segment(tp, 200, 299, {1: 200}, size=7)             # listed and counted, never found by offset
    m.add_remote_log_segment_metadata(started)
    assert m.remote_log_segment_metadata(tp, 1, 250) is None
    assert m.highest_offset_for_epoch(tp, 1) == 199
    assert [md.start_offset for md in m.list_remote_log_segments(tp)] == [0, 100, 200]
    assert [md.start_offset for md in m.list_remote_log_segments(tp, 1)] == [100, 200]
    assert [md.start_offset for md in m.list_remote_log_segments(tp, 0)] == [0, 100]
    assert m.list_remote_log_segments(tp, 7) == []
    assert m.remote_log_size(tp) == 1507 and m.remote_log_size(tp, 1) == 507 and m.remote_log_size(tp, 0) == 1500
    other = served(m, "orders", 1)                                 # partitions are apart
    assert m.list_remote_log_segments(other) == [] and m.highest_offset_for_epoch(other, 0) is None


def test_the_leader_epoch_of_an_offset(m: RemoteLogMetadataManager) -> None:
    """``epoch_at`` of a segment as the manager hands it back: each offset's epoch is the last one starting at or
    before it, and the manager's lookup by (that epoch, offset) finds the segment; the inverse of
    ``epoch_end_offset``. Past its end the last epoch, below its first epoch's start the first."""
    tp = served(m, "epochs")
    written = finished(m, segment(tp, 100, 199, {2: 100, 3: 150, 5: 180}))
    listed = m.list_remote_log_segments(tp)
    assert [md.remote_log_segment_id for md in listed] == [written.remote_log_segment_id]
    md = listed[0]
    want = {100: 2, 149: 2, 150: 3, 179: 3, 180: 5, 199: 5}
    assert {o: md.epoch_at(o) for o in want} == want
    for offset in range(100, 200):
        epoch = md.epoch_at(offset)
        found = m.remote_log_segment_metadata(tp, epoch, offset)
        assert found is not None and found.remote_log_segment_id == md.remote_log_segment_id, offset
        assert md.epoch_end_offset(epoch) >= offset                 # type: ignore[operator]
    assert md.epoch_at(250) == 5 and md.epoch_at(0) == 2


# ----------------------------------------------------------------------------------------------- fencing
def test_a_copy_started_under_a_lower_leader_epoch_cannot_finish(m: RemoteLogMetadataManager) -> None:
    tp = served(m, "fenced")
    zombie = copy(tp, 0, 99, 5)
    m.add_remote_log_segment_metadata(zombie)
    assert m.copy_fence_epoch(tp) == 5
    fresh = copy(tp, 0, 99, 6, broker_id=2)
    m.add_remote_log_segment_metadata(fresh)
    assert m.copy_fence_epoch(tp) == 6
    with pytest.raises(CopyFencedError, match="epoch 5 refused.*epoch 6") as err:
        m.update_remote_log_segment_metadata(update(zombie, S.COPY_SEGMENT_FINISHED))
    assert isinstance(err.value, InvalidStateTransitionError)
    m.update_remote_log_segment_metadata(update(fresh, S.COPY_SEGMENT_FINISHED, broker_id=2))
    m.add_remote_log_segment_metadata(copy(tp, 300, 399, 4))       # a lower epoch never lowers the fence
    assert m.copy_fence_epoch(tp) == 6
    finished(m, copy(tp, 100, 199, None))                          # no epoch (an old writer): never fenced
    finished(m, copy(tp, 200, 299, 6, broker_id=2))                # equal epoch: finishes
    listed = sorted((md.start_offset, md.state, md.broker_leader_epoch or -1) for md in m.list_remote_log_segments(tp))
    assert listed == [(0, S.COPY_SEGMENT_STARTED, 5), (0, S.COPY_SEGMENT_FINISHED, 6),
                      (100, S.COPY_SEGMENT_FINISHED, -1), (200, S.COPY_SEGMENT_FINISHED, 6),
                      (300, S.COPY_SEGMENT_STARTED, 4)]
    assert m.remote_log_segment_metadata(tp, 6, 50).remote_log_segment_id == fresh.remote_log_segment_id
    assert m.remote_log_segment_metadata(tp, 5, 50) is None        # the zombie is never served
    # what the fenced writer must do: delete its copy
    m.update_remote_log_segment_metadata(update(zombie, S.DELETE_SEGMENT_STARTED))
    m.update_remote_log_segment_metadata(update(zombie, S.DELETE_SEGMENT_FINISHED))
    assert zombie.remote_log_segment_id not in {md.remote_log_segment_id for md in m.list_remote_log_segments(tp)}


# -------------------------------------------------------------------------------------- partition delete
def test_partition_delete_drops_segments_and_unserved_reads_fail(make: Factory) -> None:
    m = make()
    tp = TopicIdPartition(uuid.uuid4(), "gone", 0)
    with pytest.raises(PartitionNotServedError, match="on_partition_leadership_changes"):
        m.list_remote_log_segments(tp)
    m.on_partition_leadership_changes([tp], [])
    for i in range(3):
        finished(m, segment(tp, i * 10, i * 10 + 9))
    assert len(m.list_remote_log_segments(tp)) == 3
    for st in RemotePartitionDeleteState:
        m.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(tp, st, 1, 1))
    assert m.list_remote_log_segments(tp) == []
    assert m.remote_log_segment_metadata(tp, 0, 5) is None
    assert m.remote_partition_delete_metadata(tp).state == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED
    with pytest.raises(InvalidStateTransitionError, match="DELETE_PARTITION_FINISHED -> DELETE_PARTITION_MARKED"):
        m.put_remote_partition_delete_metadata(
            RemotePartitionDeleteMetadata(tp, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 1, 1))
    m.on_stop_partitions([tp])
    with pytest.raises(PartitionNotServedError):
        m.list_remote_log_segments(tp)


def test_copy_started_refused_after_partition_delete(m: RemoteLogMetadataManager) -> None:
    tp = served(m, "deleted")
    m.put_remote_partition_delete_metadata(
        RemotePartitionDeleteMetadata(tp, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 1, 1))
    with pytest.raises(InvalidStateTransitionError, match="the partition is DELETE_PARTITION_MARKED"):
        m.add_remote_log_segment_metadata(copy(tp, 0, 9, 3, 1))
    for st in list(RemotePartitionDeleteState)[1:]:
        m.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(tp, st, 1, 1))
    with pytest.raises(InvalidStateTransitionError, match="the partition is DELETE_PARTITION_FINISHED"):
        m.add_remote_log_segment_metadata(copy(tp, 0, 9, 3, 1))
    assert m.list_remote_log_segments(tp) == [] and m.copy_fence_epoch(tp) is None


def test_partition_delete_states_and_segment_deletes_meanwhile(m: RemoteLogMetadataManager) -> None:
    """MARKED -> STARTED -> FINISHED, each repeatable, none skipped; a purge deletes the partition's segments (their
    updates are still accepted) between MARKED and FINISHED."""
    tp = served(m, "purged")
    assert m.remote_partition_delete_metadata(tp) is None
    md = finished(m, copy(tp, 0, 9, 2))
    m.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(tp, P.DELETE_PARTITION_MARKED, 5, 1))
    m.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(tp, P.DELETE_PARTITION_MARKED, 6, 1))
    with pytest.raises(InvalidStateTransitionError, match="DELETE_PARTITION_MARKED -> DELETE_PARTITION_FINISHED"):
        m.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(tp, P.DELETE_PARTITION_FINISHED, 7, 1))
    got = m.remote_partition_delete_metadata(tp)
    assert (got.state, got.event_timestamp_ms, got.topic_id_partition) == (P.DELETE_PARTITION_MARKED, 6, tp)
    assert m.remote_log_segment_metadata(tp, 2, 5) is not None      # still readable until its segment is deleted
    m.update_remote_log_segment_metadata(update(md, S.DELETE_SEGMENT_STARTED))
    m.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(tp, P.DELETE_PARTITION_STARTED, 8, 1))
    m.update_remote_log_segment_metadata(update(md, S.DELETE_SEGMENT_FINISHED))
    with pytest.raises(InvalidStateTransitionError, match="DELETE_PARTITION_STARTED -> DELETE_PARTITION_MARKED"):
        m.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(tp, P.DELETE_PARTITION_MARKED, 9, 1))
    m.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(tp, P.DELETE_PARTITION_FINISHED, 10, 1))
    m.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(tp, P.DELETE_PARTITION_FINISHED, 11, 1))
    assert m.remote_partition_delete_metadata(tp).state == P.DELETE_PARTITION_FINISHED
    assert m.list_remote_log_segments(tp) == [] and m.copy_fence_epoch(tp) is None


# ------------------------------------------------------------------------------------------- bulk writes
def test_write_many_checks_against_the_state_before_the_call(m: RemoteLogMetadataManager) -> None:
    tp = served(m, "many")
    segs = [segment(tp, i * 10, i * 10 + 9) for i in range(5)]
    done = finished(m, segment(tp, 1000, 1009))
    assert m.write_segment_metadata_many(segs) == [None] * 5          # applied on return
    assert [s.start_offset for s in m.list_remote_log_segments(tp)] == [0, 10, 20, 30, 40, 1000]
    late = segment(tp, 500, 509)
    stray = segment(tp, 2000, 2009)
    errors = m.write_segment_metadata_many(
        [update(s, S.COPY_SEGMENT_FINISHED) for s in segs] + [update(stray, S.COPY_SEGMENT_FINISHED), done, late,
                                                             update(late, S.COPY_SEGMENT_FINISHED)])
    assert errors[:5] == [None] * 5 and errors[-2] is None
    assert isinstance(errors[5], UnknownSegmentError)                 # never added
    assert isinstance(errors[6], InvalidStateTransitionError)         # done: FINISHED, added again
    assert isinstance(errors[8], UnknownSegmentError)                 # added in the same call: unknown before it
    assert [(s.start_offset, s.state) for s in m.list_remote_log_segments(tp)] == \
        [(i * 10, S.COPY_SEGMENT_FINISHED) for i in range(5)] + [(500, S.COPY_SEGMENT_STARTED),
                                                                 (1000, S.COPY_SEGMENT_FINISHED)]
    # two updates of one segment in one call: each checked against the state before, applied in order
    assert m.write_segment_metadata_many([update(segs[0], S.DELETE_SEGMENT_STARTED),
                                          update(segs[0], S.DELETE_SEGMENT_STARTED)]) == [None, None]
    assert m.list_remote_log_segments(tp)[0].state == S.DELETE_SEGMENT_STARTED
    with pytest.raises(ValueError, match="COPY_SEGMENT_STARTED"):   # a bad add is the caller's error: nothing written
        m.write_segment_metadata_many([segment(tp, 3000, 3009),
                                       done.with_update(update(done, S.DELETE_SEGMENT_STARTED))])
    assert 3000 not in {s.start_offset for s in m.list_remote_log_segments(tp)}


# -------------------------------------------------------------------------------------- serving, closing
def test_serving_readiness_and_stopping(make: Factory) -> None:
    m = make()
    tp = TopicIdPartition(uuid.uuid4(), "served", 0)
    assert not m.is_ready(tp)
    for read in (lambda: m.list_remote_log_segments(tp), lambda: m.remote_log_segment_metadata(tp, 0, 0),
                 lambda: m.highest_offset_for_epoch(tp, 0), lambda: m.remote_partition_delete_metadata(tp),
                 lambda: m.remote_log_size(tp), lambda: m.copy_fence_epoch(tp)):
        with pytest.raises(PartitionNotServedError, match="on_partition_leadership_changes"):
            read()
    with pytest.raises(PartitionNotServedError):
        m.wait_ready([tp], timeout_s=600)                             # at once, not after the timeout
    m.on_partition_leadership_changes([], [tp])                       # a follower is served too
    m.wait_ready([tp])
    assert m.is_ready(tp) and m.list_remote_log_segments(tp) == []
    m.on_stop_partitions([tp])
    assert not m.is_ready(tp)
    with pytest.raises(PartitionNotServedError):
        m.list_remote_log_segments(tp)
    with pytest.raises(PartitionNotServedError):
        m.wait_ready([tp], timeout_s=600)


def test_a_closed_manager_refuses_reads_and_writes(make: Factory) -> None:
    m = make()
    tp = TopicIdPartition(uuid.uuid4(), "closed", 0)
    m.on_partition_leadership_changes([tp], [])
    md = segment(tp, 0, 9)
    m.add_remote_log_segment_metadata(md)
    m.close()
    m.close()                                                         # idempotent
    for call in (lambda: m.list_remote_log_segments(tp),
                 lambda: m.add_remote_log_segment_metadata(segment(tp, 10, 19)),
                 lambda: m.update_remote_log_segment_metadata(update(md, S.COPY_SEGMENT_FINISHED)),
                 lambda: m.write_segment_metadata_many([segment(tp, 20, 29)]),
                 lambda: m.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(tp, P(0), 1, 1)),
                 lambda: m.on_partition_leadership_changes([tp], [])):
        with pytest.raises(RemoteLogMetadataError, match="closed"):
            call()
