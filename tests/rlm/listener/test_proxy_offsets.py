"""ListOffsets by timestamp through the proxy while the broker's log start moves, real broker.

One topic of three segments of 40 records (each record its own timestamp, each segment rolled by its first record's,
``segment.ms`` apart), tiered by an in-process sidecar; DeleteRecords puts the broker's log start at 43. A hook on the
proxy's connection to its broker (:meth:`rlm.listener.upstream.brokers.Upstream.request`, the client's request
forwarded) runs DeleteRecords to 80 just before the client's ListOffsets goes to the broker: retention or
DeleteRecords between the proxy's log-start ask and the broker's answer, made deterministic. The broker answers a
timestamp whose first record (60) it deleted a moment before with no offset (-1: Kafka's
``UnifiedLog.fetchOffsetByTimestamp`` looks in the first segment whose largest timestamp is at or after it, 40..79,
still on disk, from the log start on, and finds none) or, that segment deleted, 80; through the proxy the answer is
the tier's, 60.

Partition 1, the same records: DeleteRecords past the tier's end (120, the record that rolled the third segment, in
the broker's active segment, never tiered): a timestamp the tier has no answer to, whose first record is in that
range, is OFFSET_NOT_AVAILABLE while the range is pending (``hole_confirm_ms`` longer than the module), not the
broker's -1. The fast tests of the decision and of the order: ``test_boundary_offsets.py``.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from devtools.devkafka import KafkaCluster
from rlm.listener import Listener, start_listener
from rlm.listener.protocol.apis import ApiKey
from rlm.listener.protocol.codec import ErrorCode
from rlm.listener.upstream.brokers import Upstream
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.rlm.listener.raw_wire import list_offsets
from tests.support.kafka import broker_watermarks, produce
from tests.support.sidecar import make_settings, wait_for

ROUNDS, PER_ROUND = 3, 40  # three segments of 40 records, then one record that rolls the third
SEGMENT_MS = 300
ROUND_MS = 1000  # each round's timestamps this far after the last one's: a segment rolls at each round's first record
TIERED = ROUNDS * PER_ROUND  # the tier's high watermark
LOG_START, MOVED_TO = 43, 80  # the broker's log start, and where DeleteRecords moves it while it answers
LOOKED_UP = 60  # the record whose timestamp is looked up: between the two
PARTITIONS = 2  # 0: the log start moved while the broker answers; 1: a range past the tier's end pending
HOLE_CONFIRM_MS = 600_000  # history_listener.hole_confirm_ms: partition 1's range stays pending


@dataclass
class Moving:
    kafka: KafkaCluster
    listener: Listener
    topic: str
    stamps: dict[int, int]  # offset -> timestamp, the same on both partitions, rising


@pytest.fixture(scope="module")
def moving(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Moving]:
    tmp: Path = tmp_path_factory.mktemp("offsets")
    topic = f"offsets-{uuid.uuid4().hex[:6]}"
    tid = kafka.create_topic(topic, PARTITIONS, config={"segment.ms": str(SEGMENT_MS)})
    base = int(time.time() * 1000)
    stamps: dict[int, int] = {}
    for p in range(PARTITIONS):
        for r in range(ROUNDS + 1):
            n = PER_ROUND if r < ROUNDS else 1
            recs = [(f"r{r}-{i}".encode(), f"value-{r}-{i}".encode() * 3, None, base + r * ROUND_MS + i)
                    for i in range(n)]
            for (_part, offset), rec in zip(produce(kafka, topic, recs, partition=p, **{
                    "batch.num.messages": 10, "enable.idempotence": True}),  # in order: retries not reordered
                                            recs, strict=True):
                assert stamps.setdefault(offset, rec[3]) == rec[3]
    assert sorted(stamps) == list(range(TIERED + 1))
    settings = make_settings(kafka, tmp, topics={"include": [topic]}, history_listener={
        "host": "127.0.0.1", "port": 0, "proxy": True, "authorization": {"allow_if_no_authorizer": True},
        "hole_confirm_ms": HOLE_CONFIRM_MS})
    sidecar = Sidecar(settings).start()
    listener: Listener | None = None
    try:
        listener = start_listener(settings, sidecar.rsm)
        tier = listener.server.router.ctx.tier
        for tp in (TopicIdPartition(tid, topic, p) for p in range(PARTITIONS)):
            def tiered(tp: TopicIdPartition = tp) -> bool:
                tier.refresh([tp])
                t = tier.partition(tp)
                return t is not None and (t.log_start_offset, t.high_watermark) == (0, TIERED)
            wait_for(tiered, 60, f"{tp} tiered up to {TIERED}")
        _delete_records(kafka, topic, 0, LOG_START)
        yield Moving(kafka, listener, topic, stamps)
    finally:
        if listener is not None:
            listener.stop()
        sidecar.stop()


def _delete_records(kafka: KafkaCluster, topic: str, partition: int, before: int) -> None:
    admin = AdminClient(kafka.admin_config())
    for fut in admin.delete_records([TopicPartition(topic, partition, before)]).values():
        fut.result(30)
    assert broker_watermarks(kafka, topic, partition)[0] == before


def _brokers_answer(moving: Moving, ts: int, partition: int) -> Any:
    host, port = moving.kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as broker:
        return list_offsets(broker, moving.topic, ts, partition)


def test_a_timestamp_lookup_the_broker_answers_past_records_deleted_while_it_answers_is_the_tiers(
        moving: Moving, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeleteRecords moves the broker's log start from 43 to 80 just before the client's ListOffsets reaches it: the
    broker answers the timestamp of record 60 with no offset (-1) or 80 (see the module's docstring); the proxy's
    answer is the tier's, 60 with its timestamp and leader epoch. With the log start asked before the answer (43),
    the broker's was passed on: a consumer told -1 (no record at or after the timestamp) or 80 skips 60..79, which
    the tier holds."""
    forward = Upstream.request
    moved: list[bytes] = []

    async def moving_first(self: Upstream, frame: bytes, **kw: bool) -> bytes | None:
        if int.from_bytes(frame[:2], "big") == ApiKey.LIST_OFFSETS and not moved:
            moved.append(frame)
            await asyncio.to_thread(_delete_records, moving.kafka, moving.topic, 0, MOVED_TO)
        return await forward(self, frame, **kw)
    monkeypatch.setattr(Upstream, "request", moving_first)

    ts = moving.stamps[LOOKED_UP]
    with socket.create_connection(("127.0.0.1", moving.listener.port), timeout=30) as sock:
        got = list_offsets(sock, moving.topic, ts)
    assert moved, "the client's ListOffsets did not go through the hook"
    assert (got.error_code, got.offset, got.timestamp, got.leader_epoch) == (0, LOOKED_UP, ts, 0)
    kafkas = _brokers_answer(moving, ts, 0)
    assert kafkas.error_code == 0 and kafkas.offset in (-1, MOVED_TO), kafkas  # what the broker alone says now


