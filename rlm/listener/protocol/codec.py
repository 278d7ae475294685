"""The message codecs of the listener, by kio: request bodies decoded, response bodies built and encoded.

Messages are encoded and decoded by `kio <https://github.com/Aiven-Open/kio>`_ (Aiven, Apache-2.0): immutable
dataclasses generated from the very message JSON schemas Kafka builds its own protocol classes from
(``clients/src/main/resources/common/message``), every version, flexible versions and tagged fields included, with
a compiled reader. We chose it over kafka-python's hand-written structures (which stop at older versions: Fetch v13+
with topic ids, the versions current clients prefer, are missing) and over generating codecs from the kafka-clients
jar ourselves (a code generator to keep). Framing (size prefix, headers) is :mod:`rlm.listener.protocol.frame`.

Handlers build version-independent values (dicts and lists named as the schema's fields); :func:`build` turns them
into the kio entity of the version asked for, keeping the fields that version has.
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
from dataclasses import MISSING, Field, fields, is_dataclass
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from rlm.listener.protocol.frame import SIZE, BadRequestError, RequestHeader, response_header

__all__ = [
    "ErrorCode",
    "build",
    "decode_request",
    "decode_response",
    "encode_request",
    "new_request",
    "encode_response",
    "error_body",
    "produce_acks",
    "response_type",
]


def decode_request(frame: bytes, header: RequestHeader) -> Any:
    """The request body as kio's entity of the header's api key and version."""
    try:
        schema = load_request_schema(header.api_key, header.api_version)
    except Exception as err:  # noqa: BLE001
        raise BadRequestError(f"api key {header.api_key} version {header.api_version}: {err}", header) from None
    try:
        body, _size = entity_reader(schema)(frame, header.body_offset)
    except Exception as err:  # noqa: BLE001 - kio raises ValueError/IndexError/... on bad bytes
        raise BadRequestError(f"{schema.__name__} v{header.api_version}: cannot decode: {err}", header) from None
    # Bytes after the body are ignored, as Kafka's broker does (AbstractRequest.parseRequest reads the message
    # and never checks the buffer's remainder): librdkafka's all-topics Metadata v12 carries 3 of them.
    return body


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


def encode_request(frame: bytes, header: RequestHeader, body: Any) -> bytes:
    """The request frame ``frame`` (without its size prefix) with its body replaced by ``body`` (a kio entity of the
    same api key and version), size prefix included: the header's bytes are kept as the client sent them."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(frame[:header.body_offset])
    entity_writer(type(body))(out, body)
    data = out.getbuffer()
    SIZE.pack_into(data, 0, len(data) - 4)
    encoded = bytes(data)
    data.release()
    return encoded


def new_request(api_key: int, api_version: int, correlation_id: int, client_id: str, values: Mapping[str, Any]
                ) -> tuple[bytes, RequestHeader]:
    """A request of our own (the proxy asking its broker), size prefix included, and its header."""
    rtype = load_request_schema(api_key, api_version)
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


def response_type(header: RequestHeader) -> type | None:
    try:
        return load_response_schema(header.api_key, header.api_version)
    except Exception:  # noqa: BLE001
        return None


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
    data = bytes(frame)
    frame.release()
    return data


# ------------------------------------------------------------------------------------------------ building
def build(entity_type: type, values: Mapping[str, Any]) -> Any:
    """``entity_type`` (a kio dataclass) from ``values``: fields it lacks are ignored, fields missing from
    ``values`` take their default (or the empty/zero value for a required one)."""
    kwargs: dict[str, Any] = {}
    for f, required in _fields(entity_type):
        if f.name in values:
            kwargs[f.name] = _convert(f, f.type, values[f.name])
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


def _convert(f: Field, tp: Any, value: Any) -> Any:
    if value is None:
        return None
    tp, _ = _inner(tp)
    kafka_type = f.metadata.get("kafka_type")
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
            return tuple(v if isinstance(v, item) else build(item, v) for v in value)
        return tuple(value)
    if is_dataclass(tp):
        return value if isinstance(value, tp) else build(tp, value)
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
