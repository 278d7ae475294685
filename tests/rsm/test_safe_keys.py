"""Safe object keys, property-tested: any topic name Kafka accepts ([a-zA-Z0-9._-], 1-249 characters) makes keys
that stay under the store's root, fit S3's key length and parse back to the same topic, partition, base offset
and segment id, through the filesystem store's own listing as garbage collection and recovery list it (a key
component longer than a file name, 249 + 37 bytes for the longest names, is laid out by the filesystem store).
Arbitrary unicode (names no Kafka allows, keys and prefixes at the store layer) is either refused with an error
naming it or kept under the root."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from rsm.errors import RemoteStorageError
from rsm.format.keys import (
    MAX_ENCODED_TOPIC_NAME,
    SegmentKeys,
    decode_topic_name,
    encode_topic_name,
    parse_key_tail,
    parse_partition_key,
    partition_prefix,
)
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import CONTINUED, TMP_DIR, FileSystemStore, _disk_parts

KAFKA_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-"
NAME_MAX = 255  # bytes of one path component (ext4, xfs, tmpfs)
S3_KEY_MAX = 1024  # bytes of an S3 object key

kafka_names = st.one_of(
    st.text(alphabet=KAFKA_CHARS, min_size=1, max_size=249),
    st.text(alphabet=KAFKA_CHARS, min_size=200, max_size=249),  # the long end, often
    st.text(alphabet=".", min_size=1, max_size=249),  # only dots: every byte percent-encoded
).filter(lambda n: n not in (".", ".."))  # the two names Kafka refuses within its alphabet
unicode_names = st.text(min_size=0, max_size=300)
uuids = st.uuids()
partitions = st.integers(0, 2**31 - 1)
offsets = st.integers(0, 2**63 - 1)
object_numbers = st.integers(0, 99_999)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _check_key(key: str, name: str, tid: uuid.UUID, partition: int, base: int, sid: uuid.UUID,
               entropy: bool) -> None:
    prefix = partition_prefix(name, tid, partition, entropy=entropy)
    parts = key.split("/")
    assert all(p not in ("", ".", "..") for p in parts), key
    assert parts[0] != TMP_DIR and not key.startswith("/")
    assert len(key.encode()) <= S3_KEY_MAX, key
    assert "\x00" not in key and key.isascii()
    assert parse_partition_key(key, entropy=entropy) == (name, tid, partition, prefix)
    assert parse_partition_key(key, entropy=not entropy) is None
    assert key.startswith(prefix) and parse_key_tail(key[len(prefix):]) == (base, sid)


@SETTINGS
@given(kafka_names, uuids, partitions, offsets, uuids, object_numbers, st.booleans())
def test_keys_of_any_kafka_topic_parse_back(name, tid, partition, base, sid, n, entropy):
    keys = SegmentKeys.for_segment(name, tid, partition, base, sid, entropy=entropy)
    assert decode_topic_name(encode_topic_name(name)) == name
    for key in (keys.data(0), keys.data(n), keys.index):
        _check_key(key, name, tid, partition, base, sid, entropy)


@SETTINGS
@given(unicode_names, uuids, partitions, offsets, uuids, st.booleans())
def test_keys_of_any_string_parse_back_or_are_refused(name, tid, partition, base, sid, entropy):
    try:
        keys = SegmentKeys.for_segment(name, tid, partition, base, sid, entropy=entropy)
    except ValueError as err:
        assert repr(name)[:40] in str(err) or not name, str(err)  # the error names the topic
        assert not name or len(encode_topic_name(name)) > MAX_ENCODED_TOPIC_NAME
        return
    assert name  # an empty name is no topic
    for key in (keys.data(0), keys.data(7), keys.index):
        _check_key(key, name, tid, partition, base, sid, entropy)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kafka_names, uuids, partitions, offsets, uuids, st.booleans())
def test_fs_store_keeps_every_copy_under_its_root_and_lists_it_back(name, tid, partition, base, sid, entropy):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "remote"
        store = FileSystemStore(root, fsync=False)
        rsm = RemoteStorageManager(RsmConfig(key_entropy=entropy), store)
        keys = SegmentKeys.for_segment(name, tid, partition, base, sid, entropy=entropy)
        for key in (keys.data(0), keys.data(1), keys.index):
            assert store.put(key, [key.encode()]) == len(key.encode())
        files = [p for p in root.rglob("*") if p.is_file()]
        assert len(files) == 3
        assert all(os.path.realpath(p).startswith(os.path.realpath(root) + os.sep) for p in files)
        assert all(len(c.encode()) <= NAME_MAX for p in files for c in p.relative_to(root).parts)
        # as garbage collection lists a partition ...
        listing = rsm.list_copies(tid, name, partition, rsm.layout)
        assert listing.foreign_keys == ()
        assert [(c.copy.remote_segment_id, c.copy.start_offset, sorted(c.keys)) for c in listing.copies] == \
            [(sid, base, sorted([keys.data(0), keys.data(1), keys.index]))]
        # ... and recovery lists the whole store
        assert [(p.topic_name, p.topic_id, p.partition) for p in rsm.list_partitions()] == [(name, tid, partition)]
        assert store.get_bytes(keys.index) == keys.index.encode()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(min_size=0, max_size=300))
def test_fs_store_refuses_or_keeps_under_its_root_any_key(key):
    with tempfile.TemporaryDirectory() as d:
        root = Path(d) / "remote"
        store = FileSystemStore(root, fsync=False)
        try:
            store.put(key, [b"x"])
        except (ValueError, RemoteStorageError) as err:
            assert repr(key)[:40] in str(err) or key[:40] in str(err), str(err)  # the error names the key
            assert not any(p.is_file() for p in root.rglob("*") if TMP_DIR not in p.relative_to(root).parts)
            return
        files = [p for p in root.rglob("*") if p.is_file() and TMP_DIR not in p.relative_to(root).parts]
        assert len(files) == 1 and os.path.realpath(files[0]).startswith(os.path.realpath(root) + os.sep)
        assert [o.key for o in store.list("")] == [key]
        assert store.get_bytes(key) == b"x" and store.head(key) == 1
        store.delete(key)
        assert store.head(key) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet="ab.%+/é", min_size=1, max_size=260), min_size=1, max_size=6))
def test_fs_store_paths_of_keys_sharing_directories_are_those_of_their_components(keys):
    """FileSystemStore._path keeps the directories of the keys it was asked for (by the key's part before its last
    "/"): whatever came before, a key's path is its components laid out on disk, long ones cut."""
    with tempfile.TemporaryDirectory() as d:
        store = FileSystemStore(Path(d) / "remote", fsync=False)
        for key in keys + [k + "/n" for k in keys] + keys:
            try:
                path = store._path(key)  # noqa: SLF001
            except ValueError:
                continue
            assert path == store.root.joinpath(*_disk_parts(key.split("/")))


