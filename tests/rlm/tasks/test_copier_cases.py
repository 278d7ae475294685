"""The copier through the cluster events of issue 9, on crafted partition dirs (no broker; the real metadata cache,
storage manager on the filesystem, staging and reader). Each case fails on the copier before the fixes; the same
events on real brokers are in test_cluster_events.py."""

from __future__ import annotations

import shutil
import struct
import uuid

import pytest

from rlm.config import RetentionRule
from rlm.tasks.expiration import expire_partition
from rlm.tier import remote_chain
from rlmm.api import RemoteLogSegmentState, TopicIdPartition
from rsm.log.partition import PartitionDir
from tests.support.batches import BASE_TS, TXN, abort_marker, batch, one_per_batch, write_partition
from tests.support.world import World

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
TEN_AND_ONE = {0: one_per_batch(0, 10, b"v"), 10: one_per_batch(10, 1, b"v")}  # [0,9] rolled, 10 active
TEN_AND_ONE_E5 = {0: one_per_batch(0, 10, b"v", 5), 10: one_per_batch(10, 1, b"v", 5)}  # the same, under epoch 5


def new_tp(topic: str = "t") -> TopicIdPartition:
    return TopicIdPartition(uuid.uuid4(), topic, 0)


def test_straddling_segment_is_copied_from_the_tier_end_once(world: World) -> None:
    tp = new_tp()
    # The old leader (broker 2) tiered [0,99]; this replica rolled at 50 and 150.
    write_partition(world.pdir(2, tp), tp.topic_id, {0: one_per_batch(0, 100, b"v"), 100: one_per_batch(100, 1, b"v")})
    assert world.copier(2, tp).run_once(10**9).copied
    write_partition(world.pdir(1, tp), tp.topic_id,
                    {0: one_per_batch(0, 50, b"v"), 50: one_per_batch(50, 100, b"v"), 150: one_per_batch(150, 5, b"v")},
                    epochs=((0, 0), (1, 150)))
    copier = world.copier(1, tp)
    for _ in range(2):
        copier.run_once(10**9)
    assert world.finished(tp) == [(0, 99), (100, 149)]
    assert [o for o, _v in world.values(tp)] == list(range(150))
    assert copier.staging.staged(tp) == []


def test_leadership_move_during_a_copy_fences_the_old_leaders_copy(world: World) -> None:
    tp = new_tp()
    for broker in (1, 2):
        write_partition(world.pdir(broker, tp), tp.topic_id, TEN_AND_ONE_E5,
                        epochs=((5, 0),) if broker == 1 else ((5, 0), (6, 11)))
    old, new = world.copier(1, tp), world.copier(2, tp)
    epoch_now = {"e": 5}
    inner = world.rsm

    class MoveDuringUpload:
        def __getattr__(self, name: str) -> object:
            return getattr(inner, name)

        def copy_log_segment_data(self, md, data, **kw):  # type: ignore[no-untyped-def]
            epoch_now["e"] = 6  # leadership moves to broker 2 while broker 1 uploads; broker 2 copies at once
            assert [(m.start_offset, m.end_offset_inclusive) for m in new.run_once(11, leader_epoch=6).copied] \
                == [(0, 9)]
            return inner.copy_log_segment_data(md, data)

    old.rsm = MoveDuringUpload()  # type: ignore[assignment]
    result = old.run_once(11, leader_epoch=5, current_leader_epoch=lambda: epoch_now["e"])
    assert result.fenced and result.copied == []
    assert world.finished(tp) == [(0, 9)]
    assert [m.broker_leader_epoch for m in world.rlmm.list_remote_log_segments(tp)] == [6]
    assert [o for o, _ in world.values(tp)] == list(range(10))


def test_metadata_fences_a_finish_that_the_epoch_check_missed(world: World) -> None:
    tp = new_tp()
    for broker in (1, 2):
        write_partition(world.pdir(broker, tp), tp.topic_id, TEN_AND_ONE)
    old, new = world.copier(1, tp), world.copier(2, tp)
    inner = world.rsm

    class MoveDuringUpload:
        def __getattr__(self, name: str) -> object:
            return getattr(inner, name)

        def copy_log_segment_data(self, md, data, **kw):  # type: ignore[no-untyped-def]
            # The new leader's STARTED lands before the old leader's FINISHED; the old leader's check is stale.
            new.copy_segment(new.staging.stage(tp, new.partition_dir, 0, 9), 0,
                             PartitionDir(new.partition_dir).leader_epochs(), leader_epoch=8)
            return inner.copy_log_segment_data(md, data)

    old.rsm = MoveDuringUpload()  # type: ignore[assignment]
    result = old.run_once(11, leader_epoch=7, current_leader_epoch=lambda: 7)
    assert result.fenced
    assert [(m.start_offset, m.broker_leader_epoch) for m in world.rlmm.list_remote_log_segments(tp)] == [(0, 8)]


