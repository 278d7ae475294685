"""Staging's round and a crash at every step of it (issue 26: the segments of a round are linked, their markers
linked, each naming the files it vouches for, then their partition's dir fsynced once; no dir per segment).

The process dies (a BaseException nothing of staging catches) at a point of a round of three segments, and then, as a
power cut may, the names made since the dir's last fsync are lost (all of them, every other one, or none: a power
cut keeps any subset). The sidecar restarts (a new :class:`Staging` on the same dirs): what it lists is complete
(every file of each listed segment is the broker's, byte for byte), nothing else is left in the partition's dir,
and the next copy run copies every segment, byte-exact. On crafted partition dirs (no broker), the in-memory
metadata manager, the storage manager on the filesystem."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

import rlm.tasks.staging as staging_mod
from rlmm.api import TopicIdPartition
from tests.support.batches import one_per_batch, write_partition
from tests.support.world import World


class Killed(BaseException):
    """The process dies: nothing of staging's clean-up runs."""


def rolled(world: World, n: int) -> TopicIdPartition:
    """A partition of ``n`` rolled segments of ten records ([0,9], [10,19] ...) and an active one."""
    tp = TopicIdPartition(uuid.uuid4(), "crash", 0)
    write_partition(world.pdir(1, tp), tp.topic_id,
                    {base: one_per_batch(base, 10, b"v") for base in range(0, 10 * n + 1, 10)})
    return tp


class Cut:
    """Kills the process at the ``at``-th call of ``step`` (``"fsync"``: staging's dir fsyncs; ``"marker"``: the
    links of markers), and records the names linked into a dir since its last fsync (a power cut may lose them)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, step: str, at: int) -> None:
        self.unsynced: dict[Path, list[Path]] = {}
        calls = {"fsync": 0, "marker": 0}
        real_fsync_dir, real_link = staging_mod.fsync_dir, os.link

        def fsync_dir(path: Path) -> None:
            calls["fsync"] += 1
            if step == "fsync" and calls["fsync"] == at:
                raise Killed
            real_fsync_dir(path)
            self.unsynced.pop(Path(path), None)

        def link(src, dst) -> None:  # noqa: ANN001
            if ".complete" in str(dst):
                calls["marker"] += 1
                if step == "marker" and calls["marker"] == at:
                    raise Killed
            real_link(src, dst)
            self.unsynced.setdefault(Path(dst).parent, []).append(Path(dst))

        monkeypatch.setattr(staging_mod, "fsync_dir", fsync_dir)
        monkeypatch.setattr(os, "link", link)

    def power_cut(self, lose: str) -> None:
        """Lose the names made since their dir's last fsync: ``all``, ``alternate`` (every other one) or ``none``."""
        for names in self.unsynced.values():
            for i, p in enumerate(names):
                if lose == "all" or (lose == "alternate" and i % 2 == 0):
                    p.unlink(missing_ok=True)


@pytest.mark.parametrize("lose", ["all", "alternate", "none"])
@pytest.mark.parametrize(("step", "at"), [
    ("marker", 1),  # every segment's files linked, no marker yet
    ("marker", 3),  # two markers made, the third not
    ("fsync", 1),   # every file and every marker made, the dir not fsynced yet
])
def test_a_crash_anywhere_in_a_round_loses_nothing(world: World, monkeypatch: pytest.MonkeyPatch, step: str, at: int,
                                                   lose: str) -> None:
    tp = rolled(world, 4)
    copier = world.copier(1, tp)
    pdir = world.pdir(1, tp)
    first = copier.staging.stage(tp, pdir, 0, 9)  # the partition's staging dir exists: the round makes no dir
    sdir = first.directory
    cut = Cut(monkeypatch, step, at)
    with pytest.raises(Killed):
        copier.staging.stage_many(tp, pdir, [(10, 19), (20, 29), (30, 39)])
    cut.power_cut(lose)
    monkeypatch.undo()

    restarted = world.copier(1, tp)  # a new Staging on the same dirs lists what the crash left
    listed = restarted.staging.staged(tp)
    assert listed[0] == first
    for s in listed:
        for suffix in (".log", ".index", ".timeindex"):
            ours = s.file(suffix)
            assert ours is not None and ours.read_bytes() == (pdir / f"{s.base_offset:020d}{suffix}").read_bytes()
    kept = {n for s in listed for n in os.listdir(sdir) if n.startswith(f"{s.base_offset:020d}.")}
    assert set(os.listdir(sdir)) == kept  # nothing of an unfinished segment is left
    result = restarted.run_once(41)
    assert [(m.start_offset, m.end_offset_inclusive) for m in result.copied] == [(0, 9), (10, 19), (20, 29),
                                                                                 (30, 39)]
    assert [o for o, _v in world.values(tp)] == list(range(40))
    assert restarted.staging.staged(tp) == [] and os.listdir(sdir) == []


def test_a_crash_in_a_release_leaves_files_the_next_listing_removes(world: World,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A release unlinks the marker first: killed right after it, the segment's files have no marker, so the next
    listing (after a restart) removes them and never takes them for a staged segment."""
    tp = rolled(world, 2)
    copier = world.copier(1, tp)
    pdir = world.pdir(1, tp)
    a, b = copier.staging.stage_many(tp, pdir, [(0, 9), (10, 19)]).staged
    real_unlink = os.unlink

    def unlink(path, *args, **kw) -> None:  # noqa: ANN001
        real_unlink(path, *args, **kw)
        if ".complete" in str(path):
            raise Killed

    monkeypatch.setattr(os, "unlink", unlink)
    with pytest.raises(Killed):
        copier.staging.release(a)
    monkeypatch.undo()
    assert (a.directory / f"{0:020d}.log").exists()  # its files are still there, its marker not
    restarted = world.copier(1, tp)
    assert restarted.staging.staged(tp) == [b]
    assert not (a.directory / f"{0:020d}.log").exists()
    assert all(n.startswith((f"{10:020d}.", f"{20:020d}.")) for n in os.listdir(a.directory))  # b's files only
