"""The message codecs of the listener, by kio: request bodies decoded, response bodies built and encoded.

Messages are encoded and decoded by `kio <https://github.com/Aiven-Open/kio>`_ (Aiven, Apache-2.0): immutable
dataclasses generated from the very message JSON schemas Kafka builds its own protocol classes from
(``clients/src/main/resources/common/message``), every version, flexible versions and tagged fields included, with
a compiled reader. We chose it over kafka-python's hand-written structures (which stop at older versions: Fetch v13+
with topic ids, the versions current clients prefer, are missing) and over generating codecs from the kafka-clients
jar ourselves (a code generator to keep). Framing (size prefix, headers) is :mod:`rlm.listener.protocol.frame`.

Handlers build version-independent values (dicts and lists named as the schema's fields); :func:`build` turns them
into the kio entity of the version asked for, keeping the fields that version has.

Large requests and answers must not hold the GIL (so the listener's event loop) in one piece. kio's reader is native
code: one ``entity_reader`` call decodes a whole frame holding the GIL throughout (about 50 ms for a 4.8 MB Fetch of
300,000 partitions, 1 s for a 100 MiB one). So :func:`decode_request` with ``keep`` decodes every array of structs
an item at a time (kio's native reader per item, a few microseconds each; the interpreter may switch threads between
items), and :func:`build` with ``keep`` lists what it makes: dropping a request or an answer of hundreds of
thousands of entities frees them all in one deallocation holding the GIL (tens of ms); with their items held in
``keep``, the entity's drop only lowers reference counts, and :func:`free_gradually` frees ``keep`` a slice at a time.
"""

from __future__ import annotations

import datetime
import functools
import io
import struct
import types
import typing
import uuid
from collections.abc import Mapping
from dataclasses import MISSING, Field, dataclass, fields, is_dataclass
from typing import Any

from kio.index import load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import EntityTupleField, PrimitiveTupleField, classify_field, get_field_tag, is_optional
from kio.serial._parse import get_field_reader
from kio.serial.readers import read_compact_array_length, read_legacy_array_length, read_unsigned_varint

from rlm.listener.protocol.frame import SIZE, BadRequestError, RequestHeader, request_schema, response_header
from rsm.log.batch import RecordParts

__all__ = [
    "ErrorCode",
    "build",
    "decode_request",
    "decode_response",
    "new_request",
    "encode_fetch_response",
    "fetch_response_parts",
    "encode_response",
    "error_body",
    "FetchAnswer",
    "fetch_answer",
    "fetch_records_end",
    "fetch_sessionless",
    "free_gradually",
    "last_offset",
    "produce_acks",
    "produce_names_leaders",
    "response_type",
    "warm_schemas",
]


def decode_request(frame: bytes, header: RequestHeader, *, keep: list[Any] | None = None) -> Any:
    """The request body as kio's entity of the header's api key and version. With ``keep``, arrays of structs are
    decoded an item at a time, and their items appended to ``keep`` (to be freed by :func:`free_gradually` once the
    entity is dropped): for large frames, so that no one call holds the GIL for the whole frame."""
    try:
        schema = request_schema(header.api_key, header.api_version)
    except Exception as err:  # noqa: BLE001
        raise BadRequestError(f"api key {header.api_key} version {header.api_version}: {err}", header) from None
    try:
        if keep is None:
            body, _size = entity_reader(schema)(frame, header.body_offset)
        else:
            body, _size = _read_sliced(schema, frame, header.body_offset, keep)
    except Exception as err:  # noqa: BLE001 - kio raises ValueError/IndexError/... on bad bytes
        raise BadRequestError(f"{schema.__name__} v{header.api_version}: cannot decode: {err}", header) from None
    null = _null_array(body, schema)
    if null is not None:
        raise BadRequestError(f"{schema.__name__} v{header.api_version}: non-nullable array {null} is null", header)
    # Bytes after the body are ignored, as Kafka's broker does (AbstractRequest.parseRequest reads the message
    # and never checks the buffer's remainder): librdkafka's all-topics Metadata v12 carries 3 of them.
    return body


@functools.cache
def _arrays(entity_type: type) -> tuple[tuple[str, bool, type | None], ...]:
    """The array fields of an entity type: (name, nullable, item type when it is a struct that holds arrays itself)."""
    out = []
    for f in fields(entity_type):
        cls = classify_field(f)
        if isinstance(cls, EntityTupleField):
            out.append((f.name, is_optional(f), cls.type_ if _arrays(cls.type_) else None))
        elif isinstance(cls, PrimitiveTupleField):
            out.append((f.name, is_optional(f), None))
    return tuple(out)


