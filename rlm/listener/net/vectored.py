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

Plaintext only: a TLS transport (``asyncio.sslproto``) encrypts what it is handed and owns its socket's writes;
:func:`vectored` says whether a transport can be written this way.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

__all__ = ["IOV_MAX", "vectored", "write_parts"]

try:
    IOV_MAX = max(int(os.sysconf("SC_IOV_MAX")), 16)  # buffers one writev takes at most (Linux: 1024)
except (AttributeError, OSError, ValueError):  # pragma: no cover - no such sysconf name
    IOV_MAX = 16

Buffer = bytes | bytearray | memoryview
SENDFILE_MIN_BYTES = 64 * 1024
"""A part at least this long that is a view of a file's mapping (the tier's blocks on the filesystem store) is sent
from the file (``sendfile``: the socket takes the page cache's pages, not a copy); a shorter one goes in the
``writev`` (a system call per part would cost more than its copy)."""


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
    taken = 0
    i, n = 0, len(parts)
    sock = transport.get_extra_info("socket")
    if sock is not None and not transport.get_write_buffer_size() and not transport.is_closing():
        fd = sock.fileno()
        while i < n:
            whole = _in_file(parts[i])
            if whole is not None:  # sent from its file: no copy into the socket
                src, position, size = whole
                try:
                    sent = os.sendfile(fd, src, position, size)
                except OSError:  # would block, or an error the transport's write meets too
                    break
                taken += sent
                if sent < size:
                    if sent:
                        transport.write(memoryview(parts[i])[sent:])
                        i += 1
                    break
                i += 1
                continue
            j = i + 1
            while j < n and j - i < IOV_MAX and _in_file(parts[j]) is None:
                j += 1
            batch = parts[i:j]
            try:
                sent = os.writev(fd, batch)
            except BlockingIOError:
                break
            except OSError:
                break  # the transport's write meets the error too, and closes the connection
            taken += sent
            for part in batch:
                size = len(part)
                if sent < size:
                    if sent:  # the socket stopped inside this part: the rest of it, as a view
                        transport.write(memoryview(part)[sent:])
                        i += 1
                    break
                sent -= size
                i += 1
            else:
                continue  # the whole batch was taken
            break
    for part in parts[i:]:
        transport.write(part)
    return taken


def _in_file(part: Buffer) -> tuple[int, int, int] | None:
    """Where ``part`` is in a file, ``(fd, position, length)``, when it is a view of a file's mapping at least
    :data:`SENDFILE_MIN_BYTES` long (:class:`rsm.store.fs.MappedFile`: its ``file_range``); else None."""
    if type(part) is not memoryview or part.nbytes < SENDFILE_MIN_BYTES:
        return None
    file_range = getattr(part.obj, "file_range", None)
    return None if file_range is None else file_range(part)
