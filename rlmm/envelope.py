"""What ``rlmm`` keeps inside a segment record's ``CustomMetadata`` bytes, next to the storage manager's own.

Kafka 4.3 decodes ``RemoteLogSegmentMetadataRecord`` only in version 0, which has no field for the leader epoch
under which a copy started (KIP-1266 adds ``BrokerLeaderEpoch`` as tag 1 of version 1). To keep every value
decodable by Kafka's own ``RemoteLogMetadataSerde`` and formatter, the epoch travels inside ``CustomMetadata``
(nullable bytes that Kafka never interprets), in this envelope; the RSM's opaque bytes are one field of it:

    CustomMetadataEnvelope =>
        Magic:bytes[4] (= 0xff 'R' 'L' 'M')
        Version:int8 (= 0; another version is not ours to read: the bytes are taken as foreign)
        TAGS => count:uvarint (tag:uvarint size:uvarint data[size])*   ascending, each tag at most once
            tag 0 => BrokerLeaderEpoch:int32 (big-endian, >= 0)   the leader epoch the copying broker started under
            tag 1 => RsmCustomMetadata:bytes                       the RSM's custom metadata; absent means null
            other tags: skipped (later fields)

Canonical form (what :func:`wrap` writes): no envelope at all when there is no epoch and the RSM's bytes cannot be
mistaken for one (null, or not starting with ``Magic``): the field then holds the RSM's bytes unchanged, exactly as
before the envelope existed. Otherwise the envelope with tags 0 and 1 as present, in that order, 1-byte varints
where they fit. Bytes that do not start with ``Magic``, or do but do not parse as a version-0 envelope, were written
by Kafka or another storage manager: they decode as the RSM's bytes with no epoch.
"""

from __future__ import annotations

import struct

__all__ = ["MAGIC", "VERSION", "NotCanonicalError", "canonical_epoch", "is_canonical", "parse", "unwrap", "uvarint",
           "wrap"]

MAGIC = b"\xffRLM"
VERSION = 0
_HEAD = MAGIC + bytes((VERSION,))
_HEAD_LEN = len(_HEAD)
TAG_BROKER_LEADER_EPOCH = 0
TAG_RSM_CUSTOM_METADATA = 1
_I32 = struct.Struct(">i")
_EPOCH_ONLY = _HEAD + b"\x01\x00\x04"            # count 1, tag 0, size 4
_EPOCH_AND_RSM = _HEAD + b"\x02\x00\x04"         # count 2, tag 0, size 4 (then tag 1)
_I32_AT = _I32.unpack_from


class NotCanonicalError(ValueError):
    """Envelope bytes that :func:`wrap` would not have written (the cache re-encodes such values)."""


def uvarint(value: int) -> bytes:
    """Kafka's unsigned varint (the tagged-field and compact-length encoding)."""
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def wrap(broker_leader_epoch: int | None, rsm: bytes | None) -> bytes | None:
    """The ``CustomMetadata`` field value (canonical form, see the module docstring)."""
    if broker_leader_epoch is None and (rsm is None or not rsm.startswith(MAGIC)):
        return rsm
    if broker_leader_epoch is not None:        # the usual shapes, without the general loop
        if rsm is None:
            return _EPOCH_ONLY + _I32.pack(broker_leader_epoch)
        if len(rsm) < 0x80:
            return b"".join((_EPOCH_AND_RSM, _I32.pack(broker_leader_epoch), b"\x01", bytes((len(rsm),)), rsm))
    parts = [_HEAD, uvarint((broker_leader_epoch is not None) + (rsm is not None))]
    if broker_leader_epoch is not None:
        parts.append(b"\x00\x04" + _I32.pack(broker_leader_epoch))
    if rsm is not None:
        parts += [b"\x01", uvarint(len(rsm)), rsm]
    return b"".join(parts)


def _readuvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]            # IndexError when truncated: the caller treats the bytes as foreign
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise ValueError("varint longer than 5 bytes")


def parse(data: bytes) -> tuple[int | None, bytes | None, bool] | None:
    """(epoch, rsm bytes, canonical) of an envelope, or None when ``data`` is not one."""
    if not data.startswith(_HEAD):
        return None
    try:
        count, pos = _readuvarint(data, _HEAD_LEN)
        canonical = data[_HEAD_LEN] == count
        epoch = rsm = None
        last = -1
        for _ in range(count):
            tag_pos = pos
            tag, pos = _readuvarint(data, pos)
            size, pos = _readuvarint(data, pos)
            end = pos + size
            if tag <= last or end > len(data):
                return None
            if tag == TAG_BROKER_LEADER_EPOCH:
                if size != 4:
                    return None
                (epoch,) = _I32.unpack_from(data, pos)
                if epoch < 0:
                    return None
            elif tag == TAG_RSM_CUSTOM_METADATA:
                rsm = data[pos:end]
            else:
                canonical = False
            canonical = canonical and pos - tag_pos == 1 + len(uvarint(size))
            last = tag
            pos = end
        if pos != len(data):
            return None
    except (IndexError, ValueError):
        return None
    if epoch is None and (rsm is None or not rsm.startswith(MAGIC)):
        canonical = False           # wrap() would not have enveloped these bytes
    return epoch, rsm, canonical


def canonical_epoch(buf: bytes, start: int, end: int) -> int | None:
    """The epoch of the envelope ``buf[start:end]`` (which starts with ``MAGIC``), or None when it has none; raises
    :class:`NotCanonicalError` unless it is exactly what :func:`wrap` writes. The cache's fast path."""
    size = end - start
    if size == 12 and buf[start:start + 8] == _EPOCH_ONLY or buf[start:start + 8] == _EPOCH_AND_RSM and size > 13 \
            and buf[start + 12] == TAG_RSM_CUSTOM_METADATA and buf[start + 13] == size - 14 < 0x80:
        (epoch,) = _I32_AT(buf, start + 8)
        if epoch >= 0:
            return epoch
    parsed = parse(buf[start:end])
    if parsed is None or not parsed[2]:
        raise NotCanonicalError("not a canonical envelope")
    return parsed[0]


def unwrap(data: bytes | None) -> tuple[int | None, bytes | None]:
    """(broker leader epoch, RSM bytes) of a ``CustomMetadata`` field value; foreign bytes have no epoch."""
    if data is None:
        return None, None
    parsed = parse(data)
    if parsed is None:
        return None, data
    return parsed[0], parsed[1]


def is_canonical(data: bytes | None) -> bool:
    """True when ``wrap(*unwrap(data)) == data`` (what the cache's fast scanners require)."""
    if data is None or not data.startswith(MAGIC):
        return True
    parsed = parse(data)
    return parsed is not None and parsed[2]

