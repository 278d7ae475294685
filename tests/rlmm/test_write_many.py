"""``write_segment_metadata_many``: bulk writes (``rlm recover``) against the real broker: applied on return
(read-your-writes), refusals per record without stopping the others, the same outcome as one write at a time."""

from __future__ import annotations

import uuid

import pytest

from rlmm.api import (
    InvalidStateTransitionError,
    RemoteLogMetadataManager,
    RemoteLogSegmentState,
    TopicIdPartition,
    UnknownSegmentError,
)
from tests.rlmm.helpers import segment, update

pytestmark = [pytest.mark.kafka]

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


@pytest.mark.parametrize("batched", [True, False])
def test_write_many_applies_and_refuses_per_record(rlmm_factory, batched: bool) -> None:
    m = rlmm_factory(f"__rlmm_many_{uuid.uuid4().hex[:8]}", "cache")
    write = m.write_segment_metadata_many if batched else (
        lambda recs: RemoteLogMetadataManager.write_segment_metadata_many(m, recs))
    tps = [TopicIdPartition(uuid.uuid4(), "many", p) for p in range(3)]
    segs = [segment(tp, i * 10, i * 10 + 9) for tp in tps for i in range(40)]
    done = segment(tps[0], 1000, 1009)
    m.add_remote_log_segment_metadata(done)
    m.update_remote_log_segment_metadata(update(done, FINISHED))

    assert write(segs) == [None] * len(segs)  # applied on return: the next batch is checked against them
    stray = segment(tps[1], 2000, 2009)
    errors = write([update(s, FINISHED) for s in segs] + [update(stray, FINISHED), done])  # done: re-added
    assert errors[:len(segs)] == [None] * len(segs)
    assert isinstance(errors[-2], UnknownSegmentError) and isinstance(errors[-1], InvalidStateTransitionError)
    for tp in tps:
        listed = [(s.start_offset, s.state) for s in m.list_remote_log_segments(tp)]
        assert listed == [(i * 10, FINISHED) for i in range(40)] + ([(1000, FINISHED)] if tp == tps[0] else [])
    # a second manager reading the topic sees the same
    other = rlmm_factory(m.topic, "cache-2", serve_all=True)
    other.wait_ready(tps, timeout_s=60)
    assert [s.remote_log_segment_id for s in other.list_remote_log_segments(tps[2])] == \
        [s.remote_log_segment_id for s in segs if s.topic_id_partition == tps[2]]
