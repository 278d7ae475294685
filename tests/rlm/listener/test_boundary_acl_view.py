"""ListOffsets and OffsetForLeaderEpoch of a topic the listener's ACL view refuses DESCRIBE while the broker answers
the principal all the same (:func:`rlm.listener.tier.boundary._served_partitions_changed`): fast tests, the tier, the
catalog and the view stood in for. Kafka's OffsetForLeaderEpoch takes CLUSTER_ACTION on the cluster instead of
DESCRIBE on the topic (``KafkaApis.handleOffsetForLeaderEpochRequest``), so the broker answers a principal the view
refuses with its log start as the end of an epoch its checkpoint no longer holds; on the real broker, a grant the view
has not fetched yet: ``test_proxy_acl_view.py``."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema

from rlm.listener.net.principals import Client
from rlm.listener.protocol.apis import ApiKey
from rlm.listener.protocol.codec import ErrorCode, build
from rlm.listener.tier.boundary import Holes, epochs_below_log_start, list_offsets_below_log_start
from rlm.listener.tier.catalog import ServedTopic
from rlm.listener.tier.offsets import EARLIEST, LATEST
from rlm.tier import Lineage, TimestampHit
from rlmm.api import TopicIdPartition

TOPIC = "t"
LOG_START = 50  # the broker's
LINEAGE = Lineage(((0, 0), (3, 40), (5, 60)))  # the tier's, offsets 0..79: E0 ended at 40
TS, TIER_HIT = 1_000, 45  # a timestamp and the tier's first record at or after it
CLIENT = Client("User:late", "127.0.0.1")


def _ctx(may_describe: bool) -> Any:
    served = ServedTopic(TOPIC, uuid.uuid4(), tuple(range(8)))

    def partition(tp: TopicIdPartition) -> Any:
        return SimpleNamespace(tp=tp, lineage=LINEAGE, log_start_offset=0, high_watermark=80, latest_epoch=5,
                               end_offset=lambda iso: 80, epoch_of=lambda offset: 0,
                               segments=(SimpleNamespace(start_offset=0, max_timestamp_ms=TS),))

    def offset_for_timestamp(tp: TopicIdPartition, ts: int) -> TimestampHit | None:
        return TimestampHit(TIER_HIT, TS, 0) if ts <= TS else None
    return SimpleNamespace(catalog=SimpleNamespace(by_name=lambda name: served if name == TOPIC else None),
                           tier=SimpleNamespace(ready=lambda tp: True, partition=partition,
                                                offset_for_timestamp=offset_for_timestamp),
                           allowed=lambda client, op, names: set(names) if may_describe else set())


def _epochs(may_describe: bool) -> dict[int, tuple[int, int, int]]:
    """Partition -> (error code, leader epoch, end offset) through the proxy: E0 (0), which the broker answers with
    its log start; E5 (1), from its checkpoint; E0 of a partition the broker refuses (2)."""
    asked = {0: 0, 1: 5, 2: 0}
    broker = {0: (0, 0, LOG_START), 1: (0, 5, 70), 2: (ErrorCode.not_leader_or_follower.value, -1, -1)}
    req = build(load_request_schema(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4), {"replica_id": -1, "topics": [
        {"topic": TOPIC, "partitions": [{"partition": p, "current_leader_epoch": 6, "leader_epoch": e}
                                        for p, e in asked.items()]}]})
    resp = build(load_response_schema(ApiKey.OFFSET_FOR_LEADER_EPOCH, 4), {"throttle_time_ms": 0, "topics": [
        {"topic": TOPIC, "partitions": [{"error_code": c, "partition": p, "leader_epoch": e, "end_offset": o}
                                        for p, (c, e, o) in broker.items()]}]})
    out = epochs_below_log_start(_ctx(may_describe), req, resp, CLIENT, {(TOPIC, p): LOG_START for p in asked},
                                 Holes())
    (t,) = out.topics
    return {p.partition: (p.error_code, p.leader_epoch, p.end_offset) for p in t.partitions}


def _offsets(may_describe: bool) -> dict[int, tuple[int, int]]:
    """Partition -> (error code, offset) through the proxy: EARLIEST (0), the broker's log start; TS (1), whose first
    record the broker answers at its log start (the tier's is below it); LATEST (2); a timestamp past the tier's
    records (3), the broker's answer."""
    asked = {0: EARLIEST, 1: TS, 2: LATEST, 3: TS + 1}
    broker = {0: LOG_START, 1: LOG_START, 2: 120, 3: 110}
    req = build(load_request_schema(ApiKey.LIST_OFFSETS, 7), {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": p, "current_leader_epoch": -1, "timestamp": ts}
                                       for p, ts in asked.items()]}]})
    resp = build(load_response_schema(ApiKey.LIST_OFFSETS, 7), {"throttle_time_ms": 0, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": p, "error_code": 0, "timestamp": -1, "offset": o,
                                        "leader_epoch": 5} for p, o in broker.items()]}]})
    out = list_offsets_below_log_start(_ctx(may_describe), req, resp, CLIENT,
                                       {(TOPIC, p): LOG_START for p in asked if asked[p] >= 0}, Holes())
    (t,) = out.topics
    return {p.partition_index: (p.error_code, p.offset) for p in t.partitions}


@pytest.mark.parametrize("may_describe", [True, False])
def test_an_epoch_the_tier_would_answer_is_asked_again_when_the_view_refuses_describe(may_describe: bool) -> None:
    """Allowed: E0 is the tier's (ended at 40). Refused by the view (the broker answered, by CLUSTER_ACTION or an ACL
    the view has not fetched): OFFSET_NOT_AVAILABLE, neither the broker's log start (a truncation below it hidden)
    nor the tier's answer. E5 and the broker's error stand either way: the tier would not change them."""
    e0 = (0, 0, 40) if may_describe else (ErrorCode.offset_not_available, -1, -1)
    assert _epochs(may_describe) == {0: e0, 1: (0, 5, 70), 2: (ErrorCode.not_leader_or_follower, -1, -1)}


@pytest.mark.parametrize("may_describe", [True, False])
def test_an_offset_the_tier_would_answer_is_asked_again_when_the_view_refuses_describe(may_describe: bool) -> None:
    """Allowed: EARLIEST is the tier's 0, TS its 45. Refused by the view: both OFFSET_NOT_AVAILABLE (the broker's log
    start would start a consumer past what the tier holds). LATEST and the lookup past the tier: the broker's."""
    got = _offsets(may_describe)
    if may_describe:
        assert got == {0: (0, 0), 1: (0, TIER_HIT), 2: (0, 120), 3: (0, 110)}
    else:
        assert got == {0: (ErrorCode.offset_not_available, -1), 1: (ErrorCode.offset_not_available, -1),
                       2: (0, 120), 3: (0, 110)}
