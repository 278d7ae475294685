"""TierView's bounds of a partition without a broker: the log start offset, high watermark and last stable offset
over stand-in segments (the remote chain as the reader lists it, each with its producer snapshot or batch headers).
The real broker and store are exercised end to end in ``test_history_kafka.py``."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from rlm.tier import TierView
from rlm.tier import view as tier_module
from rlmm.api import TopicIdPartition
from rsm.log.producer_snapshot import ProducerStateEntry

TP = TopicIdPartition(uuid.uuid4(), "t", 0)


@dataclass
class Seg:
    start_offset: int
    end_offset_inclusive: int
    snapshot: list[ProducerStateEntry] | None = None  # None: copied without one
    headers: list[Any] = field(default_factory=list)  # batch headers, for segments without a snapshot
    remote_log_segment_id: Any = None
    segment_leader_epochs: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        self.remote_log_segment_id = SimpleNamespace(id=uuid.uuid4())
        self.segment_leader_epochs = ((0, self.start_offset),)

    # the storage manager's SegmentHandle, as far as TierView uses it
    def producer_snapshot(self) -> list[ProducerStateEntry] | None:
        return self.snapshot

    def batches(self, _from: int, _to: int, **_kw: Any) -> Any:  # large=: headers only here
        yield from ((h, b"") for h in self.headers)  # a generator, as the storage manager's


CAUGHT_UP = SimpleNamespace(is_ready=lambda _tp: True)  # the reader's metadata manager (TierView.ready)


def entry(pid: int, txn_first: int) -> ProducerStateEntry:
    return ProducerStateEntry(pid, 0, 0, txn_first, 0, 0, -1, txn_first)


def batch(pid: int, base: int, last: int, *, control: bool = False) -> Any:
    return SimpleNamespace(producer_id=pid, base_offset=base, last_offset=last, is_transactional=True,
                           is_control=control)


@pytest.fixture(autouse=True)
def _segments_are_their_own_handles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tier_module, "to_rsm", lambda md: md)


def view(segs: list[Seg]) -> TierView:
    reader = SimpleNamespace(segments=lambda _tp: segs, rsm=SimpleNamespace(open_segment=lambda md: md), rlmm=CAUGHT_UP)
    return TierView(reader, ttl_s=0)  # type: ignore[arg-type]


def bounds(segs: list[Seg]) -> tuple[int, int, int]:
    t = view(segs).partition(TP)
    assert t is not None
    return t.log_start_offset, t.high_watermark, t.last_stable_offset


def test_no_open_transaction_the_lso_is_the_high_watermark() -> None:
    assert bounds([Seg(0, 9, []), Seg(10, 19, [entry(7, -1)])]) == (0, 20, 20)


def test_an_open_transaction_in_the_last_snapshot_bounds_the_lso() -> None:
    assert bounds([Seg(0, 9, []), Seg(10, 19, [entry(7, 12), entry(8, 15), entry(9, -1)])]) == (0, 20, 12)


def test_the_lso_is_never_below_the_tiers_start() -> None:
    """A transaction whose first records remote retention expired (a hanging one): the tier is still served."""
    assert bounds([Seg(30, 39, [entry(7, 12)])]) == (30, 40, 30)


def test_without_a_snapshot_the_batch_headers_after_the_newest_one_decide() -> None:
    segs = [Seg(0, 9, [entry(7, 5)]),                                # 7 open at 5 at offset 9
            Seg(10, 19, None, [batch(7, 10, 12, control=True),         # 7 decided
                               batch(8, 13, 15)]),                      # 8 opens at 13
            Seg(20, 29, None, [batch(9, 20, 21), batch(8, 22, 22, control=True)])]  # 9 opens, 8 decided
    assert bounds(segs) == (0, 30, 20)
    assert bounds(segs[:2]) == (0, 20, 13)
    assert bounds([Seg(0, 9, None, [batch(5, 0, 3), batch(5, 4, 4, control=True)])]) == (0, 10, 10)


def test_nothing_remote() -> None:
    assert view([]).partition(TP) is None


def test_a_growing_tier_without_snapshots_walks_only_the_new_segments() -> None:
    """Offload segments (streaming mode) have no producer snapshot: the open transactions at the tier's end follow
    the batch headers, from the previous answer on when the tier grew, with the same answer as a full walk."""
    segs = [Seg(0, 9, None, [batch(7, 0, 4), batch(7, 5, 5, control=True), batch(8, 6, 9)]),
            Seg(10, 19, None, [batch(8, 10, 12), batch(9, 13, 19)])]
    opened: list[int] = []
    reader = SimpleNamespace(segments=lambda _tp: segs, rlmm=CAUGHT_UP,
                             rsm=SimpleNamespace(open_segment=lambda md: opened.append(md.start_offset) or md))
    tv = TierView(reader, ttl_s=0)  # type: ignore[arg-type]
    assert tv.partition(TP).last_stable_offset == 6  # pid 8 open since 6
    assert sorted(set(opened)) == [0, 10]
    opened.clear()
    segs.append(Seg(20, 29, None, [batch(8, 20, 20, control=True), batch(9, 21, 21, control=True)]))
    assert tv.partition(TP).last_stable_offset == 30  # both closed: the high watermark
    assert sorted(set(opened)) == [20]  # only the new segment was read
    assert bounds(list(segs)) == (0, 30, 30)  # a fresh view's full walk agrees
    segs.append(Seg(30, 39, None, [batch(10, 35, 39)]))
    assert tv.partition(TP).last_stable_offset == 35
    assert bounds(list(segs)) == (0, 40, 35)
