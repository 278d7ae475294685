"""Applications that know nothing of the tier read the whole log through the proxy (``history_listener.proxy``):
a Kafka Streams app and Spark's own ``kafka`` source, each with the sidecar's listener as its only bootstrap server
(issue 24, "Done means").

One module-scoped set-up on the session broker: a topic of 2 partitions, three segments each (tiered by an
in-process sidecar), then DeleteRecords moves the broker's log start into the tier (inside a segment, as in
``test_proxy.py``): offsets below it exist only remotely. Then one more round is produced, to the broker's log only.
Keys repeat (``KEYS`` of them), values are binary, some records carry headers.

Both apps run at once, as child processes, while the set-up waits:

- **Kafka Streams** (``tests/support/java/StreamsCount.java``, compiled at test time against the ``kafka-streams``
  jar from Maven Central at the broker's Kafka version: :mod:`devtools.kafka_streams`): counts records per key from
  the beginning (``auto.offset.reset=earliest``) through a repartition topic into an in-memory store (changelogged),
  exactly once (``exactly_once_v2``: transactions through the proxy), and writes the counts to an output topic. The
  internal topics are created by Streams through the proxy (CreateTopics forwarded), the output topic by an
  AdminClient through the proxy; Streams' consumer group commits on the broker (in its transactions).
  Exactly-once failed at first (``InvalidTxnStateException: Partition was not added to the transaction``): the proxy
  passed on the broker's ``transaction.version`` 2 while offering Produce below v12, which Transactions V2 needs.
  The proxy now offers Produce at the broker's versions (``test_proxy_produce.py``), so Streams runs Transactions V2
  through it.
- **Spark** (``spark-sql-kafka-0-10``, in a child process: :mod:`tests.support.spark_kafka_child`): one batch query,
  ``subscribe`` and ``startingOffsets earliest``, reading tier and broker data at once.
"""

from __future__ import annotations

import struct
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from devtools.devkafka import KafkaCluster
from devtools.kafka_streams import compile_app, java_app_cmd
from devtools.spark_kafka import spark_kafka_jars
from rlm.listener import start_listener
from rlm.listener.net.server import REQUESTS
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.support import spark_kafka_child
from tests.support.clients import Rec, producer, send
from tests.support.kafka import broker_watermarks
from tests.support.sidecar import make_settings, wait_for

pytestmark = pytest.mark.slow

PARTITIONS = 2
ROUNDS, PER_ROUND = 3, 50  # per partition: three tiered segments, then a roll record, then LIVE more (not tiered)
LIVE = 30
SEGMENT_MS = 300
LOG_START = {0: 2 * PER_ROUND - 7, 1: PER_ROUND + 3}  # the broker's log start after DeleteRecords: inside segments
TIERED = ROUNDS * PER_ROUND
KEYS = 11
APP_TIMEOUT_S = 300  # each app took 25-120 s here, on 2 cores shared with other work
STREAMS_SOURCE = Path(__file__).resolve().parents[2] / "support" / "java" / "StreamsCount.java"


@dataclass
class Apps:
    """What was produced and what each app returned."""

    topic: str
    output: str
    app_id: str
    produced: dict[int, list[Rec]]  # partition -> records in offset order
    ends: dict[int, int]  # the broker's end offsets when the apps started
    streams_counts: dict[bytes, int] = field(default_factory=dict)  # key -> count, as the app printed them
    streams_total: int = 0
    spark_rows: list[dict[str, Any]] = field(default_factory=list)
    requests: dict[tuple[str, str], float] = field(default_factory=dict)  # (api, error) -> answered by the proxy
    seconds: dict[str, float] = field(default_factory=dict)


def _record(p: int, r: int, i: int) -> tuple[bytes, bytes, list[tuple[str, bytes | None]] | None, int]:
    """Record ``i`` of round ``r`` of partition ``p``: a key out of KEYS, a binary value, headers on some."""
    key = f"key-{(i * 7 + r + p) % KEYS}".encode()
    value = f"v{p}.{r}.{i}|".encode() * (1 + i % 7) + bytes((i * 31 + j + p) % 256 for j in range(i % 40))
    headers = [("h", bytes([i % 256, 0, 0xFF])), ("dup", b"a"), ("dup", b"b"), ("null", None)] if i % 6 == 1 else None
    return key, value, headers, 0


def _produce(kafka: KafkaCluster, topic: str, p: int, r: int, n: int) -> list[Rec]:
    return send(producer(kafka, **{"batch.num.messages": 10}), topic, p, [_record(p, r, i) for i in range(n)])


