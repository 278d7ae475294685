"""ListOffsets answers as the proxy changes them (:func:`rlm.listener.tier.boundary.list_offsets_below_log_start`)
and the order in which the proxy asks its broker: fast tests of the decision, the tier, the catalog and the broker
stood in for (the real broker's answers: ``test_proxy.py``, ``test_proxy_offsets.py``)."""

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
from rlm.listener.tier.boundary import Holes, list_offsets_below_log_start
from rlm.listener.tier.catalog import ServedTopic
from rlm.listener.tier.offsets import EARLIEST, LATEST, MAX_TIMESTAMP
from rlm.listener.upstream.proxy import Proxy
from rlm.listener.upstream.rewrite import PeerAddresses
from rlm.tier import TimestampHit
from rlmm.api import TopicIdPartition

TOPIC = "t"
VERSION = 7  # ListOffsets as a client asks it (MAX_TIMESTAMP from v7)
TS = 1_000  # the timestamp looked up
TIER_HIT = 45  # the tier's first record at or after TS (the tier holds 0..79)
TIER_END = 80
BROKER_END, BROKER_MAX_TS = 120, (110, 9_000)  # the broker's LATEST and MAX_TIMESTAMP (offset, timestamp)
NOT_AVAILABLE = (ErrorCode.offset_not_available, -1)


def _ctx(ready: bool = True, end: int = TIER_END) -> Any:
    """A tier holding offsets 0..``end`` - 1 of every partition, its first record at or after TS at 45 (its last
    before TS + 1)."""
    served = ServedTopic(TOPIC, uuid.uuid4(), tuple(range(8)))

    def partition(tp: TopicIdPartition) -> Any:
        return SimpleNamespace(tp=tp, log_start_offset=0, high_watermark=end, end_offset=lambda iso: end,
                               epoch_of=lambda offset: 0, segments=(SimpleNamespace(start_offset=0,
                                                                                    max_timestamp_ms=TS),))

    def offset_for_timestamp(tp: TopicIdPartition, ts: int) -> TimestampHit | None:
        return TimestampHit(TIER_HIT, TS, 0) if ts <= TS else None
    tier = SimpleNamespace(ready=lambda tp: ready, partition=partition, offset_for_timestamp=offset_for_timestamp)
    return SimpleNamespace(catalog=SimpleNamespace(by_name=lambda name: served if name == TOPIC else None),
                           tier=tier, partition_tier=lambda tp, api: partition(tp),
                           allowed=lambda client, op, names: set(names), authorizer=None)


def _request(asked: dict[int, int]) -> Any:
    return build(load_request_schema(ApiKey.LIST_OFFSETS, VERSION), {
        "replica_id": -1, "isolation_level": 0, "topics": [{"name": TOPIC, "partitions": [
            {"partition_index": p, "current_leader_epoch": -1, "timestamp": ts} for p, ts in asked.items()]}]})


def _answers(resp: Any) -> dict[int, tuple[int, int]]:
    (t,) = resp.topics
    return {p.partition_index: (p.error_code, p.offset) for p in t.partitions}