def test_truncation_after_unclean_election_tiers_the_new_lineage(world: World) -> None:
    tp = new_tp()
    pdir = world.pdir(1, tp)
    # Broker 1 leads epoch 1 and tiers 0..4; offsets 3..4 were never replicated (acks=1).
    write_partition(pdir, tp.topic_id, {0: one_per_batch(0, 3, b"old", 1), 3: one_per_batch(3, 2, b"diverged", 1),
                                        5: one_per_batch(5, 1, b"old", 1)}, epochs=((1, 0),))
    assert [(m.start_offset, m.end_offset_inclusive) for m in world.copier(1, tp).run_once(10**9).copied] \
        == [(0, 2), (3, 4)]
    # Unclean election: another replica leads from 3 (epoch 2); broker 1 truncates, refetches, leads again (3).
    shutil.rmtree(pdir)
    write_partition(pdir, tp.topic_id, {0: one_per_batch(0, 3, b"old", 1), 3: one_per_batch(3, 2, b"NEW", 2),
                                        5: one_per_batch(5, 2, b"NEW", 2), 7: one_per_batch(7, 1, b"NEW", 3)},
                    epochs=((1, 0), (2, 3), (3, 7)))
    copier = world.copier(1, tp)  # a restart: the watermark file says 4, under epoch 1
    assert [(m.start_offset, m.end_offset_inclusive) for m in copier.run_once(10**9).copied] == [(3, 4), (5, 6)]
    assert [v for _o, v in world.values(tp)] == [b"old-0", b"old-1", b"old-2", b"NEW-3", b"NEW-4", b"NEW-5",
                                                   b"NEW-6"]
    # The diverged copy is deleted by the leader's expiration (outside its lineage), nothing else.
    deleted = expire_partition(world.rlmm, copier.deleter, tp, RetentionRule(retention_ms=-1, retention_bytes=-1),
                               local_epochs=PartitionDir(pdir).leader_epochs())
    assert [(m.start_offset, m.end_offset_inclusive, m.segment_leader_epochs) for m in deleted] == [(3, 4, ((1, 3),))]
    assert world.finished(tp) == [(0, 2), (3, 4), (5, 6)]


def test_recreated_topic_never_gets_the_deleted_topics_staged_data(world: World) -> None:
    old = new_tp()
    pdir = world.pdir(1, old)
    write_partition(pdir, old.topic_id, {0: one_per_batch(0, 5, b"OLD"), 5: one_per_batch(5, 5, b"OLD"),
                                         10: one_per_batch(10, 1, b"OLD")})
    c1 = world.copier(1, old)
    assert c1.run_once(0).waiting_for_lso == 2  # staged, not copied (LSO 0)
    shutil.rmtree(pdir)  # deleted on the cluster; re-created with the same name
    new = TopicIdPartition(uuid.uuid4(), "t", 0)
    write_partition(pdir, new.topic_id, {0: one_per_batch(0, 5, b"NEW"), 5: one_per_batch(5, 5, b"NEW"),
                                         10: one_per_batch(10, 1, b"NEW")})
    world.copier(1, new).run_once(11)
    assert {v[:3] for _o, v in world.values(new)} == {b"NEW"}
    assert len(world.values(new)) == 10


