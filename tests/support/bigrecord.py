"""Test parts shared by the large-record tests (issue 26, PDP-43): a broker that takes 200 MiB records, the
endpoint's readiness and the tier's progress, and a streamed batch of known bytes for framing tests. Kept apart from
:mod:`tests.support.bigbatch`, which the measured child processes import (no broker or pytest imports there)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

from devtools.devkafka import KafkaCluster
from rlm.tier import StreamedBatch
from tests.support.fixtures import _running

__all__ = ["BIG_RECORD_LIMIT", "KnownBatch", "big_record_cluster", "index_objects", "listening"]

MiB = 1 << 20
BIG_RECORD_LIMIT = 230 * MiB
"""``max.message.bytes`` and friends of :func:`big_record_cluster`: above a 200 MiB record and its batch."""


def big_record_cluster(base_dir: Path) -> Iterator[KafkaCluster]:
    """A one-broker cluster taking records up to :data:`BIG_RECORD_LIMIT` (``socket.request.max.bytes`` cannot be
    raised on the session's broker); the session fixture ``kafka_big`` yields from it."""
    cluster = KafkaCluster(brokers=1, base_dir=base_dir, heap="1g", broker_config={
        "socket.request.max.bytes": str(2 * BIG_RECORD_LIMIT), "message.max.bytes": str(BIG_RECORD_LIMIT),
        "replica.fetch.max.bytes": str(BIG_RECORD_LIMIT)})
    yield from _running(cluster, "the large-record Kafka broker")


def index_objects(root: Path) -> int:
    """Index objects of a filesystem store under ``root``: one per tiered segment."""
    return sum(1 for _ in root.rglob("*-index"))


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


class KnownBatch(StreamedBatch):
    """A StreamedBatch of known bytes, given out ``chunk`` bytes at a time (no store behind it: framing tests)."""

    def __init__(self, data: bytes, chunk: int = 4096) -> None:  # noqa: D107
        self.data = data
        self.chunk = chunk

    def __len__(self) -> int:
        return len(self.data)

    def chunks(self) -> Iterator[memoryview]:
        view = memoryview(self.data)
        return (view[i:i + self.chunk] for i in range(0, len(view), self.chunk))
