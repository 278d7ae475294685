"""CRC-32C over a region of a writable buffer without copying it.

``google_crc32c.value`` (hardware accelerated, ~11 GB/s) accepts only ``bytes``, which would force a copy of
every batch. We call the same library's ``crc32c_extend(crc, ptr, len)`` through ctypes on the address of our
own read buffer instead; if that library cannot be loaded we fall back to ``google_crc32c.extend`` on a copy.

The library is loaded with ``ctypes.PyDLL``: calls keep the GIL. A batch's CRC takes microseconds (64 KiB: about
20 us); releasing the GIL for it and taking it back, with a reader's ten read-ahead GETs' threads wanting it, cost
31-74 us per call against 4-18 us held (issue 25: a sequential read's parser spent most of its CPU waiting to get the
GIL back after each batch's CRC, and while it did, fetched requests filled its read-ahead window).
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable

__all__ = ["buffer_address", "crc32c_at"]


def _load() -> Callable[[int, int, int], int] | None:
    import google_crc32c

    pkg = os.path.dirname(google_crc32c.__file__)
    for candidate in glob.glob(os.path.join(pkg, os.pardir, "google_crc32c.libs", "libcrc32c*")) + glob.glob(
        os.path.join(pkg, "libcrc32c*")
    ):
        try:
            lib = ctypes.PyDLL(candidate)  # the GIL kept across the call (see the module doc)
        except OSError:
            continue
        fn = lib.crc32c_extend
        fn.restype = ctypes.c_uint32
        fn.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t]
        return fn
    return None


_extend = _load()


def buffer_address(buf: bytearray) -> int:
    """The address of ``buf[0]``; valid while ``buf`` is alive and not resized (callers keep a view on it)."""
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf)) if len(buf) else 0


if _extend is not None:
    _ext = _extend

    def crc32c_at(buf: bytearray, address: int, start: int, length: int, crc: int = 0) -> int:
        """CRC-32C of ``buf[start:start+length]`` (``address`` from :func:`buffer_address`), extending ``crc``."""
        return _ext(crc, address + start, length)

else:  # pragma: no cover - only if the shared library is not where google-crc32c's wheel puts it
    import google_crc32c as _g

    def crc32c_at(buf: bytearray, address: int, start: int, length: int, crc: int = 0) -> int:
        return _g.extend(crc, bytes(memoryview(buf)[start : start + length]))