def test_read_committed_drops_an_abort_past_a_future_timestamp(world: World) -> None:
    tp = new_tp()
    pdir = world.pdir(1, tp)
    pid = 7
    write_partition(pdir, tp.topic_id, {
        0: [batch(0, [b"aborted-%d" % i for i in range(5)], attrs=TXN, producer_id=pid), batch(5, [b"ok-5"])],
        6: [batch(6, [b"ok-6"], ts=BASE_TS + 3_600_000)],  # another producer's clock is an hour ahead
        7: [batch(7, [b"ok-7"], ts=BASE_TS + 1), abort_marker(8, pid)],
        9: [batch(9, [b"ok-9"])],
    })
    # The abort's transaction index entry: version, producer id, first, last offset, last stable offset.
    (pdir / f"{7:020d}.txnindex").write_bytes(struct.pack(">hqqqq", 0, pid, 0, 8, 9))
    world.copier(1, tp).run_once(10**9)
    assert [v for _o, v in world.values(tp, isolation="read_committed")] == [b"ok-5", b"ok-6", b"ok-7"]


def test_duplicate_copies_serve_once_and_the_extra_one_is_deleted(world: World) -> None:
    tp = new_tp()
    for broker in (1, 2):
        write_partition(world.pdir(broker, tp), tp.topic_id, TEN_AND_ONE)
    # Two leaders without epochs (records written before fencing): both finish the same range.
    world.copier(1, tp, watermark=False).run_once(11)
    c2 = world.copier(2, tp, watermark=False)
    c2.staging.stage(tp, c2.partition_dir, 0, 9)
    c2.copy_segment(c2.staging.staged(tp)[0], 0, PartitionDir(c2.partition_dir).leader_epochs())
    assert world.finished(tp) == [(0, 9), (0, 9)]
    assert [o for o, _ in world.values(tp)] == list(range(10))
    assert len(remote_chain(world.rlmm.list_remote_log_segments(tp))) == 1
    deleted = expire_partition(world.rlmm, c2.deleter, tp, RetentionRule(retention_ms=-1, retention_bytes=-1))
    assert len(deleted) == 1 and world.finished(tp) == [(0, 9)]
    assert [o for o, _ in world.values(tp)] == list(range(10))


def test_a_lower_epoch_copy_left_started_is_cleaned_up_at_once(world: World) -> None:
    tp = new_tp()
    write_partition(world.pdir(2, tp), tp.topic_id, TEN_AND_ONE_E5, epochs=((5, 0), (6, 11)))
    # Broker 1, leader under epoch 5, was killed mid-copy: its STARTED copy is young (not abandoned by age).
    zombie = world.copier(1, tp)
    write_partition(world.pdir(1, tp), tp.topic_id, TEN_AND_ONE_E5, epochs=((5, 0),))
    staged = zombie.staging.stage(tp, zombie.partition_dir, 0, 9)

    class Killed(Exception):
        pass

    class KilledDuringUpload:
        def __getattr__(self, name: str) -> object:
            return getattr(world.rsm, name)

        def copy_log_segment_data(self, md, data, **kw):  # type: ignore[no-untyped-def]
            world.rsm.copy_log_segment_data(md, data)
            raise Killed

    zombie.rsm = KilledDuringUpload()  # type: ignore[assignment]
    zombie.deleter.delete = lambda md, reason: (_ for _ in ()).throw(Killed())  # type: ignore[method-assign]
    # (the kill takes the copier's own clean-up with it)
    with pytest.raises(Killed):
        zombie.copy_segment(staged, 0, PartitionDir(zombie.partition_dir).leader_epochs(), leader_epoch=5)
    assert [m.state for m in world.rlmm.list_remote_log_segments(tp)] == [RemoteLogSegmentState.COPY_SEGMENT_STARTED]
    # The new leader (epoch 6) deletes it at once: it can never finish (the metadata fences epoch 5 now).
    result = world.copier(2, tp).run_once(11, leader_epoch=6)
    assert result.cleaned_up == 1
    assert [(m.broker_leader_epoch, m.state) for m in world.rlmm.list_remote_log_segments(tp)] == [(6, FINISHED)]
    assert [o for o, _ in world.values(tp)] == list(range(10))


def test_a_failure_after_the_upload_leaves_no_started_copy(world: World) -> None:
    tp = new_tp()
    write_partition(world.pdir(1, tp), tp.topic_id, TEN_AND_ONE)

    def broken() -> int:
        raise RuntimeError("the broker did not answer")

    with pytest.raises(RuntimeError):
        world.copier(1, tp).run_once(11, leader_epoch=0, current_leader_epoch=broken)
    assert world.rlmm.list_remote_log_segments(tp) == []
    assert not [p for p in (world.tmp / "remote").rglob("*") if p.is_file() and ".tmp" not in p.parts]