def _null_array(entity: Any, entity_type: type) -> str | None:
    """The name of the first array that is null where the schema says it may not be, else None. kio reads a null
    array (length -1) into None whatever the schema, where Kafka's parser refuses a non-nullable one: a handler
    iterating it would fail. Only arrays of structs that hold arrays are walked (a Fetch's topics, not its
    hundreds of thousands of partitions)."""
    for name, nullable, item_type in _arrays(entity_type):
        value = getattr(entity, name)
        if value is None:
            if not nullable:
                return name
        elif item_type is not None:
            for item in value:
                inner = _null_array(item, item_type)
                if inner is not None:
                    return f"{name}[].{inner}"
    return None


@dataclass(frozen=True, slots=True)
class _Layout:
    """How :func:`_read_sliced` reads one entity type: its fields in wire order, each with kio's native reader, or
    the item type of an array of structs (read an item at a time); its tagged fields by tag."""

    flexible: bool
    fields: tuple[tuple[str, Any, type | None], ...]  # (name, reader, item type of an array of structs or None)
    tagged: dict[int, tuple[str, Any]]  # tag -> (name, reader)
    defaults: dict[str, Any]  # tagged fields without a dataclass default: kio's implicit one


@functools.cache
def _layout(entity_type: type) -> _Layout | None:
    """The entity's layout when it (or a struct in it) has an array of structs; None: kio reads it whole."""
    flexible = bool(entity_type.__flexible__)
    plain: list[tuple[str, Any, type | None]] = []
    tagged: dict[int, tuple[str, Any]] = {}
    defaults: dict[str, Any] = {}
    arrays = False
    for f in fields(entity_type):
        tag = get_field_tag(f)
        if tag is not None:
            tagged[tag] = (f.name, get_field_reader(entity_type, f, False, True))
            if f.default is MISSING and f.default_factory is MISSING:
                defaults[f.name] = get_tagged_field_default(f)
            continue
        cls = classify_field(f)
        if isinstance(cls, EntityTupleField):
            arrays = True
            plain.append((f.name, None, cls.type_))
        else:
            plain.append((f.name, get_field_reader(entity_type, f, False, False), None))
    return _Layout(flexible, tuple(plain), tagged, defaults) if arrays else None


def _read_sliced(entity_type: type, frame: bytes, offset: int, keep: list[Any]) -> tuple[Any, int]:
    """As kio's ``entity_reader(entity_type)(frame, offset)``, the arrays of structs an item at a time (each item
    appended to ``keep``)."""
    layout = _layout(entity_type)
    if layout is None:
        return entity_reader(entity_type)(frame, offset)
    pos = offset
    values: dict[str, Any] = {}
    for name, reader, item_type in layout.fields:
        if item_type is None:
            values[name], n = reader(frame, pos)
            pos += n
            continue
        count, n = (read_compact_array_length if layout.flexible else read_legacy_array_length)(frame, pos)
        pos += n
        if count is None or count < 0:
            values[name] = None
            continue
        if count > len(frame) - pos:  # each item takes a byte at least
            raise ValueError(f"{entity_type.__name__}.{name}: {count} items in {len(frame) - pos} bytes")
        items = []
        for _ in range(count):
            item, n = _read_sliced(item_type, frame, pos, keep)
            pos += n
            items.append(item)
        keep.extend(items)
        values[name] = tuple(items)
    if layout.flexible:
        tags, n = read_unsigned_varint(frame, pos)
        pos += n
        for _ in range(tags):
            tag, n = read_unsigned_varint(frame, pos)
            pos += n
            size, n = read_unsigned_varint(frame, pos)
            pos += n
            if tag in layout.tagged:
                name, reader = layout.tagged[tag]
                values[name], _n = reader(frame, pos)
            pos += size
        for name, default in layout.defaults.items():
            values.setdefault(name, default)
    return entity_type(**values), pos - offset


def free_gradually(obj: Any, step: int = 1024) -> None:
    """Empty ``obj`` (a list, or a dict of lists and dicts, as handlers' values are: a few topics, each with many
    partitions) a slice of ``step`` items at a time, so that freeing hundreds of thousands of objects never holds
    the GIL for more than one slice. The dicts of a short list are emptied too (a topic's dict holds its partitions);
    those of a long one are freed with their slice (a partition's dict holds a few values)."""
    if isinstance(obj, dict):
        for value in obj.values():
            if isinstance(value, (dict, list)):
                free_gradually(value, step)
        obj.clear()
    elif isinstance(obj, list):
        short = len(obj) <= step
        while obj:
            for value in obj[-step:]:
                if isinstance(value, list) and len(value) > step or isinstance(value, dict) and short:
                    free_gradually(value, step)
            del obj[-step:]


