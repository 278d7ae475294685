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
  fetch offset (below the tier's start, or a hole) the broker's OFFSET_OUT_OF_RANGE stands. read_committed: when the
  broker's last stable offset is above its log start, every transaction begun below it is decided, markers tiered or
  not: the tier is read up to its high watermark and the broker's aborted transactions (of a Fetch at its log start)
  come with the tier's (:class:`rlm.tier.Decided`); otherwise the tier's own last stable offset bounds the read.
  A broker that answers OFFSET_OUT_OF_RANGE but not the ListOffsets for its bounds (a follower, which serves a
  consumer's Fetch v11+ but not its ListOffsets; a new leader for a moment after a leadership move:
  OFFSET_NOT_AVAILABLE) gets its ListOffsets error passed on instead, which clients retry on: its OFFSET_OUT_OF_RANGE
  would reset a consumer group (``auto.offset.reset``) from a position the tier holds. So does a partition whose tier
  the listener has not read yet (:meth:`rlm.tier.TierView.ready`: its metadata manager, which at start reads the
  metadata topic from its cache's progress or from the beginning, not caught up with it) where that tier has
  nothing at the fetch offset: OFFSET_NOT_AVAILABLE, not the broker's OFFSET_OUT_OF_RANGE, nor a hole.
- **A hole**: the tier ends below the broker's log start, and the offsets ``tier's high watermark .. broker's log
  start - 1`` are nowhere. Copy lag past local retention is normal (the sidecar stages every rolled segment it has not
  copied, :mod:`rlm.tasks.staging`, so the broker may delete it first), so such a range is a hole only once it is
  *confirmed* (:class:`Holes`): no segment staged for tiering overlaps it (:func:`rlm.tasks.staging.staged_ranges`,
  read only) and it has been seen so, from the same first offset (where the tier ends), for
  ``history_listener.hole_confirm_ms`` (the moment between a copy's staging released and the listener's own metadata
  manager and tier view reading the copy; a segment rolled and deleted before the stage job staged it). A range that
  only grows at its end (the broker's retention deleting a segment every few seconds) keeps its clock: only the copy
  holding its first offset can end it, and were its grace to start again at every move of the broker's log start, a
  real hole would stay pending for ever. Until then it is *pending*: a Fetch there gets OFFSET_NOT_AVAILABLE and
  ListOffsets EARLIEST too, and a timestamp lookup the tier has no answer to below the broker's log start (its first
  record at or after the timestamp may be there), and OffsetForLeaderEpoch of an epoch that may end there (clients ask
  again; the broker's OFFSET_OUT_OF_RANGE, log start or answer past it would reset a consumer past offsets tiered
  seconds later, or let a truncation pass), counted once a range (``rlm_history_tier_holes_pending_total{topic}``) and
  logged once a range with what is staged, a range being its partition and first offset (its end as first met). A
  partition with nothing remote is pending so below the broker's log start (its first segments staged, or copied and not
  read yet); confirmed, the broker's answers stand and no hole is counted (tiering began after the broker's retention
  ran, or remote retention expired everything), its range logged once at WARNING. A confirmed hole gets the broker's
  OFFSET_OUT_OF_RANGE, as from Kafka, and EARLIEST is the broker's log start; it is counted once
  (``rlm_history_tier_holes_total{topic}``) and logged once at ERROR with its range then, when a Fetch or ListOffsets
  meets it; its growing later is neither. A Fetch's range is the one the tier it read gives (its answer's
  high watermark), not a second read's (:func:`_hole_at`).
- **ListOffsets**: EARLIEST is the tier's log start offset (and its leader epoch) when it is below the broker's answer,
  the tier reaches the broker's log start (no hole: otherwise a consumer reset to the tier's start would read up to the
  hole, be told OFFSET_OUT_OF_RANGE, reset to the tier's start again, forever; with a hole EARLIEST is the broker's, as
  Kafka's after retention; with a pending one, OFFSET_NOT_AVAILABLE) and the client's principal may DESCRIBE the
  topic. A timestamp lookup is the tier's (:meth:`rlm.tier.TierView.offset_for_timestamp`, the remote time indexes)
  when the first record at or after the timestamp lies below the broker's log start (asked after its answer, which
  may be past records it deleted a moment before; not given, OFFSET_NOT_AVAILABLE); with no answer from the tier
  there while the tier ends below the broker's log start in a pending range (see *A hole*), OFFSET_NOT_AVAILABLE (the
  first record at or after the timestamp may be in that range). LATEST and the other special timestamps are the
  broker's. EARLIEST and timestamp lookups of a partition whose tier the listener has not read yet
  (:meth:`rlm.tier.TierView.ready`) are OFFSET_NOT_AVAILABLE (clients ask again): the broker's answers would start a
  consumer past the tier's history. One whose tier cannot be read where its answer may be (the tier's bounds, or the
  time index or segment of a copy beginning below the broker's log start: a store error, a corrupt object) is
  KAFKA_STORAGE_ERROR, as a Fetch there (:data:`rlm.listener.tier.context.UNREADABLE_ERROR`, which clients retry),
  counted and logged as one (:meth:`rlm.listener.tier.context.TierContext.unreadable`). A lookup the tier could answer
  only at or past the broker's log start (no copy beginning below it has a record at or after the timestamp) is the
  broker's, nothing read; so is any, EARLIEST too, where the broker's log start is 0 (nothing below it).
