"""Produce to the real broker with the offsets acknowledged: inside transactions (committed or aborted) or plain."""

from __future__ import annotations

import uuid

from confluent_kafka import Producer

from devtools.devkafka import KafkaCluster
from tests.support.kafka import produce

__all__ = ["TxnProducer", "plain"]


class TxnProducer:
    def __init__(self, kafka: KafkaCluster, topic: str) -> None:
        self.topic = topic
        self.p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5,
                           "transactional.id": f"txn-{uuid.uuid4().hex}"})
        self.p.init_transactions(30)

    def send(self, tag: str, n: int) -> dict[int, tuple[bytes, bytes]]:
        """Produce ``n`` records inside the open transaction; return offset -> (key, value) once acknowledged."""
        out: dict[int, tuple[bytes, bytes]] = {}

        def cb(err, msg) -> None:  # type: ignore[no-untyped-def]
            assert err is None, err
            out[msg.offset()] = (msg.key(), msg.value())

        for i in range(n):
            self.p.produce(self.topic, key=f"{tag}-{i}".encode(), value=f"{tag}-value-{i}".encode() * 5,
                           partition=0, on_delivery=cb)
        assert self.p.flush(30) == 0
        assert len(out) == n
        return out

    def txn(self, tag: str, n: int, *, commit: bool) -> dict[int, tuple[bytes, bytes]]:
        self.p.begin_transaction()
        out = self.send(tag, n)
        (self.p.commit_transaction if commit else self.p.abort_transaction)(30)
        return out

def plain(kafka: KafkaCluster, topic: str, tag: str, n: int) -> dict[int, tuple[bytes, bytes]]:
    recs = [(f"{tag}-{i}".encode(), f"{tag}-plain-{i}".encode()) for i in range(n)]
    return {off: kv for (_p, off), kv in zip(produce(kafka, topic, recs), recs, strict=True)}
