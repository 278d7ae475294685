"""The proxied routes (:mod:`rlm.listener.routing`): a client request forwarded to the broker, and the broker's
answer brought back, rewritten (broker addresses) or split (the tier's part merged in) on the way.

FORWARD keeps the bytes (only the correlation id is mapped, :class:`~rlm.listener.upstream.brokers.Upstream`): the
request is not even decoded, so any version the broker speaks passes. A Produce with ``acks=0`` gets no answer, from
the broker or from us. REWRITE and SPLIT decode the broker's answer (kio) on a worker, change it and encode it
again; SPLIT also forwards a Fetch that asks for no fetch session (see the routing module).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from rlm.listener.net.principals import Client
from rlm.listener.protocol.apis import ApiKey
from rlm.listener.protocol.codec import ErrorCode, decode_response, encode_request, encode_response, produce_acks
from rlm.listener.protocol.frame import SIZE, RequestHeader
from rlm.listener.routing import Route
from rlm.listener.tier.boundary import BrokerBounds, earliest_below_log_start, fetch_below_log_start, out_of_range
from rlm.listener.tier.context import TierContext
from rlm.listener.upstream.brokers import Upstream
from rlm.listener.upstream.rewrite import PeerAddresses

__all__ = ["NO_SESSION_EPOCH", "Proxy"]

Run = Callable[..., Awaitable[Any]]  # runs a blocking function on the listener's workers
NO_SESSION_ID = 0
NO_SESSION_EPOCH = -1  # Kafka's FetchMetadata.FINAL_EPOCH with session id 0: a full fetch, no session made
BOUNDS_LIST_OFFSETS_VERSION = 5  # the ListOffsets the proxy asks its broker for bounds (the last non-flexible one)
EARLIEST, LATEST = -2, -1


class Proxy:
    """What a proxying listener needs beyond the endpoint: where its broker is and who stands for each broker."""

    def __init__(self, ctx: TierContext, peers: PeerAddresses, upstream: str, *, timeout_s: float,
                 max_response_bytes: int) -> None:
        self.ctx = ctx
        self.peers = peers
        self.upstream = upstream
        self.timeout_s = timeout_s
        self.max_response_bytes = max_response_bytes

    def connection(self) -> Upstream:
        """A new client connection's connection to the broker (opened at its first request)."""
        return Upstream.of(self.upstream, timeout_s=self.timeout_s, max_response_bytes=self.max_response_bytes)

    async def answer(self, route: Route, header: RequestHeader, frame: bytes, req: Any, client: Client,
                     upstream: Upstream, run: Run) -> bytes | None:
        """The answer frame (size prefix included) to one client request, ``b""`` for none (Produce acks=0).
        ``req`` is the decoded request for SPLIT routes (None otherwise). Raises
        :class:`~rlm.listener.upstream.brokers.UpstreamError` when the broker fails the connection."""
        key = header.api_key
        if route is Route.FORWARD:
            if key == ApiKey.PRODUCE and produce_acks(frame, header) == 0:
                await upstream.request(frame, answered=False)
                return b""
            answer = await upstream.request(frame)
            assert answer is not None
            return SIZE.pack(len(answer)) + answer
        if route is Route.REWRITE:
            answer = await upstream.request(frame)
            rewrite = {ApiKey.METADATA: self.peers.metadata, ApiKey.DESCRIBE_CLUSTER: self.peers.describe_cluster,
                       ApiKey.FIND_COORDINATOR: self.peers.find_coordinator}[key]
            return await run(_rewritten, answer, header, rewrite)
        if key == ApiKey.FETCH:
            sessionless = dataclasses.replace(req, session_id=NO_SESSION_ID, session_epoch=NO_SESSION_EPOCH)
            forwarded = await run(encode_request, frame, header, sessionless)
            answer = await upstream.request(forwarded[SIZE.size:])

            def decode() -> tuple[Any, dict[tuple[Any, int], str]]:
                body = decode_response(answer, header)
                return body, out_of_range(self.ctx, req, body)

            body, refused = await run(decode)
            bounds = await self._bounds(upstream, refused, req.isolation_level) if refused else {}

            def merge() -> bytes:
                merged = fetch_below_log_start(self.ctx, req, body, client, bounds) if bounds else body
                return encode_response(header, self.peers.fetch(dataclasses.replace(merged, session_id=NO_SESSION_ID)))

            return await run(merge)
        if key == ApiKey.LIST_OFFSETS:
            answer = await upstream.request(frame)
            return await run(_rewritten, answer, header,
                             lambda body: earliest_below_log_start(self.ctx, req, body, client))
        raise ValueError(f"api key {key} has no proxied route {route}")


    async def _bounds(self, upstream: Upstream, partitions: dict[tuple[Any, int], str], isolation: int
                      ) -> dict[tuple[Any, int], BrokerBounds]:
        """The broker's log start offset, high watermark and last stable offset of ``partitions`` ((topic key,
        partition) -> topic name), by ListOffsets EARLIEST and LATEST on the client's connection to the broker; a
        partition the broker answers with an error is left out (the tier then answers nothing for it)."""
        by_name: dict[str, list[int]] = {}
        for (_key, p), name in partitions.items():
            by_name.setdefault(name, []).append(p)

        async def ask(timestamp: int, isolation_level: int) -> dict[tuple[str, int], int]:
            body = await upstream.ask(ApiKey.LIST_OFFSETS, BOUNDS_LIST_OFFSETS_VERSION, {
                "replica_id": -1, "isolation_level": isolation_level, "topics": [
                    {"name": name, "partitions": [{"partition_index": p, "current_leader_epoch": -1,
                                                   "timestamp": timestamp} for p in parts]}
                    for name, parts in by_name.items()]})
            return {(t.name, p.partition_index): p.offset for t in body.topics for p in t.partitions
                    if p.error_code == ErrorCode.none}

        start, end = await ask(EARLIEST, 0), await ask(LATEST, 0)
        stable = await ask(LATEST, 1) if isolation == 1 else end
        out = {}
        for key, name in partitions.items():
            at = (name, key[1])
            if at in start and at in end and at in stable:
                out[key] = BrokerBounds(start[at], end[at], stable[at])
        return out


def _rewritten(answer: bytes | None, header: RequestHeader, change: Callable[[Any], Any]) -> bytes:
    """The broker's answer decoded, changed and encoded again (on a worker)."""
    assert answer is not None
    return encode_response(header, change(decode_response(answer, header)))