def _leadership(staging, run=None):  # type: ignore[no-untyped-def]
    """A leadership registry over ``staging`` alone (no cluster, no scheduler, no topic paused); ``run``: the copy
    run of its copy jobs."""
    from rlm.tasks.leadership import Leadership

    settings = type("S", (), {"topics": type("T", (), {"is_paused": lambda self, t: False})()})()
    scheduler = type("NoScheduler", (), {"remove_job": lambda self, job_id: None})()
    return Leadership(settings, scheduler, rlmm=None, rsm=None, staging=staging, deleter=None,  # type: ignore[arg-type]
                      run=run or (lambda led: None))


def test_staging_of_partitions_not_led_is_released(world: World) -> None:
    from rlm.sidecar import Sidecar

    led, other = new_tp(), new_tp("u")
    for tp in (led, other):
        write_partition(world.pdir(1, tp), tp.topic_id, TEN_AND_ONE)
    staging = world.copier(1, led).staging
    for tp in (led, other):
        staging.stage(tp, world.pdir(1, tp), 0, 9)
    sidecar = Sidecar.__new__(Sidecar)  # only its staging: a sidecar killed while leading ``other`` left this
    sidecar.leadership = _leadership(staging)
    assert sidecar.release_unled_staging({led}) == 1
    assert [s.tp for s in staging.staged()] == [led]


def _staged_leadership(world: World, tp: TopicIdPartition):  # type: ignore[no-untyped-def]
    """A leadership registry of only broker 1's staging (:func:`_leadership`), with its segment [0, 9] of ``tp``
    staged; and broker 1's copier of ``tp``."""
    write_partition(world.pdir(1, tp), tp.topic_id, TEN_AND_ONE)
    copier = world.copier(1, tp)
    copier.staging.stage(tp, world.pdir(1, tp), 0, 9)
    return _leadership(copier.staging), copier


def test_staging_of_a_partition_whose_run_outlives_its_leadership_is_left_to_the_run(world: World) -> None:
    """Leadership moved while a copy run went on: discovery leaves its staging to the run (which releases it when
    it ends) instead of pulling the files from under its copy; once the run has ended, discovery releases it."""
    from rlm.tasks.leadership import Led

    tp = new_tp()
    leadership, copier = _staged_leadership(world, tp)
    leadership._led = {(tp.topic, tp.partition): Led(tp, world.pdir(1, tp), copier, None)}
    run = leadership._led[(tp.topic, tp.partition)].running
    run.acquire()  # the copy run is going
    leadership.stop_leading((tp.topic, tp.partition))
    assert leadership.release_unled_staging(set()) == 0
    assert [s.tp for s in copier.staging.staged()] == [tp]
    run.release()  # the run ended (the real one releases the staging itself: run_copy)
    assert leadership.release_unled_staging(set()) == 1 and leadership.still_running() == {}


def test_a_run_that_starts_after_leadership_was_lost_does_nothing(world: World) -> None:
    """A copy run scheduled while leading but started after the sidecar saw leadership move (it waited for the
    metadata cache or the ListOffsets round): it neither cleans up, stages nor reports a gap. Seen in a chaos run:
    such a stale run on a follower whose log started far above the leader's tiered end logged tens of thousands
    of offsets as "deleted by the broker before they could be staged" (and counted them in rlm_segment_gaps),
    all of them remote, and staged segments the next discovery round released again."""
    import threading

    tp = new_tp()
    write_partition(world.pdir(2, tp), tp.topic_id, {0: one_per_batch(0, 100, b"v"), 100: one_per_batch(100, 1, b"v")})
    assert world.copier(2, tp).run_once(10**9).copied  # the leader tiered [0, 99]
    write_partition(world.pdir(1, tp), tp.topic_id, {150: one_per_batch(150, 50, b"v"),
                                                     200: one_per_batch(200, 1, b"v")})  # a follower from 150 on
    stop = threading.Event()
    stop.set()
    follower = world.copier(1, tp)
    result = follower.run_once(10**9, stop)
    assert result.gaps == [] and not result.copied and result.cleaned_up == 0
    assert follower.staging.staged(tp) == []
    assert world.finished(tp) == [(0, 99)]


