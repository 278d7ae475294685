"""The answers of the history endpoint, one method per Kafka API, as version-independent values.

Each handler takes the decoded request (a kio entity of whatever version the client sent) and returns a dict named
as the response schema's fields; :func:`rlm.history.wire.build` keeps what the version has (topic names before
Fetch v13, topic ids from it, and so on). Handlers block (they read the store): the server runs them on its
worker threads.

Every handler gets the :class:`Client` that sent the request (its principal and address): topics are served only
as the cluster's ACLs let that principal (:mod:`~rlm.history.acls`; Kafka's own rules): Fetch needs READ, Metadata
and ListOffsets DESCRIBE. Metadata of all topics lists only those the client may describe; a topic named that it
may not gets TOPIC_AUTHORIZATION_FAILED, whether or not it exists, as a broker answers.

The endpoint is one node (``node_id``, the advertised address) that leads every served partition. Partition leader
epochs are the tier's: Metadata names the epoch of the newest tiered offset, ListOffsets the epoch of the offset it
answers (as a broker does). OffsetForLeaderEpoch is not offered, so clients skip position validation.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from rlm.history.acls import DESCRIBE, READ, Authorizer
from rlm.history.catalog import Catalog, ServedTopic
from rlm.history.wire import API_KEYS, SASL_API_KEYS, ErrorCode
from rlm.tier import FetchResult, Isolation, PartitionTier, TierView, UnreadableCopyError

__all__ = ["Client", "Handlers", "NodeInfo"]

log = logging.getLogger(__name__)

UNREADABLE = Counter("rlm_history_unreadable_copies",
                     "Partitions answered without their data because a remote copy could not be read", ["api"])
REPORTED_COPIES = 10_000  # copies remembered as already logged (then they are logged again)

INT32_MIN = -(2**31)
EARLIEST, LATEST, MAX_TIMESTAMP, EARLIEST_LOCAL, LATEST_TIERED = -2, -1, -3, -4, -5
FETCH_MAX_BYTES = 57_671_680  # Kafka's fetch.max.bytes default (55 MiB): history_listener.fetch_max_bytes


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: int
    host: str
    port: int
    cluster_id: str


@dataclass(frozen=True, slots=True)
class Client:
    """Who sent a request: the principal the cluster's ACLs name (``User:alice``) and its address."""

    principal: str
    host: str


