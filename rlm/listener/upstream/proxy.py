"""The proxied routes (:mod:`rlm.listener.routing`): a client request forwarded to the broker, and the broker's
answer brought back, rewritten (broker addresses) or split (the tier's part merged in) on the way.

FORWARD keeps the bytes (only the correlation id is mapped, :class:`~rlm.listener.upstream.brokers.Upstream`, the
answer read into one buffer and sent on from it): the request is not even decoded, so any version the broker speaks
passes. REWRITE and SPLIT decode the broker's answer (kio) on a worker, change it and encode it again, only when it
must change:

- Produce (REWRITE) is forwarded as bytes, its request never decoded: a Produce with ``acks=0`` gets no answer, from
  the broker or from us, and an answer is decoded only when it names leaders' addresses (v10+ ``node_endpoints``,
  checked by a walk over its bytes), else passed as the broker's.
- Fetch (SPLIT) is forwarded as the client's bytes with its session fields set to "no session" (see the routing
  module), and the broker's answer walked (:func:`~rlm.listener.protocol.codec.fetch_answer`): passed as its bytes
  unless a partition of a topic the tier serves is OFFSET_OUT_OF_RANGE (decoded, the tier's part merged in:
  :func:`~rlm.listener.tier.boundary.fetch_below_log_start`) or it names leaders' addresses (v16+). The merge needs
  the broker's log start offset, high watermark and last stable offset of the partitions concerned, asked on the
  client's own connection to it (ListOffsets EARLIEST, LATEST), and for a read_committed Fetch of a tier that sees a
  transaction open at its end the transactions the broker aborted (a Fetch at its log start). Bounds asked are
  remembered a moment per connection (:class:`~rlm.listener.upstream.bounds.KnownBounds`): a Fetch whose every
  partition asks below a known log start is answered from the tier alone, the broker not asked (read_committed: when
  no tier sees a transaction open at its end), written field by field and handed to the socket as its parts, the
  tier's buffers not joined (:func:`~rlm.listener.protocol.codec.fetch_response_parts`); the answer to the Fetch the
  client will send next (the same partitions, each after the last record it got) is read from the tier meanwhile
  (:class:`Prefetched`), so a consumer reading history has the tier's read overlap its own work and the answer's
  trip. A Fetch whose bounds went stale (once a second) goes to the broker; when the broker answers every
  partition OFFSET_OUT_OF_RANGE below the log start it then gives, the answer is the tier's alone the same way (the
  answer read ahead used, written in parts), not the broker's decoded and encoded again.
- ListOffsets and OffsetForLeaderEpoch (SPLIT) are forwarded as bytes, their answers decoded and changed where the
  tier answers (their partitions' log start offsets asked too when the tier may answer, after the answer: the
  broker's answer to a timestamp or an epoch may be its log start as it was then).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import ssl
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, NamedTuple, Protocol

from prometheus_client import Counter

from rlm.listener.authz import READ
from rlm.listener.net.chunked import ChunkedAnswer, encode_streamed_response
from rlm.listener.net.principals import Client
from rlm.listener.protocol.apis import ApiKey
from rlm.listener.protocol.codec import (
    ErrorCode,
    decode_response,
    encode_response,
    fetch_answer,
    fetch_response_parts,
    fetch_sessionless,
    last_offset,
    produce_acks,
    produce_names_leaders,
)
from rlm.listener.protocol.frame import CORRELATION_ID, SIZE, BadRequestError, RequestHeader
from rlm.listener.routing import Route
from rlm.listener.tier.boundary import (
    BrokerBounds,
    Holes,
    epochs_below_log_start,
    fetch_below_log_start,
    fetch_from_tier,
    list_offsets_below_log_start,
    out_of_range,
    served_partitions,
)
from rlm.listener.tier.context import TierContext
from rlm.listener.tier.fetch import in_request_order
from rlm.listener.tier.held import Claim, HeldBlocks, budget_of
from rlm.listener.upstream.brokers import Upstream, UpstreamError
from rlm.listener.upstream.hosts import HostCheck
from rlm.listener.upstream.relay import Relay, Relayed
from rlm.listener.upstream.rewrite import PeerAddresses
from rlm.tier import StreamedBatch

__all__ = ["NO_SESSION_EPOCH", "Proxy"]



class Run(Protocol):
    """Runs a blocking function on the listener's workers: awaited (``run(fn, *args)``, an asyncio future), or not
    (``run.submit(fn, *args)``, a :class:`concurrent.futures.Future` that wakes no event loop when it completes:
    an answer read ahead is looked at only when the next Fetch comes)."""

    def __call__(self, fn: Callable[..., Any], *args: Any) -> Awaitable[Any]: ...

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]: ...


NO_SESSION_ID = 0
NO_SESSION_EPOCH = -1  # Kafka's FetchMetadata.FINAL_EPOCH with session id 0: a full fetch, no session made
BOUNDS_LIST_OFFSETS_VERSION = 5  # the ListOffsets the proxy asks its broker for bounds (the last non-flexible one)
ABORTED_FETCH_VERSION = 11  # the Fetch the proxy asks its broker for aborted transactions (topics by name)
EARLIEST, LATEST = -2, -1
INLINE_PRODUCE_CHECK_BYTES = 16384  # a Produce answer up to this size (~500 partitions) is checked on the event loop
INLINE_FETCH_WALK_PARTITIONS = 512  # a Fetch answer of up to this many partitions is walked on the event loop
PREFETCH_MAX_BYTES = 8 * 1024 * 1024  # an answer from the tier up to this size gets the next one read ahead
PREFETCHES_HELD = 8  # answers read ahead and not yet used or dropped, in the whole process (64 MiB at most)
PREFETCHES = Counter("rlm_history_proxy_prefetches", "As a proxy: answers from the tier read ahead for the Fetch a "
                     "client was expected to send next, by what became of them: used, or missed (another Fetch came)",
                     ["result"])
_PREFETCHES_USED, _PREFETCHES_MISSED = PREFETCHES.labels("used"), PREFETCHES.labels("missed")  # kept: once per Fetch
# An answer read ahead is read without its own READ check: it is used only once the Fetch it is for finds every
# topic of it readable (Proxy._still_readable), so the ACLs are looked up once an answer, not twice.
_READ_AHEAD = functools.partial(fetch_from_tier, checked_by_caller=True)


class Proxy:
    """What a proxying listener needs beyond the endpoint: where its broker is and who stands for each broker."""

    def __init__(self, ctx: TierContext, peers: PeerAddresses, upstream: str, *, timeout_s: float,
                 max_response_bytes: int, ssl_context: ssl.SSLContext | None = None) -> None:
        self.ctx = ctx
        self.peers = peers
        self.upstream = upstream
        self.ssl_context = ssl_context  # TLS to the broker (history_listener.upstream_tls)
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes
        self.holes = Holes()
        self.prefetched: weakref.WeakSet[Prefetched] = weakref.WeakSet()  # held by connections, not yet used
        self.held = HeldBlocks(budget_of(ctx))  # the block buffers they hold, within the block cache's budget
        self.hosts = HostCheck(ctx.authorizer)  # which clients' requests may be forwarded (host-based ACLs)

    def connection(self) -> Upstream:
        """A new client connection's connection to the broker (opened at its first request)."""
        return Upstream.of(self.upstream, timeout_s=self.timeout_s, max_response_bytes=self.max_response_bytes,
                           ssl_context=self.ssl_context)

    async def answer(self, route: Route, header: RequestHeader, frame: bytes, req: Any, client: Client,
                     upstream: Upstream, run: Run, room: Callable[[], int] | None = None
                     ) -> bytes | bytearray | ChunkedAnswer | Relayed | None:
        """The answer frame (size prefix included) to one client request, ``b""`` for none (Produce acks=0); a
        Fetch answer carrying a batch too large to hold is a :class:`ChunkedAnswer` (PDP-43: the batch read from the
        store and written a chunk at a time).
        ``req`` is the decoded request for SPLIT routes (None otherwise). ``room``: what is left of the listener's
        bound on queued answers (``queued_max_response_bytes``), read on the event loop: the tier's part of a Fetch
        answer carries no more records (at least one batch), and nothing is read ahead past half of it. Raises
        :class:`~rlm.listener.upstream.brokers.UpstreamError` when the broker fails the connection."""
        key = header.api_key
        if route is Route.FORWARD:
            return await upstream.forward(frame)
        if key == ApiKey.PRODUCE:
            return await self._produce(header, frame, upstream, run)
        if route is Route.REWRITE:
            answer = await upstream.request(frame)
            rewrite = {ApiKey.METADATA: self.peers.metadata, ApiKey.DESCRIBE_CLUSTER: self.peers.describe_cluster,
                       ApiKey.FIND_COORDINATOR: self.peers.find_coordinator}[key]
            return await run(_rewritten, answer, header, rewrite)
        if key == ApiKey.FETCH:
            return await self._fetch(header, frame, req, client, upstream, run, room)
        if key in (ApiKey.LIST_OFFSETS, ApiKey.OFFSET_FOR_LEADER_EPOCH):
            if key == ApiKey.LIST_OFFSETS:  # by timestamp: EARLIEST's answer is the broker's log start itself
                asked = _by_name((t.name, p.partition_index) for t in req.topics for p in t.partitions
                                 if p.timestamp >= 0)
                change = list_offsets_below_log_start
            else:
                asked = _by_name((t.topic, p.partition) for t in req.topics for p in t.partitions
                                 if p.leader_epoch >= 0)
                change = epochs_below_log_start
            answer = await upstream.request(frame)
            # The log start after the answer: at least the one the broker answered with (it only moves up), so an
            # answer past records retention or DeleteRecords deleted in between (a timestamp's first record, an
            # epoch's end: the broker's log start then) is seen below it, and the tier's used or asked again.
            starts = await self._log_starts(upstream, served_partitions(self.ctx, asked)) if asked else {}
            return await run(_rewritten, answer, header, lambda body: change(
                self.ctx, req, body, client, starts, self.holes))
        raise ValueError(f"api key {key} has no proxied route {route}")

    async def _fetch(self, header: RequestHeader, frame: bytes, req: Any, client: Client, upstream: Upstream,
                     run: Run, room: Callable[[], int] | None = None
                     ) -> bytes | bytearray | ChunkedAnswer | Relayed:
        """A Fetch forwarded as the client's bytes, asking for no session (:func:`fetch_sessionless`); the broker's
        answer walked (:func:`fetch_answer`), not decoded, and passed as its bytes unless a partition of a topic the
        tier serves is OFFSET_OUT_OF_RANGE (then decoded and split: the tier's part merged in) or it names leaders'
        addresses (v16+ ``node_endpoints``: decoded and those moved). A broker's answer with no fetch session asked
        says session id 0 already."""
        ahead, upstream.prefetched = upstream.prefetched, None
        known = self._known_below(req, upstream)
        if known is not None:  # every partition below the broker's log start as known: the tier alone
            tier = await self._tier_answer(header, req, client, known, upstream, run, room, ahead)
            if tier is not None:
                return tier
            ahead = None  # taken (used or missed)
        # cut through when the client's path held back the last large answer (rlm.listener.upstream.relay)
        relay = Relay(upstream.client, header) if upstream.client is not None and upstream.client_paced else None
        broker = f"{upstream.host}:{upstream.port}"
        try:
            framed = await upstream.forward(fetch_sessionless(frame, header), relay=relay)
            assert framed is not None
            answer = memoryview(framed)[SIZE.size:]
            walk = fetch_answer(answer, header, max_partitions=INLINE_FETCH_WALK_PARTITIONS)
            if walk is None:  # many partitions: walked on a worker
                walk = await run(fetch_answer, answer, header)
        except (UpstreamError, BadRequestError) as err:  # the broker's connection failed, or its answer is malformed
            if relay is not None:
                relay.abort(str(err), broker)  # part of the answer went: the client must not take the rest of another
            raise
        refused = self._served(walk.out_of_range()) if walk.error_code == ErrorCode.none.value else False
        if relay is not None and relay.sent:
            answer.release()
            if refused or walk.names_leaders:  # cannot be: such an answer has an error, never relayed
                why = "a Fetch answer sent on as it came needed a change once whole"
                relay.abort(why, broker)
                raise UpstreamError(why)
            return relay.finished(framed)
        if refused:
            return await self._split_fetch(header, bytes(answer), req, client, upstream, run, room, ahead)
        if walk.names_leaders:
            return await run(_rewritten, bytes(answer), header, self.peers.leaders)
        answer.release()
        return framed

    def _known_below(self, req: Any, upstream: Upstream) -> dict[tuple[Any, int], BrokerBounds] | None:
        """The known bounds (:class:`~rlm.listener.upstream.bounds.KnownBounds`) of every partition of ``req``,
        (topic key, partition) -> bounds, when each asks below its known log start (and they are few enough to
        look up on the event loop); else None."""
        out: dict[tuple[Any, int], BrokerBounds] = {}
        catalog = self.ctx.catalog
        for t in req.topics:
            name = getattr(t, "topic", None)
            key = name if name is not None else t.topic_id
            served = catalog.by_name(key) if name is not None else catalog.by_id(key)
            if served is None:
                return None
            for p in t.partitions:
                if len(out) >= INLINE_FETCH_WALK_PARTITIONS or p.partition not in served.partitions:
                    return None
                b = upstream.known.below(served.tp(p.partition), p.fetch_offset, stable=req.isolation_level == 1)
                if b is None:
                    return None
                out[(key, p.partition)] = b
        return out or None

    async def _tier_answer(self, header: RequestHeader, req: Any, client: Client,
                           known: dict[tuple[Any, int], BrokerBounds], upstream: Upstream, run: Run,
                           room: Callable[[], int] | None, ahead: Prefetched | None) -> ChunkedAnswer | None:
        """The answer to ``req`` from the tier alone (:func:`fetch_from_tier`; None: the broker must be asked), in
        parts: the tier's buffers as they are, a batch too large to hold read and written a chunk at a time (PDP-43,
        :func:`fetch_response_parts`). ``ahead``, the answer read ahead for it when the previous Fetch guessed it
        (:class:`Prefetched`), else read now. Then the next one is read ahead, on a worker, once this answer is
        handed to the socket (:class:`ChunkedAnswer` ``then``: the server calls it after the first writes of an
        answer up to 2 MiB, before a larger one's), while the client reads and parses it. Not before the writes, as
        until session 21: the worker's read (~0.4 ms of Python a 1 MiB answer) then held the GIL between the
        answer's writes (a ``sendfile`` or ``writev`` a part, each one taking the GIL back), and the answer reached
        the client later (``bench_proxy_fetch``, the client's clock, load 14-17: whole answer p50 2.1-3.8 ms against
        3.0-14.0, 4 rounds alternating)."""
        values: dict[str, Any] | None = None
        answer: ChunkedAnswer | None = None
        used = False
        if ahead is not None:
            order = _order(req)
            if ahead.shape == _shape(req, order) and self._still_readable(req, client):
                try:
                    done = ahead.values
                    got = done.result() if done.done() else await asyncio.wrap_future(done)
                    values, used = got.values, True
                    if values is not None:
                        answer = got.answer_to(header, order)
                        if answer is None:  # read for the same partitions, named in another order
                            values = in_request_order(values, req)
                except Exception:  # noqa: BLE001 - read again now, where an error is this request's
                    pass
            (_PREFETCHES_USED if used else _PREFETCHES_MISSED).inc()
        if not used:
            values = await run(fetch_from_tier, self.ctx, req, client, known, room() if room else None)
        if values is None:
            return None
        if answer is None:
            answer = ChunkedAnswer(*fetch_response_parts(header, values))
        left = room() if room else None  # the room now, before this answer is queued against it
        answer.then = functools.partial(self._read_ahead, header, req, values, client, upstream, run,
                                        None if left is None else lambda: left)
        return answer

    def _read_ahead(self, header: RequestHeader, req: Any, values: dict[str, Any], client: Client,
                    upstream: Upstream, run: Run, room: Callable[[], int] | None) -> None:
        """Start reading, on a worker, the answer to the Fetch the client will send next after ``values`` (the
        answer to ``req``: each partition's fetch offset after its last record), when every partition of it asks
        below a known log start, ``values`` carries at most :data:`PREFETCH_MAX_BYTES` of records and the listener
        has room (:class:`Prefetched`); its records held within the read-ahead budget (:mod:`rlm.listener.tier.held`:
        views of their blocks where those fit, else copied out, else not held: read again when the Fetch comes), and
        the answer encoded there too (:class:`ReadAhead`)."""
        nxt = _next_request(req, values)
        left = room() if room else None
        if nxt is not None and _answer_bytes(values) <= PREFETCH_MAX_BYTES and (left is None or
                                                                              left >= 2 * PREFETCH_MAX_BYTES):
            ahead_known = self._known_below(nxt, upstream)
            if ahead_known is not None and len(self.prefetched) < PREFETCHES_HELD and self.held.has_room():
                # not awaited: its completion wakes no event loop (an error is its use's)
                claim = self.held.claim()
                order = _order(nxt)
                future = run.submit(self._read_next, header, order, claim, nxt, client, ahead_known)
                upstream.prefetched = Prefetched(_shape(nxt, order), future, claim)
                self.prefetched.add(upstream.prefetched)

    def _read_next(self, header: RequestHeader, order: tuple[Any, ...], claim: Claim, nxt: Any, client: Client,
                   known: dict[tuple[Any, int], BrokerBounds]) -> ReadAhead:
        """The answer read ahead (on a worker): the tier's values for ``nxt``, held under ``claim``, and encoded as
        the answer to a request of ``header``'s version naming its partitions in ``order``."""
        values = self.held.read(claim, _READ_AHEAD, self.ctx, nxt, client, known, PREFETCH_MAX_BYTES)
        if values is None:
            return ReadAhead(None, header.api_version, order, None)
        return ReadAhead(values, header.api_version, order, fetch_response_parts(header, values))

    @staticmethod
    def _all_below(req: Any, bounds: dict[tuple[Any, int], BrokerBounds]
                   ) -> dict[tuple[Any, int], BrokerBounds] | None:
        """``bounds`` when every partition of ``req`` has its bounds there and asks below their log start (the
        broker answered each OFFSET_OUT_OF_RANGE there: the tier alone answers, :func:`fetch_from_tier`); else
        None."""
        n = 0
        for t in req.topics:
            key = name if (name := getattr(t, "topic", None)) is not None else t.topic_id
            for p in t.partitions:
                b = bounds.get((key, p.partition))
                if b is None or not 0 <= p.fetch_offset < b.log_start_offset:
                    return None
                n += 1
        return bounds if n else None

    def _still_readable(self, req: Any, client: Client) -> bool:
        """Whether the client's principal may still READ every topic of ``req`` (an answer read ahead was
        authorized when it was read; the ACLs may have changed since). On the event loop: the ACLs are cached, and
        the topics few (those :meth:`_known_below` looked up)."""
        names = set()
        for t in req.topics:
            name = getattr(t, "topic", None)
            if name is None:
                served = self.ctx.catalog.by_id(t.topic_id)
                if served is None:
                    return False
                name = served.name
            names.add(name)
        return self.ctx.allowed(client, READ, names) == names

    def _served(self, partitions: list[tuple[Any, int]]) -> bool:
        """Whether any of ``partitions`` ((topic name or id, partition)) is of a topic the tier serves."""
        catalog = self.ctx.catalog
        for key, _p in partitions:
            if (catalog.by_name(key) if isinstance(key, str) else catalog.by_id(key)) is not None:
                return True
        return False

    async def _split_fetch(self, header: RequestHeader, answer: bytes, req: Any, client: Client, upstream: Upstream,
                           run: Run, room: Callable[[], int] | None = None, ahead: Prefetched | None = None
                           ) -> bytes | ChunkedAnswer:
        """The broker's Fetch ``answer`` decoded, the partitions it answers OFFSET_OUT_OF_RANGE below its log start
        answered from the tier (:func:`fetch_below_log_start`), encoded again.

        When the broker answered every partition OFFSET_OUT_OF_RANGE below the log start it then gave (a history
        read whose known bounds went stale: once a second, :mod:`rlm.listener.upstream.bounds`), the answer is the
        tier's alone as for known bounds (:meth:`_tier_values`): ``ahead``, the answer read ahead for it, is used,
        and the answer is written in parts, not decoded into entities and encoded whole with its records (bench_proxy:
        9 of 232 history Fetches, each then read the tier again and dropped the answer read ahead)."""

        def decode() -> tuple[Any, dict[tuple[Any, int], str]]:
            body = decode_response(answer, header)
            return body, out_of_range(self.ctx, req, body)

        body, refused = await run(decode)
        known: dict[tuple[Any, int], BrokerBounds] = {}
        if req.isolation_level == 0 and refused:  # a log start known above the fetch offset needs no asking
            offsets = {(t.topic if getattr(t, "topic", None) is not None else t.topic_id, p.partition): p.fetch_offset
                       for t in req.topics for p in t.partitions}
            for k, name in refused.items():
                served = self.ctx.catalog.by_name(name)
                b = upstream.known.below(served.tp(k[1]), offsets[k]) if served is not None else None
                if b is not None:
                    known[k] = b
        rest = {k: name for k, name in refused.items() if k not in known}
        bounds, unbounded = (await self._bounds(upstream, rest, req.isolation_level, run) if rest else ({}, {}))
        bounds.update(known)
        if not unbounded and (tier_alone := self._all_below(req, bounds)) is not None:
            tier = await self._tier_answer(header, req, client, tier_alone, upstream, run, room, ahead)
            if tier is not None:
                return tier
        budget = room() if room else None

        def merge() -> tuple[bytes | ChunkedAnswer, Any]:
            merged = (fetch_below_log_start(self.ctx, req, body, client, bounds, self.holes, unbounded, budget)
                      if bounds or unbounded else body)
            framed = encode_streamed_response(self.peers.leaders(dataclasses.replace(merged, session_id=NO_SESSION_ID)),
                                              functools.partial(encode_response, header), flexible=header.flexible)
            return framed, merged

        framed, merged = await run(merge)
        if bounds:  # the tier answered: its next answer read ahead too (a Fetch the broker answered in part, or
            # whose tier answer needs the broker's word on its transactions)
            self._read_ahead(header, req, _records_of(merged), client, upstream, run, room)
        return framed

    async def _produce(self, header: RequestHeader, frame: bytes, upstream: Upstream, run: Run) -> bytes | bytearray:
        """A Produce forwarded as bytes; its answer as the broker's bytes unless it names leaders' addresses (v10+
        ``node_endpoints``, for partitions answered NOT_LEADER_OR_FOLLOWER): then decoded and those moved."""
        if produce_acks(frame, header) == 0:
            await upstream.request(frame, answered=False)
            return b""
        framed = await upstream.forward(frame)
        assert framed is not None
        answer = memoryview(framed)[SIZE.size:]
        names = (produce_names_leaders(answer, header) if len(answer) <= INLINE_PRODUCE_CHECK_BYTES
                 else await run(produce_names_leaders, answer, header))
        if names:
            return await run(_rewritten, bytes(answer), header, self.peers.leaders)
        answer.release()
        return framed

    async def _log_starts(self, upstream: Upstream, partitions: dict[str, list[int]]) -> dict[tuple[str, int], int]:
        """The broker's log start offset of ``partitions`` (topic -> partitions; none asked when empty)."""
        return await _list_offsets(upstream, partitions, EARLIEST, 0) if partitions else {}


    async def _bounds(self, upstream: Upstream, partitions: dict[tuple[Any, int], str], isolation: int, run: Run
                      ) -> tuple[dict[tuple[Any, int], BrokerBounds], dict[tuple[Any, int], ErrorCode]]:
        """The broker's log start offset, high watermark and last stable offset of ``partitions`` ((topic key,
        partition) -> topic name), by ListOffsets EARLIEST and LATEST on the client's connection to the broker; and
        apart, the partitions it answers with an error, with the (first) error: a broker that is not the
        partition's leader (NOT_LEADER_OR_FOLLOWER: a follower serves a consumer's Fetch, KIP-392, but not its
        ListOffsets) or a new leader whose high watermark has not caught up with its epoch's start
        (OFFSET_NOT_AVAILABLE, for a moment after a leadership move). For read_committed (``isolation`` 1), a
        partition whose tier sees a transaction open at its end while the broker's last stable offset is past its
        log start also gets the broker's aborted transactions there."""
        by_name = _by_name((name, p) for (_key, p), name in partitions.items())
        errors: dict[tuple[str, int], ErrorCode] = {}
        start = await _list_offsets(upstream, by_name, EARLIEST, 0, errors)
        end = await _list_offsets(upstream, by_name, LATEST, 0, errors)
        stable = await _list_offsets(upstream, by_name, LATEST, 1, errors) if isolation == 1 else end
        out = {}
        unbounded = {}
        for key, name in partitions.items():
            at = (name, key[1])
            if at in start and at in end and at in stable:
                out[key] = BrokerBounds(start[at], end[at], stable[at])
                served = self.ctx.catalog.by_name(name)
                if served is not None:
                    upstream.known.learn(served.tp(key[1]), out[key], stable=isolation == 1)
            else:  # not answered at all: as the broker says of an offset it cannot serve yet
                unbounded[key] = errors.get(at, ErrorCode.offset_not_available)
        if isolation == 1:
            unsure = await run(self._open_in_tier, {k: partitions[k] for k, b in out.items()
                                                    if b.last_stable_offset > b.log_start_offset})
            for k in unsure:
                aborted = await _aborted(upstream, partitions[k], k[1], out[k].log_start_offset)
                if aborted is not None:
                    out[k] = dataclasses.replace(out[k], aborted=aborted)
        return out, unbounded

    def _open_in_tier(self, partitions: dict[tuple[Any, int], str]) -> list[tuple[Any, int]]:
        """Those of ``partitions`` whose tier sees a transaction still open at its end (on a worker)."""
        out = []
        for key, name in partitions.items():
            served = self.ctx.catalog.by_name(name)
            pt = self.ctx.partition_tier(served.tp(key[1]), "fetch") if served is not None else None
            if pt is not None and pt.last_stable_offset < pt.high_watermark:
                out.append(key)
        return out


