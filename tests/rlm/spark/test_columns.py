"""The executors' columnar decode (:func:`rlm.spark.columns.decode_columns`) against the record-by-record decode
(:func:`rsm.log.records.decode_records`), on batches the real broker wrote: every codec, null keys, tombstones,
empty values, records of 8 KiB and more (a Length of three bytes), a batch decompressing to more than the scratch
buffer, LogAppendTime; batches with headers are left to the record-by-record decode; malformed batches raise only
CorruptRecordBatchError."""

from __future__ import annotations

import dataclasses
import random
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devtools.devkafka import KafkaCluster
from rlm.spark import columns
from rlm.spark.columns import decode_columns
from rsm.log.batch import HEADER, BatchHeader, iter_batches_with_bytes
from rsm.log.errors import CorruptRecordBatchError
from rsm.log.records import decode_records
from tests.support.kafka import partition_dir, produce, roll_and_wait

pytestmark = pytest.mark.kafka
CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
TS0 = 1_700_000_000_000


def _records(rnd: random.Random, n: int, headers_every: int | None) -> list[tuple]:
    out = []
    for i in range(n):
        key = None if i % 5 == 0 else f"key-{i}".encode()
        size = rnd.choice([0, 1, 60, 63, 64, 200, 8191, 8200, 70_000]) if i % 13 else 20
        value = None if i % 17 == 3 else (rnd.randbytes(size) if i % 2 else bytes(size))
        headers = [("h", b"v"), ("n", None)] if headers_every and i % headers_every == 0 else []
        out.append((key, value, headers, TS0 + i * 3 - (50 if i % 7 == 0 else 0)))
    return out


def _batches(kafka: KafkaCluster, name: str, recs: list[tuple], topic_config: dict[str, str] | None = None,
             **producer: object) -> list[tuple[BatchHeader, bytes]]:
    kafka.create_topic(name, 1, config={"segment.ms": "200", "retention.ms": "-1",
                                        "max.message.bytes": str(16 << 20), **(topic_config or {})})
    produce(kafka, name, recs, **{"linger.ms": 20, "message.max.bytes": 16 << 20, **producer})
    roll_and_wait(kafka, name)
    pdir: Path = partition_dir(kafka, name)
    out = []
    for log in sorted(pdir.glob("*.log"))[:-1]:
        out += [(h, bytes(data)) for h, data in iter_batches_with_bytes(log)]
    return out


@pytest.fixture(scope="module")
def broker_batches(kafka: KafkaCluster) -> dict[str, list[tuple[BatchHeader, bytes]]]:
    rnd = random.Random(14)
    run = uuid.uuid4().hex[:6]
    out = {}
    for codec in CODECS:
        out[codec] = _batches(kafka, f"columns-{codec}-{run}", _records(rnd, 400, None),
                              **{"compression.type": codec, "batch.size": 64 * 1024})
    out["headers"] = _batches(kafka, f"columns-headers-{run}", _records(rnd, 200, 50),
                              **{"compression.type": "lz4", "batch.size": 64 * 1024})
    out["append-time"] = _batches(kafka, f"columns-append-{run}", _records(rnd, 200, None),
                                  {"message.timestamp.type": "LogAppendTime"}, **{"compression.type": "zstd"})
    # one batch decompressing to more than the scratch buffer (and compressing well: it is sent as one batch)
    big = [(b"big", bytes(columns._SCRATCH_BYTES + 100_000), [], TS0), (None, b"after", [], TS0 + 1)]
    out["big"] = _batches(kafka, f"columns-big-{run}", big, **{"compression.type": "lz4", "batch.size": 16 << 20,
                                                                "linger.ms": 200})
    return out


def _same(h: BatchHeader, data: bytes) -> int:
    cols = decode_columns(h, data, path="t.log")
    assert cols is not None
    recs = decode_records(h, data)
    assert cols.offsets.tolist() == [r.offset for r in recs]
    assert cols.timestamps.tolist() == [r.timestamp for r in recs]
    assert cols.keys.to_pylist() == [r.key for r in recs]
    assert cols.values.to_pylist() == [r.value for r in recs]
    assert cols.keys.null_count == sum(r.key is None for r in recs)
    return len(recs)


