"""What an idle sidecar does not do (issue 26), without a broker: a discovery round while nothing changed describes no
topic (cheap rounds, kept correct by the metadata fingerprint, the log-dir watcher's layout and the rescan interval),
and a caught-up copy job sleeps until its partition directory changes (the copy jobs' real scheduler, real inotify)."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlm.discovery import MetadataAnswer, PartitionInfo, TopicLookup
from rlm.tasks.dispatch import CopyJobs
from rlm.tasks.leadership import Leadership, Led, copy_job_id
from rlm.tasks.staging import Staging
from rlmm.api import TopicIdPartition
from rlmm.memory import InMemoryRemoteLogMetadataManager
from tests.support.discovery import BROKER, FakeView, fake_partition_dir, offline_settings, partition_info


class CountingView(FakeView):
    """The fake cluster, counting the calls a full round makes."""

    def __init__(self, infos: dict[tuple[str, int], PartitionInfo]) -> None:
        super().__init__(infos)
        self.described = 0
        self.configs_read = 0
        self.missing: set[str] = set()  # topics deleted on the cluster

    def partitions(self, topics: Iterable[str] | None = None, *,
                   skip_unauthorized: bool = False) -> dict[tuple[str, int], PartitionInfo]:
        self.described += 1
        return {k: v for k, v in super().partitions(topics).items() if k[0] not in self.missing}

    def topic_configs(self, topics: Iterable[str]) -> dict[str, dict[str, str | None] | None]:
        self.configs_read += 1
        return super().topic_configs(topics)

    def topic_ids(self, topics: Iterable[str]) -> dict[str, TopicLookup]:
        from confluent_kafka import KafkaError

        ids = {info.topic: info.topic_id for info in self.infos.values()}
        return {t: TopicLookup(t, error_code=KafkaError.UNKNOWN_TOPIC_OR_PART) if t in self.missing
                else TopicLookup(t, topic_id=ids[t]) for t in topics}

    def metadata(self, topics: Iterable[str]) -> MetadataAnswer:
        return super().metadata(set(topics) - self.missing)


class LaggingView(CountingView):
    """The fake cluster, its DescribeTopics answered by a broker behind the one answering Metadata: ``lagging``,
    when set, is what that broker still says of the partitions."""

    def __init__(self, infos: dict[tuple[str, int], PartitionInfo]) -> None:
        super().__init__(infos)
        self.lagging: dict[tuple[str, int], PartitionInfo] | None = None

    def partitions(self, topics: Iterable[str] | None = None, *,
                   skip_unauthorized: bool = False) -> dict[tuple[str, int], PartitionInfo]:
        if self.lagging is None:
            return super().partitions(topics)
        fresh, self.infos = self.infos, self.lagging
        try:
            return super().partitions(topics)
        finally:
            self.infos = fresh


@pytest.fixture
def sidecar_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    import rlm.sidecar
    from rlm.sidecar import Sidecar

    monkeypatch.setattr(rlm.sidecar, "ensure_topic", lambda *a, **k: None)  # no cluster to create the topic on
    made: list[Sidecar] = []

    def make(view: FakeView, **overrides: Any) -> Sidecar:
        sidecar = Sidecar(offline_settings(tmp_path, **overrides), rlmm=InMemoryRemoteLogMetadataManager())
        sidecar.view = view  # type: ignore[assignment]
        made.append(sidecar)
        return sidecar

    yield make
    for sidecar in made:
        sidecar.stop(timeout_s=5)


def test_rounds_describe_topics_only_when_something_changed(tmp_path: Path, sidecar_of) -> None:  # noqa: ANN001
    tid = uuid.uuid4()
    logs = tmp_path / "logs"
    fake_partition_dir(logs, "t", 0, tid)
    view = CountingView({("t", 0): partition_info("t", tid, 0, BROKER), ("t", 1): partition_info("t", tid, 1, BROKER)})
    sidecar = sidecar_of(view)
    sidecar.discover()
    assert (view.described, view.configs_read, sidecar.full_rounds) == (1, 1, 1)
    assert sidecar.leadership.counts() == (1, 0)
    for _ in range(3):
        sidecar.discover()
    assert (view.described, view.configs_read, sidecar.full_rounds) == (1, 1, 1)  # nothing changed: cheap rounds
    assert sidecar.last_discovery_ok is not None and sidecar.leadership.counts() == (1, 0)

    # leadership moved: the metadata answer differs, the round is full and follows the partition
    view.infos[("t", 0)] = partition_info("t", tid, 0, 2)
    sidecar.discover()
    assert view.described == 2 and sidecar.leadership.counts() == (0, 1)
    sidecar.discover()
    assert view.described == 2

    # a partition directory appears (the broker got a replica; the cluster's answer had it already): full round
    fake_partition_dir(logs, "t", 1, tid)
    sidecar.discover()
    assert view.described == 3 and sidecar.leadership.counts() == (1, 1)
    sidecar.discover()
    assert view.described == 3


def test_a_full_round_whose_answers_disagree_on_leaders_is_followed_by_another(tmp_path: Path,
                                                                                sidecar_of) -> None:  # noqa: ANN001
    """Each broker answers from its own copy of the cluster's metadata: a round's Metadata request (its fingerprint)
    may reach a broker already past a leader election and its DescribeTopics one that is not yet. That round acts on
    the old leader; its fingerprint is the new one's. Were the next rounds cheap (the same fingerprint), they would keep
    the old answer until the rescan (60 s by default): the new leader's sidecar not leading, with no error."""
    tid = uuid.uuid4()
    fake_partition_dir(tmp_path / "logs", "t", 0, tid)
    view = LaggingView({("t", 0): partition_info("t", tid, 0, 2)})
    sidecar = sidecar_of(view)
    sidecar.discover()
    assert sidecar.leadership.counts() == (0, 1) and sidecar.disagreeing_rounds == 0

    # elected here: the broker answering Metadata knows, the one answering DescribeTopics not yet
    view.lagging = dict(view.infos)
    view.infos[("t", 0)] = partition_info("t", tid, 0, BROKER)
    sidecar.discover()
    assert view.described == 2 and sidecar.leadership.counts() == (0, 1)  # acted on the old leader this round

    # the lagging broker caught up: the next round is full again (not a cheap one keeping the old answer)
    view.lagging = None
    sidecar.discover()
    assert view.described == 3 and sidecar.leadership.counts() == (1, 0)
    assert sidecar.disagreeing_rounds == 1  # the second round's, not the third's
    sidecar.discover()
    assert view.described == 3  # the answers agree again: cheap rounds


