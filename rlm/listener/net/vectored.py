"""Vectored writes of an answer's parts to a plaintext connection (issue 24).

A Fetch answered from the tier is a list of parts (:func:`rlm.listener.protocol.codec.fetch_response_parts`: the
fields between the records, and each partition's records as the tier's own buffer). asyncio's selector transport
(Python 3.11) takes a ``write`` at a time: each a ``send`` system call while its buffer is empty, and once the socket
has not taken all of one, every byte after it copied into the transport's buffer; ``writelines`` joins its list
into one bytes object first (a copy of the whole answer). :func:`write_parts` hands the socket every part in one
``writev`` (``sendmsg`` without flags) from the parts' own buffers, and gives the transport only what the socket did
not take, where it is copied into the transport's buffer as any ``write`` is (then the transport sends it when the
socket can take more, and pauses its protocol as usual: the listener's back-pressure is unchanged).

A part that is a view of a file's mapping (the tier's blocks on the filesystem store, :class:`rsm.store.fs.MappedFile`)
and at least :data:`SENDFILE_MIN_BYTES` long is sent from the file with ``sendfile`` between the ``writev`` s of the
parts around it: the socket takes the page cache's pages, the bytes the mapping shows, without copying them (on
loopback: 0.41 -> 0.29 ms of the writer's CPU per MiB in 256 KiB parts, none saved in 16 KiB parts; the copy is
the receiver's). What it does not take is queued from the mapping, as the rest of any part.

The contract (callers rely on it: the tier may hand out views of buffers it reuses once the call returns):
**no part is referenced after the call.** What the socket took is in the kernel; the rest is a copy in the
transport's buffer. So the parts may be changed, reused or released as soon as :func:`write_parts` returns.

An answer larger than the socket's buffer (the listener's above ``WRITE_SLICE_BYTES``: a consumer of many partitions
gets ~1 MiB of each) is written with :func:`send_parts` in rounds, drained between them: each round hands the socket
the parts' own buffers as far as it takes them and copies only :data:`QUEUE_AT_MOST_BYTES` into the transport (so that
it watches the socket); :func:`write_parts` copies all the socket did not take at once.

Plaintext only: a TLS transport (``asyncio.sslproto``) encrypts what it is handed and owns its socket's writes;
:func:`vectored` says whether a transport can be written this way.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

__all__ = ["IOV_MAX", "QUEUE_AT_MOST_BYTES", "send_parts", "vectored", "write_parts"]

try:
    IOV_MAX = max(int(os.sysconf("SC_IOV_MAX")), 16)  # buffers one writev takes at most (Linux: 1024)
except (AttributeError, OSError, ValueError):  # pragma: no cover - no such sysconf name
    IOV_MAX = 16

Buffer = bytes | bytearray | memoryview
SENDFILE_MIN_BYTES = 64 * 1024
"""A part at least this long that is a view of a file's mapping (the tier's blocks on the filesystem store) is sent
from the file (``sendfile``: the socket takes the page cache's pages, not a copy); a shorter one goes in the
``writev`` (a system call per part would cost more than its copy)."""


QUEUE_AT_MOST_BYTES = 64 * 1024
""":func:`send_parts` copies at most this much of what the socket did not take into the transport's buffer: enough
that the transport watches the socket (its ``drain()`` then says when the socket takes more), little to copy."""


def vectored(transport: asyncio.BaseTransport) -> bool:
    """Whether ``transport`` is a plaintext socket transport :func:`write_parts` may write to straight."""
    return (transport.get_extra_info("sslcontext") is None and transport.get_extra_info("ssl_object") is None
            and transport.get_extra_info("socket") is not None)


def write_parts(transport: asyncio.WriteTransport, parts: Sequence[Buffer]) -> int:
    """Write ``parts``, in order, to a plaintext ``transport`` (:func:`vectored`); the bytes the socket took at once
    (the rest is in the transport's buffer, copied). No part is referenced after the call (the module docstring).

    While the transport holds nothing, the parts go to the socket in ``writev`` calls of at most :data:`IOV_MAX`
    buffers each, until the socket takes less than it was given; then the rest of the part it stopped in (a view)
    and every later part are handed to ``transport.write``, which copies them into its buffer and sends them as the
    socket can take more. While the transport holds bytes already (or is closing), every part goes to
    ``transport.write``: they queue behind those. An error of the socket other than "would block" is left to the
    transport, which meets it on its own write and closes the connection as for any write."""
    i, skip, taken = _write_direct(transport, parts, 0, 0)
    if i < len(parts):
        transport.write(memoryview(parts[i])[skip:] if skip else parts[i])
        for part in parts[i + 1:]:
            transport.write(part)
    return taken


def send_parts(transport: asyncio.WriteTransport, parts: Sequence[Buffer], at: tuple[int, int],
               queue_at_most: int = QUEUE_AT_MOST_BYTES) -> tuple[tuple[int, int], int]:
    """Write ``parts`` from position ``at`` (part index, bytes of it already written) to a plaintext ``transport``
    (:func:`vectored`) as far as the socket takes them now, and no further than :data:`QUEUE_AT_MOST_BYTES` past
    that, copied into the transport's buffer (so that it watches the socket and ``drain()`` tells when it takes
    more); returns the position reached (``(len(parts), 0)``: all written) and the bytes the socket took at once.

    For an answer larger than the socket's buffer, written in rounds with a ``drain()`` between them (the caller's):
    :func:`write_parts` would copy all the socket did not take at once into the transport's buffer (and then send
    it from there: each byte copied twice), where each round here hands the socket the parts' own buffers (a mapped
    file's with ``sendfile``) and copies ``queue_at_most`` bytes at most. The parts after the position reached are
    the caller's, still referenced (hold them until written); none before it is. While the transport holds bytes
    (or is closing), nothing is written: drain it first."""
    i, skip = at
    if transport.get_write_buffer_size() or transport.is_closing():
        return at, 0
    i, skip, taken = _write_direct(transport, parts, i, skip)
    left = queue_at_most
    while i < len(parts) and left > 0:
        view = memoryview(parts[i])[skip:skip + left]
        transport.write(view)  # copied into its buffer (what its send did not take at once)
        left -= view.nbytes
        skip += view.nbytes
        if skip >= len(parts[i]):
            i, skip = i + 1, 0
    return (i, skip), taken


def _write_direct(transport: asyncio.WriteTransport, parts: Sequence[Buffer], i: int, skip: int
                  ) -> tuple[int, int, int]:
    """Write ``parts`` from part ``i`` (its first ``skip`` bytes written already) straight to ``transport``'s socket
    (``writev``, ``sendfile`` for a mapped file's long parts) while its transport holds nothing and the socket takes
    all it is given; returns where it stopped (part index, bytes of it written) and the bytes the socket took."""
    taken = 0
    n = len(parts)
    sock = transport.get_extra_info("socket")
    if sock is None or transport.get_write_buffer_size() or transport.is_closing():
        return i, skip, 0
    fd = sock.fileno()
    while i < n:
        whole = _in_file(parts[i])
        if whole is not None:  # sent from its file: no copy into the socket
            src, position, size = whole
            try:
                sent = os.sendfile(fd, src, position + skip, size - skip)
            except OSError:  # would block, or an error the transport's write meets too
                break
            taken += sent
            skip += sent
            if skip < size:
                break
            i, skip = i + 1, 0
            continue
        j = i + 1
        while j < n and j - i < IOV_MAX and _in_file(parts[j]) is None:
            j += 1
        batch = list(parts[i:j])
        if skip:
            batch[0] = memoryview(batch[0])[skip:]
        try:
            sent = os.writev(fd, batch)
        except OSError:  # would block, or an error the transport's write meets too (and closes the connection)
            break
        taken += sent
        for part in batch:
            size = len(part)
            if sent < size:
                skip += sent
                break
            sent -= size
            i, skip = i + 1, 0
        else:
            continue  # the whole batch was taken
        break
    return i, skip, taken


def _in_file(part: Buffer) -> tuple[int, int, int] | None:
    """Where ``part`` is in a file, ``(fd, position, length)``, when it is a view of a file's mapping at least
    :data:`SENDFILE_MIN_BYTES` long (:class:`rsm.store.fs.MappedFile`: its ``file_range``); else None."""
    if type(part) is not memoryview or part.nbytes < SENDFILE_MIN_BYTES:
        return None
    file_range = getattr(part.obj, "file_range", None)
    return None if file_range is None else file_range(part)
