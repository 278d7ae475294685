"""The one routing table of the listener: for each api key, who answers it, as the history endpoint and as a proxy.

=============  ===================================================================================================
route          meaning
=============  ===================================================================================================
``HERE``       answered by the listener itself: from the tier (:mod:`rlm.listener.tier`), or about itself
               (ApiVersions; as a proxy, the intersection of its versions and the broker's)
``FORWARD``    to the broker and back as bytes, only the correlation id mapped (:mod:`rlm.listener.upstream`)
``REWRITE``    forwarded; the broker addresses in the answer replaced by the sidecars' in front of them (a Produce
               answer only when it names any: v10+ with ``node_endpoints``; else its bytes pass as FORWARD's)
``SPLIT``      forwarded; what lies below the broker's log start answered from the tier and merged into the
               broker's answer in the client's order (:mod:`rlm.listener.tier.boundary`)
``SASL``       as a proxy whose clients authenticate (``history_listener.sasl``): passed through to the broker on the
               client's own connection by its SASL session, so the broker authenticates the client
               (:class:`rlm.listener.net.sasl.PassThroughSession`); not offered without ``sasl``
``REFUSED``    not offered: UNSUPPORTED_VERSION
=============  ===================================================================================================

As a proxy, every api key the broker offers and the table does not name is forwarded, at the broker's versions; the
keys the listener decodes (HERE, REWRITE, SPLIT) are offered at the versions both it and the broker speak. Fetch
sessions (KIP-227) are declined the way a broker may decline them: forwarded Fetches ask for no session (session id
0, epoch -1, a full fetch) and every answer says session id 0, so clients send full fetches; a partition's answer can
then come from the tier or the broker, request by request, with no session state to keep in step.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable
from typing import Any

from rlm.listener.net.principals import Client
from rlm.listener.protocol.apis import API_KEYS, PROXY_API_KEYS, SASL_API_KEYS, ApiKey
from rlm.listener.protocol.codec import ErrorCode
from rlm.listener.tier.context import TierContext
from rlm.listener.tier.fetch import fetch
from rlm.listener.tier.node import NodeAnswers
from rlm.listener.tier.offsets import list_offsets

__all__ = ["NOT_NAMED", "ROUTES", "Answer", "Route", "Router"]


class Route(enum.StrEnum):
    HERE = "here"
    FORWARD = "forward"
    REWRITE = "rewrite"
    SPLIT = "split"
    SASL = "sasl"
    REFUSED = "refused"


H, F, W, S, A, R = Route.HERE, Route.FORWARD, Route.REWRITE, Route.SPLIT, Route.SASL, Route.REFUSED
# api key: (as the history endpoint, as a proxy)
ROUTES: dict[int, tuple[Route, Route]] = {
    ApiKey.API_VERSIONS: (H, H),
    ApiKey.SASL_HANDSHAKE: (H, A),  # a proxy passes SASL through: the broker authenticates the client
    ApiKey.SASL_AUTHENTICATE: (H, A),
    ApiKey.METADATA: (H, W),
    ApiKey.DESCRIBE_CLUSTER: (H, W),
    ApiKey.FIND_COORDINATOR: (H, W),
    ApiKey.LIST_OFFSETS: (H, S),  # EARLIEST and timestamps below the broker's log start: the tier's
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (R, S),  # epochs that ended below the broker's log start: the tier's lineage
    ApiKey.FETCH: (H, S),  # partitions below the broker's log start: the tier's
    ApiKey.PRODUCE: (H, W),  # the endpoint refuses it (read-only); a proxy forwards it, new leaders' addresses moved
    ApiKey.SHARE_FETCH: (R, R),  # answers name leaders' addresses (not rewritten yet)
    ApiKey.SHARE_ACKNOWLEDGE: (R, R),
}
NOT_NAMED = (R, F)
# Produce is offered at the broker's versions (those kio knows: PROXY_API_KEYS), so its finalized features pass as
# they are: Transactions V2 (KIP-890, transaction.version 2) needs Produce v12+, which a broker finalizing it serves.

Answer = Callable[[Any, Client], dict[str, Any] | None]  # (decoded request, client) -> response values, or none


class Router:
    """The table applied to one listener: the versions it offers and the answer of each api key served here
    (ApiVersions is answered by the server on its event loop, Fetch through its long polls: :meth:`fetch`).
    ``proxy`` is set when the listener proxies its broker (:class:`rlm.listener.upstream.proxy.Proxy`)."""

    def __init__(self, ctx: TierContext, node: NodeAnswers, *, proxy: Any = None) -> None:
        self.ctx = ctx
        self.node = node
        self.proxy = proxy
        self.offered: dict[int, tuple[int, int]] = {**API_KEYS, **(SASL_API_KEYS if node.sasl else {})}
        self._here: dict[int, Answer] = {
            ApiKey.PRODUCE: node.produce, ApiKey.METADATA: node.metadata,
            ApiKey.DESCRIBE_CLUSTER: node.describe_cluster, ApiKey.FIND_COORDINATOR: node.find_coordinator,
            ApiKey.LIST_OFFSETS: functools.partial(list_offsets, ctx)}
        self._versions_of: tuple[object, dict[int, tuple[int, int]]] | None = None  # (broker's dict, offered)

    def route(self, api_key: int) -> Route:
        return ROUTES.get(api_key, NOT_NAMED)[1 if self.proxy is not None else 0]

    def versions(self, broker: dict[int, tuple[int, int]] | None = None) -> dict[int, tuple[int, int]]:
        """api key -> (min, max) versions offered: as the endpoint, :attr:`offered`; as a proxy, from the broker's
        (``broker``) by the table, computed once per broker answer (asked once per upstream connection; every
        request of a proxy's clients asks for it: bench_proxy's profile had it at 4% of the proxy's CPU)."""
        if self.proxy is None:
            return self.offered
        memo = self._versions_of
        if memo is not None and memo[0] is broker:
            return memo[1]
        out: dict[int, tuple[int, int]] = {}
        for key, (lo, hi) in (broker or {}).items():
            route = self.route(key)
            if route is Route.REFUSED or (route is Route.SASL and not self.node.sasl):
                continue
            if route is Route.SASL:
                lo, hi = max(lo, SASL_API_KEYS[key][0]), min(hi, SASL_API_KEYS[key][1])
            elif route is not Route.FORWARD:
                ours = PROXY_API_KEYS.get(key) or API_KEYS.get(key)
                if ours is None:
                    continue
                lo, hi = max(lo, ours[0]), min(hi, ours[1])
            if lo <= hi:
                out[key] = (lo, hi)
        if broker is not None:
            self._versions_of = (broker, out)
        return out

    def api_versions(self, error: ErrorCode = ErrorCode.none, *, broker: Any = None) -> dict[str, Any]:
        """The ApiVersions answer: as a proxy, the broker's (its features) with the versions of :meth:`versions`."""
        if self.proxy is None:
            return self.node.api_versions(error)
        values = dataclasses.asdict(broker)
        values["error_code"] = error
        offered = self.versions({int(k.api_key): (int(k.min_version), int(k.max_version)) for k in broker.api_keys})
        values["api_keys"] = [{"api_key": k, "min_version": lo, "max_version": hi}
                              for k, (lo, hi) in sorted(offered.items())]
        return values

    def answer(self, api_key: int) -> Answer:
        """The answer of an api key served here (not ApiVersions, Fetch or SASL's)."""
        return self._here[api_key]

    def fetch(self, req: Any, client: Client, *, budget: int | None = None) -> tuple[dict[str, Any], int]:
        return fetch(self.ctx, req, client, budget=budget)
