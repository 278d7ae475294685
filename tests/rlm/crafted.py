"""Crafted partition directories and a synchronous metadata manager, for copier unit tests without a broker.

The batches are Kafka v2 record batches (CRC-32C over the bytes after the CRC field), records uncompressed. The
metadata manager applies every write at once to the real :class:`rlmm.cache.MetadataCache`, through the real
``rlmm.serde`` encoding, so the cache's refusals (fencing, state transitions) reach the writer as they would.
The capabilities themselves are proven against the real broker (tests/rlm/test_cluster_events.py).
"""

from __future__ import annotations

import base64
import struct
import uuid
from pathlib import Path

from rlmm import serde
from rlmm.api import (
    CopyFencedError,
    InvalidStateTransitionError,
    RemoteLogMetadataManager,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
    UnknownSegmentError,
)
from rlmm.cache import MetadataCache
from rlmm.keys import KeyKind, encode_key
from rsm.log.batch import batch_crc

TXN = 0x10
CONTROL = 0x20
BASE_TS = 1_700_000_000_000


def _zigzag(v: int) -> bytes:
    v = (v << 1) ^ (v >> 63)
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def record(offset_delta: int, key: bytes | None, value: bytes | None) -> bytes:
    body = b"\x00" + _zigzag(0) + _zigzag(offset_delta)
    body += _zigzag(-1) if key is None else _zigzag(len(key)) + key
    body += _zigzag(-1) if value is None else _zigzag(len(value)) + value
    body += _zigzag(0)  # no headers
    return _zigzag(len(body)) + body


def batch(base: int, values: list[bytes], *, epoch: int = 0, ts: int = BASE_TS, attrs: int = 0,
          producer_id: int = -1, records: bytes | None = None) -> bytes:
    n = len(values)
    recs = records if records is not None else b"".join(record(i, None, v) for i, v in enumerate(values))
    tail = struct.pack(">hiqqqhii", attrs, n - 1, ts, ts, producer_id, 0 if producer_id >= 0 else -1, -1, n)
    after_length = struct.pack(">ibI", epoch, 2, 0) + tail + recs
    data = bytearray(struct.pack(">qi", base, len(after_length)) + after_length)
    data[17:21] = struct.pack(">I", batch_crc(data))
    return bytes(data)


def abort_marker(base: int, producer_id: int, ts: int = BASE_TS) -> bytes:
    key, value = struct.pack(">hh", 0, 0), struct.pack(">hi", 0, 0)  # version 0, type ABORT; coordinator epoch
    return batch(base, [value], ts=ts, attrs=TXN | CONTROL, producer_id=producer_id,
                 records=record(0, key, value))


def one_per_batch(base: int, n: int, tag: bytes, epoch: int = 0) -> list[bytes]:
    return [batch(base + i, [b"%s-%d" % (tag, base + i)], epoch=epoch) for i in range(n)]


def write_partition(path: Path, topic_id: uuid.UUID, segments: dict[int, list[bytes]],
                    epochs: tuple[tuple[int, int], ...] = ((0, 0),)) -> None:
    """A partition dir as the broker leaves it: ``.log`` files (the last one is the active segment), empty
    offset/time indexes, ``partition.metadata`` and ``leader-epoch-checkpoint``."""
    path.mkdir(parents=True, exist_ok=True)
    tid = base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")
    (path / "partition.metadata").write_text(f"version: 0\ntopic_id: {tid}\n")
    lines = ["0", str(len(epochs)), *(f"{e} {o}" for e, o in epochs)]
    (path / "leader-epoch-checkpoint").write_text("\n".join(lines) + "\n")
    for base, batches in segments.items():
        (path / f"{base:020d}.log").write_bytes(b"".join(batches))
        (path / f"{base:020d}.index").write_bytes(b"")
        (path / f"{base:020d}.timeindex").write_bytes(b"")


class SyncRlmm(RemoteLogMetadataManager):
    """Every write encoded as on the topic and applied to a real MetadataCache at once (one metadata partition)."""

    def __init__(self, path: Path) -> None:
        self.cache = MetadataCache(path, topic="__md", num_partitions=1)
        self._next = 0

    def _write(self, key: bytes, value: bytes) -> None:
        out = self.cache.apply([(0, self._next, key, value)], {})
        self._next += 1
        if out.skipped:
            skipped = out.skipped[0]
            raise (CopyFencedError if skipped.fenced else InvalidStateTransitionError)(skipped.error)

    def add_remote_log_segment_metadata(self, md: RemoteLogSegmentMetadata) -> None:
        tp = md.topic_id_partition
        self._write(encode_key(KeyKind.SEGMENT, tp.topic_id, tp.partition, md.remote_log_segment_id.id, md.state),
                    serde.encode(md))

    def update_remote_log_segment_metadata(self, u: RemoteLogSegmentMetadataUpdate) -> None:
        tp = u.topic_id_partition
        if self.cache.segment(tp, u.remote_log_segment_id.id) is None:
            raise UnknownSegmentError(str(u.remote_log_segment_id))
        self._write(encode_key(KeyKind.SEGMENT, tp.topic_id, tp.partition, u.remote_log_segment_id.id, u.state),
                    serde.encode(u))

    def put_remote_partition_delete_metadata(self, m: RemotePartitionDeleteMetadata) -> None:
        tp = m.topic_id_partition
        self._write(encode_key(KeyKind.PARTITION_DELETE, tp.topic_id, tp.partition, None, m.state), serde.encode(m))

    def remote_log_segment_metadata(self, tp: TopicIdPartition, epoch: int, offset: int):  # type: ignore[no-untyped-def]
        return self.cache.segment_floor(tp, epoch, offset)

    def highest_offset_for_epoch(self, tp: TopicIdPartition, epoch: int) -> int | None:
        return self.cache.highest_offset_for_epoch(tp, epoch)

    def list_remote_log_segments(self, tp: TopicIdPartition, epoch: int | None = None):  # type: ignore[no-untyped-def]
        return self.cache.segments(tp, epoch)

    def remote_log_size(self, tp: TopicIdPartition, epoch: int | None = None) -> int:
        return sum(m.segment_size_bytes for m in self.cache.segments(tp, epoch))

    def remote_partition_delete_metadata(self, tp: TopicIdPartition):  # type: ignore[no-untyped-def]
        return self.cache.partition_delete(tp)

    def on_partition_leadership_changes(self, leaders, followers) -> None:  # type: ignore[no-untyped-def]
        pass

    def on_stop_partitions(self, partitions) -> None:  # type: ignore[no-untyped-def]
        pass

    def is_ready(self, tp: TopicIdPartition) -> bool:
        return True

    def wait_ready(self, tps, timeout_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
        pass  # every write is applied at once

    def close(self) -> None:
        self.cache.close()