def test_a_full_round_every_rescan_interval_and_while_a_deletion_is_being_proven(
        tmp_path: Path, sidecar_of) -> None:  # noqa: ANN001
    tid, gone_id = uuid.uuid4(), uuid.uuid4()
    logs = tmp_path / "logs"
    fake_partition_dir(logs, "t", 0, tid)
    gone_dir = fake_partition_dir(logs, "gone", 0, gone_id)
    view = CountingView({("t", 0): partition_info("t", tid, 0, BROKER),
                         ("gone", 0): partition_info("gone", gone_id, 0, BROKER)})
    sidecar = sidecar_of(view, tasks={"rescan_interval_ms": 1000, "purge_grace_ms": 0, "purge_rounds": 3})
    sidecar.discover()
    sidecar.discover()
    assert view.described == 1
    time.sleep(1.05)
    sidecar.discover()  # the last full round is older than rescan_interval_ms: a config change would show now
    assert view.described == 2

    # a topic deleted: it leaves the metadata answer (full round), and while its deletion is being proven over
    # purge_rounds rounds every round is full, until the purge
    import shutil

    view.missing.add("gone")
    shutil.rmtree(gone_dir)
    sidecar.discover()
    assert view.described == 3 and sidecar.deletions.pending()
    sidecar.discover()
    sidecar.discover()
    assert view.described == 5
    assert TopicIdPartition(gone_id, "gone", 0) not in sidecar.known.all()  # purged and forgotten
    sidecar.discover()  # its evidence is dropped by the next full round
    assert view.described == 6 and not sidecar.deletions.pending()
    sidecar.discover()
    assert view.described == 6


