"""Hypothesis strategies for the metadata value objects."""

from __future__ import annotations

import uuid

from hypothesis import strategies as st

from rlmm import envelope
from rlmm.api import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

__all__ = ["metadata", "partition_deletes", "segments", "topic_id_partitions", "updates"]

I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
uuids = st.builds(lambda i: uuid.UUID(int=i), st.integers(0, 2**128 - 1))
topic_id_partitions = st.builds(TopicIdPartition, uuids, st.text(min_size=1, max_size=40), st.integers(0, 2**31 - 1))
segment_ids = st.builds(RemoteLogSegmentId, topic_id_partitions, uuids)
custom = st.none() | st.binary(max_size=300) | st.binary(max_size=40).map(lambda b: envelope.MAGIC + b)
broker_leader_epochs = st.none() | st.integers(0, 2**31 - 1)


@st.composite
def segments(draw) -> RemoteLogSegmentMetadata:
    start = draw(st.integers(0, 2**62))
    end = start + draw(st.integers(0, 2**20))
    n = draw(st.integers(1, 5))
    epochs = sorted(draw(st.sets(st.integers(0, 2**31 - 1), min_size=n, max_size=n)))
    offsets = sorted(draw(st.lists(st.integers(start, end), min_size=n - 1, max_size=n - 1)))
    return RemoteLogSegmentMetadata(
        draw(segment_ids), start, end, draw(I64), draw(I32), draw(I64), draw(I32),
        tuple(zip(epochs, [start, *offsets], strict=True)), draw(custom),
        RemoteLogSegmentState.COPY_SEGMENT_STARTED, draw(st.booleans()), draw(broker_leader_epochs))


updates = st.builds(RemoteLogSegmentMetadataUpdate, segment_ids, I64, custom,
                    st.sampled_from(list(RemoteLogSegmentState)[1:]), I32)
partition_deletes = st.builds(RemotePartitionDeleteMetadata, topic_id_partitions,
                              st.sampled_from(list(RemotePartitionDeleteState)), I64, I32)
metadata = segments() | updates | partition_deletes
