"""Garbage collection: every key layout a partition was written under, purged topics' leftovers, stores' own
leftovers (fs temp files, S3 incomplete multipart uploads), fail-closed ownership, a durable state file."""

from __future__ import annotations

import dataclasses
import json
import os
import time
import uuid
from pathlib import Path

import boto3
import pytest
from botocore.config import Config

from rlm.tasks import gc as gc_module
from rlm.tasks.gc import GarbageCollector
from rlm.tier import to_rsm
from rlmm.api import (
    RemoteLogMetadataManager,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from rlmm.memory import InMemoryRemoteLogMetadataManager
from rsm.api import LogSegmentData
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import TMP_DIR, FileSystemStore
from rsm.store.s3 import S3Store
from tests.support.batches import batch

GRACE = 60_000


def _rlmm() -> InMemoryRemoteLogMetadataManager:
    """The in-memory reference manager, serving every partition (GC reads partitions nobody announced)."""
    return InMemoryRemoteLogMetadataManager(serve_all=True)


def _lose(rlmm: RemoteLogMetadataManager, md: RemoteLogSegmentMetadata) -> None:
    """A lost delete: the metadata says the segment is deleted, its objects stay in the store."""
    for state in (RemoteLogSegmentState.DELETE_SEGMENT_STARTED, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED):
        rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(md.remote_log_segment_id, 2, None,
                                                                               state, 1))


def _segment(tmp: Path, base: int, n: int = 5) -> LogSegmentData:
    d = tmp / f"local-{uuid.uuid4().hex[:6]}"
    d.mkdir()
    log = d / f"{base:020d}.log"
    log.write_bytes(b"".join(batch(base + i, [b"v"]) for i in range(n)))
    (d / "x.index").write_bytes(b"")
    (d / "x.timeindex").write_bytes(b"")
    return LogSegmentData(log, d / "x.index", d / "x.timeindex", None, None, b"0\n0\n")


def _copy(rlmm: RemoteLogMetadataManager | None, rsm: RemoteStorageManager, tp: TopicIdPartition, base: int, tmp: Path,
          n: int = 5) -> RemoteLogSegmentMetadata:
    """Copy a segment; with ``rlmm``, recorded COPY_SEGMENT_FINISHED with its custom metadata (else an orphan)."""
    md = RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.uuid4()), base, base + n - 1, 1_700_000_000_000, 1,
                                  1, 100, ((0, base),))
    custom = rsm.copy_log_segment_data(to_rsm(md), _segment(tmp, base, n))
    md = dataclasses.replace(md, custom_metadata=custom, state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
    if rlmm is not None:
        _record(rlmm, md)
    return md


def _record(rlmm: RemoteLogMetadataManager, md: RemoteLogSegmentMetadata) -> None:
    """Record a copy as the copier does: COPY_SEGMENT_STARTED, then COPY_SEGMENT_FINISHED with its custom metadata."""
    rlmm.add_remote_log_segment_metadata(dataclasses.replace(md, state=RemoteLogSegmentState.COPY_SEGMENT_STARTED))
    rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
        md.remote_log_segment_id, 1, md.custom_metadata, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 1))


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and TMP_DIR not in p.parts}


def _ids(keys) -> set[str]:
    return {k.split("-index")[0][-36:] for k in keys}


