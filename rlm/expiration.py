"""Remote retention: by time and by size, from the sidecar's own per-topic rules, oldest first.

Never from the topic's ``retention.*`` (in sidecar mode they govern the broker's *local* copy) and never from the
broker's log start offset (it moves whenever local retention deletes a segment; following it would delete from
the remote tier exactly what tiering exists to keep).
"""

from __future__ import annotations

import time

from rlm.config import RetentionRule
from rlm.deleter import SegmentDeleter
from rlmm.api import RemoteLogMetadataManager, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition

__all__ = ["expire_partition", "expired_segments"]


def expired_segments(segments: list[RemoteLogSegmentMetadata], rule: RetentionRule,
                     now_ms: int) -> list[tuple[RemoteLogSegmentMetadata, str]]:
    """The segments to delete, oldest first, with the reason (``retention-time`` / ``retention-size``).

    Only a prefix of the partition's segments expires, so the remote tier stays one contiguous range.
    """
    finished = [m for m in segments if m.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED]
    out: list[tuple[RemoteLogSegmentMetadata, str]] = []
    i = 0
    if rule.retention_ms >= 0:
        cutoff = now_ms - rule.retention_ms
        while i < len(finished) and finished[i].max_timestamp_ms < cutoff:
            out.append((finished[i], "retention-time"))
            i += 1
    if rule.retention_bytes >= 0:
        remaining = sum(m.segment_size_bytes for m in finished[i:])
        while i < len(finished) and remaining > rule.retention_bytes:
            remaining -= finished[i].segment_size_bytes
            out.append((finished[i], "retention-size"))
            i += 1
    return out


def expire_partition(rlmm: RemoteLogMetadataManager, deleter: SegmentDeleter, tp: TopicIdPartition,
                     rule: RetentionRule, now_ms: int | None = None) -> list[RemoteLogSegmentMetadata]:
    """Delete the expired segments of ``tp``; return those deleted (or queued for the cleaner)."""
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    done = []
    for md, reason in expired_segments(rlmm.list_remote_log_segments(tp), rule, now_ms):
        deleter.delete(md, reason)
        done.append(md)
    return done
