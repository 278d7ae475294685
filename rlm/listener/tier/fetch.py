"""Fetch answered from the tier: record batches as stored, read_committed with the uploaded aborted transactions.

As Kafka's broker: the request's partitions are a map, one byte budget is spent across them, a topic the client may
not READ is TOPIC_AUTHORIZATION_FAILED, and one unreadable copy is that partition's KAFKA_STORAGE_ERROR only.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from typing import Any

from rlm.listener.authz import READ
from rlm.listener.net.principals import Client
from rlm.listener.protocol.codec import ErrorCode, free_gradually
from rlm.listener.tier.context import TierContext
from rlm.tier import Decided, FetchResult, Isolation, UnreadableCopyError
from rlmm.api import TopicIdPartition

__all__ = ["fetch", "in_request_order", "partition_answer"]

FREE_STEP = 1024
PARALLEL_READS = 4
"""Threads (in the process) reading the partitions of a Fetch ahead of the one answering it: Kafka's broker reads
every partition of a Fetch below its local log start at once (``remote.log.reader.threads``; KAFKA-14915). 0: each
Fetch reads its partitions one after the other (``bench_tier_read --parallel-reads``). Only for a store whose reads
wait on a network (S3): a store mapping local files (the filesystem's, :class:`rsm.store.base.MappedStore`) reads
them one after the other (``TierContext.parallel_reads``), where the hand-offs to the threads cost CPU and the GIL
and overlap no waiting (bench_tier_read, 8 partitions, alternating, load 21-25: 0.465-0.471 CPU s/GiB with 4
threads, 0.379-0.387 without, and 1097-1841 vs 2307-2462 MB/s)."""


def fetch(ctx: TierContext, req: Any, client: Client, *, budget: int | None = None,
          decided: Mapping[tuple[Any, int], Decided] | None = None,
          checked_by_caller: bool = False) -> tuple[dict[str, Any], int]:
    """The Fetch response and the record bytes it carries (for ``min_bytes``).

    As Kafka's broker: the request's partitions are a map (a partition listed twice is answered once, from its
    last entry), the answer carries at most ``min(max_bytes, fetch_max_bytes)`` record bytes (the first batch
    of the first partition with data even past it, so that a consumer always progresses), and that one budget
    is spent across the partitions in order, each taking at most its ``partition_max_bytes``. A partition
    reached with no budget left gets its bounds (from the tier's metadata) and no records: nothing of it is
    read from the store. ``budget`` (the server's room for queued answers) lowers the cap further. A topic the
    client may not READ is TOPIC_AUTHORIZATION_FAILED for each of its partitions (an unknown topic id stays
    UNKNOWN_TOPIC_ID: there is no name to authorize). ``decided``: (topic name or id, partition) -> what a proxied
    broker says of transactions the tier may not have seen decided (:class:`rlm.tier.Decided`), for read_committed.
    ``checked_by_caller``: READ is not checked here, every topic read as if allowed; only for an answer that is
    never sent unless the caller finds every topic of it readable when it sends it (an answer read ahead for a
    proxy's next Fetch, checked when that Fetch comes: :meth:`rlm.listener.upstream.proxy.Proxy._still_readable`),
    so that the ACLs are not looked up twice for one answer."""
    topics: dict[Any, tuple[str | None, uuid.UUID | None]] = {}  # topic name (< v13) or id -> (name, id)
    wanted: dict[tuple[Any, int], Any] = {}  # (topic, partition) -> its last entry, in first-seen order
    for t in req.topics:
        name, tid = getattr(t, "topic", None), getattr(t, "topic_id", None)
        key = name if name is not None else tid
        topics.setdefault(key, (name, tid))
        for p in t.partitions:
            wanted[(key, p.partition)] = p
    names = {name if name is not None else ctx.name_of(tid) for name, tid in topics.values()}
    ok = {n for n in names if n is not None} if checked_by_caller else ctx.allowed(client, READ, names)
    asked = req.max_bytes if req.max_bytes > 0 else ctx.fetch_max_bytes
    left = min(asked, ctx.fetch_max_bytes, ctx.fetch_max_bytes if budget is None else budget)
    slots: list[tuple[Any, dict[str, Any] | None]] = []  # (topic key, its answer or None: read below), in order
    reads: list[_Read] = []
    for (key, index), p in wanted.items():
        name, tid = topics[key]
        code = None
        topic = None
        if name is not None and name not in ok:  # refused before existence is told
            code = ErrorCode.topic_authorization_failed
        else:
            topic = ctx.catalog.by_name(name) if name is not None else ctx.catalog.by_id(tid)
            if topic is not None and topic.name not in ok:
                code = ErrorCode.topic_authorization_failed
            elif topic is None:
                code = ErrorCode.unknown_topic_id if name is None else ErrorCode.unknown_topic_or_partition
            elif index not in topic.partitions:
                code = ErrorCode.unknown_topic_or_partition
        if code is not None:
            slots.append((key, partition_answer(index, FetchResult(), code)))
            continue
        assert topic is not None
        reads.append(_Read(len(slots), topic.tp(index), index, p.fetch_offset, p.partition_max_bytes,
                           decided.get((key, index)) if decided else None))
        slots.append((key, None))
    total = _read_all(ctx, reads, left, Isolation.from_id(getattr(req, "isolation_level", 0)))
    parts: dict[Any, list[dict[str, Any]]] = {key: [] for key in topics}
    for r in reads:
        slots[r.slot] = (slots[r.slot][0], r.answer)
    for key, answer in slots:
        parts[key].append(answer)  # type: ignore[arg-type]  # every read's answer is in its slot
    if len(wanted) > FREE_STEP:  # freed a slice at a time, not in one deallocation holding the GIL (ms per 100,000)
        keys = list(wanted)
        wanted.clear()
        free_gradually(keys, FREE_STEP)
        free_gradually(slots, FREE_STEP)
        free_gradually(reads, FREE_STEP)
    responses = []
    for key, (name, tid) in topics.items():
        topic = ctx.catalog.by_name(name) if name is not None else ctx.catalog.by_id(tid)
        responses.append({"topic": name if name is not None else (topic.name if topic else None),
                          "topic_id": tid if tid is not None else (topic.topic_id if topic else None),
                          "partitions": parts[key]})
    return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0, "responses": responses}, total


class _Read:
    """One partition of a Fetch read from the tier: what it asks, the room it is read with, its answer."""

    __slots__ = ("answer", "at_least_one", "decided", "index", "max_bytes", "offset", "future",
                 "partition_max_bytes", "slot", "tp")

    def __init__(self, slot: int, tp: TopicIdPartition, index: int, offset: int, partition_max_bytes: int,
                 decided: Decided | None) -> None:
        self.slot = slot  # its place among the request's partitions
        self.tp = tp
        self.index = index
        self.offset = offset
        self.partition_max_bytes = partition_max_bytes
        self.decided = decided
        self.max_bytes = 0  # the room it was read with (planned, then as in order)
        self.at_least_one = False
        self.future: Future[FetchResult | UnreadableCopyError] | None = None  # read ahead on the pool
        self.answer: dict[str, Any] | None = None

    def room(self, left: int) -> int:
        """Its room when the budget has ``left`` bytes: at most its own ``partition_max_bytes``."""
        return max(min(self.partition_max_bytes, left), 0)

    def read(self, ctx: TierContext, isolation: Isolation) -> FetchResult | UnreadableCopyError:
        """The tier's answer with the room set (:attr:`max_bytes`, :attr:`at_least_one`), or the copy's error."""
        try:
            return ctx.tier.fetch(self.tp, self.offset, self.max_bytes, at_least_one=self.at_least_one,
                                  isolation=isolation, decided=self.decided)
        except UnreadableCopyError as err:  # this partition only: the others are served
            return err


def _read_all(ctx: TierContext, reads: list[_Read], left: int, isolation: Isolation) -> int:
    """Read ``reads`` (in the request's order) from the tier, each answer set; returns the record bytes in all.

    The answers are those of reading the partitions one after the other, each with the room the ones before it
    left (``left``, spent in order; the first to carry data may pass it with its first batch). Several are read at
    once, on :data:`PARALLEL_READS` threads and this one: each with its *planned* room, the budget minus the rooms of
    those before it (as if each filled its own), the first one ``at_least_one``. Taken in order, a read whose planned
    room is the one the partitions before it actually left is kept; any other is read again here with the right room
    (rare: only once the rooms asked for outgrow the budget, or when the partitions before a read brought no data).
    A read not started when its turn comes is read here instead; none is left running when this returns."""
    plan = left
    parallel = PARALLEL_READS if ctx.parallel_reads else 0
    ahead: list[Future[FetchResult | UnreadableCopyError]] = []
    for i, r in enumerate(reads):
        r.max_bytes, r.at_least_one = r.room(plan), i == 0
        plan -= r.max_bytes
        if i and r.max_bytes > 0 and parallel:  # may send records: read ahead (the first is read here)
            r.future = _pool().submit(r.read, ctx, isolation)
            ahead.append(r.future)
    total = 0
    try:
        for r in reads:
            room, first = r.room(left), total == 0
            res = None
            if r.future is not None and not r.future.cancel():  # else not started: read here
                res = r.future.result()
                if (r.max_bytes, r.at_least_one) != (room, first) and not (
                        r.max_bytes == room and isinstance(res, FetchResult) and res.size):
                    res = None  # read with another room (with data, at_least_one changes nothing): again
            if res is None:
                r.max_bytes, r.at_least_one = room, first
                res = r.read(ctx, isolation)
            total, left = _answer(ctx, r, res, total, left)
    finally:  # no read outlives the Fetch (an error raised); a cancelled one is never waited for: it may sit
        futures_wait([f for f in ahead if not f.cancel()])  # queued behind other Fetches' reads
    return total


def _answer(ctx: TierContext, r: _Read, res: FetchResult | UnreadableCopyError, total: int,
            left: int) -> tuple[int, int]:
    """Set ``r``'s answer from its tier read ``res``; returns the record bytes and the budget after it."""
    if isinstance(res, UnreadableCopyError):
        r.answer = partition_answer(r.index, FetchResult(), ctx.unreadable(res, "fetch"))
        return total, left
    if res.gap is not None:
        ctx.gap(r.tp, *res.gap)
    code = {None: ErrorCode.none, "offset_out_of_range": ErrorCode.offset_out_of_range,
            "offset_not_available": ErrorCode.none}[res.error]
    r.answer = partition_answer(r.index, res, code)
    return total + res.size, left - res.size


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """The threads that read a Fetch's partitions ahead of the one answering it (started when first needed)."""
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(PARALLEL_READS, thread_name_prefix="tier-fetch")
        return _POOL


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
