"""ListOffsets answered from the tier: earliest, latest, by timestamp, max timestamp and latest tiered.

Each answer names the leader epoch of the offset it gives (the tier's, as a broker does). A topic the client may not
DESCRIBE is TOPIC_AUTHORIZATION_FAILED; a partition whose copy cannot be read is KAFKA_STORAGE_ERROR.
"""

from __future__ import annotations

from typing import Any

from rlm.listener.authz import DESCRIBE
from rlm.listener.net.principals import Client
from rlm.listener.protocol.codec import ErrorCode
from rlm.listener.tier.catalog import ServedTopic
from rlm.listener.tier.context import TierContext
from rlm.tier import Isolation, UnreadableCopyError

__all__ = ["EARLIEST", "EARLIEST_LOCAL", "LATEST", "LATEST_TIERED", "MAX_TIMESTAMP", "list_offsets", "offset_of"]

EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -2, -1, -3, -4, -5


def list_offsets(ctx: TierContext, req: Any, client: Client) -> dict[str, Any]:
    """The ListOffsets response for ``req``, every partition from the tier."""
    isolation = Isolation.from_id(getattr(req, "isolation_level", 0))
    ok = ctx.allowed(client, DESCRIBE, {t.name for t in req.topics})
    out = []
    for t in req.topics:
        topic = ctx.catalog.by_name(t.name)
        parts = []
        for p in t.partitions:
            answer = {"partition_index": p.partition_index, "error_code": ErrorCode.none, "timestamp": -1,
                      "offset": -1, "leader_epoch": -1}
            if t.name not in ok:
                answer["error_code"] = ErrorCode.topic_authorization_failed
            elif topic is None or p.partition_index not in topic.partitions:
                answer["error_code"] = ErrorCode.unknown_topic_or_partition
            else:
                try:
                    answer.update(offset_of(ctx, topic, p.partition_index, p.timestamp, isolation))
                except UnreadableCopyError as err:
                    answer["error_code"] = ctx.unreadable(err, "list_offsets")
            parts.append(answer)
        out.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": out}


def offset_of(ctx: TierContext, topic: ServedTopic, partition: int, ts: int, isolation: Isolation
              ) -> dict[str, Any]:
    """One partition's answer to timestamp ``ts`` (or a special offset: EARLIEST, LATEST ...) from the tier."""
    tp = topic.tp(partition)
    tier = ctx.tier.partition(tp)
    if tier is None:
        return {"error_code": ErrorCode.offset_not_available}
    end = tier.end_offset(isolation)  # what the client may fetch: below the LSO for read_committed
    if ts == LATEST:
        return {"offset": end, "leader_epoch": tier.latest_epoch}
    if ts in (EARLIEST, EARLIEST_LOCAL):
        return {"offset": tier.log_start_offset, "leader_epoch": tier.epoch_of(tier.log_start_offset)}
    if ts == LATEST_TIERED:
        off = tier.high_watermark - 1
        if off >= end:
            return {}
        return {"offset": off, "leader_epoch": tier.epoch_of(off)}
    if ts == MAX_TIMESTAMP:
        hit = ctx.tier.max_timestamp(tp)
    elif ts >= 0:
        hit = ctx.tier.offset_for_timestamp(tp, ts)
    else:
        return {"error_code": ErrorCode.invalid_request}
    # As Kafka's Partition.fetchOffsetForTimestamp: an answer at or past what the client may fetch (the last
    # stable offset for read_committed) is no answer (-1).
    if hit is None or hit.offset >= end:
        return {}
    return {"offset": hit.offset, "timestamp": hit.timestamp, "leader_epoch": hit.leader_epoch}
