"""The Kafka APIs the listener knows: the one list of their keys, names and the versions it answers itself.

Versions here are those the listener answers from the tier (the history endpoint). In proxy mode the broker's
versions of every forwarded API are offered as the broker gives them (:mod:`rlm.listener.routing`).
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["API_KEYS", "API_NAMES", "PROXY_API_KEYS", "SASL_API_KEYS", "ApiKey", "api_label"]


class ApiKey(IntEnum):
    """Kafka's api keys the listener names (``clients/src/main/java/org/apache/kafka/common/protocol/ApiKeys.java``)."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    OFFSET_FOR_LEADER_EPOCH = 23
    SASL_AUTHENTICATE = 36
    DESCRIBE_CLUSTER = 60
    SHARE_FETCH = 78
    SHARE_ACKNOWLEDGE = 79


# What the endpoint serves: api key -> (min version, max version). Fetch from v4 (read_committed) to v17 (topic ids
# from v13), what librdkafka 2.x and the Java client 4.x negotiate; ListOffsets to v9 (LATEST_TIERED_TIMESTAMP).
# Produce is offered only to be refused (POLICY_VIOLATION per partition): librdkafka enables record-batch v2 (and
# Fetch v4+) only for a broker that lists Produce v3+ too.
API_KEYS: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 9),
    ApiKey.FETCH: (4, 17),
    ApiKey.LIST_OFFSETS: (1, 9),
    ApiKey.METADATA: (1, 12),
    ApiKey.FIND_COORDINATOR: (0, 4),
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),
}
# What a proxy decodes beyond those, or at other versions (it answers part of them from the tier, or rewrites them):
# OffsetForLeaderEpoch from v2 (Kafka 4.x serves v2 to v4; librdkafka asks v2, the Java client v4); Produce at every
# version up to the last kio knows (v13; Kafka 4.x lists v0 to v13), its answers decoded only when they name leaders
# (v10+, KIP-951; below, the bytes pass); Fetch to v18 (v18 adds only a follower's tagged high watermark to the
# request: its answer is v17's), which the Java client 4.x asks of a broker offering it. A proxy looks an api key up
# here before API_KEYS.
PROXY_API_KEYS: dict[int, tuple[int, int]] = {
    ApiKey.OFFSET_FOR_LEADER_EPOCH: (2, 4),
    ApiKey.PRODUCE: (0, 13),
    ApiKey.FETCH: (4, 18),
}
SASL_API_KEYS: dict[int, tuple[int, int]] = {
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
}


# Metric label of each api key: a closed set (a client chooses the api key of its requests, and every label value is
# a time series kept for the life of the process: unknown keys are all "other").
API_NAMES: dict[int, str] = {
    ApiKey.PRODUCE: "produce", ApiKey.FETCH: "fetch", ApiKey.LIST_OFFSETS: "list_offsets",
    ApiKey.METADATA: "metadata", ApiKey.FIND_COORDINATOR: "find_coordinator", ApiKey.API_VERSIONS: "api_versions",
    ApiKey.DESCRIBE_CLUSTER: "describe_cluster", ApiKey.SASL_HANDSHAKE: "sasl_handshake",
    ApiKey.SASL_AUTHENTICATE: "sasl_authenticate", ApiKey.OFFSET_FOR_LEADER_EPOCH: "offset_for_leader_epoch"}


def api_label(api_key: int) -> str:
    """The metric label of ``api_key``: its name for the APIs the endpoint knows, else ``"other"``."""
    return API_NAMES.get(api_key, "other")