@pytest.fixture(scope="module")
def apps(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Apps]:
    tmp = tmp_path_factory.mktemp("proxy-apps")
    tag = uuid.uuid4().hex[:6]
    topic = f"proxy-apps-{tag}"
    tid = kafka.create_topic(topic, PARTITIONS, config={"segment.ms": str(SEGMENT_MS)})
    # Resolved (and compiled) before anything runs: a missing jar or JDK fails the module here, under CI too.
    classes = compile_app(STREAMS_SOURCE)
    import pyspark

    _version, spark_jars = spark_kafka_jars(pyspark.__version__)

    produced: dict[int, list[Rec]] = {p: [] for p in range(PARTITIONS)}
    for r in range(ROUNDS):
        for p in range(PARTITIONS):
            produced[p] += _produce(kafka, topic, p, r, PER_ROUND)
        time.sleep(SEGMENT_MS / 1000 + 0.05)
    for p in range(PARTITIONS):  # rolls the last round's segment: the tier ends at TIERED
        produced[p] += send(producer(kafka), topic, p, [(b"__roll__", b"r", None, 0)])
    settings = make_settings(kafka, tmp, topics={"include": [topic]}, history_listener={
        "host": "127.0.0.1", "port": 0, "proxy": True, "authorization": {"allow_if_no_authorizer": True}})
    sidecar = Sidecar(settings).start()
    listener = None
    procs: dict[str, subprocess.Popen] = {}
    try:
        listener = start_listener(settings, sidecar.rsm)
        tier = listener.server.router.ctx.tier
        for p in range(PARTITIONS):
            tp = TopicIdPartition(tid, topic, p)

            def tiered(tp: TopicIdPartition = tp) -> bool:
                tier.refresh([tp])
                t = tier.partition(tp)
                return t is not None and (t.log_start_offset, t.high_watermark) == (0, TIERED)
            wait_for(tiered, 90, f"{tp} tiered up to {TIERED}")
        admin = AdminClient(kafka.admin_config())
        for fut in admin.delete_records([TopicPartition(topic, p, o) for p, o in LOG_START.items()]).values():
            fut.result(30)
        for p, o in LOG_START.items():
            assert broker_watermarks(kafka, topic, p)[0] == o  # offsets below o: the tier's alone
        for p in range(PARTITIONS):  # the broker's log only (its active segment)
            produced[p] += _produce(kafka, topic, p, ROUNDS, LIVE)
        ends = {p: broker_watermarks(kafka, topic, p)[1] for p in range(PARTITIONS)}
        assert ends == {p: len(produced[p]) for p in range(PARTITIONS)}

        proxy = f"127.0.0.1:{listener.port}"
        setup = Apps(topic, f"{topic}-counts", f"counts-{tag}", produced, ends)
        # The output topic, created through the proxy (CreateTopics forwarded).
        through = AdminClient({"bootstrap.servers": proxy})  # kept referenced: its futures die with it
        (fut,) = through.create_topics([NewTopic(setup.output, 1, 1)], operation_timeout=30).values()
        fut.result(30)
        del through

        before = _requests()
        started = time.monotonic()
        reads = {"subscribe": {"kafka.bootstrap.servers": proxy, "subscribe": topic, "startingOffsets": "earliest",
                               "endingOffsets": "latest", "includeHeaders": "true"}}
        with open(tmp / "spark.log", "wb") as spark_log, open(tmp / "streams.out", "wb") as streams_out, \
                open(tmp / "streams.log", "wb") as streams_log:
            procs["spark"] = spark_kafka_child.start(spark_jars, reads, tmp / "spark-rows.json", tmp / "spark.json",
                                                     spark_log)
            procs["streams"] = subprocess.Popen(
                java_app_cmd(classes, "StreamsCount", [proxy, setup.app_id, topic, setup.output,
                                                       str(sum(ends.values())), str((APP_TIMEOUT_S - 30) * 1000),
                                                       str(tmp / "streams-state")]),
                stdout=streams_out, stderr=streams_log, stdin=subprocess.DEVNULL)
            while len(setup.seconds) < len(procs):  # each app's own time (they run at once)
                assert time.monotonic() - started < APP_TIMEOUT_S, f"still running: {procs.keys() - setup.seconds}"
                for name, proc in procs.items():
                    if name not in setup.seconds and proc.poll() is not None:
                        setup.seconds[name] = time.monotonic() - started
                time.sleep(0.2)
        for name, proc in procs.items():
            log = (tmp / f"{name}.log").read_text(errors="replace")[-6000:]
            assert proc.returncode == 0, f"{name} exited {proc.returncode}:\n{log}"
        setup.requests = {k: n - before.get(k, 0) for k, n in _requests().items() if n > before.get(k, 0)}
        setup.spark_rows = spark_kafka_child.load(tmp / "spark-rows.json")["subscribe"]
        for line in (tmp / "streams.out").read_text().splitlines():
            what, *rest = line.split("\t")
            if what == "COUNT":
                setup.streams_counts[bytes.fromhex(rest[0])] = int(rest[1])
            elif what == "TOTAL":
                setup.streams_total = int(rest[0])
        print(f"proxy apps: {setup.seconds} {setup.requests}")
        yield setup
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if listener is not None:
            listener.stop()
        sidecar.stop()


