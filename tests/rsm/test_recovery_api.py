"""What recovery needs of the storage manager: every partition in the store, a committed copy's metadata from its
index object alone, and a copy relocated to another topic identity whose keys stay addressable (the key root in its
custom metadata)."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from rsm.api import IndexType, KeyLayout, StoredPartition
from rsm.errors import RemoteResourceNotFoundError, RemoteStorageError
from rsm.format.custom_metadata import CustomMetadataError, decode_custom_metadata, encode_custom_metadata
from rsm.format.keys import decode_topic_name, encode_topic_name, parse_partition_key, partition_prefix
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import FileSystemStore

pytestmark = [pytest.mark.kafka]


@pytest.mark.parametrize("name", ["events", "a-b-c", "é x/y", "...", "x" * 249])
@pytest.mark.parametrize("entropy", [False, True])
def test_partition_keys_parse_back(name, entropy):
    tid = uuid.uuid4()
    prefix = partition_prefix(name, tid, 12, entropy=entropy)
    assert decode_topic_name(encode_topic_name(name)) == name
    assert parse_partition_key(prefix + f"{5:020d}-{uuid.uuid4()}-index", entropy=entropy) == (name, tid, 12, prefix)
    assert parse_partition_key(prefix + "x", entropy=not entropy) is None
    assert parse_partition_key(".rlm-probe", entropy=entropy) is None
    if entropy:  # an entropy prefix that is not the partition's own: not ours
        assert parse_partition_key("0000/" + prefix[5:] + "x", entropy=True) is None or prefix.startswith("0000/")


def test_key_root_in_custom_metadata_round_trips():
    tid = uuid.uuid4()
    for layout in (KeyLayout("p/", True, tid), KeyLayout("", False, tid, "old-name"), KeyLayout()):
        assert decode_custom_metadata(encode_custom_metadata(layout)) == layout
    # the version-1 bytes of a layout without key root are unchanged
    assert encode_custom_metadata(KeyLayout("p/", True)) == b"RK\x01\x01\x02p/"
    assert encode_custom_metadata(KeyLayout("", False, tid)) == b"RK\x01\x02\x00" + tid.bytes + b"\x00"
    with pytest.raises(ValueError):
        encode_custom_metadata(KeyLayout("x" * 60, False, tid, "y" * 30))
    with pytest.raises(CustomMetadataError):
        decode_custom_metadata(b"RK\x01\x02\x00" + tid.bytes)  # truncated key root
    with pytest.raises(CustomMetadataError):
        decode_custom_metadata(b"RK\x01\x04\x00")  # unknown flag


def test_list_read_and_relocate(tmp_path, broker_segments):
    rsm = RemoteStorageManager(RsmConfig(key_entropy=True), FileSystemStore(tmp_path / "remote"))
    segs = broker_segments[:3]
    mds = []
    for seg in segs:
        md = seg.metadata()
        mds.append(dataclasses.replace(md, custom_metadata=rsm.copy_log_segment_data(md, seg.data)))
    # a crashed copy: data objects, no index object
    crashed = segs[0].metadata()
    rsm.copy_log_segment_data(crashed, segs[0].data)
    rsm.store.delete(rsm.keys(crashed).index)

    first = mds[0]
    (sp,) = rsm.list_partitions()
    assert sp == StoredPartition(first.topic_id, first.topic_name, 0, rsm.layout)
    assert rsm.list_partitions(KeyLayout("", False)) == []  # nothing under the layout without entropy

    listing = rsm.list_copies(sp.topic_id, sp.topic_name, sp.partition, sp.layout)
    by_id = {c.copy.remote_segment_id: c for c in listing.copies}
    assert set(by_id) == {m.remote_segment_id for m in mds} | {crashed.remote_segment_id}
    with pytest.raises(RemoteResourceNotFoundError):
        rsm.read_committed_copy(by_id[crashed.remote_segment_id])
    for md, seg in zip(mds, segs, strict=True):
        cc = rsm.read_committed_copy(by_id[md.remote_segment_id])
        assert cc.metadata == md  # everything the copier knew, from the index object alone
        assert cc.txn_index_empty == (seg.data.transaction_index_path is None)
        assert cc.data_bytes > md.segment_size_bytes

    # relocated onto a re-created topic (new id, same name), then renamed: still read and deleted where it is
    new_id = uuid.uuid4()
    moved = rsm.relocated(first, new_id, first.topic_name)
    assert moved.topic_id == new_id
    assert decode_custom_metadata(moved.custom_metadata) == KeyLayout("", True, first.topic_id)
    renamed = rsm.relocated(moved, uuid.uuid4(), "renamed")
    assert decode_custom_metadata(renamed.custom_metadata) == KeyLayout("", True, first.topic_id, first.topic_name)
    assert rsm.relocated(renamed, first.topic_id, first.topic_name).custom_metadata == first.custom_metadata
    for m in (moved, renamed):
        with rsm.fetch_log_segment(m, 0) as f:
            assert f.read() == segs[0].data.log_path.read_bytes()
        with rsm.fetch_index(m, IndexType.OFFSET) as f:
            assert f.read() == segs[0].data.offset_index_path.read_bytes()
    # listing the new partition under the relocated layout finds the copies under the old keys
    root_layout = rsm.layout_of(moved)
    relisted = rsm.list_copies(new_id, first.topic_name, 0, root_layout)
    assert {c.copy.remote_segment_id for c in relisted.copies} == set(by_id)
    with pytest.raises(RemoteStorageError):
        # a long old name does not fit the custom metadata beside the key prefix and topic id
        rsm.relocated(dataclasses.replace(first, topic_name="n" * 90), uuid.uuid4(), "short")
    rsm.delete_log_segment_data(renamed)
    assert rsm.store.head(rsm.keys(first).index) is None
