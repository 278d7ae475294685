"""The RocksDB cache on its own (no broker): apply semantics, atomic progress, floor lookups, wipes."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest

from rlmm import serde
from rlmm.api import (
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from rlmm.cache import MetadataCache
from rlmm.keys import KeyKind, encode_key
from tests.rlmm.helpers import segment, update

S = RemoteLogSegmentState
TP = TopicIdPartition(uuid.UUID(int=7), "orders", 1)


class Feeder:
    def __init__(self, cache: MetadataCache) -> None:
        self.cache = cache
        self.offset = 0
        self.mp = cache.mp_of(TP)

    def __call__(self, *items, key: bytes = b"k"):
        recs = []
        for it in items:
            recs.append((self.mp, self.offset, key, it if isinstance(it, bytes | None) else serde.encode(it)))
            self.offset += 1
        return self.cache.apply(recs, {})


@pytest.fixture
def cache(tmp_path):
    c = MetadataCache(tmp_path / "db", topic="m", num_partitions=8)
    yield c
    c.close()


def test_lifecycle_lookups_and_progress(cache: MetadataCache) -> None:
    feed = Feeder(cache)
    a = segment(TP, 0, 99, {0: 0, 1: 60})
    b = segment(TP, 100, 199, {1: 100, 4: 180})
    out = feed(a, update(a, S.COPY_SEGMENT_FINISHED), b)
    assert out.applied == 3 and out.skipped == []
    assert cache.progress(feed.mp).next_offset == 3
    assert cache.segment_floor(TP, 0, 59).remote_log_segment_id == a.remote_log_segment_id
    assert cache.segment_floor(TP, 0, 60) is None
    assert cache.segment_floor(TP, 1, 99).start_offset == 0
    assert cache.segment_floor(TP, 1, 150) is None                     # b is not finished yet
    assert cache.highest_offset_for_epoch(TP, 1) == 99
    feed(update(b, S.COPY_SEGMENT_FINISHED))
    assert cache.segment_floor(TP, 1, 150).start_offset == 100
    assert cache.segment_floor(TP, 4, 199).start_offset == 100
    assert cache.segment_floor(TP, 4, 200) is None
    assert (cache.highest_offset_for_epoch(TP, 1), cache.highest_offset_for_epoch(TP, 4)) == (179, 199)
    assert [m.start_offset for m in cache.segments(TP, 1)] == [0, 100]
    assert [m.start_offset for m in cache.segments(TP, 4)] == [100]
    feed(update(b, S.DELETE_SEGMENT_STARTED))
    assert cache.segment_floor(TP, 1, 150) is None and cache.highest_offset_for_epoch(TP, 4) is None
    assert cache.segment(TP, b.remote_log_segment_id.id).state == S.DELETE_SEGMENT_STARTED
    feed(update(b, S.DELETE_SEGMENT_FINISHED))
    assert cache.segment(TP, b.remote_log_segment_id.id) is None
    assert [d.segment_id for d in cache.deleted_segments(feed.mp)] == [b.remote_log_segment_id.id]
    tomb_key = encode_key(KeyKind.SEGMENT, TP.topic_id, TP.partition, b.remote_log_segment_id.id, 3)
    out = feed(None, key=tomb_key)
    assert out.tombstones == 1 and cache.deleted_segments(feed.mp) == []
    assert cache.progress(feed.mp).next_offset == feed.offset


def test_refusals_and_corruption_are_reported_not_applied(cache: MetadataCache) -> None:
    feed = Feeder(cache)
    a = segment(TP, 0, 99)
    feed(a, update(a, S.COPY_SEGMENT_FINISHED))
    before = cache.dump()
    out = feed(a, update(segment(TP, 5, 6), S.COPY_SEGMENT_FINISHED), update(a, S.DELETE_SEGMENT_FINISHED),
               b"\x01\x00\x00garbage", replace(a, state=S.COPY_SEGMENT_FINISHED))
    assert [s.reason for s in out.skipped] == ["refused", "refused", "refused", "corrupt", "refused"]
    assert "COPY_SEGMENT_FINISHED -> COPY_SEGMENT_STARTED" in out.skipped[0].error
    assert "no such segment" in out.skipped[1].error
    assert "COPY_SEGMENT_FINISHED -> DELETE_SEGMENT_FINISHED" in out.skipped[2].error
    assert [s.offset for s in out.skipped] == [2, 3, 4, 5, 6]
    assert cache.dump() == before and cache.progress(feed.mp).next_offset == 7


def test_readd_while_started_replaces(cache: MetadataCache) -> None:
    feed = Feeder(cache)
    a = segment(TP, 0, 99, {2: 0})
    moved = replace(a, start_offset=10, segment_leader_epochs=((3, 10),))
    feed(a, moved, update(moved, S.COPY_SEGMENT_FINISHED))
    assert [m.start_offset for m in cache.segments(TP)] == [10]
    assert cache.segments(TP, 2) == [] and cache.segment_floor(TP, 3, 50).start_offset == 10


def test_partition_delete_finished_and_wipe(cache: MetadataCache) -> None:
    feed = Feeder(cache)
    other = TopicIdPartition(uuid.UUID(int=8), "x", 0)
    segs = [segment(TP, i * 10, i * 10 + 9) for i in range(3)]
    feed(*segs, *[update(s, S.COPY_SEGMENT_FINISHED) for s in segs])
    o = segment(other, 0, 9)
    cache.apply([(cache.mp_of(other), 0, b"k", serde.encode(o))], {})
    out = feed(*[RemotePartitionDeleteMetadata(TP, st, 1, 1) for st in RemotePartitionDeleteState],
               segment(TP, 100, 109))                            # after FINISHED, in the same batch: refused
    assert [(s.offset, s.reason) for s in out.skipped] == [(feed.offset - 1, "refused")]
    assert "COPY_SEGMENT_STARTED refused: the partition is DELETE_PARTITION_FINISHED" in out.skipped[0].error
    assert cache.segments(TP) == []
    assert cache.partition_delete(TP).state == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED
    assert cache.progress(feed.mp).next_offset == feed.offset
    cache.wipe([feed.mp])
    assert cache.segments(TP) == [] and cache.progress(feed.mp) is None
    if cache.mp_of(other) != feed.mp:
        assert len(cache.segments(other)) == 1


def fenced_segment(start: int, end: int, epoch: int | None):
    return replace(segment(TP, start, end, {max(epoch or 0, 0): start}), broker_leader_epoch=epoch)


def test_copy_fencing_by_broker_leader_epoch(cache: MetadataCache) -> None:
    feed = Feeder(cache)
    old = fenced_segment(0, 99, 5)          # a copy started under epoch 5 ...
    new = fenced_segment(0, 99, 6)          # ... and the same range by the next leader, epoch 6
    same = fenced_segment(100, 199, 6)
    legacy = fenced_segment(200, 299, None)
    out = feed(old, new, update(old, S.COPY_SEGMENT_FINISHED), update(new, S.COPY_SEGMENT_FINISHED), same, legacy,
               update(same, S.COPY_SEGMENT_FINISHED), update(legacy, S.COPY_SEGMENT_FINISHED))
    assert [(s.offset, s.reason, s.fenced) for s in out.skipped] == [(2, "refused", True)]
    err = out.skipped[0].error
    assert str(old.remote_log_segment_id.id) in err and "epoch 5" in err and "epoch 6" in err
    assert cache.copy_fence_epoch(TP) == 6
    sid = lambda md: md.remote_log_segment_id.id  # noqa: E731
    assert cache.segment(TP, sid(old)).state == S.COPY_SEGMENT_STARTED          # never served, never counted
    assert cache.segment(TP, sid(old)).broker_leader_epoch == 5
    assert cache.segment(TP, sid(new)).state == S.COPY_SEGMENT_FINISHED         # equal epoch finishes
    assert cache.segment(TP, sid(legacy)).state == S.COPY_SEGMENT_FINISHED      # no epoch: never fenced
    assert cache.segment_floor(TP, 6, 50).remote_log_segment_id == new.remote_log_segment_id
    assert cache.segment_floor(TP, 5, 50) is None
    # a later, higher epoch fences only copies that have not finished; the zombie may still be deleted
    newer = fenced_segment(300, 399, 9)
    out = feed(newer, update(old, S.COPY_SEGMENT_FINISHED), update(same, S.COPY_SEGMENT_FINISHED),
               update(old, S.DELETE_SEGMENT_STARTED), update(old, S.DELETE_SEGMENT_FINISHED))
    assert [(s.offset, s.fenced) for s in out.skipped] == [(feed.offset - 4, True)]
    assert "epoch 5" in out.skipped[0].error and "epoch 9" in out.skipped[0].error
    assert cache.segment(TP, sid(old)) is None and cache.copy_fence_epoch(TP) == 9
    # a lower STARTED does not lower the fence
    feed(fenced_segment(400, 499, 1))
    assert cache.copy_fence_epoch(TP) == 9
    other = TopicIdPartition(TP.topic_id, TP.topic, 2)
    assert cache.copy_fence_epoch(other) is None


def test_copy_fence_dropped_with_the_partition_and_persisted(tmp_path) -> None:
    cache = MetadataCache(tmp_path / "db", topic="m", num_partitions=8)
    feed = Feeder(cache)
    feed(fenced_segment(0, 9, 4))
    cache.close()
    cache = MetadataCache(tmp_path / "db", topic="m", num_partitions=8)
    try:
        feed.cache = cache
        assert cache.copy_fence_epoch(TP) == 4
        assert any(k[:1] == b"\x17" for k in cache.dump())
        feed(*[RemotePartitionDeleteMetadata(TP, st, 1, 1) for st in RemotePartitionDeleteState])
        assert cache.copy_fence_epoch(TP) is None and cache.segments(TP) == []
        assert not any(k[:1] == b"\x17" for k in cache.dump())
    finally:
        cache.close()


@pytest.mark.parametrize("deleting", list(RemotePartitionDeleteState))
def test_copy_started_refused_once_partition_delete_began(cache: MetadataCache, deleting) -> None:
    feed = Feeder(cache)
    a = segment(TP, 0, 9)
    feed(a)
    out = feed(*[RemotePartitionDeleteMetadata(TP, st, 1, 1) for st in RemotePartitionDeleteState][:deleting + 1],
               segment(TP, 10, 19))
    assert [s.reason for s in out.skipped] == ["refused"]
    assert f"COPY_SEGMENT_STARTED refused: the partition is {deleting.name}" in out.skipped[0].error
    assert [m.start_offset for m in cache.segments(TP)] == ([] if deleting == 2 else [0])
    out = feed(segment(TP, 20, 29))                        # in a later batch too
    assert [s.reason for s in out.skipped] == ["refused"]


def test_updates_after_partition_delete_finished_in_the_same_batch(cache: MetadataCache) -> None:
    feed = Feeder(cache)
    a = segment(TP, 0, 9)
    feed(a)
    out = feed(*[RemotePartitionDeleteMetadata(TP, st, 1, 1) for st in RemotePartitionDeleteState],
               update(a, S.COPY_SEGMENT_FINISHED))
    assert [s.reason for s in out.skipped] == ["refused"] and "no such segment" in out.skipped[0].error
    assert cache.segments(TP) == [] and cache.segment_floor(TP, 0, 5) is None


def test_a_second_deleters_records_are_told_apart_from_other_refusals(cache: MetadataCache) -> None:
    """Two deleters of one segment (an old leader's clean-up and the new leader's, a purge): the late one's records
    are refused as "deleted already" (logged at INFO by the manager, not as corruption); other refusals are not."""
    feed = Feeder(cache)
    a, b = segment(TP, 0, 99), segment(TP, 100, 199)
    out = feed(a, update(a, S.COPY_SEGMENT_FINISHED), update(a, S.DELETE_SEGMENT_STARTED),
               update(a, S.DELETE_SEGMENT_FINISHED),
               update(a, S.DELETE_SEGMENT_STARTED), update(a, S.DELETE_SEGMENT_FINISHED))  # a second deleter, late
    assert [(s.offset, s.reason, s.deleted_already) for s in out.skipped] == [(4, "refused", True),
                                                                             (5, "refused", True)]
    out = feed(update(b, S.DELETE_SEGMENT_STARTED),                      # never added: not a late deleter
               b, update(b, S.DELETE_SEGMENT_STARTED), update(b, S.COPY_SEGMENT_FINISHED))
    # The copy's FINISHED after its DELETE_SEGMENT_STARTED: an old leader's copy finishing after the new leader began
    # deleting it (seen in an 8-minute chaos run, session 9): normal, deleted already.
    assert [(s.offset, s.deleted_already) for s in out.skipped] == [(6, False), (9, True)]
    out = feed(b)  # the segment added again while it is deleted: any other refusal is not
    assert [(s.offset, s.deleted_already) for s in out.skipped] == [(10, False)]


def test_a_second_purgers_records_are_deleted_already(cache: MetadataCache) -> None:
    """Every sidecar that served a deleted topic purges it: a late purger's MARKED or STARTED after another's
    STARTED or FINISHED is refused as "deleted already" (INFO), not as corruption."""
    feed = Feeder(cache)
    P = RemotePartitionDeleteState
    out = feed(*[RemotePartitionDeleteMetadata(TP, st, 1, 1) for st in (P.DELETE_PARTITION_MARKED,
                                                                       P.DELETE_PARTITION_STARTED,
                                                                       P.DELETE_PARTITION_MARKED,
                                                                       P.DELETE_PARTITION_FINISHED,
                                                                       P.DELETE_PARTITION_STARTED)])
    assert [(s.offset, s.deleted_already) for s in out.skipped] == [(2, True), (4, True)]
