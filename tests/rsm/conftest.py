"""Fixtures of the RemoteStorageManager tests: segments the real broker wrote, and one store per kind."""

from __future__ import annotations

import random
import shutil
import struct
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from confluent_kafka import Producer

from rsm.api import EpochEntry, LogSegmentData, RemoteSegmentMetadata
from rsm.log.batch import BatchHeader, batch_crc, scan_batches
from rsm.log.partition import PartitionDir
from rsm.store.fs import FileSystemStore
from rsm.store.s3 import S3Store
from tests.support.kafka import partition_dir, produce, roll_and_wait

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


@dataclass(frozen=True)
class BrokerSegment:
    """A rolled segment the broker wrote (files copied aside so retention cannot take them)."""

    topic_name: str
    topic_id: uuid.UUID
    base_offset: int
    end_offset_inclusive: int
    data: LogSegmentData
    batches: tuple[BatchHeader, ...]

    def metadata(self, segment_id: uuid.UUID | None = None) -> RemoteSegmentMetadata:
        epochs = sorted({b.partition_leader_epoch for b in self.batches})
        return RemoteSegmentMetadata(
            remote_segment_id=segment_id or uuid.uuid4(), topic_id=self.topic_id, topic_name=self.topic_name,
            partition=0, start_offset=self.base_offset, end_offset_inclusive=self.end_offset_inclusive,
            max_timestamp_ms=max(b.max_timestamp for b in self.batches),
            segment_size_bytes=self.data.log_path.stat().st_size,
            broker_id=1, event_timestamp_ms=1_700_000_000_000,
            segment_leader_epochs=tuple(EpochEntry(e, self.base_offset) for e in epochs))


def _produce_transactions(kafka, topic: str) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"tx-{topic}",
                  "linger.ms": 5, "compression.type": "lz4"})
    p.init_transactions(60)
    p.begin_transaction()
    for i in range(50):
        p.produce(topic, key=b"tx-commit-%d" % i, value=b"c" * 300, partition=0)
    p.commit_transaction(60)
    p.begin_transaction()
    for i in range(50):
        p.produce(topic, key=b"tx-abort-%d" % i, value=b"a" * 300, partition=0)
    p.flush(30)
    p.abort_transaction(60)
    p.begin_transaction()
    p.produce(topic, key=b"tx-last", value=b"z", partition=0)
    p.commit_transaction(60)


@pytest.fixture(scope="session")
def broker_segments(kafka, tmp_path_factory) -> list[BrokerSegment]:
    """Rolled segments of one topic: one per codec (many batches, headers, explicit timestamps) and one
    holding a committed and an aborted transaction (so it has a ``.txnindex``)."""
    topic = f"rsm-contract-{uuid.uuid4().hex[:8]}"
    topic_id = kafka.create_topic(topic, 1, 1, {"segment.ms": "200", "message.timestamp.type": "CreateTime",
                                                   # our timestamps are from 2023: time retention would delete them
                                                   "retention.ms": "-1"})
    ts0 = 1_700_000_000_000
    for n, codec in enumerate(CODECS):
        records = [(b"k%d" % i, (b"%s-%05d-" % (codec.encode(), i)) * (1 + i % 40),
                    [("h", b"v%d" % i)] if i % 7 == 0 else None, ts0 + n * 100_000 + i) for i in range(400)]
        produce(kafka, topic, records, **{"compression.type": codec, "batch.size": 8192, "linger.ms": 2})
    _produce_transactions(kafka, topic)
    pdir = partition_dir(kafka, topic)
    roll_and_wait(kafka, topic, 0, rolled=len(list(pdir.glob("*.log"))))
    part = PartitionDir(pdir)
    segments = part.segments()
    out_dir = tmp_path_factory.mktemp("broker-segments")
    epoch_bytes = (pdir / "leader-epoch-checkpoint").read_bytes()
    result = []
    for i, seg in enumerate(segments):
        if seg.is_active:
            continue
        nxt = segments[i + 1].base_offset
        copies = {}
        snapshot = pdir / f"{nxt:020d}.snapshot"
        for name, src in (("log", seg.log_path), ("index", seg.offset_index_path), ("timeindex", seg.time_index_path),
                          ("txnindex", seg.txn_index_path), ("snapshot", snapshot if snapshot.exists() else None)):
            if src is None:
                copies[name] = None
                continue
            dst = out_dir / src.name
            shutil.copyfile(src, dst)
            copies[name] = dst
        batches = tuple(scan_batches(copies["log"]))
        if not batches:
            continue
        data = LogSegmentData(copies["log"], copies["index"], copies["timeindex"], copies["txnindex"],
                              copies["snapshot"], epoch_bytes)
        result.append(BrokerSegment(topic, topic_id, seg.base_offset, nxt - 1, data, batches))
    assert len(result) >= len(CODECS) + 1, [s.base_offset for s in result]
    return result