def decode_response(frame: bytes, header: RequestHeader) -> Any:
    """A response frame (without its size prefix) to ``header``'s request, as kio's entity of its version (a
    broker's answer the proxy rewrites). Raises :class:`BadRequestError` when it does not decode."""
    rtype = response_type(header)
    if rtype is None:
        raise BadRequestError(f"api key {header.api_key} version {header.api_version}: no response schema", header)
    try:
        _header, offset = entity_reader(rtype.__header_schema__)(frame, 0)
        body, _size = entity_reader(rtype)(frame, offset)
    except Exception as err:  # noqa: BLE001 - kio raises ValueError/IndexError/... on bad bytes
        raise BadRequestError(f"{rtype.__name__} v{header.api_version}: cannot decode: {err}", header) from None
    return body


def new_request(api_key: int, api_version: int, correlation_id: int, client_id: str, values: Mapping[str, Any]
                ) -> tuple[bytes, RequestHeader]:
    """A request of our own (the proxy asking its broker), size prefix included, and its header."""
    rtype = request_schema(api_key, api_version)
    header_type = rtype.__header_schema__
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    entity_writer(header_type)(out, build(header_type, {
        "request_api_key": api_key, "request_api_version": api_version, "correlation_id": correlation_id,
        "client_id": client_id}))
    body_offset = out.tell() - 4
    entity_writer(rtype)(out, build(rtype, values))
    data = out.getbuffer()
    SIZE.pack_into(data, 0, len(data) - 4)
    encoded = bytes(data)
    data.release()
    return encoded, RequestHeader(api_key, api_version, correlation_id, client_id, bool(rtype.__flexible__),
                                  body_offset)


# Produce => transactional_id acks ...: a nullable string, int16 length (-1: null) before v9, compact (unsigned varint
# length + 1, 0: null) from v9 (flexible); then acks int16.
PRODUCE_FIRST_FLEXIBLE = 9


def produce_acks(frame: bytes, header: RequestHeader) -> int:
    """The ``acks`` of a Produce request, read without decoding its records (0: the broker sends no answer)."""
    pos = header.body_offset
    try:
        if header.api_version >= PRODUCE_FIRST_FLEXIBLE:
            n, shift = 0, 0
            while True:
                b = frame[pos]
                pos += 1
                n |= (b & 0x7F) << shift
                shift += 7
                if not b & 0x80:
                    break
            pos += max(n - 1, 0)
        else:
            (n,) = struct.unpack_from(">h", frame, pos)
            pos += 2 + max(n, 0)
        (acks,) = struct.unpack_from(">h", frame, pos)
    except (IndexError, struct.error):
        raise BadRequestError(f"Produce v{header.api_version}: truncated before acks", header) from None
    return acks


# ProduceResponse v10+ (KIP-951): ``node_endpoints``, the addresses of the leaders named in partitions answered
# NOT_LEADER_OR_FOLLOWER, is a top-level tagged field, after every partition's answer.
PRODUCE_FIRST_LEADERS = 10
PRODUCE_FIRST_TOPIC_ID = 13  # topics by id (16 bytes) instead of by name
_PARTITION_FIXED = 4 + 2 + 8 + 8 + 8  # index, error_code, base_offset, log_append_time_ms, log_start_offset
_PARTITION_PLAIN_END = b"\x01\x00\x00"  # then no record_errors, a null error_message, no tagged fields


