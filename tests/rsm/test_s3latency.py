"""The latency-emulating S3 (devtools/s3latency.py): bytes through it are exact both ways (multipart PUT, ranged
GETs, HEAD, listings, a missing key), its delays follow the model it is given, seeded. No timings are asserted."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from devtools.s3latency import LatencyModel, S3Latency
from rsm.errors import RemoteResourceNotFoundError
from rsm.store.s3 import S3Store
from tests.support.stores import new_bucket, s3_client_for

pytestmark = [pytest.mark.s3]

MiB = 1024 * 1024
# fast figures: the test checks bytes, not time
FAST = LatencyModel(first_byte_median_ms=1, first_byte_floor_ms=0.5, put_base_ms=1, put_ms_per_mib=0.5,
                    bandwidth_bytes_per_s=2e9)


def test_bytes_through_the_emulator_are_exact(s3proxy_endpoint) -> None:
    bucket = new_bucket(s3_client_for(s3proxy_endpoint))
    data = random.Random(3).randbytes(11 * MiB + 12345)
    with S3Latency(s3proxy_endpoint, FAST, seed=5) as lat:
        store = S3Store(bucket, endpoint_url=lat.url, region_name="us-east-1", part_size_bytes=5 * MiB)
        try:
            assert store.put("a/obj", (data[p:p + MiB] for p in range(0, len(data), MiB))) == len(data)  # multipart
            store.put("a/small", [b"x" * 100])
            assert store.get_bytes("a/obj") == data
            assert store.get_bytes("a/obj", 7, 6 * MiB + 3) == data[7:6 * MiB + 4]
            assert store.head("a/obj") == len(data)
            assert store.head("a/none") is None
            assert [(o.key, o.size_bytes) for o in store.list("a/")] == [("a/obj", len(data)), ("a/small", 100)]
            with pytest.raises(RemoteResourceNotFoundError):
                store.get_bytes("a/none")
            store.delete_many(["a/obj", "a/small"])
            assert list(store.list("a/")) == []
        finally:
            store.close()
        stats = lat.stats()
    assert stats["requests_PUT"] >= 4  # 3 parts and one small object
    assert stats["bytes_in"] >= len(data) + 100
    assert stats["bytes_out"] >= len(data) + 6 * MiB
    assert stats.get("outliers", 0) == 0


def test_delays_follow_the_model_and_the_seed() -> None:
    model = LatencyModel(outlier_rate=0.05)
    a = S3Latency("http://127.0.0.1:9", model, seed=7)
    b = S3Latency("http://127.0.0.1:9", model, seed=7)
    try:
        gets = [a.draw_delay_s("GET", 0) for _ in range(4000)]
        assert gets == [b.draw_delay_s("GET", 0) for _ in range(4000)]  # seeded: the same draws
        outliers = a.stats()["outliers"]
        assert 100 <= outliers <= 300  # 5% of 4000
        plain = sorted(d for d in gets if d < model.outlier_min_s)
        assert min(plain) >= model.first_byte_floor_ms / 1000
        assert statistics.median(plain) == pytest.approx(model.first_byte_median_ms / 1000, rel=0.1)
        # lognormal sigma 0.6: the log of the draws above the floor spreads like it
        p90 = plain[int(0.9 * len(plain))]
        assert math.log(p90 / statistics.median(plain)) == pytest.approx(1.2816 * 0.6, rel=0.15)
        assert max(gets) <= model.first_byte_median_ms * 20 / 1000 + model.outlier_max_s
        # a PUT costs its base plus its size, never a lognormal draw (outliers aside)
        quiet = S3Latency("http://127.0.0.1:9", LatencyModel(), seed=1)
        try:
            assert quiet.draw_delay_s("PUT", 8 * MiB) == pytest.approx(0.060 + 8 * 0.020)
        finally:
            quiet.stop()
    finally:
        a.stop()
        b.stop()


def test_the_model_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="bandwidth"):
        LatencyModel(bandwidth_bytes_per_s=0)
    with pytest.raises(ValueError, match="outlier_rate"):
        LatencyModel(outlier_rate=1.5)
