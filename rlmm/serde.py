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

This module is the reference codec: :func:`encode` writes the canonical form, :func:`decode` reads any valid value
and names the field and byte position of any malformation. The fixed-size runs of the layout are the
:class:`Fields` below (one ``struct.Struct`` each, fields named as above); :mod:`rlmm.scan`, the metadata cache's
fast path over the canonical form, takes its offsets from them.
"""

from __future__ import annotations

import struct
import uuid
from enum import IntEnum

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

__all__ = ["BROKER_EVENT", "BROKER_EVENT_STATE", "EMPTY_TAGS", "EPOCH_ENTRY", "FRAME_VERSION", "HEADERS",
           "SCHEMA_VERSION", "SEGMENT_FIXED", "SEGMENT_SIZE", "SEGMENT_UUID", "STATE", "TXN_INDEX_EMPTY_TAGS",
           "UUID_PARTITION", "Fields", "MetadataApiKey", "decode", "decode_api_key", "encode", "nullable_bytes"]

FRAME_VERSION = 1
SCHEMA_VERSION = 0
SEGMENT_SCHEMA_VERSION_V1 = 1              # KIP-1266: RemoteLogSegmentMetadataRecord with BrokerLeaderEpoch
TAG_TXN_INDEX_EMPTY = 0
TAG_BROKER_LEADER_EPOCH = 1                # in SchemaVersion 1 only


class MetadataApiKey(IntEnum):
    REMOTE_LOG_SEGMENT_METADATA = 0
    REMOTE_LOG_SEGMENT_METADATA_UPDATE = 1
    REMOTE_PARTITION_DELETE_METADATA = 2


class Fields(struct.Struct):
    """A big-endian ``struct.Struct`` of named fields: ``offset[name]`` is a field's byte offset (from
    ``struct.calcsize``), so a reader that needs one field finds it by name, never by counting bytes."""

    __slots__ = ("fields", "offset")

    def __init__(self, *fields: tuple[str, str]) -> None:
        super().__init__(">" + "".join(fmt for _name, fmt in fields))
        self.fields = fields
        self.offset: dict[str, int] = {}
        for i, (name, _fmt) in enumerate(fields):
            if name in self.offset:
                raise ValueError(f"field {name} twice in {fields}")
            self.offset[name] = struct.calcsize(">" + "".join(fmt for _name, fmt in fields[:i]))

    def __add__(self, other: Fields) -> Fields:
        """These fields followed by ``other``'s."""
        return Fields(*self.fields, *other.fields)

    def prefixed(self, prefix: str) -> Fields:
        """The same fields, named ``prefix + name``."""
        return Fields(*((prefix + name, fmt) for name, fmt in self.fields))

    def part(self, first: str, last: str | None = None) -> Fields:
        """The run of fields from ``first`` to ``last`` (default: only ``first``), read at ``offset[first]``."""
        names = [name for name, _fmt in self.fields]
        return Fields(*self.fields[names.index(first):names.index(last or first) + 1])


# The fixed-size runs of the layout in the module docstring, in order of appearance.
UUID_PARTITION = Fields(("Id", "16s"), ("Partition", "i"))       # TopicIdPartitionEntry, after Name
SEGMENT_UUID = Fields(("Id", "16s"))                               # RemoteLogSegmentIdEntry, after TopicIdPartition
SEGMENT_FIXED = Fields(("StartOffset", "q"), ("EndOffset", "q"), ("BrokerId", "i"), ("MaxTimestampMs", "q"),
                       ("EventTimestampMs", "q"))                  # RemoteLogSegmentMetadataRecord
EPOCH_ENTRY = Fields(("LeaderEpoch", "i"), ("Offset", "q"))      # SegmentLeaderEpochs element, then its TAGS
SEGMENT_SIZE = Fields(("SegmentSizeInBytes", "i"))
STATE = Fields(("State", "b"))                                     # RemoteLogSegmentState (after CustomMetadata)
BROKER_EVENT = Fields(("BrokerId", "i"), ("EventTimestampMs", "q"))   # RemoteLogSegmentMetadataUpdateRecord
BROKER_EVENT_STATE = BROKER_EVENT + Fields(("RemotePartitionDeleteState", "b"))   # RemotePartitionDeleteMetadataRecord
EMPTY_TAGS = b"\x00"                                               # TAGS with no field
TXN_INDEX_EMPTY_TAGS = b"\x01\x00\x01\x01"                          # TAGS: 1 field, tag 0 (TxnIndexEmpty), size 1, true
_I32 = struct.Struct(">i")                                         # BrokerLeaderEpoch tag data


# --------------------------------------------------------------------------------------------------- encode
_uvarint = envelope.uvarint
_wrap = envelope.wrap
_unwrap = envelope.unwrap
HEADERS = {k: _uvarint(FRAME_VERSION) + _uvarint(k) + _uvarint(SCHEMA_VERSION) for k in MetadataApiKey}
"""FrameVersion, ApiKey and SchemaVersion as :func:`encode` writes them, by api key."""


