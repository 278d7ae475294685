"""The state dir (:mod:`rlm.state`): names pinned, the durable replace under failures at each step, format versions."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from rlm.known import KnownPartitions
from rlm.state import GC_ORPHANS, KNOWN_PARTITIONS, StateDir, StateFormatError, read_json, write_file_durably
from rlm.tasks.gc import GarbageCollector
from rlmm.api import TopicIdPartition
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import FileSystemStore


class Crash(Exception):
    """Stands for the process dying at that step."""


def test_state_dir_names_are_those_earlier_sidecars_wrote(tmp_path: Path) -> None:
    """Renaming any of these loses state on upgrade: they are pinned."""
    state = StateDir(tmp_path)
    tp = TopicIdPartition(uuid.UUID(int=7), "t", 3)
    assert state.known_partitions == tmp_path / "known-partitions.json"
    assert state.gc_orphans == tmp_path / "gc-orphans.json"
    assert state.copy_watermark(tp) == tmp_path / "copied" / f"{tp.topic_id}-3"
    assert [state.metadata_cache(u).name for u in ("sidecar", "cli", "history")] == [
        "metadata-cache", "cli-metadata-cache", "history-metadata-cache"]
    recover = state.new_recover_cache()
    assert recover.parent == tmp_path and recover.name.startswith("recover-metadata-cache-") and recover.is_dir()


def _fail_on(monkeypatch: pytest.MonkeyPatch, name: str, call: int = 1) -> None:
    """Make the ``call``-th call of ``os.<name>`` raise :class:`Crash`."""
    real = getattr(os, name)
    calls = [0]

    def fail(*args: object) -> object:
        calls[0] += 1
        if calls[0] == call:
            raise Crash(name)
        return real(*args)

    monkeypatch.setattr(os, name, fail)


@pytest.mark.parametrize(("step", "call"), [("fsync", 1), ("replace", 1)], ids=["fsync of the file", "rename"])
def test_a_crash_before_the_rename_leaves_the_old_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             step: str, call: int) -> None:
    path = tmp_path / "f.json"
    write_file_durably(path, b"old contents")
    _fail_on(monkeypatch, step, call)
    with pytest.raises(Crash):
        write_file_durably(path, b"new contents, longer than the old")
    assert path.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]  # no temp file left behind


def test_a_crash_after_the_rename_leaves_the_new_file_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f.json"
    write_file_durably(path, b"old contents")
    _fail_on(monkeypatch, "fsync", 2)  # the second fsync is the directory's
    with pytest.raises(Crash):
        write_file_durably(path, b"new")
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_a_temp_file_left_by_a_killed_write_is_never_read_and_is_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    write_file_durably(path, b"old")
    (tmp_path / "f.json.tmp").write_bytes(b"half of a new ver")  # SIGKILL mid-write: no except clause ran
    assert path.read_bytes() == b"old"
    write_file_durably(path, b"new")
    assert path.read_bytes() == b"new" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_the_file_and_its_directory_are_fsynced_before_it_returns(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_file_durably(tmp_path / "f", b"x")
    assert synced == [str(tmp_path / "f.tmp"), str(tmp_path)]


def test_a_newer_known_partitions_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / KNOWN_PARTITIONS.name
    path.write_text(json.dumps({"version": 2, "partitions": []}))
    with pytest.raises(StateFormatError, match=r"known-partitions\.json: format version 2, this rlm reads version 1"
                                               r": a newer rlm wrote it") as err:
        KnownPartitions(path)
    assert str(path) in str(err.value) and "purged" in str(err.value)  # what moving it away loses


def test_a_known_partitions_file_of_another_shape_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / KNOWN_PARTITIONS.name
    path.write_text('[["not a uuid", "t", 0]]')
    with pytest.raises(StateFormatError, match="is not \\[topic id, topic, partition\\]") as err:
        KnownPartitions(path)
    assert str(path) in str(err.value)
    path.write_text("[[")
    with pytest.raises(StateFormatError, match=f"{path}: not a known-partitions.json state file"):
        KnownPartitions(path)


def test_a_newer_gc_state_file_is_a_clear_error(tmp_path: Path) -> None:
    """Before, a version it did not know was read as version 1 (its keys taken for key bases)."""
    path = tmp_path / GC_ORPHANS.name
    path.write_text(json.dumps({"version": 4, "first_seen": {}, "partitions": {}}))
    rsm = RemoteStorageManager(RsmConfig(), FileSystemStore(tmp_path / "remote", fsync=False))
    with pytest.raises(StateFormatError, match=r"format version 4, this rlm reads version 1, 2, 3") as err:
        GarbageCollector(None, rsm, grace_ms=1, state_path=path)  # type: ignore[arg-type]  # reads no metadata
    assert str(err.value).startswith(f"{path}: ")
    path.write_text("[]")
    with pytest.raises(StateFormatError, match=f"{path}: not a gc-orphans.json state file"):
        GarbageCollector(None, rsm, grace_ms=1, state_path=path)  # type: ignore[arg-type]


def test_versions_read(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    assert read_json(path, GC_ORPHANS) is None  # missing
    path.write_text("")
    assert read_json(path, GC_ORPHANS) is None  # empty: as before, nothing kept yet
    path.write_text('{"some/key": 1}')
    assert read_json(path, GC_ORPHANS) == (1, {"some/key": 1})  # version 1 predates the key
    path.write_text('{"version": 3, "first_seen": {}}')
    assert read_json(path, GC_ORPHANS) == (3, {"version": 3, "first_seen": {}})
    path.write_text('{"version": "3"}')
    with pytest.raises(StateFormatError, match="format version '3'"):
        read_json(path, GC_ORPHANS)