@dataclasses.dataclass(frozen=True, slots=True, weakref_slot=True)
class Prefetched:
    """An answer from the tier read ahead for the Fetch a client is expected to send next (one per connection, at
    most :data:`PREFETCHES_HELD` in the process, each of at most :data:`PREFETCH_MAX_BYTES` of records):
    the same partitions, sizes and isolation, each partition's fetch offset after the last record of the previous
    answer. Used only when the next Fetch has exactly that shape (:func:`_shape`) and still asks below known log
    starts; the tier's records never change, so the answer is the one reading it then would give (bounds a moment
    older). A guess missed costs the read (counted: ``rlm_history_proxy_prefetches_total{result}``)."""

    shape: tuple[Any, ...]
    values: concurrent.futures.Future[ReadAhead]
    claim: Claim  # the buffers its records hold, let go with it (rlm.listener.tier.held)


@dataclasses.dataclass(frozen=True, slots=True)
class ReadAhead:
    """What a worker read ahead (:class:`Prefetched`): the tier's values (None: the broker must be asked), and the
    answer encoded from them (:func:`fetch_response_parts`) for a request of ``api_version`` naming its partitions in
    ``order`` (:func:`_order`), its correlation id a placeholder: the event loop only puts the request's in
    (:meth:`answer_to`), where encoding it there took ~10% of its time a Fetch."""

    values: dict[str, Any] | None
    api_version: int
    order: tuple[Any, ...]
    encoded: tuple[list[Any], int] | None

    def answer_to(self, header: RequestHeader, order: tuple[Any, ...]) -> ChunkedAnswer | None:
        """The encoded answer with ``header``'s correlation id, when the request is of the version and names the
        partitions in the ``order`` it was encoded for; else None (encode :attr:`values` in the request's order)."""
        if self.encoded is None or header.api_version != self.api_version or order != self.order:
            return None
        parts, size = self.encoded
        first = parts[0]  # the size prefix, the correlation id, then the answer's first fields (one part)
        return ChunkedAnswer([first[:SIZE.size] + CORRELATION_ID.pack(header.correlation_id)
                              + first[SIZE.size + CORRELATION_ID.size:], *parts[1:]], size)


