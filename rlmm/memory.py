"""An in-memory RemoteLogMetadataManager: the reference implementation tests run against (as Kafka ships
``InmemoryRemoteLogMetadataManager`` for its own tests).

It holds the metadata in dicts under one lock and applies every write at once, so its reads are always current
(read-your-writes trivially; :meth:`wait_ready` returns at once). It refuses what the topic-based manager refuses,
with the same errors, because both decide with :mod:`rlmm.rules`; ``tests/rlmm/test_contract.py`` runs the same
contract suite on both. What it does not model is the topic: no second manager sees its writes, nothing survives
:meth:`close`, and no race between a writer's check and another writer's record exists (a batch write is checked
against the state before the call, then applied in order, as the topic-based manager's is).

Serving mirrors the topic-based manager: reads of a partition raise :class:`PartitionNotServedError` unless it was
named in :meth:`on_partition_leadership_changes` (or the manager serves all: ``serve_all=True``, handy for tests of
code that never announces leadership), or was written through this manager since the last
:meth:`on_stop_partitions` (the topic-based manager consumes the metadata partition a write uses, and keeps
consuming it until the next stop).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Sequence

from rlmm.api import (
    PartitionNotServedError,
    RemoteLogMetadataError,
    RemoteLogMetadataManager,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from rlmm.rules import (
    raised_fence,
    refuse_new_segment,
    refuse_partition_delete,
    refuse_segment_update,
    require_new_segment,
)

__all__ = ["InMemoryRemoteLogMetadataManager"]

_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
_DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED

SegmentRecord = RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate


class _Partition:
    """The metadata of one user partition."""

    __slots__ = ("segments", "finished_at", "fence", "delete")

    def __init__(self) -> None:
        self.segments: dict[uuid.UUID, RemoteLogSegmentMetadata] = {}   # every state but DELETE_SEGMENT_FINISHED
        self.finished_at: dict[uuid.UUID, int] = {}   # COPY_SEGMENT_FINISHED segments -> order they finished in
        self.fence: int | None = None                 # highest broker leader epoch of a COPY_SEGMENT_STARTED
        self.delete: RemotePartitionDeleteMetadata | None = None


class InMemoryRemoteLogMetadataManager(RemoteLogMetadataManager):
    """See the module docstring. Thread-safe: one lock around every call."""

    def __init__(self, *, serve_all: bool = False) -> None:
        self._lock = threading.Lock()
        self._partitions: dict[TopicIdPartition, _Partition] = {}
        self._deleted: set[RemoteLogSegmentId] = set()   # fully deleted: a late second deleter is told so
        self._serve_all = serve_all
        self._served: set[TopicIdPartition] = set()      # named by on_partition_leadership_changes
        self._written: set[TopicIdPartition] = set()     # written since the last on_stop_partitions
        self._finish_seq = 0
        self._closed = False

    # ------------------------------------------------------------------------------------------ write side
    def add_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> None:
        self._write_one(metadata)

    def update_remote_log_segment_metadata(self, update: RemoteLogSegmentMetadataUpdate) -> None:
        self._write_one(update)

    def _write_one(self, rec: SegmentRecord) -> None:
        with self._lock:
            self._check_open()
            self._written.add(rec.remote_log_segment_id.topic_id_partition)
            refused = self._refusal(rec)
            if refused is not None:
                raise refused
            self._apply(rec)

    def write_segment_metadata_many(self, records: Sequence[SegmentRecord]) -> list[RemoteLogMetadataError | None]:
        """Every record checked against the metadata as it was before the call, then each applied in order, where it
        may still be refused by one applied before it (as the topic-based manager's cache refuses a record)."""
        with self._lock:
            self._check_open()
            self._written.update(rec.remote_log_segment_id.topic_id_partition for rec in records)
            out: list[RemoteLogMetadataError | None] = [self._refusal(rec) for rec in records]
            for i, rec in enumerate(records):
                if out[i] is None:
                    out[i] = self._refusal(rec)
                    if out[i] is None:
                        self._apply(rec)
            return out

    def put_remote_partition_delete_metadata(self, metadata: RemotePartitionDeleteMetadata) -> None:
        tp = metadata.topic_id_partition
        with self._lock:
            self._check_open()
            self._written.add(tp)
            p = self._partitions.setdefault(tp, _Partition())
            refused = refuse_partition_delete(tp, metadata.state, None if p.delete is None else p.delete.state)
            if refused is not None:
                raise refused
            p.delete = metadata
            if metadata.state == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                p.segments.clear()
                p.finished_at.clear()
                p.fence = None

    def _refusal(self, rec: SegmentRecord) -> RemoteLogMetadataError | None:
        """The error refusing ``rec`` against the current state, or None (a bad add argument is a ValueError)."""
        sid = rec.remote_log_segment_id
        p = self._partitions.get(sid.topic_id_partition) or _Partition()
        existing = p.segments.get(sid.id)
        known = None if existing is None else existing.state
        if isinstance(rec, RemoteLogSegmentMetadataUpdate):
            return refuse_segment_update(sid, rec.state, known,
                                         copy_epoch=None if existing is None else existing.broker_leader_epoch,
                                         fence_epoch=lambda: p.fence, deleted=sid in self._deleted)
        require_new_segment(rec)
        return refuse_new_segment(sid, rec.state, known, None if p.delete is None else p.delete.state)

    def _apply(self, rec: SegmentRecord) -> None:
        """Apply a record :meth:`_refusal` allowed."""
        sid = rec.remote_log_segment_id
        p = self._partitions.setdefault(sid.topic_id_partition, _Partition())
        if isinstance(rec, RemoteLogSegmentMetadata):
            p.segments[sid.id] = rec
            p.finished_at.pop(sid.id, None)
            p.fence = raised_fence(p.fence, rec.broker_leader_epoch)
            return
        if rec.state == _DELETE_FINISHED:
            del p.segments[sid.id]
            p.finished_at.pop(sid.id, None)
            self._deleted.add(sid)
            return
        old = p.segments[sid.id]
        p.segments[sid.id] = old.with_update(rec)
        if rec.state == _FINISHED:
            if old.state != _FINISHED:
                self._finish_seq += 1
                p.finished_at[sid.id] = self._finish_seq
        else:
            p.finished_at.pop(sid.id, None)

    # ------------------------------------------------------------------------------------------- read side
    def _read(self, tp: TopicIdPartition) -> _Partition:
        """The partition's metadata, for a read (the caller holds the lock): refused when not served."""
        self._check_open()
        if not (self._serve_all or tp in self._served or tp in self._written):
            raise PartitionNotServedError(f"{tp}: not served by this in-memory metadata manager; call "
                                          "on_partition_leadership_changes first")
        return self._partitions.get(tp) or _Partition()

    def _floor(self, p: _Partition, epoch: int, offset: int | None) -> RemoteLogSegmentMetadata | None:
        """The COPY_SEGMENT_FINISHED segment whose run of ``epoch`` starts last at or before ``offset`` (None: the
        last run of the epoch); of two starting at the same offset, the one finished last. As the cache's floor."""
        best: tuple[int, int] | None = None
        found = None
        for segment_id, seq in p.finished_at.items():
            md = p.segments[segment_id]
            start = dict(md.segment_leader_epochs).get(epoch)
            if start is None or (offset is not None and start > offset):
                continue
            if best is None or (start, seq) > best:
                best, found = (start, seq), md
        return found

    def remote_log_segment_metadata(self, tp: TopicIdPartition, epoch: int,
                                    offset: int) -> RemoteLogSegmentMetadata | None:
        with self._lock:
            md = self._floor(self._read(tp), epoch, offset)
            return md if md is not None and offset <= md.epoch_end_offset(epoch) else None  # type: ignore[operator]

    def highest_offset_for_epoch(self, tp: TopicIdPartition, epoch: int) -> int | None:
        with self._lock:
            md = self._floor(self._read(tp), epoch, None)
            return None if md is None else md.epoch_end_offset(epoch)

    def list_remote_log_segments(self, tp: TopicIdPartition,
                                 epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        with self._lock:
            segments = [md for md in self._read(tp).segments.values()
                        if epoch is None or md.epoch_end_offset(epoch) is not None]
        return sorted(segments, key=lambda md: (md.start_offset, md.remote_log_segment_id.id.bytes))

    def remote_log_size(self, tp: TopicIdPartition, epoch: int | None = None) -> int:
        return sum(md.segment_size_bytes for md in self.list_remote_log_segments(tp, epoch))

    def copy_fence_epoch(self, tp: TopicIdPartition) -> int | None:
        with self._lock:
            return self._read(tp).fence

    def remote_partition_delete_metadata(self, tp: TopicIdPartition) -> RemotePartitionDeleteMetadata | None:
        with self._lock:
            return self._read(tp).delete

    # ------------------------------------------------------------------------------------------- lifecycle
    def on_partition_leadership_changes(self, leaders: Iterable[TopicIdPartition],
                                        followers: Iterable[TopicIdPartition]) -> None:
        with self._lock:
            self._check_open()
            self._served.update(leaders)
            self._served.update(followers)

    def on_stop_partitions(self, partitions: Iterable[TopicIdPartition]) -> None:
        with self._lock:
            self._check_open()
            self._served.difference_update(partitions)
            self._written.clear()

    def is_ready(self, tp: TopicIdPartition) -> bool:
        with self._lock:
            return self._serve_all or tp in self._served or tp in self._written

    def wait_ready(self, tps: Iterable[TopicIdPartition], timeout_s: float = 60.0) -> None:
        """Returns at once (reads are always current); a partition not served raises PartitionNotServedError."""
        with self._lock:
            for tp in tps:
                self._read(tp)

    def close(self) -> None:
        with self._lock:
            self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise RemoteLogMetadataError("the metadata manager is closed")
