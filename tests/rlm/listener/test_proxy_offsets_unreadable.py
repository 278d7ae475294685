"""ListOffsets and OffsetForLeaderEpoch through the proxy where a tier copy cannot be read, real broker.

One topic of two partitions, each three segments of 40 records (each record its own timestamp, each segment rolled
by its first record's, ``segment.ms`` apart) and one record that rolls the third, tiered by an in-process sidecar
(copies 0..39, 40..79, 80..119); DeleteRecords puts the broker's log start at 80. Each test flips a byte of a copy's
index object on the filesystem store (bit rot: the copy's time index and block list cannot be read,
:class:`rsm.errors.CorruptRemoteObjectError`) and starts the proxy with a storage manager of its own (no copy read
before), ``hole_confirm_ms`` 0 (a range below the broker's log start the tier is taken to lack is a hole at once):

- partition 0, the copy 40..79: the timestamp of record 60 is KAFKA_STORAGE_ERROR, not the broker's answer (-1 or
  80: past 60..79, which the tier holds);
- partition 1, the newest copy 80..119, whose producer snapshot gives the tier's bounds: EARLIEST is
  KAFKA_STORAGE_ERROR, not the broker's log start 80; so is OffsetForLeaderEpoch of an epoch the broker answers
  undefined (-1, -1: above its latest, E0), while its answer from its checkpoint (E0: the log end) passes unread.

Once the byte is flipped back, the same clients read exactly: offsets_for_times gives 60 and a consumer reads
60..120, a consumer started at the beginning while the copy could not be read reads 0..120. The fast tests of the
decision: ``test_boundary_unreadable.py``, ``test_boundary_epochs_unreadable.py``.
"""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from prometheus_client import REGISTRY

from devtools.devkafka import KafkaCluster
from rlm.config import SidecarSettings
from rlm.listener import Listener, start_listener
from rlm.listener.protocol.codec import ErrorCode
from rlm.listener.tier.offsets import EARLIEST
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from rsm.manager import RemoteStorageManager
from tests.rlm.listener.raw_wire import call, list_offsets
from tests.support.clients import consume_until
from tests.support.kafka import broker_watermarks, produce
from tests.support.sidecar import make_settings, wait_for
from tests.support.stores import index_base, index_keys, unreadable_copy

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROUNDS, PER_ROUND = 3, 40
SEGMENT_MS = 300
ROUND_MS = 1000  # each round's timestamps this far after the last one's: a segment rolls at each round's first record
TIERED = ROUNDS * PER_ROUND  # the tier's high watermark; record 120 stays in the broker's active segment
LOG_START = 80  # the broker's log start after DeleteRecords: the copies 0..39 and 40..79 are the tier's alone
LOOKED_UP = 60  # the record whose timestamp partition 0 looks up, in the copy 40..79
STORAGE_ERROR = ErrorCode.kafka_storage_error


@dataclass
class Tiered:
    kafka: KafkaCluster
    settings: SidecarSettings
    topic: str
    topic_id: uuid.UUID
    stamps: dict[int, int]  # offset -> timestamp, the same on both partitions, rising


@pytest.fixture(scope="module")
def tiered(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiered]:
    tmp: Path = tmp_path_factory.mktemp("offsets-unreadable")
    topic = f"unreadable-{uuid.uuid4().hex[:6]}"
    tid = kafka.create_topic(topic, 2, config={"segment.ms": str(SEGMENT_MS)})
    base = int(time.time() * 1000)
    stamps: dict[int, int] = {}
    for p in range(2):
        for r in range(ROUNDS + 1):
            recs = [(f"r{r}-{i}".encode(), f"value-{r}-{i}".encode(), None, base + r * ROUND_MS + i)
                    for i in range(PER_ROUND if r < ROUNDS else 1)]
            for (_part, offset), rec in zip(produce(kafka, topic, recs, partition=p, **{
                    "batch.num.messages": 10, "enable.idempotence": True}), recs, strict=True):
                assert stamps.setdefault(offset, rec[3]) == rec[3]
    assert sorted(stamps) == list(range(TIERED + 1))
    settings = make_settings(kafka, tmp, topics={"include": [topic]}, history_listener={
        "host": "127.0.0.1", "port": 0, "proxy": True, "authorization": {"allow_if_no_authorizer": True},
        "hole_confirm_ms": 0})
    sidecar = Sidecar(settings).start()
    try:
        for p in range(2):
            tp = TopicIdPartition(tid, topic, p)
            wait_for(lambda tp=tp: _tiered(settings, tp), 60, f"{tp} tiered up to {TIERED}")
    finally:
        sidecar.stop()  # nothing more to copy: the proxy below reads the store and the metadata topic alone
    admin = AdminClient(kafka.admin_config())
    for fut in admin.delete_records([TopicPartition(topic, p, LOG_START) for p in range(2)]).values():
        fut.result(30)
    assert [broker_watermarks(kafka, topic, p)[0] for p in range(2)] == [LOG_START, LOG_START]
    yield Tiered(kafka, settings, topic, tid, stamps)


