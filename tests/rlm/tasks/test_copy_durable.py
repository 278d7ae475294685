"""A copy run's batch is made durable once, after its last copy and before any COPY_SEGMENT_FINISHED (issue 26: the
filesystem store's object names of the batch fsynced with one directory fsync, not one per copy). The process dies
right before that fsync, and then, as a power cut may, the objects' names are lost (or not): nothing was published
FINISHED, the restarted copier's clean-up deletes the STARTED copies and copies every segment again, byte-exact.
On crafted partition dirs (no broker), the in-memory metadata manager, the storage manager on the filesystem."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rlmm.api import RemoteLogSegmentState, TopicIdPartition
from rsm.store.fs import FileSystemStore
from tests.support.batches import one_per_batch, write_partition
from tests.support.world import World

STARTED = RemoteLogSegmentState.COPY_SEGMENT_STARTED
FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


class Killed(BaseException):
    """The process dies: nothing of the copier's clean-up runs."""


def stored(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() and ".tmp" not in p.parts}


@pytest.mark.parametrize("lose", [True, False])
def test_a_crash_before_the_batch_is_durable_publishes_nothing_and_loses_nothing(
        world: World, monkeypatch: pytest.MonkeyPatch, lose: bool) -> None:
    tp = TopicIdPartition(uuid.uuid4(), "durable", 0)
    write_partition(world.pdir(1, tp), tp.topic_id,
                    {base: one_per_batch(base, 10, b"v") for base in range(0, 51, 10)})
    copier = world.copier(1, tp)
    assert copier.copy_options == {"durable": False}  # the store's copies are made durable by the batch
    synced: list[list[str]] = []

    def sync_names(self: FileSystemStore, keys) -> None:  # type: ignore[no-untyped-def]
        synced.append(list(keys))
        raise Killed

    monkeypatch.setattr(FileSystemStore, "sync_names", sync_names)
    with pytest.raises(Killed):
        copier.run_once(51, leader_epoch=5, current_leader_epoch=lambda: 5)
    monkeypatch.undo()
    assert len(synced) == 1 and len(synced[0]) == 5  # the batch's five index objects, in one call
    assert [m.state for m in world.rlmm.list_remote_log_segments(tp)] == [STARTED] * 5  # nothing published
    if lose:  # a power cut: the names were never fsynced into their directory
        for p in stored(world.tmp / "remote"):
            p.unlink()
    restarted = world.copier(1, tp)
    result = restarted.run_once(51, leader_epoch=5, current_leader_epoch=lambda: 5)
    assert result.cleaned_up == 5
    assert world.finished(tp) == [(b, b + 9) for b in range(0, 50, 10)]
    assert [o for o, _v in world.values(tp)] == list(range(50))
    live = {str(m.remote_log_segment_id.id) for m in world.rlmm.list_remote_log_segments(tp)}
    assert all(any(sid in str(p) for sid in live) for p in stored(world.tmp / "remote"))  # the dead copies' gone
