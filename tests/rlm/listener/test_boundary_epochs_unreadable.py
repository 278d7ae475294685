"""OffsetForLeaderEpoch through the proxy where the tier cannot be read (:func:`rlm.listener.tier.boundary.
epochs_below_log_start`): fast tests of the decision, the tier, the catalog and the authorizer stood in for, the
listener's own :class:`rlm.listener.tier.context.TierContext` counting and logging. The real broker with a copy
corrupted on the filesystem store: ``test_proxy_offsets_unreadable.py``.

The tier's lineage: E0 from 0, E3 from 40 (E0 ended at 40), its high watermark 80; the broker's log start is 50 and
its checkpoint begins at E3 (its start raised to 50): Kafka answers E0 with its log start, (0, 50), not where E0 ended.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from prometheus_client import REGISTRY

from rlm.listener.net.principals import Client
from rlm.listener.protocol.codec import ErrorCode, build
from rlm.listener.tier.boundary import Holes, epochs_below_log_start
from rlm.listener.tier.catalog import ServedTopic
from rlm.listener.tier.context import TierContext
from rlm.tier import Lineage, UnreadableCopyError
from rlmm.api import TopicIdPartition
from rsm.errors import CorruptRemoteObjectError

TOPIC = "t"
LOG_START = 50  # the broker's
STORAGE_ERROR = (ErrorCode.kafka_storage_error, -1, -1)


class _Tier:
    """A tier view (:class:`rlm.tier.TierView`'s methods the decision calls) whose bounds raise
    :class:`UnreadableCopyError` while ``fail`` (its newest copy's producer snapshot corrupt); ``reads`` counts them."""

    def __init__(self) -> None:
        self.fail = False
        self.reads = 0

    def ready(self, tp: TopicIdPartition) -> bool:
        return True

    def partition(self, tp: TopicIdPartition) -> Any:
        self.reads += 1
        if self.fail:
            raise UnreadableCopyError(tp, None, CorruptRemoteObjectError(
                "producer snapshot", key=f"{tp.partition}/00000000000000000040-index", position=0))
        return SimpleNamespace(tp=tp, lineage=Lineage(((0, 0), (3, 40))), high_watermark=80)


def _ctx(tier: _Tier) -> TierContext:
    served = ServedTopic(TOPIC, uuid.uuid4(), (0, 1, 2))
    catalog = SimpleNamespace(by_name=lambda name: served if name == TOPIC else None)
    authorizer = SimpleNamespace(allowed=lambda principal, host, op, names: set(names))
    return TierContext(catalog, tier, authorizer)  # type: ignore[arg-type]


def _answers(ctx: TierContext, asked: dict[int, int], broker: dict[int, tuple[int, int, int]]
             ) -> dict[int, tuple[int, int, int]]:
    """The proxy's answer, partition -> (error code, leader epoch, end offset), to a request for ``asked``
    (partition -> epoch) the broker answered ``broker`` (partition -> (error, epoch, end offset)), its log start 50,
    ``hole_confirm_ms`` 0."""
    req = build(load_request_schema(23, 4), {"replica_id": -1, "topics": [{"topic": TOPIC, "partitions": [
        {"partition": p, "current_leader_epoch": 6, "leader_epoch": e} for p, e in asked.items()]}]})
    resp = build(load_response_schema(23, 4), {"throttle_time_ms": 0, "topics": [{"topic": TOPIC, "partitions": [
        {"error_code": c, "partition": p, "leader_epoch": e, "end_offset": o} for p, (c, e, o) in broker.items()]}]})
    out = epochs_below_log_start(ctx, req, resp, Client("User:a", "127.0.0.1"),
                                 {(TOPIC, p): LOG_START for p in broker}, Holes())  # confirm_s 0
    (t,) = out.topics
    return {p.partition: (p.error_code, p.leader_epoch, p.end_offset) for p in t.partitions}


def _unreadable_count() -> float:
    return REGISTRY.get_sample_value("rlm_history_unreadable_copies_total", {"api": "offset_for_leader_epoch"}) or 0.0


def test_an_epoch_the_broker_answers_with_its_log_start_is_a_storage_error_while_the_tier_cannot_be_read(
        caplog: pytest.LogCaptureFixture) -> None:
    """E0, which the broker answers with its log start (0, 50), and E7, which it answers undefined (-1, -1), while
    the tier's bounds cannot be read: KAFKA_STORAGE_ERROR, which both client families retry, as a Fetch there. Before,
    the tier was taken for empty, 0..49 a hole at once (``hole_confirm_ms`` 0), and the broker's (0, 50) went out: a
    consumer at (43, E0) passed validation and read from 43, 40..42 of E3 never. Counted per answer, logged once per
    copy. Readable again: E0 ended at 40 (the tier's), E7 the broker's (the lineage has nothing above it)."""
    tier = _Tier()
    ctx = _ctx(tier)
    tier.fail = True
    before = _unreadable_count()
    asked, broker = {0: 0, 1: 7}, {0: (0, 0, LOG_START), 1: (0, -1, -1)}
    assert _answers(ctx, asked, broker) == {0: STORAGE_ERROR, 1: STORAGE_ERROR}
    assert _answers(ctx, asked, broker) == {0: STORAGE_ERROR, 1: STORAGE_ERROR}
    assert _unreadable_count() == before + 4
    assert len([r for r in caplog.records if "remote copy cannot be read" in r.getMessage()]) == 2  # one a copy
    tier.fail = False
    assert _answers(ctx, asked, broker) == {0: (0, 0, 40), 1: (0, -1, -1)}


def test_an_answer_from_the_brokers_checkpoint_reads_no_tier() -> None:
    """E3 answered (3, 60) and E5 (5, 70), end offsets above the broker's log start (from its checkpoint: exact, as
    the tier's lineage would say) and a broker's error: the broker's answers while the tier cannot be read, the tier
    not read at all (a consumer at the head validating its position does not wait on a corrupt copy)."""
    tier = _Tier()
    tier.fail = True
    nl = ErrorCode.not_leader_or_follower.value
    broker = {0: (0, 3, 60), 1: (0, 5, 70), 2: (nl, -1, -1)}
    assert _answers(_ctx(tier), {0: 3, 1: 5, 2: 0}, broker) == broker
    assert tier.reads == 0