def s3_client_for(endpoint: str):
    """A boto3 client of ``endpoint`` with the default credentials, checksums only when required, path-style."""
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, request_checksum_calculation="when_required",
                                      response_checksum_validation="when_required"))


@pytest.fixture(scope="session")
def s3_client(s3_endpoint):
    """A client of moto's server."""
    return s3_client_for(s3_endpoint)


def _varint(n: int) -> bytes:
    z, out = (n << 1) ^ (n >> 63), bytearray()
    while z > 0x7F:
        out.append(z & 0x7F | 0x80)
        z >>= 7
    return bytes(out + bytes([z]))


def synthetic_segment(tmp: Path, size_bytes: int) -> tuple[LogSegmentData, int]:
    """A ``.log`` of about ``size_bytes`` in ``tmp`` (empty offset and time indexes): uncompressed v2 batches of one
    60 KiB record each, valid CRC-32C, offsets 0, 1, 2 ...; its data and its last offset."""
    rng = random.Random(5)
    ts = 1_700_000_000_000
    with open(tmp / "0.log", "wb") as f:
        offset = 0
        while offset * 61440 < size_bytes:
            value = rng.randbytes(61440)
            body = b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(len(value)) + value + _varint(0)
            after_len = (struct.pack(">ibI", 0, 2, 0) + struct.pack(">hiqqqhii", 0, 0, ts, ts, -1, -1, -1, 1)
                         + _varint(len(body)) + body)
            batch = bytearray(struct.pack(">qi", offset, len(after_len)) + after_len)
            batch[17:21] = struct.pack(">I", batch_crc(batch))
            f.write(batch)
            offset += 1
    (tmp / "0.index").write_bytes(b"")
    (tmp / "0.timeindex").write_bytes(b"")
    return LogSegmentData(tmp / "0.log", tmp / "0.index", tmp / "0.timeindex", None, None, b"0\n0\n"), offset - 1


def new_bucket(s3_client) -> str:
    name = f"rsm-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture(params=["fs", "moto", "s3proxy"])
def store_kind(request) -> str:
    """The stores of the contract: the file system, moto's S3 mock, s3proxy (a real S3 server)."""
    return request.param


@pytest.fixture
def store(store_kind, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[FileSystemStore | S3Store]:
    if store_kind == "fs":
        yield FileSystemStore(tmp_path / "remote")
        return
    endpoint = request.getfixturevalue("s3_endpoint" if store_kind == "moto" else "s3proxy_endpoint")
    s3 = S3Store(new_bucket(s3_client_for(endpoint)), endpoint_url=endpoint, region_name="us-east-1",
                 part_size_bytes=5 * 1024 * 1024)
    try:
        yield s3
    finally:
        s3.close()


def corrupt_byte(store, key: str, position: int) -> None:
    """Flip one byte of a stored object behind the store's back (bit rot)."""
    if isinstance(store, FileSystemStore):
        path = store.root / key
        data = bytearray(path.read_bytes())
        data[position] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        k = store.key_prefix + key
        data = bytearray(store.client.get_object(Bucket=store.bucket, Key=k)["Body"].read())
        data[position] ^= 0xFF
        store.client.put_object(Bucket=store.bucket, Key=k, Body=bytes(data))