- **OffsetForLeaderEpoch**: an epoch that ended below the broker's log start (the broker's checkpoint no longer holds
  it: Kafka then answers the requested epoch with its log start) is answered from the tier's lineage
  (:meth:`rlm.tier.Lineage.end_offset_for`: the largest epoch at or below it and the start of the next), DESCRIBE
  checked; the broker's answer stands for every other epoch and for every error. Before the listener has read the
  partition's tier (:meth:`rlm.tier.TierView.ready`) its lineage is not used (empty, or partial mid-replay): an answer
  the broker did not give from its checkpoint (its end offset at or below its log start, or undefined) is
  OFFSET_NOT_AVAILABLE, which clients retry; the broker's answer from its checkpoint (an end offset above its log
  start) stands. So is, whether the tier is read or not, a partition whose log start the broker did not give (its
  ListOffsets after the answer failed for it: leadership moved between the two): an answer from its checkpoint cannot
  be told then from one at its log start, which a client would take for the epoch's end and check its position
  against (offsets of a truncated lineage below it skipped). So is an epoch the lineage has nothing above, the
  broker's answer not from its checkpoint, while the tier ends below the broker's log start in a pending range (see
  *A hole*): the next epoch's start may yet be tiered; with a confirmed hole the broker's answer stands. The tier is
  read only for an answer not from the broker's checkpoint (one from it is exact: Kafka's checkpoint holds every
  epoch from its log start on); where it cannot be read then (its bounds), KAFKA_STORAGE_ERROR, as a Fetch there
  (:data:`rlm.listener.tier.context.UNREADABLE_ERROR`), counted and logged as one: taken for a tier with nothing
  remote, the range below the broker's log start was a hole once confirmed and the broker's log start went out.
- **A topic the listener's ACL view refuses DESCRIBE** whose ListOffsets or OffsetForLeaderEpoch the broker answers
  all the same (an ACL granted since the view's last fetch, CLUSTER_ACTION on the cluster, a super user or a host the
  view does not share, the view unavailable): a partition whose answer the tier would change is OFFSET_NOT_AVAILABLE,
  neither the broker's answer nor the tier's (:func:`_served_partitions_changed`).
"""

from __future__ import annotations

import dataclasses
import enum
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from rlm.listener.authz import DESCRIBE
from rlm.listener.net.principals import Client
from rlm.listener.protocol.codec import ErrorCode, build
from rlm.listener.tier.catalog import ServedTopic
from rlm.listener.tier.context import TierContext
from rlm.listener.tier.fetch import fetch
from rlm.listener.tier.offsets import EARLIEST, offset_of
from rlm.logs import limited_logger
from rlm.tier import Decided, Isolation, PartitionTier, UnreadableCopyError
from rlmm.api import TopicIdPartition

__all__ = ["BrokerBounds", "Hole", "Holes", "epochs_below_log_start", "fetch_below_log_start", "fetch_from_tier",
           "list_offsets_below_log_start", "out_of_range", "served_partitions"]

log = limited_logger(__name__)

HOLES = Counter("rlm_history_tier_holes", "Holes met by the proxy: ranges below the broker's log start that the "
                "tier does not hold (each counted once: a range is its partition and first offset)", ["topic"])
PENDING_HOLES = Counter("rlm_history_tier_holes_pending", "Ranges below the broker's log start that the tier does "
                        "not hold yet, met by the proxy while staged for tiering or within hole_confirm_ms: answered "
                        "OFFSET_NOT_AVAILABLE (each counted once: a range is its partition and first offset)",
                        ["topic"])
REPORTED_HOLES = 10_000  # holes remembered as already counted and logged (then they are counted again)


@dataclass(frozen=True, slots=True)
class BrokerBounds:
    """A partition's bounds in the broker's log, asked with ListOffsets: a Fetch answered OFFSET_OUT_OF_RANGE
    carries none (Kafka sets them to -1 on a partition error). ``aborted``: for read_committed, the transactions the
    broker aborted that began below its log start, ``(producer id, first offset)`` (asked only when needed)."""

    log_start_offset: int
    high_watermark: int
    last_stable_offset: int
    aborted: tuple[tuple[int, int], ...] | None = None

    def decided(self) -> Decided | None:
        """What the broker says of transactions for a read_committed read of the tier (:class:`rlm.tier.Decided`),
        when it says anything: its last stable offset above its log start, and its aborted transactions known."""
        if self.aborted is None or self.last_stable_offset <= self.log_start_offset:
            return None
        return Decided(self.last_stable_offset, self.aborted)


class Hole(enum.Enum):
    """What :meth:`Holes.check` found below the broker's log start."""

    NONE = "none"  # the tier reaches the broker's log start
    PENDING = "pending"  # the tier ends below it, but what is missing may yet be tiered: clients ask again
    CONFIRMED = "confirmed"  # a hole: the broker's OFFSET_OUT_OF_RANGE and log start stand