class Handlers:
    def __init__(self, catalog: Catalog, tier: TierView, node: NodeInfo, authorizer: Authorizer, *,
                 sasl: bool = False, fetch_max_bytes: int = FETCH_MAX_BYTES) -> None:
        self.catalog = catalog
        self.tier = tier
        self.node = node
        self.authorizer = authorizer
        self.sasl = sasl
        self.fetch_max_bytes = fetch_max_bytes
        self._reported: OrderedDict[str, None] = OrderedDict()  # copies whose failure was logged
        self._reported_lock = threading.Lock()

    def _unreadable(self, err: UnreadableCopyError, api: str) -> None:
        """Count a partition answered without its data; log the copy the first time it fails (a client retrying
        the partition would otherwise write a line per request)."""
        UNREADABLE.labels(api).inc()
        with self._reported_lock:
            if err.copy_id in self._reported:
                return
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

    def _partition_tier(self, tp: Any, api: str) -> PartitionTier | None:
        """The partition's tier, or None when nothing of it is remote or it cannot be read (counted, logged)."""
        try:
            return self.tier.partition(tp)
        except UnreadableCopyError as err:
            self._unreadable(err, api)
            return None

    # -------------------------------------------------------------------------------------- cluster
    def api_versions(self, error: ErrorCode = ErrorCode.none) -> dict[str, Any]:
        keys = {**API_KEYS, **(SASL_API_KEYS if self.sasl else {})}
        return {"error_code": error, "throttle_time": 0, "finalized_features_epoch": -1,
                "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(
                    keys.items())]}

    def _brokers(self) -> list[dict[str, Any]]:
        n = self.node
        return [{"node_id": n.node_id, "broker_id": n.node_id, "host": n.host, "port": n.port, "rack": None}]

    def _allowed(self, client: Client, operation: str, names: Any) -> set[str]:
        return self.authorizer.allowed(client.principal, client.host, operation,
                                       (n for n in names if n is not None))

    def describe_cluster(self, _req: Any, _client: Client) -> dict[str, Any]:
        n = self.node
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "endpoint_type": 1,
                "cluster_id": n.cluster_id, "controller_id": n.node_id, "brokers": self._brokers(),
                "cluster_authorized_operations": INT32_MIN}

    def metadata(self, req: Any, client: Client) -> dict[str, Any]:
        topics: list[dict[str, Any]] = []
        wanted = getattr(req, "topics", None)
        if wanted is None:  # every topic the client may describe
            every = self.catalog.topics()
            ok = self._allowed(client, DESCRIBE, every)
            served: list[tuple[ServedTopic | None, str | None, uuid.UUID | None]] = [
                (t, t.name, t.topic_id) for t in sorted(every.values(), key=lambda t: t.name) if t.name in ok]
        else:
            served = []
            for w in wanted:
                name, tid = getattr(w, "name", None), getattr(w, "topic_id", None)
                if name:
                    served.append((self.catalog.by_name(name), name, None))
                elif tid is not None and tid != uuid.UUID(int=0):
                    served.append((self.catalog.by_id(tid), None, tid))
                else:
                    served.append((None, name, tid))
            ok = self._allowed(client, DESCRIBE, {name or (t.name if t else None) for t, name, _tid in served})
        for topic, name, tid in served:
            if (name or (topic.name if topic else None)) not in ok and (name is not None or topic is not None):
                # Refused before existence is told: a name the client may not describe says nothing more.
                topics.append({"error_code": ErrorCode.topic_authorization_failed, "name": name,
                               "topic_id": tid or uuid.UUID(int=0), "is_internal": False, "partitions": [],
                               "topic_authorized_operations": INT32_MIN})
                continue
            if topic is None:
                code = ErrorCode.unknown_topic_id if name is None else ErrorCode.unknown_topic_or_partition
                topics.append({"error_code": code, "name": name, "topic_id": tid or uuid.UUID(int=0),
                               "is_internal": False, "partitions": [],
                               "topic_authorized_operations": INT32_MIN})
                continue
            parts = []
            for p in topic.partitions:
                # A tier that cannot be read is no Metadata error (a broker's Metadata reads no log either): the
                # partition is listed without its leader epoch; Fetch and ListOffsets say KAFKA_STORAGE_ERROR.
                t = self._partition_tier(topic.tp(p), "metadata")
                parts.append({"error_code": ErrorCode.none, "partition_index": p, "leader_id": self.node.node_id,
                              "leader_epoch": t.latest_epoch if t is not None else -1,
                              "replica_nodes": [self.node.node_id], "isr_nodes": [self.node.node_id],
                              "offline_replicas": []})
            topics.append({"error_code": ErrorCode.none, "name": topic.name, "topic_id": topic.topic_id,
                           "is_internal": False, "partitions": parts, "topic_authorized_operations": INT32_MIN})
        return {"throttle_time": 0, "brokers": self._brokers(), "cluster_id": self.node.cluster_id,
                "controller_id": self.node.node_id, "topics": topics, "cluster_authorized_operations": INT32_MIN}

    def find_coordinator(self, req: Any, _client: Client) -> dict[str, Any]:
        """No consumer groups here: COORDINATOR_NOT_AVAILABLE (consumers use ``assign()``)."""
        msg = "the history endpoint has no group coordinator: assign partitions (no subscribe)"
        keys = getattr(req, "coordinator_keys", None) or [getattr(req, "key", "")]
        return {"throttle_time": 0, "error_code": ErrorCode.coordinator_not_available, "error_message": msg,
                "node_id": -1, "host": "", "port": -1,
                "coordinators": [{"key": k, "node_id": -1, "host": "", "port": -1,
                                  "error_code": ErrorCode.coordinator_not_available, "error_message": msg}
                                 for k in keys]}

    def produce(self, req: Any, _client: Client) -> dict[str, Any] | None:
        """Refused: the endpoint is read-only (POLICY_VIOLATION per partition; no answer for acks=0)."""
        if req.acks == 0:
            return None
        msg = "the history endpoint is read-only: produce to the cluster"
        return {"throttle_time": 0, "responses": [
            {"name": t.name, "partition_responses": [
                {"index": p.index, "error_code": ErrorCode.policy_violation, "base_offset": -1,
                 "log_append_time": -1, "log_start_offset": -1, "error_message": msg} for p in t.partition_data]}
            for t in req.topic_data]}

    # -------------------------------------------------------------------------------------- offsets
    def list_offsets(self, req: Any, client: Client) -> dict[str, Any]:
        isolation = Isolation.from_id(getattr(req, "isolation_level", 0))
        ok = self._allowed(client, DESCRIBE, {t.name for t in req.topics})
        out = []
        for t in req.topics:
            topic = self.catalog.by_name(t.name)
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
                        answer.update(self._offset(topic, p.partition_index, p.timestamp, isolation))
                    except UnreadableCopyError as err:
                        self._unreadable(err, "list_offsets")
                        answer["error_code"] = ErrorCode.kafka_storage_error
                parts.append(answer)
            out.append({"name": t.name, "partitions": parts})
        return {"throttle_time": 0, "topics": out}

    def _offset(self, topic: ServedTopic, partition: int, ts: int, isolation: Isolation) -> dict[str, Any]:
        tp = topic.tp(partition)
        tier = self.tier.partition(tp)
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
            hit = self.tier.max_timestamp(tp)
        elif ts >= 0:
            hit = self.tier.offset_for_timestamp(tp, ts)
        else:
            return {"error_code": ErrorCode.invalid_request}
        # As Kafka's Partition.fetchOffsetForTimestamp: an answer at or past what the client may fetch (the last
        # stable offset for read_committed) is no answer (-1).
        if hit is None or hit.offset >= end:
            return {}
        return {"offset": hit.offset, "timestamp": hit.timestamp, "leader_epoch": hit.leader_epoch}

    # ---------------------------------------------------------------------------------------- fetch
    def fetch(self, req: Any, client: Client, *, budget: int | None = None) -> tuple[dict[str, Any], int]:
        """The Fetch response and the record bytes it carries (for ``min_bytes``).

        As Kafka's broker: the request's partitions are a map (a partition listed twice is answered once, from its
        last entry), the answer carries at most ``min(max_bytes, fetch_max_bytes)`` record bytes (the first batch
        of the first partition with data even past it, so that a consumer always progresses), and that one budget
        is spent across the partitions in order, each taking at most its ``partition_max_bytes``. A partition
        reached with no budget left gets its bounds (from the tier's metadata) and no records: nothing of it is
        read from the store. ``budget`` (the server's room for queued answers) lowers the cap further. A topic the
        client may not READ is TOPIC_AUTHORIZATION_FAILED for each of its partitions (an unknown topic id stays
        UNKNOWN_TOPIC_ID: there is no name to authorize)."""
        isolation = Isolation.from_id(getattr(req, "isolation_level", 0))
        topics: dict[Any, tuple[str | None, uuid.UUID | None]] = {}  # topic name (< v13) or id -> (name, id)
        wanted: dict[tuple[Any, int], Any] = {}  # (topic, partition) -> its last entry, in first-seen order
        for t in req.topics:
            name, tid = getattr(t, "topic", None), getattr(t, "topic_id", None)
            key = name if name is not None else tid
            topics.setdefault(key, (name, tid))
            for p in t.partitions:
                wanted[(key, p.partition)] = p
        ok = self._allowed(client, READ, {name if name is not None else self._name_of(tid)
                                          for name, tid in topics.values()})
        asked = req.max_bytes if req.max_bytes > 0 else self.fetch_max_bytes
        left = min(asked, self.fetch_max_bytes, self.fetch_max_bytes if budget is None else budget)
        total = 0
        parts: dict[Any, list[dict[str, Any]]] = {key: [] for key in topics}
        for (key, index), p in wanted.items():
            name, tid = topics[key]
            if name is not None and name not in ok:  # refused before existence is told
                parts[key].append(_partition(index, FetchResult(), ErrorCode.topic_authorization_failed))
                continue
            topic = self.catalog.by_name(name) if name is not None else self.catalog.by_id(tid)
            if topic is not None and topic.name not in ok:
                parts[key].append(_partition(index, FetchResult(), ErrorCode.topic_authorization_failed))
                continue
            if topic is None:
                code = ErrorCode.unknown_topic_id if name is None else ErrorCode.unknown_topic_or_partition
                parts[key].append(_partition(index, FetchResult(), code))
                continue
            if index not in topic.partitions:
                parts[key].append(_partition(index, FetchResult(), ErrorCode.unknown_topic_or_partition))
                continue
            # No budget left (and data already in the answer): the tier reads nothing (max_bytes 0).
            try:
                res = self.tier.fetch(topic.tp(index), p.fetch_offset, max(min(p.partition_max_bytes, left), 0),
                                      at_least_one=total == 0, isolation=isolation)
            except UnreadableCopyError as err:  # this partition only: the others are served
                self._unreadable(err, "fetch")
                parts[key].append(_partition(index, FetchResult(), ErrorCode.kafka_storage_error))
                continue
            total += res.size
            left -= res.size
            code = {None: ErrorCode.none, "offset_out_of_range": ErrorCode.offset_out_of_range,
                    "offset_not_available": ErrorCode.none}[res.error]
            parts[key].append(_partition(index, res, code))
        responses = []
        for key, (name, tid) in topics.items():
            topic = self.catalog.by_name(name) if name is not None else self.catalog.by_id(tid)
            responses.append({"topic": name if name is not None else (topic.name if topic else None),
                              "topic_id": tid if tid is not None else (topic.topic_id if topic else None),
                              "partitions": parts[key]})
        return {"throttle_time": 0, "error_code": ErrorCode.none, "session_id": 0, "responses": responses}, total


    def _name_of(self, topic_id: uuid.UUID | None) -> str | None:
        topic = self.catalog.by_id(topic_id) if topic_id is not None else None
        return topic.name if topic is not None else None


def _partition(index: int, res: FetchResult, code: ErrorCode) -> dict[str, Any]:
    return {"partition_index": index, "error_code": code, "high_watermark": res.high_watermark,
            "last_stable_offset": res.last_stable_offset, "log_start_offset": res.log_start_offset,
            "aborted_transactions": None if res.aborted is None else [
                {"producer_id": pid, "first_offset": first} for pid, first in res.aborted],
            "preferred_read_replica": -1, "records": res.records}
