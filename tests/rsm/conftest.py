"""Fixtures of the RemoteStorageManager tests: segments the real broker wrote, and one store per kind."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Producer

from rsm.api import LogSegmentData
from rsm.log.batch import scan_batches
from rsm.log.partition import PartitionDir
from rsm.store.fs import FileSystemStore
from rsm.store.s3 import S3Store
from tests.support.kafka import CODECS, BrokerSegment, partition_dir, produce, roll_and_wait
from tests.support.stores import new_bucket, s3_client_for


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


@pytest.fixture(scope="session")
def s3_client(s3_endpoint):
    """A client of moto's server."""
    return s3_client_for(s3_endpoint)


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