def produce_names_leaders(answer: bytes | memoryview, header: RequestHeader) -> bool:
    """Whether a broker's Produce answer (without its size prefix) to ``header``'s request has top-level tagged
    fields (``node_endpoints``: broker addresses), walked to without decoding it: one varint or fixed-size skip per
    field, so the common answer (no leader moved) passes as the broker's bytes. Raises :class:`BadRequestError` on a
    truncated answer."""
    if header.api_version < PRODUCE_FIRST_LEADERS:
        return False
    by_id = header.api_version >= PRODUCE_FIRST_TOPIC_ID
    try:
        pos = _skip_tags(answer, 4)  # correlation id, response header v1's tagged fields
        topics, pos = _uvarint(answer, pos)
        for _ in range(topics - 1):
            pos = pos + 16 if by_id else _skip_compact(answer, pos)
            partitions, pos = _uvarint(answer, pos)
            for _ in range(partitions - 1):
                pos += _PARTITION_FIXED
                if answer[pos:pos + 3] == _PARTITION_PLAIN_END:  # the common answer: one compare
                    pos += len(_PARTITION_PLAIN_END)
                    continue
                errors, pos = _uvarint(answer, pos)
                for _ in range(errors - 1):
                    pos = _skip_tags(answer, _skip_compact(answer, pos + 4))  # batch_index, message
                pos = _skip_tags(answer, _skip_compact(answer, pos))  # error_message; current_leader (tag 0)
            pos = _skip_tags(answer, pos)
        pos += 4  # throttle_time_ms
        tags, _pos = _uvarint(answer, pos)
    except IndexError:
        raise BadRequestError(f"ProduceResponse v{header.api_version}: truncated", header) from None
    return tags > 0


# Fetch (the proxy's live path, :mod:`rlm.listener.upstream.proxy`): the request forwarded as the client's bytes with
# its session fields set to "no session", the answer walked, not decoded. Request body: [replica_id int32 before
# v15], max_wait_ms int32, min_bytes int32, max_bytes int32 (v3+), isolation_level int8 (v4+), session_id int32 and
# session_epoch int32 (v7+), then the topics.
FETCH_FIRST_SESSION = 7
FETCH_FIRST_FLEXIBLE = 12
FETCH_FIRST_TOPIC_ID = 13  # topics by id (16 bytes) instead of by name
FETCH_FIRST_NO_REPLICA_ID = 15  # replica_id moved to a tagged field (ReplicaState)
FETCH_FIRST_LEADERS = 16  # node_endpoints (KIP-951), a top-level tagged field
RECORDS_PART_MIN_BYTES = 32 << 10  # fetch_response_parts: smaller records are joined with the fields around them
_SESSION = struct.Struct(">ii")
_NO_SESSION = (0, -1)  # session id 0, epoch -1 (FINAL_EPOCH): a full fetch, no session made
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def fetch_sessionless(frame: bytes, header: RequestHeader) -> bytes:
    """A Fetch request (without its size prefix) as ``frame`` with session id 0 and epoch -1 (a full fetch, no
    session made: the proxy declines fetch sessions), patched in place of a copy; ``frame`` itself when it asks for
    no session already (librdkafka) or predates sessions (before v7). Raises :class:`BadRequestError` when the
    frame is too short to hold them."""
    if header.api_version < FETCH_FIRST_SESSION:
        return frame
    at = header.body_offset + (0 if header.api_version >= FETCH_FIRST_NO_REPLICA_ID else 4) + 13
    if at + _SESSION.size > len(frame):
        raise BadRequestError(f"Fetch v{header.api_version}: truncated before its session fields", header)
    if _SESSION.unpack_from(frame, at) == _NO_SESSION:
        return frame
    out = bytearray(frame)
    _SESSION.pack_into(out, at, *_NO_SESSION)
    return bytes(out)


@dataclass(frozen=True, slots=True)
class FetchAnswer:
    """What the proxy needs of a broker's Fetch answer, read by :func:`fetch_answer` without decoding it."""

    error_code: int  # the top-level error (v7+; 0 before)
    errors: tuple[tuple[Any, int, int], ...]  # (topic name before v13 / id from v13, partition, error) of errors
    names_leaders: bool  # top-level tagged fields (v16+ node_endpoints: broker addresses to rewrite)
    size: int  # the bytes walked (the answer's length when it is whole)

    def out_of_range(self) -> list[tuple[Any, int]]:
        return [(key, p) for key, p, code in self.errors if code == ErrorCode.offset_out_of_range.value]


def _fetch_answer_head(answer: bytes | memoryview, v: int) -> tuple[int, int]:
    """A Fetch answer's (v4+, without its size prefix) top-level error code (0 before v7) and the position of its
    topics array: after the correlation id (and the v12+ header's tagged fields), throttle time, error and session."""
    pos = _skip_tags(answer, 4) if v >= FETCH_FIRST_FLEXIBLE else 4  # correlation id, response header v1's tags
    pos += 4  # throttle_time_ms
    if v < FETCH_FIRST_SESSION:
        return 0, pos
    (error_code,) = _I16.unpack_from(answer, pos)
    return error_code, pos + 6  # error_code, session_id


