"""OffsetForLeaderEpoch answers as the proxy changes them (:func:`rlm.listener.tier.boundary.epochs_below_log_start`),
for every kind of broker answer, before and after the tier is read, and the order in which the proxy asks its broker:
fast tests of the decision, the tier, the catalog and the broker stood in for (the real broker's answers:
``test_proxy_epochs.py``)."""

from __future__ import annotations

import asyncio
import uuid
from types import SimpleNamespace
from typing import Any

from kio.index import load_request_schema, load_response_schema

from rlm.listener.net.principals import Client
from rlm.listener.protocol.apis import ApiKey
from rlm.listener.protocol.codec import ErrorCode, build, decode_response, encode_response
from rlm.listener.protocol.frame import RequestHeader
from rlm.listener.routing import Route
from rlm.listener.tier.boundary import Holes, epochs_below_log_start
from rlm.listener.tier.catalog import ServedTopic
from rlm.listener.upstream.proxy import Proxy
from rlm.listener.upstream.rewrite import PeerAddresses
from rlm.tier import Lineage
from rlmm.api import TopicIdPartition

TOPIC = "t"
LOG_START = 50  # the broker's
LINEAGE = Lineage(((0, 0), (3, 40), (5, 60)))  # the tier's: E3 ended at 60, E0 at 40
NOT_AVAILABLE = (ErrorCode.offset_not_available, -1, -1)


def _ctx(ready: bool, read: list[TopicIdPartition], lineage: Lineage, high_watermark: int) -> Any:
    served = ServedTopic(TOPIC, uuid.uuid4(), tuple(range(8)))

    def partition(tp: TopicIdPartition) -> Any:
        read.append(tp)
        return SimpleNamespace(lineage=lineage, tp=tp, high_watermark=high_watermark)
    return SimpleNamespace(catalog=SimpleNamespace(by_name=lambda name: served if name == TOPIC else None),
                           tier=SimpleNamespace(ready=lambda tp: ready, partition=partition),
                           allowed=lambda client, op, names: set(names), authorizer=None)


