"""Rolled segments copied in place, unstaged, where the topic's ``file.delete.delay.ms`` allows it
(:mod:`rlm.tasks.in_place`), against the real broker: the copies are exact (an aborted transaction's index uploaded
from the anonymous file the copy holds), nothing is staged; with a short delay everything is staged at once as
before; with a long one, segments retention renames while their copy waits are staged and copied, none lost."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlm.tasks.staging import StageRound
from rlmm.api import TopicIdPartition
from rsm.log.partition import DELETED_SUFFIX
from rsm.manager import RemoteStorageManager
from tests.support.kafka import set_topic_config
from tests.support.sidecar import (
    assert_contiguous,
    assert_readable,
    copy_state,
    latest_remote,
    make_settings,
    only,
    produce_segments,
    remote_segments,
    wait_for,
)
from tests.support.txn import TxnProducer, plain


def staged_rounds(sidecar: Sidecar, tp: TopicIdPartition) -> list[list[tuple[int, int]]]:
    """Every staging round of ``tp`` with segments in it, from now on (the stage job's, the copy runs')."""
    rounds: list[list[tuple[int, int]]] = []
    inner = sidecar.staging.stage_many

    def spy(tp_: TopicIdPartition, partition_dir: Path, ranges: Iterable[tuple[int, int]], **kw: object,
            ) -> StageRound:
        ranges = list(ranges)
        if tp_ == tp and ranges:
            rounds.append(ranges)
        return inner(tp_, partition_dir, ranges, **kw)  # type: ignore[arg-type]

    sidecar.staging.stage_many = spy  # type: ignore[method-assign]
    return rounds


def test_segments_copied_in_place_are_exact_and_never_staged(kafka: KafkaCluster, topic_name: str,
                                                             tmp_path: Path) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300", "file.delete.delay.ms": "120000"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name))
    sidecar = Sidecar(settings)
    rounds = staged_rounds(sidecar, tp)
    with sidecar:
        wait_for(lambda: sidecar.health()[1]["leading"] == 1, 30, "the sidecar to lead the partition")
        tx = TxnProducer(kafka, topic_name)
        committed: dict[int, tuple[bytes, bytes]] = {}
        aborted: dict[int, tuple[bytes, bytes]] = {}
        for round_ in range(3):
            committed |= tx.txn(f"c{round_}", 30, commit=True)
            aborted |= tx.txn(f"a{round_}", 20, commit=False)
            committed |= plain(kafka, topic_name, f"p{round_}", 10)
            time.sleep(0.35)
        committed |= produce_segments(kafka, topic_name, 3, 50, segment_ms=300)
        wait_for(lambda: latest_remote(sidecar, tp) >= max(committed) - 1, 60, "every rolled segment to be remote")
        segs = remote_segments(sidecar, tp)
        assert_contiguous(segs)
        last = segs[-1].end_offset_inclusive
        want = {o: kv for o, kv in committed.items() if o <= last}
        got = {r.offset: (r.key, r.value) for r in sidecar.reader.read(tp, 0, isolation="read_committed")}
        assert got == want
        everything = {r.offset: (r.key, r.value) for r in sidecar.reader.read(tp, 0)}
        assert everything == want | aborted

        assert rounds == []  # nothing staged: every segment was copied in place
        led = sidecar.leadership.get(topic_name, 0)
        assert led is not None and led.copier.defer_staging_s == 60.0  # half of the topic's delay
        assert not (Path(settings.staging_dir) / str(topic_id) / f"{topic_name}-0").exists()


def test_a_short_delete_delay_stages_at_once_and_loses_nothing(kafka: KafkaCluster, topic_name: str,
                                                               tmp_path: Path) -> None:
    """The broker deletes a rolled segment within ~1-2 s (retention 500 ms, checked every second, files unlinked 1 s
    after their rename); the sidecar copies every 4 s: staged at once, as before, every offset is copied."""
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300", "retention.ms": "500",
                                                          "file.delete.delay.ms": "1000"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    sidecar = Sidecar(make_settings(kafka, tmp_path, topics=only(topic_name), tasks={"copy_interval_ms": 4000}))
    rounds = staged_rounds(sidecar, tp)
    with sidecar:
        wait_for(lambda: sidecar.health()[1]["leading"] == 1, 30, "the sidecar to lead the partition")
        sent = produce_segments(kafka, topic_name, 8, 100, segment_ms=300)
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 60, "every produced offset to be remote")
        assert_contiguous(remote_segments(sidecar, tp))
        assert_readable(sidecar, tp, sent)
        led = sidecar.leadership.get(topic_name, 0)
        assert led is not None and led.copier.defer_staging_s is None  # 1 s < 4 stage intervals (4 x 300 ms)
        assert sum(len(r) for r in rounds) >= 8  # every rolled segment staged


class HeldRsm(RemoteStorageManager):
    """The real storage manager whose first copy waits for ``release``: the copy run holding it takes no new segment."""

    held: threading.Event
    release: threading.Event

    def copy_log_segment_data(self, segment_metadata, data, **kw):  # type: ignore[no-untyped-def]
        if not self.held.is_set():
            self.held.set()
            self.release.wait(120)
        return super().copy_log_segment_data(segment_metadata, data, **kw)


def test_segments_renamed_by_retention_while_their_copy_waits_are_staged(kafka: KafkaCluster, topic_name: str,
                                                                        tmp_path: Path) -> None:
    """Staging waits (delay 8 s: up to 4 s); the first segment's copy is held, so the segments rolled meanwhile wait
    for the next run; retention renames each to ``.deleted`` within ~1-2 s of its roll and the broker unlinks it 8 s
    later. The stage job stages them before that, and once the copy goes on every offset is copied, none lost."""
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300", "retention.ms": "500",
                                                          "file.delete.delay.ms": "8000"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name))
    rsm = HeldRsm(settings.store)
    rsm.held, rsm.release = threading.Event(), threading.Event()
    sidecar = Sidecar(settings, rsm=rsm)
    rounds = staged_rounds(sidecar, tp)
    with sidecar:
        try:
            wait_for(lambda: sidecar.health()[1]["leading"] == 1, 30, "the sidecar to lead the partition")
            sent = produce_segments(kafka, topic_name, 1, 100, segment_ms=300)
            assert rsm.held.wait(60), "no copy started"
            led = sidecar.leadership.get(topic_name, 0)
            assert led is not None and led.copier.defer_staging_s == 4.0
            sent |= produce_segments(kafka, topic_name, 4, 100, segment_ms=300)
            pdir = led.path
            # the segments' bases, live or renamed .deleted by retention already (a loaded machine: CI saw [301, 401]
            # from the live names alone); the last is the active segment
            rolled = sorted({int(p.name[:20]) for p in pdir.iterdir()
                             if p.name.endswith((".log", f".log{DELETED_SUFFIX}"))})[:-1]
            assert len(rolled) >= 4, rolled

            def unlinked() -> bool:  # renamed by retention, then unlinked by the broker
                names = {p.name for p in pdir.iterdir()}
                return all(f"{base:020d}.log" not in names and f"{base:020d}.log{DELETED_SUFFIX}" not in names
                           for base in rolled)

            wait_for(unlinked, 60, "the broker to delete the rolled segments", interval_s=0.5)
        finally:
            rsm.release.set()
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent) - 1, 60, "every rolled segment to be remote")
        assert_contiguous(remote_segments(sidecar, tp))
        assert_readable(sidecar, tp, {o: kv for o, kv in sent.items() if o <= latest_remote(sidecar, tp)})
        assert rounds  # staged: nothing else kept them once the broker unlinked them


def test_segments_waiting_unstaged_count_as_held_in_the_retention_margin(kafka: KafkaCluster, topic_name: str,
                                                                         tmp_path: Path) -> None:
    """Segments left unstaged for a copy in place are staged at retention's rename, so the retention margin counts
    them as it counts staged ones: with their copy held, the partition's oldest segment at risk is its active one,
    not the oldest waiting one."""
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300", "retention.ms": "3600000",
                                                          "file.delete.delay.ms": "120000"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name))
    rsm = HeldRsm(settings.store)
    rsm.held, rsm.release = threading.Event(), threading.Event()
    with Sidecar(settings, rsm=rsm) as sidecar:
        try:
            wait_for(lambda: sidecar.health()[1]["leading"] == 1, 30, "the sidecar to lead the partition")
            produce_segments(kafka, topic_name, 1, 20, segment_ms=300)
            assert rsm.held.wait(60), "no copy started"
            produce_segments(kafka, topic_name, 2, 20, segment_ms=300)
            led = sidecar.leadership.get(topic_name, 0)
            assert led is not None
            wait_for(lambda: len(led.copier.deferred_bases()) >= 3, 30, "the rolled segments to wait unstaged",
                     detail=lambda: f"{led.copier.deferred_bases()} {copy_state(sidecar, tp)}")
            active = max(int(p.name[:20]) for p in led.path.glob("*.log"))
            wait_for(lambda: tp in sidecar.margins and sidecar.margins[tp].segment == active, 30,
                     "the margin's oldest segment at risk to be the active one",
                     detail=lambda: f"{sidecar.margins.get(tp)}; waiting {led.copier.deferred_bases()}")
            assert sidecar.staging.staged(tp) == []
        finally:
            rsm.release.set()


def test_segments_that_waited_long_enough_are_staged_without_a_change(kafka: KafkaCluster, topic_name: str,
                                                                      tmp_path: Path) -> None:
    """Staging waits up to 0.6 s (delay 1.2 s, four 300 ms stage intervals); the copy is held and the partition's
    directory changes no more: the stage job stages the waiting segments all the same."""
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300", "file.delete.delay.ms": "1200"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name))
    rsm = HeldRsm(settings.store)
    rsm.held, rsm.release = threading.Event(), threading.Event()
    with Sidecar(settings, rsm=rsm) as sidecar:
        try:
            wait_for(lambda: sidecar.health()[1]["leading"] == 1, 30, "the sidecar to lead the partition")
            sent = produce_segments(kafka, topic_name, 1, 20, segment_ms=300)
            assert rsm.held.wait(60), "no copy started"
            sent |= produce_segments(kafka, topic_name, 2, 20, segment_ms=300)
            led = sidecar.leadership.get(topic_name, 0)
            assert led is not None and led.copier.defer_staging_s == 0.6
            rolled = sorted(int(p.name[:20]) for p in led.path.glob("*.log"))[:-1]
            wait_for(lambda: [s.base_offset for s in sidecar.staging.staged(tp)] == rolled, 30,
                     "every rolled segment to be staged", detail=lambda: copy_state(sidecar, tp))
            assert not led.copier.deferring
        finally:
            rsm.release.set()
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent) - 1, 60, "every rolled segment to be remote")
        assert_contiguous(remote_segments(sidecar, tp))
        assert_readable(sidecar, tp, {o: kv for o, kv in sent.items() if o <= latest_remote(sidecar, tp)})


def test_a_delete_delay_lowered_while_segments_wait_stages_them_at_the_next_round(kafka: KafkaCluster,
                                                                                   topic_name: str,
                                                                                   tmp_path: Path) -> None:
    """Segments wait unstaged (delay 120 s: up to 60 s), their copy held; the topic's delay is lowered to 1 s: the
    discovery reads it again while they wait and the stage job stages them at its next rounds, not after the next full
    discovery round (a minute later), in which retention could rename and the broker unlink them."""
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300", "file.delete.delay.ms": "120000"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name))
    rsm = HeldRsm(settings.store)
    rsm.held, rsm.release = threading.Event(), threading.Event()
    with Sidecar(settings, rsm=rsm) as sidecar:
        try:
            wait_for(lambda: sidecar.health()[1]["leading"] == 1, 30, "the sidecar to lead the partition")
            produce_segments(kafka, topic_name, 1, 20, segment_ms=300)
            assert rsm.held.wait(60), "no copy started"
            produce_segments(kafka, topic_name, 2, 20, segment_ms=300)
            led = sidecar.leadership.get(topic_name, 0)
            assert led is not None
            wait_for(lambda: len(led.copier.deferred_bases()) >= 2, 30, "the rolled segments to wait unstaged")
            assert sidecar.staging.staged(tp) == []
            set_topic_config(kafka, topic_name, file_delete_delay_ms="1000")
            rolled = sorted(int(p.name[:20]) for p in led.path.glob("*.log"))[:-1]
            wait_for(lambda: [s.base_offset for s in sidecar.staging.staged(tp)] == rolled, 20,
                     "the waiting segments to be staged", detail=lambda: copy_state(sidecar, tp))
            assert led.copier.defer_staging_s is None
        finally:
            rsm.release.set()