def _skip_partition_head(answer: bytes | memoryview, pos: int, v: int) -> int:
    """The position of a Fetch answer partition's records field, from its start at ``pos``: its index and error,
    offsets, aborted transactions and preferred read replica skipped."""
    flexible = v >= FETCH_FIRST_FLEXIBLE
    pos += 6 + 8 + 8 + (8 if v >= 5 else 0)  # index, error, high watermark, last stable, log start offsets
    aborted, pos = _array_length(answer, pos, flexible)
    for _ in range(aborted):
        pos += 16  # producer_id, first_offset
        if flexible:
            pos = _skip_tags(answer, pos)
    return pos + 4 if v >= 11 else pos  # preferred_read_replica


def fetch_answer(answer: bytes | memoryview, header: RequestHeader, *,
                 max_partitions: int | None = None) -> FetchAnswer | None:
    """A broker's Fetch answer (without its size prefix) to ``header``'s request (v4+), walked field by field: a
    fixed-size skip or one length read per field, records skipped by their length, so the common answer (no error,
    no leader moved) passes as the broker's bytes. None when it has more than ``max_partitions`` partitions (the
    caller walks it on a worker instead of its event loop). Raises :class:`BadRequestError` on a truncated
    answer."""
    v = header.api_version
    flexible = v >= FETCH_FIRST_FLEXIBLE
    by_id = v >= FETCH_FIRST_TOPIC_ID
    errors: list[tuple[Any, int, int]] = []
    error_code = 0
    names_leaders = False
    try:
        error_code, pos = _fetch_answer_head(answer, v)
        topics, pos = _array_length(answer, pos, flexible)
        for _ in range(topics):
            if by_id:
                key: Any = uuid.UUID(bytes=bytes(answer[pos:pos + 16]))
                pos += 16
            else:
                key, pos = _string(answer, pos, flexible)
            partitions, pos = _array_length(answer, pos, flexible)
            if max_partitions is not None:
                max_partitions -= partitions
                if max_partitions < 0:
                    return None
            for _ in range(partitions):
                index, code = _INDEX_ERROR.unpack_from(answer, pos)
                if code:
                    errors.append((key, index, code))
                pos = _skip_partition_head(answer, pos, v)
                if flexible:
                    pos = _skip_compact(answer, pos)  # records
                    pos = _skip_tags(answer, pos)  # diverging_epoch, current_leader, snapshot_id
                else:
                    (n,) = _I32.unpack_from(answer, pos)
                    pos += 4 + max(n, 0)
            if flexible:
                pos = _skip_tags(answer, pos)
        if flexible:
            tags, _end = _uvarint(answer, pos)
            names_leaders = tags > 0 and v >= FETCH_FIRST_LEADERS
            pos = _skip_tags(answer, pos)
        if pos > len(answer):
            raise IndexError(pos)
    except (IndexError, struct.error):
        raise BadRequestError(f"FetchResponse v{v}: truncated", header) from None
    return FetchAnswer(error_code, tuple(errors), names_leaders, pos)


def fetch_records_end(answer: bytes | memoryview, header: RequestHeader) -> int | None:
    """Where the records of a broker's Fetch answer (without its size prefix) to ``header``'s request (v4+) end, read
    from as much of its start as has come, when it is an answer of one topic of one partition, with records and no
    error, top-level or the partition's: its bytes up to there are the same whatever the rest holds (the proxy's
    cut-through, :mod:`rlm.listener.upstream.relay`). None when it is not such an answer. Raises ``IndexError`` or
    ``struct.error`` when ``answer`` is too short to tell."""
    v = header.api_version
    flexible = v >= FETCH_FIRST_FLEXIBLE
    error_code, pos = _fetch_answer_head(answer, v)
    if error_code:
        return None
    topics, pos = _array_length(answer, pos, flexible)
    if topics != 1:
        return None
    if v >= FETCH_FIRST_TOPIC_ID:
        pos += 16
    else:
        _name, pos = _string(answer, pos, flexible)
    partitions, pos = _array_length(answer, pos, flexible)
    if partitions != 1:
        return None
    _index, code = _INDEX_ERROR.unpack_from(answer, pos)
    if code:
        return None
    pos = _skip_partition_head(answer, pos, v)
    if flexible:
        n, pos = _uvarint(answer, pos)
        n -= 1
    else:
        (n,) = _I32.unpack_from(answer, pos)
        pos += 4
    if pos > len(answer):
        raise IndexError(pos)
    return pos + n if n > 0 else None


