from __future__ import annotations

import base64
import logging
import os
import uuid
from pathlib import Path

import pytest

from rlm.config import ConfigError, load_settings
from rlm.known import KnownPartitions
from rlm.tasks.staging import (
    SegmentGoneError,
    Staging,
    StagingError,
    StagingFullError,
    TopicIdMismatchError,
    default_staging_root,
)
from rlmm.api import TopicIdPartition


def make_segment(pdir: Path, base: int, with_txn: bool = False, tag: bytes = b"L") -> dict[str, bytes]:
    pdir.mkdir(parents=True, exist_ok=True)
    files = {".log": tag * 100 + base.to_bytes(8, "big"), ".index": b"I" * 16, ".timeindex": b"T" * 24}
    if with_txn:
        files[".txnindex"] = b"X" * 34
    for suffix, data in files.items():
        (pdir / f"{base:020d}{suffix}").write_bytes(data)
    return files


def write_topic_id(pdir: Path, tid: uuid.UUID) -> None:
    pdir.mkdir(parents=True, exist_ok=True)
    b64 = base64.urlsafe_b64encode(tid.bytes).decode().rstrip("=")
    (pdir / "partition.metadata").write_text(f"version: 0\ntopic_id: {b64}\n")


def tp_of(topic: str = "t", partition: int = 0) -> TopicIdPartition:
    return TopicIdPartition(uuid.uuid4(), topic, partition)


def test_stage_survives_broker_delete(tmp_path: Path) -> None:
    log_dir = tmp_path / "kafka" / "data"
    pdir = log_dir / "my.topic-x-3"
    files = make_segment(pdir, 42, with_txn=True)
    tp = tp_of("my.topic-x", 3)
    staging = Staging({log_dir: default_staging_root(log_dir)})
    staged = staging.stage(tp, pdir, 42, 99)
    assert staging.stage(tp, pdir, 42, 99) == staged  # idempotent
    assert staged.tp == tp and (staged.topic, staged.partition) == ("my.topic-x", 3)
    # keyed by topic id: <root>/<topic id>/<topic>-<partition>/, the partition's segments side by side in it
    assert staged.directory == default_staging_root(log_dir) / str(tp.topic_id) / "my.topic-x-3"
    assert sorted(p.name for p in staged.directory.iterdir()) == [f"{42:020d}{x}" for x in (
        ".complete-99.itx", ".index", ".log", ".timeindex", ".txnindex")]  # the marker names the files staged
    for p in pdir.iterdir():  # the broker's retention removes the segment
        p.unlink()
    for suffix, data in files.items():
        assert staged.file(suffix).read_bytes() == data
    assert staged.file(".snapshot") is None
    assert staging.staged(tp) == staging.staged() == [staged] and staged.end_offset_inclusive == 99
    assert staging.stage(tp, pdir, 42, 99) == staged  # the broker deleted it: ours is the copy to keep
    assert staging.size_bytes() == sum(len(d) for d in files.values()) == staging.held_bytes()
    staging.release(staged)
    assert staging.staged() == [] and staging.size_bytes() == 0 and staging.held_bytes() == 0
    # the partition's dir stays for its next segment (made again per segment, it cost a mkdir and an fsync)
    root = default_staging_root(log_dir)
    assert [p.relative_to(root) for p in root.rglob("*")] == [Path(str(tp.topic_id)),
                                                              Path(str(tp.topic_id)) / "my.topic-x-3"]
    assert staging.release_partition(tp) == 0
    assert list(root.iterdir()) == []  # the partition's release removes its dir, and the topic id's once empty


