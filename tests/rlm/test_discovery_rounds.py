"""Discovery without a broker: the classification of a round (:func:`rlm.discovery.classify`) over temporary log
dirs and made-up cluster answers, the leadership registry's bookkeeping (:mod:`rlm.tasks.leadership`), and whole
discovery rounds of a sidecar whose cluster is a fake view and whose metadata manager is the in-memory one
(:mod:`rlmm.memory`), failing when told of leadership changes."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from rlm.discovery import Skip, classify, scan_log_dirs
from rlm.tasks.leadership import Leadership, LeadershipChangeError, copy_job_id
from rlmm.api import RemoteLogMetadataError, TopicIdPartition
from rlmm.memory import InMemoryRemoteLogMetadataManager
from tests.support.discovery import BROKER, FakeView, fake_partition_dir, offline_settings, partition_info


# ---------------------------------------------------------------------------------------------- classify
def test_classify_splits_leaders_followers_and_says_why_the_rest_is_skipped(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    ids = {t: uuid.uuid4() for t in ("led", "followed", "gone", "compacted", "unknown", "unlisted", "fresh",
                                     "recreated")}
    paths = {t: fake_partition_dir(logs, t, 0, None if t == "fresh" else ids[t]) for t in ids}
    paths["led-1"] = fake_partition_dir(logs, "led", 1, ids["led"])  # two partitions of one topic, one led here
    cluster = {(t, 0): partition_info(t, ids[t], 0, BROKER if t == "led" else 2) for t in ids if t != "gone"}
    cluster[("led", 1)] = partition_info("led", ids["led"], 1, 3)
    cluster[("recreated", 0)] = partition_info("recreated", uuid.uuid4(), 0, BROKER)  # the directory is the old topic's
    compaction: dict[str, bool | None] = {t: False for t in ids}
    compaction |= {"compacted": True, "unknown": None}
    del compaction["unlisted"]  # its DescribeConfigs went unanswered: not even in the answer

    found = classify(scan_log_dirs([logs]), cluster, compaction, BROKER)

    assert found.leaders == {TopicIdPartition(ids["led"], "led", 0): paths["led"]}
    assert found.followers == {TopicIdPartition(ids["led"], "led", 1), TopicIdPartition(ids["followed"], "followed", 0)}
    assert found.skipped == {("gone", 0): Skip.NOT_DESCRIBED, ("compacted", 0): Skip.COMPACTED,
                             ("unknown", 0): Skip.CONFIG_UNKNOWN, ("unlisted", 0): Skip.CONFIG_UNKNOWN,
                             ("fresh", 0): Skip.NO_PARTITION_METADATA, ("recreated", 0): Skip.OTHER_TOPIC_ID}


def test_classify_skips_an_unreadable_partition_metadata(tmp_path: Path) -> None:
    tid = uuid.uuid4()
    path = fake_partition_dir(tmp_path, "t", 0, tid)
    (path / "partition.metadata").write_text("version: 0\ntopic_id: not-an-id\n")
    found = classify(scan_log_dirs([tmp_path]), {("t", 0): partition_info("t", tid, 0, BROKER)}, {"t": False}, BROKER)
    assert (found.leaders, found.followers, found.skipped) == ({}, set(), {("t", 0): Skip.NO_PARTITION_METADATA})


def test_classify_of_nothing_is_nothing() -> None:
    found = classify({}, {}, {}, BROKER)
    assert (found.leaders, found.followers, found.skipped) == ({}, set(), {})


# ---------------------------------------------------------------------------------------- the registry
class RecordingScheduler:
    def __init__(self) -> None:
        self.jobs: dict[str, Any] = {}

    def add_job(self, func: Any, trigger: str, **kwargs: Any) -> object:
        self.jobs[kwargs["id"]] = kwargs
        return kwargs

    def remove_job(self, job_id: str) -> None:
        del self.jobs[job_id]

    def pause_job(self, job_id: str) -> object:
        self.jobs[job_id]["next_run_time"] = None
        return self.jobs[job_id]

    def modify_job(self, job_id: str, **changes: Any) -> object:
        self.jobs[job_id].update(changes)
        return self.jobs[job_id]


class FlakyRlmm(InMemoryRemoteLogMetadataManager):
    """The in-memory metadata manager, whose ``on_partition_leadership_changes`` raises ``failures`` times first."""

    def __init__(self, failures: int = 0) -> None:
        super().__init__()
        self.failures = failures
        self.calls = 0

    def on_partition_leadership_changes(self, leaders: Iterable[TopicIdPartition],
                                        followers: Iterable[TopicIdPartition]) -> None:
        self.calls += 1
        if self.failures:
            self.failures -= 1
            raise RemoteLogMetadataError("metadata partition 2: end offset not readable (broker restarting)")
        super().on_partition_leadership_changes(leaders, followers)


def test_the_registry_changes_nothing_when_the_metadata_manager_fails(tmp_path: Path) -> None:
    from rlm.tasks.staging import Staging

    settings = offline_settings(tmp_path)
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    path = fake_partition_dir(tmp_path / "logs", "t", 0, tp.topic_id)
    scheduler = RecordingScheduler()
    rlmm = FlakyRlmm(failures=1)
    leadership = Leadership(settings, scheduler, rlmm=rlmm, rsm=None,  # type: ignore[arg-type]
                            staging=Staging({tmp_path / "logs": tmp_path / "staging"}), deleter=object(),  # type: ignore[arg-type]
                            run=lambda led: None)
    with pytest.raises(LeadershipChangeError, match="not readable"):
        leadership.serve({tp: path}, set())
    assert leadership.counts() == (0, 0) and scheduler.jobs == {}

    assert leadership.serve({tp: path}, set())
    assert leadership.counts() == (1, 0) and list(scheduler.jobs) == [copy_job_id(tp)]
    assert leadership.get("t", 0) is not None and rlmm.is_ready(tp)

    from rlm import metrics

    metrics.COPY_LAG_BYTES.labels("t", "0").set(123)  # as its copy runs report it while it is led
    metrics.COPY_LAG_SEGMENTS.labels("t", "0").set(2)
    assert leadership.serve({}, {tp})  # leadership moved: followed, its copy job gone
    assert leadership.counts() == (0, 1) and scheduler.jobs == {} and leadership.get("t", 0) is None
    # ... and its copy-lag gauges: the new leader's sidecar reports them (kept, per-topic sums counted it twice)
    from prometheus_client import REGISTRY

    assert REGISTRY.get_sample_value("rlm_copy_lag_bytes", {"topic": "t", "partition": "0"}) is None
    assert REGISTRY.get_sample_value("rlm_copy_lag_segments", {"topic": "t", "partition": "0"}) is None

    leadership.stop()
    assert leadership.stopping and not leadership.serve({tp: path}, set())  # no job added once stopping
    assert scheduler.jobs == {} and leadership.counts() == (0, 1)


# ---------------------------------------------------------------------------------------- whole rounds
@pytest.mark.parametrize("mode", ["normal", "read_only"])
def test_a_round_whose_metadata_manager_fails_is_a_failed_round_and_the_next_retries(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, mode: str) -> None:
    import rlm.sidecar
    from rlm.sidecar import Sidecar

    monkeypatch.setattr(rlm.sidecar, "ensure_topic", lambda *a, **k: None)  # no cluster to create the topic on
    led = TopicIdPartition(uuid.uuid4(), "t", 0)
    followed = TopicIdPartition(led.topic_id, "t", 1)
    for tp in (led, followed):
        fake_partition_dir(tmp_path / "logs", tp.topic, tp.partition, tp.topic_id)
    rlmm = FlakyRlmm(failures=1)
    sidecar = Sidecar(offline_settings(tmp_path, mode=mode), rlmm=rlmm)
    sidecar.view = FakeView({("t", 0): partition_info("t", led.topic_id, 0, BROKER),  # type: ignore[assignment]
                             ("t", 1): partition_info("t", led.topic_id, 1, 2)})
    round_ = sidecar.discover if mode == "normal" else sidecar.follow
    try:
        with caplog.at_level(logging.WARNING, logger="rlm.sidecar"):
            round_()
        assert rlmm.calls == 1
        assert sidecar.last_error is not None and sidecar.last_error.startswith("discovery: metadata manager: ")
        assert "end offset not readable" in sidecar.last_error
        assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
            "discovery failed: metadata manager"]
        assert sidecar.last_discovery_ok is None and sidecar.last_discovery_attempt is not None
        assert sidecar.leadership.counts() == (0, 0) and not rlmm.is_ready(led)
        ready, body = sidecar.health()
        assert not ready and body["checks"]["broker"]["reason"] == sidecar.last_error  # type: ignore[index]

        round_()  # the next round tells the metadata manager again, and serves
        assert rlmm.calls == 2 and sidecar.last_discovery_ok is not None
        assert rlmm.is_ready(led) and rlmm.is_ready(followed)
        if mode == "normal":
            assert sidecar.leadership.counts() == (1, 1)
            assert sidecar._copy_jobs.get_job(copy_job_id(led)) is not None
        else:  # read-only follows every partition, led here or not, and copies none
            assert sidecar.leadership.counts() == (0, 2)
            assert sidecar._copy_jobs.get_jobs() == []
        assert sidecar.health()[1]["checks"]["broker"]["ok"]  # type: ignore[index]
    finally:
        sidecar.stop(timeout_s=5)


def test_staging_a_partition_whose_directory_is_gone_is_no_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """A led partition's directory deleted with its topic (seen in the chaos run, three times in 8 minutes): the
    stage job says so at INFO and leaves /health's last error alone; the next round stops leading it."""
    import shutil

    import rlm.sidecar
    from rlm.sidecar import Sidecar

    monkeypatch.setattr(rlm.sidecar, "ensure_topic", lambda *a, **k: None)  # no cluster to create the topic on
    led = TopicIdPartition(uuid.uuid4(), "t", 0)
    pdir = fake_partition_dir(tmp_path / "logs", led.topic, led.partition, led.topic_id)
    sidecar = Sidecar(offline_settings(tmp_path), rlmm=InMemoryRemoteLogMetadataManager())
    sidecar.view = FakeView({("t", 0): partition_info("t", led.topic_id, 0, BROKER)})  # type: ignore[assignment]
    try:
        sidecar.discover()
        assert sidecar.leadership.counts() == (1, 0)
        sidecar.leadership.get("t", 0).copier._highest = -1  # as after its first copy run: staging looks at the dir
        shutil.rmtree(pdir)
        with caplog.at_level(logging.INFO, logger="rlm.sidecar"):
            sidecar.stage()
        assert sidecar.last_error is None
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING], [r.getMessage() for r in caplog.records]
        assert "staging skipped: the partition's directory is gone" in [r.getMessage() for r in caplog.records]
    finally:
        sidecar.stop(timeout_s=5)