def test_gc_visits_every_recorded_layout_and_the_configured_one(tmp_path):
    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    rlmm = _rlmm()
    store = FileSystemStore(tmp_path / "remote", fsync=False)
    old = RemoteStorageManager(RsmConfig(key_entropy=False), store)
    live_old = _copy(rlmm, old, tp, 0, tmp_path)
    orphan_old = _copy(None, old, tp, 5, tmp_path)  # a crashed copy under the old layout
    new = RemoteStorageManager(RsmConfig(key_entropy=True), store)  # config changed
    live_new = _copy(rlmm, new, tp, 10, tmp_path)
    orphan_new = _copy(None, new, tp, 15, tmp_path)

    gc = GarbageCollector(rlmm, new, grace_ms=GRACE, state_path=tmp_path / "state" / "gc.json")
    now = int(time.time() * 1000)
    assert gc.run([tp], now_ms=now) == []
    found = gc.run([tp], dry_run=True)
    assert _ids(found) == {str(orphan_old.remote_log_segment_id.id), str(orphan_new.remote_log_segment_id.id)}
    deleted = gc.run([tp], now_ms=now + GRACE)
    assert _ids(deleted) == _ids(found)
    # what live segments own is untouched, and still readable through their recorded layouts
    for md in (live_old, live_new):
        assert [e.base_offset for e in new.reader(to_rsm(md)).iter_entries()] == list(
            range(md.start_offset, md.end_offset_inclusive + 1))
    assert _ids(_files(tmp_path / "remote")) == {str(live_old.remote_log_segment_id.id),
                                                  str(live_new.remote_log_segment_id.id)}
    # the last old-layout segment goes away by a lost delete (metadata says deleted, objects stay)
    _lose(rlmm, live_old)
    gc.run([tp], now_ms=now + GRACE)
    assert _ids(gc.run([tp], now_ms=now + 3 * GRACE)) == {str(live_old.remote_log_segment_id.id)}
    assert _ids(_files(tmp_path / "remote")) == {str(live_new.remote_log_segment_id.id)}


def test_gc_remembers_a_recovered_copys_key_root(tmp_path):
    """A partition recovered onto a new topic id (``rlm recover``) keeps its keys under the old id, recorded as the
    key root in each copy's custom metadata. GC remembers that root with the layout, across restarts, so old-id
    leftovers are still found once no segment records the root any more."""
    old_tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    new_tp = TopicIdPartition(uuid.uuid4(), "orders", 0)  # the topic re-created, or on another cluster
    rlmm = _rlmm()
    rsm = RemoteStorageManager(RsmConfig(), FileSystemStore(tmp_path / "remote", fsync=False))
    written = [_copy(None, rsm, old_tp, base, tmp_path) for base in (0, 5)]
    crashed = _copy(None, rsm, old_tp, 10, tmp_path)  # never committed: an orphan under the old id
    recovered = []
    for md in written:  # what rlm recover records: the copy as a segment of the new id, keys under the old one
        moved = rsm.relocated(to_rsm(md), new_tp.topic_id, new_tp.topic)
        rec = dataclasses.replace(md, remote_log_segment_id=RemoteLogSegmentId(new_tp, md.remote_log_segment_id.id),
                                  custom_metadata=moved.custom_metadata)
        _record(rlmm, rec)
        recovered.append(rec)
    assert rsm.layout_of(to_rsm(recovered[0])).root_topic_id == old_tp.topic_id

    state = tmp_path / "state" / "gc.json"
    now = int(time.time() * 1000)
    gc = GarbageCollector(rlmm, rsm, grace_ms=GRACE, state_path=state)
    assert gc.run([new_tp], now_ms=now) == []
    assert _ids(gc.run([new_tp], now_ms=now + GRACE)) == {str(crashed.remote_log_segment_id.id)}
    # recovered segments still readable under their key root
    assert [e.base_offset for e in rsm.reader(to_rsm(recovered[1])).iter_entries()] == [5, 6, 7, 8, 9]

    # every recovered segment goes away by lost deletes: metadata says deleted, the old-id objects stay. No
    # segment records the key root any more; a restarted GC still visits it, from its state file.
    for md in recovered:
        _lose(rlmm, md)
    gc = GarbageCollector(rlmm, rsm, grace_ms=GRACE, state_path=state)
    assert _ids(gc.run([new_tp], dry_run=True)) == {str(md.remote_log_segment_id.id) for md in recovered}
    gc.run([new_tp], now_ms=now + 2 * GRACE)
    deleted = gc.run([new_tp], now_ms=now + 3 * GRACE)
    assert _ids(deleted) == {str(md.remote_log_segment_id.id) for md in recovered}
    assert all(k.startswith(rsm.partition_prefix(old_tp.topic, old_tp.topic_id, 0)) for k in deleted)
    assert _files(tmp_path / "remote") == set()
    remembered = json.loads(state.read_text())["partitions"][f"{new_tp.topic_id}:0"]["layouts"]
    assert ["", False, str(old_tp.topic_id), None] in remembered


