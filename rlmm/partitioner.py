"""Which metadata partition holds a user partition's records, exactly as Kafka computes it.

Mirrors ``org.apache.kafka.server.log.remote.metadata.storage.RemoteLogMetadataTopicPartitioner``::

    h = java.util.Objects.hash(topicId.lsb, topicId.msb, partition)   # 31-based, int32 overflow
    bytes = h as 4 big-endian bytes
    metadata partition = (Utils.murmur2(bytes) & 0x7fffffff) % num_partitions

``Long.hashCode(v) = (int)(v ^ (v >>> 32))``; Kafka's murmur2 is the producer's default partitioner hash
(seed 0x9747b28c, m 0x5bd1e995, r 24).
"""

from __future__ import annotations

import struct
import uuid
from functools import lru_cache

__all__ = ["java_objects_hash", "metadata_partition", "murmur2"]

_MASK32 = 0xFFFFFFFF
_MASK64 = 0xFFFFFFFFFFFFFFFF
_U32 = struct.Struct(">I")
_U32_LE = struct.Struct("<I")


def _to_i32(v: int) -> int:
    v &= _MASK32
    return v - 0x100000000 if v & 0x80000000 else v


def _long_hash(v: int) -> int:
    """Java ``Long.hashCode`` of a 64-bit value given unsigned or signed."""
    v &= _MASK64
    return _to_i32(v ^ (v >> 32))


def java_objects_hash(*ints: int) -> int:
    """``Objects.hash`` of already-hashed ints: ``31 * acc + h`` from 1, as a signed int32."""
    acc = 1
    for h in ints:
        acc = (31 * acc + h) & _MASK32
    return _to_i32(acc)


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` as a signed int32."""
    length = len(data)
    m, r = 0x5BD1E995, 24
    h = (0x9747B28C ^ length) & _MASK32
    n4 = length // 4
    for i in range(n4):
        (k,) = _U32_LE.unpack_from(data, i * 4)
        k = (k * m) & _MASK32
        k ^= k >> r
        k = (k * m) & _MASK32
        h = (h * m) & _MASK32
        h ^= k
    rest = length % 4
    tail = n4 * 4
    if rest == 3:
        h ^= data[tail + 2] << 16
    if rest >= 2:
        h ^= data[tail + 1] << 8
    if rest >= 1:
        h ^= data[tail]
        h = (h * m) & _MASK32
    h ^= h >> 13
    h = (h * m) & _MASK32
    h ^= h >> 15
    return _to_i32(h)


@lru_cache(maxsize=65536)
def metadata_partition(topic_id: uuid.UUID, partition: int, num_partitions: int) -> int:
    """The ``__remote_log_metadata`` partition of user partition (``topic_id``, ``partition``)."""
    if num_partitions <= 0:
        raise ValueError(f"num_partitions must be positive, got {num_partitions}")
    msb, lsb = topic_id.int >> 64, topic_id.int & _MASK64
    h = java_objects_hash(_long_hash(lsb), _long_hash(msb), partition)
    return (murmur2(_U32.pack(h & _MASK32)) & 0x7FFFFFFF) % num_partitions
