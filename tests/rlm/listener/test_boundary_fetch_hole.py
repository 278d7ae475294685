"""A Fetch below the broker's log start that the tier has nothing for (:func:`rlm.listener.tier.boundary.
fetch_below_log_start`): whether it is a hole is decided from the tier the Fetch read, not from a second read of
it. Fast tests: the tier, the catalog and the authorizer stood in for, the listener's own
:class:`rlm.listener.tier.context.TierContext`, :class:`rlm.listener.tier.boundary.Holes` with the test's clock.

The broker's log start is 50 and it answers a Fetch at 45 OFFSET_OUT_OF_RANGE. The tier read by the Fetch ends at 40
(its copy 0..39): 40..49 is a range the tier does not hold yet, pending for ``hole_confirm_ms`` (OFFSET_NOT_AVAILABLE,
the client fetches again), then a hole (the broker's OFFSET_OUT_OF_RANGE). A second read of the tier's bounds after
the Fetch's own (what ``_hole_at`` did before) could tell another story: a copy 40..79 read in between (the tier
view's cache of 0.5 s run out, or refreshed), or the tier unreadable for a moment (taken for a tier with nothing
remote); both let the broker's OFFSET_OUT_OF_RANGE through while 40..49 was pending, and a consumer reset by
``auto.offset.reset`` from 45.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

from kio.index import load_request_schema, load_response_schema

from rlm.listener.net.principals import Client
from rlm.listener.protocol.codec import ErrorCode, build
from rlm.listener.tier.boundary import BrokerBounds, Holes, fetch_below_log_start
from rlm.listener.tier.catalog import ServedTopic
from rlm.listener.tier.context import TierContext
from rlm.tier import FetchResult, PartitionTier, UnreadableCopyError
from rlmm.api import TopicIdPartition
from rsm.errors import CorruptRemoteObjectError

TOPIC = "t"
VERSION = 12  # topics by name
LOG_START = 50  # the broker's
FETCHED = 45  # the client's fetch offset, below it
CONFIRM_S = 30.0  # hole_confirm_ms's default
SERVED = ServedTopic(TOPIC, uuid.uuid4(), (0,))
TP = SERVED.tp(0)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Tier:
    """A tier view (:class:`rlm.tier.TierView`'s methods the Fetch calls) whose successive reads of the partition's
    bounds give ``reads`` in turn (a high watermark: the chain 0..hwm-1; None: nothing remote; an exception: raised),
    the last one from then on. :meth:`fetch` reads them first, as the tier view's does."""

    def __init__(self, *reads: int | None | Exception, ready: bool = True) -> None:
        self.reads = list(reads)
        self.known = ready

    def ready(self, tp: TopicIdPartition) -> bool:
        return self.known

    def partition(self, tp: TopicIdPartition) -> Any:
        got = self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]
        if isinstance(got, Exception):
            raise got
        if got is None:
            return None
        return SimpleNamespace(tp=tp, log_start_offset=0, high_watermark=got, last_stable_offset=got)

    def fetch(self, tp: TopicIdPartition, offset: int, max_bytes: int, **_kw: Any) -> FetchResult:
        tier: PartitionTier | None = self.partition(tp)
        if tier is None:
            return FetchResult(error="offset_not_available")
        out = FetchResult(high_watermark=tier.high_watermark, last_stable_offset=tier.last_stable_offset,
                          log_start_offset=tier.log_start_offset)
        if offset < tier.log_start_offset or offset > tier.high_watermark:
            out.error = "offset_out_of_range"
        return out  # at or past its end: nothing (no records here anyway)


def _unreadable(tp: TopicIdPartition) -> UnreadableCopyError:
    return UnreadableCopyError(tp, None, CorruptRemoteObjectError("producer snapshot", key="k-40-index", position=0))


def _answer(tier: _Tier, holes: Holes) -> int:
    """The proxy's error code for the partition of a Fetch at ``FETCHED`` the broker answered OFFSET_OUT_OF_RANGE."""
    return _partition(tier, holes).error_code


