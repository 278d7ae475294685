"""confluent-kafka clients as the tests drive them: records as a producer's delivery reports or a consumer give them
(:class:`Rec`), producing with every delivery report awaited, consuming until given end offsets, librdkafka's debug
lines caught."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, Producer

from devtools.devkafka import KafkaCluster

__all__ = ["Rec", "consume_until", "librdkafka_log", "producer", "send"]


@dataclass(frozen=True, slots=True)
class Rec:
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()

    @classmethod
    def of(cls, msg: Any) -> Rec:
        """A consumed (or delivered) confluent-kafka message."""
        return cls(msg.offset(), msg.timestamp()[1], msg.key(), msg.value(), tuple(msg.headers() or ()))


def send(prod: Producer, topic: str, partition: int,
         records: Iterable[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None, int]]
         ) -> list[Rec]:
    """Produce ``(key, value, headers, timestamp_ms or 0 for now)`` and wait for every delivery report; the records
    as the broker stored them (offset, and its timestamp for LogAppendTime)."""
    recs = list(records)
    out: list[Rec | None] = [None] * len(recs)
    errors: list[Any] = []

    def cb(i: int) -> Any:
        def on_delivery(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
                return
            k, v, h, _ts = recs[i]
            out[i] = Rec(msg.offset(), msg.timestamp()[1], k, v, tuple(h or ()))
        return on_delivery

    for i, (k, v, h, ts) in enumerate(recs):
        while True:
            try:
                prod.produce(topic, key=k, value=v, headers=h, partition=partition, timestamp=ts,
                             on_delivery=cb(i))
                break
            except BufferError:
                prod.poll(0.1)
    assert prod.flush(60) == 0, "records not delivered within 60 s"
    assert not errors, errors
    return out  # type: ignore[return-value]


def consume_until(consumer: Consumer, ends: dict[tuple[str, int], int], *, timeout_s: float = 30.0,
                  settle_s: float = 0.0) -> dict[tuple[str, int], list[Rec]]:
    """Poll until every (topic, partition) delivered a record at or past its end offset (exclusive end), then
    ``settle_s`` more (whatever comes then is returned too: a test of "nothing more" sees it); returns the records
    per partition in the order received. Fails on a consumer error."""
    got: dict[tuple[str, int], list[Rec]] = {k: [] for k in ends}
    deadline = time.monotonic() + timeout_s
    pending = {k for k, end in ends.items() if end > 0}

    def poll(seconds: float) -> None:
        for msg in consumer.consume(500, seconds):
            assert msg.error() is None, msg.error()
            key = (msg.topic(), msg.partition())
            got.setdefault(key, []).append(Rec.of(msg))
            if key in ends and msg.offset() >= ends[key] - 1:
                pending.discard(key)

    while pending:
        left = deadline - time.monotonic()
        assert left > 0, f"timed out: {[(k, got[k][-1].offset if got[k] else None) for k in sorted(pending)]}"
        poll(min(left, 0.5))
    settle = time.monotonic() + settle_s
    while (left := settle - time.monotonic()) > 0:
        poll(min(left, 0.25))
    return got


def producer(kafka: KafkaCluster, **conf: Any) -> Producer:
    """A producer to the broker (linger 5 ms)."""
    return Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5, **conf})


def librdkafka_log() -> tuple[logging.Logger, list[str]]:
    """A logger for librdkafka's ``debug`` lines (a client's ``logger=``), and the list they go to."""
    lines: list[str] = []

    class Into(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(record.getMessage())

    log = logging.getLogger(f"rdkafka-{uuid.uuid4().hex[:6]}")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    log.addHandler(Into())
    return log, lines
