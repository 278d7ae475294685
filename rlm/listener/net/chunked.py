"""Fetch answers carrying a batch too large to hold (PDP-43, issue 26): encoded around it, written a chunk at a time.

The tier hands such a batch out as a :class:`rlm.tier.StreamedBatch` (its size, and a way to read it again). The
answer is encoded as any other, with a 16-byte random tag in place of each such partition's records; the frame is
then cut at the tags into a :class:`ChunkedAnswer`: the encoded parts (views of the one frame), each tag's length
prefix rewritten for the batch's real size (``COMPACT_RECORDS``' unsigned varint of size + 1 in flexible versions,
``RECORDS``' int32 size before), the frame's size prefix likewise, and the batches themselves, which the server
reads from the store and writes to the socket a chunk at a time (:meth:`rlm.listener.net.server.ListenerServer`), so
the sidecar holds about a block of them whatever their size. A Fetch answer is the only one that carries records.
"""

from __future__ import annotations

import dataclasses
import io
import os
from collections.abc import Callable, Iterator
from typing import Any

from kio.serial.writers import write_unsigned_varint

from rlm.listener.protocol.frame import SIZE
from rlm.tier import StreamedBatch

__all__ = ["ChunkedAnswer", "encode_streamed", "encode_streamed_response"]

TAG_BYTES = 16


class ChunkedAnswer:
    """One response frame in parts: encoded bytes (memoryviews, or the tier's record buffers) and
    :class:`StreamedBatch` es, in order. ``then``: what the server calls (on its event loop) once a small answer
    (up to ``WRITE_SLICE_BYTES``, in memory) is handed to the socket, its first writes made, and before a larger one
    is written a slice at a time (the proxy reads the next answer ahead there:
    :meth:`rlm.listener.upstream.proxy.Proxy._tier_answer`)."""

    __slots__ = ("parts", "size", "then")

    def __init__(self, parts: list[memoryview | bytes | StreamedBatch], size: int,
                 then: Callable[[], None] | None = None) -> None:
        self.parts = parts
        self.size = size
        self.then = then

    def __len__(self) -> int:
        """The frame's bytes, its size prefix included."""
        return self.size

    def __iter__(self) -> Iterator[memoryview | bytes | StreamedBatch]:
        return iter(self.parts)

    def in_memory(self) -> bool:
        """No part is a :class:`StreamedBatch`: the answer can be written without reading the store (a tier answer
        in parts, :func:`rlm.listener.protocol.codec.fetch_response_parts`)."""
        return not any(isinstance(p, StreamedBatch) for p in self.parts)


def _uvarint(n: int) -> bytes:
    """A compact length as the protocol writes it (kio's unsigned varint)."""
    out = io.BytesIO()
    write_unsigned_varint(out, n)
    return out.getvalue()


def encode_streamed(values: dict[str, Any], encode: Callable[[dict[str, Any]], bytes], *,
                    flexible: bool) -> bytes | ChunkedAnswer:
    """``encode(values)``, or, when a partition's ``records`` is a :class:`StreamedBatch`, the
    :class:`ChunkedAnswer` of it (see the module docstring). ``flexible``: the response's version is flexible."""
    streamed: list[tuple[bytes, StreamedBatch]] = []
    for t in values.get("responses", ()):
        for p in t.get("partitions", ()):
            records = p.get("records")
            if isinstance(records, StreamedBatch):
                tag = os.urandom(TAG_BYTES)
                p["records"] = tag
                streamed.append((tag, records))
    return _cut(encode(values), streamed, flexible=flexible)


def encode_streamed_response(resp: Any, encode: Callable[[Any], bytes], *, flexible: bool) -> bytes | ChunkedAnswer:
    """As :func:`encode_streamed`, for a Fetch response entity (kio) whose partitions' ``records`` may be
    :class:`StreamedBatch` es (a proxy's answer, the tier's part merged into the broker's): ``encode(resp)``, each
    such batch tagged."""
    streamed: list[tuple[bytes, StreamedBatch]] = []
    topics = []
    for t in resp.responses:
        parts = []
        for p in t.partitions:
            if isinstance(p.records, StreamedBatch):
                tag = os.urandom(TAG_BYTES)
                streamed.append((tag, p.records))
                p = dataclasses.replace(p, records=tag)  # noqa: PLW2901
            parts.append(p)
        topics.append(dataclasses.replace(t, partitions=tuple(parts)))
    if not streamed:
        return encode(resp)
    return _cut(encode(dataclasses.replace(resp, responses=tuple(topics))), streamed, flexible=flexible)


def _cut(frame: bytes, streamed: list[tuple[bytes, StreamedBatch]], *, flexible: bool) -> bytes | ChunkedAnswer:
    """``frame`` cut at the tags of ``streamed`` into a :class:`ChunkedAnswer` (see the module docstring)."""
    if not streamed:
        return frame
    old = _uvarint(TAG_BYTES + 1) if flexible else TAG_BYTES.to_bytes(4, "big")
    view = memoryview(frame)
    parts: list[memoryview | bytes | StreamedBatch] = []
    size = len(frame)
    pos = 4  # after the size prefix, rewritten below
    for tag, batch in streamed:
        at = frame.find(tag, pos)
        if at < 0 or frame[at - len(old):at] != old:
            raise AssertionError("a streamed batch's tag is not in the encoded answer as its records")
        new = _uvarint(len(batch) + 1) if flexible else len(batch).to_bytes(4, "big")
        parts += [view[pos:at - len(old)], new, batch]
        size += len(new) - len(old) + len(batch) - TAG_BYTES
        pos = at + TAG_BYTES
    parts.append(view[pos:])
    parts.insert(0, SIZE.pack(size - 4))
    return ChunkedAnswer(parts, size)
