"""Kafka's framing: the size prefix, the request header and the response header.

A frame on the socket (every integer big-endian; Kafka's ``RequestHeader.json`` / ``ResponseHeader.json``)::

    size            int32     length of what follows
    request header  v1: api_key int16, api_version int16, correlation_id int32, client_id nullable string
                    v2 (flexible versions): v1 + tagged fields
    request body    the API's schema at api_version

    size            int32
    response header v0: correlation_id int32; v1 (flexible versions): + tagged fields
                    (ApiVersions always answers with v0, so a client can read it at any version)
    response body

Whether a request's header is v1 or v2 is its schema's (kio knows which versions are flexible). The correlation id
sits at a fixed place in both headers (request: byte 4, response: byte 0, after the size prefix): a proxy maps it
without decoding anything else (:mod:`rlm.listener.upstream.brokers`).
"""

from __future__ import annotations

import functools
import struct
import typing

from kio.index import load_request_schema
from kio.serial import entity_reader

from rlm.listener.protocol.apis import ApiKey

__all__ = [
    "MAX_FRAME_BYTES",
    "SIZE",
    "BadRequestError",
    "RequestHeader",
    "correlation_id_of_response",
    "read_header",
    "request_schema",
    "response_header",
]

SIZE = struct.Struct(">i")
# api_key int16, api_version int16, correlation_id int32: the fixed start of every request header version.
HEADER_START = struct.Struct(">hhi")
CORRELATION_ID = struct.Struct(">i")
REQUEST_CORRELATION_AT = 4  # after api_key int16, api_version int16
MAX_FRAME_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes default


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


@functools.cache
def request_schema(api_key: int, version: int) -> type:
    """kio's request schema of an api key and version, looked up once (kio resolves its module path by name at each
    call: 0.07 ms, three times per proxied request; the offered ones are looked up at start, by
    :func:`~rlm.listener.protocol.codec.warm_schemas`). Raises as kio does for an unknown one (not remembered)."""
    return load_request_schema(api_key, version)


def read_header(frame: bytes) -> RequestHeader:
    """The header of one request frame (without its size prefix)."""
    if len(frame) < HEADER_START.size + 2:
        raise BadRequestError(f"request of {len(frame)} bytes is shorter than a request header")
    api_key, version, correlation_id = HEADER_START.unpack_from(frame)
    try:
        schema = request_schema(api_key, version)
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
    if flexible and pos < len(frame) and frame[pos] == 0:  # no tagged fields (clients send none): read here
        return header._replace(body_offset=pos + 1)
    if flexible and schema is not None:
        try:
            _tags, size = entity_reader(schema.__header_schema__)(frame, 0)
        except Exception as err:  # noqa: BLE001 - kio raises on truncation
            raise BadRequestError(f"request header: {err}", header) from None
        header = header._replace(body_offset=size)
    return header


def response_header(header: RequestHeader) -> bytes:
    """The response header answering ``header`` (without the size prefix): v1 for a flexible request, v0 otherwise
    and always for ApiVersions."""
    tags = b"\0" if header.flexible and header.api_key != ApiKey.API_VERSIONS else b""  # v1: no tagged fields
    return CORRELATION_ID.pack(header.correlation_id) + tags


def correlation_id_of_response(frame: bytes) -> int:
    """The correlation id of a response frame (without its size prefix)."""
    if len(frame) < CORRELATION_ID.size:
        raise BadRequestError(f"response of {len(frame)} bytes is shorter than a response header")
    return CORRELATION_ID.unpack_from(frame)[0]