def test_stage_links_renamed_deleted_files(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    pdir = log_dir / "t-0"
    files = make_segment(pdir, 7)
    for p in list(pdir.iterdir()):
        p.rename(p.with_name(p.name + ".deleted"))  # what the broker does before unlinking
    staged = Staging({log_dir: tmp_path / "stage"}).stage(tp_of(), pdir, 7, 8)
    assert staged.log_path.read_bytes() == files[".log"]


def test_producer_snapshot_is_the_next_segments(tmp_path: Path) -> None:
    """Kafka uploads fetchSnapshot(nextSegmentBaseOffset): the producer state at the end of the segment."""
    log_dir = tmp_path / "data"
    pdir = log_dir / "t-0"
    make_segment(pdir, 100)
    (pdir / f"{100:020d}.snapshot").write_bytes(b"state at 100")  # before the segment: not the one to upload
    staging = Staging({log_dir: tmp_path / "stage"})
    tp = tp_of()
    staged = staging.stage(tp, pdir, 100, 249)
    assert staged.file(".snapshot") is None  # the roll's snapshot is not written yet
    (pdir / f"{250:020d}.snapshot").write_bytes(b"state at 250")
    staged = staging.stage(tp, pdir, 100, 249)  # seen again: the late snapshot is linked too
    assert staged.file(".snapshot") == staged.producer_snapshot_path == staged.directory / f"{250:020d}.snapshot"
    assert staged.file(".snapshot").read_bytes() == b"state at 250"
    assert not (staged.directory / f"{100:020d}.snapshot").exists()
    # retention renamed the next segment's files, its snapshot included, before we saw this segment
    make_segment(pdir, 250)
    (pdir / f"{400:020d}.snapshot.deleted").write_bytes(b"state at 400")
    assert staging.stage(tp, pdir, 250, 399).file(".snapshot").read_bytes() == b"state at 400"


def test_gone_segment_is_an_error_and_leaves_nothing(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    (log_dir / "t-0").mkdir(parents=True)
    staging = Staging({log_dir: tmp_path / "stage"})
    with pytest.raises(SegmentGoneError, match="00000000000000000009.log"):
        staging.stage(tp_of(), log_dir / "t-0", 9, 10)
    assert staging.staged() == [] and list((tmp_path / "stage").iterdir()) == []


def test_staging_inside_log_dir_refused(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    log_dir.mkdir()
    with pytest.raises(StagingError, match="inside log dir"):
        Staging({log_dir: log_dir / ".staging"})


def test_recreated_topic_never_gets_the_old_topics_staged_segments(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    pdir = log_dir / "t-0"
    old, new = tp_of(), tp_of()
    write_topic_id(pdir, old.topic_id)
    old_files = make_segment(pdir, 0, tag=b"O")
    staging = Staging({log_dir: tmp_path / "stage"})
    staging.stage(old, pdir, 0, 4)
    for p in pdir.iterdir():  # the topic is deleted, then re-created under the same name
        p.unlink()
    write_topic_id(pdir, new.topic_id)
    new_files = make_segment(pdir, 0, tag=b"N")
    s = staging.stage(new, pdir, 0, 4)
    assert s.log_path.read_bytes() == new_files[".log"] and s.tp == new
    assert [x.log_path.read_bytes() for x in staging.staged(old)] == [old_files[".log"]]
    assert staging.staged(new) == [s]
    with pytest.raises(TopicIdMismatchError, match=str(new.topic_id)):
        staging.stage(old, pdir, 0, 4)  # a copier still holding the old topic id
    assert staging.topic_ids() == {old.topic_id, new.topic_id}
    assert staging.release_topic(old.topic_id) == 1
    assert staging.staged() == [s] and staging.topic_ids() == {new.topic_id}


def test_staged_dir_reused_only_for_the_same_segment(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    pdir = log_dir / "t-0"
    tp = tp_of()
    make_segment(pdir, 100, tag=b"A")
    staging = Staging({log_dir: tmp_path / "stage"})
    first = staging.stage(tp, pdir, 100, 199)
    ino = first.log_path.stat().st_ino
    # truncated and regrown: the same base rolled at another offset -> restaged with the new end
    s = staging.stage(tp, pdir, 100, 149)
    assert s.end_offset_inclusive == 149 and [x.end_offset_inclusive for x in staging.staged(tp)] == [149]
    # same base and end, but another file (truncated to 100 exactly, a new segment 100 of the new lineage)
    (pdir / f"{100:020d}.log").rename(pdir / f"{100:020d}.log.deleted")
    new_files = make_segment(pdir, 100, tag=b"B")
    assert (pdir / f"{100:020d}.log").stat().st_ino != ino
    s = staging.stage(tp, pdir, 100, 149)
    assert s.log_path.read_bytes() == new_files[".log"] and s.file(".index").read_bytes() == new_files[".index"]
    assert s.log_path.stat().st_ino == (pdir / f"{100:020d}.log").stat().st_ino
    # the same one again: reused as is (no relink)
    assert staging.stage(tp, pdir, 100, 149) == s
    assert s.log_path.stat().st_ino == (pdir / f"{100:020d}.log").stat().st_ino


def legacy_segment(root: Path, tp: TopicIdPartition, pdir: Path, base: int, marker: str, content: bytes = b"") -> Path:
    """A segment dir of the layout before (``<partition's staging dir>/<stem>/``): the segment's files linked into it
    and ``marker`` (``.complete-<end>``, or an older sidecar's ``.complete`` file holding ``content``)."""
    seg = root / str(tp.topic_id) / pdir.name / f"{base:020d}"
    seg.mkdir(parents=True)
    for p in pdir.iterdir():
        if p.name.startswith(f"{base:020d}."):
            os.link(p, seg / p.name)
    if marker.startswith(".complete-"):
        os.link(seg / f"{base:020d}.log", seg / marker)
    else:
        (seg / marker).write_bytes(content)
    return seg


def test_empty_or_unreadable_marker_is_incomplete_never_end_minus_one(tmp_path: Path) -> None:
    """A segment with a broken marker, or two, is incomplete: its files are removed by the next listing (also after
    a restart) and stage() redoes it."""
    log_dir = tmp_path / "data"
    pdir = log_dir / "t-0"
    make_segment(pdir, 0)
    tp = tp_of()
    staging = Staging({log_dir: tmp_path / "stage"})
    stem = f"{0:020d}"
    for bad in (".complete", ".complete-", ".complete--5", ".complete-x", ".complete-12\n", ".complete-98",
                ".complete-99.itt", ".complete-99.q"):
        s = staging.stage(tp, pdir, 0, 99)
        (s.directory / f"{stem}{bad}").write_bytes(b"")  # a second marker (or a broken one beside the good one)
        assert staging.staged() == [], bad  # removed: staged again if still local
        assert list(s.directory.iterdir()) == []
        s = staging.stage(tp, pdir, 0, 99)
        (s.directory / f"{stem}{bad}").write_bytes(b"")
        s = staging.stage(tp, pdir, 0, 99)  # stage() redoes it too
        assert staging.staged() == [s] and s.end_offset_inclusive == 99
        staging.release(s)
        assert list(s.directory.iterdir()) == []
    # after a restart as well; and files of a segment whose marker is gone (a release or a round a crash cut short)
    s = staging.stage(tp, pdir, 0, 99)
    (s.directory / f"{stem}.complete-99.it").unlink()
    assert Staging({log_dir: tmp_path / "stage"}).staged() == [] and list(s.directory.iterdir()) == []
    # a file the marker vouches for is missing (a power cut kept the marker, not that link): incomplete
    s = staging.stage(tp, pdir, 0, 99)
    (s.directory / f"{stem}.timeindex").unlink()
    assert Staging({log_dir: tmp_path / "stage"}).staged() == [] and list(s.directory.iterdir()) == []
    # a marker without letters (this layout's first version) vouches for the .log alone
    s = staging.stage(tp, pdir, 0, 99)
    os.rename(s.directory / f"{stem}.complete-99.it", s.directory / f"{stem}.complete-99")
    (s.directory / f"{stem}.timeindex").unlink()
    restarted = Staging({log_dir: tmp_path / "stage"})
    assert [x.end_offset_inclusive for x in restarted.staged()] == [99]
    restarted.release(restarted.staged()[0])
    assert list(s.directory.iterdir()) == []  # its marker found by name, released with its files
    # the layout before: a segment dir whose older marker file is empty, unreadable or no offset
    for bad_content in (b"", b"\xff\xfe", b"-1", b"garbage", b"--5"):
        seg = legacy_segment(tmp_path / "stage", tp, pdir, 0, ".complete", bad_content)
        assert Staging({log_dir: tmp_path / "stage"}).staged() == [] and not seg.exists()


def _record_fsyncs_and_links(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    events: list[tuple[str, str]] = []
    real_fsync, real_link = os.fsync, os.link

    def fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def link(a, b) -> None:  # noqa: ANN001
        events.append(("link", str(b)))
        real_link(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "link", link)
    return events


def test_marker_written_durably(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The links, then the marker (``<stem>.complete-<end>.<letters>``, a link of the staged .log naming the files it
    vouches for: no inode, no data to fsync), then the directory fsynced; the new dirs fsynced into their parents."""
    log_dir = tmp_path / "data"
    make_segment(log_dir / "t-0", 0)
    staging = Staging({log_dir: tmp_path / "stage"})
    events = _record_fsyncs_and_links(monkeypatch)
    s = staging.stage(tp_of(), log_dir / "t-0", 0, 9)
    d = str(s.directory)
    marker = ("link", f"{d}/{0:020d}.complete-9.it")
    assert events.index(marker) == len(events) - 2 and events[-1] == ("fsync", d)  # the marker last, then fsynced
    assert all(e[0] == "link" for e in events[:events.index(marker)] if e[1].startswith(d + "/"))  # links before
    synced = [p for kind, p in events if kind == "fsync"]
    assert str(s.directory.parent) in synced and str(s.directory.parent.parent) in synced  # the new dirs, once
    assert synced.count(d) == 1
    assert sorted(p.name for p in s.directory.iterdir() if ".complete" in p.name) == [f"{0:020d}.complete-9.it"]
    assert (s.directory / f"{0:020d}.complete-9.it").stat().st_ino == s.log_path.stat().st_ino
    assert staging.size_bytes() == staging.held_bytes() == s.log_path.stat().st_size + 16 + 24  # counted once


def test_a_round_is_one_fsync_and_no_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """stage_many: every segment's files linked, every marker, one fsync of the partition's dir: one fsync for the
    round and no directory made, however many segments (issue 26: a dir per segment cost an inode and three fsyncs
    per segment)."""
    log_dir = tmp_path / "data"
    pdir = log_dir / "t-0"
    for base in (0, 10, 20, 30):
        make_segment(pdir, base)
    tp = tp_of()
    staging = Staging({log_dir: tmp_path / "stage"})
    staging.stage(tp, pdir, 0, 9)  # the partition's dir is made by its first segment
    events = _record_fsyncs_and_links(monkeypatch)
    made: list[str] = []
    real_mkdir = os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda p, *a, **k: (made.append(str(p)), real_mkdir(p, *a, **k))[1])
    done = staging.stage_many(tp, pdir, [(0, 9), (10, 19), (20, 29), (30, 39)])
    assert [s.base_offset for s in done.staged] == [0, 10, 20, 30] and done.gone == [] and done.error is None
    d = str(done.staged[0].directory)
    assert [e for e in events if e[0] == "fsync"] == [("fsync", d)] and events[-1] == ("fsync", d) and made == []
    markers = [e for e in events if ".complete" in e[1]]
    assert markers == [("link", f"{d}/{b:020d}.complete-{b + 9}.it") for b in (10, 20, 30)]  # 0 was staged already
    assert all(".complete" in e[1] for e in events[events.index(markers[0]):-1])  # every file linked before
    assert [s.base_offset for s in staging.staged(tp)] == [0, 10, 20, 30]
    for s in done.staged:
        staging.release(s)
    assert list(Path(d).iterdir()) == []


def test_segment_dirs_of_the_layout_before_are_read_copied_and_released(tmp_path: Path) -> None:
    """A segment dir of the layout before (``<stem>/`` holding ``.complete-<end>``, or an older sidecar's
    ``.complete`` file) is complete after an upgrade: listed, kept by stage() when it is the same segment, released
    whole; a dir with both markers, or a marker name without an offset, is incomplete (removed, staged again, in the
    partition's dir); one that is not the segment is replaced."""
    log_dir = tmp_path / "data"
    pdir = log_dir / "t-0"
    make_segment(pdir, 0)
    make_segment(pdir, 100)
    tp = tp_of()
    root = tmp_path / "stage"
    old = legacy_segment(root, tp, pdir, 0, ".complete", b"99\n")
    (old / ".complete.tmp").write_text("12")  # an older sidecar's marker being written: no marker
    newer = legacy_segment(root, tp, pdir, 100, ".complete-199")
    staging = Staging({log_dir: root})
    assert [(s.base_offset, s.end_offset_inclusive, s.directory) for s in staging.staged()] == [
        (0, 99, old), (100, 199, newer)]
    assert staging.stage(tp, pdir, 0, 99).directory == old  # the same segment: kept where it is
    assert staging.held_bytes() == staging.size_bytes() > 0
    moved = staging.stage(tp, pdir, 100, 149)  # not the same segment (another end): staged anew, flat
    assert moved.directory == old.parent and not newer.exists()
    staging.release(staging.staged(tp)[0])
    assert not old.exists() and [s.base_offset for s in staging.staged(tp)] == [100]
    # two markers, or a marker name without an offset: incomplete
    both = legacy_segment(root, tp, pdir, 0, ".complete", b"99\n")
    os.link(both / f"{0:020d}.log", both / ".complete-99")
    assert [s.base_offset for s in Staging({log_dir: root}).staged(tp)] == [100] and not both.exists()
    nameless = legacy_segment(root, tp, pdir, 0, ".complete-x")
    staging = Staging({log_dir: root})
    assert not nameless.exists() and staging.stage(tp, pdir, 0, 99).directory == nameless.parent


def test_old_layout_removed_at_start(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    log_dir = tmp_path / "data"
    log_dir.mkdir()
    root = tmp_path / "stage"
    old = root / "t-0" / f"{0:020d}"
    old.mkdir(parents=True)
    (old / f"{0:020d}.log").write_bytes(b"old topic's bytes")
    (old / ".complete").write_text("99")
    (root / "README").write_text("not ours")
    with caplog.at_level(logging.WARNING, logger="rlm.tasks.staging"):
        staging = Staging({log_dir: root})
    assert not (root / "t-0").exists() and (root / "README").exists()
    assert staging.staged() == [] and "older layout" in caplog.text


def test_size_bound(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    pdir = log_dir / "t-0"
    seg_bytes = sum(len(d) for d in make_segment(pdir, 0).values())
    for base in (10, 20):
        make_segment(pdir, base)
    tp = tp_of()
    staging = Staging({log_dir: tmp_path / "stage"}, max_bytes=seg_bytes + seg_bytes // 2)
    a = staging.stage(tp, pdir, 0, 9)  # an empty area takes one segment, whatever the bound
    with pytest.raises(StagingFullError, match="staging_max_bytes") as exc:
        staging.stage(tp, pdir, 10, 19)
    assert (exc.value.held_bytes, exc.value.segment_bytes) == (seg_bytes, seg_bytes)
    assert staging.staged(tp) == [a]  # not staged, nothing left behind
    assert staging.stage(tp, pdir, 0, 9) == a  # the same segment again is no new bytes
    staging.release(a)
    b = staging.stage(tp, pdir, 10, 19)
    assert staging.staged(tp) == [b]
    # a restart counts what is held
    with pytest.raises(StagingFullError):
        Staging({log_dir: tmp_path / "stage"}, max_bytes=seg_bytes).stage(tp, pdir, 20, 29)
    assert Staging({log_dir: tmp_path / "stage"}, max_bytes=0).stage(tp, pdir, 20, 29).end_offset_inclusive == 29


def test_release_partition(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    tp0 = tp_of("t", 0)
    tp1 = TopicIdPartition(tp0.topic_id, "t", 1)
    for base in (0, 10):
        make_segment(log_dir / "t-0", base)
        make_segment(log_dir / "t-1", base)
    staging = Staging({log_dir: tmp_path / "stage"}, max_bytes=10**9)
    for tp in (tp0, tp1):
        for base in (0, 10):
            staging.stage(tp, log_dir / f"t-{tp.partition}", base, base + 9)
    assert [s.base_offset for s in staging.staged(tp0)] == [0, 10]
    held = staging.held_bytes()
    assert staging.release_partition(tp0) == 2
    assert staging.staged(tp0) == [] and len(staging.staged(tp1)) == 2 and staging.held_bytes() == held // 2
    assert staging.release_partition(tp1) == 2 and staging.topic_ids() == set()


def test_known_partitions_saved_durably(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    path = tmp_path / "known-partitions.json"
    tp = tp_of()
    KnownPartitions(path).add([tp])
    assert KnownPartitions(path).all() == [tp]
    assert str(tmp_path) in synced and any(p.startswith(str(path)) for p in synced)  # the temp file, the dir
    assert [p.name for p in tmp_path.iterdir()] == [path.name]


def test_staging_max_bytes_setting(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    base = "broker_id: 1\nlog_dirs: [/x]\nkafka: {bootstrap_servers: 'a:1'}\n"
    cfg.write_text(base)
    assert load_settings(cfg).staging_max_bytes == 0
    cfg.write_text(base + "staging_max_bytes: 1073741824\n")
    assert load_settings(cfg).staging_max_bytes == 1 << 30
    cfg.write_text(base + "staging_max_bytes: -1\n")
    with pytest.raises(ConfigError, match="staging_max_bytes"):
        load_settings(cfg)


def test_staged_segment_is_a_partition_dir_segment(tmp_path: Path) -> None:
    log_dir = tmp_path / "kafka" / "data"
    pdir = log_dir / "t-0"
    make_segment(pdir, 42, with_txn=True)
    (pdir / f"{100:020d}.snapshot").write_bytes(b"state at 100")
    staged = Staging({log_dir: default_staging_root(log_dir)}).stage(tp_of(), pdir, 42, 99)
    seg = staged.segment
    assert (seg.base_offset, seg.is_active) == (42, False)
    assert (seg.log_path, seg.offset_index_path, seg.time_index_path, seg.txn_index_path) == (
        staged.log_path, staged.file(".index"), staged.file(".timeindex"), staged.file(".txnindex"))
    assert seg.snapshot_path is None  # <base>.snapshot: the producer snapshot staged is <end + 1>.snapshot
    assert staged.producer_snapshot_path == staged.directory / f"{100:020d}.snapshot"


def test_a_partition_staged_while_another_waits_for_its_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Partitions are staged independently (issue 26): while one partition's first staging waits in an fsync (a
    loaded disk), another partition is staged, listed and released. With one lock for all, a burst's copy runs
    waited for the stage job one fsync at a time. A partition's own listing still waits for its staging in flight
    (it must not take the half-made dir for a crash's leftover and remove it)."""
    import threading

    import rlm.tasks.staging as staging_mod

    log_dir = tmp_path / "data"
    slow, fast = tp_of("t", 0), tp_of("t", 1)
    make_segment(log_dir / "t-0", 0)
    make_segment(log_dir / "t-1", 0)
    staging = Staging({log_dir: tmp_path / "stage"})
    in_fsync, release = threading.Event(), threading.Event()
    real = staging_mod.fsync_dir

    def fsync_dir(path: Path) -> None:
        if "t-0" in str(path):
            in_fsync.set()
            assert release.wait(10)
        real(path)

    monkeypatch.setattr(staging_mod, "fsync_dir", fsync_dir)
    stager = threading.Thread(target=staging.stage, args=(slow, log_dir / "t-0", 0, 9))
    stager.start()
    try:
        assert in_fsync.wait(10)
        listed: list[object] = []
        lister = threading.Thread(target=lambda: listed.append(staging.staged(slow)))
        lister.start()
        other = staging.stage(fast, log_dir / "t-1", 0, 9)  # not behind t-0's fsync
        assert staging.staged(fast) == [other]
        staging.release(other)
        assert staging.staged(fast) == []
        lister.join(0.2)
        assert lister.is_alive() and listed == []  # t-0's own listing waits for its staging
    finally:
        release.set()
        stager.join(10)
    lister.join(10)
    assert [s.base_offset for s in listed[0]] == [0]  # type: ignore[attr-defined]
    assert [s.tp for s in staging.staged()] == [slow]


def test_a_partition_dir_maps_to_its_log_dir_s_staging_root_named_as_configured_resolved_or_through_a_link(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two log dirs, one of them configured through a symbolic link. A partition dir named under either log dir as
    configured, or as resolved, maps to that log dir's staging root without resolving its path; a partition dir that
    is itself a link into the other log dir maps to the other one's (resolved, as before); one in no log dir is
    refused."""
    real_a, real_b = tmp_path / "a" / "data", tmp_path / "b" / "data"
    real_a.mkdir(parents=True)
    real_b.mkdir(parents=True)
    link_a = tmp_path / "link-a"
    link_a.symlink_to(real_a)
    roots = {link_a: tmp_path / "a" / "staging", real_b: tmp_path / "b" / "staging"}
    staging = Staging(roots)
    (real_a / "t-0").mkdir()
    (real_b / "t-1").mkdir()
    (real_a / "t-2").symlink_to(real_b / "t-1")  # a partition dir of a, linked into b
    root_a, root_b = roots[link_a].resolve(), roots[real_b].resolve()
    resolved: list[Path] = []
    resolve = Path.resolve

    def counting(self: Path, strict: bool = False) -> Path:
        resolved.append(self)
        return resolve(self, strict)

    monkeypatch.setattr(Path, "resolve", counting)
    assert staging.root_for(link_a / "t-0") == root_a
    assert staging.root_for(real_a / "t-0") == root_a
    assert staging.root_for(str(real_b / "t-1")) == root_b
    assert resolved == []  # named in a log dir: no path resolved
    assert staging.root_for(real_a / "t-2") == root_b  # a link: resolved, into b
    assert resolved == [real_a / "t-2"]
    with pytest.raises(StagingError):
        staging.root_for(tmp_path / "elsewhere" / "t-3")