def encode_fetch_response(header: RequestHeader, values: Mapping[str, Any]) -> bytes:
    """A Fetch answer (size prefix included) to ``header``'s request (v4+) from response values as the tier's fetch
    makes them: :func:`fetch_response_parts` joined (no ``records`` may be a streamed batch)."""
    parts, _ = fetch_response_parts(header, values)
    return b"".join(parts)


def fetch_response_parts(header: RequestHeader, values: Mapping[str, Any]) -> tuple[list[Any], int]:
    """A Fetch answer to ``header``'s request (v4+) as its parts, in order, and its size (size prefix included), from
    response values as the tier's fetch makes them (:func:`rlm.listener.tier.fetch.fetch`: top-level ``error_code``
    and ``session_id``, ``responses`` of ``topic`` / ``topic_id`` and ``partitions`` of index, error code, offsets,
    ``aborted_transactions`` (None or dicts) and ``records``), written field by field: joined, the bytes kio's
    encoding of :func:`build`'s entity gives (test: every version), without making the entities (build and kio's
    encoder were ~10% of a history Fetch's CPU). Tagged fields are written empty: such answers carry none (no
    leaders, no diverging epochs).

    Each partition's ``records`` is a part as it is (the tier's buffers, never copied: joined into one frame, an
    8 MiB answer cost ~5 ms of the event loop's, issue 24), and may be a :class:`rlm.tier.StreamedBatch` (its
    ``len`` is its size; the server reads it when it writes the answer, :mod:`rlm.listener.net.chunked`); the small
    fields between them, and records under ``RECORDS_PART_MIN_BYTES``, are joined into one part each run (a send
    each, not one per field)."""
    v = header.api_version
    flexible = v >= FETCH_FIRST_FLEXIBLE
    by_id = v >= FETCH_FIRST_TOPIC_ID
    out: list[Any] = [b"", _I32.pack(header.correlation_id) + (b"\0" if flexible else b"")]
    kept: set[int] = set()  # the records parts (ids: a buffer need not be hashable)
    head = _I32.pack(int(_millis(values.get("throttle_time", 0))))
    if v >= FETCH_FIRST_SESSION:
        head += _I16.pack(int(values.get("error_code", 0))) + _I32.pack(int(values.get("session_id", 0)))
    responses = values["responses"]
    out.append(head + _length(len(responses), flexible))
    for t in responses:
        if by_id:
            tid = t.get("topic_id")
            out.append(tid.bytes if tid is not None else bytes(16))
        else:
            name = (t.get("topic") or "").encode()
            out.append((_uvarint_bytes(len(name) + 1) if flexible else _I16.pack(len(name))) + name)
        parts = t["partitions"]
        out.append(_length(len(parts), flexible))
        for p in parts:
            fixed = _PARTITION_HEAD.pack(p["partition_index"], int(p["error_code"]), p["high_watermark"],
                                         p.get("last_stable_offset", -1))
            if v >= 5:
                fixed += _I64.pack(p.get("log_start_offset", -1))
            aborted = p.get("aborted_transactions")
            if aborted is None:
                fixed += b"\0" if flexible else b"\xff\xff\xff\xff"
            else:
                fixed += _length(len(aborted), flexible)
                for a in aborted:
                    fixed += _ABORTED.pack(a["producer_id"], a["first_offset"]) + (b"\0" if flexible else b"")
            if v >= 11:
                fixed += _I32.pack(p.get("preferred_read_replica", -1))
            records = p.get("records")
            if records is None:
                out.append(fixed + (b"\0" if flexible else b"\xff\xff\xff\xff"))
            else:
                out.append(fixed + (_uvarint_bytes(len(records) + 1) if flexible else _I32.pack(len(records))))
                pieces = records.parts if isinstance(records, RecordParts) else (records,)  # the tier's: block views
                out.extend(pieces)
                for b in pieces:
                    if len(b) >= RECORDS_PART_MIN_BYTES or not isinstance(b, (bytes, bytearray, memoryview)):
                        kept.add(id(b))
            if flexible:
                out.append(b"\0")  # the partition's tagged fields
        if flexible:
            out.append(b"\0")  # the topic's
    if flexible:
        out.append(b"\0")  # the answer's (no node_endpoints)
    size = sum(map(len, out))
    out[0] = _I32.pack(size)
    return _coalesced(out, kept), size + SIZE.size


