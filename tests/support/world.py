"""The copier's crafted world, for tests without a broker: partition dirs written by the batch builder
(:mod:`tests.support.batches`), the in-memory reference metadata manager, the storage manager on the filesystem,
staging and the reader."""

from __future__ import annotations

from pathlib import Path

from rlm.tasks.copier import PartitionCopier
from rlm.tasks.deleter import SegmentDeleter
from rlm.tasks.staging import Staging
from rlm.tier import RemoteReader
from rlmm.api import RemoteLogSegmentState, TopicIdPartition
from rsm.manager import RemoteStorageManager, RsmConfig
from tests.support.rlmm import SyncRlmm

__all__ = ["FINISHED", "World"]

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


class World:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.rlmm = SyncRlmm(tmp / "cache")
        self.rsm = RemoteStorageManager(RsmConfig(store="fs", root_path=tmp / "remote", fsync=False))
        self.reader = RemoteReader(self.rlmm, self.rsm)

    def copier(self, broker: int, tp: TopicIdPartition, *, watermark: bool = True) -> PartitionCopier:
        logdir = self.tmp / f"logs{broker}"
        return PartitionCopier(broker_id=broker, tp=tp, partition_dir=logdir / f"{tp.topic}-{tp.partition}",
                               rlmm=self.rlmm, rsm=self.rsm, staging=Staging({logdir: self.tmp / f"staging{broker}"}),
                               deleter=SegmentDeleter(broker, self.rlmm, self.rsm, None),
                               watermark_path=self.tmp / f"wm{broker}" / f"{tp.topic_id}-{tp.partition}"
                               if watermark else None)

    def pdir(self, broker: int, tp: TopicIdPartition) -> Path:
        return self.tmp / f"logs{broker}" / f"{tp.topic}-{tp.partition}"

    def finished(self, tp: TopicIdPartition) -> list[tuple[int, int]]:
        return [(m.start_offset, m.end_offset_inclusive) for m in self.rlmm.list_remote_log_segments(tp)
                if m.state == FINISHED]

    def values(self, tp: TopicIdPartition, offset: int = 0, **kw: object) -> list[tuple[int, bytes | None]]:
        return [(r.offset, r.value) for r in self.reader.read(tp, offset, **kw)]  # type: ignore[arg-type]
