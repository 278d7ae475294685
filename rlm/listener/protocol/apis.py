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
# a time series kept for the life of the process: unknown keys are all "other"). Kafka's names (kio's module names),
# for the APIs a client sends to a broker, so that a proxy's forwarded requests (groups, transactions, admin) are
# told apart; broker-to-broker and controller APIs are "other".
API_NAMES: dict[int, str] = {
    0: "produce", 1: "fetch", 2: "list_offsets", 3: "metadata", 8: "offset_commit", 9: "offset_fetch",
    10: "find_coordinator", 11: "join_group", 12: "heartbeat", 13: "leave_group", 14: "sync_group",
    15: "describe_groups", 16: "list_groups", 17: "sasl_handshake", 18: "api_versions", 19: "create_topics",
    20: "delete_topics", 21: "delete_records", 22: "init_producer_id", 23: "offset_for_leader_epoch",
    24: "add_partitions_to_txn", 25: "add_offsets_to_txn", 26: "end_txn", 28: "txn_offset_commit",
    29: "describe_acls", 30: "create_acls", 31: "delete_acls", 32: "describe_configs", 33: "alter_configs",
    35: "describe_log_dirs", 36: "sasl_authenticate", 37: "create_partitions", 42: "delete_groups",
    43: "elect_leaders", 44: "incremental_alter_configs", 47: "offset_delete", 60: "describe_cluster",
    61: "describe_producers", 65: "describe_transactions", 66: "list_transactions", 68: "consumer_group_heartbeat",
    69: "consumer_group_describe", 71: "get_telemetry_subscriptions", 72: "push_telemetry",
    75: "describe_topic_partitions", 76: "share_group_heartbeat", 77: "share_group_describe", 78: "share_fetch",
    79: "share_acknowledge", 88: "streams_group_heartbeat", 89: "streams_group_describe"}


def api_label(api_key: int) -> str:
    """The metric label of ``api_key``: its name for the APIs the endpoint knows, else ``"other"``."""
    return API_NAMES.get(api_key, "other")
