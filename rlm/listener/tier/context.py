"""What every answer from the tier shares: the served topics, the tier's read model, the cluster's ACLs for the
client's principal, and how a copy that cannot be read is reported.

Topics are served only as the cluster's ACLs let the client's principal (:mod:`rlm.listener.authz`; Kafka's own
rules): Fetch needs READ, Metadata and ListOffsets DESCRIBE.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable

from prometheus_client import Counter

from rlm.listener.authz import Authorizer
from rlm.listener.net.principals import Client
from rlm.listener.protocol.codec import ErrorCode
from rlm.listener.tier.catalog import Catalog
from rlm.logs import limited_logger
from rlm.tier import PartitionTier, TierView, UnreadableCopyError
from rlmm.api import TopicIdPartition

__all__ = ["FETCH_MAX_BYTES", "UNREADABLE_ERROR", "TierContext", "reads_wait_on_network"]

log = limited_logger(__name__)

UNREADABLE = Counter("rlm_history_unreadable_copies",
                     "Partitions answered without their data because a remote copy could not be read", ["api"])
REPORTED_COPIES = 10_000  # copies remembered as already logged (then they are logged again)
GAPS = Counter("rlm_history_tier_gaps", "Gaps of the remote chain met by a Fetch (offsets no remote segment holds, "
               "answered OFFSET_OUT_OF_RANGE), each gap counted once", ["topic"])
FETCH_MAX_BYTES = 57_671_680  # Kafka's fetch.max.bytes default (55 MiB): history_listener.fetch_max_bytes
UNREADABLE_ERROR = ErrorCode.kafka_storage_error
"""A partition whose answer needs a remote copy that cannot be read (:meth:`TierContext.unreadable`), in every API
that reads the tier: Fetch and ListOffsets, the endpoint's and the proxy's below the broker's log start, and the
proxy's OffsetForLeaderEpoch of an epoch its broker no longer holds (Kafka's consumer and librdkafka retry it there
too: ``OffsetsForLeaderEpochUtils.handleResponse``, ``rd_kafka_toppar_handle_OffsetForLeaderEpoch``). Never the
broker's answer instead: past its log start, it would start a consumer past records the tier holds. Both client
families retry it without resetting: Kafka's consumer retries a ListOffsets partition with it
(``OffsetFetcherUtils.handleListOffsetResponse``, with OFFSET_NOT_AVAILABLE and NOT_LEADER_OR_FOLLOWER) and refreshes
its metadata on a Fetch (``FetchCollector.handleInitializeErrors``), its admin client retries it (a
``RetriableException``); librdkafka refreshes on it in ListOffsets (``rd_kafka_handle_ListOffsets``, as
OFFSET_NOT_AVAILABLE), its consumer queries the offset again 500 ms later (``rd_kafka_toppar_handle_Offset``) and
handles it in a Fetch itself. Kafka's broker answers a remote ListOffsets read that failed with
``Errors.forException``, UNKNOWN_SERVER_ERROR for a ``RemoteStorageException`` (``DelayedRemoteListOffsets``), which
librdkafka treats as permanent (``auto.offset.reset``): not that."""


class TierContext:
    def __init__(self, catalog: Catalog, tier: TierView, authorizer: Authorizer, *,
                 fetch_max_bytes: int = FETCH_MAX_BYTES, parallel_reads: bool = True) -> None:
        self.catalog = catalog
        self.tier = tier
        # whether a Fetch's partitions are read at once (rlm.listener.tier.fetch.PARALLEL_READS threads): reads that
        # wait on a network, not those of a store whose blocks are mapped from local files (rsm.store.base.MappedStore)
        self.parallel_reads = parallel_reads
        self.authorizer = authorizer
        self.fetch_max_bytes = fetch_max_bytes
        self._reported: OrderedDict[str, None] = OrderedDict()  # copies whose failure was logged
        self._reported_lock = threading.Lock()

    def unreadable(self, err: UnreadableCopyError, api: str) -> ErrorCode:
        """Count a partition answered without its data; log the copy the first time it fails (a client retrying
        the partition would otherwise write a line per request). Returns the partition's error,
        :data:`UNREADABLE_ERROR`."""
        UNREADABLE.labels(api).inc()
        with self._reported_lock:
            if err.copy_id in self._reported:
                return UNREADABLE_ERROR
            self._reported[err.copy_id] = None
            while len(self._reported) > REPORTED_COPIES:
                self._reported.popitem(last=False)
        seg = err.segment
        log.error("history endpoint: a remote copy cannot be read: its partition is answered with "
                  "KAFKA_STORAGE_ERROR (logged once per copy); re-copy the segment or delete the copy", extra={
                      "topic_partition": str(err.tp), "segment_id": err.copy_id, "key": err.key,
                      "start_offset": seg.start_offset if seg else None,
                      "end_offset_inclusive": seg.end_offset_inclusive if seg else None,
                      "reason": f"{type(err.cause).__name__}: {err.cause}"})
        return UNREADABLE_ERROR

    def gap(self, tp: TopicIdPartition, first_offset: int, last_offset_inclusive: int) -> None:
        """Count and log (once per gap) a Fetch of offsets lost from the tier: a gap between two segments of the
        remote chain (copy lag past local retention while the sidecar was away)."""
        key = f"{tp}:{first_offset}:{last_offset_inclusive}"
        with self._reported_lock:
            if key in self._reported:
                return
            self._reported[key] = None
            while len(self._reported) > REPORTED_COPIES:
                self._reported.popitem(last=False)
        GAPS.labels(tp.topic).inc()
        log.error("history endpoint: a Fetch inside a gap of the remote chain: these offsets are not remote (the "
                  "broker deleted them before they were tiered); answered OFFSET_OUT_OF_RANGE as Kafka answers an "
                  "offset no remote segment holds (logged once per gap; rlm status shows it)", extra={
                      "topic_partition": str(tp), "first_offset": first_offset,
                      "last_offset_inclusive": last_offset_inclusive,
                      "offsets": last_offset_inclusive - first_offset + 1})

    def partition_tier(self, tp: TopicIdPartition, api: str) -> PartitionTier | None:
        """The partition's tier, or None when nothing of it is remote or it cannot be read (counted, logged)."""
        try:
            return self.tier.partition(tp)
        except UnreadableCopyError as err:
            self.unreadable(err, api)
            return None

    def allowed(self, client: Client, operation: str, names: Iterable[str | None]) -> set[str]:
        """The topics of ``names`` the client's principal may ``operation`` by the cluster's ACLs."""
        return self.authorizer.allowed(client.principal, client.host, operation,
                                       (n for n in names if n is not None))

    def name_of(self, topic_id: uuid.UUID | None) -> str | None:
        topic = self.catalog.by_id(topic_id) if topic_id is not None else None
        return topic.name if topic is not None else None


def reads_wait_on_network(rsm: object) -> bool:
    """Whether the storage manager's reads wait on a network (S3): a Fetch's partitions are then read at once
    (``TierContext.parallel_reads``); not when its store maps local files (the filesystem's,
    :class:`rsm.store.base.MappedStore`): nothing to wait for in parallel."""
    return getattr(getattr(rsm, "store", None), "map_range", None) is None
