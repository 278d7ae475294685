"""A copied segment's leader epochs are what its batches say, though the broker's log start moved past the start of
its epochs before the copy (:mod:`rlm.tasks.segment_epochs`), against the real 3-broker cluster.

One topic of 3 replicas: a first leader writes epoch E0's records, leadership moves (reassignment and a preferred
election: E1) and the new leader writes more, so that the new leader's first segment holds both epochs; a record
timestamped ahead rolls it (``segment.ms`` is long: nothing else rolls). A sidecar next to the new leader stages the
segment, and its copies fail until the test lets them go. Meanwhile the broker's log start moves: DeleteRecords to
inside E1 (the segment stays local), or local retention deletes the segment (it stays staged). Kafka cuts the
leader-epoch checkpoint back to the log start: E0 is gone from it, E1 starts at the log start. The copy made after
that records E0 from the segment's start and E1 from where its batches begin it; before, it recorded E1 from the log
start (``delete_records``) or E0 alone (``retention``), and the tier's lineage ended E0 at the wrong offset."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlmm.api import RemoteLogSegmentMetadata, TopicIdPartition
from rsm.errors import RemoteStorageError
from rsm.log.batch import scan_batches
from rsm.log.checkpoint import EpochEntry, read_leader_epoch_checkpoint
from rsm.manager import RemoteStorageManager
from tests.support.kafka import broker_watermarks, partition_dir, produce, set_topic_config
from tests.support.sidecar import PartitionStates, copy_state, make_settings, only, reassign, remote_segments, wait_for

NODES = (1, 2, 3)
PER_EPOCH = 40
SEGMENT_MS = 300_000  # no roll but the test's own, by a record timestamped AHEAD_MS ahead
AHEAD_MS = 600_000
INTO_E1 = 20  # DeleteRecords: the broker's log start this many offsets into E1


class HeldRsm(RemoteStorageManager):
    """The real storage manager whose copies fail until ``release`` is set (each copy run prepares its copies anew:
    the one after the release reads the checkpoint as the broker left it)."""

    release: threading.Event
    tried: threading.Event  # a copy was tried (and failed)

    def copy_log_segment_data(self, segment_metadata, data, **kw):  # type: ignore[no-untyped-def]
        if not self.release.is_set():
            self.tried.set()
            raise RemoteStorageError("held by the test")
        return super().copy_log_segment_data(segment_metadata, data, **kw)


def _batch_epochs(log: Path) -> tuple[tuple[int, int], ...]:
    """(epoch, first offset) of each run of batches under one epoch in ``log``, read from the batch headers."""
    out: list[tuple[int, int]] = []
    for h in scan_batches(log):
        if not out or out[-1][0] != h.partition_leader_epoch:
            out.append((h.partition_leader_epoch, h.base_offset))
    return tuple(out)


@pytest.mark.parametrize("moved", ["delete_records", "retention"])
def test_a_copy_after_the_log_start_moved_records_the_epochs_its_batches_say(
        kafka_cluster3: KafkaCluster, topic_name: str, tmp_path: Path, moved: str) -> None:
    kafka = kafka_cluster3
    tid = kafka.create_topic(topic_name, 1, replication_factor=3, config={"segment.ms": str(SEGMENT_MS)})
    tp = TopicIdPartition(tid, topic_name, 0)
    states = PartitionStates(kafka)
    first = wait_for(lambda: (n := states.leader(topic_name)) > 0 and n, 30, "a leader")
    sent: dict[int, tuple[bytes, bytes]] = {}
    tag = uuid.uuid4().hex[:6]

    def send(records: list[tuple]) -> list[int]:
        offsets = [off for _p, off in produce(kafka, topic_name, records, acks="all", **{"batch.num.messages": 10})]
        sent.update((o, (r[0], r[1])) for o, r in zip(offsets, records, strict=True))
        return offsets

    e0 = send([(f"{tag}-e0-{i}".encode(), b"e0" * 40) for i in range(PER_EPOCH)])
    new = next(n for n in NODES if n != first)
    reassign(kafka, {(topic_name, 0): [new, *(n for n in NODES if n != new)]}, tmp_path)
    wait_for(lambda: states.elect(topic_name, [0]) and states.leader(topic_name) == new, 60, f"node {new} to lead")
    e1 = send([(f"{tag}-e1-{i}".encode(), b"e1" * 40) for i in range(PER_EPOCH)])
    (roll,) = send([(b"ahead", b"a", None, int(time.time() * 1000) + AHEAD_MS)])
    pdir = partition_dir(kafka, topic_name, node_id=new)
    seg = pdir / f"{0:020d}.log"
    assert sorted(p.name for p in pdir.glob("*.log")) == [seg.name, f"{roll:020d}.log"]  # the premise: one segment
    end = roll - 1
    assert (e0[0], e1[0], end) == (0, PER_EPOCH, 2 * PER_EPOCH - 1)
    batches = _batch_epochs(seg)
    (ep0, _), (ep1, _) = batches
    assert batches == ((ep0, 0), (ep1, e1[0])) and ep0 < ep1  # the premise: the segment holds both epochs
    assert read_leader_epoch_checkpoint(pdir / "leader-epoch-checkpoint") == [EpochEntry(ep0, 0),
                                                                               EpochEntry(ep1, e1[0])]

    settings = make_settings(kafka, tmp_path, node_id=new, topics=only(topic_name))
    rsm = HeldRsm(settings.store)
    rsm.release, rsm.tried = threading.Event(), threading.Event()
    with Sidecar(settings, rsm=rsm) as sidecar:
        wait_for(lambda: sidecar.health()[1]["leading"] == 1, 60, "the sidecar to lead the partition")
        wait_for(rsm.tried.is_set, 60, "a copy to be tried and held", detail=lambda: copy_state(sidecar, tp))
        if moved == "delete_records":
            log_start = e1[0] + INTO_E1
            admin = AdminClient(kafka.admin_config())
            for fut in admin.delete_records([TopicPartition(topic_name, 0, log_start)]).values():
                fut.result(30)
        else:
            log_start = roll
            set_topic_config(kafka, topic_name, retention_ms="1000")  # the ahead record's segment is kept
            wait_for(lambda: not seg.exists(), 120, "local retention to delete the segment",
                     detail=lambda: str(sorted(p.name for p in pdir.iterdir())))
        wait_for(lambda: broker_watermarks(kafka, topic_name)[0] == log_start, 60, f"the log start at {log_start}")
        # the premise: Kafka cut the checkpoint back to the log start, E0 gone from it
        wait_for(lambda: read_leader_epoch_checkpoint(pdir / "leader-epoch-checkpoint")
                 == [EpochEntry(ep1, log_start)], 30, "the checkpoint cut back to the log start",
                 detail=lambda: str(read_leader_epoch_checkpoint(pdir / "leader-epoch-checkpoint")))
        assert remote_segments(sidecar, tp) == []  # nothing copied yet
        rsm.release.set()
        segs: list[RemoteLogSegmentMetadata] = wait_for(lambda: remote_segments(sidecar, tp), 60, "the copy",
                                                        detail=lambda: copy_state(sidecar, tp))
        records = list(sidecar.reader.read(tp, 0))
    assert [(m.start_offset, m.end_offset_inclusive) for m in segs] == [(0, end)]
    (md,) = segs
    assert md.segment_leader_epochs == batches  # was ((ep1, log_start),) or ((ep0, 0),)
    # the copy's own batches: each offset once, its record's epoch the map's
    assert [r.offset for r in records] == list(range(end + 1))
    assert all((r.key, r.value) == sent[r.offset] and r.leader_epoch == md.epoch_at(r.offset) for r in records)
