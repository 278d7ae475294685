"""Files this process holds open, named through ``/proc/self/fd/<n>``, read on that descriptor, not opened again.

A rolled segment copied in place from the broker's log dir (:mod:`rlm.tasks.in_place`) is held by descriptors
opened for reading, and handed to the copy as ``/proc/self/fd/<n>`` names (the open file, whatever retention does to
its names). Opening such a name again walks procfs and makes a new open file, and a buffered ``open`` adds its
``fstat``, ``ioctl`` and ``lseek`` calls: the copy of a segment in place opened its ``.log`` twice (the blocks' reads
and the CRC scan) and read its time index through ``Path.read_bytes`` (nine system calls). The readers here take the
descriptor itself: :func:`open_read` wraps it (not closed with the wrapper), :func:`read_bytes` reads it with
``pread``; any other name is opened as before, by :func:`read_bytes` with ``os.open`` and ``os.read`` (four system
calls for a small file: the copy run's leader-epoch checkpoint). A one-segment copy run in place (a crafted
partition, ``strace -f``) made 72 system calls, now 56, each of which hands the GIL to another of a burst's threads
(issue 26).
"""

from __future__ import annotations

import errno
import os
from io import FileIO

__all__ = ["FD_DIR", "held_fd", "open_read", "read_bytes"]

FD_DIR = "/proc/self/fd"
_FD_PREFIX = f"{FD_DIR}/"
_READ_BYTES = 64 * 1024  # what read_bytes asks for at a time: a rolled segment's index file is read in one or a few


def held_fd(path: str | os.PathLike[str]) -> int | None:
    """The descriptor ``path`` names when it is ``/proc/self/fd/<n>`` (a file this process holds open), else None."""
    name = os.fspath(path)
    if not isinstance(name, str) or not name.startswith(_FD_PREFIX):
        return None
    n = name[len(_FD_PREFIX):]
    return int(n) if n.isdigit() else None


def open_read(path: str | os.PathLike[str]) -> FileIO:
    """``path`` opened for unbuffered reading (``open(path, "rb", buffering=0)``); a ``/proc/self/fd/<n>`` name of a
    descriptor open in this process is that descriptor wrapped (closing the wrapper leaves it open; a reader that
    seeks moves its offset, which the holders read with ``pread`` only). A name whose descriptor is not open is
    opened by its name (and fails as that open does)."""
    fd = held_fd(path)
    if fd is not None:
        try:
            return FileIO(fd, "rb", closefd=False)
        except OSError as err:
            if err.errno != errno.EBADF:
                raise
    return FileIO(os.fspath(path), "rb")


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The whole file at ``path`` (as ``Path.read_bytes``, raising as it does): a held descriptor read with
    ``pread`` from offset 0; any other name (or a descriptor ``pread`` cannot read: closed, write-only) opened with
    ``os.open`` and read with ``os.read`` (no buffered reader's ``fstat``, ``ioctl`` and ``lseek`` calls)."""
    fd = held_fd(path)
    if fd is not None:
        parts: list[bytes] = []
        pos = 0
        try:
            while chunk := os.pread(fd, _READ_BYTES, pos):
                parts.append(chunk)
                pos += len(chunk)
            return b"".join(parts)
        except OSError as err:
            if pos or err.errno != errno.EBADF:
                raise
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        parts = []
        while chunk := os.read(fd, _READ_BYTES):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)