def _order(req: Any) -> tuple[Any, ...]:
    """A Fetch request's partitions in the order it names them: (topic key, partition, fetch offset, max bytes)."""
    return tuple((getattr(t, "topic", None) or t.topic_id, p.partition, p.fetch_offset, p.partition_max_bytes)
                 for t in req.topics for p in t.partitions)


def _shape(req: Any, order: tuple[Any, ...]) -> tuple[Any, ...]:
    """What an answer from the tier depends on in a Fetch request (``order``: its :func:`_order`): its partitions as
    a set, not a list (librdkafka starts each Fetch's list one partition further on, for fairness: an ordered shape
    never matched a consumer of several partitions; the answer read ahead is put in the request's order,
    :func:`in_request_order`). The first partition of the list read ahead may then not be the request's: the two
    answers differ only where a batch is larger than its partition's max bytes (it comes with the first partition
    only), and the client fetches it again."""
    return req.isolation_level, req.max_bytes, frozenset(order)


class _NextFetch(NamedTuple):
    """The Fetch a client is expected to send next (:func:`_next_request`): the fields of a kio request that the
    tier's fetch and the proxy read, made without kio's entities (``dataclasses.replace`` of each took ~8 us)."""

    isolation_level: int
    max_bytes: int
    topics: tuple[_NextTopic, ...]


