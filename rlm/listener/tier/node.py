"""The history endpoint as one Kafka node: ApiVersions, Metadata, DescribeCluster, FindCoordinator and Produce.

The endpoint is one node (``node_id``, the advertised address) that leads every served partition. Partition leader
epochs are the tier's: Metadata names the epoch of the newest tiered offset. Metadata of all topics lists only those
the client may describe; a topic named that it may not gets TOPIC_AUTHORIZATION_FAILED, whether or not it exists, as
a broker answers. OffsetForLeaderEpoch is not offered, so clients skip position validation.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from rlm.listener.authz import DESCRIBE
from rlm.listener.net.principals import Client
from rlm.listener.protocol.apis import API_KEYS, SASL_API_KEYS
from rlm.listener.protocol.codec import ErrorCode
from rlm.listener.tier.catalog import ServedTopic
from rlm.listener.tier.context import TierContext

__all__ = ["INT32_MIN", "NodeAnswers", "NodeInfo"]

INT32_MIN = -(2**31)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    node_id: int
    host: str
    port: int
    cluster_id: str


class NodeAnswers:
    def __init__(self, ctx: TierContext, node: NodeInfo, *, sasl: bool = False) -> None:
        self.ctx = ctx
        self.node = node
        self.sasl = sasl

    def api_versions(self, error: ErrorCode = ErrorCode.none) -> dict[str, Any]:
        keys = {**API_KEYS, **(SASL_API_KEYS if self.sasl else {})}
        return {"error_code": error, "throttle_time": 0, "finalized_features_epoch": -1,
                "api_keys": [{"api_key": k, "min_version": lo, "max_version": hi} for k, (lo, hi) in sorted(
                    keys.items())]}

    def _brokers(self) -> list[dict[str, Any]]:
        n = self.node
        return [{"node_id": n.node_id, "broker_id": n.node_id, "host": n.host, "port": n.port, "rack": None}]

    def describe_cluster(self, _req: Any, _client: Client) -> dict[str, Any]:
        n = self.node
        return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "endpoint_type": 1,
                "cluster_id": n.cluster_id, "controller_id": n.node_id, "brokers": self._brokers(),
                "cluster_authorized_operations": INT32_MIN}

    def metadata(self, req: Any, client: Client) -> dict[str, Any]:
        topics: list[dict[str, Any]] = []
        wanted = getattr(req, "topics", None)
        if wanted is None:  # every topic the client may describe
            every = self.ctx.catalog.topics()
            ok = self.ctx.allowed(client, DESCRIBE, every)
            served: list[tuple[ServedTopic | None, str | None, uuid.UUID | None]] = [
                (t, t.name, t.topic_id) for t in sorted(every.values(), key=lambda t: t.name) if t.name in ok]
        else:
            served = []
            for w in wanted:
                name, tid = getattr(w, "name", None), getattr(w, "topic_id", None)
                if name:
                    served.append((self.ctx.catalog.by_name(name), name, None))
                elif tid is not None and tid != uuid.UUID(int=0):
                    served.append((self.ctx.catalog.by_id(tid), None, tid))
                else:
                    served.append((None, name, tid))
            ok = self.ctx.allowed(client, DESCRIBE, {name or (t.name if t else None) for t, name, _tid in served})
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
                t = self.ctx.partition_tier(topic.tp(p), "metadata")
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
