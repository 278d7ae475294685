"""Raw Kafka protocol over a socket, for the listener tests that send what a client library would not."""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

__all__ = ["EARLIEST", "call", "closed", "fetch", "kstr", "list_offsets", "only_partition", "plain_login", "recv_frame",
           "request"]

EARLIEST = -2  # ListOffsets' timestamp for the log start


def request(api_key: int, version: int, body: bytes, correlation_id: int = 7) -> bytes:
    """A request frame with header v1 (client id "t"): non-flexible versions only."""
    payload = struct.pack(">hhih", api_key, version, correlation_id, 1) + b"t" + body
    return struct.pack(">i", len(payload)) + payload


def kstr(s: str) -> bytes:
    return struct.pack(">h", len(s)) + s.encode()


def recv_frame(sock: socket.socket) -> bytes | None:
    """One response frame's payload, or None when the server closed (or reset) the connection."""
    def exactly(n: int) -> bytes | None:
        buf = b""
        while len(buf) < n:
            try:
                chunk = sock.recv(n - len(buf))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            buf += chunk
        return buf

    head = exactly(4)
    return None if head is None else exactly(struct.unpack(">i", head)[0])


def closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def call(sock: socket.socket, api_key: int, version: int, values: dict[str, Any], correlation_id: int = 7) -> Any:
    """Send a (non-flexible) request built by kio from ``values``; its decoded response, None if closed."""
    from kio.index import load_request_schema, load_response_schema
    from kio.serial import entity_reader, entity_writer

    from rlm.listener.protocol.codec import build

    out = io.BytesIO()
    entity = build(load_request_schema(api_key, version), values)
    entity_writer(type(entity))(out, entity)
    sock.sendall(request(api_key, version, out.getvalue(), correlation_id))
    frame = recv_frame(sock)
    if frame is None:
        return None
    assert struct.unpack_from(">i", frame)[0] == correlation_id
    resp, _size = entity_reader(load_response_schema(api_key, version))(frame, 4)
    return resp


def plain_login(sock: socket.socket, user: str, password: str) -> bool:
    """SASL PLAIN over SaslHandshake v1 / SaslAuthenticate v0: whether the endpoint accepted it."""
    if call(sock, 17, 1, {"mechanism": "PLAIN"}).error_code != 0:
        return False
    resp = call(sock, 36, 0, {"auth_bytes": f"\0{user}\0{password}".encode()})
    return resp is not None and resp.error_code == 0


def fetch(sock: socket.socket, topic: str, parts: list[tuple[int, int]], max_bytes: int = 1 << 20,
          isolation: int = 0, correlation_id: int = 7) -> Any:
    """A Fetch v11 (no session, no wait) of ``(partition, offset)`` in that order; the answer's correlation id
    checked (:func:`call`)."""
    return call(sock, 1, 11, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes, "isolation_level": isolation,
        "session_id": 0, "session_epoch": -1, "rack_id": "", "topics": [{"topic": topic, "partitions": [
            {"partition": p, "fetch_offset": o, "current_leader_epoch": -1, "log_start_offset": -1,
             "partition_max_bytes": max_bytes} for p, o in parts]}]}, correlation_id)


def only_partition(resp: Any) -> Any:
    """The one partition of a Fetch answer of one topic and one partition."""
    (t,) = resp.responses
    (p,) = t.partitions
    return p


def list_offsets(sock: socket.socket, topic: str, timestamp: int, partition: int = 0) -> Any:
    """A ListOffsets v5 (read_uncommitted) of one partition at ``timestamp`` (``EARLIEST``, -1: the end); its
    partition's answer."""
    (t,) = call(sock, 2, 5, {"replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
        {"partition_index": partition, "current_leader_epoch": -1, "timestamp": timestamp}]}]}).topics
    (p,) = t.partitions
    return p
