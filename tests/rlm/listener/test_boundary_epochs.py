"""OffsetForLeaderEpoch answers as the proxy changes them (:func:`rlm.listener.tier.boundary.epochs_below_log_start`),
for every kind of broker answer, before and after the tier is read: a fast test of the decision, the tier and the
catalog stood in for (the real broker's answers: ``test_proxy_epochs.py``)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

from kio.index import load_request_schema, load_response_schema

from rlm.listener.net.principals import Client
from rlm.listener.protocol.codec import ErrorCode, build
from rlm.listener.tier.boundary import epochs_below_log_start
from rlm.listener.tier.catalog import ServedTopic
from rlm.tier import Lineage
from rlmm.api import TopicIdPartition

TOPIC = "t"
LOG_START = 50  # the broker's
LINEAGE = Lineage(((0, 0), (3, 40), (5, 60)))  # the tier's: E3 ended at 60, E0 at 40
NOT_AVAILABLE = (ErrorCode.offset_not_available, -1, -1)


def _ctx(ready: bool, read: list[TopicIdPartition]) -> Any:
    served = ServedTopic(TOPIC, uuid.uuid4(), tuple(range(8)))

    def partition_tier(tp: TopicIdPartition, api: str) -> Any:
        read.append(tp)
        return SimpleNamespace(lineage=LINEAGE)
    return SimpleNamespace(catalog=SimpleNamespace(by_name=lambda name: served if name == TOPIC else None),
                           tier=SimpleNamespace(ready=lambda tp: ready), partition_tier=partition_tier,
                           allowed=lambda client, op, names: set(names))


def _answer(ready: bool, asked: dict[int, int], broker: dict[int, tuple[int, int, int]],
            log_starts: dict[int, int]) -> tuple[dict[int, tuple[int, int, int]], list[TopicIdPartition]]:
    """The proxy's answer, partition -> (error code, leader epoch, end offset), to a request for ``asked``
    (partition -> epoch) that the broker answered ``broker``, its log start ``log_starts``; and the partitions whose
    tier was read."""
    req = build(load_request_schema(23, 4), {"replica_id": -1, "topics": [{"topic": TOPIC, "partitions": [
        {"partition": p, "current_leader_epoch": 6, "leader_epoch": e} for p, e in asked.items()]}]})
    resp = build(load_response_schema(23, 4), {"throttle_time_ms": 0, "topics": [{"topic": TOPIC, "partitions": [
        {"error_code": c, "partition": p, "leader_epoch": e, "end_offset": o} for p, (c, e, o) in broker.items()]}]})
    read: list[TopicIdPartition] = []
    out = epochs_below_log_start(_ctx(ready, read), req, resp, Client("User:a", "127.0.0.1"),
                                 {(TOPIC, p): s for p, s in log_starts.items()})
    (t,) = out.topics
    return {p.partition: (p.error_code, p.leader_epoch, p.end_offset) for p in t.partitions}, read


def test_before_the_tier_is_read_only_answers_from_the_brokers_checkpoint_stand() -> None:
    """Not ready: the broker's end offset at its log start (an epoch its checkpoint no longer holds), below it,
    undefined, or a partition whose log start the broker did not give: OFFSET_NOT_AVAILABLE, and no tier read. Above
    its log start (from its checkpoint), a broker's error, an epoch not asked (-1): the broker's answer."""
    asked = {0: 3, 1: 3, 2: 3, 3: 5, 4: 3, 5: 3, 6: -1}
    broker = {0: (0, 3, LOG_START), 1: (0, 3, LOG_START - 1), 2: (0, -1, -1), 3: (0, 5, 70),
              4: (ErrorCode.not_leader_or_follower.value, -1, -1), 5: (0, 3, LOG_START), 6: (0, -1, -1)}
    got, read = _answer(False, asked, broker, {p: LOG_START for p in range(7) if p != 5})
    assert got == {0: NOT_AVAILABLE, 1: NOT_AVAILABLE, 2: NOT_AVAILABLE, 3: (0, 5, 70),
                   4: (ErrorCode.not_leader_or_follower, -1, -1), 5: NOT_AVAILABLE, 6: (0, -1, -1)}
    assert read == []  # the lineage of a tier not read yet is never used


def test_once_the_tier_is_read_an_epoch_below_the_log_start_is_the_lineages() -> None:
    """Ready: E0 and E1, which the broker answers with its log start, are the tier's: E0 ended at 40 (the largest
    epoch at or below the one asked, E1 never having held an offset). E3, which the broker's checkpoint holds (its
    first entry, its start raised to the log start), ends at 60 in both: the broker's answer; E5, past the tier's
    lineage, the broker's."""
    asked = {0: 0, 1: 1, 2: 3, 3: 5}
    broker = {0: (0, 0, LOG_START), 1: (0, 1, LOG_START), 2: (0, 3, 60), 3: (0, 5, 70)}
    got, read = _answer(True, asked, broker, {p: LOG_START for p in range(4)})
    assert got == {0: (0, 0, 40), 1: (0, 0, 40), 2: (0, 3, 60), 3: (0, 5, 70)}
    assert len(read) == 4
