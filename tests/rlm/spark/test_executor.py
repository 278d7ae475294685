"""Input partitions carry the storage manager's segment metadata itself (:func:`rlm.tier.segments.to_rsm`), and survive
cloudpickle, which is how Spark ships them to the executors (no Spark session, no store)."""

from __future__ import annotations

import pickle
from dataclasses import astuple

from pyspark import cloudpickle

from rlm.spark.planning import Bounds, _plan_partition
from rlm.tier import to_rsm
from rsm.api import RemoteSegmentMetadata
from tests.support.spark import options, seg


def test_input_partitions_carry_the_segment_metadata_and_pickle() -> None:
    segs = [seg(0, 99), seg(100, 199)]
    slices = _plan_partition(options(), Bounds(), None, segs)  # type: ignore[arg-type]
    assert len(slices) == 2
    for s, md in zip(slices, segs, strict=True):
        assert isinstance(s.segment, RemoteSegmentMetadata)
        assert astuple(s.segment) == astuple(to_rsm(md))
        for dumps, loads in ((cloudpickle.dumps, cloudpickle.loads), (pickle.dumps, pickle.loads)):
            back = loads(dumps(s))
            assert back == s and astuple(back.segment) == astuple(to_rsm(md))
