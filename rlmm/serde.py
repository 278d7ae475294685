"""Values of the metadata topic, byte-compatible with Kafka's ``RemoteLogMetadataSerde``.

Mirrors ``org.apache.kafka.server.log.remote.metadata.storage.serialization.RemoteLogMetadataSerde``
(https://github.com/apache/kafka/tree/trunk/storage/src/main/java/org/apache/kafka/server/log/remote/metadata/
storage/serialization) and the JSON schemas ``storage/src/main/resources/message/RemoteLogSegmentMetadataRecord.json``,
``RemoteLogSegmentMetadataUpdateRecord.json``, ``RemotePartitionDeleteMetadataRecord.json`` (all "flexibleVersions":
"0+"). Ints are big-endian; ``uuid`` is 16 bytes (most then least significant 64 bits); ``compact_*`` lengths are
``uvarint(length + 1)`` with 0 meaning null; every struct, nested ones and array elements included, ends with
``TAGS => count:uvarint (tag:uvarint size:uvarint data[size])*`` (``0x00`` when empty). Unknown tags are skipped.

    Frame => FrameVersion:uvarint(=1) ApiKey:uvarint SchemaVersion:uvarint(=0; 1 also read for ApiKey 0) Body

    TopicIdPartitionEntry => Name:compact_string Id:uuid Partition:int32 TAGS
    RemoteLogSegmentIdEntry => TopicIdPartition:TopicIdPartitionEntry Id:uuid TAGS

    RemoteLogSegmentMetadataRecord (ApiKey 0) =>
        RemoteLogSegmentId:RemoteLogSegmentIdEntry
        StartOffset:int64 EndOffset:int64 BrokerId:int32 MaxTimestampMs:int64 EventTimestampMs:int64
        SegmentLeaderEpochs:compact_array[LeaderEpoch:int32 Offset:int64 TAGS]
        SegmentSizeInBytes:int32 CustomMetadata:compact_nullable_bytes RemoteLogSegmentState:int8
        TAGS (tag 0 => TxnIndexEmpty:bool, written only when true;
              tag 1 => BrokerLeaderEpoch:int32, SchemaVersion 1 only (KIP-1266), read, never written)

    RemoteLogSegmentMetadataUpdateRecord (ApiKey 1) =>
        RemoteLogSegmentId:RemoteLogSegmentIdEntry BrokerId:int32 EventTimestampMs:int64
        CustomMetadata:compact_nullable_bytes RemoteLogSegmentState:int8 TAGS

    RemotePartitionDeleteMetadataRecord (ApiKey 2) =>
        TopicIdPartition:TopicIdPartitionEntry BrokerId:int32 EventTimestampMs:int64
        RemotePartitionDeleteState:int8 TAGS

CustomMetadata of both segment records holds :mod:`rlmm.envelope`: the RSM's bytes and, in a
RemoteLogSegmentMetadataRecord, the broker leader epoch of the copy. Kafka 4.3 reads SchemaVersion 0 only, so that
is what we write (the epoch in the envelope); a SchemaVersion 1 record's BrokerLeaderEpoch tag wins over the
envelope's. An update record carries no epoch: the segment keeps the one of its COPY_SEGMENT_STARTED record.
"""

from __future__ import annotations

import struct
import uuid
from enum import IntEnum
from typing import NamedTuple