def _partition(tier: _Tier, holes: Holes, unbounded: dict[tuple[Any, int], ErrorCode] | None = None) -> Any:
    """The proxy's partition answer to a Fetch at ``FETCHED`` the broker answered OFFSET_OUT_OF_RANGE (its records
    empty, as Kafka's ``MemoryRecords.EMPTY``), its bounds known, or not and ``unbounded`` given."""
    catalog = SimpleNamespace(by_name=lambda name: SERVED if name == TOPIC else None, by_id=lambda tid: None)
    authorizer = SimpleNamespace(allowed=lambda principal, host, op, names: set(names))
    ctx = TierContext(catalog, tier, authorizer, parallel_reads=False)  # type: ignore[arg-type]
    req = build(load_request_schema(1, VERSION), {
        "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "topics": [{"topic": TOPIC, "partitions": [
            {"partition": 0, "current_leader_epoch": -1, "fetch_offset": FETCHED, "last_fetched_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}], "forgotten_topics_data": [], "rack_id": ""})
    resp = build(load_response_schema(1, VERSION), {
        "throttle_time_ms": 0, "error_code": 0, "session_id": 0, "responses": [{"topic": TOPIC, "partitions": [
            {"partition_index": 0, "error_code": ErrorCode.offset_out_of_range.value, "high_watermark": -1,
             "last_stable_offset": -1, "log_start_offset": -1, "aborted_transactions": None,
             "preferred_read_replica": -1, "records": b""}]}]})
    bounds = {} if unbounded else {(TOPIC, 0): BrokerBounds(LOG_START, 100, 100)}
    got = fetch_below_log_start(ctx, req, resp, Client("User:a", "127.0.0.1"), bounds, holes, unbounded)
    ((p,),) = [t.partitions for t in got.responses]
    return p


def test_a_range_pending_stays_pending_when_a_second_read_of_the_tier_fails() -> None:
    """The partition had nothing remote, 0..49 met for longer than the grace; then its first copy, 0..39, is read:
    40..49 is a new range, pending (OFFSET_NOT_AVAILABLE), whatever a read of the tier after the Fetch's own gives.
    Before, that second read failing took the tier for empty, 0..49, and its grace had run: the broker's
    OFFSET_OUT_OF_RANGE."""
    clock = _Clock()
    holes = Holes(CONFIRM_S, clock=clock)
    assert _answer(_Tier(None), holes) == ErrorCode.offset_not_available  # 0..49 pending
    clock.now += CONFIRM_S + 1
    assert _answer(_Tier(40, _unreadable(TP)), holes) == ErrorCode.offset_not_available  # 40..49 met now
    assert _answer(_Tier(40), holes) == ErrorCode.offset_not_available
    clock.now += CONFIRM_S + 1
    assert _answer(_Tier(40), holes) == ErrorCode.offset_out_of_range  # a hole once its own grace ran


def test_a_range_pending_stays_pending_when_a_second_read_sees_more_of_the_tier() -> None:
    """The Fetch read the tier ending at 40 (nothing at 45); a read of the tier after it sees the copy 40..79 read
    in between: 40..49 is pending (OFFSET_NOT_AVAILABLE; the client's next Fetch at 45 gets the tier's records).
    Before, the second read's end (80, past 45) made it no hole at all: the broker's OFFSET_OUT_OF_RANGE."""
    holes = Holes(CONFIRM_S, clock=_Clock())
    assert _answer(_Tier(40, 80), holes) == ErrorCode.offset_not_available


def test_an_error_the_proxy_puts_in_place_of_out_of_range_carries_empty_records_not_null() -> None:
    """OFFSET_NOT_AVAILABLE for a range pending, for a tier not read yet, and the broker's own ListOffsets error where
    it gave no bounds: each partition's records are empty (length 0), as Kafka's for an error
    (``MemoryRecords.EMPTY``), not null (length -1): librdkafka fails the whole Fetch answer on a null
    ("Protocol parse failure for Fetch ... invalid MessageSetSize -1"), the other partitions' records with it."""
    pending = _partition(_Tier(40), Holes(CONFIRM_S, clock=_Clock()))
    unknown = _partition(_Tier(None, ready=False), Holes(CONFIRM_S, clock=_Clock()))
    unbounded = _partition(_Tier(40), Holes(), {(TOPIC, 0): ErrorCode.not_leader_or_follower})
    assert [(p.error_code, p.records) for p in (pending, unknown, unbounded)] == [
        (ErrorCode.offset_not_available, b""), (ErrorCode.offset_not_available, b""),
        (ErrorCode.not_leader_or_follower, b"")]