def test_the_partitions_served_are_remembered_by_full_rounds_and_again_after_a_failed_save(
        tmp_path: Path, sidecar_of, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """A cheap round serves the last full round's answer, which that round remembered (the known-partitions file):
    it does not hash every partition again. A full round whose save failed leaves the next round full, so what it
    served is remembered then (a partition never remembered is never purged when its topic is deleted)."""
    tid = uuid.uuid4()
    fake_partition_dir(tmp_path / "logs", "t", 0, tid)
    view = CountingView({("t", 0): partition_info("t", tid, 0, BROKER)})
    sidecar = sidecar_of(view)
    added: list[int] = []
    add = sidecar.known.add

    def counted(tps: Iterable[TopicIdPartition]) -> None:
        tps = list(tps)
        added.append(len(tps))
        if fail:
            raise OSError("disk full")
        add(tps)

    fail = True
    monkeypatch.setattr(sidecar.known, "add", counted)
    with pytest.raises(OSError):
        sidecar.discover()
    assert added == [1] and sidecar.known.all() == []
    fail = False
    sidecar.discover()  # full again: the failed round's answer was not remembered
    assert view.described == 2 and added == [1, 1]
    assert sidecar.known.all() == [TopicIdPartition(tid, "t", 0)]
    for _ in range(3):
        sidecar.discover()
    assert view.described == 2 and added == [1, 1]  # cheap rounds: nothing added again


# ------------------------------------------------------------------------------------ sleeping copy jobs
@contextlib.contextmanager
def led_partition(tmp_path: Path, run: Any, interval_ms: int = 100,
                  ) -> Iterator[tuple[Leadership, CopyJobs, TopicIdPartition, Path]]:
    """One partition led by a registry on the sidecar's (started) copy job scheduler, whose copy run is
    ``run(led, leadership)``."""
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    path = fake_partition_dir(tmp_path / "logs", "t", 0, tp.topic_id)
    scheduler = CopyJobs(4).start()
    settings = offline_settings(tmp_path, tasks={"copy_interval_ms": interval_ms, "copy_settle_ms": 0})  # (a wake: now)
    leadership = Leadership(settings, scheduler, rlmm=InMemoryRemoteLogMetadataManager(), rsm=None,  # type: ignore[arg-type]
                            staging=Staging({tmp_path / "logs": tmp_path / "staging"}),
                            deleter=object(), run=lambda led: run(led, leadership))  # type: ignore[arg-type]
    try:
        assert leadership.serve({tp: path}, set())
        yield leadership, scheduler, tp, path
    finally:
        leadership.stop()
        scheduler.shutdown()


def _wait(cond: Any, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_caught_up_copy_job_sleeps_until_its_directory_changes(tmp_path: Path) -> None:
    runs: list[Led] = []
    with led_partition(tmp_path, lambda led, _l: runs.append(led) or True) as (leadership, scheduler, tp, path):
        _wait(lambda: leadership.sleeping() == 1)
        time.sleep(0.5)  # five copy intervals
        assert len(runs) == 1 and scheduler.get_job(copy_job_id(tp)).next_run_time is None
        assert leadership.wake({tmp_path / "logs" / "other-0"}) == []
        woken = leadership.wake({path})
        assert [led.tp for led in woken] == [tp]
        _wait(lambda: len(runs) == 2 and leadership.sleeping() == 1)
        time.sleep(0.3)
        assert len(runs) == 2


def test_wake_finds_the_partition_led_now_at_a_directory(tmp_path: Path) -> None:
    """The registry finds a woken directory's partition by its path (not a walk of every led one): the topic
    re-created under its name leads a new partition at the same directory, which a wake finds (not the old one), and
    a directory no longer led wakes nothing."""
    with led_partition(tmp_path, lambda led, _l: True) as (leadership, _s, tp, path):
        old = leadership.get(tp.topic, tp.partition)
        again = TopicIdPartition(uuid.uuid4(), tp.topic, tp.partition)
        assert leadership.serve({again: path}, set())
        new = leadership.get(tp.topic, tp.partition)
        assert new is not None and new is not old and new.tp == again
        assert leadership.wake([path, path]) == [new]  # (a path given twice wakes its partition once)
        assert leadership.serve({}, {again})
        assert leadership.wake({path}) == []


def _waking_run(runs: list[int], wake_in_runs: int) -> Any:
    """A copy run that thinks it caught up, during whose first ``wake_in_runs`` runs the directory changes (the stage
    job wakes the partition while the run goes)."""
    def run(led: Led, leadership: Leadership) -> bool:
        runs.append(1)
        if len(runs) <= wake_in_runs:
            leadership.wake({led.path})
        return True
    return run


def test_a_change_seen_during_a_run_makes_it_look_again_at_once(tmp_path: Path) -> None:
    """The directory changed while the run went (its listing may have missed the roll): the job does not sleep but
    runs again at once (not at its interval: an hour here), then sleeps."""
    runs: list[int] = []
    with led_partition(tmp_path, _waking_run(runs, 1), interval_ms=3_600_000) as (leadership, _s, _tp, _path):
        _wait(lambda: leadership.sleeping() == 1)
        time.sleep(0.3)
        assert len(runs) == 2


def test_a_roll_during_every_run_reruns_a_bounded_number_of_times(tmp_path: Path) -> None:
    """A partition whose directory changes during every run: RERUNS_ON_CHANGE runs again at once, then its interval
    (it does not hold a worker for good)."""
    from rlm.tasks.leadership import RERUNS_ON_CHANGE

    runs: list[int] = []
    with led_partition(tmp_path, _waking_run(runs, 1_000), interval_ms=3_600_000) as (leadership, _s, _tp, _path):
        _wait(lambda: len(runs) >= RERUNS_ON_CHANGE + 1)
        time.sleep(0.3)
        assert len(runs) == RERUNS_ON_CHANGE + 1 and leadership.sleeping() == 0


def test_a_run_that_did_not_catch_up_keeps_its_interval_and_stopping_wakes_nothing(tmp_path: Path) -> None:
    runs = threading.Semaphore(0)
    with led_partition(tmp_path, lambda led, _l: runs.release() and False) as (leadership, _s, _tp, path):
        for _ in range(3):  # waiting for the LSO, a failed copy ...: it runs every interval
            assert runs.acquire(timeout=5)
        assert leadership.sleeping() == 0
        leadership.stop()
        assert leadership.wake({path}) == []


def test_the_stage_job_wakes_the_led_partition_whose_directory_changed(tmp_path: Path, sidecar_of) -> None:  # noqa: ANN001
    """End to end without a broker: the sidecar's watcher sees a segment created in a led partition's directory, and
    the stage job wakes that partition's sleeping copy job (its next run now), not the other one's."""
    tid = uuid.uuid4()
    logs = tmp_path / "logs"
    dirs = [fake_partition_dir(logs, "t", p, tid) for p in (0, 1)]
    view = CountingView({("t", p): partition_info("t", tid, p, BROKER) for p in (0, 1)})
    sidecar = sidecar_of(view, tasks={"copy_interval_ms": 3_600_000})
    sidecar.discover()
    sidecar.stage()  # the watcher's first look: every directory
    for led in sidecar.leadership.each_led():
        assert led.changed.is_set() and not sidecar.leadership.sleep(led)  # changed: a run must look first
        led.changed.clear()  # as a run does when it begins ...
        assert sidecar.leadership.sleep(led)  # ... and, finding it caught up, sleeps
    assert sidecar.leadership.sleeping() == 2
    (dirs[1] / f"{0:020d}.log").touch()  # a roll
    sidecar.stage()
    led1 = sidecar.leadership.get("t", 1)
    assert led1 is not None and not led1.asleep and led1.changed.is_set()
    assert sidecar.leadership.sleeping() == 1 and sidecar.leadership.get("t", 0).asleep  # type: ignore[union-attr]


def test_the_gauges_list_no_directory_of_a_partition_without_local_retention(tmp_path: Path, sidecar_of,  # noqa: ANN001
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A topic whose local retention deletes nothing (``retention.ms`` and ``retention.bytes`` -1) has nothing at
    risk: its margin is infinite without listing its directory or walking the staging area every 5 s (in a burst,
    every led directory changed between two refreshes: listed each time, issue 26). A topic with a retention is
    listed."""
    import math

    from rlm.health import MarginCache

    tid, kept_tid = uuid.uuid4(), uuid.uuid4()
    logs = tmp_path / "logs"
    fake_partition_dir(logs, "t", 0, tid)
    fake_partition_dir(logs, "kept", 0, kept_tid)
    view = CountingView({("t", 0): partition_info("t", tid, 0, BROKER),
                         ("kept", 0): partition_info("kept", kept_tid, 0, BROKER)})
    configs = view.topic_configs
    view.topic_configs = lambda topics: {t: c if t != "kept" else {**(c or {}), "retention.ms": "60000"}  # type: ignore[method-assign]
                                         for t, c in configs(topics).items()}
    sidecar = sidecar_of(view)
    sidecar.discover()
    listed: list[Path] = []
    real = MarginCache.margin
    monkeypatch.setattr(MarginCache, "margin", lambda self, path, *a, **k: listed.append(path) or real(
        self, path, *a, **k))
    sidecar._refresh_gauges()
    assert listed == [logs / "kept-0"]
    by_topic = {tp.topic: m for tp, m in sidecar.margins.items()}
    assert (by_topic["t"].seconds, by_topic["t"].bytes) == (math.inf, math.inf)
    assert set(by_topic) == {"t", "kept"}


@pytest.mark.kafka
def test_a_sleeping_copy_job_copies_a_roll_within_seconds(kafka, topic_name: str, tmp_path: Path) -> None:  # noqa: ANN001
    """Against the real broker: with a copy interval of an hour, a partition's copy job runs once when led, finds it
    caught up and sleeps; a roll the broker makes later is seen by the watcher and copied within seconds (before, a
    roll waited for the next copy interval: an hour here)."""
    from rlm.sidecar import Sidecar
    from tests.support.kafka import produce, roll_and_wait
    from tests.support.sidecar import make_settings, only, wait_for

    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "200"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name),
                             tasks={"copy_interval_ms": 3_600_000, "discovery_interval_ms": 300})
    with Sidecar(settings) as sidecar:
        wait_for(lambda: sidecar.leadership.sleeping() == 1, 60, "the copy job to find the partition caught up")
        produce(kafka, topic_name, [(b"k", b"v" * 100)] * 50)
        roll_and_wait(kafka, topic_name, rolled=1)
        wait_for(lambda: sidecar.reader.latest_offset(tp) is not None, 30, "the rolled segment to be remote")
        assert sidecar.reader.latest_offset(tp) >= 49
        wait_for(lambda: sidecar.leadership.sleeping() == 1, 30, "the job to sleep again once caught up")


def test_the_stage_job_stages_a_roll_from_the_watchers_listing(tmp_path: Path, sidecar_of,  # noqa: ANN001
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage job lists a changed partition directory once: the watcher lists it as it reads the events
    (:attr:`rlm.watch.Changes.listings`), and the stage job stages the roll from that listing, not a second one of
    its own (issue 26: 2,000 partitions rolling at once, each listed twice per stage round)."""
    import os

    from tests.support.batches import one_per_batch, write_partition

    tid = uuid.uuid4()
    logs = tmp_path / "logs"
    pdir = fake_partition_dir(logs, "t", 0, tid)
    view = CountingView({("t", 0): partition_info("t", tid, 0, BROKER)})
    sidecar = sidecar_of(view, tasks={"copy_interval_ms": 3_600_000})
    sidecar.discover()
    sidecar.stage()  # the watcher's first look: every directory
    led = sidecar.leadership.get("t", 0)
    assert led is not None
    led.copier._highest = -1  # noqa: SLF001 - as a first copy run that found nothing remote leaves it
    write_partition(pdir, tid, {0: one_per_batch(0, 5, b"a"), 5: one_per_batch(5, 1, b"b")})  # [0,4] rolled
    looked: list[str] = []
    inner = os.listdir

    def listdir(path="."):  # type: ignore[no-untyped-def]  # noqa: ANN001, ANN202
        looked.append(str(path))
        return inner(path)

    monkeypatch.setattr(os, "listdir", listdir)
    sidecar.stage()
    assert [(s.base_offset, s.end_offset_inclusive) for s in sidecar.staging.staged(led.tp)] == [(0, 4)]
    assert looked.count(str(pdir)) == 1


def test_full_rounds_read_a_partitions_metadata_file_only_when_it_changed(tmp_path: Path, sidecar_of,  # noqa: ANN001
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Every full round checks each partition directory's topic id, reading ``partition.metadata`` only when its
    stat changed (issue 26: 2,000 files read and parsed per full round); a directory whose file now names another
    topic id (the topic deleted and re-created) is skipped as before."""
    from tests.support.batches import partition_metadata_reads, write_partition_metadata

    reads = partition_metadata_reads(monkeypatch)
    tid = uuid.uuid4()
    logs = tmp_path / "logs"
    dirs = [fake_partition_dir(logs, "t", p, tid) for p in (0, 1)]
    view = CountingView({("t", p): partition_info("t", tid, p, BROKER) for p in (0, 1)})
    sidecar = sidecar_of(view)
    sidecar.discover()
    assert len(reads) == 2 and len(list(sidecar.leadership.each_led())) == 2
    sidecar._last_full = None  # noqa: SLF001 - the next round is a full one (as at the rescan interval)
    sidecar.discover()
    assert sidecar.full_rounds == 2 and len(reads) == 2  # nothing changed: no file read
    write_partition_metadata(dirs[1], uuid.uuid4())  # another topic id than the cluster's
    sidecar._last_full = None  # noqa: SLF001
    assert sidecar._discovery_round()[0].keys() == {TopicIdPartition(tid, "t", 0)}  # noqa: SLF001
    assert reads == [*reads[:2], dirs[1] / "partition.metadata"]
