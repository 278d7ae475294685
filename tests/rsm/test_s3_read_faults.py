"""Reads on S3 through the latency emulator's outliers and the fault proxy's errors together (issue 25): a history
Fetch's reads (one block at a time, read ahead across the reads by the block cache's streams) and a long read (the
read-ahead window) hand out exactly the copy's bytes, or fail with RemoteStorageError; the GETs sent beyond those of
the same reads on a clean store are bounded by the faults injected (each costs a retry, a resumed body, or at most
a window re-read after a read failed) and the hedges. No timings are asserted."""

from __future__ import annotations

import uuid

import pytest

from devtools.s3latency import LatencyModel, S3Latency
from rsm.api import RemoteSegmentMetadata
from rsm.errors import RemoteStorageError
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.s3 import S3Store
from tests.rsm.faultproxy import FaultProxy
from tests.support.batches import synthetic_segment
from tests.support.stores import new_bucket, s3_client_for

KiB, MiB = 1024, 1024 * 1024
OUTLIERS = LatencyModel(first_byte_median_ms=2, first_byte_sigma=0.3, first_byte_floor_ms=1, put_base_ms=1,
                        put_ms_per_mib=0.5, bandwidth_bytes_per_s=2e9, outlier_rate=0.05, outlier_min_s=0.2,
                        outlier_max_s=0.3)
CONFIG = {"block_size_bytes": 256 * KiB, "hedge_share": 0.2, "read_ahead_bytes": 2 * MiB,
          "read_ahead_request_bytes": 512 * KiB, "block_cache_bytes": 1 * MiB}
WINDOW_REQUESTS = CONFIG["read_ahead_bytes"] // CONFIG["read_ahead_request_bytes"]


def _reads(rsm: RemoteStorageManager, md: RemoteSegmentMetadata, blocks: int) -> list[bytes | None]:
    """Each block read twice through a new handle (as Fetches inside one block, then the next), then the whole copy
    in one read; None for a read that failed."""
    out: list[bytes | None] = []
    for b in [b for b in range(blocks) for _ in range(2)]:
        try:
            out.append(b"".join(bytes(d) for _h, d in rsm.open_segment(md).batches(
                0, md.end_offset_inclusive, first_block=b, last_block=b)))
        except RemoteStorageError:
            out.append(None)
    try:
        out.append(b"".join(bytes(d) for _h, d in rsm.open_segment(md).batches(0, md.end_offset_inclusive)))
    except RemoteStorageError:
        out.append(None)
    return out


@pytest.mark.s3
def test_reads_through_outliers_and_faults_are_exact_and_retries_bounded(s3_endpoint: str, tmp_path) -> None:
    bucket = new_bucket(s3_client_for(s3_endpoint))
    data, last = synthetic_segment(tmp_path, 6 * MiB)
    md = RemoteSegmentMetadata(uuid.uuid4(), uuid.uuid4(), "rf", 0, 0, last)
    clean = S3Store(bucket, endpoint_url=s3_endpoint, region_name="us-east-1")
    writer = RemoteStorageManager(RsmConfig(store="s3", bucket=bucket, **CONFIG), clean)
    writer.copy_log_segment_data(md, data)
    blocks = len(writer.reader(md).ledger.blocks)
    assert blocks >= 20
    reference = RemoteStorageManager(RsmConfig(store="s3", bucket=bucket, **CONFIG),
                                     S3Store(bucket, endpoint_url=s3_endpoint, region_name="us-east-1"))
    reference.reader(md)  # the index cached: only data GETs are counted
    before = reference.store.requests.snapshot().get("GetObject", 0)
    want = _reads(reference, md, blocks)
    clean_gets = reference.store.requests.snapshot().get("GetObject", 0) - before
    assert None not in want and want[-1] == b"".join(w for w in want[:-1:2] if w is not None)

    with S3Latency(s3_endpoint, OUTLIERS, seed=3) as lat, FaultProxy(lat.url, rate=0.25, seed=9) as faults:
        store = S3Store(bucket, endpoint_url=faults.url, region_name="us-east-1", hedge_share=0.2, retries=3,
                        connect_timeout_s=5, read_timeout_s=10)
        rsm = RemoteStorageManager(RsmConfig(store="s3", bucket=bucket, **CONFIG), store)
        try:
            rsm.reader(md)
            before = store.requests.snapshot().get("GetObject", 0)
            got = _reads(rsm, md, blocks)
            gets = store.requests.snapshot().get("GetObject", 0) - before
        finally:
            store.close()
            clean.close()
        injected = sum(faults.injected.values())
        outliers = lat.stats().get("outliers", 0)
    failed = got.count(None)
    print(f"reads {len(got)}, failed {failed}, GETs {gets} (clean {clean_gets}), faults {dict(faults.injected)}, "
          f"outliers {outliers}, hedges {store.hedger.hedges}, streams {rsm.block_cache.streams_opened}")  # type: ignore[union-attr]
    assert injected >= 1 and outliers >= 1
    assert all(g is None or g == w for g, w in zip(got, want, strict=True))  # exact, or failed: never wrong bytes
    assert failed <= len(got) // 4  # most reads got through (retries, resumed bodies)
    # every GET beyond the clean run's: a retry or a resumed body per fault, a window re-read after a failed read,
    # or a hedge
    assert gets - clean_gets <= injected * (1 + WINDOW_REQUESTS) + store.hedger.hedges
