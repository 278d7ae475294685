"""The listener's real server over a stub tier, no broker: one served topic (``SERVED``, one partition, nothing in
it), every client allowed. For the tests of the server itself (framing, large requests, memory held, log limits)
over real sockets: they need no topic or only its name in Metadata."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from rlm.config import HistorySaslSettings
from rlm.listener.net.sasl import SaslAuthenticator
from rlm.listener.net.server import ConnectionLimits, ListenerServer
from rlm.listener.routing import Router
from rlm.listener.tier.catalog import ServedTopic
from rlm.listener.tier.context import TierContext
from rlm.listener.tier.node import NodeAnswers, NodeInfo

__all__ = ["SERVED", "AllowAll", "StubCatalog", "StubTier", "serving"]

SERVED = ServedTopic("served", uuid.UUID(int=1), (0,))


class StubCatalog:
    def topics(self) -> dict[str, ServedTopic]:
        return {SERVED.name: SERVED}

    def by_name(self, name: str) -> ServedTopic | None:
        return SERVED if name == SERVED.name else None

    def by_id(self, topic_id: Any) -> ServedTopic | None:
        return SERVED if topic_id == SERVED.topic_id else None


class StubTier:
    def partition(self, tp: Any) -> None:
        return None


class AllowAll:
    def allowed(self, principal: str, host: str, operation: str, topics: Any) -> set[str]:
        return set(topics)


@contextmanager
def serving(limits: ConnectionLimits | None = None,
            sasl: HistorySaslSettings | None = None) -> Iterator[ListenerServer]:
    """The server started on a free port of 127.0.0.1 (``limits``: the server's defaults when None; ``sasl``: its
    SASL users, none when None), stopped on exit."""
    ctx = TierContext(StubCatalog(), StubTier(), AllowAll())  # type: ignore[arg-type]
    factory = SaslAuthenticator(sasl, failed_authentication_delay_s=0).session if sasl is not None else None
    srv = ListenerServer(Router(ctx, NodeAnswers(ctx, NodeInfo(1, "127.0.0.1", 0, "c"))), "127.0.0.1", 0,
                         limits=limits, session_factory=factory).start()
    try:
        yield srv
    finally:
        srv.stop()
