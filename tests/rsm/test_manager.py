"""RemoteStorageManager configuration and failure paths: entropy keys, throttles, S3 key prefix, corrupt input."""

from __future__ import annotations

import re
import shutil
import uuid

import pytest

from rsm.api import LogSegmentData
from rsm.errors import RemoteStorageError, StoreConfigError
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.s3 import S3Store
from rsm.throttle import THROTTLE_BYTES
from rsm.verify import verify_segment

pytestmark = [pytest.mark.kafka]


def test_entropy_keys_and_copy_throttle(store, broker_segments):
    seg = broker_segments[0]
    md = seg.metadata()
    rsm = RemoteStorageManager(RsmConfig(key_entropy=True, copy_rate_bytes_per_second=512 * 1024 * 1024,
                                         fetch_rate_bytes_per_second=512 * 1024 * 1024), store)
    copied_before = THROTTLE_BYTES.labels("copy")._value.get()
    fetched_before = THROTTLE_BYTES.labels("fetch")._value.get()
    rsm.copy_log_segment_data(md, seg.data)
    keys = rsm.keys(md)
    assert re.fullmatch(r"[0-9a-f]{4}", keys.base.split("/")[0])
    assert [o.key for o in store.list(keys.base.split("/")[0] + "/")] == sorted([keys.data(0), keys.index])
    size = seg.data.log_path.stat().st_size
    assert THROTTLE_BYTES.labels("copy")._value.get() - copied_before >= size
    with rsm.fetch_log_segment(md, 0) as f:
        assert f.read() == seg.data.log_path.read_bytes()
    assert THROTTLE_BYTES.labels("fetch")._value.get() - fetched_before == size
    rsm.copy_throttle.set_rate(1024 * 1024 * 1024)
    assert rsm.copy_throttle.rate_bytes_per_second == 1024 * 1024 * 1024


def test_corrupt_local_segment_fails_cleanly(store, broker_segments, tmp_path):
    seg = broker_segments[1]
    bad_log = tmp_path / seg.data.log_path.name
    shutil.copyfile(seg.data.log_path, bad_log)
    raw = bytearray(bad_log.read_bytes())
    victim = seg.batches[-1].position + 70
    raw[victim] ^= 0x55
    bad_log.write_bytes(bytes(raw))
    data = LogSegmentData(bad_log, seg.data.offset_index_path, seg.data.time_index_path, None, None, b"")
    md = seg.metadata()
    rsm = RemoteStorageManager(RsmConfig(block_size_bytes=4096), store)
    with pytest.raises(RemoteStorageError, match=re.escape(str(bad_log))):
        rsm.copy_log_segment_data(md, data)
    assert list(store.list(rsm.keys(md).prefix)) == []
    missing = LogSegmentData(seg.data.log_path, tmp_path / "nope.index", seg.data.time_index_path, None, None, b"")
    with pytest.raises(RemoteStorageError, match="nope.index"):
        rsm.copy_log_segment_data(md, missing)
    assert list(store.list(rsm.keys(md).prefix)) == []


def test_s3_config_key_prefix_and_errors(s3_endpoint, s3_client, broker_segments, tmp_path):
    bucket = f"rsm-cfg-{uuid.uuid4().hex[:8]}"
    cfg = RsmConfig(store="s3", bucket=bucket, endpoint_url=s3_endpoint, region="us-east-1", key_prefix="tenant-a/",
                    create_bucket=True)
    rsm = RemoteStorageManager(cfg)
    assert isinstance(rsm.store, S3Store)
    seg = broker_segments[2]
    md = seg.metadata()
    rsm.copy_log_segment_data(md, seg.data)
    raw_keys = [o["Key"] for o in s3_client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert raw_keys and all(k.startswith("tenant-a/") for k in raw_keys)
    assert verify_segment(rsm.store, rsm.keys(md)).ok
    with pytest.raises(StoreConfigError):
        RsmConfig(store="fs").make_store()
    with pytest.raises(StoreConfigError):
        RsmConfig(store="s3").make_store()
    with pytest.raises(StoreConfigError):
        S3Store(bucket, endpoint_url=s3_endpoint, part_size_bytes=1024)
    with pytest.raises(Exception, match="extra"):
        RsmConfig(nonsense=1)