def test_gc_reads_a_version_2_state_file(tmp_path):
    """Layouts a version-2 state file remembered (prefix and entropy, no key root) are still visited."""
    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    store = FileSystemStore(tmp_path / "remote", fsync=False)
    old = RemoteStorageManager(RsmConfig(key_prefix="old/"), store)
    leftover = _copy(None, old, tp, 0, tmp_path)
    state = tmp_path / "gc.json"
    state.write_text(json.dumps({"version": 2, "first_seen": {}, "partitions": {f"{tp.topic_id}:0": {
        "topic": tp.topic, "topic_id": str(tp.topic_id), "partition": 0, "layouts": [["old/", False]]}}}))
    gc = GarbageCollector(_rlmm(), RemoteStorageManager(RsmConfig(), store), grace_ms=GRACE, state_path=state)
    assert _ids(gc.run([tp], dry_run=True)) == {str(leftover.remote_log_segment_id.id)}


def test_gc_collects_purged_partitions_and_fails_closed(tmp_path):
    tp, other = TopicIdPartition(uuid.uuid4(), "gone", 0), TopicIdPartition(uuid.uuid4(), "moved", 0)
    rlmm = _rlmm()
    store = FileSystemStore(tmp_path / "remote", fsync=False)
    rsm = RemoteStorageManager(RsmConfig(), store)
    _copy(rlmm, rsm, tp, 0, tmp_path)
    kept = _copy(rlmm, rsm, other, 0, tmp_path)
    gc = GarbageCollector(rlmm, rsm, grace_ms=GRACE, state_path=tmp_path / "gc.json")
    now = int(time.time() * 1000)
    assert gc.run([tp, other], now_ms=now) == []
    # the topic is purged, but the segment deletes were lost: objects stay, no metadata owns them
    for state in RemotePartitionDeleteState:
        rlmm.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(tp, state, now, 1))
    # `other` is no longer passed either (leadership moved) and its metadata lists nothing (say, a lagging
    # cache): without proof of a purge it is never touched
    _lose(rlmm, kept)
    assert gc.run([], now_ms=now) == []
    deleted = gc.run([], now_ms=now + GRACE)
    assert deleted and all(k.startswith(rsm.partition_prefix(tp.topic, tp.topic_id, 0)) for k in deleted)
    assert _ids(_files(tmp_path / "remote")) == {str(kept.remote_log_segment_id.id)}
    gc.run([], now_ms=now + 2 * GRACE)
    state = json.loads((tmp_path / "gc.json").read_text())
    assert list(state["partitions"]) == [f"{other.topic_id}:0"]  # the emptied purged partition is forgotten

    # custom metadata GC cannot read: the whole partition is skipped
    p3 = TopicIdPartition(uuid.uuid4(), "foreign", 0)
    md = _copy(rlmm, rsm, p3, 0, tmp_path)
    _copy(None, rsm, p3, 5, tmp_path)
    rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(   # a repeated state replaces it
        md.remote_log_segment_id, 3, b"other-rsm", RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 1))
    assert gc.run([p3], now_ms=now) == [] and gc.run([p3], now_ms=now + 10 * GRACE) == []
    assert len(_ids(_files(tmp_path / "remote"))) == 3