def _coalesced(parts: list[Any], records: set[int]) -> list[Any]:
    """``parts`` with each run of parts that are not records (``records``: their ids) joined into one."""
    out: list[Any] = []
    run: list[Any] = []
    for p in parts:
        if id(p) in records:
            if run:
                out.append(b"".join(run))
                run = []
            out.append(p)
        else:
            run.append(p)
    if run:
        out.append(b"".join(run))
    return out


def last_offset(records: bytes | bytearray | memoryview | RecordParts | None) -> int | None:
    """The last offset of the last whole record batch (v2: base offset int64, batch length int32, leader epoch,
    magic, crc, attributes, then last offset delta int32 at byte 23) in ``records``; None without one."""
    if isinstance(records, RecordParts):
        return records.last_offset
    if not records:
        return None
    pos, last = 0, None
    n = len(records)
    while pos + 27 <= n:
        (base,) = _I64.unpack_from(records, pos)
        (length,) = _I32.unpack_from(records, pos + 8)
        if pos + 12 + length > n:
            break
        (delta,) = _I32.unpack_from(records, pos + 23)
        last = base + delta
        pos += 12 + length
    return last


def _millis(value: Any) -> float:
    return value.total_seconds() * 1000 if isinstance(value, datetime.timedelta) else value


def _length(n: int, flexible: bool) -> bytes:
    return _uvarint_bytes(n + 1) if flexible else _I32.pack(n)


