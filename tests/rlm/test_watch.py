"""The log-dir watcher (rlm.watch) on real inotify over temporary directories: rolls, partition directories that come
and go, a queue overflow and a missed event found by the rescan. No broker."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlm.watch import LogDirWatcher

HOUR_S = 3600.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def roll(pdir: Path, base: int) -> None:
    """What a broker's roll does to a partition directory: a new segment's files."""
    for suffix in (".log", ".index", ".timeindex"):
        (pdir / f"{base:020d}{suffix}").touch()


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    for name in ("t-0", "t-1", "u.v-0"):
        (d / name).mkdir(parents=True)
        roll(d / name, 0)
    (d / "meta.properties").write_text("x")
    return d


def test_first_call_reports_every_partition_then_only_what_changed(log_dir: Path) -> None:
    clock = Clock()
    w = LogDirWatcher([log_dir], rescan_interval_s=HOUR_S, clock=clock)
    try:
        first = w.changes()
        assert first.rescanned and first.layout
        assert first.partitions == {log_dir / "t-0", log_dir / "t-1", log_dir / "u.v-0"}
        assert w.watched == 4  # the log dir and three partition directories
        quiet = w.changes()
        assert not quiet.partitions and not quiet.layout and not quiet.rescanned
        # appends are not events: only entries created, moved or deleted are
        with open(log_dir / "t-0" / f"{0:020d}.log", "ab") as f:
            f.write(b"x" * 100)
        assert not w.changes().partitions
        roll(log_dir / "t-1", 50)
        got = w.changes()
        assert got.partitions == {log_dir / "t-1"} and not got.layout and not got.rescanned
        # retention: a segment renamed .deleted, then removed
        (log_dir / "t-0" / f"{0:020d}.log").rename(log_dir / "t-0" / f"{0:020d}.log.deleted")
        assert w.changes().partitions == {log_dir / "t-0"}
        assert w.rescans == 1
    finally:
        w.close()


def test_partition_directories_created_and_removed_change_the_layout(log_dir: Path) -> None:
    w = LogDirWatcher([log_dir], rescan_interval_s=HOUR_S, clock=Clock())
    try:
        w.changes()
        version = w.layout_version
        new = log_dir / "n-3"
        new.mkdir()
        roll(new, 0)  # between the directory's creation and its watch: seen because the new directory is reported
        got = w.changes()
        assert got.partitions == {new} and got.layout and w.layout_version == version + 1
        roll(new, 10)  # watched from now on
        assert w.changes().partitions == {new}
        # a topic deleted: the broker renames the directory, then removes it
        (log_dir / "t-1").rename(log_dir / "t-1.abcd-delete")
        got = w.changes()
        assert got.layout and not got.partitions and w.layout_version == version + 2
        roll(log_dir / "t-1.abcd-delete", 99)  # its old watch was dropped: no event of a -delete directory
        assert not w.changes().partitions
        # a replica moved in from another log dir: -future renamed to the partition's name
        fut = log_dir / "m-0.beef-future"
        fut.mkdir()
        roll(fut, 0)
        assert not w.changes().layout  # -future directories are not partitions yet
        fut.rename(log_dir / "m-0")
        got = w.changes()
        assert got.partitions == {log_dir / "m-0"} and got.layout
    finally:
        w.close()


def test_a_missed_event_is_found_by_the_rescan(log_dir: Path) -> None:
    """A watch the kernel no longer reports for (here removed under the watcher): the roll is not seen by events,
    but the rescan compares every directory's entries with the last listing and reports it."""
    clock = Clock()
    w = LogDirWatcher([log_dir], rescan_interval_s=60, clock=clock)
    try:
        w.changes()
        pdir = log_dir / "t-0"
        w._inotify.rm_watch(w._watch_of[pdir])  # type: ignore[union-attr]  # the event source goes silent
        roll(pdir, 77)
        clock.now += 59
        assert not w.changes().partitions  # no event, no rescan yet
        clock.now += 1
        got = w.changes()
        assert got.rescanned and got.partitions == {pdir}
        assert w.rescans == 2
        clock.now += 60
        again = w.changes()
        assert again.rescanned and not again.partitions  # reported once: the listing is remembered
    finally:
        w.close()


def test_a_log_dir_created_after_the_watcher_is_watched_at_the_next_call(tmp_path: Path) -> None:
    log_dir = tmp_path / "later"
    w = LogDirWatcher([log_dir], rescan_interval_s=HOUR_S, clock=Clock())
    try:
        assert not w.changes().partitions
        (log_dir / "t-0").mkdir(parents=True)
        got = w.changes()
        assert got.partitions == {log_dir / "t-0"} and got.layout
        roll(log_dir / "t-0", 5)
        assert w.changes().partitions == {log_dir / "t-0"}
    finally:
        w.close()


def test_queue_overflow_rescans_every_directory(log_dir: Path) -> None:
    """More events than the kernel queues (fs.inotify.max_queued_events): the overflow event makes the next call list
    every directory, which finds the roll whose event was dropped."""
    max_queued = int(Path("/proc/sys/fs/inotify/max_queued_events").read_text())
    if max_queued > 100_000:
        pytest.skip(f"fs.inotify.max_queued_events is {max_queued}: too many files to overflow it here")
    w = LogDirWatcher([log_dir], rescan_interval_s=HOUR_S, clock=Clock())
    try:
        w.changes()
        noisy = log_dir / "t-0"
        for i in range(max_queued + 10):
            os.close(os.open(noisy / f"f{i}", os.O_CREAT | os.O_WRONLY))
        roll(log_dir / "u.v-0", 42)  # its event is past the overflow: dropped by the kernel
        got = w.changes()
        assert got.rescanned and w.rescans == 2
        assert got.partitions == {noisy, log_dir / "u.v-0"}
        assert not w.changes().partitions  # events queued after the overflow were read; nothing new since
    finally:
        w.close()


def test_without_inotify_every_call_lists_every_directory(log_dir: Path) -> None:
    w = LogDirWatcher([log_dir], rescan_interval_s=HOUR_S, use_inotify=False, clock=Clock())
    try:
        w.changes()
        assert w.watched == 0
        roll(log_dir / "t-1", 9)
        got = w.changes()
        assert got.partitions == {log_dir / "t-1"} and got.rescanned
    finally:
        w.close()


def test_changes_carry_the_listing_of_each_changed_directory(log_dir: Path) -> None:
    """Each changed directory is listed once, as the events are read, and the listing handed to the caller (who then
    need not list it again: the stage job, issue 26); a directory gone before it could be listed has none."""
    w = LogDirWatcher([log_dir], rescan_interval_s=HOUR_S, clock=Clock())
    try:
        first = w.changes()
        assert first.listings[log_dir / "t-0"] == frozenset(os.listdir(log_dir / "t-0"))
        roll(log_dir / "t-1", 50)
        roll(log_dir / "u.v-0", 50)
        got = w.changes()
        assert got.listings.keys() == {log_dir / "t-1", log_dir / "u.v-0"}
        assert f"{50:020d}.log" in got.listings[log_dir / "t-1"]
        assert got.listings[log_dir / "t-1"] == frozenset(os.listdir(log_dir / "t-1"))
        roll(log_dir / "t-0", 50)
        for name in os.listdir(log_dir / "t-0"):
            (log_dir / "t-0" / name).unlink()
        (log_dir / "t-0").rmdir()
        gone = w.changes()
        assert log_dir / "t-0" not in gone.listings and gone.layout
    finally:
        w.close()
