"""Deletes the store refuses go through the to-be-deleted topic and finish once it recovers; garbage collection
removes orphaned objects and nothing else. Real broker, real segments, a file-system store."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException

from devtools.devkafka import KafkaCluster
from rlm import metrics
from rlm.sidecar import Sidecar
from rlm.tasks.cleaner import Cleaner
from rlm.tasks.deleter import SegmentDeleter
from rlmm import serde
from rlmm.api import (
    PartitionNotServedError,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from rsm.api import LogSegmentData, RemoteSegmentMetadata
from rsm.errors import RemoteStorageError
from rsm.format.keys import SegmentKeys, partition_prefix
from rsm.log.checkpoint import EpochEntry, format_leader_epoch_checkpoint
from rsm.manager import RemoteStorageManager
from rsm.store.base import Store
from tests.support.kafka import partition_dir
from tests.support.sidecar import (
    assert_contiguous,
    assert_readable,
    latest_remote,
    make_settings,
    only,
    produce_segments,
    remote_segments,
    store_keys,
    wait_for,
)


class RefusingStore:
    """A real store whose deletes fail (as an S3 outage or a missing permission would) while ``refuse`` is set."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.refuse = threading.Event()
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _check(self, key: str) -> None:
        if self.refuse.is_set():
            self.refused += 1
            raise RemoteStorageError(f"delete of {key}: access denied (test)")

    def delete(self, key: str) -> None:
        self._check(key)
        self.inner.delete(key)

    def delete_many(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        self._check(keys[0] if keys else "")
        self.inner.delete_many(keys)


def queued_records(kafka: KafkaCluster, topic: str, timeout_s: float = 10.0) -> list[bytes]:
    """Keys of every record in the to-be-deleted topic."""
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"probe-{uuid.uuid4().hex}",
                  "auto.offset.reset": "earliest", "enable.partition.eof": True})
    c.subscribe([topic])
    keys: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == -191:  # _PARTITION_EOF
                    break
                continue
            keys.append(msg.key())
    finally:
        c.close()
    return keys


def test_refused_deletes_go_through_the_queue_and_finish(kafka: KafkaCluster, topic_name: str,
                                                          tmp_path: Path) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    sent = produce_segments(kafka, topic_name, 5, 150, segment_ms=300)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name), metadata={"tombstone_delay_ms": 600_000})
    root = Path(settings.store.root_path)
    with Sidecar(settings) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 60, "every offset remote")
        segs = remote_segments(sidecar, tp)
    assert len(segs) >= 5
    doomed, kept = segs[:-2], segs[-2:]

    # Restarted with size retention over the two newest segments, against a store that refuses every delete.
    # Copy runs are hourly here (one at start), so only the cleaner retries the refused deletes.
    by_size = settings.model_copy(update={
        "retention": [settings.retention[0].model_copy(update={
            "retention_bytes": sum(s.segment_size_bytes for s in kept)})],
        "tasks": settings.tasks.model_copy(update={"copy_interval_ms": 3_600_000})})
    store = RefusingStore(settings.store.make_store())
    store.refuse.set()
    with Sidecar(by_size, rsm=RemoteStorageManager(settings.store, store=store)) as sidecar:
        def states() -> dict[uuid.UUID, RemoteLogSegmentState]:
            try:
                return {m.remote_log_segment_id.id: m.state for m in sidecar.rlmm.list_remote_log_segments(tp)}
            except PartitionNotServedError:
                return {}  # discovery has not found the partition yet

        wait_for(lambda: all(states().get(s.remote_log_segment_id.id) == RemoteLogSegmentState.DELETE_SEGMENT_STARTED
                             for s in doomed), 60, "the expired segments to be DELETE_SEGMENT_STARTED")
        wait_for(lambda: sidecar.cleaner.retries >= 2, 90, "the cleaner to retry")  # its group join is slow under load
        time.sleep(1.0)  # more expiration runs while the store refuses
        queued = queued_records(kafka, settings.metadata.to_be_deleted_topic)
        assert sorted(queued) == sorted(s.remote_log_segment_id.id.bytes for s in doomed)  # each once
        keys = store_keys(root)
        for s in doomed:  # nothing gone yet
            assert any(str(s.remote_log_segment_id.id) in k for k in keys)
        assert sidecar.cleaner.deleted == 0
        # The backlog gauge counts them, and stays up while the store refuses (the cleaner seeks back)
        wait_for(lambda: metrics.DELETIONS_QUEUED._value.get() >= len(doomed), 30, "rlm_deletions_queued")

        def finished() -> set[uuid.UUID]:  # DELETE_SEGMENT_FINISHED recorded (tombstones pending: delay 10 min)
            cache = sidecar.rlmm.cache
            return {d.segment_id for d in cache.deleted_segments(cache.mp_of(tp))}

        assert not finished()
        store.refuse.clear()  # the store recovers
        wait_for(lambda: {s.remote_log_segment_id.id for s in doomed} <= finished(), 60,
                 "DELETE_SEGMENT_FINISHED for every refused delete")
        assert not {s.remote_log_segment_id.id for s in doomed} & states().keys()
        assert sidecar.cleaner.deleted == len(doomed)
        wait_for(lambda: metrics.DELETIONS_QUEUED._value.get() == 0, 30, "rlm_deletions_queued back to 0")
        keys = store_keys(root)
        for s in doomed:
            assert not any(str(s.remote_log_segment_id.id) in k for k in keys)
        for s in kept:
            assert states()[s.remote_log_segment_id.id] == RemoteLogSegmentState.COPY_SEGMENT_FINISHED
            assert any(str(s.remote_log_segment_id.id) in k for k in keys)
        left = remote_segments(sidecar, tp)
        assert [s.remote_log_segment_id for s in left] == [s.remote_log_segment_id for s in kept]
        got = {r.offset: (r.key, r.value) for r in sidecar.reader.read(tp, kept[0].start_offset)}
        assert {o: got[o] for o in got if o in sent} == {o: kv for o, kv in sent.items()
                                                         if o >= kept[0].start_offset}