class Holes:
    """Ranges below the broker's log start that the tier does not hold, by partition: pending, then confirmed holes
    (see the module's docstring). A range is pending while a segment staged for tiering (``staged``: a partition's
    staged ``(base, end inclusive)``, :func:`rlm.tasks.staging.staged_ranges`) overlaps it, and for ``confirm_s``
    from the first time its first offset (where the tier ends) was met with none over the range: a range that grows
    at its end (the broker's log start moved on) keeps its clock, one whose first offset moved (the tier read more,
    or less) is a new one, and a staged segment over any of it holds it pending and starts its clock again once gone
    (a copy just released is read by the listener within the grace). Each hole is counted and logged once, each
    pending range too, by its partition and first offset: one that grows at its end is the same range, its pending
    line giving its end as first met and its hole line its end when confirmed (until session 24 each end met was
    another range, counted and logged again: a range met at 8 ends, 5 of them pending, was 5 pending ranges and 3
    holes). A partition with nothing remote: its confirmed range is not counted as a hole, and logged once at WARNING
    (:meth:`check`).
    ``confirm_s`` 0 and no ``staged``: every such range is a hole at once. Thread-safe."""

    def __init__(self, confirm_s: float = 0.0, staged: Callable[[TopicIdPartition], list[tuple[int, int]]] | None
                 = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.confirm_s = confirm_s
        self._staged = staged
        self._clock = clock
        # (partition, first offset) of the holes counted and logged, and of the pending ranges
        self._seen: OrderedDict[tuple[TopicIdPartition, int], None] = OrderedDict()
        self._told: OrderedDict[tuple[TopicIdPartition, int], None] = OrderedDict()
        # partition -> its range's first offset (where the tier ends) and since when it has been met with nothing
        # staged over the range (None: staged when last met)
        self._ranges: OrderedDict[TopicIdPartition, tuple[int, float | None]] = OrderedDict()
        self._lock = threading.Lock()

    def met(self, tp: TopicIdPartition, first_offset: int, last_offset_inclusive: int, api: str) -> None:
        """A hole of partition ``tp`` from ``first_offset`` met: counted and logged, with its range now, unless one
        from there was already (it grows at its end as the broker's log start moves on)."""
        with self._lock:
            if not _remember(self._seen, (tp, first_offset)):
                return
        HOLES.labels(tp.topic).inc()
        log.error("proxy: a hole below the broker's log start: these offsets are neither remote nor on the broker "
                  "(the broker's retention deleted them before they were tiered); a Fetch of them is answered "
                  "OFFSET_OUT_OF_RANGE (logged once per hole, with its range now: it grows as the broker's log "
                  "start moves on)", extra={
                      "topic_partition": str(tp), "first_offset": first_offset,
                      "last_offset_inclusive": last_offset_inclusive,
                      "offsets": last_offset_inclusive - first_offset + 1, "api": api})

    def _nothing_remote(self, tp: TopicIdPartition, last_offset_inclusive: int, api: str) -> None:
        """Partition ``tp``'s range ``0 .. last_offset_inclusive`` confirmed with nothing of it remote: logged once,
        with its range now, and not counted as a hole (:meth:`check`)."""
        with self._lock:
            if not _remember(self._seen, (tp, 0)):  # a tier's range starts at its high watermark, 1 or more
                return
        log.warning("proxy: nothing of this partition is remote and the broker's log starts above 0: these offsets "
                    "are neither remote nor on the broker, and the broker's answers stand (a Fetch of them "
                    "OFFSET_OUT_OF_RANGE, EARLIEST its log start). Not counted as a hole: tiering began after the "
                    "broker's retention ran, or remote retention expired everything, or (a loss) the broker deleted "
                    "the first segments before their copy (logged once per partition, with its range now)", extra={
                        "topic_partition": str(tp), "first_offset": 0, "last_offset_inclusive": last_offset_inclusive,
                        "offsets": last_offset_inclusive + 1, "api": api})

    def check(self, tier: PartitionTier | None, log_start_offset: int, api: str, *,
              tp: TopicIdPartition | None = None) -> Hole:
        """Whether ``tier`` ends below the broker's ``log_start_offset``: not, pending, or a hole (counted and logged
        once). ``tier`` None (nothing of partition ``tp`` is remote): the range is everything below the broker's log
        start, pending as any other (its first segment staged and deleted before its copy, or copied and not read by
        the listener yet); once confirmed it is not counted as a hole, as nothing may have been tiered (tiering began
        after the broker's retention had run, and the first copy is not read within the grace; or remote retention
        expired it all: an ERROR and a hole counted would be false for these, and the listener cannot tell them from
        first segments deleted before their copy), and it is logged once at WARNING with its range then (until
        session 24 its pending line was its last): the broker's answers stand, as they did."""
        if tier is not None:
            return self.check_end(tier.tp, tier.high_watermark, log_start_offset, api)
        return self.check_end(tp, None, log_start_offset, api) if tp is not None else Hole.NONE

    def check_end(self, tp: TopicIdPartition, high_watermark: int | None, log_start_offset: int, api: str) -> Hole:
        """:meth:`check` of partition ``tp``'s tier ending at ``high_watermark`` (None: nothing of it is remote), as
        a read of the tier gave it: a Fetch's (:func:`_hole_at`), whose answer must be judged by the tier it read."""
        if high_watermark is not None:
            if high_watermark >= log_start_offset:
                return Hole.NONE
            first = high_watermark
        elif log_start_offset <= 0:
            return Hole.NONE
        else:
            first = 0
        last = log_start_offset - 1
        try:
            held = self._staged(tp) if self._staged is not None else []
        except OSError as err:  # what is staged is not known: nothing is confirmed (fail closed)
            log.warning("proxy: the staging dir cannot be listed: a range below the broker's log start stays pending",
                        extra={"topic_partition": str(tp), "error": f"{type(err).__name__}: {err}"})
            held = [(first, last)]
        staged = [r for r in held if r[0] <= last and r[1] >= first]
        now, tell = self._clock(), False
        with self._lock:
            was = self._ranges.get(tp)
            since = was[1] if was is not None and was[0] == first else None
            if staged:
                since = None
            elif since is None:
                since = now
            self._ranges[tp] = (first, since)
            self._ranges.move_to_end(tp)
            while len(self._ranges) > REPORTED_HOLES:
                self._ranges.popitem(last=False)
            confirmed = since is not None and now - since >= self.confirm_s
            if not confirmed:
                tell = _remember(self._told, (tp, first))
        if confirmed:
            if high_watermark is not None:
                self.met(tp, first, last, api)
            else:
                self._nothing_remote(tp, last, api)
            return Hole.CONFIRMED
        if tell:
            PENDING_HOLES.labels(tp.topic).inc()
            log.warning("proxy: the tier ends below the broker's log start, and these offsets may yet be tiered "
                        "(staged for a copy, or met for less than history_listener.hole_confirm_ms): a Fetch of them, "
                        "ListOffsets EARLIEST, ListOffsets by a timestamp the tier has no answer to and "
                        "OffsetForLeaderEpoch of an epoch ending there are answered "
                        "OFFSET_NOT_AVAILABLE, and clients ask again (logged once per range, with its range as "
                        "first met: it grows as the broker's log start moves on)", extra={
                            "topic_partition": str(tp), "first_offset": first, "last_offset_inclusive": last,
                            "offsets": last - first + 1, "staged": [list(r) for r in staged],
                            "hole_confirm_ms": round(self.confirm_s * 1000), "api": api})
        return Hole.PENDING


def _remember(seen: OrderedDict[Any, None], key: Any) -> bool:
    """Add ``key`` to ``seen`` (the oldest forgotten past :data:`REPORTED_HOLES`); whether it is new. Under the
    caller's lock."""
    if key in seen:
        return False
    seen[key] = None
    while len(seen) > REPORTED_HOLES:
        seen.popitem(last=False)
    return True


def served_partitions(ctx: TierContext, names: dict[str, list[int]]) -> dict[str, list[int]]:
    """Of ``names`` (topic name -> partitions), those the tier serves."""
    out: dict[str, list[int]] = {}
    for name, parts in names.items():
        served = ctx.catalog.by_name(name)
        if served is not None:
            ours = [p for p in parts if p in served.partitions]
            if ours:
                out[name] = ours
    return out


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
                          bounds: dict[tuple[Any, int], BrokerBounds], holes: Holes,
                          unbounded: dict[tuple[Any, int], ErrorCode] | None = None, budget: int | None = None) -> Any:
    """``resp`` (the broker's Fetch answer to ``req``, kio entities) with the partitions below the broker's log start
    (``bounds``: those :func:`out_of_range` named, as the broker gives them now) answered from the tier where it
    holds them (see the module's docstring); a hole met is told to ``holes``. ``unbounded``: those
    :func:`out_of_range` named whose bounds the broker would not give, with its error: their OFFSET_OUT_OF_RANGE
    is replaced by that error (:func:`_unbounded`); so is, by OFFSET_NOT_AVAILABLE, that of a partition whose tier
    has nothing there while it is not known yet (:func:`_tier_known`). ``budget``: the listener's room for queued
    answers (its ``queued_max_response_bytes`` left), which lowers the tier's record budget further."""
    if unbounded:
        resp = _unbounded(resp, unbounded)
    asked = {(_key(t), p.partition): p for t in req.topics for p in t.partitions}
    below = {k for k, b in bounds.items() if 0 <= asked[k].fetch_offset < b.log_start_offset}
    if not below:
        return resp
    unknown = {k for k in below if not _tier_known(ctx, k)}  # asked before the tier is read (TierView.ready)
    used = sum(len(p.records or b"") for t in resp.responses for p in t.partitions)
    sub = dataclasses.replace(req, topics=tuple(
        dataclasses.replace(t, partitions=tuple(p for p in t.partitions if (_key(t), p.partition) in below))
        for t in req.topics if any((_key(t), p.partition) in below for p in t.partitions)))
    cap = req.max_bytes if req.max_bytes > 0 else ctx.fetch_max_bytes
    if budget is not None:
        cap = min(cap, budget)
    decided = {k: d for k in below if (d := bounds[k].decided()) is not None}
    values, _size = fetch(ctx, sub, client, budget=max(cap - used, 0), decided=decided)
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
                if (key, p.partition_index) in unknown:  # not read yet, not nowhere: the client fetches again
                    parts.append(_errored(p, ErrorCode.offset_not_available))
                    continue
                if got is not None and (key, p.partition_index) in below and _hole_at(
                        ctx, holes, key, p.partition_index, got, asked[(key, p.partition_index)].fetch_offset,
                        bounds[(key, p.partition_index)].log_start_offset) is Hole.PENDING:  # may yet be tiered
                    parts.append(_errored(p, ErrorCode.offset_not_available))
                    continue
                parts.append(p)
                continue
            parts.append(build(type(p), {**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)},
                                         **_with_bounds(got, bounds[(key, p.partition_index)])}))
        topics.append(dataclasses.replace(t, partitions=tuple(parts)))
    return dataclasses.replace(resp, responses=tuple(topics))


