"""The segment and partition-delete state machines and the value objects' checks (no broker)."""

from __future__ import annotations

import uuid

import pytest

from rlmm.api import (
    InvalidStateTransitionError,
    RemoteLogMetadataError,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

S = RemoteLogSegmentState
P = RemotePartitionDeleteState
ALLOWED = {
    (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED), (S.COPY_SEGMENT_STARTED, S.DELETE_SEGMENT_STARTED),
    (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED), (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED),
}
TP = TopicIdPartition(uuid.uuid4(), "orders", 7)
SID = RemoteLogSegmentId(TP, uuid.uuid4())


def test_byte_ids_are_kafkas() -> None:
    assert [int(s) for s in S] == [0, 1, 2, 3]
    assert [int(p) for p in P] == [0, 1, 2]


@pytest.mark.parametrize("src", list(S))
@pytest.mark.parametrize("dst", list(S))
def test_segment_transitions(src: S, dst: S) -> None:
    ok = src == dst or (src, dst) in ALLOWED
    assert src.can_transition_to(dst) is ok
    if ok:
        src.check_transition(dst, SID)
    else:
        with pytest.raises(InvalidStateTransitionError) as err:
            src.check_transition(dst, SID)
        msg = str(err.value)
        assert str(SID.id) in msg and src.name in msg and dst.name in msg
        assert isinstance(err.value, RemoteLogMetadataError)


@pytest.mark.parametrize("src", list(P))
@pytest.mark.parametrize("dst", list(P))
def test_partition_delete_transitions(src: P, dst: P) -> None:
    assert src.can_transition_to(dst) is (dst in (src, src + 1))


def _seg(**kw) -> RemoteLogSegmentMetadata:
    args = dict(remote_log_segment_id=SID, start_offset=0, end_offset_inclusive=99, max_timestamp_ms=5, broker_id=1,
                event_timestamp_ms=6, segment_size_bytes=1000, segment_leader_epochs={0: 0, 3: 40})
    args.update(kw)
    return RemoteLogSegmentMetadata(**args)


def test_with_update_applies_and_checks() -> None:
    md = _seg()
    fin = md.with_update(RemoteLogSegmentMetadataUpdate(SID, 9, b"x", S.COPY_SEGMENT_FINISHED, 2))
    assert (fin.state, fin.broker_id, fin.event_timestamp_ms, fin.custom_metadata) == (S.COPY_SEGMENT_FINISHED, 2,
                                                                                       9, b"x")
    assert fin.with_update(RemoteLogSegmentMetadataUpdate(SID, 10, None, S.COPY_SEGMENT_FINISHED, 2)).state == \
        S.COPY_SEGMENT_FINISHED   # a repeated state is an idempotent retry
    with pytest.raises(InvalidStateTransitionError, match="COPY_SEGMENT_FINISHED -> DELETE_SEGMENT_FINISHED"):
        fin.with_update(RemoteLogSegmentMetadataUpdate(SID, 9, None, S.DELETE_SEGMENT_FINISHED, 2))


def test_epoch_end_offsets() -> None:
    md = _seg()
    assert md.segment_leader_epochs == ((0, 0), (3, 40))
    assert (md.epoch_end_offset(0), md.epoch_end_offset(3), md.epoch_end_offset(1)) == (39, 99, None)


@pytest.mark.parametrize("kw", [
    {"segment_leader_epochs": {}}, {"segment_leader_epochs": ((3, 0), (1, 5))},
    {"segment_leader_epochs": {0: 200}}, {"start_offset": 50, "end_offset_inclusive": 10},
])
def test_bad_segments_refused(kw) -> None:
    with pytest.raises(ValueError, match=str(SID.id)):
        _seg(**kw)


def test_update_cannot_be_copy_started() -> None:
    with pytest.raises(ValueError, match="COPY_SEGMENT_STARTED"):
        RemoteLogSegmentMetadataUpdate(SID, 1, None, S.COPY_SEGMENT_STARTED, 1)
