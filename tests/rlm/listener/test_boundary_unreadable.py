"""ListOffsets through the proxy where the tier cannot be read (:func:`rlm.listener.tier.boundary.
list_offsets_below_log_start`): fast tests of the decision, the tier, the catalog and the authorizer stood in for, the
listener's own :class:`rlm.listener.tier.context.TierContext` counting and logging. The real broker with a copy
corrupted on the filesystem store: ``test_proxy_offsets_unreadable.py``.

The tier holds 0..79 in two copies, 0..39 (records before TS) and 40..79 (its first record at or after TS at 45); the
broker's log start is 50 and it answers every lookup with 50 (its first record): past 45..49, which the tier holds.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from prometheus_client import REGISTRY

from rlm.listener.net.principals import Client
from rlm.listener.protocol.apis import ApiKey
from rlm.listener.protocol.codec import ErrorCode, build
from rlm.listener.tier.boundary import Holes, list_offsets_below_log_start
from rlm.listener.tier.catalog import ServedTopic
from rlm.listener.tier.context import TierContext
from rlm.listener.tier.offsets import EARLIEST
from rlm.tier import TimestampHit, UnreadableCopyError
from rlmm.api import TopicIdPartition
from rsm.errors import CorruptRemoteObjectError

TOPIC = "t"
VERSION = 7
TS = 1_000  # the timestamp looked up
TIER_HIT = 45  # the tier's first record at or after TS, in its second copy
BROKER = 50  # the broker's log start, and its answer to every lookup
STORAGE_ERROR = (ErrorCode.kafka_storage_error, -1)


class _Tier:
    """A tier view (:class:`rlm.tier.TierView`'s methods the decision calls) of two copies, 0..39 and 40..79, whose
    bounds (``bounds_fail``) or time index reads (``lookup_fail``) raise :class:`UnreadableCopyError` as a corrupt
    object makes them; ``lookups`` counts the time index reads."""

    def __init__(self) -> None:
        self.bounds_fail = self.lookup_fail = False
        self.lookups = 0

    def ready(self, tp: TopicIdPartition) -> bool:
        return True

    def partition(self, tp: TopicIdPartition) -> Any:
        if self.bounds_fail:
            raise UnreadableCopyError(tp, None, CorruptRemoteObjectError("producer snapshot", key="k-80-index",
                                                                         position=0))
        segments = (SimpleNamespace(start_offset=0, max_timestamp_ms=TS - 1),
                    SimpleNamespace(start_offset=40, max_timestamp_ms=TS + 10))
        return SimpleNamespace(tp=tp, segments=segments, log_start_offset=0, high_watermark=80,
                               end_offset=lambda isolation: 80, epoch_of=lambda offset: 0)

    def offset_for_timestamp(self, tp: TopicIdPartition, ts: int) -> TimestampHit | None:
        self.lookups += 1
        if self.lookup_fail:
            raise UnreadableCopyError(tp, None, CorruptRemoteObjectError("time index", key="k-40-index", position=0))
        return TimestampHit(TIER_HIT, TS, 0) if ts <= TS else None


def _ctx(tier: _Tier) -> TierContext:
    served = ServedTopic(TOPIC, uuid.uuid4(), (0, 1))
    catalog = SimpleNamespace(by_name=lambda name: served if name == TOPIC else None)
    authorizer = SimpleNamespace(allowed=lambda principal, host, op, names: set(names))
    return TierContext(catalog, tier, authorizer)  # type: ignore[arg-type]


def _answers(ctx: TierContext, asked: dict[int, int], log_start: int = BROKER) -> dict[int, tuple[int, int]]:
    """The proxy's answer, partition -> (error code, offset), to a lookup of ``asked`` (partition -> timestamp or
    EARLIEST) the broker answered with ``log_start`` (its log start, asked after its answer, the same)."""
    req = build(load_request_schema(ApiKey.LIST_OFFSETS, VERSION), {
        "replica_id": -1, "isolation_level": 0, "topics": [{"name": TOPIC, "partitions": [
            {"partition_index": p, "current_leader_epoch": -1, "timestamp": ts} for p, ts in asked.items()]}]})
    resp = build(load_response_schema(ApiKey.LIST_OFFSETS, VERSION), {"throttle_time_ms": 0, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": p, "error_code": 0, "timestamp": -1 if ts == EARLIEST
                                        else TS + 20, "offset": log_start, "leader_epoch": 0}
                                       for p, ts in asked.items()]}]})
    got = list_offsets_below_log_start(ctx, req, resp, Client("User:a", "127.0.0.1"),
                                       {(TOPIC, p): log_start for p, ts in asked.items() if ts != EARLIEST},
                                       Holes())  # confirm_s 0: a range the tier lacks would be a hole at once
    (t,) = got.topics
    return {p.partition_index: (p.error_code, p.offset) for p in t.partitions}


def _unreadable_count() -> float:
    return REGISTRY.get_sample_value("rlm_history_unreadable_copies_total", {"api": "list_offsets"}) or 0.0


def test_a_timestamp_lookup_whose_copy_below_the_log_start_cannot_be_read_is_a_storage_error(
        caplog: pytest.LogCaptureFixture) -> None:
    """The copy 40..79 holds the answer (45), below the broker's log start (50), and its time index cannot be read:
    KAFKA_STORAGE_ERROR, as a Fetch of it, which clients retry; not the broker's 50 (a consumer starting there skips
    45..49). Counted per answer, logged once per copy. Readable again: the tier's 45."""
    tier = _Tier()
    ctx = _ctx(tier)
    tier.lookup_fail = True
    before = _unreadable_count()
    assert _answers(ctx, {0: TS}) == {0: STORAGE_ERROR}
    assert _answers(ctx, {0: TS}) == {0: STORAGE_ERROR}
    assert _unreadable_count() == before + 2
    assert len([r for r in caplog.records if "remote copy cannot be read" in r.getMessage()]) == 1
    tier.lookup_fail = False
    assert _answers(ctx, {0: TS}) == {0: (0, TIER_HIT)}