def fetch_from_tier(ctx: TierContext, req: Any, client: Client, bounds: dict[tuple[Any, int], BrokerBounds],
                    budget: int | None = None, *, checked_by_caller: bool = False) -> dict[str, Any] | None:
    """The answer (response values) to a Fetch ``req`` whose every partition asks below the broker's log start as
    the proxy knows it (``bounds``, by (topic key, partition): learned from the broker's answers a moment ago, with
    its last stable offset for read_committed), from the tier alone, without asking the broker: each partition as
    :func:`fetch_below_log_start` answers it, the broker's high watermark and last stable offset the larger of the
    known ones and the tier's (the broker's are never below the tier's). None when the tier does not answer every
    partition without an error and with records or room for none (nothing there, a hole, an unreadable copy, a topic
    not readable), or, for read_committed, sees a transaction open at its end (only the broker knows whether it
    was aborted): then the proxy asks the broker. A stale log start is only lower than the broker's (it moves up):
    an offset below it is below the broker's too. ``budget``: as :func:`fetch_below_log_start`'s;
    ``checked_by_caller``: as :func:`rlm.listener.tier.fetch.fetch`'s (READ checked by the caller before it sends
    the answer)."""
    committed = getattr(req, "isolation_level", 0) == 1
    if not req.topics:
        return None
    cap = req.max_bytes if req.max_bytes > 0 else ctx.fetch_max_bytes
    if budget is not None:
        cap = min(cap, budget)
    asked = {(_key(t), p.partition): p.fetch_offset for t in req.topics for p in t.partitions}
    named = getattr(req.topics[0], "topic", None) is not None  # the request's version names topics (before v13)
    values, _size = fetch(ctx, req, client, budget=cap, checked_by_caller=checked_by_caller)
    for t in values["responses"]:
        key = t["topic"] if named else t["topic_id"]
        parts = []
        for p in t["partitions"]:
            at = (key, p["partition_index"])
            if at not in asked or p["error_code"] != ErrorCode.none or _nothing_there(p, asked[at]) or (
                    committed and p["last_stable_offset"] < p["high_watermark"]):
                return None
            b = bounds[at]
            parts.append({**p, **_with_bounds(p, b, high_watermark=max(b.high_watermark, p["high_watermark"]),
                                              last_stable_offset=max(b.last_stable_offset, p["last_stable_offset"]))})
        t["partitions"] = parts
    return values


