"""Segments written by the real broker, made once per session and shared by the rsm/log tests.

One topic per codec (the producer compresses, the topic keeps the producer's codec), records with headers,
null keys, tombstones and explicit timestamps; a several-MiB record; a topic with a committed and an aborted
transaction whose markers end up in a rolled segment. Every topic is rolled at the end so the data sits in
rolled (immutable) segments.
"""

from __future__ import annotations

import os
import random
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.support.kafka import CODECS, partition_dir, produce, roll_and_wait

MiB = 1024 * 1024
BIG_VALUE_BYTES = 5 * MiB
TS0 = 1_700_000_000_000


@dataclass
class ProducedTopic:
    name: str
    topic_id: uuid.UUID
    pdir: Path | None = None  # resolved after the first produce (the broker creates it lazily)
    # offset -> (key, value, headers as a tuple of (name, value), timestamp_ms or None when not ours to check)
    expected: dict[int, tuple[bytes | None, bytes | None, tuple, int | None]] = field(default_factory=dict)
    committed: list[int] = field(default_factory=list)  # offsets of records of committed transactions
    aborted: list[int] = field(default_factory=list)  # offsets of records of the aborted transaction


def _records(rng: random.Random, n: int, tag: str) -> list[tuple]:
    out = []
    for i in range(n):
        key = None if i % 4 == 0 else f"{tag}-key-{i}".encode()
        value = None if i % 11 == 5 else rng.randbytes(rng.choice([0, 1, 17, 200, 1500]))
        if i % 9 == 0 and value:  # compressible values too
            value = (f"{tag}-{i}-" * 40).encode()
        headers = [("h1", rng.randbytes(5)), ("utf8-ключ", b""), ("nullh", None)] if i % 3 == 0 else None
        out.append((key, value, headers, TS0 + i * 7))
    return out


def _expect(topic: ProducedTopic, recs: list[tuple], offsets: list[tuple[int, int]]) -> None:
    for (key, value, headers, ts), (_, off) in zip(recs, offsets, strict=True):
        topic.expected[off] = (key, value, tuple(headers or ()), ts)


def _topic_config(**extra: str) -> dict[str, str]:
    return {"segment.ms": "200", "segment.bytes": str(16 * MiB), "compression.type": "producer",
            "index.interval.bytes": "512", "max.message.bytes": str(8 * MiB),
            "retention.ms": "-1", **extra}  # our record timestamps are from 2023: time retention would delete them


@pytest.fixture(scope="session")
def broker_topics(kafka) -> dict[str, ProducedTopic]:
    rng = random.Random(405)
    run = uuid.uuid4().hex[:6]
    topics: dict[str, ProducedTopic] = {}
    for codec in CODECS:
        name = f"rsmlog.{codec}-codec-{run}"  # '.' and '-' in topic names on purpose
        # Batches of at most 10 records (70 ms of record timestamps) in segments of 2 s of them: each rolled segment
        # holds ~29 batches, hence several index entries, however the producer's sends fall on a loaded machine (with
        # librdkafka's own batching a round could be one batch, a segment one batch and its index empty).
        tid = kafka.create_topic(name, 1, config=_topic_config(**{"segment.ms": "2000"}))
        t = ProducedTopic(name, tid)
        for part in range(2):  # two produce rounds
            recs = _records(rng, 600, f"{codec}{part}")
            _expect(t, recs, produce(kafka, name, recs, **{"compression.type": codec, "linger.ms": 20,
                                                           "batch.num.messages": 10}))
        if codec == "none":
            big = [(b"big", os.urandom(BIG_VALUE_BYTES), [("size", b"5MiB")], TS0 + 999_999)]
            _expect(t, big, produce(kafka, name, big, **{"message.max.bytes": 10 * MiB}))
        topics[codec] = t

    name = f"rsmlog-txn-{run}"
    tid = kafka.create_topic(name, 1, config=_topic_config())
    t = ProducedTopic(name, tid)
    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"rsmlog-{run}",
                         "linger.ms": 5, "compression.type": "lz4"})
    producer.init_transactions(30)

    def txn(recs: list[tuple], commit: bool) -> list[int]:
        offsets: list[int] = []

        def cb(err, msg):
            if err is not None:
                raise RuntimeError(f"delivery failed: {err}")
            offsets.append(msg.offset())

        producer.begin_transaction()
        for i, (key, value, headers, ts) in enumerate(recs):
            producer.produce(name, key=key, value=value, headers=headers, partition=0, timestamp=ts, on_delivery=cb)
            if i % 5 == 4:
                # A batch of 5 records (~1.7 KiB), whatever the machine's speed: the segment rolls by record
                # timestamps (7 ms apart, segment.ms=200), so it holds several batches, hence several index entries.
                producer.flush(30)
        producer.flush(30)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)
        return offsets

    committed = _records(rng, 50, "commit")
    offs = txn(committed, True)
    _expect(t, committed, [(0, o) for o in offs])
    t.committed = offs
    aborted = _records(rng, 30, "abort")
    offs = txn(aborted, False)
    _expect(t, aborted, [(0, o) for o in offs])  # aborted records are still in the log, byte-exact
    t.aborted = offs
    more = _records(rng, 20, "commit2")
    offs = txn(more, True)
    _expect(t, more, [(0, o) for o in offs])
    t.committed += offs
    topics["txn"] = t

    for t in topics.values():
        t.pdir = partition_dir(kafka, t.name)
        # roll after the last produce; a filler append (key ROLL_KEY) starts the new active segment
        roll_and_wait(kafka, t.name, 0, rolled=1)
        last = max(t.expected)
        while not any(int(p.stem) > last for p in t.pdir.glob("*.log")):
            roll_and_wait(kafka, t.name, 0, rolled=len(list(t.pdir.glob("*.log"))))
    return topics