def _tiered(settings: SidecarSettings, tp: TopicIdPartition) -> bool:
    """Whether the store holds the copies 0..39, 40..79 and 80..119 of ``tp`` (their index objects: written last)."""
    return sorted(index_base(k) for k in index_keys(settings.store.root_path, tp)) == [0, 40, 80]


def _unreadable(t: Tiered, partition: int, base: int) -> AbstractContextManager[None]:
    """The index object of ``partition``'s copy beginning at ``base`` with one byte flipped, then flipped back."""
    return unreadable_copy(t.settings.store.root_path, TopicIdPartition(t.topic_id, t.topic, partition), base)


@contextmanager
def _proxy(t: Tiered) -> Iterator[Listener]:
    """The proxy of the session broker, with a storage manager of its own, its tier of both partitions read."""
    rsm = RemoteStorageManager(t.settings.store)
    listener = start_listener(t.settings, rsm)
    try:
        tier = listener.server.router.ctx.tier
        for p in range(2):
            tp = TopicIdPartition(t.topic_id, t.topic, p)
            wait_for(lambda tp=tp: tier.ready(tp), 30, f"{tp} read by the proxy")
        yield listener
    finally:
        listener.stop()
        rsm.close()


def _ask(listener: Listener, topic: str, ts: int, partition: int) -> tuple[int, int]:
    with socket.create_connection(("127.0.0.1", listener.port), timeout=30) as sock:
        got = list_offsets(sock, topic, ts, partition)
    return got.error_code, got.offset


def _unreadable_answers(api: str = "list_offsets") -> float:
    return REGISTRY.get_sample_value("rlm_history_unreadable_copies_total", {"api": api}) or 0.0


def _end_offset(address: tuple[str, int], topic: str, epoch: int, partition: int) -> tuple[int, int, int]:
    """OffsetForLeaderEpoch v3 (a consumer's: replica id -1, no current epoch): (error code, leader epoch, end
    offset)."""
    with socket.create_connection(address, timeout=30) as sock:
        resp = call(sock, 23, 3, {"replica_id": -1, "topics": [{"topic": topic, "partitions": [
            {"partition": partition, "current_leader_epoch": -1, "leader_epoch": epoch}]}]})
    ((p,),) = [t.partitions for t in resp.topics]
    return p.error_code, p.leader_epoch, p.end_offset


def _consumer(listener: Listener) -> Consumer:
    return Consumer({"bootstrap.servers": f"127.0.0.1:{listener.port}", "group.id": f"u-{uuid.uuid4().hex[:6]}",
                     "auto.offset.reset": "error", "enable.auto.commit": False, "fetch.wait.max.ms": 100})


def test_a_timestamp_lookup_whose_copy_below_the_log_start_is_corrupt_is_a_storage_error(tiered: Tiered) -> None:
    """Partition 0, the copy 40..79 corrupt: the timestamp of record 60 is KAFKA_STORAGE_ERROR through the proxy
    (the broker alone answers -1 or 80: a consumer starting there skips 60..79), counted in
    ``rlm_history_unreadable_copies_total{api="list_offsets"}``; librdkafka's offsets_for_times gets the error, no
    offset. A timestamp the broker holds the first record of, in no copy beginning below its log start (record 100):
    the broker's answer. The byte flipped back: 60, and a consumer assigned there reads 60..120 exactly."""
    t, ts = tiered, tiered.stamps[LOOKED_UP]
    with _proxy(t) as listener:
        with _unreadable(t, 0, 40):
            before = _unreadable_answers()
            assert _ask(listener, t.topic, ts, 0) == (STORAGE_ERROR, -1)
            assert _unreadable_answers() == before + 1
            assert _ask(listener, t.topic, t.stamps[100], 0) == (0, 100)
            c = _consumer(listener)
            try:
                with pytest.raises(KafkaException) as err:
                    c.offsets_for_times([TopicPartition(t.topic, 0, ts)], 10)
                assert err.value.args[0].code() == KafkaError.KAFKA_STORAGE_ERROR
            finally:
                c.close()
        assert _ask(listener, t.topic, ts, 0) == (0, LOOKED_UP)
        c = _consumer(listener)
        try:
            (at,) = c.offsets_for_times([TopicPartition(t.topic, 0, ts)], 10)
            assert (at.error, at.offset) == (None, LOOKED_UP)
            c.assign([at])
            got = consume_until(c, {(t.topic, 0): TIERED + 1}, settle_s=0.5)[(t.topic, 0)]
        finally:
            c.close()
    assert [(r.offset, r.timestamp) for r in got] == [(o, t.stamps[o]) for o in range(LOOKED_UP, TIERED + 1)]