def _with_bounds(got: dict[str, Any], b: BrokerBounds, *, high_watermark: int | None = None,
                 last_stable_offset: int | None = None) -> dict[str, Any]:
    """A partition's answer from the tier (``got``) as the proxy sends it: the broker's bounds ``b`` (its high
    watermark and last stable offset, or those given instead), the lower log start offset of the two. Its records
    as the tier gave them: a batch too large to hold stays a :class:`rlm.tier.StreamedBatch`, read from the store
    when the answer is written, a chunk at a time (:func:`rlm.listener.net.chunked.encode_streamed`,
    ``encode_streamed_response``), never whole (PDP-43)."""
    return {"error_code": got["error_code"], "records": got["records"],
            "aborted_transactions": got["aborted_transactions"], "preferred_read_replica": -1,
            "high_watermark": b.high_watermark if high_watermark is None else high_watermark,
            "last_stable_offset": b.last_stable_offset if last_stable_offset is None else last_stable_offset,
            "log_start_offset": min(got["log_start_offset"], b.log_start_offset)
            if got["log_start_offset"] >= 0 else b.log_start_offset}


def _unbounded(resp: Any, errors: dict[tuple[Any, int], ErrorCode]) -> Any:
    """``resp`` with the OFFSET_OUT_OF_RANGE of the partitions of ``errors`` replaced by their error. The broker's
    OFFSET_OUT_OF_RANGE may hide an offset the tier holds, and without the broker's bounds the proxy cannot tell:
    passed on, it would send the client back to ``auto.offset.reset`` (a consumer group to the tier's first offset,
    or past what it has not read). The broker's own ListOffsets error says why it gave no bounds, and clients retry
    on it: NOT_LEADER_OR_FOLLOWER (this broker follows; the client refreshes its metadata and goes to the leader's
    proxy), OFFSET_NOT_AVAILABLE (a new leader, for a moment: the client fetches again)."""
    topics = []
    for t in resp.responses:
        key = _key(t)
        topics.append(dataclasses.replace(t, partitions=tuple(
            _errored(p, errors[(key, p.partition_index)])
            if (key, p.partition_index) in errors and p.error_code == ErrorCode.offset_out_of_range else p
            for p in t.partitions)))
    return dataclasses.replace(resp, responses=tuple(topics))


