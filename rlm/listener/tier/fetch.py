"""Fetch answered from the tier: record batches as stored, read_committed with the uploaded aborted transactions.

As Kafka's broker: the request's partitions are a map, one byte budget is spent across them, a topic the client may
not READ is TOPIC_AUTHORIZATION_FAILED, and one unreadable copy is that partition's KAFKA_STORAGE_ERROR only.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from rlm.listener.authz import READ
from rlm.listener.net.principals import Client
from rlm.listener.protocol.codec import ErrorCode, free_gradually
from rlm.listener.tier.context import TierContext
from rlm.tier import Decided, FetchResult, Isolation, UnreadableCopyError

__all__ = ["fetch", "in_request_order", "partition_answer"]

FREE_STEP = 1024


def fetch(ctx: TierContext, req: Any, client: Client, *, budget: int | None = None,
          decided: Mapping[tuple[Any, int], Decided] | None = None) -> tuple[dict[str, Any], int]:
    """The Fetch response and the record bytes it carries (for ``min_bytes``).

    As Kafka's broker: the request's partitions are a map (a partition listed twice is answered once, from its
    last entry), the answer carries at most ``min(max_bytes, fetch_max_bytes)`` record bytes (the first batch
    of the first partition with data even past it, so that a consumer always progresses), and that one budget
    is spent across the partitions in order, each taking at most its ``partition_max_bytes``. A partition
    reached with no budget left gets its bounds (from the tier's metadata) and no records: nothing of it is
    read from the store. ``budget`` (the server's room for queued answers) lowers the cap further. A topic the
    client may not READ is TOPIC_AUTHORIZATION_FAILED for each of its partitions (an unknown topic id stays
    UNKNOWN_TOPIC_ID: there is no name to authorize). ``decided``: (topic name or id, partition) -> what a proxied
    broker says of transactions the tier may not have seen decided (:class:`rlm.tier.Decided`), for read_committed."""
    isolation = Isolation.from_id(getattr(req, "isolation_level", 0))
    topics: dict[Any, tuple[str | None, uuid.UUID | None]] = {}  # topic name (< v13) or id -> (name, id)
    wanted: dict[tuple[Any, int], Any] = {}  # (topic, partition) -> its last entry, in first-seen order
    for t in req.topics:
        name, tid = getattr(t, "topic", None), getattr(t, "topic_id", None)
        key = name if name is not None else tid
        topics.setdefault(key, (name, tid))
        for p in t.partitions:
            wanted[(key, p.partition)] = p
    ok = ctx.allowed(client, READ, {name if name is not None else ctx.name_of(tid)
                                      for name, tid in topics.values()})
    asked = req.max_bytes if req.max_bytes > 0 else ctx.fetch_max_bytes
    left = min(asked, ctx.fetch_max_bytes, ctx.fetch_max_bytes if budget is None else budget)
    total = 0
    parts: dict[Any, list[dict[str, Any]]] = {key: [] for key in topics}
    for (key, index), p in wanted.items():
        name, tid = topics[key]
        if name is not None and name not in ok:  # refused before existence is told
            parts[key].append(partition_answer(index, FetchResult(), ErrorCode.topic_authorization_failed))
            continue
        topic = ctx.catalog.by_name(name) if name is not None else ctx.catalog.by_id(tid)
        if topic is not None and topic.name not in ok:
            parts[key].append(partition_answer(index, FetchResult(), ErrorCode.topic_authorization_failed))
            continue
        if topic is None:
            code = ErrorCode.unknown_topic_id if name is None else ErrorCode.unknown_topic_or_partition
            parts[key].append(partition_answer(index, FetchResult(), code))
            continue
        if index not in topic.partitions:
            parts[key].append(partition_answer(index, FetchResult(), ErrorCode.unknown_topic_or_partition))
            continue
        # No budget left (and data already in the answer): the tier reads nothing (max_bytes 0).
        try:
            res = ctx.tier.fetch(topic.tp(index), p.fetch_offset, max(min(p.partition_max_bytes, left), 0),
                                  at_least_one=total == 0, isolation=isolation,
                                  decided=decided.get((key, index)) if decided else None)
        except UnreadableCopyError as err:  # this partition only: the others are served
            ctx.unreadable(err, "fetch")
            parts[key].append(partition_answer(index, FetchResult(), ErrorCode.kafka_storage_error))
            continue
        if res.gap is not None:
            ctx.gap(topic.tp(index), *res.gap)
        total += res.size
        left -= res.size
        code = {None: ErrorCode.none, "offset_out_of_range": ErrorCode.offset_out_of_range,
                "offset_not_available": ErrorCode.none}[res.error]
        parts[key].append(partition_answer(index, res, code))
    if len(wanted) > FREE_STEP:  # freed a slice at a time, not in one deallocation holding the GIL (ms per 100,000)
        keys = list(wanted)
        wanted.clear()
        free_gradually(keys, FREE_STEP)
    responses = []
    for key, (name, tid) in topics.items():
        topic = ctx.catalog.by_name(name) if name is not None else ctx.catalog.by_id(tid)
        responses.append({"topic": name if name is not None else (topic.name if topic else None),
                          "topic_id": tid if tid is not None else (topic.topic_id if topic else None),
                          "partitions": parts[key]})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0, "responses": responses}, total


def partition_answer(index: int, res: FetchResult, code: ErrorCode) -> dict[str, Any]:
    return {"partition_index": index, "error_code": code, "high_watermark": res.high_watermark,
            "last_stable_offset": res.last_stable_offset, "log_start_offset": res.log_start_offset,
            "aborted_transactions": None if res.aborted is None else [
                {"producer_id": pid, "first_offset": first} for pid, first in res.aborted],
            "preferred_read_replica": -1, "records": res.records}


def in_request_order(values: dict[str, Any], req: Any) -> dict[str, Any]:
    """``values`` (:func:`fetch`'s answer to a Fetch naming the same partitions as ``req``, maybe in another order:
    an answer read ahead, :mod:`rlm.listener.upstream.proxy`) ordered as :func:`fetch` answers ``req``: topics in
    the order ``req`` first names them, each topic's partitions likewise."""
    named = bool(req.topics) and getattr(req.topics[0], "topic", None) is not None  # by name before v13
    topics = {}
    parts = {}
    for t in values["responses"]:
        key = t["topic"] if named else t["topic_id"]
        topics[key] = t
        for p in t["partitions"]:
            parts[(key, p["partition_index"])] = p
    wanted = dict.fromkeys((getattr(t, "topic", None) or t.topic_id, p.partition) for t in req.topics
                           for p in t.partitions)
    ordered: dict[Any, list[dict[str, Any]]] = {}
    for key, index in wanted:
        ordered.setdefault(key, []).append(parts[(key, index)])
    return {**values, "responses": [{**topics[key], "partitions": ps} for key, ps in ordered.items()]}
