"""rlm.tier.chain: the remote chain every reader, retention and the copier follow (unit tests, no broker)."""

from __future__ import annotations

import uuid

from rlm.tier import Lineage, chain_gaps, lineage_of, remote_chain, unchained
from rlmm.api import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from rsm.log.checkpoint import EpochEntry

TP = TopicIdPartition(uuid.UUID(int=7), "t", 0)
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


def seg(start: int, end: int, epochs: tuple[tuple[int, int], ...] | None = None, *, broker_epoch: int | None = None,
        ts: int = 0, state: RemoteLogSegmentState = FINISHED, name: str = "") -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        RemoteLogSegmentId(TP, uuid.uuid5(uuid.NAMESPACE_OID, f"{start}-{end}-{epochs}-{broker_epoch}-{ts}-{name}")),
        start, end, 1, 1, ts, end - start + 1, epochs or ((0, start),), state=state,
        broker_leader_epoch=broker_epoch)


def ranges(chain: list[RemoteLogSegmentMetadata]) -> list[tuple[int, int]]:
    return [(m.start_offset, m.end_offset_inclusive) for m in chain]


def test_contiguous_segments_are_the_chain() -> None:
    segs = [seg(100, 199), seg(0, 99), seg(200, 299)]
    assert ranges(remote_chain(segs)) == [(0, 99), (100, 199), (200, 299)]
    assert chain_gaps(remote_chain(segs)) == []


def test_only_finished_segments() -> None:
    segs = [seg(0, 99), seg(100, 199, state=RemoteLogSegmentState.COPY_SEGMENT_STARTED),
            seg(100, 199, state=RemoteLogSegmentState.DELETE_SEGMENT_STARTED, name="x")]
    assert ranges(remote_chain(segs)) == [(0, 99)]


def test_two_copies_of_one_range_serve_once_newest_leaders_copy() -> None:
    old = seg(0, 1934, broker_epoch=1, ts=5)
    new = seg(0, 1934, broker_epoch=2, ts=9)
    chain = remote_chain([old, new, seg(1935, 2000, broker_epoch=2)])
    assert chain[0] is new and ranges(chain) == [(0, 1934), (1935, 2000)]
    delete, keep = unchained([old, new], chain, lineage_of([old, new]))
    assert delete == [(old, "duplicate")] and keep == []


def test_overlapping_copies_with_other_boundaries_keep_every_offset() -> None:
    # The old leader copied [0,1934]; the new leader, whose replica rolled at 1901, copied [0,1900] and [1901,2500].
    b = seg(0, 1934, broker_epoch=1)
    c1, c2 = seg(0, 1900, broker_epoch=2), seg(1901, 2500, broker_epoch=2)
    chain = remote_chain([b, c1, c2])
    assert ranges(chain) == [(0, 1900), (1901, 2500)]
    assert unchained([b, c1, c2], chain, lineage_of([b, c1, c2]))[0] == [(b, "duplicate")]


def test_unclean_election_diverged_segments_are_not_served() -> None:
    # B led epoch 1 and tiered [3000,4031]; C, elected unclean at 3000 under epoch 2, tiered [3000,4027].
    common = seg(0, 2999, ((1, 0),))
    diverged = seg(3000, 4031, ((1, 3000),))
    new = seg(3000, 4027, ((2, 3000),))
    chain = remote_chain([common, diverged, new])
    assert ranges(chain) == [(0, 2999), (3000, 4027)] and chain[1] is new
    lin = lineage_of([common, diverged, new])
    assert not lin.holds(diverged) and lin.holds(new) and lin.holds(common)
    # Not deleted yet: the new lineage covers 3000..4027 only, the diverged copy claims 4028..4031 too.
    assert unchained([common, diverged, new], chain, lin) == ([], [diverged])
    more = seg(4028, 4100, ((2, 4028),))
    chain = remote_chain([common, diverged, new, more])
    assert unchained([common, diverged, new, more], chain, lin)[0] == [(diverged, "diverged-lineage")]


def test_epoch_starting_after_a_higher_one_diverged_whole() -> None:
    # B became leader (epoch 5) at 3100; C, out of sync at 3000, was elected (epoch 6) at 3000.
    lin = lineage_of([seg(0, 2999, ((4, 0),)), seg(3100, 3200, ((5, 3100),)), seg(3000, 3500, ((6, 3000),))])
    assert lin.entries == ((4, 0), (6, 3000))
    assert ranges(remote_chain([seg(0, 2999, ((4, 0),)), seg(3100, 3200, ((5, 3100),)),
                                seg(3000, 3500, ((6, 3000),))])) == [(0, 2999), (3000, 3500)]