def _errored(p: Any, code: ErrorCode) -> Any:
    """A Fetch partition answer ``p`` with error ``code`` and no records: empty ones (length 0), as Kafka's with an
    error (``MemoryRecords.EMPTY``), not null (-1), which librdkafka cannot parse: it drops the whole answer, the
    other partitions' records with it, and fetches again at once instead of backing off on the error (3,586 log
    lines, two per answer, from the two consumers of one staged-range test run of test_proxy_pending_holes)."""
    return dataclasses.replace(p, error_code=code, records=b"")


def _nothing_there(got: dict[str, Any], fetch_offset: int) -> bool:
    """The tier has nothing at ``fetch_offset``: out of its range, or at or past its end (a hole below the broker's
    log start); the broker's OFFSET_OUT_OF_RANGE stands."""
    if got["error_code"] == ErrorCode.offset_out_of_range:
        return True
    return got["error_code"] == ErrorCode.none and not got["records"] and fetch_offset >= got["high_watermark"]


def _tier_known(ctx: TierContext, key: Any) -> bool:
    """Whether the listener's tier of the partition ``key`` ((topic key, partition)) is known
    (:meth:`rlm.tier.TierView.ready`): its metadata manager has caught up with it since it began serving it (at
    start it reads the metadata topic from its cache's progress, or from the beginning). A topic not served is."""
    served = ctx.catalog.by_name(key[0]) if isinstance(key[0], str) else ctx.catalog.by_id(key[0])
    return served is None or ctx.tier.ready(served.tp(key[1]))


def _hole_at(ctx: TierContext, holes: Holes, key: Any, partition: int, got: dict[str, Any], fetch_offset: int,
             log_start: int) -> Hole:
    """A Fetch the tier could not answer below the broker's log start (``got``, the tier's answer): a hole (pending
    or confirmed, :meth:`Holes.check_end`) when the tier ends below both. Judged by the tier's end that answer
    carries (its high watermark; -1: nothing remote), not by a second read of the tier: one that failed would take
    the tier for empty (0..log start, a range whose grace may have run), one that saw a copy read in between would
    end past ``fetch_offset`` (no hole): either let the broker's OFFSET_OUT_OF_RANGE through for a range pending
    (test_boundary_fetch_hole)."""
    served = ctx.catalog.by_name(key) if isinstance(key, str) else ctx.catalog.by_id(key)
    if served is None:
        return Hole.NONE
    end = got["high_watermark"]
    if end <= fetch_offset:
        return holes.check_end(served.tp(partition), end if end >= 0 else None, log_start, "fetch")
    return Hole.NONE


def list_offsets_below_log_start(ctx: TierContext, req: Any, resp: Any, client: Client,
                                 log_starts: dict[tuple[str, int], int], holes: Holes) -> Any:
    """``resp`` (the broker's ListOffsets answer to ``req``) with EARLIEST and timestamp lookups answered by the tier
    where the module's docstring says. ``log_starts``: the broker's log start offset of the partitions asked by
    timestamp, (topic, partition) -> offset, asked after its answer (EARLIEST's own answer is the broker's log start):
    a lookup it answered past records it deleted a moment before (its answer its new log start) has the tier's hit
    below it. One whose log start it did not give (leadership moved between the two) is OFFSET_NOT_AVAILABLE: its
    answer may be past records the tier holds."""
    wanted = {(t.name, p.partition_index): p.timestamp for t in req.topics for p in t.partitions
              if p.timestamp == EARLIEST or p.timestamp >= 0}
    if not wanted:
        return resp
    isolation = Isolation.from_id(getattr(req, "isolation_level", 0))

    def change(served: ServedTopic, p: Any) -> Any:
        ts = wanted.get((served.name, p.partition_index))
        if ts is None:
            return p
        tp = served.tp(p.partition_index)
        if not ctx.tier.ready(tp):  # the tier's answer not known yet
            return _not_available(p)
        start = p.offset if ts == EARLIEST else log_starts.get((served.name, p.partition_index))
        if start is None:
            return _not_available(p)
        if start <= 0:  # nothing below the broker's log start: its answer, the tier not read
            return p
        try:
            pt = ctx.tier.partition(tp)
            if ts == EARLIEST:
                return _earliest(holes, tp, pt, p)
            return _by_timestamp(ctx, holes, served, pt, p, ts, start, isolation)
        except UnreadableCopyError as err:  # the tier's answer not known: as a Fetch of it, never the broker's
            return _not_available(p, ctx.unreadable(err, "list_offsets"))

    return _served_partitions_changed(ctx, client, resp, lambda t: t.name, lambda p: p.partition_index, change,
                                      _not_available)