@settings(max_examples=200, deadline=None)
@given(st.text(min_size=0, max_size=40))
@example("../")
@example("../outside/")
@example("inside/../../outside/s")
@example("/")
@example(".tmp/")
@example("\x00/")  # found by hypothesis: os.walk raised "embedded null byte", naming no prefix
def test_fs_store_lists_nothing_outside_its_root(prefix):
    with tempfile.TemporaryDirectory() as d:
        outside = Path(d) / "outside"
        outside.mkdir()
        (outside / "secret").write_bytes(b"s")
        root = Path(d) / "remote"
        store = FileSystemStore(root, fsync=False)
        store.put("inside/a", [b"a"])
        try:
            keys = [o.key for o in store.list(prefix)]
        except ValueError as err:
            assert repr(prefix)[:40] in str(err), str(err)
            return
        assert set(keys) <= {"inside/a"}


def test_the_longest_kafka_topic_name_is_stored_and_listed(tmp_path):
    """249 characters (Kafka's limit) plus ``-<topic id>`` is longer than one file name may be (255 bytes): the key
    is the same as on S3, the filesystem store lays the component out as ``<200 bytes>%+/<the rest>``."""
    name, tid, sid = "t" * 249, uuid.UUID(int=5), uuid.UUID("12345678-1234-5678-1234-567812345678")
    keys = SegmentKeys.for_segment(name, tid, 3, 0, sid)
    assert keys.base == f"{name}-{tid}/3/{0:020d}-{sid}"  # one component, as before: nothing stored moves
    store = FileSystemStore(tmp_path / "remote", fsync=False)
    store.put(keys.index, [b"i"])
    on_disk = f"{'t' * 200}{CONTINUED}/{'t' * 49}-{tid}/3/{0:020d}-{sid}-index"
    assert (tmp_path / "remote" / on_disk).read_bytes() == b"i"
    assert [o.key for o in store.list(partition_prefix(name, tid, 3))] == [keys.index]
    assert parse_partition_key(next(iter(store.list(""))).key) == (name, tid, 3, partition_prefix(name, tid, 3))
    assert store.head(keys.index) == 1 and store.get_bytes(keys.index) == b"i"
    store.delete(keys.index)
    assert list(store.list("")) == []


def test_a_cut_component_never_ends_in_a_dot_directory(tmp_path):
    store = FileSystemStore(tmp_path / "remote", fsync=False)
    for key in ("a" * 400 + ".", "a" * 200 + "..", "é" * 150 + "/x", "a" * 199 + "é" + "b" * 100):
        store.put(key, [b"v"])
    assert sorted(o.key for o in store.list("")) == sorted(
        ["a" * 400 + ".", "a" * 200 + "..", "é" * 150 + "/x", "a" * 199 + "é" + "b" * 100])
    for p in (tmp_path / "remote").rglob("*"):
        assert p.name not in (".", "..") and len(p.name.encode()) <= NAME_MAX


@pytest.mark.parametrize("name", ["", "x" * 800, "é" * 300])
def test_a_name_no_key_can_hold_is_refused_naming_it(name):
    with pytest.raises(ValueError, match="topic name"):
        partition_prefix(name, uuid.uuid4(), 0)


def test_surrogates_and_nul_are_refused_by_the_fs_store(tmp_path):
    store = FileSystemStore(tmp_path / "remote", fsync=False)
    for key in ("a\x00b", "a/\udc80", "../x", "a/../../x", "/abs", ".tmp/x", "a//b", "a%+/b", "b%+"):
        with pytest.raises(ValueError, match="invalid object key"):
            store.put(key, [b"x"])
