"""The metadata cache's fast path over the canonical form of :mod:`rlmm.serde`'s record values.

The cache applies records without building value objects: it needs raw ids, offsets and the byte positions of the
fields an update replaces. The scanners here accept only the canonical shape :func:`rlmm.serde.encode` writes and
check everything :func:`rlmm.serde.decode` checks; anything else goes through ``decode``, which raises the precise
error or yields a value that is re-encoded canonically. So :func:`scan_segment` and :func:`scan_update` raise only
:class:`rlmm.api.CorruptMetadataRecordError`, and their views agree with ``decode``.

The layout is :mod:`rlmm.serde`'s (its docstring, in ``Name => Type`` notation, and its :class:`rlmm.serde.Fields`);
every offset here comes from those structs. The canonical shape narrows it: every uvarint is one byte (names shorter
than 127 bytes, fewer than 126 leader epochs, CustomMetadata shorter than 127 bytes), every TAGS section is empty
(``0x00``) except a segment record's own, which is empty or holds only TxnIndexEmpty, and CustomMetadata is what
:func:`rlmm.envelope.wrap` writes. A canonical RemoteLogSegmentMetadataRecord reads as::

    Header => FrameVersion ApiKey SchemaVersion            (serde.HEADERS)
    Name => length:uint8 bytes[length - 1]
    Ids => Id Partition TAGS(0x00) Id TAGS(0x00)             (_IDS: serde.UUID_PARTITION, serde.SEGMENT_UUID)
    serde.SEGMENT_FIXED                                      (SegmentView.broker_pos: its BrokerId)
    SegmentLeaderEpochs => count:uint8 (LeaderEpoch Offset TAGS(0x00))*   (_EPOCH: serde.EPOCH_ENTRY)
    serde.SEGMENT_SIZE
    CustomMetadata => length:uint8 bytes[length - 1]        (SegmentView.custom_pos)
    serde.STATE                                              (SegmentView.state_pos)
    TAGS

and a RemoteLogSegmentMetadataUpdateRecord as Header Name Ids serde.BROKER_EVENT CustomMetadata serde.STATE
TAGS(0x00).
"""

from __future__ import annotations

import struct
import uuid
from typing import NamedTuple

from rlmm import envelope, serde
from rlmm.api import (
    CorruptMetadataRecordError,
    RemoteLogMetadata,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)

__all__ = ["SegmentView", "UpdateView", "api_key_of", "decode", "patch_segment", "scan_segment", "scan_update",
           "segment_from_view"]


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


_Key = serde.MetadataApiKey
_SEG_HEAD = serde.HEADERS[_Key.REMOTE_LOG_SEGMENT_METADATA]
_UPD_HEAD = serde.HEADERS[_Key.REMOTE_LOG_SEGMENT_METADATA_UPDATE]
_HEAD_SIZE = len(_SEG_HEAD)
_UVARINT_1 = 1                             # a canonical length or count: one uvarint byte, < 0x80
_TAGS = serde.Fields(("TAGS", "B"))        # a canonical nested TAGS section: count 0
_IDS = (serde.UUID_PARTITION + _TAGS).prefixed("TopicIdPartition.") + serde.SEGMENT_UUID + _TAGS
_EPOCH = serde.EPOCH_ENTRY + _TAGS
_BROKER_AT = serde.SEGMENT_FIXED.offset["BrokerId"]
_BROKER_TIMES = serde.SEGMENT_FIXED.part("BrokerId", "EventTimestampMs")
_BROKER_ID = serde.SEGMENT_FIXED.part("BrokerId")
_EVENT_TS = serde.SEGMENT_FIXED.part("EventTimestampMs")
_EVENT_AFTER_BROKER = serde.SEGMENT_FIXED.offset["EventTimestampMs"] - _BROKER_AT
# a segment record's own TAGS: none, TxnIndexEmpty false (read, never written), TxnIndexEmpty true
_TAIL_TAGS = (serde.EMPTY_TAGS, serde.TXN_INDEX_EMPTY_TAGS[:-1] + b"\x00", serde.TXN_INDEX_EMPTY_TAGS)
_MAGIC = envelope.MAGIC
_canonical_epoch = envelope.canonical_epoch
_wrap = envelope.wrap
_IDS_AT = _IDS.unpack_from
_FIXED_AT = serde.SEGMENT_FIXED.unpack_from
_EPOCH_AT = _EPOCH.unpack_from
_SIZE_AT = serde.SEGMENT_SIZE.unpack_from
_BROKER_EVENT_AT = serde.BROKER_EVENT.unpack_from
_BROKER_TIMES_AT = _BROKER_TIMES.unpack_from
_SCAN_ERRORS = (IndexError, struct.error, UnicodeDecodeError)
# sizes as plain ints: the hot loops read module globals, not attributes
_IDS_SIZE = _IDS.size
_FIXED_SIZE = serde.SEGMENT_FIXED.size
_EPOCH_SIZE = _EPOCH.size
_SEGMENT_SIZE_SIZE = serde.SEGMENT_SIZE.size
_BROKER_EVENT_SIZE = serde.BROKER_EVENT.size
_STATE_SIZE = serde.STATE.size
_MAGIC_SIZE = len(_MAGIC)
_MAGIC_FIRST = _MAGIC[0]
_N_STATES = len(RemoteLogSegmentState)
_N_API_KEYS = len(_Key)
_EMPTY_TAGS = serde.EMPTY_TAGS
# NamedTuple views built by tuple.__new__ itself: the generated __new__ and _make are Python frames, one per record
_tuple_new = tuple.__new__
_TXN_INDEX_EMPTY_TAGS = serde.TXN_INDEX_EMPTY_TAGS


