"""Raw Kafka protocol over a socket, for the listener tests that send what a client library would not."""

from __future__ import annotations

import socket
import struct

__all__ = ["closed", "kstr", "recv_frame", "request"]


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