def _answer(ready: bool, asked: dict[int, int], broker: dict[int, tuple[int, int, int]],
            log_starts: dict[int, int], lineage: Lineage = LINEAGE, high_watermark: int = 80,
            holes: Holes | None = None) -> tuple[dict[int, tuple[int, int, int]], list[TopicIdPartition]]:
    """The proxy's answer, partition -> (error code, leader epoch, end offset), to a request for ``asked``
    (partition -> epoch) that the broker answered ``broker``, its log start ``log_starts``, the tier's ``lineage``
    ending at ``high_watermark``; and the partitions whose tier was read."""
    req = build(load_request_schema(23, 4), {"replica_id": -1, "topics": [{"topic": TOPIC, "partitions": [
        {"partition": p, "current_leader_epoch": 6, "leader_epoch": e} for p, e in asked.items()]}]})
    resp = build(load_response_schema(23, 4), {"throttle_time_ms": 0, "topics": [{"topic": TOPIC, "partitions": [
        {"error_code": c, "partition": p, "leader_epoch": e, "end_offset": o} for p, (c, e, o) in broker.items()]}]})
    read: list[TopicIdPartition] = []
    out = epochs_below_log_start(_ctx(ready, read, lineage, high_watermark), req, resp, Client("User:a", "127.0.0.1"),
                                 {(TOPIC, p): s for p, s in log_starts.items()}, holes or Holes())
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
    lineage, the broker's. The tier is read only for the two answers not from the broker's checkpoint."""
    asked = {0: 0, 1: 1, 2: 3, 3: 5}
    broker = {0: (0, 0, LOG_START), 1: (0, 1, LOG_START), 2: (0, 3, 60), 3: (0, 5, 70)}
    got, read = _answer(True, asked, broker, {p: LOG_START for p in range(4)})
    assert got == {0: (0, 0, 40), 1: (0, 0, 40), 2: (0, 3, 60), 3: (0, 5, 70)}
    assert sorted(tp.partition for tp in read) == [0, 1]


def test_an_epoch_the_tier_may_yet_end_is_asked_again_while_its_range_is_pending() -> None:
    """Ready, the tier ending at 45 below the broker's log start (50) with E3 its last epoch: E3, which the broker
    answers with its log start, may have ended anywhere from 45 to 50 (the next epoch's start not tiered yet):
    OFFSET_NOT_AVAILABLE while the range is pending (within ``hole_confirm_ms``), the broker's answer once it is a
    confirmed hole (as Kafka's after its retention). E0 (the lineage's) and E5 (from the broker's checkpoint) keep
    their answers either way."""
    asked, starts = {0: 3, 1: 0, 2: 5}, {p: LOG_START for p in range(3)}
    broker = {0: (0, 3, LOG_START), 1: (0, 0, LOG_START), 2: (0, 5, 70)}
    short = Lineage(((0, 0), (3, 40)))
    got, _read = _answer(True, asked, broker, starts, short, 45, Holes(confirm_s=3600.0))
    assert got == {0: NOT_AVAILABLE, 1: (0, 0, 40), 2: (0, 5, 70)}
    got, _read = _answer(True, asked, broker, starts, short, 45, Holes(confirm_s=0.0))
    assert got == {0: (0, 3, LOG_START), 1: (0, 0, 40), 2: (0, 5, 70)}


def test_an_answer_whose_log_start_the_broker_did_not_give_is_asked_again_once_the_tier_is_read() -> None:
    """Ready, the broker's log start not given for partitions 0-2 (its ListOffsets after the answer failed for them:
    leadership moved between the two): E3 answered with 50 may be the broker's log start (its checkpoint no longer
    holding E3) or an end offset from its checkpoint, and E5's 70 too (the log start may have moved past 70 in
    between); E3 undefined (-1) is no answer either. Each is OFFSET_NOT_AVAILABLE, which clients retry: passed on, the
    client would check its position against 50 where the tier says E3 ended at 60 or 40. A broker's error stands;
    partition 4, whose log start is known, gets the lineage's end (E0 at 40). Only partition 4's tier is read."""
    asked = {0: 3, 1: 5, 2: 3, 3: 3, 4: 0}
    broker = {0: (0, 3, LOG_START), 1: (0, 5, 70), 2: (0, -1, -1), 3: (ErrorCode.not_leader_or_follower.value, -1, -1),
              4: (0, 0, LOG_START)}
    got, read = _answer(True, asked, broker, {3: LOG_START, 4: LOG_START})
    assert got == {0: NOT_AVAILABLE, 1: NOT_AVAILABLE, 2: NOT_AVAILABLE,
                   3: (ErrorCode.not_leader_or_follower, -1, -1), 4: (0, 0, 40)}
    assert [tp.partition for tp in read] == [4]


class _Broker:
    """A stand-in for the proxy's connection to its broker (:class:`rlm.listener.upstream.brokers.Upstream`) whose
    log start moves from ``before`` to ``after`` while it answers the client's OffsetForLeaderEpoch (retention or
    DeleteRecords between the proxy's two requests), answering the epoch with the log start it has then; the proxy's
    ListOffsets of its log start with ``error`` (a partition error: no log start) when given."""

    def __init__(self, header: RequestHeader, epoch: int, before: int, after: int, error: ErrorCode = ErrorCode.none
                 ) -> None:
        self.header, self.epoch, self.log_start, self.after, self.error = header, epoch, before, after, error

    async def ask(self, api_key: int, api_version: int, values: dict[str, Any]) -> Any:
        assert api_key == ApiKey.LIST_OFFSETS
        return build(load_response_schema(api_key, api_version), {"throttle_time_ms": 0, "topics": [
            {"name": t["name"], "partitions": [
                {"partition_index": p["partition_index"], "error_code": self.error.value, "timestamp": -1,
                 "offset": self.log_start if self.error == ErrorCode.none else -1,
                 "leader_epoch": 0 if self.error == ErrorCode.none else -1}
                for p in t["partitions"]]} for t in values["topics"]]})

    async def request(self, frame: bytes) -> bytes:
        self.log_start = self.after
        body = build(load_response_schema(23, self.header.api_version), {"throttle_time_ms": 0, "topics": [
            {"topic": TOPIC, "partitions": [{"error_code": 0, "partition": 0, "leader_epoch": self.epoch,
                                             "end_offset": self.log_start}]}]})
        return encode_response(self.header, body)[4:]


def _route(broker: _Broker, ready: bool) -> tuple[int, int, int]:
    """The proxy's answer (error code, leader epoch, end offset) to a client's OffsetForLeaderEpoch of E3, partition
    0, through :meth:`Proxy.answer` and ``broker``, the tier read (``ready``) or not."""
    req = build(load_request_schema(23, 4), {"replica_id": -1, "topics": [{"topic": TOPIC, "partitions": [
        {"partition": 0, "current_leader_epoch": 6, "leader_epoch": 3}]}]})
    proxy = Proxy(_ctx(ready, [], LINEAGE, 80), PeerAddresses(1, lambda: ("127.0.0.1", 9092), {}), "127.0.0.1:1",
                  timeout_s=1.0, max_response_bytes=1 << 20)

    async def run(fn: Any, *args: Any) -> Any:
        return fn(*args)
    framed = asyncio.run(proxy.answer(Route.SPLIT, broker.header, b"", req, Client("User:a", "127.0.0.1"),
                                      broker, run))  # type: ignore[arg-type]
    (t,) = decode_response(bytes(framed)[4:], broker.header).topics
    (p,) = t.partitions
    return p.error_code, p.leader_epoch, p.end_offset


def test_the_proxy_asks_the_log_start_after_the_brokers_answer() -> None:
    """The broker answers E3 with its log start, 50, having moved it from 40 a moment before: compared with the log
    start asked before the answer (40), 50 looks like an end offset from its checkpoint and would be passed on; asked
    after (50, or more: it only moves up), it is seen for what it is (not ready here: OFFSET_NOT_AVAILABLE)."""
    assert _route(_Broker(RequestHeader(23, 4, 7, "c", True, 0), 3, 40, LOG_START), False) == NOT_AVAILABLE


def test_an_answer_is_asked_again_when_the_proxys_log_start_ask_fails_for_the_partition() -> None:
    """The broker answers E3 with its log start (50), then the proxy's ListOffsets for that log start with
    NOT_LEADER_OR_FOLLOWER (leadership moved between the two), or OFFSET_NOT_AVAILABLE (a new leader for a moment):
    the tier read or not, OFFSET_NOT_AVAILABLE, not the broker's 50 (the tier's lineage ends E3 at 60)."""
    header = RequestHeader(23, 4, 7, "c", True, 0)
    for error in (ErrorCode.not_leader_or_follower, ErrorCode.offset_not_available):
        for ready in (True, False):
            assert _route(_Broker(header, 3, LOG_START, LOG_START, error), ready) == NOT_AVAILABLE, (error, ready)