def api_key_of(value: bytes) -> int:
    """The api key of a record value (fast for the canonical header; checked like ``serde.decode``)."""
    if len(value) > _HEAD_SIZE and value[0] == serde.FRAME_VERSION and value[1] < _N_API_KEYS \
            and value[2] == serde.SCHEMA_VERSION:
        return value[1]
    return serde.decode_api_key(value)


def _ids(buf: bytes) -> tuple[bytes, int, bytes, int] | None:
    """TopicId, Partition, SegmentId and the position after RemoteLogSegmentId, canonical shape only."""
    n = buf[_HEAD_SIZE]
    if n == 0 or n >= 0x80:
        return None
    p = _HEAD_SIZE + n                     # the name's length byte, then n - 1 bytes
    buf[_HEAD_SIZE + _UVARINT_1:p].decode("utf-8")
    tid, part, tp_tags, sid, sid_tags = _IDS_AT(buf, p)
    if tp_tags or sid_tags:
        return None
    return tid, part, sid, p + _IDS_SIZE


def _scan_segment_fast(buf: bytes) -> SegmentView | None:
    if buf[:_HEAD_SIZE] != _SEG_HEAD:
        return None
    ids = _ids(buf)
    if ids is None:
        return None
    tid, part, sid, p = ids
    start, end, _broker, _max_ts, _event = _FIXED_AT(buf, p)
    broker_pos = p + _BROKER_AT
    p += _FIXED_SIZE
    n = buf[p] - 1
    if n < 1 or n >= 0x7F:
        return None
    p += _UVARINT_1
    epochs = []
    last_e = last_o = -(1 << 64)
    for _ in range(n):
        e, o, tags = _EPOCH_AT(buf, p)
        if tags or e <= last_e or o < last_o:
            return None
        epochs.append((e, o))
        last_e, last_o = e, o
        p += _EPOCH_SIZE
    p += _SEGMENT_SIZE_SIZE
    custom_pos = p
    c = buf[p]
    if c >= 0x80:
        return None
    broker_epoch = None
    if c > _MAGIC_SIZE and buf[p + 1] == _MAGIC_FIRST and buf[p + 1:p + 1 + _MAGIC_SIZE] == _MAGIC:
        try:
            broker_epoch = _canonical_epoch(buf, p + 1, p + c)
        except envelope.NotCanonicalError:
            return None
    p += c if c else _UVARINT_1
    state = buf[p]
    if state >= _N_STATES or start < 0 or end < start or epochs[0][1] < start or last_o > end:
        return None
    if buf[p + _STATE_SIZE:] not in _TAIL_TAGS:
        return None
    return _tuple_new(SegmentView, (buf, tid, part, sid, start, end, tuple(epochs), broker_pos, custom_pos, p, state,
                                    broker_epoch))