def test_a_timestamp_lookup_whose_first_record_may_yet_be_tiered_is_asked_again(moving: Moving) -> None:
    """Partition 1: DeleteRecords to 121, past the tier's end (120): record 120, the only one at or after its
    timestamp, is neither tiered nor the broker's, and the range (120..120) is pending. The broker answers its
    timestamp with -1 (no record at or after it: a consumer would go to the end, past 120 if it is tiered); the
    proxy with OFFSET_NOT_AVAILABLE, which clients retry. The timestamp of a record the tier holds below the
    broker's log start (60): the tier's."""
    _delete_records(moving.kafka, moving.topic, 1, TIERED + 1)
    ts = moving.stamps[TIERED]
    with socket.create_connection(("127.0.0.1", moving.listener.port), timeout=30) as sock:
        got = list_offsets(sock, moving.topic, ts, 1)
        held = list_offsets(sock, moving.topic, moving.stamps[LOOKED_UP], 1)
    assert (got.error_code, got.offset) == (ErrorCode.offset_not_available, -1)
    assert (held.error_code, held.offset, held.timestamp) == (0, LOOKED_UP, moving.stamps[LOOKED_UP])
    kafkas = _brokers_answer(moving, ts, 1)
    assert (kafkas.error_code, kafkas.offset) == (0, -1)  # what the broker alone says
