"""Spark planning over a remote chain with a hole: failOnDataLoss fails the query naming the missing offsets, or
reads around them (driver-side planning only: no Spark session, no store reads for small segments)."""

from __future__ import annotations

import uuid

import pytest

from rlm.spark.options import SparkSourceError, parse_options
from rlm.spark.planning import Bounds, _plan_partition
from rlmm.api import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition

TP = TopicIdPartition(uuid.UUID(int=3), "orders", 0)


def seg(start: int, end: int) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId(TP, uuid.uuid4()), start, end, 1, 1, 1, 100, ((0, start),),
                                    state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED)


def options(**extra: str):  # noqa: ANN201
    return parse_options({"subscribe": "orders", "kafka.bootstrap.servers": "127.0.0.1:1", "store": "fs",
                          "store.root_path": "/nonexistent", **extra})


def test_a_hole_in_the_chain_fails_the_query_under_fail_on_data_loss() -> None:
    segs = [seg(0, 99), seg(150, 199)]
    with pytest.raises(SparkSourceError, match=r"\(100, 149\)"):
        _plan_partition(options(), Bounds(), None, segs)  # type: ignore[arg-type]


def test_without_fail_on_data_loss_the_query_reads_around_the_hole() -> None:
    segs = [seg(0, 99), seg(150, 199)]
    slices = _plan_partition(options(failOnDataLoss="false"), Bounds(), None, segs)  # type: ignore[arg-type]
    assert [(s.from_offset, s.to_offset_inclusive) for s in slices] == [(0, 99), (150, 199)]


def test_a_hole_outside_the_asked_range_does_not_fail() -> None:
    segs = [seg(0, 99), seg(150, 199)]
    slices = _plan_partition(options(startingOffsets='{"orders": {"0": 150}}'), Bounds(), None,  # type: ignore[arg-type]
                             segs)
    assert [(s.from_offset, s.to_offset_inclusive) for s in slices] == [(150, 199)]