def test_earliest_whose_tier_bounds_cannot_be_read_is_a_storage_error(tiered: Tiered) -> None:
    """Partition 1, the newest copy 80..119 corrupt (its producer snapshot gives the tier's bounds): EARLIEST and the
    timestamp of record 60 are KAFKA_STORAGE_ERROR through the proxy, not the broker's log start 80 (the tier taken
    for empty, 0..79 a hole at once). A consumer started at the beginning meanwhile queries again (librdkafka: 500
    ms later); the byte flipped back, it starts at the tier's 0 and reads 0..120 exactly."""
    t = tiered
    with _proxy(t) as listener, _consumer(listener) as c:
        with _unreadable(t, 1, 80):
            before = _unreadable_answers()
            assert _ask(listener, t.topic, EARLIEST, 1) == (STORAGE_ERROR, -1)
            assert _ask(listener, t.topic, t.stamps[LOOKED_UP], 1) == (STORAGE_ERROR, -1)
            assert _unreadable_answers() == before + 2
            c.assign([TopicPartition(t.topic, 1, OFFSET_BEGINNING)])
            assert c.consume(10, 2.0) == []  # its EARLIEST answered KAFKA_STORAGE_ERROR, asked again
            assert _unreadable_answers() > before + 2
        got = consume_until(c, {(t.topic, 1): TIERED + 1}, settle_s=0.5)[(t.topic, 1)]
    assert [(r.offset, r.timestamp) for r in got] == [(o, t.stamps[o]) for o in range(TIERED + 1)]


def test_an_epoch_the_broker_does_not_answer_from_its_checkpoint_is_a_storage_error_while_the_tier_cannot_be_read(
        tiered: Tiered) -> None:
    """Partition 1, the newest copy 80..119 corrupt (the tier's bounds cannot be read), every record of epoch 0. E1,
    above the broker's latest epoch, it answers undefined (-1, -1: librdkafka resets by ``auto.offset.reset`` on it):
    only the tier could say more, and it cannot be read: KAFKA_STORAGE_ERROR through the proxy, counted in
    ``rlm_history_unreadable_copies_total{api="offset_for_leader_epoch"}`` (before: the tier taken for empty, 0..79 a
    hole at once, the broker's answer passed on). E0, its latest, it answers from its checkpoint with its log end
    (0, 121): the proxy's answer too, the tier not read. The byte flipped back: E1 is the broker's (-1, -1), the
    tier's lineage holding nothing above E0."""
    t = tiered
    broker = ("127.0.0.1", t.kafka.nodes[0].port)
    assert _end_offset(broker, t.topic, 0, 1) == (0, 0, TIERED + 1)
    assert _end_offset(broker, t.topic, 1, 1) == (0, -1, -1)
    with _proxy(t) as listener:
        proxy = ("127.0.0.1", listener.port)
        with _unreadable(t, 1, 80):
            before = _unreadable_answers("offset_for_leader_epoch")
            assert _end_offset(proxy, t.topic, 1, 1) == (STORAGE_ERROR, -1, -1)
            assert _unreadable_answers("offset_for_leader_epoch") == before + 1
            assert _end_offset(proxy, t.topic, 0, 1) == (0, 0, TIERED + 1)
            assert _unreadable_answers("offset_for_leader_epoch") == before + 1
        assert _end_offset(proxy, t.topic, 1, 1) == (0, -1, -1)
