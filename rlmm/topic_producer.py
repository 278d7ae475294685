"""The write side of the metadata topic: one idempotent producer (``acks=all``), Kafka's ``ProducerManager``.

:meth:`MetadataProducer.send` produces records to the metadata partitions the caller chose and reports, per record,
where it landed (partition, offset) or why Kafka did not take it; it does not wait for the local cache (the manager's
read-your-writes wait is on the consumer task, :meth:`rlmm.topic_consumer.ConsumerTask.wait_applied`).
:meth:`MetadataProducer.write_due_tombstones` writes the tombstones of segments fully deleted long enough ago.

A read-only manager has no producer at all: an idempotent producer asks for a producer id at once, which needs WRITE
on the topic or IDEMPOTENT_WRITE on the cluster, rights a principal that only reads should not need.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence

from confluent_kafka import Producer

from rlmm.api import MetadataWriteError
from rlmm.cache import MetadataCache
from rlmm.keys import segment_keys

__all__ = ["MetadataProducer"]


class MetadataProducer:
    """Produces metadata records to one topic. ``client`` is the confluent-kafka producer (thread-safe)."""

    def __init__(self, topic: str, client_config: Mapping[str, object]) -> None:
        self.topic = topic
        self.client = Producer({"acks": "all", "enable.idempotence": True, "linger.ms": 1, **client_config})
        self._tombstoned: set[tuple[uuid.UUID, int, uuid.UUID]] = set()

    def send(self, records: Sequence[tuple[int, bytes, bytes, object]], timeout_s: float,
             ) -> list[tuple[int, int] | MetadataWriteError]:
        """Produce every ``(metadata partition, key, value, what)``, flush until all are acknowledged (giving up after
        ``timeout_s`` without a new acknowledgement), and return per record its (metadata partition, offset) or the
        :class:`MetadataWriteError` naming ``what``."""
        client = self.client
        out: list[tuple[int, int] | MetadataWriteError | None] = [None] * len(records)
        delivered = [0]

        def on_delivery(j: int, mp: int, what: object) -> Callable[[object, object], None]:
            def cb(err, msg) -> None:
                delivered[0] += 1
                out[j] = (mp, msg.offset()) if err is None else \
                    MetadataWriteError(f"{what}: {self.topic}-{mp} refused the record: {err}")
            return cb

        for j, (mp, key, value, what) in enumerate(records):
            while True:
                try:
                    client.produce(self.topic, key=key, value=value, partition=mp, on_delivery=on_delivery(j, mp, what))
                    break
                except BufferError:  # the producer's queue is full: let deliveries drain it
                    client.poll(0.1)
        progress_at, seen = time.monotonic(), -1
        while delivered[0] < len(records):
            if delivered[0] != seen:
                progress_at, seen = time.monotonic(), delivered[0]
            elif time.monotonic() - progress_at > timeout_s:
                break
            client.flush(1.0)
        return [MetadataWriteError(f"{rec[3]}: not acknowledged by {self.topic}-{rec[0]} within {timeout_s}s")
                if res is None else res for rec, res in zip(records, out, strict=True)]

    def write_due_tombstones(self, cache: MetadataCache, mps: Iterable[int], broker_id: int, delay_ms: int) -> None:
        """Tombstone every key of the segments this broker fully deleted at least ``delay_ms`` ago in metadata
        partitions ``mps`` (once each; consuming them clears the cache's pending entry). Does not wait."""
        now_ms = int(time.time() * 1000)
        for mp in sorted(mps):
            for d in cache.deleted_segments(mp):
                ident = (d.topic_id, d.partition, d.segment_id)
                if d.broker_id != broker_id or ident in self._tombstoned or now_ms - d.event_timestamp_ms < delay_ms:
                    continue
                # the DELETE_SEGMENT_FINISHED key last: consuming its tombstone clears the pending entry
                for key in segment_keys(d.topic_id, d.partition, d.segment_id):
                    self.client.produce(self.topic, key=key, value=None, partition=mp)
                self._tombstoned.add(ident)

    def poll(self) -> None:
        """Serve delivery callbacks (called often by the consumer task)."""
        self.client.poll(0)

    def close(self, timeout_s: float = 10.0) -> None:
        self.client.flush(timeout_s)