def test_cleaner_retries_through_the_delete_path() -> None:
    """The cleaner's retry (no broker): a refusal is counted as cleaner-delete and not queued again; once the store
    agrees the segment walks to DELETE_SEGMENT_FINISHED, counted once; a record done with is done."""
    tp = TopicIdPartition(uuid.uuid4(), "cleaner-unit", 0)
    queued = dataclasses.replace(
        RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.uuid4()), 0, 9, 1, 1, 1, 100, ((0, 0),)),
        state=RemoteLogSegmentState.DELETE_SEGMENT_STARTED)

    class Metadata:
        md = queued

        def on_partition_leadership_changes(self, leaders: Any, followers: Any) -> None:
            pass

        def wait_ready(self, tps: Any, timeout_s: float = 60.0) -> None:
            pass

        def list_remote_log_segments(self, tp: TopicIdPartition) -> list[RemoteLogSegmentMetadata]:
            return [] if self.md.state == RemoteLogSegmentState.DELETE_SEGMENT_FINISHED else [self.md]

        def update_remote_log_segment_metadata(self, update: Any) -> None:
            self.md = self.md.with_update(update)

    class Storage:
        def __init__(self) -> None:
            self.refuse = True
            self.deleted: list[uuid.UUID] = []

        def delete_log_segment_data(self, m: RemoteSegmentMetadata) -> None:
            if self.refuse:
                raise RemoteStorageError("access denied (test)")
            self.deleted.append(m.remote_segment_id)

    rlmm, rsm = Metadata(), Storage()
    cleaner = Cleaner({}, "unused", rlmm, rsm, 1)  # type: ignore[arg-type]
    refused = metrics.ERRORS.labels("cleaner-delete")._value.get()
    done = metrics.SEGMENTS_DELETED.labels(tp.topic, "cleaner")._value.get()
    record = serde.encode(queued)
    assert cleaner.handle(record) is False and cleaner.handle(record) is False
    assert metrics.ERRORS.labels("cleaner-delete")._value.get() == refused + 2
    assert rlmm.md.state == RemoteLogSegmentState.DELETE_SEGMENT_STARTED and cleaner.deleted == 0
    rsm.refuse = False
    assert cleaner.handle(record) is True and cleaner.handle(record) is True
    assert rlmm.md.state == RemoteLogSegmentState.DELETE_SEGMENT_FINISHED
    assert cleaner.deleted == 1 and rsm.deleted == [queued.remote_log_segment_id.id]
    assert metrics.SEGMENTS_DELETED.labels(tp.topic, "cleaner")._value.get() == done + 1