def test_leadership_lost_while_staging_reports_no_gap(world: World) -> None:
    """The race behind the chaos run's false gap: leadership moves while a run stages, the sidecar releases the
    staging of the partition it no longer leads, and the run then finds what it had staged missing. No gap is
    reported once the run's stop is set; a run still leading reports a real gap as before."""
    import threading

    tp = new_tp()
    write_partition(world.pdir(2, tp), tp.topic_id, {0: one_per_batch(0, 100, b"v"), 100: one_per_batch(100, 1, b"v")})
    assert world.copier(2, tp).run_once(10**9).copied  # [0, 99] tiered
    segments = {100: one_per_batch(100, 50, b"v"), 150: one_per_batch(150, 50, b"v"), 200: one_per_batch(200, 1, b"v")}
    write_partition(world.pdir(1, tp), tp.topic_id, segments)
    copier = world.copier(1, tp)
    copier.staging.stage(tp, world.pdir(1, tp), 100, 149)  # staged while leading, then retention took the file
    (world.pdir(1, tp) / "00000000000000000100.log").unlink()
    stop = threading.Event()
    real_stage = copier.staging.stage

    def stage_and_lose_leadership(*args, **kwargs):  # type: ignore[no-untyped-def]
        stop.set()  # leadership moves now; discovery releases what is staged for the partition
        copier.staging.release_partition(tp)
        return real_stage(*args, **kwargs)

    copier.staging.stage = stage_and_lose_leadership  # type: ignore[method-assign]
    _staged, gaps = copier.stage_new(99, stop)
    assert gaps == []
    copier.staging.stage = real_stage  # type: ignore[method-assign]
    copier.staging.release_partition(tp)
    assert copier.stage_new(99)[1] == [(100, 149)]  # leading: a real gap is still reported


def test_a_run_that_ends_after_leadership_came_back_keeps_the_staging(world: World) -> None:
    """Leadership lost and regained while a run went on: when the stale run ends it does not release the staging
    the new run copies from (it did, and the new run's copies would then fail on missing staged files)."""
    from rlm.tasks.leadership import Led

    tp = new_tp()
    leadership, copier = _staged_leadership(world, tp)
    key = (tp.topic, tp.partition)
    old = Led(tp, world.pdir(1, tp), copier, None)
    leadership._led = {key: old}

    def run_that_loses_and_regains_leadership(led: Led) -> None:
        old.stop.set()
        leadership._led[key] = Led(tp, world.pdir(1, tp), world.copier(1, tp), None)  # led again: a new run

    leadership._run = run_that_loses_and_regains_leadership
    leadership.run_copy(old)
    assert [s.tp for s in copier.staging.staged()] == [tp]
    leadership._led.pop(key)  # not led any more: the stale run's end releases it
    old2 = Led(tp, world.pdir(1, tp), copier, None)
    leadership._run = lambda led: led.stop.set()
    leadership.run_copy(old2)
    assert copier.staging.staged() == []


def test_a_clean_up_raced_by_another_sidecar_goes_on(world: World) -> None:
    """Two sidecars clean up the same fenced copy (seen in the chaos run: 'copy task failed ... no such segment'):
    the one that comes second finds it deleted already, says so at INFO and goes on, instead of failing its run."""
    from dataclasses import replace

    from tests.rlmm.helpers import segment

    tp = new_tp()
    for broker in (2, 3):
        write_partition(world.pdir(broker, tp), tp.topic_id, TEN_AND_ONE_E5, epochs=((5, 0), (6, 11)))
    zombie = replace(segment(tp, 0, 9, {5: 0}, broker_id=1), broker_leader_epoch=5)
    world.rlmm.add_remote_log_segment_metadata(zombie)
    stale = world.rlmm.list_remote_log_segments(tp)
    first, second = world.copier(2, tp), world.copier(3, tp)
    assert first.clean_up_unfinished(leader_epoch=6) == 1
    assert world.rlmm.list_remote_log_segments(tp) == []

    class Stale:  # the second sidecar listed the segments before the first one's clean-up landed
        def __getattr__(self, name: str) -> object:
            return getattr(world.rlmm, name)

        def list_remote_log_segments(self, tp, epoch=None):  # type: ignore[no-untyped-def]
            return stale

    second.rlmm = Stale()  # type: ignore[assignment]
    second.deleter.rlmm = second.rlmm
    assert second.clean_up_unfinished(leader_epoch=6) == 0