def _uvarint_bytes(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


_PARTITION_HEAD = struct.Struct(">ihqq")  # partition_index, error_code, high_watermark, last_stable_offset
_ABORTED = struct.Struct(">qq")
_I64 = struct.Struct(">q")
_INDEX_ERROR = struct.Struct(">ih")


def _array_length(data: bytes, pos: int, flexible: bool) -> tuple[int, int]:
    """An array's item count at ``pos`` (0 for null) and the position after it."""
    if flexible:
        n, pos = _uvarint(data, pos)
        return max(n - 1, 0), pos
    (n,) = _I32.unpack_from(data, pos)
    return max(n, 0), pos + 4


def _string(data: bytes, pos: int, flexible: bool) -> tuple[str, int]:
    """A (non-null) string at ``pos`` and the position after it."""
    if flexible:
        n, pos = _uvarint(data, pos)
        n -= 1
    else:
        (n,) = _I16.unpack_from(data, pos)
        pos += 2
    end = pos + max(n, 0)
    if end > len(data):
        raise IndexError(end)
    return bytes(data[pos:end]).decode("utf-8", "replace"), end


def _uvarint(data: bytes, pos: int) -> tuple[int, int]:
    """An unsigned varint at ``pos``: (value, the position after it)."""
    n = shift = 0
    while True:
        b = data[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7


def _skip_compact(data: bytes, pos: int) -> int:
    """The position after a compact (nullable) string or bytes at ``pos`` (length + 1 as a varint, 0: null)."""
    n, pos = _uvarint(data, pos)
    end = pos + max(n - 1, 0)
    if end > len(data):
        raise IndexError(end)
    return end


def _skip_tags(data: bytes, pos: int) -> int:
    """The position after a tagged-field section at ``pos`` (count, then each tag, size and bytes)."""
    count, pos = _uvarint(data, pos)
    for _ in range(count):
        _tag, pos = _uvarint(data, pos)
        size, pos = _uvarint(data, pos)
        pos += size
    if pos > len(data):
        raise IndexError(pos)
    return pos


def response_type(header: RequestHeader) -> type | None:
    """kio's response schema answering ``header``'s request, None for an api key or version it does not know."""
    return _response_schema(header.api_key, header.api_version)


@functools.cache
def _response_schema(api_key: int, version: int) -> type | None:
    """Looked up once per api key and version (kio resolves its module path by name at each call)."""
    try:
        return load_response_schema(api_key, version)
    except Exception:  # noqa: BLE001
        return None


def warm_schemas(offered: Mapping[int, tuple[int, int]]) -> int:
    """Look up kio's request and response schemas of every version ``offered`` (api key -> (lowest, highest)) now,
    into the caches every request is served from (:func:`~rlm.listener.protocol.frame.request_schema`,
    :func:`response_type`); how many there are. kio imports a schema's module at its first use: at a version's
    first request, on the event loop, which each held for 5-20 ms of CPU (bench_listener_stall's first large Fetch
    v4: 7-8 ms; its first ApiVersions: 3.7 ms). Once per process (about 0.4 s for the 118 the endpoint offers, on a
    loaded machine)."""
    n = 0
    for key, (lo, hi) in offered.items():
        for version in range(lo, hi + 1):
            try:
                request_schema(key, version)
            except Exception:  # noqa: BLE001, S112 - kio has no such schema: answered as unsupported anyway
                continue
            n += 1 + (_response_schema(key, version) is not None)
    return n


def encode_response(header: RequestHeader, body: Any | None, *, raw_error: int | None = None) -> bytes:
    """One response frame (size prefix included) for ``header``'s request. ``body`` is a kio entity; with no
    schema for the request (unknown api key or version) ``raw_error`` is sent as a bare int16 after the header."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(response_header(header))
    if body is not None:
        entity_writer(type(body))(out, body)
    else:
        out.write(struct.pack(">h", ErrorCode.unsupported_version.value if raw_error is None else raw_error))
    frame = out.getbuffer()
    SIZE.pack_into(frame, 0, len(frame) - 4)
    frame.release()
    return out.getvalue()  # no copy once no view is left (a copy of a large answer holds the GIL: 5 ms per 9 MB)


# ------------------------------------------------------------------------------------------------ building
def build(entity_type: type, values: Mapping[str, Any], keep: list[Any] | None = None) -> Any:
    """``entity_type`` (a kio dataclass) from ``values``: fields it lacks are ignored, fields missing from
    ``values`` take their default (or the empty/zero value for a required one). With ``keep``, the items of its
    arrays of structs are appended to it too (see :func:`free_gradually`)."""
    kwargs: dict[str, Any] = {}
    for f, required in _fields(entity_type):
        if f.name in values:
            kwargs[f.name] = _convert(f, f.type, values[f.name], keep)
        elif required:
            kwargs[f.name] = _empty(f, f.type)
    return entity_type(**kwargs)


@functools.cache
def _fields(entity_type: type) -> tuple[tuple[Field, bool], ...]:
    """The entity's fields, each with whether it is required (no default): looked up once per type."""
    return tuple((f, f.default is MISSING and f.default_factory is MISSING) for f in fields(entity_type))


def error_body(entity_type: type, code: ErrorCode) -> Any:
    """A response of ``entity_type`` saying ``code`` wherever it has a top-level error code, otherwise empty."""
    values = {f.name: code for f in fields(entity_type) if f.metadata.get("kafka_type") == "error_code"}
    return build(entity_type, values)


@functools.cache
def _inner(tp: Any) -> tuple[Any, bool]:
    """(type without ``| None``, nullable)."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _convert(f: Field, tp: Any, value: Any, keep: list[Any] | None = None) -> Any:
    if value is None:
        return None
    tp, _ = _inner(tp)
    kafka_type = f.metadata.get("kafka_type")
    if kafka_type == "records" and isinstance(value, RecordParts):  # kio writes one buffer: the parts joined
        return bytes(value)
    if kafka_type == "error_code":
        return value if isinstance(value, ErrorCode) else ErrorCode(int(value))
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return value if isinstance(value, datetime.timedelta) else datetime.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64":  # milliseconds since the epoch; -1 (Kafka's "none") is None
        if isinstance(value, datetime.datetime):
            return value
        if value < 0:
            return None
        return datetime.datetime.fromtimestamp(value / 1000, tz=datetime.UTC)
    if kafka_type == "uuid":
        return value if isinstance(value, uuid.UUID) or value is None else uuid.UUID(str(value))
    if typing.get_origin(tp) is tuple:
        (item,) = typing.get_args(tp)[:1]
        if is_dataclass(item):
            items = tuple(v if isinstance(v, item) else build(item, v, keep) for v in value)
            if keep is not None:
                keep.extend(items)
            return items
        return tuple(value)
    if is_dataclass(tp):
        return value if isinstance(value, tp) else build(tp, value, keep)
    return value


def _empty(f: Field, tp: Any) -> Any:
    tp, nullable = _inner(tp)
    kafka_type = f.metadata.get("kafka_type")
    if kafka_type == "error_code":
        return ErrorCode.none
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(0)
    if kafka_type == "datetime_i64":
        return None if nullable else datetime.datetime.fromtimestamp(0, tz=datetime.UTC)
    if kafka_type == "uuid":
        return None if nullable else uuid.UUID(int=0)
    if typing.get_origin(tp) is tuple:
        return None if nullable else ()
    if is_dataclass(tp):
        return build(tp, {})
    if nullable:
        return None
    if kafka_type in ("string",):
        return ""
    if kafka_type in ("bytes", "records"):
        return b""
    if kafka_type == "bool":
        return False
    return 0
