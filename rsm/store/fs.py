"""A filesystem object store: one file per key under a root directory.

Atomic puts: the object is written to ``<root>/.tmp/<random>``, fsynced, renamed over ``<root>/<key>`` and the
target directory fsynced; a reader opens either the old file or the complete new one. A write killed mid-way
leaves its temp file; :meth:`FileSystemStore.remove_stale_temp_files` (run by garbage collection after its grace)
removes those. Keys are ``/``-separated
relative paths; ``..``, absolute paths and empty components are refused.
"""

from __future__ import annotations

import io
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from rsm.errors import RemoteResourceNotFoundError, RemoteStorageError, StoreConfigError
from rsm.store.base import Chunk, ObjectInfo, RequestCounter

__all__ = ["FileSystemStore"]

TMP_DIR = ".tmp"


class _RangeReader(io.RawIOBase):
    """Reads at most ``remaining`` bytes from an open file."""

    def __init__(self, f: BinaryIO, remaining: int) -> None:
        self._f = f
        self._remaining = remaining

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        if self._remaining <= 0:
            return 0
        mv = memoryview(b)
        if len(mv) > self._remaining:
            mv = mv[:self._remaining]
        n = self._f.readinto(mv)  # type: ignore[attr-defined]
        self._remaining -= n or 0
        return n or 0

    def close(self) -> None:
        if not self.closed:
            self._f.close()
        super().close()


_IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)


def _write_all(fd: int, buffers: list[bytes | bytearray | memoryview]) -> int:
    """Write a gather list with ``writev`` (in groups of at most IOV_MAX), finishing partial writes."""
    total = 0
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        group = views[:_IOV_MAX]
        n = os.writev(fd, group)
        total += n
        # drop what was written, keep the rest
        i = 0
        while i < len(group) and n >= len(group[i]):
            n -= len(group[i])
            i += 1
        views = views[i:]
        if n:
            views[0] = views[0][n:]
    return total


class FileSystemStore:
    """Objects as files under ``root``; ``fsync=False`` skips the fsyncs (benchmarks and tests only)."""

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.requests = RequestCounter()
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / TMP_DIR).mkdir(exist_ok=True)
        except OSError as err:
            raise StoreConfigError(f"cannot create the store root {self.root}: {err}") from err

    def __repr__(self) -> str:
        return f"FileSystemStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts) or parts[0] == TMP_DIR:
            raise ValueError(f"invalid object key {key!r}")
        return self.root.joinpath(*parts)

    def put(self, key: str, chunks: Iterable[Chunk]) -> int:
        """Errors of ``chunks`` itself propagate unchanged; the store's own become RemoteStorageError."""
        path = self._path(key)
        self.requests.add("put")
        tmp = self.root / TMP_DIR / f"{uuid.uuid4().hex}"
        size = 0
        fd = -1
        try:
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except OSError as err:
                raise RemoteStorageError(f"put {key} to {self.root} failed: {err}") from err
            for chunk in chunks:
                try:
                    size += _write_all(fd, chunk if isinstance(chunk, list) else [chunk])
                except OSError as err:
                    raise RemoteStorageError(f"put {key} to {self.root} failed at byte {size}: {err}") from err
            try:
                if self.fsync:
                    os.fsync(fd)
                os.close(fd)
                fd = -1
                path.parent.mkdir(parents=True, exist_ok=True)
                os.replace(tmp, path)
                if self.fsync:
                    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
                    try:
                        os.fsync(dfd)
                    finally:
                        os.close(dfd)
            except OSError as err:
                raise RemoteStorageError(f"put {key} to {self.root} failed: {err}") from err
        finally:
            if fd >= 0:
                os.close(fd)
            tmp.unlink(missing_ok=True)
        return size

    def get(self, key: str, start: int = 0, end_inclusive: int | None = None) -> BinaryIO:
        path = self._path(key)
        self.requests.add("get")
        try:
            f = open(path, "rb")  # noqa: SIM115 - closed by the returned reader
        except FileNotFoundError as err:
            raise RemoteResourceNotFoundError(f"no object {key} in {self.root}") from err
        except OSError as err:
            raise RemoteStorageError(f"get {key} from {self.root} failed: {err}") from err
        size = os.fstat(f.fileno()).st_size
        end = size - 1 if end_inclusive is None else min(end_inclusive, size - 1)
        f.seek(start)
        return io.BufferedReader(_RangeReader(f, max(0, end - start + 1)), 1 << 20)  # type: ignore[return-value]

    def get_bytes(self, key: str, start: int = 0, end_inclusive: int | None = None) -> bytes:
        with self.get(key, start, end_inclusive) as r:
            return r.read()

    def probe(self) -> None:
        """The root is a directory this process may write (a HEAD of a missing key would not notice it gone)."""
        self.requests.add("head")
        if not self.root.is_dir() or not os.access(self.root, os.W_OK | os.X_OK):
            raise RemoteStorageError(f"store root {self.root} is not a writable directory")

    def head(self, key: str) -> int | None:
        self.requests.add("head")
        try:
            return self._path(key).stat().st_size
        except FileNotFoundError:
            return None
        except OSError as err:
            raise RemoteStorageError(f"head {key} in {self.root} failed: {err}") from err

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        self.requests.add("list")
        d = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        top = self.root / d if d else self.root
        out = []
        for dirpath, dirnames, filenames in os.walk(top):
            rel = os.path.relpath(dirpath, self.root)
            if rel == ".":
                dirnames[:] = [n for n in dirnames if n != TMP_DIR]
                rel = ""
            for name in filenames:
                key = f"{rel}/{name}" if rel else name
                key = key.replace(os.sep, "/")
                if key.startswith(prefix):
                    try:
                        out.append(ObjectInfo(key, os.stat(os.path.join(dirpath, name)).st_size))
                    except FileNotFoundError:
                        continue
        out.sort(key=lambda o: o.key)
        return iter(out)

    def remove_stale_temp_files(self, older_than_ms: int) -> list[str]:
        """Remove temp files of writes killed mid-way (``<root>/.tmp/*``) last modified before ``older_than_ms``
        (epoch ms); return their paths relative to the root. A write in progress keeps its file's mtime fresh."""
        out = []
        tmp_dir = self.root / TMP_DIR
        try:
            entries = list(os.scandir(tmp_dir))
        except FileNotFoundError:
            return out
        except OSError as err:
            raise RemoteStorageError(f"listing {tmp_dir} failed: {err}") from err
        for e in entries:
            try:
                if e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_mtime * 1000 < older_than_ms:
                    os.unlink(e.path)
                    out.append(f"{TMP_DIR}/{e.name}")
            except FileNotFoundError:
                continue
            except OSError as err:
                raise RemoteStorageError(f"removing {e.path} failed: {err}") from err
        return out

    def delete(self, key: str) -> None:
        self.requests.add("delete")
        try:
            self._path(key).unlink(missing_ok=True)
        except OSError as err:
            raise RemoteStorageError(f"delete {key} in {self.root} failed: {err}") from err

    def delete_many(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.delete(key)