def test_expiration_never_reads_another_incarnations_lineage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """A led partition whose directory now belongs to the topic's next incarnation (deleted and re-created under its
    name, seen in an 8-minute chaos run): expiration skips it at INFO. Before, it merged the new incarnation's
    leader-epoch checkpoint into the old partition's lineage, found every segment outside the remote chain and
    logged a WARNING for each (61 in that run)."""
    import base64

    import rlm.sidecar
    from rlm.sidecar import Sidecar
    from rlmm.api import RemoteLogSegmentState
    from tests.rlmm.helpers import segment, update

    monkeypatch.setattr(rlm.sidecar, "ensure_topic", lambda *a, **k: None)  # no cluster to create the topic on
    led = TopicIdPartition(uuid.uuid4(), "t", 0)
    pdir = fake_partition_dir(tmp_path / "logs", led.topic, led.partition, led.topic_id)
    (pdir / "leader-epoch-checkpoint").write_text("0\n1\n0 0\n")
    rlmm = InMemoryRemoteLogMetadataManager(serve_all=True)
    segs = [segment(led, 0, 9), segment(led, 10, 19)]
    for md in segs:
        rlmm.add_remote_log_segment_metadata(md)
        rlmm.update_remote_log_segment_metadata(update(md, RemoteLogSegmentState.COPY_SEGMENT_FINISHED))
    sidecar = Sidecar(offline_settings(tmp_path), rlmm=rlmm)
    sidecar.view = FakeView({("t", 0): partition_info("t", led.topic_id, 0, BROKER)})  # type: ignore[assignment]
    monkeypatch.setattr(sidecar, "_leader_epoch", lambda _led: (20, 0))  # leading under the checkpoint's epoch
    try:
        sidecar.discover()
        assert sidecar.leadership.counts() == (1, 0)
        # The topic is deleted and re-created: the directory is the new incarnation's, its lineage starts anew.
        new_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        (pdir / "partition.metadata").write_text(f"version: 0\ntopic_id: {new_id}\n")
        (pdir / "leader-epoch-checkpoint").write_text("0\n2\n0 0\n7 5\n")  # its epoch 7 from offset 5
        with caplog.at_level(logging.INFO, logger="rlm"):
            sidecar.expire()
        ours = [r for r in caplog.records if r.name.startswith(("rlm.sidecar", "rlm.tasks"))]  # not librdkafka's
        assert not [r for r in ours if r.levelno >= logging.WARNING], [r.getMessage() for r in ours]
        assert "expiration skipped: the partition's directory is not this topic id's" in [r.getMessage() for r in ours]
        finished = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
        assert [m.state for m in rlmm.list_remote_log_segments(led)] == [finished, finished]
        assert sidecar.last_error is None
    finally:
        sidecar.stop(timeout_s=5)