from rlmm import envelope
from rlmm.api import (
    CorruptMetadataRecordError,
    RemoteLogMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

__all__ = ["FRAME_VERSION", "SCHEMA_VERSION", "MetadataApiKey", "SegmentView", "UpdateView", "api_key_of", "decode",
           "decode_api_key", "encode", "patch_segment", "scan_segment", "scan_update", "segment_from_view"]

FRAME_VERSION = 1
SCHEMA_VERSION = 0
SEGMENT_SCHEMA_VERSION_V1 = 1              # KIP-1266: RemoteLogSegmentMetadataRecord with BrokerLeaderEpoch
TAG_TXN_INDEX_EMPTY = 0
TAG_BROKER_LEADER_EPOCH = 1                # in SchemaVersion 1 only


class MetadataApiKey(IntEnum):
    REMOTE_LOG_SEGMENT_METADATA = 0
    REMOTE_LOG_SEGMENT_METADATA_UPDATE = 1
    REMOTE_PARTITION_DELETE_METADATA = 2


_I8 = struct.Struct(">b")
_I32 = struct.Struct(">i")
_UUID_PARTITION = struct.Struct(">16si")   # Id:uuid Partition:int32 (after the topic name)
_SEGMENT_FIXED = struct.Struct(
    ">q"   # StartOffset
    "q"    # EndOffset
    "i"    # BrokerId
    "q"    # MaxTimestampMs
    "q"    # EventTimestampMs
)
_EPOCH_ENTRY = struct.Struct(
    ">i"   # LeaderEpoch
    "q"    # Offset
)                                           # followed by the element's TAGS
_BROKER_EVENT = struct.Struct(
    ">i"   # BrokerId
    "q"    # EventTimestampMs
)
_BROKER_EVENT_STATE = struct.Struct(
    ">i"   # BrokerId
    "q"    # EventTimestampMs
    "b"    # RemotePartitionDeleteState
)
UUID_SIZE = 16


# --------------------------------------------------------------------------------------------------- encode
_uvarint = envelope.uvarint
_wrap = envelope.wrap
_unwrap = envelope.unwrap
_HEADERS = {k: _uvarint(FRAME_VERSION) + _uvarint(k) + _uvarint(SCHEMA_VERSION) for k in MetadataApiKey}
_NO_TAGS = b"\x00"


def _tp(tp: TopicIdPartition) -> bytes:
    name = tp.topic.encode("utf-8")
    return _uvarint(len(name) + 1) + name + _UUID_PARTITION.pack(tp.topic_id.bytes, tp.partition) + _NO_TAGS


def _segment_id(sid: RemoteLogSegmentId) -> bytes:
    return _tp(sid.topic_id_partition) + sid.id.bytes + _NO_TAGS


def _nullable_bytes(value: bytes | None) -> bytes:
    return b"\x00" if value is None else _uvarint(len(value) + 1) + bytes(value)


def encode(metadata: RemoteLogMetadata) -> bytes:
    """The record value Kafka's ``RemoteLogMetadataSerde.serialize`` writes for ``metadata``."""
    if isinstance(metadata, RemoteLogSegmentMetadata):
        md = metadata
        parts = [_HEADERS[MetadataApiKey.REMOTE_LOG_SEGMENT_METADATA], _segment_id(md.remote_log_segment_id),
                 _SEGMENT_FIXED.pack(md.start_offset, md.end_offset_inclusive, md.broker_id, md.max_timestamp_ms,
                                     md.event_timestamp_ms),
                 _uvarint(len(md.segment_leader_epochs) + 1)]
        parts.extend(_EPOCH_ENTRY.pack(e, o) + _NO_TAGS for e, o in md.segment_leader_epochs)
        parts += [_I32.pack(md.segment_size_bytes), _nullable_bytes(_wrap(md.broker_leader_epoch, md.custom_metadata)),
                  _I8.pack(md.state),
                  b"\x01\x00\x01\x01" if md.txn_index_empty else _NO_TAGS]
        return b"".join(parts)
    if isinstance(metadata, RemoteLogSegmentMetadataUpdate):
        u = metadata
        return b"".join((_HEADERS[MetadataApiKey.REMOTE_LOG_SEGMENT_METADATA_UPDATE],
                         _segment_id(u.remote_log_segment_id),
                         _BROKER_EVENT.pack(u.broker_id, u.event_timestamp_ms),
                         _nullable_bytes(_wrap(None, u.custom_metadata)),
                         _I8.pack(u.state), _NO_TAGS))
    if isinstance(metadata, RemotePartitionDeleteMetadata):
        p = metadata
        return b"".join((_HEADERS[MetadataApiKey.REMOTE_PARTITION_DELETE_METADATA], _tp(p.topic_id_partition),
                         _BROKER_EVENT_STATE.pack(p.broker_id, p.event_timestamp_ms, p.state), _NO_TAGS))
    raise TypeError(f"cannot encode {type(metadata).__name__}")


# --------------------------------------------------------------------------------------------------- decode
class _Reader:
    """A cursor over one record value; every failure names the field and byte position."""

    __slots__ = ("buf", "pos", "end", "api", "version")

    def __init__(self, buf: bytes | memoryview) -> None:
        self.buf = memoryview(buf)
        self.pos = 0
        self.end = len(self.buf)
        self.api = "RemoteLogMetadata"
        self.version = SCHEMA_VERSION

    def fail(self, field: str, problem: str, pos: int | None = None) -> CorruptMetadataRecordError:
        return CorruptMetadataRecordError(
            f"{self.api}.{field} at byte {self.pos if pos is None else pos} of {self.end}: {problem}")

    def need(self, n: int, field: str) -> None:
        if self.pos + n > self.end:
            raise self.fail(field, f"expected {n} bytes, found {self.end - self.pos}")

    def uvarint(self, field: str) -> int:
        buf, pos, end = self.buf, self.pos, self.end
        if pos < end and buf[pos] < 0x80:
            self.pos = pos + 1
            return buf[pos]
        value = shift = 0
        start = pos
        while True:
            if pos >= end:
                raise self.fail(field, "truncated unsigned varint", start)
            b = buf[pos]
            pos += 1
            value |= (b & 0x7F) << shift
            if b < 0x80:
                break
            shift += 7
            if shift > 28:
                raise self.fail(field, "unsigned varint longer than 5 bytes", start)
        self.pos = pos
        return value

    def unpack(self, st: struct.Struct, field: str) -> tuple:
        self.need(st.size, field)
        out = st.unpack_from(self.buf, self.pos)
        self.pos += st.size
        return out

    def raw(self, n: int, field: str) -> bytes:
        self.need(n, field)
        out = self.buf[self.pos:self.pos + n].tobytes()
        self.pos += n
        return out

    def string(self, field: str) -> str:
        start = self.pos
        n = self.uvarint(field) - 1
        if n < 0:
            raise self.fail(field, "null string in a non-nullable field", start)
        data = self.raw(n, field)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise self.fail(field, f"invalid UTF-8 ({err.reason})", start) from err

    def nullable_bytes(self, field: str) -> bytes | None:
        n = self.uvarint(field) - 1
        return None if n < 0 else self.raw(n, field)

    def tags(self, field: str, known: dict[int, str] | None = None) -> dict[int, bytes]:
        """Read a tagged-field section; return the known tags' data, skip the others."""
        count = self.uvarint(f"{field}.TaggedFieldCount")
        found: dict[int, bytes] = {}
        for _ in range(count):
            tag = self.uvarint(f"{field}.Tag")
            size = self.uvarint(f"{field}.Tag[{tag}].Size")
            data = self.raw(size, f"{field}.Tag[{tag}]")
            if known and tag in known:
                found[tag] = data
        return found

    def tp(self, field: str) -> TopicIdPartition:
        name = self.string(f"{field}.Name")
        tid, partition = self.unpack(_UUID_PARTITION, f"{field}.Id/Partition")
        self.tags(field)
        return TopicIdPartition(uuid.UUID(bytes=tid), name, partition)

    def segment_id(self) -> RemoteLogSegmentId:
        tp = self.tp("RemoteLogSegmentId.TopicIdPartition")
        sid = self.raw(UUID_SIZE, "RemoteLogSegmentId.Id")
        self.tags("RemoteLogSegmentId")
        return RemoteLogSegmentId(tp, uuid.UUID(bytes=sid))

    def done(self) -> None:
        if self.pos != self.end:
            raise self.fail("<end>", f"{self.end - self.pos} trailing bytes after the record")


def decode_api_key(value: bytes | memoryview) -> int:
    """The api key of a record value (after checking the frame and schema versions)."""
    r = _Reader(value)
    return _header(r)


def _header(r: _Reader) -> int:
    frame = r.uvarint("FrameVersion")
    if frame != FRAME_VERSION:
        raise r.fail("FrameVersion", f"unsupported frame version {frame} (expected {FRAME_VERSION})", 0)
    key_pos = r.pos
    api_key = r.uvarint("ApiKey")
    version = r.uvarint("SchemaVersion")
    if api_key not in _DECODERS:
        raise r.fail("ApiKey", f"unknown api key {api_key} (known: {sorted(_DECODERS)})", key_pos)
    if version != SCHEMA_VERSION and not (api_key == MetadataApiKey.REMOTE_LOG_SEGMENT_METADATA
                                          and version == SEGMENT_SCHEMA_VERSION_V1):
        raise r.fail("SchemaVersion", f"unsupported schema version {version} of api key {api_key}", key_pos + 1)
    r.version = version
    return api_key


def _decode_segment(r: _Reader) -> RemoteLogSegmentMetadata:
    r.api = "RemoteLogSegmentMetadataRecord"
    sid = r.segment_id()
    start, end, broker, max_ts, event_ts = r.unpack(_SEGMENT_FIXED, "StartOffset..EventTimestampMs")
    n_pos = r.pos
    n = r.uvarint("SegmentLeaderEpochs.Length") - 1
    if n < 0:
        raise r.fail("SegmentLeaderEpochs", "null array in a non-nullable field", n_pos)
    if n * (_EPOCH_ENTRY.size + 1) > r.end - r.pos:
        raise r.fail("SegmentLeaderEpochs", f"{n} entries do not fit in {r.end - r.pos} bytes", n_pos)
    epochs = []
    for i in range(n):
        epochs.append(r.unpack(_EPOCH_ENTRY, f"SegmentLeaderEpochs[{i}]"))
        r.tags(f"SegmentLeaderEpochs[{i}]")
    (size,) = r.unpack(_I32, "SegmentSizeInBytes")
    broker_epoch, custom = _unwrap(r.nullable_bytes("CustomMetadata"))
    state_pos = r.pos
    (state,) = r.unpack(_I8, "RemoteLogSegmentState")
    known = {TAG_TXN_INDEX_EMPTY: "TxnIndexEmpty"}
    if r.version >= SEGMENT_SCHEMA_VERSION_V1:
        known[TAG_BROKER_LEADER_EPOCH] = "BrokerLeaderEpoch"
    tags = r.tags("", known)
    txn_empty = False
    if TAG_TXN_INDEX_EMPTY in tags:
        data = tags[TAG_TXN_INDEX_EMPTY]
        if len(data) != 1:
            raise r.fail("TxnIndexEmpty", f"expected a 1-byte bool, found {len(data)} bytes")
        txn_empty = data[0] != 0
    if TAG_BROKER_LEADER_EPOCH in tags:
        data = tags[TAG_BROKER_LEADER_EPOCH]
        if len(data) != 4:
            raise r.fail("BrokerLeaderEpoch", f"expected a 4-byte int32, found {len(data)} bytes")
        (broker_epoch,) = _I32.unpack(data)
        if broker_epoch < 0:     # Kafka's "no epoch" is -1
            broker_epoch = None
    r.done()
    try:
        st = RemoteLogSegmentState(state)
    except ValueError:
        raise r.fail("RemoteLogSegmentState", f"unknown segment state {state}", state_pos) from None
    try:
        return RemoteLogSegmentMetadata(sid, start, end, max_ts, broker, event_ts, size, tuple(epochs), custom, st,
                                        txn_empty, broker_epoch)
    except ValueError as err:
        raise r.fail("<record>", str(err), 0) from err


def _decode_update(r: _Reader) -> RemoteLogSegmentMetadataUpdate:
    r.api = "RemoteLogSegmentMetadataUpdateRecord"
    sid = r.segment_id()
    broker, event_ts = r.unpack(_BROKER_EVENT, "BrokerId/EventTimestampMs")
    _epoch, custom = _unwrap(r.nullable_bytes("CustomMetadata"))
    state_pos = r.pos
    (state,) = r.unpack(_I8, "RemoteLogSegmentState")
    r.tags("")
    r.done()
    try:
        st = RemoteLogSegmentState(state)
        return RemoteLogSegmentMetadataUpdate(sid, event_ts, custom, st, broker)
    except ValueError as err:
        raise r.fail("RemoteLogSegmentState", f"invalid segment state {state}: {err}", state_pos) from None


def _decode_partition_delete(r: _Reader) -> RemotePartitionDeleteMetadata:
    r.api = "RemotePartitionDeleteMetadataRecord"
    tp = r.tp("TopicIdPartition")
    state_pos = r.pos + _BROKER_EVENT.size
    broker, event_ts, state = r.unpack(_BROKER_EVENT_STATE, "BrokerId/EventTimestampMs/RemotePartitionDeleteState")
    r.tags("")
    r.done()
    try:
        return RemotePartitionDeleteMetadata(tp, RemotePartitionDeleteState(state), event_ts, broker)
    except ValueError:
        raise r.fail("RemotePartitionDeleteState", f"unknown partition delete state {state}", state_pos) from None


_DECODERS = {
    MetadataApiKey.REMOTE_LOG_SEGMENT_METADATA: _decode_segment,
    MetadataApiKey.REMOTE_LOG_SEGMENT_METADATA_UPDATE: _decode_update,
    MetadataApiKey.REMOTE_PARTITION_DELETE_METADATA: _decode_partition_delete,
}


def decode(value: bytes | memoryview | None) -> RemoteLogMetadata:
    """Decode one record value; raises only :class:`CorruptMetadataRecordError` (field and byte position)."""
    if value is None:
        raise CorruptMetadataRecordError("RemoteLogMetadata: null value (a tombstone is not a metadata record)")
    if type(value) is bytes and value[:3] == _SEG_HEAD:
        try:
            view = _scan_segment_fast(value)
        except (IndexError, struct.error, UnicodeDecodeError):
            view = None
        if view is not None:
            return segment_from_view(view)
    r = _Reader(value)
    api_key = _header(r)
    return _DECODERS[api_key](r)


# ------------------------------------------------------------------------------- scanning (the cache's hot path)
# The cache applies records without building value objects: it needs raw ids, offsets and the byte positions of the
# fields an update replaces. The fast scanners accept only the canonical shape ``encode`` writes (1-byte varints,
# empty tagged sections except TxnIndexEmpty, names < 127 bytes) and check everything ``decode`` checks; anything
# else goes through ``decode``, which raises the precise error or yields a value that is re-encoded canonically.
class SegmentView(NamedTuple):
    value: bytes                           # canonical record bytes (what the cache stores)
    topic_id: bytes
    partition: int
    segment_id: bytes
    start_offset: int
    end_offset_inclusive: int
    epochs: tuple[tuple[int, int], ...]
    broker_pos: int                        # BrokerId, then MaxTimestampMs, EventTimestampMs
    custom_pos: int                        # CustomMetadata (compact nullable bytes), then the state byte
    state_pos: int
    state: int
    broker_leader_epoch: int | None        # from the CustomMetadata envelope


class UpdateView(NamedTuple):
    topic_id: bytes
    partition: int
    segment_id: bytes
    broker_id: int
    event_timestamp_ms: int
    custom_field: bytes                    # CustomMetadata as encoded (length prefix included), canonical
    state: int
    custom_metadata: bytes | None          # the RSM's bytes (envelope removed)


_SEG_HEAD = b"\x01\x00\x00"
_MAGIC = envelope.MAGIC
_canonical_epoch = envelope.canonical_epoch
_UPD_HEAD = b"\x01\x01\x00"
_TAIL_TAGS = (b"\x00", b"\x01\x00\x01\x00", b"\x01\x00\x01\x01")
_I32_AT = _I32.unpack_from
_FIXED_AT = _SEGMENT_FIXED.unpack_from
_EPOCH_AT = _EPOCH_ENTRY.unpack_from
_BROKER_EVENT_AT = _BROKER_EVENT.unpack_from


def api_key_of(value: bytes) -> int:
    """The api key of a record value (fast for the canonical header; checked like ``decode``)."""
    if len(value) > 3 and value[0] == FRAME_VERSION and value[1] < 3 and value[2] == SCHEMA_VERSION:
        return value[1]
    return decode_api_key(value)


def _ids(buf: bytes) -> tuple[bytes, int, bytes, int] | None:
    """TopicId, Partition, SegmentId and the position after RemoteLogSegmentId, canonical shape only."""
    n = buf[3]
    if n == 0 or n >= 0x80:
        return None
    p = 3 + n
    buf[4:p].decode("utf-8")
    (part,) = _I32_AT(buf, p + 16)
    if buf[p + 20] != 0 or buf[p + 37] != 0:
        return None
    return buf[p:p + 16], part, buf[p + 21:p + 37], p + 38


def _scan_segment_fast(buf: bytes) -> SegmentView | None:
    if buf[:3] != _SEG_HEAD:
        return None
    ids = _ids(buf)
    if ids is None:
        return None
    tid, part, sid, p = ids
    start, end, _broker, _max_ts, _event = _FIXED_AT(buf, p)
    broker_pos = p + 16
    p += 36
    n = buf[p] - 1
    if n < 1 or n >= 0x7F:
        return None
    p += 1
    epochs = []
    last_e = last_o = -(1 << 64)
    for _ in range(n):
        e, o = _EPOCH_AT(buf, p)
        if buf[p + 12] != 0 or e <= last_e or o < last_o:
            return None
        epochs.append((e, o))
        last_e, last_o = e, o
        p += 13
    p += 4
    custom_pos = p
    c = buf[p]
    if c >= 0x80:
        return None
    broker_epoch = None
    if c > 4 and buf[p + 1] == 0xFF and buf[p + 1:p + 5] == _MAGIC:
        try:
            broker_epoch = _canonical_epoch(buf, p + 1, p + c)
        except envelope.NotCanonicalError:
            return None
    p += c if c else 1
    state = buf[p]
    if state > 3 or start < 0 or end < start or epochs[0][1] < start or last_o > end:
        return None
    if buf[p + 1:] not in _TAIL_TAGS:
        return None
    return SegmentView(buf, tid, part, sid, start, end, tuple(epochs), broker_pos, custom_pos, p, state, broker_epoch)


def scan_segment(value: bytes) -> SegmentView:
    """Scan a RemoteLogSegmentMetadataRecord; raises only CorruptMetadataRecordError (like :func:`decode`)."""
    try:
        view = _scan_segment_fast(value)
    except (IndexError, struct.error, UnicodeDecodeError):
        view = None
    if view is not None:
        return view
    md = decode(value)
    if not isinstance(md, RemoteLogSegmentMetadata):
        raise CorruptMetadataRecordError(f"RemoteLogMetadata.ApiKey at byte 1: expected a segment record, found "
                                         f"{type(md).__name__}")
    view = _scan_segment_fast(encode(md))
    if view is None:   # e.g. a topic name of 127+ bytes: no fast shape; positions from a careful re-encoding
        view = _scan_canonical(md)
    return view


def _scan_canonical(md: RemoteLogSegmentMetadata) -> SegmentView:
    raw = encode(md)
    tail = len(b"\x01\x00\x01\x01" if md.txn_index_empty else _NO_TAGS)
    state_pos = len(raw) - tail - 1
    custom_len = len(_nullable_bytes(_wrap(md.broker_leader_epoch, md.custom_metadata)))
    custom_pos = state_pos - custom_len
    fixed_pos = custom_pos - 4 - sum(_EPOCH_ENTRY.size + 1 for _ in md.segment_leader_epochs) \
        - len(_uvarint(len(md.segment_leader_epochs) + 1)) - _SEGMENT_FIXED.size
    sid = md.remote_log_segment_id
    return SegmentView(raw, sid.topic_id_partition.topic_id.bytes, sid.topic_id_partition.partition, sid.id.bytes,
                       md.start_offset, md.end_offset_inclusive, md.segment_leader_epochs, fixed_pos + 16,
                       custom_pos, state_pos, int(md.state), md.broker_leader_epoch)


def scan_update(value: bytes) -> UpdateView:
    """Scan a RemoteLogSegmentMetadataUpdateRecord; raises only CorruptMetadataRecordError."""
    try:
        if value[:3] == _UPD_HEAD:
            ids = _ids(value)
            if ids is not None:
                tid, part, sid, p = ids
                broker, event_ts = _BROKER_EVENT_AT(value, p)
                p += 12
                c = value[p]
                end = p + (c if c else 1)
                if c < 0x80 and 1 <= value[end] <= 3 and value[end + 1:] == _NO_TAGS and not (
                        c > 4 and value[p + 1:p + 5] == _MAGIC):     # an envelope: canonicalised below
                    return UpdateView(tid, part, sid, broker, event_ts, value[p:end], value[end],
                                      value[p + 1:end] if c else None)
    except (IndexError, struct.error, UnicodeDecodeError):
        pass
    u = decode(value)
    if not isinstance(u, RemoteLogSegmentMetadataUpdate):
        raise CorruptMetadataRecordError(f"RemoteLogMetadata.ApiKey at byte 1: expected an update record, found "
                                         f"{type(u).__name__}")
    sid = u.remote_log_segment_id
    return UpdateView(sid.topic_id_partition.topic_id.bytes, sid.topic_id_partition.partition, sid.id.bytes,
                      u.broker_id, u.event_timestamp_ms, _nullable_bytes(_wrap(None, u.custom_metadata)), int(u.state),
                      u.custom_metadata)


_EVENT_TS = struct.Struct(">q")
_STATE_BYTE = [bytes((i,)) for i in range(4)]
_new_view = SegmentView._make


def patch_segment(view: SegmentView, update: UpdateView) -> SegmentView:
    """The segment record after ``update``: BrokerId, EventTimestampMs, the RSM's CustomMetadata and state replaced;
    the broker leader epoch in the CustomMetadata envelope is kept."""
    raw = view.value
    bp, cp, sp = view.broker_pos, view.custom_pos, view.state_pos
    broker_epoch = view.broker_leader_epoch
    custom = update.custom_field if broker_epoch is None else _nullable_bytes(_wrap(broker_epoch,
                                                                                    update.custom_metadata))
    if len(custom) == sp - cp:                      # the usual case: patch in place
        buf = bytearray(raw)
        _I32.pack_into(buf, bp, update.broker_id)
        _EVENT_TS.pack_into(buf, bp + 12, update.event_timestamp_ms)
        buf[cp:sp] = custom
        buf[sp] = update.state
        new = bytes(buf)
    else:
        new = b"".join((raw[:bp], _I32.pack(update.broker_id), raw[bp + 4:bp + 12],
                        _EVENT_TS.pack(update.event_timestamp_ms), raw[bp + 20:cp], custom,
                        _STATE_BYTE[update.state], raw[sp + 1:]))
        sp = cp + len(custom)
    return _new_view((new, view[1], view[2], view[3], view[4], view[5], view[6], bp, cp, sp, update.state,
                      broker_epoch))


# Value objects from a scanned (hence already validated) record, without re-running the dataclass checks.
_object_new = object.__new__
_setattr = object.__setattr__
_SAFE_UNKNOWN = uuid.SafeUUID.unknown
_SEGMENT_STATES = tuple(RemoteLogSegmentState)
_BROKER_MAX_EVENT = struct.Struct(
    ">i"   # BrokerId
    "q"    # MaxTimestampMs
    "q"    # EventTimestampMs
)
_TXN_TRUE = b"\x01\x00\x01\x01"


def _uuid(raw: bytes) -> uuid.UUID:
    u = _object_new(uuid.UUID)
    _setattr(u, "int", int.from_bytes(raw, "big"))
    _setattr(u, "is_safe", _SAFE_UNKNOWN)
    return u


def segment_from_view(view: SegmentView) -> RemoteLogSegmentMetadata:
    """The value object of a scanned segment record (the fields ``scan_segment`` already checked)."""
    raw = view.value
    broker, max_ts, event_ts = _BROKER_MAX_EVENT.unpack_from(raw, view.broker_pos)
    cp = view.custom_pos
    (size,) = _I32_AT(raw, cp - 4)
    c = raw[cp]
    name_end = view.broker_pos - 16 - 38
    tp = _object_new(TopicIdPartition)
    _setattr(tp, "topic_id", _uuid(view.topic_id))
    _setattr(tp, "topic", raw[4:name_end].decode("utf-8"))
    _setattr(tp, "partition", view.partition)
    sid = _object_new(RemoteLogSegmentId)
    _setattr(sid, "topic_id_partition", tp)
    _setattr(sid, "id", _uuid(view.segment_id))
    md = _object_new(RemoteLogSegmentMetadata)
    _setattr(md, "remote_log_segment_id", sid)
    _setattr(md, "start_offset", view.start_offset)
    _setattr(md, "end_offset_inclusive", view.end_offset_inclusive)
    _setattr(md, "max_timestamp_ms", max_ts)
    _setattr(md, "broker_id", broker)
    _setattr(md, "event_timestamp_ms", event_ts)
    _setattr(md, "segment_size_bytes", size)
    _setattr(md, "segment_leader_epochs", view.epochs)
    custom = None if c == 0 else raw[cp + 1:cp + c]
    if c > 4 and custom[:4] == _MAGIC:       # canonical: an envelope (scan_segment checked it)
        custom = _unwrap(custom)[1]
    _setattr(md, "custom_metadata", custom)
    _setattr(md, "state", _SEGMENT_STATES[view.state])
    _setattr(md, "txn_index_empty", raw[view.state_pos + 1:] == _TXN_TRUE)
    _setattr(md, "broker_leader_epoch", view.broker_leader_epoch)
    return md
