"""Spark planning over a remote chain with a hole: failOnDataLoss fails the query naming the missing offsets, or
reads around them (driver-side planning only: no Spark session, no store reads for small segments)."""

from __future__ import annotations

import pytest

from rlm.spark.options import SparkSourceError
from rlm.spark.planning import Bounds, _plan_partition
from tests.support.spark import options, seg


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