def test_lookups_whose_tier_bounds_cannot_be_read_are_a_storage_error() -> None:
    """The tier's bounds cannot be read (its newest copy's producer snapshot): EARLIEST and a timestamp lookup are
    KAFKA_STORAGE_ERROR, not the broker's log start 50 (with nothing known of the tier, a range below it would be
    taken for a confirmed hole and the broker's answer passed on). Readable again: the tier's 0 and 45."""
    tier = _Tier()
    ctx = _ctx(tier)
    tier.bounds_fail = True
    before = _unreadable_count()
    assert _answers(ctx, {0: EARLIEST, 1: TS}) == {0: STORAGE_ERROR, 1: STORAGE_ERROR}
    assert _unreadable_count() == before + 2
    tier.bounds_fail = False
    assert _answers(ctx, {0: EARLIEST, 1: TS}) == {0: (0, 0), 1: (0, TIER_HIT)}


def test_a_lookup_the_tier_could_answer_only_past_the_log_start_reads_no_copy() -> None:
    """The broker's log start at 40: the only copy with a record at or after TS + 1 begins there (the copy below, 0..39,
    holds none), so the tier's answer could not lie below it; the broker's answer stands and no time index is read,
    an unreadable one included (a copy the broker still holds does not fail its lookups). TS: the copy 0..39 has no
    record at or after it either: the broker's. A log start of 0: the broker's answers, the tier's bounds not read."""
    tier = _Tier()
    ctx = _ctx(tier)
    tier.lookup_fail = True
    assert _answers(ctx, {0: TS + 1, 1: TS}, log_start=40) == {0: (0, 40), 1: (0, 40)}
    assert tier.lookups == 0
    tier.bounds_fail = True
    assert _answers(ctx, {0: EARLIEST, 1: TS}, log_start=0) == {0: (0, 0), 1: (0, 0)}
    assert tier.lookups == 0