def plant_orphans(rsm: RemoteStorageManager, tp: TopicIdPartition, pdir: Path, base_offset: int,
                  end_offset: int) -> set[str]:
    """A complete copy whose metadata was never written (crash before COPY_SEGMENT_STARTED reached the topic)
    and a copy that crashed half-way (a data object, no index); returns their keys."""
    stem = pdir / f"{base_offset:020d}"
    snapshot = pdir / f"{base_offset:020d}.snapshot"
    md = RemoteSegmentMetadata(
        remote_segment_id=uuid.uuid4(), topic_id=tp.topic_id, topic_name=tp.topic, partition=tp.partition,
        start_offset=base_offset, end_offset_inclusive=end_offset, max_timestamp_ms=int(time.time() * 1000),
        segment_size_bytes=stem.with_suffix(".log").stat().st_size, broker_id=1,
        event_timestamp_ms=int(time.time() * 1000), segment_leader_epochs=(EpochEntry(0, base_offset),))
    rsm.copy_log_segment_data(md, LogSegmentData(
        log_path=stem.with_suffix(".log"), offset_index_path=stem.with_suffix(".index"),
        time_index_path=stem.with_suffix(".timeindex"), transaction_index_path=None,
        producer_snapshot_path=snapshot if snapshot.exists() else None,
        leader_epoch_checkpoint=format_leader_epoch_checkpoint([EpochEntry(0, base_offset)])))
    keys = {o.key for o in rsm.store.list(rsm.keys(md).prefix)}
    assert any(k.endswith("-index") for k in keys)
    half = SegmentKeys.for_segment(tp.topic, tp.topic_id, tp.partition, base_offset, uuid.uuid4(),
                                   entropy=rsm.config.key_entropy)
    rsm.store.put(half.data(0), [b"first block of a copy that crashed"])
    return keys | {half.data(0)}


def test_gc_removes_orphans_and_nothing_else(kafka: KafkaCluster, topic_name: str, tmp_path: Path) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    sent = produce_segments(kafka, topic_name, 4, 150, segment_ms=300)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name))
    root = Path(settings.store.root_path)
    with Sidecar(settings) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 60, "every offset remote")
        segs = remote_segments(sidecar, tp)
        pdir = partition_dir(kafka, topic_name)
        orphans = plant_orphans(sidecar.rsm, tp, pdir, segs[0].start_offset, segs[0].end_offset_inclusive)
        prefix = partition_prefix(tp.topic, tp.topic_id, tp.partition, entropy=sidecar.rsm.config.key_entropy)
        sidecar.rsm.store.put(prefix + "README", [b"not a segment: gc leaves it alone"])
        before = store_keys(root)
        assert orphans <= before

        listed = sidecar.collect_garbage(dry_run=True)
        assert set(listed) == orphans
        assert store_keys(root) == before  # a dry run deletes nothing

        deleted = sidecar.collect_garbage()
        assert set(deleted) == orphans
        assert store_keys(root) == before - orphans
        assert prefix + "README" in store_keys(root)
        assert sidecar.collect_garbage(dry_run=True) == []
        after = remote_segments(sidecar, tp)
        assert [s.remote_log_segment_id for s in after] == [s.remote_log_segment_id for s in segs]
        assert_contiguous(after)
        assert_readable(sidecar, tp, sent)


