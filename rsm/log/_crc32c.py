"""CRC-32C over a region of a buffer without copying it.

``google_crc32c.value`` (hardware accelerated, ~11 GB/s) accepts only ``bytes``, which would force a copy of
every batch. We call the same library's ``crc32c_extend(crc, ptr, len)`` through ctypes on the address of our
own read buffer instead; if that library cannot be loaded we fall back to ``google_crc32c.extend`` on a copy.

The ``crc32c`` package (a dependency of kio's) is used instead where it runs on the CPU's instructions: it takes
any buffer, read-only views of mapped files too, with no address to find and no ctypes call, and folds three streams
with carry-less multiplies: 256 KiB in cache in 12 us (21 GB/s) where this library took 84-178 us (1.5-3.1 GB/s) on
this host (in-process, a read-only view of a mapped file, best of 5 x 200, session 18). A history Fetch's 1 MiB comes
from memory, not the cache: its CRCs took 110 of 329 us instead of 224 of 551 (bench_tier_read --breakdown, one run
each, load 5.3 then 3.8), the tier read 0.43-0.57 instead of 0.70-0.73 CPU s/GiB (3 alternating pairs, load 12-17).
Its calls keep the GIL too (``gil_release_mode=0``).

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


class _PyBuffer(ctypes.Structure):
    """CPython's ``Py_buffer`` (its first field is the address)."""

    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def buffer_address(buf: bytearray | memoryview) -> int:
    """The address of ``buf[0]``; valid while ``buf`` is alive and not resized (callers keep a view on it). A
    read-only view (of a file mapped into memory: :meth:`rsm.store.fs.FileSystemStore.map_range`) too: ctypes takes
    the address of writable buffers only, so its address is asked of the buffer protocol itself."""
    if not len(buf):
        return 0
    if isinstance(buf, memoryview) and buf.readonly:
        view = _PyBuffer()
        _get_buffer(buf, ctypes.byref(view), 0)  # PyBUF_SIMPLE (a contiguous view: a slice of a memoryview is)
        try:
            return view.buf or 0
        finally:
            _release_buffer(ctypes.byref(view))
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def _load_folding() -> Callable[..., int] | None:
    """``crc32c.crc32c`` (the ``crc32c`` package, which kio requires) when it runs on the CPU's CRC32 and carry-less
    multiply instructions (``hardware_based``); else None."""
    try:
        import crc32c as folding
    except ImportError:  # pragma: no cover - kio requires it
        return None
    return folding.crc32c if getattr(folding, "hardware_based", False) else None


_folding = _load_folding()


if _folding is not None:
    _fold = _folding

    def crc32c_at(buf: bytearray, address: int, start: int, length: int, crc: int = 0) -> int:
        """CRC-32C of ``buf[start:start+length]``, extending ``crc`` (``address`` unused here)."""
        return _fold(memoryview(buf)[start:start + length], crc, 0)  # gil_release_mode 0: the GIL kept (module doc)

elif _extend is not None:  # pragma: no cover - only without the crc32c package's hardware path
    _ext = _extend

    def crc32c_at(buf: bytearray, address: int, start: int, length: int, crc: int = 0) -> int:
        """CRC-32C of ``buf[start:start+length]`` (``address`` from :func:`buffer_address`), extending ``crc``."""
        return _ext(crc, address + start, length)

else:  # pragma: no cover - only if the shared library is not where google-crc32c's wheel puts it
    import google_crc32c as _g

    def crc32c_at(buf: bytearray, address: int, start: int, length: int, crc: int = 0) -> int:
        return _g.extend(crc, bytes(memoryview(buf)[start : start + length]))
