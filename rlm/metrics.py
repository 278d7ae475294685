"""The sidecar's Prometheus metrics, all defined here (``rsm`` and ``rlmm`` define their own in their packages).

Every metric lives in the default registry, which ``/metrics`` serves (see :mod:`rlm.http`).
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

__all__ = [
    "BYTES_COPIED",
    "BYTES_READ",
    "COPY_HELD",
    "COPY_LAG_BYTES",
    "COPY_LAG_SEGMENTS",
    "COPY_REFUSALS",
    "COPY_RUN_SEGMENTS",
    "COPY_SECONDS",
    "OFFLOAD_OPEN_SECONDS",
    "OFFLOAD_SEGMENT_SECONDS",
    "DELETE_SECONDS",
    "ERRORS",
    "GC_DELETED",
    "LOG_DIR_OK",
    "METADATA_NOT_CAUGHT_UP",
    "PURGE_CHECK_UNAUTHORIZED",
    "READ_SECONDS",
    "DELETIONS_QUEUED",
    "MIN_RETENTION_MARGIN_SECONDS",
    "RETENTION_MARGIN_BYTES",
    "RETENTION_MARGIN_SECONDS",
    "SEGMENTS_COPIED",
    "SEGMENTS_DELETED",
    "SEGMENT_GAPS",
    "STAGING_BYTES",
]

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

COPY_LAG_BYTES = Gauge("rlm_copy_lag_bytes", "Bytes of the local log not yet remote (segment mode: rolled segments; "
                       "streaming mode: from the open offload segment's start, the active segment included)",
                       ["topic", "partition"])
COPY_LAG_SEGMENTS = Gauge("rlm_copy_lag_segments", "Local segments not yet remote (segment mode: rolled ones; "
                          "streaming mode: those holding offsets not yet remote, the active one included)",
                          ["topic", "partition"])
COPY_HELD = Gauge(
    "rlm_copy_held", "1 while a led partition's copying is held at a segment whose copy was refused for its batches' "
    "leader epochs (reason: epoch-mismatch, the broker's leader-epoch checkpoint and the batches disagree; "
    "no-leader-epoch, epoch-backwards, no-batches: the batches give no map); nothing from that segment on is copied "
    "until a copy of it succeeds (each run tries again)", ["topic", "partition", "reason"])
COPY_REFUSALS = Counter(
    "rlm_copy_refusals", "Copies refused for their batches' leader epochs (reasons as rlm_copy_held's)",
    ["topic", "reason"])
BYTES_COPIED = Counter("rlm_bytes_copied", "Segment bytes copied to the remote store", ["topic"])
SEGMENTS_COPIED = Counter("rlm_segments_copied", "Segments copied to the remote store", ["topic"])
BYTES_READ = Counter("rlm_bytes_read", "Bytes served from the remote store by remote reads", ["topic"])
SEGMENTS_DELETED = Counter("rlm_segments_deleted", "Remote segments deleted", ["topic", "reason"])
GC_DELETED = Counter("rlm_gc_deleted_objects", "Orphan objects deleted by garbage collection")
COPY_SECONDS = Histogram("rlm_copy_seconds", "Time to copy one segment", buckets=_LATENCY_BUCKETS)
COPY_RUN_SEGMENTS = Histogram(
    "rlm_copy_run_segments", "Segments copied by one copy run of a partition (segment mode; _count: the runs)",
    buckets=(0, 1, 2, 3, 5, 10, 20, 50, 100))
OFFLOAD_SEGMENT_SECONDS = Histogram(
    "rlm_offload_segment_seconds", "Streaming offload: from an offload segment's first committed batch seen to the "
    "segment remote (its first batch's remote lag, less the poll interval)", buckets=_LATENCY_BUCKETS)
OFFLOAD_OPEN_SECONDS = Gauge("rlm_offload_open_seconds", "Streaming offload: age of the offload segment being cut "
                             "(0: none open)", ["topic", "partition"])
READ_SECONDS = Histogram("rlm_read_seconds", "Time to serve one remote read", buckets=_LATENCY_BUCKETS)
DELETE_SECONDS = Histogram("rlm_delete_seconds", "Time to delete one remote segment", buckets=_LATENCY_BUCKETS)
ERRORS = Counter("rlm_errors", "Failed operations", ["op"])
SEGMENT_GAPS = Counter("rlm_segment_gaps", "Rolled segments the broker deleted before they were staged",
                       ["topic", "partition"])
PURGE_CHECK_UNAUTHORIZED = Counter(
    "rlm_purge_check_unauthorized", "Deleted-topic checks answered TOPIC_AUTHORIZATION_FAILED (nothing purged)",
    ["topic"])
METADATA_NOT_CAUGHT_UP = Gauge(
    "rlm_metadata_not_caught_up", "Partitions served (led or followed) whose metadata cache has not caught up with "
    "the metadata topic (/health's metadata check): no copy, expiration or read of them proceeds meanwhile")
CLUSTER_CALLS = Counter(
    "rlm_cluster_calls", "The cluster view's admin calls (rlm.discovery.ClusterView), by kind: list_offsets (the copy "
    "runs' last stable offsets and fences), metadata (list_topics), describe_topics, describe_configs; librdkafka "
    "sends one request per broker leading what a call asks", ["call"])
LIST_OFFSETS_PARTITIONS = Counter(
    "rlm_list_offsets_partitions", "Partitions asked for by the cluster view's list_offsets calls (over "
    "rlm_cluster_calls{call=list_offsets}: how many copy runs' questions one call answered)")
STAGING_BYTES = Gauge("rlm_staging_bytes", "Bytes held in the hard-link staging area")
LOG_DIR_OK = Gauge("rlm_log_dir_ok", "1 when the configured log dir exists and is readable, else 0", ["log_dir"])
DELETIONS_QUEUED = Gauge(
    "rlm_deletions_queued", "Deletes the store refused, queued in the to-be-deleted topic and not yet retried to the "
    "end, in the partitions this sidecar's cleaner consumes")
MIN_RETENTION_MARGIN_SECONDS = Gauge(
    "rlm_min_retention_margin_seconds", "health.min_retention_margin_ms in seconds: below it a partition's "
    "retention margin makes /health not ready (and fires RlmRetentionMarginLow)")
RETENTION_MARGIN_SECONDS = Gauge(
    "rlm_retention_margin_seconds", "Time until the broker's local retention reaches the oldest segment neither "
    "tiered nor staged (+Inf: nothing at risk)", ["topic", "partition"])
RETENTION_MARGIN_BYTES = Gauge(
    "rlm_retention_margin_bytes", "Bytes the partition may still grow before its local retention.bytes reaches the "
    "oldest segment neither tiered nor staged (+Inf: nothing at risk)", ["topic", "partition"])