def test_gap_between_chain_segments_is_reported() -> None:
    chain = remote_chain([seg(0, 99), seg(150, 199)])
    assert ranges(chain) == [(0, 99), (150, 199)] and chain_gaps(chain) == [(100, 149)]


def test_partial_overlap_outside_the_chain_is_kept_not_deleted() -> None:
    a, b, c = seg(0, 99), seg(150, 199), seg(90, 160, name="c")  # c holds 100..149, which the chain lacks
    chain = remote_chain([a, b, c])
    delete, keep = unchained([a, b, c], chain, lineage_of([a, b, c]))
    assert ranges(chain) == [(0, 99), (150, 199)] and delete == [] and keep == [c]


def test_leader_lineage_below_its_checkpoint_comes_from_the_metadata() -> None:
    # Local retention truncated the checkpoint: its first entry (epoch 3) starts at the log start offset 5000.
    segs = [seg(0, 99, ((1, 0),)), seg(100, 199, ((2, 100),)), seg(200, 4999, ((3, 200),))]
    lin = lineage_of(segs).merged_with_local([EpochEntry(3, 5000), EpochEntry(4, 6000)])
    assert lin.entries == ((1, 0), (2, 100), (3, 200), (4, 6000))
    assert all(lin.holds(m) for m in segs)
    # Nothing of the early epochs in the metadata either: they are not checked.
    lin2 = Lineage(()).merged_with_local([EpochEntry(3, 5000)])
    assert lin2.known_from_epoch == 3 and lin2.holds(seg(0, 99, ((1, 0),)))


def test_leader_lineage_finds_the_diverged_segment_before_the_new_leader_tiers() -> None:
    # Remote: B's [3000,4031] under epoch 1. C leads under epoch 2 from 3000 and has tiered nothing of it yet.
    segs = [seg(0, 2999, ((1, 0),)), seg(3000, 4031, ((1, 3000),))]
    assert ranges(remote_chain(segs)) == [(0, 2999), (3000, 4031)]  # the metadata alone cannot tell yet
    lin = lineage_of(segs).merged_with_local([EpochEntry(1, 0), EpochEntry(2, 3000)])
    assert ranges(remote_chain(segs, lin)) == [(0, 2999)]
    # Not served by the leader's chain, so the copier tiers 3000.. again; deleted only once that covers it.
    assert unchained(segs, remote_chain(segs, lin), lin) == ([], [segs[1]])


def test_a_stale_lineage_never_deletes_the_only_copy() -> None:
    # A broker that lost leadership (its checkpoint ends at epoch 1 from 2170) while the new leader (epoch 2 from
    # 2425) tiered [2340,2424] under epoch 1 and [2425,3694] under epoch 2: a stale view of the lineage.
    segs = [seg(2170, 2339, ((1, 2170),)), seg(2340, 2424, ((1, 2340),)), seg(2425, 3694, ((2, 2425),))]
    stale = lineage_of(segs).merged_with_local([EpochEntry(0, 0), EpochEntry(1, 2100)])
    chain = remote_chain(segs, stale)
    delete, keep = unchained(segs, chain, stale)
    assert delete == [] and {m.start_offset for m in keep} <= {2425}


def test_bound_by_lineage() -> None:
    lin = Lineage(((1, 0), (2, 3), (3, 7)))
    assert lin.bound(4, 1) == 2      # tiered under epoch 1 up to 4; epoch 1 ends at 2 in this lineage
    assert lin.bound(5, 2) == 5
    assert lin.bound(100, 3) == 100
    assert lin.bound(4, None) == 4   # an old watermark without epoch is taken as it is
    assert Lineage(((2, 10), (4, 20))).bound(30, 3) == 19  # epoch 3 is not in it: bounded by epoch 2's end
    assert Lineage(((2, 10),)).bound(30, 1) == 9


def test_end_offset_for_an_epoch_as_kafkas_leader_epoch_cache() -> None:
    """(largest epoch <= asked, start of the next epoch); below every epoch: (asked, first start); no epoch above:
    None (the log's holder answers)."""
    lin = Lineage(((1, 0), (3, 40), (4, 70)))
    assert lin.end_offset_for(1) == (1, 40)
    assert lin.end_offset_for(2) == (1, 40)  # epoch 2 wrote nothing: its floor, 1, ends where 3 begins
    assert lin.end_offset_for(3) == (3, 70)
    assert lin.end_offset_for(0) == (0, 0)
    assert lin.end_offset_for(4) is None and lin.end_offset_for(9) is None
