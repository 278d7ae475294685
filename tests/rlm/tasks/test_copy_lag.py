"""The copy lag gauges (``rlm_copy_lag_segments``, ``rlm_copy_lag_bytes``) after a run: what is left, not what the
run started with. A copier that caught up sleeps until its directory changes (:mod:`rlm.watch`), so the value its
last run left is what the gauges show meanwhile: before the fix they kept the count of the run's start (1 after the
usual run that copied the one segment just rolled) while everything was remote."""

from __future__ import annotations

import uuid

from prometheus_client import REGISTRY

from rlmm.api import TopicIdPartition
from tests.support.batches import one_per_batch, write_partition
from tests.support.world import World


def lag(tp: TopicIdPartition) -> tuple[float | None, float | None]:
    labels = {"topic": tp.topic, "partition": str(tp.partition)}
    return (REGISTRY.get_sample_value("rlm_copy_lag_segments", labels),
            REGISTRY.get_sample_value("rlm_copy_lag_bytes", labels))


def five_rolled(world: World) -> TopicIdPartition:
    """Five rolled segments of ten records ([0,9] ... [40,49]) and an active one at 50, under a topic of its own."""
    tp = TopicIdPartition(uuid.uuid4(), f"lag-{uuid.uuid4().hex[:8]}", 0)
    segments = {base: one_per_batch(base, 10, b"v", 5) for base in range(0, 50, 10)}  # under epoch 5, as checkpointed
    write_partition(world.pdir(1, tp), tp.topic_id, {**segments, 50: one_per_batch(50, 1, b"v", 5)}, epochs=((5, 0),))
    return tp


def test_a_run_that_copies_everything_leaves_no_lag(world: World) -> None:
    tp = five_rolled(world)
    copier = world.copier(1, tp)
    result = copier.run_once(51, leader_epoch=5)
    assert len(result.copied) == 5
    assert copier.caught_up()
    assert lag(tp) == (0, 0)


def test_segments_waiting_for_the_last_stable_offset_stay_lag(world: World) -> None:
    tp = five_rolled(world)
    copier = world.copier(1, tp)
    result = copier.run_once(31, leader_epoch=5)  # [30,39] and [40,49] end at or above the LSO
    assert [m.end_offset_inclusive for m in result.copied] == [9, 19, 29]
    segments, n_bytes = lag(tp)
    assert segments == 2
    left = copier.staging.staged(tp)
    assert [s.base_offset for s in left] == [30, 40]
    assert n_bytes == sum(s.log_path.stat().st_size for s in left)
    copier.run_once(51, leader_epoch=5)
    assert lag(tp) == (0, 0)
