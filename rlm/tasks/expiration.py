"""Remote retention: by time and by size, from the sidecar's own per-topic rules, oldest first.

Never from the topic's ``retention.*`` (in sidecar mode they govern the broker's *local* copy) and never from the
broker's log start offset (it moves whenever local retention deletes a segment; following it would delete from
the remote tier exactly what tiering exists to keep).

Retention counts the remote chain only (:mod:`rlm.tier.chain`): one copy of each offset, of the current leader-epoch
lineage. Segments outside the chain are deleted here too once the chain serves all their offsets: duplicates, and
segments of a diverged lineage (as Kafka's expiration deletes segments outside the leader's lineage) once the
current lineage's copies have replaced them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from rlm.config import RetentionRule
from rlm.tasks.deleter import SegmentDeleter
from rlm.tier import lineage_of, remote_chain, unchained
from rlmm.api import RemoteLogMetadataManager, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from rsm.log.checkpoint import EpochEntry

__all__ = ["expire_partition", "expired_segments"]

log = logging.getLogger(__name__)


def expired_segments(chain: list[RemoteLogSegmentMetadata], rule: RetentionRule,
                     now_ms: int) -> list[tuple[RemoteLogSegmentMetadata, str]]:
    """The segments of the remote ``chain`` to delete, oldest first, with the reason (``retention-time`` /
    ``retention-size``). Only a prefix of the chain expires, so the remote tier stays one contiguous range.
    """
    finished = [m for m in chain if m.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED]
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
                     rule: RetentionRule, now_ms: int | None = None,
                     local_epochs: Sequence[EpochEntry] | None = None) -> list[RemoteLogSegmentMetadata]:
    """Delete the expired segments of ``tp``, and those outside its remote chain that may go; return those deleted
    (or queued for the cleaner).

    ``local_epochs``: the leader's leader-epoch checkpoint (call only while leading under its newest epoch); the
    chain then follows the leader's lineage (:meth:`rlm.tier.chain.Lineage.merged_with_local`). Without it the chain
    follows the metadata's own lineage.
    """
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    segments = rlmm.list_remote_log_segments(tp)
    lineage = lineage_of(segments)
    if local_epochs:
        lineage = lineage.merged_with_local(local_epochs)
    chain = remote_chain(segments, lineage)
    todo = expired_segments(chain, rule, now_ms)
    outside, kept = unchained(segments, chain, lineage)
    todo += outside
    for md in kept:
        log.warning("remote segment outside the remote chain kept: it holds offsets the chain lacks", extra={
            "segment": str(md.remote_log_segment_id), "start_offset": md.start_offset,
            "end_offset": md.end_offset_inclusive})
    done = []
    for md, reason in todo:
        deleter.delete(md, reason)
        done.append(md)
    return done
