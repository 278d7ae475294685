"""Hedged GETs (rsm/store/hedge.py, issue 25): a request slower than the delay is sent again and the first answer
used, the other's closed; hedges stay within their share of requests; no hedge before a p95 is known. Through the
latency emulator's outliers and the fault proxy's errors together: reads and copies exact, nothing left behind by a
copy that failed, hedges and retries bounded. No timings are asserted."""

from __future__ import annotations

import random
import threading
import uuid

import pytest

from devtools.s3latency import LatencyModel, S3Latency
from rsm.api import RemoteSegmentMetadata
from rsm.errors import RemoteResourceNotFoundError, RemoteStorageError
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store import hedge
from rsm.store.hedge import Hedger
from rsm.store.s3 import S3Store
from tests.rsm.faultproxy import FaultProxy
from tests.support.batches import synthetic_segment
from tests.support.stores import new_bucket, s3_client_for

MiB = 1024 * 1024


class SlowFirst:
    """A request whose first sending, in each call, waits until a second sending starts (or ``wait_s`` passes);
    with ``release`` it waits for that event instead (set once the call returned: only the hedge can answer it)."""

    def __init__(self, wait_s: float, release: threading.Event | None = None) -> None:
        self.wait_s = wait_s
        self.release = release
        self.discarded: list[str] = []
        self._lock = threading.Lock()
        self._calls = 0
        self._second: threading.Event | None = None
        self.discard_seen = threading.Event()

    def new_call(self) -> None:
        self._second = None

    def __call__(self) -> str:
        with self._lock:
            if self._second is None:
                self._second = threading.Event()
                mine, first = self._second, True
            else:
                mine, first = self._second, False
        if first:
            (self.release or mine).wait(self.wait_s)
            return "first"
        mine.set()
        return "second"

    def discard(self, answer: str) -> None:
        self.discarded.append(answer)
        self.discard_seen.set()


def test_a_slow_request_is_hedged_and_the_loser_discarded() -> None:
    release = threading.Event()
    req = SlowFirst(wait_s=10, release=release)
    # (a delay the first sending surely starts within, even on a loaded machine: SlowFirst's first is whichever
    # sending runs first, and with 1 ms the pool once ran the hedge first under load 20: the hedge lost, (1, 0))
    h: Hedger[str] = Hedger(1.0, req.discard, store="test", fixed_delay_s=0.5)
    won = hedge.HEDGED.labels("test", "won")._value.get()
    try:
        assert h.call(req) == "second"  # the first answers only once the call returned: the hedge must answer it
    finally:
        release.set()
    assert req.discard_seen.wait(10) and req.discarded == ["first"]
    assert (h.hedges, h.won) == (1, 1)
    assert hedge.HEDGED.labels("test", "won")._value.get() == won + 1


def test_hedges_stay_within_their_share() -> None:
    req = SlowFirst(wait_s=0.02)
    h: Hedger[str] = Hedger(0.1, req.discard, store="test", fixed_delay_s=0.001)
    answers = []
    for _ in range(60):
        req.new_call()
        answers.append(h.call(req))
    assert 1 <= h.hedges <= 0.1 * 60 + hedge.BURST
    assert answers.count("second") == h.won and answers.count("first") == 60 - h.won


def test_no_hedge_before_a_p95_is_known_and_none_when_off() -> None:
    h: Hedger[str] = Hedger(1.0, lambda _a: None, store="test")
    for i in range(hedge.MIN_SAMPLES):
        assert h.delay_s() is None
        assert h.call(lambda i=i: f"a{i}") == f"a{i}"
    assert h.delay_s() == hedge.MIN_DELAY_S  # instant answers: the floor
    off: Hedger[str] = Hedger(0.0, lambda _a: None, store="test", fixed_delay_s=0.0)
    req = SlowFirst(wait_s=0.01)
    assert off.call(req) == "first" and off.hedges == 0
    with pytest.raises(ValueError, match="share"):
        Hedger(1.5, lambda _a: None)


