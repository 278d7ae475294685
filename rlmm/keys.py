"""Record keys of the metadata topic (ours: Kafka's own writer leaves keys null, which compaction cannot keep).

One key per (segment, state) and per (partition, delete state), so compaction keeps the full
COPY_SEGMENT_STARTED record next to the latest record of every later state; a fully deleted segment is
forgotten by writing tombstones (null values) for all four of its keys.

    MetadataRecordKey => Version:int8(=0) Kind:int8 TopicId:uuid Partition:int32 SegmentId:uuid State:int8
        Kind 0 (SEGMENT): State is a RemoteLogSegmentState
        Kind 1 (PARTITION_DELETE): SegmentId is all zeros, State is a RemotePartitionDeleteState
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from enum import IntEnum

from rlmm.api import CorruptMetadataRecordError, RemoteLogSegmentState

__all__ = ["KEY_VERSION", "KeyKind", "MetadataRecordKey", "decode_key", "encode_key", "segment_keys"]

KEY_VERSION = 0
_KEY = struct.Struct(
    ">b"    # Version
    "b"     # Kind
    "16s"   # TopicId
    "i"     # Partition
    "16s"   # SegmentId
    "b"     # State
)
_ZERO_UUID = bytes(16)


class KeyKind(IntEnum):
    SEGMENT = 0
    PARTITION_DELETE = 1


@dataclass(frozen=True, slots=True)
class MetadataRecordKey:
    kind: KeyKind
    topic_id: uuid.UUID
    partition: int
    segment_id: uuid.UUID | None
    state: int


def encode_key(kind: KeyKind, topic_id: uuid.UUID, partition: int, segment_id: uuid.UUID | None,
               state: int) -> bytes:
    return _KEY.pack(KEY_VERSION, kind, topic_id.bytes, partition,
                     segment_id.bytes if segment_id is not None else _ZERO_UUID, state)


def segment_keys(topic_id: uuid.UUID, partition: int, segment_id: uuid.UUID) -> list[bytes]:
    """Every key a segment's records can have (what its tombstones must cover)."""
    return [encode_key(KeyKind.SEGMENT, topic_id, partition, segment_id, s) for s in RemoteLogSegmentState]


def decode_key(key: bytes | None) -> MetadataRecordKey:
    if key is None or len(key) != _KEY.size:
        found = "null" if key is None else f"{len(key)} bytes"
        raise CorruptMetadataRecordError(f"MetadataRecordKey at byte 0: expected {_KEY.size} bytes, found {found}")
    version, kind, tid, partition, sid, state = _KEY.unpack(key)
    if version != KEY_VERSION:
        raise CorruptMetadataRecordError(f"MetadataRecordKey.Version at byte 0: unsupported key version {version}")
    try:
        k = KeyKind(kind)
    except ValueError:
        raise CorruptMetadataRecordError(f"MetadataRecordKey.Kind at byte 1: unknown kind {kind}") from None
    return MetadataRecordKey(k, uuid.UUID(bytes=tid), partition,
                             None if k == KeyKind.PARTITION_DELETE else uuid.UUID(bytes=sid), state)