def _earliest(holes: Holes, tp: TopicIdPartition, pt: PartitionTier | None, p: Any) -> Any:
    """The broker's EARLIEST answer ``p`` (its log start) as the proxy sends it: the tier's log start ``pt`` where
    it is below and the tier reaches the broker's; OFFSET_NOT_AVAILABLE while the range between is pending."""
    hole = holes.check(pt, p.offset, "list_offsets", tp=tp) if pt is None or pt.log_start_offset < p.offset else None
    if hole is Hole.PENDING:  # the broker's log start would start a consumer past what may yet be tiered
        return _not_available(p)
    if hole is Hole.NONE and pt is not None:
        return dataclasses.replace(p, offset=pt.log_start_offset, leader_epoch=pt.epoch_of(pt.log_start_offset))
    return p


def _by_timestamp(ctx: TierContext, holes: Holes, served: ServedTopic, pt: PartitionTier | None, p: Any, ts: int,
                  start: int, isolation: Isolation) -> Any:
    """The broker's answer ``p`` to timestamp ``ts`` as the proxy sends it, its log start ``start`` asked after it:
    the tier's first record at or after ``ts`` where it lies below ``start``. The tier's time indexes are read only
    where that may be (:func:`_may_lie_below`): a lookup the tier could answer only at or past ``start`` is the
    broker's, no copy read (a corrupt copy the broker still holds fails nothing). OFFSET_NOT_AVAILABLE while the tier
    ends below ``start`` in a pending range and has no answer. Raises :class:`UnreadableCopyError` when the copy to
    read cannot be read."""
    hit = offset_of(ctx, served, p.partition_index, ts, isolation) if _may_lie_below(pt, ts, start) else {}
    if "offset" in hit and hit["offset"] < start:
        return build(type(p), {**{f.name: getattr(p, f.name) for f in dataclasses.fields(p)}, **hit})
    if holes.check(pt, start, "list_offsets", tp=served.tp(p.partition_index)) is Hole.PENDING:
        return _not_available(p)  # the first record at or after it may be in the range yet to be tiered
    return p


def _may_lie_below(pt: PartitionTier | None, ts: int, start: int) -> bool:
    """Whether the tier ``pt``'s first record at or after timestamp ``ts`` may lie below ``start``: a copy beginning
    below it has a record at or after ``ts`` (its largest timestamp at or past it). A loop, not ``any()`` over
    ``takewhile()``: 1.5-1.7 ms vs 2.5-2.7 ms with 10,000 copies below ``start`` (timeit, load 7.5)."""
    for s in pt.segments if pt is not None else ():
        if s.start_offset >= start:
            return False
        if s.max_timestamp_ms >= ts:
            return True
    return False


def _not_available(p: Any, code: ErrorCode = ErrorCode.offset_not_available) -> Any:
    """A ListOffsets partition answer ``p`` as OFFSET_NOT_AVAILABLE (as a new leader answers for a moment: clients
    ask again), or ``code`` (an unreadable copy's, :data:`rlm.listener.tier.context.UNREADABLE_ERROR`), no offset."""
    return dataclasses.replace(p, error_code=code, timestamp=-1, offset=-1,
                               **({"leader_epoch": -1} if hasattr(p, "leader_epoch") else {}))


def epochs_below_log_start(ctx: TierContext, req: Any, resp: Any, client: Client,
                           log_starts: dict[tuple[str, int], int], holes: Holes) -> Any:
    """``resp`` (the broker's OffsetForLeaderEpoch answer to ``req``) with the epochs that ended below the broker's log
    start (``log_starts``: (topic, partition) -> offset) answered from the tier's lineage, for the topics the client's
    principal may DESCRIBE. An answer the broker did not give from its own checkpoint is OFFSET_NOT_AVAILABLE
    (:func:`_epoch_not_available`) where the tier may yet say more: before the partition's tier is known
    (:meth:`rlm.tier.TierView.ready`; its lineage not read), and where the lineage has no epoch above the one asked
    while the tier ends below the broker's log start in a pending range (:meth:`Holes.check`: what is missing may yet
    be tiered, and with it the next epoch's start). So is any answer of a partition ``log_starts`` lacks (the
    broker's ListOffsets failed for it): without the log start, one from the checkpoint cannot be told from one at
    the log start; an older log start would not do (it only moves up: an end offset at or below it is past the
    checkpoint, one above it may be either)."""
    asked = {(t.topic, p.partition): p.leader_epoch for t in req.topics for p in t.partitions if p.leader_epoch >= 0}

    def change(served: ServedTopic, p: Any) -> Any:
        epoch, start = asked.get((served.name, p.partition)), log_starts.get((served.name, p.partition))
        if epoch is None:
            return p
        if start is None:  # whether the answer is from the broker's checkpoint cannot be told: asked again
            return _epoch_not_available(p)
        tp = served.tp(p.partition)
        if not ctx.tier.ready(tp):  # asked before the read: a lineage read before may be empty or partial
            return _epoch_not_available(p) if _past_checkpoint(p, start) else p
        if not _past_checkpoint(p, start):  # the broker's exact answer: the tier not read
            return p
        try:
            pt = ctx.tier.partition(tp)
        except UnreadableCopyError as err:  # the epoch's end not known: as a Fetch there, never the broker's
            return _epoch_not_available(p, ctx.unreadable(err, "offset_for_leader_epoch"))
        end = pt.lineage.end_offset_for(epoch) if pt is not None else None
        if end is None and holes.check(pt, start, "offset_for_leader_epoch", tp=tp) is Hole.PENDING:
            return _epoch_not_available(p)
        if end is None or end[1] >= start:
            return p
        return dataclasses.replace(p, leader_epoch=end[0], end_offset=end[1])

    return _served_partitions_changed(ctx, client, resp, lambda t: t.topic, lambda p: p.partition, change,
                                      _epoch_not_available)


