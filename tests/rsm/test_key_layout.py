"""The key layout (store key prefix, entropy) is recorded with each copy in its custom metadata: changing
``key_prefix`` / ``key_entropy`` afterwards leaves every existing copy readable and deletable."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from rsm.api import IndexType
from rsm.errors import RemoteResourceNotFoundError, RemoteStorageError, StoreConfigError
from rsm.format.custom_metadata import (
    MAX_CUSTOM_METADATA_BYTES,
    CustomMetadataError,
    KeyLayout,
    decode_custom_metadata,
    encode_custom_metadata,
)
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import FileSystemStore
from rsm.store.s3 import S3Store
from tests.support.stores import new_bucket, s3_client_for

pytestmark = [pytest.mark.kafka, pytest.mark.s3]


def _all_keys(store) -> list[str]:
    return [o.key for o in store.list("")]


def _stores(kind: str, tmp_path, s3_endpoint):
    """(store before, store after) the key_prefix change, over the same root / bucket."""
    if kind == "fs":
        return FileSystemStore(tmp_path / "remote"), FileSystemStore(tmp_path / "remote")
    bucket = new_bucket(s3_client_for(s3_endpoint))
    mk = lambda prefix: S3Store(bucket, endpoint_url=s3_endpoint, region_name="us-east-1",  # noqa: E731
                                key_prefix=prefix, part_size_bytes=5 * 1024 * 1024)
    return mk("tenant-a/"), mk("")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fs", "s3", "s3proxy"])
def test_copies_survive_a_key_layout_change(kind, tmp_path, request, broker_segments):
    s3_endpoint = None if kind == "fs" else request.getfixturevalue("s3proxy_endpoint" if kind == "s3proxy"
                                                                    else "s3_endpoint")
    before, after = _stores(kind, tmp_path, s3_endpoint)
    rsm1 = RemoteStorageManager(RsmConfig(key_entropy=False), before)
    segs = broker_segments[:2]
    mds = []
    for seg in segs:
        md = seg.metadata()
        custom = rsm1.copy_log_segment_data(md, seg.data)
        assert custom is not None and len(custom) < MAX_CUSTOM_METADATA_BYTES
        assert decode_custom_metadata(custom) == KeyLayout(before.key_prefix if kind != "fs" else "", False)
        mds.append(dataclasses.replace(md, custom_metadata=custom))

    rsm2 = RemoteStorageManager(RsmConfig(key_entropy=True), after)  # a fresh process with the new config
    assert rsm2.layout != rsm1.layout
    for seg, md in zip(segs, mds, strict=True):
        with rsm2.fetch_log_segment(md, 0) as f:
            assert f.read() == seg.data.log_path.read_bytes()
        with rsm2.fetch_index(md, IndexType.OFFSET) as f:
            assert f.read() == seg.data.offset_index_path.read_bytes()
        assert [e.base_offset for e in rsm2.reader(md).iter_entries()] == [b.base_offset for b in seg.batches]
        assert rsm2.verify_copy(md).ok
        # without the custom metadata the new config is used, and the copy is not found there
        with pytest.raises(RemoteResourceNotFoundError):
            rsm2.reader(dataclasses.replace(md, custom_metadata=None))

    # a new copy goes under the new layout; both are deleted where they are
    new_md = broker_segments[2].metadata()
    new_md = dataclasses.replace(new_md, custom_metadata=rsm2.copy_log_segment_data(new_md, broker_segments[2].data))
    assert decode_custom_metadata(new_md.custom_metadata) == rsm2.layout
    raw = S3Store(after.bucket, endpoint_url=s3_endpoint, region_name="us-east-1") if kind != "fs" else after
    assert any(k.startswith("tenant-a/") for k in _all_keys(raw)) == (kind != "fs")
    for md in [*mds, new_md]:
        rsm2.delete_log_segment_data(md)
        rsm2.delete_log_segment_data(md)  # idempotent
    assert _all_keys(raw) == []


def test_foreign_custom_metadata_is_refused_not_guessed(store, broker_segments):
    seg = broker_segments[0]
    rsm = RemoteStorageManager(RsmConfig(), store)
    md = seg.metadata()
    rsm.copy_log_segment_data(md, seg.data)
    keys = _all_keys(store)
    for bad in (b"", b"XY\x01\x00\x00", b"RK\x02\x00\x00", b"RK\x01\x80\x00", b"RK\x01\x00\x05ab"):
        foreign = dataclasses.replace(md, custom_metadata=bad)
        with pytest.raises(CustomMetadataError):
            rsm.delete_log_segment_data(foreign)
        with pytest.raises(CustomMetadataError):
            rsm.reader(foreign)
    assert _all_keys(store) == keys
    assert issubclass(CustomMetadataError, RemoteStorageError)


def test_custom_metadata_layout_and_limit(tmp_path):
    assert encode_custom_metadata(KeyLayout("", False)) == b"RK\x01\x00\x00"
    assert encode_custom_metadata(KeyLayout("p/", True)) == b"RK\x01\x01\x02p/"
    for layout in (KeyLayout(), KeyLayout("tenant/é/", True), KeyLayout("x" * 95, False)):
        raw = encode_custom_metadata(layout)
        assert len(raw) <= MAX_CUSTOM_METADATA_BYTES and decode_custom_metadata(raw) == layout
    with pytest.raises(ValueError):
        encode_custom_metadata(KeyLayout("x" * 96))

    class LongPrefixStore(FileSystemStore):
        key_prefix = "y" * 200

    with pytest.raises(StoreConfigError, match="key_prefix"):
        RemoteStorageManager(RsmConfig(), LongPrefixStore(tmp_path / "r"))


def test_to_rsm_passes_custom_metadata_through():
    from rlm.tier import to_rsm
    from rlmm.api import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition

    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    md = RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.uuid4()), 0, 9, 1, 1, 1, 100, ((0, 0),),
                                  custom_metadata=b"RK\x01\x01\x00")
    assert to_rsm(md).custom_metadata == b"RK\x01\x01\x00"