class _Broker:
    """A stand-in for the proxy's connection to its broker (:class:`rlm.listener.upstream.brokers.Upstream`) whose
    log start moves from ``before`` to ``after`` while it answers the client's ListOffsets (retention or
    DeleteRecords between the proxy's two requests), answering with the log it has then: a timestamp below its
    records, and EARLIEST, with its log start; LATEST and MAX_TIMESTAMP from its end."""

    def __init__(self, header: RequestHeader, before: int, after: int, error: ErrorCode = ErrorCode.none) -> None:
        self.header, self.log_start, self.after, self.error = header, before, after, error
        self.asked: list[str] = []  # the proxy's requests, in order: "log start", "client's"

    async def ask(self, api_key: int, api_version: int, values: dict[str, Any]) -> Any:
        """The proxy's ListOffsets of the log start: answered, or each partition with ``error``."""
        assert api_key == ApiKey.LIST_OFFSETS
        assert all(p["timestamp"] == EARLIEST for t in values["topics"] for p in t["partitions"])
        self.asked.append("log start")
        ok = self.error == ErrorCode.none
        return build(load_response_schema(api_key, api_version), {"throttle_time_ms": 0, "topics": [
            {"name": t["name"], "partitions": [{"partition_index": p["partition_index"], "error_code": self.error.value,
                                                "timestamp": -1, "offset": self.log_start if ok else -1,
                                                "leader_epoch": 0 if ok else -1}
                                               for p in t["partitions"]]} for t in values["topics"]]})

    async def request(self, frame: bytes) -> bytes:
        self.asked.append("client's")
        self.log_start = self.after
        return encode_response(self.header, self.body)[4:]

    def answering(self, asked: dict[int, int]) -> None:
        """What the broker answers to ``asked`` (partition -> timestamp), with the log start it has then."""
        def one(p: int, ts: int) -> dict[str, Any]:
            if ts == LATEST:
                offset, stamp = BROKER_END, -1
            elif ts == MAX_TIMESTAMP:
                offset, stamp = BROKER_MAX_TS
            else:  # EARLIEST, or a timestamp older than its first record: its log start
                offset, stamp = self.after, (-1 if ts == EARLIEST else TS + 1)
            return {"partition_index": p, "error_code": 0, "timestamp": stamp, "offset": offset, "leader_epoch": 0}
        self.body = build(load_response_schema(ApiKey.LIST_OFFSETS, VERSION), {"throttle_time_ms": 0, "topics": [
            {"name": TOPIC, "partitions": [one(p, ts) for p, ts in asked.items()]}]})


def _route(asked: dict[int, int], before: int, after: int, error: ErrorCode = ErrorCode.none
           ) -> tuple[dict[int, tuple[int, int]], list[str]]:
    """The proxy's answer, partition -> (error code, offset), to a client's ListOffsets of ``asked`` (partition ->
    timestamp) through :meth:`Proxy.answer`, its broker's log start moving from ``before`` to ``after`` while it
    answers (its ask of the log start answered with ``error`` when given); and the order of the proxy's requests
    to the broker."""
    header = RequestHeader(ApiKey.LIST_OFFSETS, VERSION, 7, "c", True, 0)
    broker = _Broker(header, before, after, error)
    broker.answering(asked)
    proxy = Proxy(_ctx(), PeerAddresses(1, lambda: ("127.0.0.1", 9092), {}), "127.0.0.1:1", timeout_s=1.0,
                  max_response_bytes=1 << 20)

    async def run(fn: Any, *args: Any) -> Any:
        return fn(*args)
    framed = asyncio.run(proxy.answer(Route.SPLIT, header, b"", _request(asked), Client("User:a", "127.0.0.1"),
                                      broker, run))  # type: ignore[arg-type]
    return _answers(decode_response(bytes(framed)[4:], header)), broker.asked


def test_a_timestamp_lookup_the_broker_answers_past_records_it_just_deleted_is_the_tiers() -> None:
    """The broker answers a timestamp whose first record (45) the tier holds with its log start, 50, having moved it
    from 40 a moment before (the records 40..49 deleted): compared with the log start asked before the answer (40),
    50 looks like an answer from the broker's own records and would be passed on, the consumer skipping 45..49;
    asked after (50, or more: it only moves up), 45 lies below it and the answer is the tier's. EARLIEST is the
    tier's (its own answer is the broker's log start, whenever it moved), LATEST and MAX_TIMESTAMP the broker's."""
    asked = {0: TS, 1: EARLIEST, 2: LATEST, 3: MAX_TIMESTAMP}
    got, order = _route(asked, 40, 50)
    assert got == {0: (0, TIER_HIT), 1: (0, 0), 2: (0, BROKER_END), 3: (0, BROKER_MAX_TS[0])}
    assert order == ["client's", "log start"]


def test_a_timestamp_lookup_is_asked_again_when_the_proxys_log_start_ask_fails_for_the_partition() -> None:
    """The broker answers the timestamp with its log start (50), then the proxy's ListOffsets of that log start with
    NOT_LEADER_OR_FOLLOWER (leadership moved between the two) or OFFSET_NOT_AVAILABLE: whether the first record at or
    after the timestamp lies below it is not known (the tier's is at 45): OFFSET_NOT_AVAILABLE, not the broker's 50.
    EARLIEST (its answer the broker's log start itself) and LATEST are not changed by it."""
    for error in (ErrorCode.not_leader_or_follower, ErrorCode.offset_not_available):
        got, order = _route({0: TS, 1: EARLIEST, 2: LATEST}, 40, 50, error)
        assert got == {0: NOT_AVAILABLE, 1: (0, 0), 2: (0, BROKER_END)}, error
        assert order == ["client's", "log start"]


