"""Kafka's own Java clients read history through the history endpoint: Kafka's console consumer (from the broker
jars) and Spark's ``kafka`` source (``spark-sql-kafka-0-10``: an AdminClient for Metadata/ListOffsets, consumers
with ``assign()`` on the executors), byte-exact against what was produced, after the broker deleted it.

One module-scoped set-up on the session broker:

- ``main``: partition 0 gets three rounds (one segment each: record time jumps a minute per round) of printable
  keys and values, null and empty keys and values, headers (repeated keys, empty and null values), explicit
  timestamps, small producer batches; then one record of 3 MiB (a batch above every consumer's default
  ``max.partition.fetch.bytes``: Kafka's "at least one batch" rule); partition 1 gets two plain rounds;
- ``codecs``: one round per codec (none, gzip, snappy, lz4, zstd), headers on some records;
- ``txn``: committed and aborted transactions with plain records in between.

An in-process sidecar tiers them; the topics' local retention is then cut to one byte, so the broker deletes every
rolled segment: its log start offset is past every offset read here (asserted). The history endpoint
(:func:`rlm.listener.start_listener`) serves the tier on a free port.

The clients run as their own processes, at once: the console consumer prints with control-character separators
and ``null.literal`` (raw bytes: no deserializer), Spark runs in a child Python process
(:mod:`tests.support.spark_kafka_child`) whose JVM gets the connector's jars at launch, and writes its rows as JSON.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from devtools.devkafka import KafkaCluster
from tests.support import spark_kafka_child

pytestmark = pytest.mark.slow

MiB = 1024 * 1024
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
ROUND_MS = 60_000  # record time between rounds: the broker rolls a segment at each round's first batch
BIG_BYTES = 3 * MiB
CLIENT_TIMEOUT_S = 150

# The console consumer's output: fields, headers and records end in control characters no produced byte uses.
FIELD_SEP, HEADER_SEP, RECORD_END, NULL = b"\x1f", b"\x1e", b"\x1d\n", b"<NULL>"
CONSOLE_PROPERTIES = ("print.timestamp=true", "print.partition=true", "print.offset=true", "print.headers=true",
                      "print.key=true", "null.literal=<NULL>", "key.separator=\x1f", "headers.separator=\x1e",
                      "line.separator=\x1d\n")

Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class Rec:
    key: bytes | None
    value: bytes | None
    headers: Headers = ()
    timestamp_ms: int | None = None  # None: the producer's clock (not compared)


@dataclass
class Tiered:
    endpoint: str
    main: str
    codecs: str
    txn: str
    records: dict[tuple[str, int], dict[int, Rec]] = field(default_factory=dict)  # (topic, p) -> offset -> record
    aborted: dict[int, Rec] = field(default_factory=dict)  # txn-0 offsets of aborted transactions
    committed: dict[int, Rec] = field(default_factory=dict)  # txn-0: committed and plain records
    broker_start: dict[tuple[str, int], int] = field(default_factory=dict)  # the broker's log start offsets
    round_start: dict[int, tuple[int, int]] = field(default_factory=dict)  # main-0 round -> (first ts, offset)


# ------------------------------------------------------------------------------------------------- producing
def printable(r: int, i: int, what: str) -> bytes:
    return f"{what} {r}/{i} äöü €".encode() * (1 + (r * 7 + i) % 5)


def main_round(r: int, n: int, base_ts: int) -> list[Rec]:
    out = []
    for i in range(n):
        key = None if i % 23 == 5 else b"" if i % 41 == 9 else f"key-{r}-{i}".encode()
        value = None if i % 29 == 7 else b"" if i % 31 == 3 else printable(r, i, "value")
        headers: Headers = () if i % 4 else (("trace", f"t{r}-{i}".encode()), ("empty", b""), ("nul", None),
                                             ("trace", b"again"))
        out.append(Rec(key, value, headers, base_ts + r * ROUND_MS + i))
    return out


def send(kafka: KafkaCluster, topic: str, partition: int, recs: list[Rec], **conf: Any) -> dict[int, Rec]:
    from tests.support.kafka import produce

    acks = produce(kafka, topic, [(r.key, r.value, list(r.headers), r.timestamp_ms or 0) for r in recs],
                   partition=partition, **{"batch.size": 8192, **conf})
    return {off: r for (_p, off), r in zip(acks, recs, strict=True)}


def produce_main(kafka: KafkaCluster, h: Tiered, base_ts: int) -> None:
    p0: dict[int, Rec] = {}
    for r in range(3):
        sent = send(kafka, h.main, 0, main_round(r, 150, base_ts))
        h.round_start[r] = (base_ts + r * ROUND_MS, min(sent))
        p0 |= sent
    big = Rec(b"big", (b"0123456789abcdef-history-" * (BIG_BYTES // 25 + 1))[:BIG_BYTES], (("size", b"3MiB"),),
              base_ts + 3 * ROUND_MS)
    p0 |= send(kafka, h.main, 0, [big], **{"message.max.bytes": 8 * MiB})
    h.records[(h.main, 0)] = p0
    p1: dict[int, Rec] = {}
    for r in range(2):
        p1 |= send(kafka, h.main, 1, [Rec(f"p1-{r}-{i}".encode(), printable(r, i, "p1"), (), base_ts + r * ROUND_MS
                                          + i) for i in range(80)])
    h.records[(h.main, 1)] = p1
    # a record past the last round (in record time) rolls the segment before it; it stays local (active segment)
    send(kafka, h.main, 0, [Rec(b"__roll__", b"r", (), base_ts + 5 * ROUND_MS)])
    send(kafka, h.main, 1, [Rec(b"__roll__", b"r", (), base_ts + 5 * ROUND_MS)])


def produce_codecs(kafka: KafkaCluster, h: Tiered, base_ts: int) -> None:
    out: dict[int, Rec] = {}
    for r, codec in enumerate(CODECS):
        recs = [Rec(f"{codec}-{i}".encode(), printable(r, i, codec),
                    (("codec", codec.encode()),) if i % 3 == 0 else (), base_ts + r * ROUND_MS + i)
                for i in range(120)]
        out |= send(kafka, h.codecs, 0, recs, **{"compression.type": codec, "batch.size": 4096})
    h.records[(h.codecs, 0)] = out
    send(kafka, h.codecs, 0, [Rec(b"__roll__", b"r", (), base_ts + len(CODECS) * ROUND_MS)])


def produce_txn(kafka: KafkaCluster, h: Tiered) -> None:
    from tests.support.txn import TxnProducer, plain

    tx = TxnProducer(kafka, h.txn)
    for r in range(2):
        h.committed |= {o: Rec(*kv) for o, kv in tx.txn(f"c{r}", 40, commit=True).items()}
        h.aborted |= {o: Rec(*kv) for o, kv in tx.txn(f"a{r}", 30, commit=False).items()}
        h.committed |= {o: Rec(*kv) for o, kv in plain(kafka, h.txn, f"p{r}", 10).items()}
        time.sleep(0.35)  # segment.ms=300: the next append rolls
    h.records[(h.txn, 0)] = h.committed | h.aborted
    plain(kafka, h.txn, "roll", 1)


# ------------------------------------------------------------------------------------------------- set-up
def broker_log_start(kafka: KafkaCluster, topic: str, partition: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"probe-{uuid.uuid4().hex[:6]}"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, partition), timeout=10)[0]
    finally:
        c.close()


@pytest.fixture(scope="module")
def tiered(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiered]:
    from rlm.listener import start_listener
    from rlm.sidecar import Sidecar
    from rlmm.api import TopicIdPartition
    from tests.support.kafka import set_topic_config
    from tests.support.sidecar import latest_remote, make_settings, wait_for

    tag = uuid.uuid4().hex[:8]
    h = Tiered("", f"hist-java-main-{tag}", f"hist-java-codecs-{tag}", f"hist-java-txn-{tag}")
    big = {"max.message.bytes": str(8 * MiB), "segment.bytes": str(16 * MiB)}
    ids = {h.main: kafka.create_topic(h.main, 2, config={"segment.ms": "1000", "retention.ms": "-1", **big}),
           h.codecs: kafka.create_topic(h.codecs, 1, config={"segment.ms": "1000", "retention.ms": "-1"}),
           h.txn: kafka.create_topic(h.txn, 1, config={"segment.ms": "300", "retention.ms": "-1"})}
    base_ts = int(time.time() * 1000) - 3_600_000
    produce_main(kafka, h, base_ts)
    produce_codecs(kafka, h, base_ts)
    produce_txn(kafka, h)

    tmp = tmp_path_factory.mktemp("history-java")
    settings = make_settings(kafka, tmp, topics={"include": [f"hist-java-.*-{tag}"]},
                             history_listener={"host": "127.0.0.1", "port": 0,
                                               "authorization": {"allow_if_no_authorizer": True}})
    sidecar = Sidecar(settings).start()
    served = None
    try:
        for (topic, p), recs in h.records.items():
            tp, last = TopicIdPartition(ids[topic], topic, p), max(recs)
            wait_for(lambda tp=tp, last=last: latest_remote(sidecar, tp) >= last, 90,
                     f"{topic}-{p} to be remote up to {last}")
        # Local retention down to one byte: the broker deletes every rolled segment (the active one, holding the
        # roll record, stays), so nothing read below can come from the broker's own log.
        for topic in ids:
            set_topic_config(kafka, topic, retention_bytes="1")
        for (topic, p), recs in h.records.items():
            last = max(recs)
            h.broker_start[(topic, p)] = wait_for(
                lambda t=topic, p=p, last=last: (s := broker_log_start(kafka, t, p)) > last and s, 60,
                f"the broker to delete {topic}-{p} locally past {last}")
        served = start_listener(settings, sidecar.rsm)
        h.endpoint = f"127.0.0.1:{served.port}"
        yield h
    finally:
        if served is not None:
            served.stop()
        sidecar.stop()


# ------------------------------------------------------------------------------------------------- clients
@dataclass
class Runs:
    console: dict[str, list[tuple[int, int, int, Headers, bytes | None, bytes | None]]]
    spark: dict[str, list[dict[str, Any]]]
    spark_version: str
    seconds: dict[str, float]
    requests: dict[tuple[str, str], float]  # (api, error) -> requests the endpoint answered during the runs


def console_args(h: Tiered, topic: str, n: int, isolation: str) -> list[str]:
    args = ["--bootstrap-server", h.endpoint, "--topic", topic, "--partition", "0", "--offset", "earliest",
            "--max-messages", str(n), "--timeout-ms", "30000", "--isolation-level", isolation]
    for prop in CONSOLE_PROPERTIES:
        args += ["--formatter-property", prop]
    return args


def parse_console(out: bytes) -> list[tuple[int, int, int, Headers, bytes | None, bytes | None]]:
    """(partition, offset, timestamp, headers, key, value) per record printed."""
    rows = []
    assert out.endswith(RECORD_END) or not out, out[-200:]
    for line in out.split(RECORD_END)[:-1]:
        ts, part, off, hdrs, key, value = line.split(FIELD_SEP)
        assert ts.startswith(b"CreateTime:"), line[:100]
        headers: Headers = ()
        if hdrs != b"NO_HEADERS":
            pairs = [h.split(b":", 1) for h in hdrs.split(HEADER_SEP)]
            headers = tuple((k.decode(), None if v == NULL else v) for k, v in pairs)
        rows.append((int(part.removeprefix(b"Partition:")), int(off.removeprefix(b"Offset:")),
                     int(ts.removeprefix(b"CreateTime:")), headers, None if key == NULL else key,
                     None if value == NULL else value))
    return rows


def spark_reads(h: Tiered) -> dict[str, dict[str, str]]:
    """Name -> options of each batch read Spark makes."""
    common = {"kafka.bootstrap.servers": h.endpoint, "startingOffsets": "earliest", "endingOffsets": "latest",
              "includeHeaders": "true"}
    ts2, _ = h.round_start[2]
    return {
        "subscribe": {**common, "subscribe": f"{h.main},{h.codecs}"},
        "assign": {**common, "assign": json.dumps({h.main: [1], h.codecs: [0]})},
        "read_committed": {**common, "assign": json.dumps({h.txn: [0]}),
                           "kafka.isolation.level": "read_committed"},
        "by_timestamp": {**common, "assign": json.dumps({h.main: [0]}),
                         "startingOffsetsByTimestamp": json.dumps({h.main: {"0": ts2}})},
    }


@pytest.fixture(scope="module")
def runs(tiered: Tiered, kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """Every client run once, all at the same time: four console consumers and one Spark child process."""
    import pyspark

    from devtools.spark_kafka import spark_kafka_jars
    from rlm.listener.net.server import REQUESTS

    h = tiered
    tmp = tmp_path_factory.mktemp("history-clients")
    version, jars = spark_kafka_jars(pyspark.__version__)
    before = _requests(REQUESTS)
    started = time.monotonic()
    spark_log = open(tmp / "spark.log", "wb")  # noqa: SIM115 - closed below
    procs = {"spark": spark_kafka_child.start(jars, spark_reads(h), tmp / "spark-rows.json", tmp / "spark.json",
                                              spark_log)}
    n_main = len(h.records[(h.main, 0)])
    consoles = {"main": (h.main, n_main, "read_uncommitted"),
                "codecs": (h.codecs, len(h.records[(h.codecs, 0)]), "read_uncommitted"),
                "txn_committed": (h.txn, len(h.committed), "read_committed"),
                "txn_uncommitted": (h.txn, len(h.committed) + len(h.aborted), "read_uncommitted")}
    for name, (topic, n, isolation) in consoles.items():
        procs[name] = subprocess.Popen(
            kafka.java_cmd("org.apache.kafka.tools.consumer.ConsoleConsumer", console_args(h, topic, n, isolation),
                           heap="512m", log_dir=tmp), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL)
    out: dict[str, tuple[bytes, bytes]] = {}
    seconds: dict[str, float] = {}
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=max(1.0, CLIENT_TIMEOUT_S - (time.monotonic() - started)))
            seconds[name] = time.monotonic() - started
            out[name] = (stdout or b"", stderr or b"")
            assert proc.returncode == 0, (f"{name} exited {proc.returncode}:\n{(stderr or b'').decode()[-3000:]}"
                                          f"{(tmp / 'spark.log').read_text()[-6000:] if name == 'spark' else ''}")
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        spark_log.close()
    after = _requests(REQUESTS)
    return Runs({name: parse_console(out[name][0]) for name in consoles},
                spark_kafka_child.load(tmp / "spark-rows.json"), version, seconds,
                {k: n - before.get(k, 0) for k, n in after.items() if n > before.get(k, 0)})


def _requests(counter: Any) -> dict[tuple[str, str], float]:
    return {(s.labels["api"], s.labels["error"]): s.value for m in counter.collect() for s in m.samples
            if s.name.endswith("_total")}


# --------------------------------------------------------------------------------------------------- tests
def test_the_broker_no_longer_holds_what_is_read(tiered: Tiered) -> None:
    for tp, recs in tiered.records.items():
        assert tiered.broker_start[tp] > max(recs), (tp, tiered.broker_start[tp], max(recs))


def test_java_clients_need_only_what_the_endpoint_serves(runs: Runs) -> None:
    """Kafka 4.3's console consumer and Spark's source (its kafka-clients: an AdminClient, then assign()ed
    consumers) ask only for APIs the endpoint offers, at versions it offers: no request was refused."""
    assert {err for _api, err in runs.requests} == {"none"}, runs.requests
    assert {api for api, _err in runs.requests} <= {"api_versions", "metadata", "describe_cluster",
                                                   "list_offsets", "fetch"}, runs.requests
    assert runs.requests[("fetch", "none")] > 0


def _console_expected(recs: dict[int, Rec], *, timestamps: bool = True) -> list[tuple]:
    return [(0, o, r.timestamp_ms if timestamps else None, r.headers, r.key, r.value) for o, r in sorted(recs.items())]


def _without_ts(rows: list[tuple]) -> list[tuple]:
    return [(p, o, None, hd, k, v) for p, o, _ts, hd, k, v in rows]


@pytest.mark.parametrize("name", ["main", "codecs"])
def test_console_consumer_reads_history_byte_exact(tiered: Tiered, runs: Runs, name: str) -> None:
    topic = tiered.main if name == "main" else tiered.codecs
    want = _console_expected(tiered.records[(topic, 0)])
    got = runs.console[name]
    assert len(got) == len(want)
    assert got == want
    if name == "main":
        assert max(len(v or b"") for *_rest, v in got) == BIG_BYTES  # above max.partition.fetch.bytes (1 MiB)


def test_console_consumer_read_committed_skips_aborted_transactions(tiered: Tiered, runs: Runs) -> None:
    got = _without_ts(runs.console["txn_committed"])
    assert got == _console_expected(tiered.committed, timestamps=False)
    assert not {o for _p, o, *_r in got} & tiered.aborted.keys()
    # read_uncommitted gets the aborted records too (the endpoint serves batches as stored; only control batches
    # are dropped, by the client)
    assert _without_ts(runs.console["txn_uncommitted"]) == _console_expected(
        tiered.committed | tiered.aborted, timestamps=False)


def _spark_expected(h: Tiered, tps: list[tuple[str, int]], *, timestamps: bool = True,
                    keep=lambda tp, o: True) -> dict[tuple[str, int, int], tuple]:  # noqa: ANN001
    return {(t, p, o): (r.key, r.value, r.headers or None, r.timestamp_ms if timestamps else None, 0)
            for t, p in tps for o, r in h.records[(t, p)].items() if keep((t, p), o)}


def test_spark_kafka_source_reads_every_row(tiered: Tiered, runs: Runs) -> None:
    h = tiered
    want = _spark_expected(h, [(h.main, 0), (h.main, 1), (h.codecs, 0)])
    got = spark_kafka_child.rows(runs.spark["subscribe"])
    assert len(got) == len(want)
    assert got == want
    assigned = spark_kafka_child.rows(runs.spark["assign"])
    assert assigned == _spark_expected(h, [(h.main, 1), (h.codecs, 0)])


def test_spark_kafka_source_read_committed(tiered: Tiered, runs: Runs) -> None:
    h = tiered
    got = spark_kafka_child.rows(runs.spark["read_committed"], timestamps=False)
    assert got == _spark_expected(h, [(h.txn, 0)], timestamps=False, keep=lambda _tp, o: o in h.committed)


def test_spark_kafka_source_starting_offsets_by_timestamp(tiered: Tiered, runs: Runs) -> None:
    h = tiered
    _ts, first = h.round_start[2]
    got = spark_kafka_child.rows(runs.spark["by_timestamp"])
    assert min(o for _t, _p, o in got) == first
    assert got == _spark_expected(h, [(h.main, 0)], keep=lambda _tp, o: o >= first)