def scan_segment(value: bytes) -> SegmentView:
    """Scan a RemoteLogSegmentMetadataRecord; raises only CorruptMetadataRecordError (like ``serde.decode``)."""
    try:
        view = _scan_segment_fast(value)
    except _SCAN_ERRORS:
        view = None
    if view is not None:
        return view
    md = serde.decode(value)
    if not isinstance(md, RemoteLogSegmentMetadata):
        raise CorruptMetadataRecordError(f"RemoteLogMetadata.ApiKey at byte 1: expected a segment record, found "
                                         f"{type(md).__name__}")
    view = _scan_segment_fast(serde.encode(md))
    if view is None:   # e.g. a topic name of 127+ bytes: no fast shape; positions from a careful re-encoding
        view = _scan_canonical(md)
    return view


def _scan_canonical(md: RemoteLogSegmentMetadata) -> SegmentView:
    raw = serde.encode(md)
    tail = len(serde.TXN_INDEX_EMPTY_TAGS if md.txn_index_empty else serde.EMPTY_TAGS)
    state_pos = len(raw) - tail - serde.STATE.size
    custom_len = len(serde.nullable_bytes(_wrap(md.broker_leader_epoch, md.custom_metadata)))
    custom_pos = state_pos - custom_len
    n = len(md.segment_leader_epochs)
    fixed_pos = custom_pos - serde.SEGMENT_SIZE.size - n * _EPOCH.size - len(envelope.uvarint(n + 1)) \
        - serde.SEGMENT_FIXED.size
    sid = md.remote_log_segment_id
    return SegmentView(raw, sid.topic_id_partition.topic_id.bytes, sid.topic_id_partition.partition, sid.id.bytes,
                       md.start_offset, md.end_offset_inclusive, md.segment_leader_epochs, fixed_pos + _BROKER_AT,
                       custom_pos, state_pos, int(md.state), md.broker_leader_epoch)


def scan_update(value: bytes) -> UpdateView:
    """Scan a RemoteLogSegmentMetadataUpdateRecord; raises only CorruptMetadataRecordError."""
    try:
        if value[:_HEAD_SIZE] == _UPD_HEAD:
            ids = _ids(value)
            if ids is not None:
                tid, part, sid, p = ids
                broker, event_ts = _BROKER_EVENT_AT(value, p)
                p += _BROKER_EVENT_SIZE
                c = value[p]
                end = p + (c if c else _UVARINT_1)
                if c < 0x80 and 1 <= value[end] < _N_STATES and value[end + _STATE_SIZE:] == _EMPTY_TAGS \
                        and not (c > _MAGIC_SIZE and value[p + 1:p + 1 + _MAGIC_SIZE] == _MAGIC):
                    # (an envelope is canonicalised below)
                    return _tuple_new(UpdateView, (tid, part, sid, broker, event_ts, value[p:end], value[end],
                                                   value[p + 1:end] if c else None))
    except _SCAN_ERRORS:
        pass
    u = serde.decode(value)
    if not isinstance(u, RemoteLogSegmentMetadataUpdate):
        raise CorruptMetadataRecordError(f"RemoteLogMetadata.ApiKey at byte 1: expected an update record, found "
                                         f"{type(u).__name__}")
    sid = u.remote_log_segment_id
    return UpdateView(sid.topic_id_partition.topic_id.bytes, sid.topic_id_partition.partition, sid.id.bytes,
                      u.broker_id, u.event_timestamp_ms, serde.nullable_bytes(_wrap(None, u.custom_metadata)),
                      int(u.state), u.custom_metadata)




def patch_segment(view: SegmentView, update: UpdateView) -> SegmentView:
    """The segment record after ``update``: BrokerId, EventTimestampMs, the RSM's CustomMetadata and state replaced;
    the broker leader epoch in the CustomMetadata envelope is kept."""
    raw = view.value
    bp, cp, sp = view.broker_pos, view.custom_pos, view.state_pos
    broker_epoch = view.broker_leader_epoch
    custom = update.custom_field if broker_epoch is None else serde.nullable_bytes(_wrap(broker_epoch,
                                                                                         update.custom_metadata))
    if len(custom) == sp - cp:                      # the usual case: patch in place
        buf = bytearray(raw)
        buf[cp:sp] = custom
    else:
        buf = bytearray().join((raw[:cp], custom, raw[sp:]))
        sp = cp + len(custom)
    _BROKER_ID.pack_into(buf, bp, update.broker_id)
    _EVENT_TS.pack_into(buf, bp + _EVENT_AFTER_BROKER, update.event_timestamp_ms)
    buf[sp] = update.state
    return _tuple_new(SegmentView, (bytes(buf), view[1], view[2], view[3], view[4], view[5], view[6], bp, cp, sp,
                                    update.state, broker_epoch))