def _requests() -> dict[tuple[str, str], float]:
    """(api, error) -> requests the listener answered so far (its counter)."""
    return {(s.labels["api"], s.labels["error"]): s.value for m in REQUESTS.collect() for s in m.samples
            if s.name.endswith("_total")}


def _group_offsets(kafka: KafkaCluster, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets as the broker's own admin API gives them."""
    admin = AdminClient(kafka.admin_config())  # kept referenced: its futures die with it
    futs = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    return {tp.partition: tp.offset for tp in futs[group].result(30).topic_partitions if tp.topic == topic}


def _last_values(kafka: KafkaCluster, topic: str) -> dict[bytes, bytes]:
    """Key -> the last committed value of ``topic`` (1 partition), read straight from the broker to its end."""
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"read-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "isolation.level": "read_committed", "enable.partition.eof": True})
    out: dict[bytes, bytes] = {}
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, len(out)
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF:
                return out
            assert msg.error() is None, msg.error()
            out[msg.key()] = msg.value()
    finally:
        c.close()


def test_kafka_streams_counts_every_record_of_the_log_history_included(apps: Apps, kafka: KafkaCluster) -> None:
    """The Streams app's counts per key are those of every record produced, from offset 0 (the tier's alone) across
    the boundary to the broker's end, each once (exactly once: its transactions went through the proxy); the counts
    it committed to the output topic say the same (read from the broker, read_committed); its internal topics exist
    on the broker, and its group committed the input's end there."""
    want = Counter(r.key for recs in apps.produced.values() for r in recs)
    assert sum(want.values()) == sum(apps.ends.values())
    assert apps.streams_counts == dict(want)
    assert apps.streams_total == sum(apps.ends.values())
    assert {k: struct.unpack(">q", v)[0] for k, v in _last_values(kafka, apps.output).items()} == dict(want)
    topics = AdminClient(kafka.admin_config()).list_topics(timeout=30).topics
    internal = {t for t in topics if t.startswith(f"{apps.app_id}-")}
    assert any(t.endswith("-repartition") for t in internal), internal
    assert any(t.endswith("-changelog") for t in internal), internal
    assert _group_offsets(kafka, apps.app_id, apps.topic) == apps.ends


def test_spark_kafka_source_subscribe_earliest_reads_tier_and_broker_in_one_batch_byte_exact(apps: Apps) -> None:
    """Spark's ``kafka`` source (``subscribe``, ``startingOffsets earliest``) returns every record of both
    partitions, from offset 0 (the tier's alone) to the broker's end, once each: keys, values, headers, offsets,
    partitions and timestamps as produced."""
    want = {(apps.topic, p, r.offset): (r.key, r.value, r.headers or None, r.timestamp, 0)
            for p, recs in apps.produced.items() for r in recs}
    got = spark_kafka_child.rows(apps.spark_rows)
    assert len(got) == len(want)
    assert got == want
    for p in range(PARTITIONS):  # both sides of the boundary, in the one query
        offsets = sorted(o for t, q, o in got if q == p)
        assert offsets[0] == 0 < LOG_START[p] < offsets[-1] + 1 == apps.ends[p]


def test_the_apps_needed_nothing_the_proxy_refuses(apps: Apps) -> None:
    """Every request of both apps was answered without an error of the listener's own (none UNSUPPORTED_VERSION,
    none refused or malformed), and Fetch and ListOffsets were among them, and the forwarded CreateTopics (Streams'
    internal topics) and TxnOffsetCommit (exactly_once_v2's commits), each counted under its own name."""
    assert {err for _api, err in apps.requests} == {"none"}, apps.requests
    assert apps.requests.get(("fetch", "none"), 0) > 0, apps.requests
    assert apps.requests.get(("list_offsets", "none"), 0) > 0, apps.requests
    assert apps.requests.get(("create_topics", "none"), 0) > 0, apps.requests
    assert apps.requests.get(("txn_offset_commit", "none"), 0) > 0, apps.requests