class _NextTopic(NamedTuple):
    topic: str | None  # before v13
    topic_id: Any  # from v13
    partitions: tuple[_NextPartition, ...]


class _NextPartition(NamedTuple):
    partition: int
    fetch_offset: int
    partition_max_bytes: int


def _next_request(req: Any, values: dict[str, Any]) -> _NextFetch | None:
    """``req`` with each partition's fetch offset after the last record of its answer in ``values`` (unchanged
    without records); None when no partition got records (the client would not move on)."""
    after: dict[tuple[Any, int], int] = {}
    for t in values["responses"]:
        for p in t["partitions"]:
            records = p["records"]
            last = records.header.last_offset if isinstance(records, StreamedBatch) else last_offset(records)
            if last is not None:
                after[(t["topic"], p["partition_index"])] = after[(t["topic_id"], p["partition_index"])] = last + 1
    if not after:
        return None
    topics = []
    for t in req.topics:
        name = getattr(t, "topic", None)
        key = name or t.topic_id
        topics.append(_NextTopic(name, getattr(t, "topic_id", None), tuple(
            _NextPartition(p.partition, after.get((key, p.partition), p.fetch_offset), p.partition_max_bytes)
            for p in t.partitions)))
    return _NextFetch(req.isolation_level, req.max_bytes, tuple(topics))