def test_gc_all_partitions_after_a_lost_state_file(tmp_path):
    """``rlm gc --all-partitions``: with no state file, the whole store's partitions are found; those of topics on the
    cluster (same topic id) and of purged topics are collected; a deleted topic whose purge has not finished, a
    partition the metadata has never heard of, and an old incarnation of a re-created topic are left alone."""
    rlmm = _rlmm()
    rsm = RemoteStorageManager(RsmConfig(), FileSystemStore(tmp_path / "remote", fsync=False))
    live = TopicIdPartition(uuid.uuid4(), "live", 0)
    purged = TopicIdPartition(uuid.uuid4(), "gone", 0)
    pending = TopicIdPartition(uuid.uuid4(), "pending", 0)
    unknown = TopicIdPartition(uuid.uuid4(), "elsewhere", 0)
    old_live = TopicIdPartition(uuid.uuid4(), "live", 0)  # the name's earlier incarnation
    kept = [_copy(rlmm, rsm, live, 0, tmp_path), _copy(rlmm, rsm, pending, 0, tmp_path),
            _copy(None, rsm, unknown, 0, tmp_path), _copy(None, rsm, old_live, 0, tmp_path)]
    _copy(None, rsm, live, 5, tmp_path)  # an orphan of a live topic
    _lose(rlmm, _copy(rlmm, rsm, purged, 0, tmp_path))  # the purge's segment deletes were lost
    now = int(time.time() * 1000)
    for state in RemotePartitionDeleteState:
        rlmm.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(purged, state, now, 1))

    gc = GarbageCollector(rlmm, rsm, grace_ms=GRACE, state_path=tmp_path / "lost" / "gc.json")
    asked: list[set[str]] = []

    def on_cluster(names: set[str]) -> dict[str, uuid.UUID]:
        asked.append(names)
        return {"live": live.topic_id}  # pending, gone and elsewhere are not on the cluster

    visit, left = gc.sweep_targets(on_cluster)
    assert asked == [{"live", "gone", "pending", "elsewhere"}]
    assert sorted(visit, key=str) == sorted([live, purged], key=str)
    why = {tp: reason for tp, reason in left}
    assert set(why) == {pending, unknown, old_live}
    assert "purge not finished" in why[pending]
    assert "unknown to the metadata" in why[unknown] and "unknown to the metadata" in why[old_live]

    assert gc.run(visit, now_ms=now) == []  # the grace holds
    deleted = gc.run(visit, now_ms=now + GRACE)
    assert deleted and all(k.startswith((rsm.partition_prefix(live.topic, live.topic_id, 0),
                                         rsm.partition_prefix(purged.topic, purged.topic_id, 0))) for k in deleted)
    assert _ids(_files(tmp_path / "remote")) == {str(md.remote_log_segment_id.id) for md in kept}


def test_gc_all_partitions_leaves_everything_when_the_metadata_is_not_readable(tmp_path):
    rsm = RemoteStorageManager(RsmConfig(), FileSystemStore(tmp_path / "remote", fsync=False))
    gone = TopicIdPartition(uuid.uuid4(), "gone", 0)
    _copy(None, rsm, gone, 0, tmp_path)

    class Unreadable(InMemoryRemoteLogMetadataManager):
        def wait_ready(self, tps, timeout_s=60.0):  # noqa: ANN001, ANN202 - the manager's signature
            raise TimeoutError("metadata partitions not caught up")

    live = TopicIdPartition(uuid.uuid4(), "live", 0)
    _copy(None, rsm, live, 0, tmp_path)
    visit, left = GarbageCollector(Unreadable(), rsm, grace_ms=0, state_path=tmp_path / "gc.json").sweep_targets(
        lambda names: {"live": live.topic_id})
    assert visit == [] and sorted((str(tp), "not readable" in why) for tp, why in left) == sorted(
        [(str(gone), True), (str(live), True)])


def test_gc_all_partitions_reads_the_metadata_of_live_partitions_too(tmp_path):
    """The live partitions found in the store are served by the metadata manager before the pass reads them (the CLI
    gets a manager serving nothing: a pass over unserved partitions skipped them all, silently keeping orphans)."""
    rsm = RemoteStorageManager(RsmConfig(), FileSystemStore(tmp_path / "remote", fsync=False))
    live = TopicIdPartition(uuid.uuid4(), "live", 0)
    rlmm = InMemoryRemoteLogMetadataManager()  # serves only what it is told to
    _copy(None, rsm, live, 0, tmp_path)  # an orphan
    gc = GarbageCollector(rlmm, rsm, grace_ms=0, state_path=tmp_path / "gc.json")
    visit, left = gc.sweep_targets(lambda names: {"live": live.topic_id})
    assert visit == [live] and left == []
    assert rlmm.is_ready(live)
    assert gc.run(visit, dry_run=True)  # the orphan is listed


def test_gc_deletes_an_orphans_index_first(tmp_path):
    """Through the storage manager's delete: the index object (the commit point) goes before the data."""

    class Recording:
        def __init__(self, inner: FileSystemStore) -> None:
            self.inner, self.deleted = inner, []

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def delete(self, key):
            self.deleted.append(key)
            self.inner.delete(key)

        def delete_many(self, keys):
            keys = list(keys)
            self.deleted.extend(keys)
            self.inner.delete_many(keys)

    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    store = Recording(FileSystemStore(tmp_path / "remote", fsync=False))
    rsm = RemoteStorageManager(RsmConfig(), store)
    rlmm = _rlmm()
    live = _copy(rlmm, rsm, tp, 0, tmp_path)
    orphan = _copy(None, rsm, tp, 5, tmp_path)
    gc = GarbageCollector(rlmm, rsm, grace_ms=GRACE, state_path=tmp_path / "gc.json")
    now = int(time.time() * 1000)
    assert gc.run([tp], now_ms=now) == []
    deleted = gc.run([tp], now_ms=now + GRACE)
    assert _ids(deleted) == {str(orphan.remote_log_segment_id.id)}
    assert sorted(store.deleted) == sorted(deleted) and store.deleted[0].endswith("-index")
    assert _ids(_files(tmp_path / "remote")) == {str(live.remote_log_segment_id.id)}


