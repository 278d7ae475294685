"""Staging a segment this process staged already (the stage job and each copy run stage every segment not remote
yet; issue 26): checked by its marker and by the broker's ``.log`` being the staged file, without resolving paths or
testing each file again; what matters is still found: a ``.log`` replaced under the same base, a producer snapshot
written since, the broker's delete."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rlm.tasks.staging import Staging, default_staging_root
from rlmm.api import TopicIdPartition


def segment(pdir: Path, base: int, tag: bytes = b"L") -> None:
    pdir.mkdir(parents=True, exist_ok=True)
    for suffix, data in ((".log", tag * 100), (".index", b"I" * 16), (".timeindex", b"T" * 24)):
        (pdir / f"{base:020d}{suffix}").write_bytes(data)


def staged_setup(tmp_path: Path) -> tuple[Staging, TopicIdPartition, Path]:
    log_dir = tmp_path / "data"
    pdir = log_dir / "t-0"
    segment(pdir, 0)
    return Staging({log_dir: default_staging_root(log_dir)}), TopicIdPartition(uuid.uuid4(), "t", 0), pdir


def test_staging_again_neither_resolves_paths_nor_tests_each_file(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    staging, tp, pdir = staged_setup(tmp_path)
    first = staging.stage(tp, pdir, 0, 99)
    calls: list[str] = []
    for name in ("resolve", "exists"):
        inner = getattr(Path, name)

        def counted(self, *a, _n=name, _f=inner, **kw):  # type: ignore[no-untyped-def]
            calls.append(_n)
            return _f(self, *a, **kw)

        monkeypatch.setattr(Path, name, counted)
    for _ in range(3):
        assert staging.stage(tp, pdir, 0, 99) == first
    assert calls == []  # before: a resolve and seven tests of files per call


def test_staging_again_links_a_snapshot_written_since(tmp_path: Path) -> None:
    staging, tp, pdir = staged_setup(tmp_path)
    s = staging.stage(tp, pdir, 0, 99)
    assert s.producer_snapshot_path is None
    (pdir / f"{100:020d}.snapshot").write_bytes(b"S" * 10)
    assert staging.stage(tp, pdir, 0, 99) == s
    assert s.producer_snapshot_path is not None and s.producer_snapshot_path.read_bytes() == b"S" * 10
    assert staging.held_bytes() == 100 + 16 + 24 + 10


def test_staging_again_replaces_a_log_replaced_under_the_same_base(tmp_path: Path) -> None:
    staging, tp, pdir = staged_setup(tmp_path)
    s = staging.stage(tp, pdir, 0, 99)
    for p in pdir.iterdir():  # truncated away and written again: other files of the same names
        p.unlink()
    segment(pdir, 0, tag=b"N")
    assert staging.stage(tp, pdir, 0, 99) == s
    assert s.log_path.read_bytes() == b"N" * 100
    assert s.log_path.stat().st_ino == (pdir / f"{0:020d}.log").stat().st_ino


def test_staging_again_after_the_broker_deleted_it_keeps_ours(tmp_path: Path) -> None:
    staging, tp, pdir = staged_setup(tmp_path)
    s = staging.stage(tp, pdir, 0, 99)
    for p in pdir.iterdir():
        if p.suffix != ".metadata":
            p.unlink()
    assert staging.stage(tp, pdir, 0, 99) == s
    assert s.log_path.read_bytes() == b"L" * 100 and staging.staged(tp) == [s]


def test_holds_answers_from_memory_and_one_stat_until_the_broker_writes_a_file_of_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage job asks :meth:`Staging.holds` before staging a segment again (issue 26): a segment this process
    staged, with every file the partition dir lists, is held without listing its staged dir or trying a link; a
    producer snapshot the broker wrote since makes it not held, so the stage job's stage() links it, as before."""
    import os

    staging, tp, pdir = staged_setup(tmp_path)
    assert not staging.holds(tp, pdir, 0, 99, set(os.listdir(pdir)))  # not staged yet
    staging.stage(tp, pdir, 0, 99, names=set(os.listdir(pdir)))
    names = set(os.listdir(pdir))
    calls: list[str] = []
    with monkeypatch.context() as m:
        for name in ("listdir", "link", "scandir"):
            inner = getattr(os, name)
            m.setattr(os, name, lambda *a, _n=name, _f=inner, **kw: (calls.append(_n), _f(*a, **kw))[1])
        assert staging.holds(tp, pdir, 0, 99, names)
        assert not staging.holds(tp, pdir, 0, 149, names)  # another end: not this segment
    assert calls == []
    (pdir / f"{100:020d}.snapshot").write_bytes(b"S" * 10)
    names = {p.name for p in pdir.iterdir()}
    assert not staging.holds(tp, pdir, 0, 99, names)  # written since: stage() links it
    s = staging.stage(tp, pdir, 0, 99, names=names)
    assert s.producer_snapshot_path is not None and s.producer_snapshot_path.read_bytes() == b"S" * 10
    assert staging.holds(tp, pdir, 0, 99, names)
    # the broker's .log replaced under the same base (truncated and regrown): not held
    (pdir / f"{0:020d}.log").rename(pdir / f"{0:020d}.log.deleted")
    segment(pdir, 0, tag=b"B")
    assert not staging.holds(tp, pdir, 0, 99, {p.name for p in pdir.iterdir()})
