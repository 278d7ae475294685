"""The Kafka wire protocol of the history endpoint: framing, headers, and the message codecs.

Messages are encoded and decoded by `kio <https://github.com/Aiven-Open/kio>`_ (Aiven, Apache-2.0): immutable
dataclasses generated from the very message JSON schemas Kafka builds its own protocol classes from
(``clients/src/main/resources/common/message``), every version, flexible versions and tagged fields included, with
a compiled reader. We chose it over kafka-python's hand-written structures (which stop at older versions: Fetch v13+
with topic ids, the versions current clients prefer, are missing) and over generating codecs from the kafka-clients
jar ourselves (a code generator to keep).

A frame on the socket (every integer big-endian)::

    size            int32     length of what follows
    request header  v1: api_key int16, api_version int16, correlation_id int32, client_id nullable string
                    v2 (flexible versions): v1 + tagged fields
    request body    the API's schema at api_version

    size            int32
    response header v0: correlation_id int32; v1 (flexible versions): + tagged fields
                    (ApiVersions always answers with v0, so a client can read it at any version)
    response body

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

__all__ = [
    "API_KEYS",
    "API_NAMES",
    "MAX_FRAME_BYTES",
    "ApiKey",
    "BadRequestError",
    "ErrorCode",
    "RequestHeader",
    "build",
    "decode_request",
    "encode_response",
    "error_body",
    "api_label",
    "read_header",
]

SIZE = struct.Struct(">i")
# api_key int16, api_version int16, correlation_id int32: the fixed start of every request header version.
HEADER_START = struct.Struct(">hhi")
MAX_FRAME_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes default


class ApiKey:
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    FIND_COORDINATOR = 10
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    SASL_AUTHENTICATE = 36
    DESCRIBE_CLUSTER = 60


# What the endpoint serves: api key -> (min version, max version). Fetch from v4 (read_committed) to v17 (topic ids
# from v13), what librdkafka 2.x and the Java client 4.x negotiate; ListOffsets to v9 (LATEST_TIERED_TIMESTAMP).
# Produce is offered only to be refused (POLICY_VIOLATION per partition): librdkafka enables record-batch v2 (and
# Fetch v4+) only for a broker that lists Produce v3+ too.
API_KEYS: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 9),
    ApiKey.FETCH: (4, 17),
    ApiKey.LIST_OFFSETS: (1, 9),
    ApiKey.METADATA: (1, 12),
    ApiKey.FIND_COORDINATOR: (0, 4),
    ApiKey.API_VERSIONS: (0, 4),
    ApiKey.DESCRIBE_CLUSTER: (0, 1),
}
SASL_API_KEYS: dict[int, tuple[int, int]] = {
    ApiKey.SASL_HANDSHAKE: (0, 1),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
}


# Metric label of each api key: a closed set (a client chooses the api key of its requests, and every label value is
# a time series kept for the life of the process: unknown keys are all "other").
API_NAMES: dict[int, str] = {
    ApiKey.PRODUCE: "produce", ApiKey.FETCH: "fetch", ApiKey.LIST_OFFSETS: "list_offsets",
    ApiKey.METADATA: "metadata", ApiKey.FIND_COORDINATOR: "find_coordinator", ApiKey.API_VERSIONS: "api_versions",
    ApiKey.DESCRIBE_CLUSTER: "describe_cluster", ApiKey.SASL_HANDSHAKE: "sasl_handshake",
    ApiKey.SASL_AUTHENTICATE: "sasl_authenticate"}


def api_label(api_key: int) -> str:
    """The metric label of ``api_key``: its name for the APIs the endpoint knows, else ``"other"``."""
    return API_NAMES.get(api_key, "other")


class BadRequestError(Exception):
    """A request that cannot be read; ``header`` is set when at least its header could (then it gets an answer)."""

    def __init__(self, message: str, header: RequestHeader | None = None) -> None:
        super().__init__(message)
        self.header = header


class RequestHeader(typing.NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    flexible: bool  # the request's schema version is flexible (header v2, response header v1)
    body_offset: int


def read_header(frame: bytes) -> RequestHeader:
    """The header of one request frame (without its size prefix)."""
    if len(frame) < HEADER_START.size + 2:
        raise BadRequestError(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, version, correlation_id = HEADER_START.unpack_from(frame)
    try:
        schema = load_request_schema(api_key, version)
    except Exception:  # noqa: BLE001 - kio: unknown api key or version
        flexible = False
        schema = None
    else:
        flexible = bool(schema.__flexible__)
    pos = HEADER_START.size
    (n,) = struct.unpack_from(">h", frame, pos)
    pos += 2
    client_id = None
    if n >= 0:
        if pos + n > len(frame):
            raise BadRequestError("client id runs past the request's end",
                                  RequestHeader(api_key, version, correlation_id, None, flexible, len(frame)))
        client_id = bytes(frame[pos:pos + n]).decode("utf-8", "replace")
        pos += n
    header = RequestHeader(api_key, version, correlation_id, client_id, flexible, pos)
    if flexible and schema is not None:
        try:
            _tags, size = entity_reader(schema.__header_schema__)(frame, 0)
        except Exception as err:  # noqa: BLE001 - kio raises on truncation
            raise BadRequestError(f"request header: {err}", header) from None
        header = header._replace(body_offset=size)
    return header


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
    out.write(struct.pack(">i", header.correlation_id))
    if header.flexible and header.api_key != ApiKey.API_VERSIONS:
        out.write(b"\0")  # response header v1: no tagged fields
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