@pytest.mark.parametrize("kind", [*CODECS, "append-time", "big"])
def test_columns_equal_the_record_by_record_decode(broker_batches: dict, kind: str) -> None:
    batches = [(h, d) for h, d in broker_batches[kind] if not h.is_control]
    assert batches
    if kind in CODECS:  # the codec is the producer's (roll_and_wait's filler records are uncompressed)
        assert sum(h.codec.name.lower() == kind for h, _ in batches) > 1
    n = sum(_same(h, d) for h, d in batches)
    assert n == sum(h.record_count for h, _ in batches)
    if kind == "none":  # records of 8 KiB and more were among them: a Length of three bytes
        assert any(len(v or b"") >= 8192 for h, d in batches for v in decode_columns(h, d).values.to_pylist())
    if kind == "append-time":
        assert all(h.timestamp_type == 1 for h, _ in batches)
    if kind == "big":
        assert len(columns._scratch.buf) > columns._SCRATCH_BYTES  # it grew for the big batch


def test_batches_with_headers_are_left_to_the_record_decode(broker_batches: dict) -> None:
    batches = broker_batches["headers"]
    with_headers = [(h, d) for h, d in batches if any(r.headers for r in decode_records(h, d))]
    without = [(h, d) for h, d in batches if not any(r.headers for r in decode_records(h, d))]
    assert with_headers
    assert all(decode_columns(h, d) is None for h, d in with_headers)
    for h, d in without:
        _same(h, d)


def test_a_truncated_or_padded_batch_names_the_file_and_position(broker_batches: dict) -> None:
    h, data = next((h, d) for h, d in broker_batches["lz4"] if h.record_count > 3)
    with pytest.raises(CorruptRecordBatchError, match=rf"t\.log at byte {h.position}: these"):
        decode_columns(h, data[:-1], path="t.log")
    raw = bytearray(columns._records_bytes(h, data))
    n = h.record_count
    # the records, uncompressed, one byte short and one byte long, in a codec-none batch with the same header
    for records, what in ((raw[:-1], "do not decode"), (raw + b"\0", "bytes after the")):
        body = bytes(data[:HEADER.size]) + bytes(records)
        bad = dataclasses.replace(h, size_bytes=len(body), attributes=h.attributes & ~0x07, record_count=n)
        with pytest.raises(CorruptRecordBatchError, match=what):
            decode_columns(bad, body, path="t.log")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_batches_raise_only_corrupt_record_batch_error(broker_batches: dict, data: st.DataObject) -> None:
    kind = data.draw(st.sampled_from(["none", "lz4", "zstd", "gzip", "snappy"]))
    h, batch = data.draw(st.sampled_from([(h, d) for h, d in broker_batches[kind] if not h.is_control]))
    body = bytearray(batch)
    for _ in range(data.draw(st.integers(1, 4))):
        pos = data.draw(st.integers(HEADER.size, len(body) - 1))
        body[pos] = data.draw(st.integers(0, 255))
    try:
        cols = decode_columns(h, bytes(body), path="t.log")
    except CorruptRecordBatchError as err:
        assert "t.log" in str(err)
        return
    if cols is not None:
        assert len(cols) == h.record_count
        assert len(cols.keys) == len(cols.values) == len(cols.timestamps) == h.record_count


def test_an_arrow_batch_mixes_columnar_and_record_decoded_batches_exactly(broker_batches: dict) -> None:
    from rlm.spark.executor import _Columns, _no_headers, _record_columns, arrow_schema

    batches = [(h, d) for h, d in broker_batches["headers"] + broker_batches["append-time"] if not h.is_control]
    cols = _Columns()
    kinds = set()
    for h, d in batches:
        c = decode_columns(h, d)
        kinds.add((c is not None, int(h.timestamp_type)))
        if c is not None:
            cols.add(c, int(h.timestamp_type), _no_headers(len(c)))
        else:
            c, headers = _record_columns(list(decode_records(h, d)), True)
            cols.add(c, int(h.timestamp_type), headers)
    assert {(True, 0), (False, 0), (True, 1)} <= kinds  # columnar and record-decoded; both timestamp types
    got = cols.to_batch(arrow_schema(True), "t", 7).to_pylist()
    want = [(r.key, r.value, "t", 7, r.offset, r.timestamp, int(h.timestamp_type), list(r.headers))
            for h, d in batches for r in decode_records(h, d)]
    assert [(g["key"], g["value"], g["topic"], g["partition"], g["offset"],
             round(g["timestamp"].timestamp() * 1000), g["timestampType"],
             [(x["key"], x["value"]) for x in g["headers"]]) for g in got] == want