def test_gc_removes_stale_fs_temp_files_and_writes_state_durably(tmp_path, monkeypatch):
    store = FileSystemStore(tmp_path / "remote")
    rsm = RemoteStorageManager(RsmConfig(), store)
    tmp_dir = tmp_path / "remote" / TMP_DIR
    stale, fresh = tmp_dir / "killed-write", tmp_dir / "running-write"
    stale.write_bytes(b"x" * 100)
    fresh.write_bytes(b"y")
    now = int(time.time() * 1000)
    os.utime(stale, (now / 1000 - 2 * gc_module.TEMP_FILE_MIN_AGE_MS / 1000,) * 2)
    paused = tmp_dir / "throttled-write"  # older than the grace, younger than TEMP_FILE_MIN_AGE_MS: in flight
    paused.write_bytes(b"z")
    os.utime(paused, (now / 1000 - 2 * GRACE / 1000,) * 2)
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd))[1])
    state_path = tmp_path / "state" / "gc.json"
    (tmp_path / "state").mkdir()
    state_path.write_text(json.dumps({"t-x/0/old": 1}))  # a version-1 state file is read
    gc = GarbageCollector(_rlmm(), rsm, grace_ms=GRACE, state_path=state_path)
    assert gc._first_seen == {"t-x/0/old": 1}
    deleted = gc.run([], now_ms=now)
    assert deleted == [f"{TMP_DIR}/killed-write"]
    assert not stale.exists() and fresh.exists() and paused.exists()
    assert len(synced) >= 2  # the file, then its directory
    assert json.loads(state_path.read_text())["version"] == 3
    assert sorted(p.name for p in state_path.parent.iterdir()) == ["gc.json"]


@pytest.mark.s3
def test_gc_aborts_stale_s3_multipart_uploads(tmp_path, s3_server):
    """On moto and on s3proxy (a real S3 server); a SIGKILLed copy's upload:
    tests/rlm/tasks/test_gc_killed_upload.py."""
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1",
                          config=Config(s3={"addressing_style": "path"}, request_checksum_calculation="when_required",
                                        response_checksum_validation="when_required"))
    bucket = f"gc-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    store = S3Store(bucket, endpoint_url=s3_server, region_name="us-east-1", key_prefix="t1/")
    rsm = RemoteStorageManager(RsmConfig(store="s3"), store)
    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    rlmm = _rlmm()
    live = _copy(rlmm, rsm, tp, 0, tmp_path)
    prefix = "t1/" + rsm.partition_prefix(tp.topic, tp.topic_id, 0)
    killed = f"{prefix}{5:020d}-{uuid.uuid4()}"  # a copy SIGKILLed mid-upload
    up = client.create_multipart_upload(Bucket=bucket, Key=killed)["UploadId"]
    client.upload_part(Bucket=bucket, Key=killed, UploadId=up, PartNumber=1, Body=b"x" * (5 * 1024 * 1024))
    elsewhere = client.create_multipart_upload(Bucket=bucket, Key="not-ours/file")["UploadId"]
    gc = GarbageCollector(rlmm, rsm, grace_ms=GRACE, state_path=tmp_path / "gc.json")
    now = int(time.time() * 1000)
    assert gc.run([tp], now_ms=now) == []  # younger than the grace: a copy may still be uploading
    assert len(client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])) == 2
    deleted = gc.run([tp], now_ms=now + GRACE + 5_000)
    assert deleted == [killed]
    left = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [(u["Key"], u["UploadId"]) for u in left] == [("not-ours/file", elsewhere)]
    assert [e.base_offset for e in rsm.reader(to_rsm(live)).iter_entries()] == [0, 1, 2, 3, 4]
