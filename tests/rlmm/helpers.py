"""Small builders for metadata used by the broker tests."""

from __future__ import annotations

import time
import uuid

from rlmm.api import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)

__all__ = ["eventually", "segment", "update"]


def segment(tp: TopicIdPartition, start: int, end: int, epochs: dict[int, int] | None = None, *, broker_id: int = 1,
            size: int = 1000, custom: bytes | None = None) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.uuid4()), start, end, 1_700_000_000_000 + end,
                                    broker_id, int(time.time() * 1000), size, epochs or {0: start}, custom)


def update(md: RemoteLogSegmentMetadata, state: RemoteLogSegmentState, *, broker_id: int = 1,
           custom: bytes | None = None) -> RemoteLogSegmentMetadataUpdate:
    return RemoteLogSegmentMetadataUpdate(md.remote_log_segment_id, int(time.time() * 1000), custom, state, broker_id)


def eventually(fn, timeout_s: float = 30.0, interval_s: float = 0.05):
    """Call ``fn`` until it returns a truthy value; return it (or fail with the last value)."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = fn()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"condition not met within {timeout_s}s (last: {last!r})")
