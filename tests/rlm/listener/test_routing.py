"""The routing table's versions as a proxy: what the broker offers, by the table, computed once per broker answer."""

from __future__ import annotations

from typing import Any

from rlm.listener.protocol.apis import ApiKey
from rlm.listener.routing import Router
from rlm.listener.tier.context import TierContext
from rlm.listener.tier.node import NodeAnswers, NodeInfo


def _router() -> Router:
    ctx: Any = TierContext(None, None, None)  # type: ignore[arg-type]
    return Router(ctx, NodeAnswers(ctx, NodeInfo(1, "127.0.0.1", 0, "c")), proxy=object())


def test_versions_follow_the_broker_and_are_computed_once_per_broker_answer() -> None:
    router = _router()
    broker = {ApiKey.FETCH: (4, 18), ApiKey.SHARE_FETCH: (0, 1), 50: (0, 3)}
    offered = router.versions(broker)
    assert offered[50] == (0, 3)  # not named: forwarded at the broker's versions
    assert ApiKey.SHARE_FETCH not in offered  # refused
    assert 4 <= offered[ApiKey.FETCH][0] <= offered[ApiKey.FETCH][1] <= 18  # ours within the broker's
    assert router.versions(broker) is offered  # the same answer: not computed again per request
    restarted = {**broker, 50: (0, 2)}  # a reconnection asks the broker again: a new answer
    again = router.versions(restarted)
    assert again is not offered and again[50] == (0, 2)