def _tp(tp: TopicIdPartition) -> bytes:
    name = tp.topic.encode("utf-8")
    return _uvarint(len(name) + 1) + name + UUID_PARTITION.pack(tp.topic_id.bytes, tp.partition) + EMPTY_TAGS


def _segment_id(sid: RemoteLogSegmentId) -> bytes:
    return _tp(sid.topic_id_partition) + SEGMENT_UUID.pack(sid.id.bytes) + EMPTY_TAGS


def nullable_bytes(value: bytes | None) -> bytes:
    """A ``compact_nullable_bytes`` field."""
    return b"\x00" if value is None else _uvarint(len(value) + 1) + bytes(value)


def encode(metadata: RemoteLogMetadata) -> bytes:
    """The record value Kafka's ``RemoteLogMetadataSerde.serialize`` writes for ``metadata``."""
    if isinstance(metadata, RemoteLogSegmentMetadata):
        md = metadata
        parts = [HEADERS[MetadataApiKey.REMOTE_LOG_SEGMENT_METADATA], _segment_id(md.remote_log_segment_id),
                 SEGMENT_FIXED.pack(md.start_offset, md.end_offset_inclusive, md.broker_id, md.max_timestamp_ms,
                                    md.event_timestamp_ms),
                 _uvarint(len(md.segment_leader_epochs) + 1)]
        parts.extend(EPOCH_ENTRY.pack(e, o) + EMPTY_TAGS for e, o in md.segment_leader_epochs)
        parts += [SEGMENT_SIZE.pack(md.segment_size_bytes),
                  nullable_bytes(_wrap(md.broker_leader_epoch, md.custom_metadata)),
                  STATE.pack(md.state),
                  TXN_INDEX_EMPTY_TAGS if md.txn_index_empty else EMPTY_TAGS]
        return b"".join(parts)
    if isinstance(metadata, RemoteLogSegmentMetadataUpdate):
        u = metadata
        return b"".join((HEADERS[MetadataApiKey.REMOTE_LOG_SEGMENT_METADATA_UPDATE],
                         _segment_id(u.remote_log_segment_id),
                         BROKER_EVENT.pack(u.broker_id, u.event_timestamp_ms),
                         nullable_bytes(_wrap(None, u.custom_metadata)),
                         STATE.pack(u.state), EMPTY_TAGS))
    if isinstance(metadata, RemotePartitionDeleteMetadata):
        p = metadata
        return b"".join((HEADERS[MetadataApiKey.REMOTE_PARTITION_DELETE_METADATA], _tp(p.topic_id_partition),
                         BROKER_EVENT_STATE.pack(p.broker_id, p.event_timestamp_ms, p.state), EMPTY_TAGS))
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
        tid, partition = self.unpack(UUID_PARTITION, f"{field}.Id/Partition")
        self.tags(field)
        return TopicIdPartition(uuid.UUID(bytes=tid), name, partition)

    def segment_id(self) -> RemoteLogSegmentId:
        tp = self.tp("RemoteLogSegmentId.TopicIdPartition")
        (sid,) = self.unpack(SEGMENT_UUID, "RemoteLogSegmentId.Id")
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
    start, end, broker, max_ts, event_ts = r.unpack(SEGMENT_FIXED, "StartOffset..EventTimestampMs")
    n_pos = r.pos
    n = r.uvarint("SegmentLeaderEpochs.Length") - 1
    if n < 0:
        raise r.fail("SegmentLeaderEpochs", "null array in a non-nullable field", n_pos)
    if n * (EPOCH_ENTRY.size + len(EMPTY_TAGS)) > r.end - r.pos:
        raise r.fail("SegmentLeaderEpochs", f"{n} entries do not fit in {r.end - r.pos} bytes", n_pos)
    epochs = []
    for i in range(n):
        epochs.append(r.unpack(EPOCH_ENTRY, f"SegmentLeaderEpochs[{i}]"))
        r.tags(f"SegmentLeaderEpochs[{i}]")
    (size,) = r.unpack(SEGMENT_SIZE, "SegmentSizeInBytes")
    broker_epoch, custom = _unwrap(r.nullable_bytes("CustomMetadata"))
    state_pos = r.pos
    (state,) = r.unpack(STATE, "RemoteLogSegmentState")
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
    broker, event_ts = r.unpack(BROKER_EVENT, "BrokerId/EventTimestampMs")
    _epoch, custom = _unwrap(r.nullable_bytes("CustomMetadata"))
    state_pos = r.pos
    (state,) = r.unpack(STATE, "RemoteLogSegmentState")
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
    state_pos = r.pos + BROKER_EVENT_STATE.offset["RemotePartitionDeleteState"]
    broker, event_ts, state = r.unpack(BROKER_EVENT_STATE, "BrokerId/EventTimestampMs/RemotePartitionDeleteState")
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
    r = _Reader(value)
    api_key = _header(r)
    return _DECODERS[api_key](r)
