"""Where the tier meets the broker: what a proxying listener answers from the tier in the broker's answers.

The broker's answer is the frame of reference (its high watermark, last stable offset, leaders and errors); the tier
fills in only what the broker no longer holds, so the crossing is exact, driven by the client's own position:

- **Fetch**: a partition the broker answers OFFSET_OUT_OF_RANGE for, whose fetch offset is below the broker's log start
  offset (asked with ListOffsets: an error answer carries no bounds), is answered from the tier
  (:func:`rlm.listener.tier.fetch.fetch`, the listener's one tier read, with its READ check for the client's principal
  and its byte budget: what the broker's answer left of ``max_bytes``). Its records are whole batches from the one
  holding the fetch offset on, as stored; the client's next fetch offset follows the last record it got, below the
  broker's log start (the tier again) or not (the broker): no offset is skipped or served twice. The partition keeps the
  broker's high watermark and last stable offset; its log start offset is the tier's. Where the tier has nothing at the
  fetch offset (below the tier's start, or a hole between the tier's end and the broker's log start) the broker's
  OFFSET_OUT_OF_RANGE stands.
- **ListOffsets EARLIEST**: the tier's log start offset (and its leader epoch) when it is below the broker's answer
  and the client's principal may DESCRIBE the topic.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from rlm.listener.authz import DESCRIBE
from rlm.listener.net.principals import Client
from rlm.listener.protocol.codec import ErrorCode, build
from rlm.listener.tier.context import TierContext
from rlm.listener.tier.fetch import fetch
from rlm.listener.tier.offsets import EARLIEST
from rlm.tier import UnreadableCopyError

__all__ = ["BrokerBounds", "earliest_below_log_start", "fetch_below_log_start", "out_of_range"]


@dataclass(frozen=True, slots=True)
class BrokerBounds:
    """A partition's bounds in the broker's log, asked with ListOffsets: a Fetch answered OFFSET_OUT_OF_RANGE
    carries none (Kafka sets them to -1 on a partition error)."""

    log_start_offset: int
    high_watermark: int
    last_stable_offset: int


def _key(topic: Any) -> Any:
    """A Fetch topic's key in requests and answers alike: its name before v13, its id from v13."""
    name = getattr(topic, "topic", None)
    return name if name is not None else topic.topic_id


def out_of_range(ctx: TierContext, req: Any, resp: Any) -> dict[tuple[Any, int], str]:
    """The partitions of the broker's Fetch answer ``resp`` to ``req`` that the tier may hold: answered
    OFFSET_OUT_OF_RANGE, of a topic the tier serves. (topic key, partition) -> topic name."""
    if resp.error_code != ErrorCode.none:
        return {}
    asked = {(_key(t), p.partition) for t in req.topics for p in t.partitions}
    out: dict[tuple[Any, int], str] = {}
    for t in resp.responses:
        key = _key(t)
        served = ctx.catalog.by_name(key) if isinstance(key, str) else ctx.catalog.by_id(key)
        if served is None:
            continue
        for p in t.partitions:
            if p.error_code == ErrorCode.offset_out_of_range and (key, p.partition_index) in asked:
                out[(key, p.partition_index)] = served.name
    return out


def fetch_below_log_start(ctx: TierContext, req: Any, resp: Any, client: Client,
                          bounds: dict[tuple[Any, int], BrokerBounds]) -> Any:
    """``resp`` (the broker's Fetch answer to ``req``, kio entities) with the partitions below the broker's log start
    (``bounds``: those :func:`out_of_range` named, as the broker gives them now) answered from the tier where it
    holds them (see the module's docstring)."""
    asked = {(_key(t), p.partition): p for t in req.topics for p in t.partitions}
    below = {k for k, b in bounds.items() if 0 <= asked[k].fetch_offset < b.log_start_offset}
    if not below:
        return resp
    used = sum(len(p.records or b"") for t in resp.responses for p in t.partitions)
    sub = dataclasses.replace(req, topics=tuple(
        dataclasses.replace(t, partitions=tuple(p for p in t.partitions if (_key(t), p.partition) in below))
        for t in req.topics if any((_key(t), p.partition) in below for p in t.partitions)))
    cap = req.max_bytes if req.max_bytes > 0 else ctx.fetch_max_bytes
    values, _size = fetch(ctx, sub, client, budget=max(cap - used, 0))
    tier: dict[tuple[Any, int], dict[str, Any]] = {}
    named = isinstance(next(iter(below))[0], str)  # the request's version names topics (before v13)
    for t in values["responses"]:
        key = t["topic"] if named else t["topic_id"]
        for p in t["partitions"]:
            tier[(key, p["partition_index"])] = p
    topics = []
    for t in resp.responses:
        key = _key(t)
        parts = []
        for p in t.partitions:
            got = tier.get((key, p.partition_index))
            if got is None or _nothing_there(got, asked[(key, p.partition_index)].fetch_offset):
                parts.append(p)
                continue
            b = bounds[(key, p.partition_index)]
            parts.append(build(type(p), {
                **{f.name: getattr(p, f.name) for f in dataclasses.fields(p)},
                "error_code": got["error_code"], "records": bytes(got["records"]),
                "aborted_transactions": got["aborted_transactions"], "preferred_read_replica": -1,
                "high_watermark": b.high_watermark, "last_stable_offset": b.last_stable_offset,
                "log_start_offset": min(got["log_start_offset"], b.log_start_offset)
                if got["log_start_offset"] >= 0 else b.log_start_offset}))
        topics.append(dataclasses.replace(t, partitions=tuple(parts)))
    return dataclasses.replace(resp, responses=tuple(topics))


def _nothing_there(got: dict[str, Any], fetch_offset: int) -> bool:
    """The tier has nothing at ``fetch_offset``: out of its range, or at or past its end (a hole below the broker's
    log start); the broker's OFFSET_OUT_OF_RANGE stands."""
    if got["error_code"] == ErrorCode.offset_out_of_range:
        return True
    return got["error_code"] == ErrorCode.none and not got["records"] and fetch_offset >= got["high_watermark"]


def earliest_below_log_start(ctx: TierContext, req: Any, resp: Any, client: Client) -> Any:
    """``resp`` (the broker's ListOffsets answer to ``req``) with EARLIEST answered by the tier's log start offset
    where it is below the broker's and the client's principal may DESCRIBE the topic."""
    asked = {(t.name, p.partition_index) for t in req.topics for p in t.partitions if p.timestamp == EARLIEST}
    if not asked:
        return resp
    ok = ctx.allowed(client, DESCRIBE, {t.name for t in resp.topics if ctx.catalog.by_name(t.name) is not None})
    topics = []
    for t in resp.topics:
        served = ctx.catalog.by_name(t.name) if t.name in ok else None
        parts = []
        for p in t.partitions:
            if served is not None and (t.name, p.partition_index) in asked and p.error_code == ErrorCode.none \
                    and p.partition_index in served.partitions:
                try:
                    pt = ctx.tier.partition(served.tp(p.partition_index))
                except UnreadableCopyError as err:  # the broker's answer stands
                    ctx.unreadable(err, "list_offsets")
                    pt = None
                if pt is not None and pt.log_start_offset < p.offset:
                    p = dataclasses.replace(p, offset=pt.log_start_offset,
                                            leader_epoch=pt.epoch_of(pt.log_start_offset))
            parts.append(p)
        topics.append(dataclasses.replace(t, partitions=tuple(parts)))
    return dataclasses.replace(resp, topics=tuple(topics))