def _past_checkpoint(p: Any, log_start: int) -> bool:
    """Whether the broker's OffsetForLeaderEpoch answer ``p`` may not come from its leader-epoch checkpoint: its end
    offset at or below its log start ``log_start`` (an epoch the checkpoint no longer holds: Kafka's
    ``LeaderEpochFileCache.endOffsetFor`` answers one below its first entry with that entry's start, raised to the log
    start by retention), or undefined (-1, no epoch or end offset found). Then only the tier knows where the epoch
    ended."""
    return p.end_offset < 0 or p.leader_epoch < 0 or p.end_offset <= log_start


def _epoch_not_available(p: Any, code: ErrorCode = ErrorCode.offset_not_available) -> Any:
    """An OffsetForLeaderEpoch partition answer ``p`` as OFFSET_NOT_AVAILABLE, no epoch or end offset: the epoch's end
    is the tier's to give and the tier is not read yet, or not tiered yet. Passed on, the broker's answer would have
    the client check its position against the broker's log start (a truncation below it hidden: offsets of the new
    lineage skipped) or against -1 (a truncation seen where there is none: the client resets by
    ``auto.offset.reset``, skipping offsets or reading them twice). OFFSET_NOT_AVAILABLE is the error both client
    families retry without resetting: Kafka's consumer (``OffsetsForLeaderEpochUtils.handleResponse``) retries it
    after ``retry.backoff.ms`` with a metadata update, librdkafka (``rd_kafka_toppar_handle_OffsetForLeaderEpoch``)
    validates again 500 ms later with a metadata refresh; and it is what the listener answers a Fetch or ListOffsets
    with before the tier is read, or in a pending range. Or as ``code``: the tier cannot be read
    (:data:`rlm.listener.tier.context.UNREADABLE_ERROR`, KAFKA_STORAGE_ERROR, in the same lists of both clients:
    retried the same way)."""
    return dataclasses.replace(p, error_code=code, leader_epoch=-1, end_offset=-1)


def _served_partitions_changed(ctx: TierContext, client: Client, resp: Any, name: Callable[[Any], str],
                               index: Callable[[Any], int], change: Callable[[ServedTopic, Any], Any],
                               withheld: Callable[[Any], Any]) -> Any:
    """``resp`` (a broker's answer whose ``topics`` each hold ``partitions``) with every partition answered without an
    error, of a topic the tier serves, replaced by ``change(topic, p)`` where the client's principal may DESCRIBE the
    topic, by ``withheld(p)`` (OFFSET_NOT_AVAILABLE) where it may not and ``change`` would not keep the broker's
    answer. The broker answered it, so the broker let the principal have it: by an ACL the listener's view has not
    fetched yet (a grant, up to ``acl_cache_ttl_ms / 2`` old), by CLUSTER_ACTION on the cluster (Kafka's
    OffsetForLeaderEpoch takes it instead of DESCRIBE), a super user of the broker not in ``super_users``, or the
    view unavailable (not an ACL of the proxy's host: such a client is not forwarded,
    :mod:`rlm.listener.upstream.hosts`). Passed on, its answer (its log start as an epoch's end or as EARLIEST)
    would hide what the tier holds; the tier's may not go to a principal the view refuses. Clients ask again, and
    get the tier's answer once the view allows it."""
    served_names = {name(t) for t in resp.topics if ctx.catalog.by_name(name(t)) is not None}
    ok = ctx.allowed(client, DESCRIBE, served_names)
    topics = []
    for t in resp.topics:
        served = ctx.catalog.by_name(name(t)) if name(t) in served_names else None
        parts = []
        for p in t.partitions:
            if served is None or p.error_code != ErrorCode.none or index(p) not in served.partitions:
                parts.append(p)
            elif name(t) in ok:
                parts.append(change(served, p))
            else:
                parts.append(p if change(served, p) == p else withheld(p))
        topics.append(dataclasses.replace(t, partitions=tuple(parts)))
    return dataclasses.replace(resp, topics=tuple(topics))
