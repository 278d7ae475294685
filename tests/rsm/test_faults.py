"""Faults: an S3 endpoint that fails a share of requests (500/503, dropped connections, cut bodies) ends every
write with a complete object or a clean error, never a partial object visible to readers."""

from __future__ import annotations

import random
import uuid

import pytest

from rsm.errors import RemoteResourceNotFoundError, RemoteStorageError
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.s3 import S3Store
from rsm.verify import verify_segment
from tests.rsm.faultproxy import FaultProxy
from tests.support.stores import new_bucket

pytestmark = [pytest.mark.s3]

MiB = 1024 * 1024


def _store(url: str, bucket: str, retries: int) -> S3Store:
    return S3Store(bucket, endpoint_url=url, region_name="us-east-1", part_size_bytes=5 * MiB, retries=retries,
                   connect_timeout_s=5, read_timeout_s=10)


@pytest.mark.parametrize(("rate", "retries"), [(0.3, 2), (0.7, 1)])
def test_multipart_puts_and_gets_through_a_faulty_endpoint(s3_endpoint, s3_client, rate, retries):
    bucket = new_bucket(s3_client)
    clean = _store(s3_endpoint, bucket, 1)
    rng = random.Random(7)
    outcomes = {"ok": 0, "error": 0}
    with FaultProxy(s3_endpoint, rate=rate, seed=11) as proxy:
        faulty = _store(proxy.url, bucket, retries)
        for i in range(8):
            data = rng.randbytes(11 * MiB + i * 1000)
            key = f"faults/obj-{i}"
            try:
                size = faulty.put(key, (data[p:p + MiB] for p in range(0, len(data), MiB)))
            except RemoteStorageError:
                outcomes["error"] += 1
                seen = clean.head(key)
                # clean error: nothing, or (the last answer lost after success) the complete object
                assert seen is None or clean.get_bytes(key) == data
                continue
            outcomes["ok"] += 1
            assert size == len(data)
            assert clean.get_bytes(key) == data
            # ranged reads through the faulty endpoint: retried and resumed, never short or wrong
            try:
                assert faulty.get_bytes(key, 123, 5 * MiB + 77) == data[123:5 * MiB + 78]
            except RemoteStorageError:
                outcomes["error"] += 1
        injected = dict(proxy.injected)
    print("faulty multipart puts:", outcomes, "injected:", injected)
    if rate < 0.5:
        assert outcomes["ok"] >= 3, (outcomes, injected)
    else:
        assert outcomes["error"] >= 1, (outcomes, injected)
    assert sum(injected.values()) >= 5 and len(injected) >= 3, injected


@pytest.mark.parametrize("rate", [0.35, 0.7])
def test_rsm_copies_through_a_faulty_endpoint_are_whole_or_unreadable(s3_endpoint, s3_client, broker_segments,
                                                                       rate):
    bucket = new_bucket(s3_client)
    clean = _store(s3_endpoint, bucket, 1)
    config = RsmConfig(store="s3", bucket=bucket, block_size_bytes=2048, max_data_object_bytes=8192)
    reader = RemoteStorageManager(config, clean)
    results = []
    with FaultProxy(s3_endpoint, rate=rate, seed=3) as proxy:
        faulty = RemoteStorageManager(config, _store(proxy.url, bucket, 1))
        for seg in broker_segments:
            md = seg.metadata(uuid.uuid4())
            try:
                faulty.copy_log_segment_data(md, seg.data)
                results.append("ok")
            except RemoteStorageError:
                results.append("error")
                keys = reader.keys(md)
                if clean.head(keys.index) is None:
                    with pytest.raises(RemoteResourceNotFoundError):
                        reader.fetch_log_segment(md, 0)
                    continue
            # whatever is readable is whole and verified
            report = verify_segment(clean, reader.keys(md))
            assert report.ok, str(report)
            with reader.fetch_log_segment(md, 0) as f:
                assert f.read() == seg.data.log_path.read_bytes()
        injected = sum(proxy.injected.values())
        print("faulty copies:", results, "injected:", dict(proxy.injected), "forwarded:", proxy.forwarded)
    assert injected > 0 and ("ok" in results if rate < 0.5 else "error" in results), (results, injected)


def test_store_requests_and_errors_are_metrics(s3_endpoint, s3_client):
    """``rsm_store_requests_total`` counts every HTTP request (retries included), ``rsm_store_request_errors_total``
    the calls that failed after retries by status (503 from the endpoint, ``connection`` with no endpoint); an
    absent key (404) is an answer, not an error."""
    from socket import socket

    from rsm.store.base import STORE_ERRORS, STORE_REQUESTS

    def count(metric, *labels: str) -> float:
        return metric.labels(*labels)._value.get()

    bucket = new_bucket(s3_client)
    with FaultProxy(s3_endpoint, rate=1.0, faults=("status503",)) as proxy:
        store = _store(proxy.url, bucket, 0)
        sent, failed = count(STORE_REQUESTS, "s3", "PutObject"), count(STORE_ERRORS, "s3", "PutObject", "503")
        with pytest.raises(RemoteStorageError):
            store.put("m/obj", [b"x"])
        assert count(STORE_REQUESTS, "s3", "PutObject") - sent >= 1
        assert count(STORE_ERRORS, "s3", "PutObject", "503") - failed >= 1
    clean = _store(s3_endpoint, bucket, 0)
    absent = count(STORE_ERRORS, "s3", "HeadObject", "404")
    assert clean.head("m/none") is None
    assert count(STORE_ERRORS, "s3", "HeadObject", "404") == absent
    with socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    gone = _store(f"http://127.0.0.1:{port}", bucket, 0)
    before = count(STORE_ERRORS, "s3", "HeadObject", "connection")
    with pytest.raises(RemoteStorageError):
        gone.head("m/obj")
    assert count(STORE_ERRORS, "s3", "HeadObject", "connection") - before == 1
