"""The one routing table of the listener: for each api key, who answers it.

========================  =====================================================================================
route                     meaning
========================  =====================================================================================
``HERE``                  answered by the listener itself: from the tier (:mod:`rlm.listener.tier`), or about
                          itself (ApiVersions, SASL)
========================  =====================================================================================

An api key the table does not name is not offered: its requests get UNSUPPORTED_VERSION.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from typing import Any

from rlm.listener.net.principals import Client
from rlm.listener.protocol.apis import API_KEYS, SASL_API_KEYS, ApiKey
from rlm.listener.tier.context import TierContext
from rlm.listener.tier.fetch import fetch
from rlm.listener.tier.node import NodeAnswers
from rlm.listener.tier.offsets import list_offsets

__all__ = ["ROUTES", "Answer", "Route", "Router"]


class Route(enum.StrEnum):
    HERE = "here"


ROUTES: dict[int, Route] = {
    ApiKey.API_VERSIONS: Route.HERE,
    ApiKey.SASL_HANDSHAKE: Route.HERE,
    ApiKey.SASL_AUTHENTICATE: Route.HERE,
    ApiKey.METADATA: Route.HERE,
    ApiKey.DESCRIBE_CLUSTER: Route.HERE,
    ApiKey.FIND_COORDINATOR: Route.HERE,
    ApiKey.LIST_OFFSETS: Route.HERE,
    ApiKey.FETCH: Route.HERE,
    ApiKey.PRODUCE: Route.HERE,
}

Answer = Callable[[Any, Client], dict[str, Any] | None]  # (decoded request, client) -> response values, or none


class Router:
    """The table applied to one listener: the versions it offers and the answer of each api key served here
    (ApiVersions is answered by the server on its event loop, Fetch through its long polls: :meth:`fetch`)."""

    def __init__(self, ctx: TierContext, node: NodeAnswers) -> None:
        self.ctx = ctx
        self.node = node
        self.offered: dict[int, tuple[int, int]] = {**API_KEYS, **(SASL_API_KEYS if node.sasl else {})}
        self._here: dict[int, Answer] = {
            ApiKey.PRODUCE: node.produce, ApiKey.METADATA: node.metadata,
            ApiKey.DESCRIBE_CLUSTER: node.describe_cluster, ApiKey.FIND_COORDINATOR: node.find_coordinator,
            ApiKey.LIST_OFFSETS: functools.partial(list_offsets, ctx)}

    def route(self, api_key: int) -> Route | None:
        return ROUTES.get(api_key) if api_key in self.offered else None

    def answer(self, api_key: int) -> Answer:
        """The answer of an api key served here (not ApiVersions, Fetch or SASL's)."""
        return self._here[api_key]

    def fetch(self, req: Any, client: Client, *, budget: int | None = None) -> tuple[dict[str, Any], int]:
        return fetch(self.ctx, req, client, budget=budget)