def test_no_log_start_is_asked_for_lookups_the_tier_does_not_answer() -> None:
    """EARLIEST, LATEST and MAX_TIMESTAMP alone: the broker's answer is all the proxy needs (EARLIEST's is its log
    start), no ListOffsets of its own is sent."""
    got, order = _route({1: EARLIEST, 2: LATEST, 3: MAX_TIMESTAMP}, 40, 50)
    assert got == {1: (0, 0), 2: (0, BROKER_END), 3: (0, BROKER_MAX_TS[0])}
    assert order == ["client's"]


def _decide(asked: dict[int, int], log_starts: dict[int, int], ready: bool = True, end: int = TIER_END,
            holes: Holes | None = None) -> dict[int, tuple[int, int]]:
    """:func:`list_offsets_below_log_start`'s answer to ``asked`` (partition -> timestamp), the broker having answered
    each with 50 (its log start: past the tier's hit), its log start as asked ``log_starts``, the tier ending at
    ``end``."""
    resp = build(load_response_schema(ApiKey.LIST_OFFSETS, VERSION), {"throttle_time_ms": 0, "topics": [
        {"name": TOPIC, "partitions": [{"partition_index": p, "error_code": 0, "timestamp": TS + 1, "offset": 50,
                                        "leader_epoch": 0} for p in asked]}]})
    return _answers(list_offsets_below_log_start(_ctx(ready, end), _request(asked), resp,
                                                 Client("User:a", "127.0.0.1"),
                                                 {(TOPIC, p): s for p, s in log_starts.items()}, holes or Holes()))


def test_a_timestamp_lookup_whose_log_start_is_not_known_is_asked_again() -> None:
    """The broker answered the client's lookup but not the proxy's log-start ask after it (leadership moved between
    the two): whether the tier holds the answer below the log start is not known, and the broker's answer (50) may be
    past records it deleted: OFFSET_NOT_AVAILABLE, which clients retry. Its log start known (50): the tier's 45;
    known and at or below the tier's hit (45): the broker's answer."""
    assert _decide({0: TS, 1: TS, 2: TS}, {1: 50, 2: 45}) == {0: NOT_AVAILABLE, 1: (0, TIER_HIT), 2: (0, 50)}


def test_before_the_tier_is_read_a_timestamp_lookup_is_asked_again() -> None:
    """Not ready: OFFSET_NOT_AVAILABLE, its log start known or not (the tier's answer not known yet)."""
    assert _decide({0: TS, 1: TS}, {1: 50}, ready=False) == {0: NOT_AVAILABLE, 1: NOT_AVAILABLE}


def test_a_timestamp_lookup_the_tier_has_no_answer_to_waits_while_the_range_below_the_log_start_is_pending() -> None:
    """The tier ends at 48 below the broker's log start (50). A timestamp whose first record the tier holds (45): the
    tier's. One past every record it holds: its first record may be in 48..49, not tiered yet (staged, or met for
    less than ``hole_confirm_ms``): OFFSET_NOT_AVAILABLE while the range is pending, not the broker's 50 (a consumer
    starting there would skip 48 and 49 once tiered); the broker's once the range is a confirmed hole (as Kafka's
    after its retention). The tier reaching the log start (ending at 80): the broker's, no wait."""
    asked, starts = {0: TS, 1: TS + 1}, {0: 50, 1: 50}
    assert _decide(asked, starts, end=48, holes=Holes(confirm_s=3600.0)) == {0: (0, TIER_HIT), 1: NOT_AVAILABLE}
    assert _decide(asked, starts, end=48, holes=Holes(confirm_s=0.0)) == {0: (0, TIER_HIT), 1: (0, 50)}
    assert _decide(asked, starts, end=TIER_END, holes=Holes(confirm_s=3600.0)) == {0: (0, TIER_HIT), 1: (0, 50)}