def _records_of(resp: Any) -> dict[str, Any]:
    """A Fetch answer (kio entity) as the response values :func:`_next_request` and :func:`_answer_bytes` read."""
    return {"responses": [{"topic": getattr(t, "topic", None), "topic_id": getattr(t, "topic_id", None),
                           "partitions": [{"partition_index": p.partition_index, "records": p.records}
                                          for p in t.partitions]} for t in resp.responses]}


def _answer_bytes(values: dict[str, Any]) -> int:
    return sum(len(p["records"] or b"") for t in values["responses"] for p in t["partitions"])


def _by_name(partitions: Iterable[tuple[str, int]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for name, p in partitions:
        if p not in out.setdefault(name, []):
            out[name].append(p)
    return out


async def _list_offsets(upstream: Upstream, by_name: dict[str, list[int]], timestamp: int, isolation_level: int,
                        errors: dict[tuple[str, int], ErrorCode] | None = None) -> dict[tuple[str, int], int]:
    """The broker's ListOffsets answer at ``timestamp`` for ``by_name`` (topic -> partitions), the partitions it
    answers without an error: (topic, partition) -> offset; the others' errors into ``errors`` (the first kept)."""
    body = await upstream.ask(ApiKey.LIST_OFFSETS, BOUNDS_LIST_OFFSETS_VERSION, {
        "replica_id": -1, "isolation_level": isolation_level, "topics": [
            {"name": name, "partitions": [{"partition_index": p, "current_leader_epoch": -1,
                                           "timestamp": timestamp} for p in parts]}
            for name, parts in by_name.items()]})
    if errors is not None:
        for t in body.topics:
            for p in t.partitions:
                if p.error_code != ErrorCode.none:
                    errors.setdefault((t.name, p.partition_index), ErrorCode(p.error_code))
    return {(t.name, p.partition_index): p.offset for t in body.topics for p in t.partitions
            if p.error_code == ErrorCode.none}


async def _aborted(upstream: Upstream, topic: str, partition: int, log_start_offset: int
                   ) -> tuple[tuple[int, int], ...] | None:
    """The transactions the broker aborted that cover its log start, ``(producer id, first offset)``: its answer to a
    read_committed Fetch there (one batch: the first partition of an answer always gets one, KIP-74), whose aborted
    transactions are those overlapping what it read. None when it answers with an error."""
    body = await upstream.ask(ApiKey.FETCH, ABORTED_FETCH_VERSION, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1, "isolation_level": 1, "session_id": 0,
        "session_epoch": NO_SESSION_EPOCH, "rack_id": "", "topics": [{"topic": topic, "partitions": [
            {"partition": partition, "fetch_offset": log_start_offset, "current_leader_epoch": -1,
             "log_start_offset": -1, "partition_max_bytes": 1}]}]})
    for t in body.responses:
        for p in t.partitions:
            if p.partition_index == partition and p.error_code == ErrorCode.none:
                return tuple((int(a.producer_id), int(a.first_offset)) for a in p.aborted_transactions or ())
    return None


def _rewritten(answer: bytes | None, header: RequestHeader, change: Callable[[Any], Any]) -> bytes:
    """The broker's answer decoded, changed and encoded again (on a worker)."""
    assert answer is not None
    return encode_response(header, change(decode_response(answer, header)))