# fast figures (bytes are checked, not time), outliers of 0.2-0.3 s on 4% of requests
OUTLIERS = LatencyModel(first_byte_median_ms=2, first_byte_sigma=0.3, first_byte_floor_ms=1, put_base_ms=1,
                        put_ms_per_mib=0.5, bandwidth_bytes_per_s=2e9, outlier_rate=0.04, outlier_min_s=0.2,
                        outlier_max_s=0.3)


@pytest.mark.s3
def test_reads_through_outliers_are_hedged_and_exact(s3_endpoint: str) -> None:
    bucket = new_bucket(s3_client_for(s3_endpoint))
    data = random.Random(8).randbytes(2 * MiB)
    with S3Latency(s3_endpoint, OUTLIERS, seed=4) as lat:
        store = S3Store(bucket, endpoint_url=lat.url, region_name="us-east-1", hedge_share=0.2)
        try:
            store.put("h/obj", [data])
            rng = random.Random(2)
            for _ in range(120):
                start = rng.randrange(len(data) - 5000)
                assert store.get_bytes("h/obj", start, start + 4999) == data[start:start + 5000]
            with pytest.raises(RemoteResourceNotFoundError):
                store.get_bytes("h/none")
        finally:
            store.close()
        outliers = lat.stats().get("outliers", 0)
    gets = store.requests.snapshot()["GetObject"]
    print(f"hedges {store.hedger.hedges} (won {store.hedger.won}), outliers {outliers}, GETs {gets}")
    assert outliers >= 1 and store.hedger.hedges >= 1
    assert gets - 121 == store.hedger.hedges  # every extra GET is a hedge, and hedges stay in their share
    assert store.hedger.hedges <= 0.2 * 121 + hedge.BURST


@pytest.mark.s3
def test_copies_and_reads_through_outliers_and_faults_together(s3_endpoint: str, tmp_path) -> None:
    """The fault proxy in front of the emulator in front of moto: each copy is whole and reads back exact, or failed
    and left nothing under its keys; hedges stay within their share."""
    bucket = new_bucket(s3_client_for(s3_endpoint))
    data, last = synthetic_segment(tmp_path, 6 * MiB)
    log = data.log_path.read_bytes()
    config = RsmConfig(store="s3", bucket=bucket, block_size_bytes=256 * 1024, part_size_bytes=5 * MiB,
                       hedge_share=0.2, read_ahead_bytes=2 * MiB, read_ahead_request_bytes=512 * 1024)
    clean = S3Store(bucket, endpoint_url=s3_endpoint, region_name="us-east-1")
    outcomes = []
    with S3Latency(s3_endpoint, OUTLIERS, seed=6) as lat, FaultProxy(lat.url, rate=0.1, seed=5) as faults:
        store = S3Store(bucket, endpoint_url=faults.url, region_name="us-east-1", part_size_bytes=5 * MiB,
                        hedge_share=0.2, retries=3, connect_timeout_s=5, read_timeout_s=10)
        rsm = RemoteStorageManager(config, store)
        try:
            for _ in range(3):
                md = RemoteSegmentMetadata(uuid.uuid4(), uuid.uuid4(), "hf", 0, 0, last)
                try:
                    rsm.copy_log_segment_data(md, data)
                except RemoteStorageError:
                    outcomes.append("copy failed")
                    assert list(clean.list(rsm.keys(md).prefix)) == []
                    continue
                try:
                    got = b"".join(bytes(d) for _h, d in rsm.open_segment(md).batches(0, last))
                except RemoteStorageError:
                    outcomes.append("read failed")
                    continue
                assert got == log
                outcomes.append("ok")
        finally:
            store.close()
            clean.close()
        injected = sum(faults.injected.values())
    counts = store.requests.snapshot()
    print(f"outcomes {outcomes}, injected {dict(faults.injected)}, hedges {store.hedger.hedges}, requests {counts}")
    assert "ok" in outcomes and injected >= 1
    assert store.hedger.hedges <= 0.2 * counts["GetObject"] + hedge.BURST