# Value objects from a scanned (hence already validated) record, without re-running the dataclass checks: each field
# set through its slot's own setter (``member_descriptor.__set__``, bound once here). ``object.__setattr__`` looks the
# name up in the class on every call: ~2x the cost of a set, and a lookup sets ~20 fields (issue 26).
_object_new = object.__new__
_SAFE_UNKNOWN = uuid.SafeUUID.unknown
_SEGMENT_STATES = tuple(RemoteLogSegmentState)


def _slot_setters(cls: type, *names: str) -> tuple:
    """The setters of ``cls``'s slots ``names``, in that order (a frozen dataclass's own ``__setattr__`` refuses)."""
    return tuple(getattr(cls, name).__set__ for name in names)


_uuid_int, _uuid_safe = _slot_setters(uuid.UUID, "int", "is_safe")
_tp_topic_id, _tp_topic, _tp_partition = _slot_setters(TopicIdPartition, "topic_id", "topic", "partition")
_sid_tp, _sid_id = _slot_setters(RemoteLogSegmentId, "topic_id_partition", "id")
(_md_sid, _md_start, _md_end, _md_max_ts, _md_broker, _md_event_ts, _md_size, _md_epochs, _md_custom, _md_state,
 _md_txn_empty, _md_broker_epoch) = _slot_setters(
    RemoteLogSegmentMetadata, "remote_log_segment_id", "start_offset", "end_offset_inclusive", "max_timestamp_ms",
    "broker_id", "event_timestamp_ms", "segment_size_bytes", "segment_leader_epochs", "custom_metadata", "state",
    "txn_index_empty", "broker_leader_epoch")


def _uuid(raw: bytes) -> uuid.UUID:
    u = _object_new(uuid.UUID)
    _uuid_int(u, int.from_bytes(raw, "big"))
    _uuid_safe(u, _SAFE_UNKNOWN)
    return u


def segment_from_view(view: SegmentView) -> RemoteLogSegmentMetadata:
    """The value object of a scanned segment record (the fields ``scan_segment`` already checked)."""
    raw = view.value
    broker, max_ts, event_ts = _BROKER_TIMES_AT(raw, view.broker_pos)
    cp = view.custom_pos
    (size,) = _SIZE_AT(raw, cp - _SEGMENT_SIZE_SIZE)
    c = raw[cp]
    name_end = view.broker_pos - _BROKER_AT - _IDS_SIZE
    tp = _object_new(TopicIdPartition)
    _tp_topic_id(tp, _uuid(view.topic_id))
    _tp_topic(tp, raw[_HEAD_SIZE + _UVARINT_1:name_end].decode("utf-8"))
    _tp_partition(tp, view.partition)
    sid = _object_new(RemoteLogSegmentId)
    _sid_tp(sid, tp)
    _sid_id(sid, _uuid(view.segment_id))
    md = _object_new(RemoteLogSegmentMetadata)
    _md_sid(md, sid)
    _md_start(md, view.start_offset)
    _md_end(md, view.end_offset_inclusive)
    _md_max_ts(md, max_ts)
    _md_broker(md, broker)
    _md_event_ts(md, event_ts)
    _md_size(md, size)
    _md_epochs(md, view.epochs)
    custom = None if c == 0 else raw[cp + 1:cp + c]
    if c > _MAGIC_SIZE and custom[:_MAGIC_SIZE] == _MAGIC:       # canonical: an envelope (scan_segment checked it)
        custom = envelope.unwrap(custom)[1]
    _md_custom(md, custom)
    _md_state(md, _SEGMENT_STATES[view.state])
    _md_txn_empty(md, raw[view.state_pos + _STATE_SIZE:] == _TXN_INDEX_EMPTY_TAGS)
    _md_broker_epoch(md, view.broker_leader_epoch)
    return md


def decode(value: bytes | memoryview | None) -> RemoteLogMetadata:
    """``serde.decode(value)``, through the scanner for a canonical segment record (what the cache stores)."""
    if type(value) is bytes and value[:_HEAD_SIZE] == _SEG_HEAD:
        try:
            view = _scan_segment_fast(value)
        except _SCAN_ERRORS:
            view = None
        if view is not None:
            return segment_from_view(view)
    return serde.decode(value)