def test_cleaner_is_a_static_member_so_shutdown_sends_no_group_leave(kafka: KafkaCluster, tmp_path: Path) -> None:
    """The cleaner joins its group as a static member (``group.instance.id``): stopping the sidecar sends no
    LeaveGroup (whose wait once slowed every restart), so the broker still lists the member after the stop; a
    restarted sidecar takes the same member's place."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    group = f"rlm-cleaner-{uuid.uuid4().hex[:6]}"
    settings = make_settings(kafka, tmp_path, topics={"include": ["none-of-these"]})
    admin = AdminClient(kafka.admin_config())

    def members() -> list[tuple[str | None, str]]:
        try:
            desc = admin.describe_consumer_groups([group])[group].result(30)
        except KafkaException:  # NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS before the group exists
            return []
        return [(m.group_instance_id, desc.state.name) for m in desc.members]

    sidecar = Sidecar(settings)
    sidecar.cleaner.stop()  # replaced by one in its own group, so that no other test's cleaner shares it
    sidecar.cleaner = Cleaner(sidecar.client_config, settings.metadata.to_be_deleted_topic, sidecar.rlmm,
                              sidecar.rsm, settings.broker_id, group_id=group, deleter=sidecar.deleter)
    sidecar.start()
    try:
        wait_for(lambda: members() == [(f"{group}-1", "STABLE")], 60, "the cleaner to join its group")
    finally:
        sidecar.stop()
    desc = admin.describe_consumer_groups([group])[group].result(30)
    assert [m.group_instance_id for m in desc.members] == [f"{group}-1"]  # no LeaveGroup: still a member
    assert desc.state != ConsumerGroupState.EMPTY


def test_a_refused_delete_whose_queue_write_fails_is_queued_by_the_next_attempt() -> None:
    """The store refuses a delete and writing it to the to-be-deleted topic fails too: the attempt raises
    (the run fails, logged), and the segment is not marked queued, so the next attempt (every copy run retries
    DELETE_SEGMENT_STARTED segments) queues it; once queued, later refusals do not queue it again."""
    from rlm.errors import DeleteQueueError
    from rlmm.memory import InMemoryRemoteLogMetadataManager

    tp = TopicIdPartition(uuid.uuid4(), "queue-unit", 0)
    rlmm = InMemoryRemoteLogMetadataManager(serve_all=True)
    md = RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.uuid4()), 0, 9, 1, 1, 1, 100, ((0, 0),))
    rlmm.add_remote_log_segment_metadata(md)
    rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
        md.remote_log_segment_id, 2, None, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 1))
    finished = next(m for m in rlmm.list_remote_log_segments(tp))

    class Refusing:
        def delete_log_segment_data(self, _m: Any) -> None:
            raise RemoteStorageError("access denied (test)")

    class FlakyQueue:
        def __init__(self) -> None:
            self.fail, self.put_calls = True, 0

        def put(self, m: RemoteLogSegmentMetadata) -> None:
            self.put_calls += 1
            if self.fail:
                raise DeleteQueueError(f"could not write {m.remote_log_segment_id} (test)")

    queue = FlakyQueue()
    deleter = SegmentDeleter(1, rlmm, Refusing(), queue)  # type: ignore[arg-type]
    with pytest.raises(DeleteQueueError):
        deleter.delete(finished, "retention-time")
    stuck = next(m for m in rlmm.list_remote_log_segments(tp))
    assert stuck.state == RemoteLogSegmentState.DELETE_SEGMENT_STARTED
    queue.fail = False
    assert deleter.delete(stuck, "unfinished-delete") is False  # refused again: queued this time
    assert queue.put_calls == 2
    assert deleter.delete(stuck, "unfinished-delete") is False  # refused again: already queued
    assert queue.put_calls == 2


def test_two_deployments_cleaners_on_one_cluster_do_not_fence_each_other(kafka: KafkaCluster) -> None:
    """Two deployments on one cluster (each its own to-be-deleted topic) run a cleaner each for the same broker id:
    each cleaner's group is its topic's, so both stay members with their own queue assigned. In one shared group
    their static members (``<group>-<broker id>``) fence each other and one queue goes unretried."""
    from confluent_kafka.admin import AdminClient

    topics = [f"tbd-{uuid.uuid4().hex[:8]}" for _ in range(2)]
    for t in topics:
        kafka.create_topic(t, 2)
    cleaners = [Cleaner(kafka.client_config(), t, None, None, 7,  # type: ignore[arg-type] - never deletes here
                        deleter=SegmentDeleter(7, None, None, None))  # type: ignore[arg-type]
                for t in topics]
    admin = AdminClient(kafka.admin_config())

    def assigned(group: str) -> dict[str, set[tuple[str, int]]]:
        """Static member id -> the partitions the group gave it."""
        try:
            desc = admin.describe_consumer_groups([group])[group].result(30)
        except KafkaException:  # NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS before the group exists
            return {}
        return {m.group_instance_id: {(tp.topic, tp.partition) for tp in m.assignment.topic_partitions}
                for m in desc.members}

    for c in cleaners:
        c.start()
    try:
        groups = [c._consumer_config["group.id"] for c in cleaners]
        want = [{f"{g}-7": {(t, 0), (t, 1)}} for g, t in zip(groups, topics, strict=True)]
        wait_for(lambda: [assigned(str(g)) for g in groups] == want, 60, "each cleaner to hold its own partitions")
        time.sleep(2.0)  # a fencing would show within a heartbeat or two
        assert all(c._thread.is_alive() for c in cleaners)
        assert [assigned(str(g)) for g in groups] == want
    finally:
        for c in cleaners:
            c.stop()
