"""Topic-level sidecar behaviour against the real broker: a deleted topic's remote data is purged through the
partition-delete states, per-topic paused copying, backfill of a topic's history, and a replica moved between
the log dirs of one broker (JBOD)."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlmm import serde
from rlmm.api import (
    PartitionNotServedError,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from rsm.log.partition import PartitionDir
from rsm.manager import RemoteStorageManager
from tests.support.kafka import partition_dir
from tests.support.sidecar import (
    RecordingRsm,
    assert_contiguous,
    latest_remote,
    make_settings,
    produce_segments,
    remote_segments,
    store_keys,
    wait_for,
)

REASSIGN = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand"


def topics(*names: str) -> dict[str, list[str]]:
    """``topics`` settings tiering exactly these topics (the session broker holds every test's topics)."""
    return {"include": [re.escape(n) for n in names]}


def read_remote(sidecar: Sidecar, tp: TopicIdPartition, from_offset: int) -> dict[int, tuple[bytes, bytes]]:
    return {r.offset: (r.key, r.value) for r in sidecar.reader.read(tp, from_offset)}


def sent_from(sent: dict[int, tuple[bytes, bytes]], first: int) -> dict[int, tuple[bytes, bytes]]:
    return {o: kv for o, kv in sent.items() if o >= first}


def metadata_history(bootstrap: str, md_topic: str, mp: int, timeout_s: float = 60.0) -> list[object]:
    """Every decoded value of one metadata partition, from its beginning to its end (tombstones left out)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"probe-{uuid.uuid4().hex}",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(md_topic, mp, OFFSET_BEGINNING)])
    out: list[object] = []
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            assert time.monotonic() < deadline, f"{md_topic}-{mp} not read to its end within {timeout_s}s"
            msg = c.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    return out
                continue
            if msg.value() is not None:
                out.append(serde.decode(msg.value()))
    finally:
        c.close()


class GatedRsm(RemoteStorageManager):
    """The real storage manager whose copies wait while ``gate`` is closed (a slow upload in flight)."""

    gate: threading.Event
    waiting: int

    def copy_log_segment_data(self, segment_metadata, segment_data, **kw):  # type: ignore[no-untyped-def]
        if not self.gate.is_set():
            self.waiting += 1
            self.gate.wait(300)
        return super().copy_log_segment_data(segment_metadata, segment_data, **kw)


# ------------------------------------------------------------------------------------------ deleted topic
def test_deleted_topic_is_purged_through_partition_delete_states(kafka: KafkaCluster, topic_name: str,
                                                                  tmp_path: Path) -> None:
    doomed_name, kept_name = f"{topic_name}-del", f"{topic_name}-keep"
    doomed = TopicIdPartition(kafka.create_topic(doomed_name, 1, config={"segment.ms": "300"}), doomed_name, 0)
    kept = TopicIdPartition(kafka.create_topic(kept_name, 1, config={"segment.ms": "300"}), kept_name, 0)
    sent_doomed = produce_segments(kafka, doomed_name, 4, 150, segment_ms=300)
    sent_kept = produce_segments(kafka, kept_name, 4, 150, segment_ms=300)
    settings = make_settings(kafka, tmp_path, topics=topics(doomed_name, kept_name))
    root = Path(settings.store.root_path)
    with Sidecar(settings) as sidecar:
        wait_for(lambda: latest_remote(sidecar, doomed) >= max(sent_doomed), 120, "the doomed topic to be remote")
        wait_for(lambda: latest_remote(sidecar, kept) >= max(sent_kept), 120, "the kept topic to be remote")
        doomed_segs = remote_segments(sidecar, doomed)
        kept_segs = remote_segments(sidecar, kept)
        keys_before = store_keys(root)
        doomed_keys = {k for k in keys_before if str(doomed.topic_id) in k}
        kept_keys = {k for k in keys_before if str(kept.topic_id) in k}
        assert len(doomed_segs) >= 4 and len(kept_segs) >= 4
        assert doomed_keys and kept_keys
        assert doomed in sidecar.known.all()

        admin = AdminClient(kafka.admin_config())
        admin.delete_topics([doomed_name], operation_timeout=30)[doomed_name].result(60)

        def delete_state() -> RemotePartitionDeleteState | None:
            try:
                md = sidecar.rlmm.remote_partition_delete_metadata(doomed)
            except PartitionNotServedError:
                return None  # between discovery's stop and the purge's re-assign
            return md.state if md is not None else None

        wait_for(lambda: delete_state() == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED, 120,
                 "DELETE_PARTITION_FINISHED for the deleted topic")
        wait_for(lambda: doomed not in sidecar.known.all(), 30, "the purged partition to be forgotten")
        time.sleep(2.0)  # several more discovery rounds: the purge is not repeated

        # The metadata: MARKED -> STARTED -> FINISHED, once each and in that order, by this broker; every
        # segment walked DELETE_SEGMENT_STARTED -> DELETE_SEGMENT_FINISHED before FINISHED.
        history = metadata_history(kafka.bootstrap_servers, settings.metadata.topic,
                                   sidecar.rlmm.cache.mp_of(doomed))
        pdel = [(i, h) for i, h in enumerate(history) if isinstance(h, RemotePartitionDeleteMetadata)
                and h.topic_id_partition == doomed]
        assert [h.state for _, h in pdel] == [RemotePartitionDeleteState.DELETE_PARTITION_MARKED,
                                             RemotePartitionDeleteState.DELETE_PARTITION_STARTED,
                                             RemotePartitionDeleteState.DELETE_PARTITION_FINISHED]
        assert all(h.broker_id == settings.broker_id for _, h in pdel)
        finished_at = pdel[-1][0]
        started_at = pdel[1][0]
        for seg in doomed_segs:
            steps = [(i, h.state) for i, h in enumerate(history) if isinstance(h, RemoteLogSegmentMetadataUpdate)
                     and h.remote_log_segment_id == seg.remote_log_segment_id
                     and h.state >= RemoteLogSegmentState.DELETE_SEGMENT_STARTED]
            assert [s for _, s in steps] == [RemoteLogSegmentState.DELETE_SEGMENT_STARTED,
                                             RemoteLogSegmentState.DELETE_SEGMENT_FINISHED], seg
            assert started_at < steps[0][0] and steps[-1][0] < finished_at
        assert sidecar.rlmm.list_remote_log_segments(doomed) == []

        # The store: nothing of the deleted topic is left; the other topic's objects are all still there.
        keys_after = store_keys(root)
        assert not any(str(doomed.topic_id) in k or k.startswith(doomed_name) for k in keys_after)
        assert {k for k in keys_after if str(kept.topic_id) in k} == kept_keys
        assert keys_after == keys_before - doomed_keys

        # The other topic's remote data: same segments, every record readable byte-exact.
        assert [s.remote_log_segment_id for s in remote_segments(sidecar, kept)] == \
            [s.remote_log_segment_id for s in kept_segs]
        assert_contiguous(remote_segments(sidecar, kept))
        got = read_remote(sidecar, kept, 0)
        assert {o: got[o] for o in got if o in sent_kept} == sent_kept


# ------------------------------------------------------------------------------------------------- paused
def test_paused_topic_copies_nothing_but_still_reads_and_expires(kafka: KafkaCluster, topic_name: str,
                                                                 tmp_path: Path) -> None:
    """``topics.paused`` is read from the (frozen) settings at start: pausing means restarting the sidecar with
    the topic listed there, keeping its state dir."""
    paused_name, live_name = f"{topic_name}-p", f"{topic_name}-u"
    paused = TopicIdPartition(kafka.create_topic(paused_name, 1, config={"segment.ms": "300"}), paused_name, 0)
    live = TopicIdPartition(kafka.create_topic(live_name, 1, config={"segment.ms": "300"}), live_name, 0)
    old_paused = produce_segments(kafka, paused_name, 4, 120, segment_ms=300)
    old_live = produce_segments(kafka, live_name, 3, 120, segment_ms=300)
    settings = make_settings(kafka, tmp_path, topics=topics(paused_name, live_name))

    # 1. Unpaused: both topics are tiered.
    with Sidecar(settings) as sidecar:
        wait_for(lambda: latest_remote(sidecar, paused) >= max(old_paused), 120, "the paused topic's history")
        wait_for(lambda: latest_remote(sidecar, live) >= max(old_live), 120, "the live topic's history")
        before = remote_segments(sidecar, paused)
    assert len(before) >= 4
    assert_contiguous(before)
    paused_end = before[-1].end_offset_inclusive

    # 2. New data for both; restart with the topic paused and remote retention by size over its two newest
    # remote segments.
    new_paused = produce_segments(kafka, paused_name, 3, 120, segment_ms=300)
    new_live = produce_segments(kafka, live_name, 3, 120, segment_ms=300)
    keep = before[-2:]
    limit = sum(s.segment_size_bytes for s in keep)
    paused_settings = settings.model_copy(update={
        "topics": settings.topics.model_copy(update={"paused": [re.escape(paused_name)]}),
        "retention": [settings.retention[0].model_copy(update={"pattern": re.escape(paused_name),
                                                                "retention_bytes": limit}),
                      settings.retention[0]]})
    assert paused_settings.topics.is_paused(paused_name) and not paused_settings.topics.is_paused(live_name)
    with Sidecar(paused_settings) as sidecar:
        wait_for(lambda: latest_remote(sidecar, live) >= max(new_live), 120, "the live topic's new records")
        wait_for(lambda: [s.remote_log_segment_id for s in remote_segments(sidecar, paused)]
                 == [s.remote_log_segment_id for s in keep], 120, "the paused topic's oldest segments to expire")
        time.sleep(3.0)  # many copy intervals (300 ms) more: still nothing new for the paused topic
        # No copy was even started (any state) past what was remote before the pause.
        listed = sidecar.rlmm.list_remote_log_segments(paused)
        assert [s.remote_log_segment_id for s in listed] == [s.remote_log_segment_id for s in keep]
        assert latest_remote(sidecar, paused) == paused_end < min(new_paused)
        # ... while its remaining remote segments are read byte-exact,
        got = read_remote(sidecar, paused, keep[0].start_offset)
        assert {o: got[o] for o in got if o in old_paused} == sent_from(old_paused, keep[0].start_offset)
        assert max(got) == paused_end
        # ... and the live topic got everything, contiguous.
        live_segs = remote_segments(sidecar, live)
        assert_contiguous(live_segs)
        got_live = read_remote(sidecar, live, 0)
        assert {o: got_live[o] for o in got_live if o in old_live or o in new_live} == {**old_live, **new_live}

    # 3. Unpaused again (unlimited retention): the paused topic resumes right after its last remote offset.
    with Sidecar(settings) as sidecar:
        wait_for(lambda: latest_remote(sidecar, paused) >= max(new_paused), 120, "the paused topic to catch up")
        segs = remote_segments(sidecar, paused)
        assert [s.remote_log_segment_id for s in segs[:2]] == [s.remote_log_segment_id for s in keep]
        assert_contiguous(segs, first_offset=keep[0].start_offset)
        got = read_remote(sidecar, paused, paused_end + 1)
        assert {o: got[o] for o in got if o in new_paused} == new_paused


# ------------------------------------------------------------------------------------------------ backfill
def test_backfill_of_a_topic_with_history(kafka: KafkaCluster, topic_name: str, tmp_path: Path) -> None:
    tp = TopicIdPartition(kafka.create_topic(topic_name, 1, config={"segment.ms": "300"}), topic_name, 0)
    sent = produce_segments(kafka, topic_name, 14, 100, segment_ms=300, value_size=150,
                            **{"compression.type": "zstd"})
    local = PartitionDir(partition_dir(kafka, topic_name)).rolled_ranges()
    assert len(local) >= 14 and local[0][0] == 0 and local[-1][1] >= max(sent)

    settings = make_settings(kafka, tmp_path, topics=topics(topic_name))
    rsm = RecordingRsm(settings.store)
    with Sidecar(settings, rsm=rsm) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= local[-1][1], 180, "the whole history to be remote")
        segs = remote_segments(sidecar, tp)
        # Every rolled local segment, as it is on the broker: none skipped, none merged, none twice.
        assert [(s.start_offset, s.end_offset_inclusive) for s in segs] == local
        assert_contiguous(segs)
        # Oldest first, each once.
        assert rsm.copied == [b for b, _ in local]
        assert all(s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED
                   for s in sidecar.rlmm.list_remote_log_segments(tp))
        got = read_remote(sidecar, tp, 0)
        assert sorted(got) == list(range(local[-1][1] + 1))  # every offset of the history, in order
        assert {o: got[o] for o in sent} == sent
        wait_for(lambda: sidecar.staging.staged() == [], 30, "staging to be emptied")  # released after FINISHED


# ---------------------------------------------------------------------------------------------- log dir move
@pytest.mark.slow
def test_replica_moved_between_log_dirs_is_followed(topic_name: str, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="rlm")
    kc = KafkaCluster(brokers=1, log_dirs_per_broker=2, start_timeout_s=300)
    sidecar: Sidecar | None = None
    try:
        kc.start()
        tp = TopicIdPartition(kc.create_topic(topic_name, 1, config={"segment.ms": "300"}, timeout=60),
                              topic_name, 0)
        source = wait_for(lambda: next((d / f"{topic_name}-0" for d in kc.node(1).log_dirs
                                        if (d / f"{topic_name}-0").is_dir()), None), 60, "the partition dir")
        target_dir = next(d for d in kc.node(1).log_dirs if d != source.parent)
        target = target_dir / source.name
        first = produce_segments(kc, topic_name, 4, 150, segment_ms=300)

        settings = make_settings(kc, tmp_path, topics=topics(topic_name))
        assert len(settings.log_dirs) == 2
        rsm = GatedRsm(settings.store)
        rsm.gate, rsm.waiting = threading.Event(), 0
        rsm.gate.set()
        sidecar = Sidecar(settings, rsm=rsm).start()
        wait_for(lambda: latest_remote(sidecar, tp) >= max(first), 120, "the first segments to be remote")
        before = remote_segments(sidecar, tp)
        assert_contiguous(before)

        # Segments rolled but not remote yet when the replica moves: one copy in flight (held at the store),
        # the others staged (hard-linked) from the old log dir.
        rsm.gate.clear()
        pending = produce_segments(kc, topic_name, 3, 150, segment_ms=300)
        wait_for(lambda: rsm.waiting >= 1, 60, "a copy to be in flight")
        old_staging = Path(settings.staging_dir) / source.parent.name
        wait_for(lambda: len([s for s in sidecar.staging.staged() if old_staging in s.directory.parents]) >= 3,
                 60, "the pending segments to be staged from the old log dir")

        # Move the replica to the broker's other log dir with Kafka's reassignment tool.
        plan = tmp_path / "move.json"
        plan.write_text(json.dumps({"version": 1, "partitions": [
            {"topic": topic_name, "partition": 0, "replicas": [1], "log_dirs": [str(target_dir)]}]}))
        proc = kc.run_class(REASSIGN, ["--bootstrap-server", kc.bootstrap_servers,
                                       "--reassignment-json-file", str(plan), "--execute"], timeout=180)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        wait_for(lambda: target.is_dir() and not source.exists(), 180, "the partition dir to move")

        def verified() -> bool:
            p = kc.run_class(REASSIGN, ["--bootstrap-server", kc.bootstrap_servers,
                                        "--reassignment-json-file", str(plan), "--verify"], timeout=180)
            return p.returncode == 0 and "in progress" not in p.stdout and "completed" in p.stdout

        wait_for(verified, 180, "the reassignment tool to report the move complete", interval_s=2.0)
        wait_for(lambda: (led := sidecar.leadership.get(topic_name, 0)) is not None and led.path == target, 60,
                 "the sidecar to follow the partition into its new log dir")
        rsm.gate.set()

        second = produce_segments(kc, topic_name, 4, 150, segment_ms=300)
        wait_for(lambda: latest_remote(sidecar, tp) >= max(second), 120, "the segments after the move")
        segs = remote_segments(sidecar, tp)
        assert [s.remote_log_segment_id for s in segs[:len(before)]] == [s.remote_log_segment_id for s in before]
        assert len(segs) > len(before)
        assert segs[len(before)].start_offset == before[-1].end_offset_inclusive + 1
        assert_contiguous(segs)  # no gap, no offset range remote twice
        got = read_remote(sidecar, tp, 0)
        assert {o: got[o] for o in got if o in first or o in pending or o in second} == \
            {**first, **pending, **second}
        assert sorted(got) == list(range(segs[-1].end_offset_inclusive + 1))
        # The segments staged from the old log dir and staged again from the new one (the same offsets) were
        # released as remote already, never made into an empty copy that fails the whole copy run.
        inverted = [r.getMessage() for r in caplog.records if r.exc_info and "bad offsets" in str(r.exc_info[1])]
        assert inverted == []
        wait_for(lambda: sidecar.staging.staged() == [], 30, "staging to be emptied")  # released after FINISHED
    finally:
        if sidecar is not None:
            sidecar.rsm.gate.set()  # type: ignore[attr-defined]
            sidecar.stop()
        kc.stop()
