"""A filesystem object store: one file per key under a root directory.

Atomic puts: the object is written to an anonymous file in the key's directory (``O_TMPFILE``), fsynced, and linked
at ``<root>/<key>`` (where the filesystem has no anonymous files: written to ``<root>/.tmp/<random>``, fsynced,
renamed over ``<root>/<key>``), and the target directory fsynced; a reader opens either the old file or the complete
new one.
:meth:`FileSystemStore.put_deferred` leaves the directory fsync to a later put into the same directory (a copy's
data objects, its index object last), or to :meth:`FileSystemStore.sync_names` (a batch of copies: one fsync per
directory for all of them); a directory a put creates is fsynced into its parent. A write killed mid-way
leaves its temp file; :meth:`FileSystemStore.remove_stale_temp_files` (run by garbage collection after its grace)
removes those. :meth:`FileSystemStore.put_uncommitted` writes an object in place, without a temp file, for objects no
one reads before a later one commits them (a copy's data objects).

Keys are ``/``-separated relative paths; ``..``, ``.``, absolute paths, empty components, a first component ``.tmp``,
NUL, strings that are not valid unicode and components ending with ``%+`` are refused (ValueError naming the key), so
every object is a file under the root. A listing's prefix may not climb out of the root either.

A key component longer than a file name may be (255 bytes; a Kafka topic name of 249 characters makes a
286-byte ``<name>-<topic id>``) is laid out on disk as directories of at most 200 bytes each ending with ``%+``,
then the rest: ``<first 200 bytes>%+/<next 200 bytes>%+/<rest>``. Listing joins them back, so keys are the same
on every store. (Percent-encoded topic names never hold ``%+``: ``%`` is always followed by two hex digits.)
"""

from __future__ import annotations

import io
import mmap
import os
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from rsm.errors import CorruptRemoteObjectError, RemoteResourceNotFoundError, RemoteStorageError, StoreConfigError
from rsm.log._crc32c import buffer_address
from rsm.store.base import IOV_MAX, Chunk, ObjectInfo, RequestCounter

__all__ = ["FileSystemStore", "MappedFile"]

TMP_DIR = ".tmp"
NAME_MAX_BYTES = 255  # one path component (file name) on ext4, xfs, tmpfs
CONTINUED = "%+"  # ends each on-disk directory of a key component cut for being longer than a file name
_PIECE_BYTES = 200
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: the pages mapped by the mmap call itself
_HELD_BYTES = 1 << 20  # immutable chunks held to go out in one writev with the next (FileSystemStore._write_chunks)
_DIRS_KEPT = 8192  # key directories FileSystemStore._path keeps (one a partition and key layout; cleared when full)


def _cut(component: str) -> list[str]:
    """``component`` in pieces of at most ``_PIECE_BYTES`` UTF-8 bytes, cut between characters; the last piece is
    never ``.`` or ``..``."""
    pieces: list[str] = []
    start = size = 0
    for i, ch in enumerate(component):
        n = len(ch.encode("utf-8"))
        if size + n > _PIECE_BYTES:
            pieces.append(component[start:i])
            start, size = i, 0
        size += n
    pieces.append(component[start:])
    if pieces[-1] in (".", "..") and len(pieces) > 1:  # one more character of the piece before, into the last
        pieces[-1] = pieces[-2][-1] + pieces[-1]
        pieces[-2] = pieces[-2][:-1]
    return pieces


def _disk_parts(parts: list[str]) -> list[str]:
    """A key's components as path components on disk (long ones cut, see the module doc)."""
    out: list[str] = []
    for p in parts:
        if len(p.encode("utf-8")) <= NAME_MAX_BYTES:
            out.append(p)
        else:
            *dirs, last = _cut(p)
            out.extend(d + CONTINUED for d in dirs)
            out.append(last)
    return out


def _key_of(disk_parts: list[str]) -> str | None:
    """The key of a file at ``disk_parts`` under the root (long components joined back); None if it is none."""
    parts: list[str] = []
    pending = ""
    for p in disk_parts:
        if p.endswith(CONTINUED):
            pending += p[:-len(CONTINUED)]
        else:
            parts.append(pending + p)
            pending = ""
    return None if pending else "/".join(parts)


class MappedFile(mmap.mmap):
    """A read-only mapping of ``length`` bytes of an open file from ``position`` (:meth:`FileSystemStore.map_range`),
    which keeps the file open (``fd``, closed with the mapping): :meth:`file_range` of a view of it says where in the
    file its bytes are, so a socket can send them from the file itself (``os.sendfile``: the page cache's pages handed
    to the socket, not copied into it; :mod:`rlm.listener.net.vectored`). The file's bytes are the mapping's (one
    page cache), and stay so: an object is never changed in place once readable, and a deleted one stays open."""

    def __new__(cls, fd: int, length: int, position: int) -> MappedFile:
        self = super().__new__(cls, fd, length, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ,
                               offset=position)
        self.position = position
        view = memoryview(self)
        self.address = buffer_address(view)  # where the mapping starts (a view's offset in it: its address minus)
        view.release()
        self.fd = fd  # the mapping's from here on (closed with it)
        return self

    def file_range(self, view: memoryview) -> tuple[int, int, int]:
        """``(fd, position, length)``: where the bytes of ``view``, a view of this mapping, are in the file."""
        return self.fd, self.position + buffer_address(view) - self.address, view.nbytes

    def __del__(self) -> None:
        fd, self.fd = getattr(self, "fd", -1), -1
        if fd >= 0:
            os.close(fd)


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


def _write_all(fd: int, buffers: list[bytes | bytearray | memoryview]) -> int:
    """Write a gather list with ``writev`` (in groups of at most IOV_MAX), finishing partial writes."""
    total = 0
    views = [memoryview(b).cast("B") for b in buffers if len(b)]
    while views:
        group = views[:IOV_MAX]
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


def _fsync_dir(d: Path) -> None:
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _tmpfile_links_work(d: Path) -> bool:
    """Whether anonymous files (``O_TMPFILE``) can be made in ``d`` and linked into it through ``/proc/self/fd``
    (Linux 3.11 and later, on ext4, xfs, btrfs, tmpfs; not every filesystem has them): tried once, with a file of no
    bytes linked and unlinked. :meth:`FileSystemStore._put_linked` when they can, else a temp file and a rename."""
    try:
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        fd = os.open(".", os.O_WRONLY | os.O_TMPFILE, 0o644, dir_fd=dfd)
        try:
            name = f"probe-{uuid.uuid4().hex}"  # (left behind by a kill: a temp file, remove_stale_temp_files')
            os.link(f"/proc/self/fd/{fd}", name, dst_dir_fd=dfd, follow_symlinks=True)
            os.unlink(name, dir_fd=dfd)
        finally:
            os.close(fd)
        return True
    except (OSError, AttributeError):  # (AttributeError: no os.O_TMPFILE outside Linux)
        return False
    finally:
        os.close(dfd)


class FileSystemStore:
    """Objects as files under ``root``; ``fsync=False`` skips the fsyncs (benchmarks and tests only)."""

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.requests = RequestCounter("fs")
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            (self.root / TMP_DIR).mkdir(exist_ok=True)
        except OSError as err:
            raise StoreConfigError(f"cannot create the store root {self.root}: {err}") from err
        self._links_tmpfiles = _tmpfile_links_work(self.root / TMP_DIR)
        self._dirs: dict[str, Path] = {}  # a key's part before its last "/" -> that directory's path (see _path)

    def __repr__(self) -> str:
        return f"FileSystemStore({str(self.root)!r})"

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or key.startswith("/") or any(p in ("", ".", "..") for p in parts) or parts[0] == TMP_DIR:
            raise ValueError(f"invalid object key {key!r}")
        if "\x00" in key:
            raise ValueError(f"invalid object key {key!r}: it holds NUL")
        try:
            key.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"invalid object key {key!r}: not valid unicode") from None
        if any(p.endswith(CONTINUED) for p in parts):
            raise ValueError(f"invalid object key {key!r}: a component ends with {CONTINUED!r} (the store's mark of "
                             f"a long component cut on disk)")
        # The key's directory on disk is kept, by the key's part before its last "/": building it with pathlib is most
        # of this call (~12 us, and a copy makes three: issue 26), and a partition's keys share one directory.
        directory, _, name = key.rpartition("/")
        if len(name.encode("utf-8")) > NAME_MAX_BYTES:  # the name is cut into directories too (see the module doc)
            return self.root.joinpath(*_disk_parts(parts))
        where = self._dirs.get(directory)
        if where is None:
            if len(self._dirs) >= _DIRS_KEPT:
                self._dirs.clear()
            where = self._dirs[directory] = self.root.joinpath(*_disk_parts(parts[:-1]))
        return where / name

    def put(self, key: str, chunks: Iterable[Chunk]) -> int:
        """Errors of ``chunks`` itself propagate unchanged; the store's own become RemoteStorageError."""
        return self._put(key, chunks, sync_dir=True)

    def put_deferred(self, key: str, chunks: Iterable[Chunk]) -> int:
        """:meth:`put`, except that the object's name is not made durable yet (its bytes are: fsynced before the
        rename): the next :meth:`put` into the same directory makes it so, as its directory fsync covers every name
        in that directory. For objects that only count once a later object of the same directory is written: a
        copy's data objects, committed by its index object (``rsm.manager``). A crash before that later put may
        lose the name (the copy was never committed: its clean-up deletes what is left). One directory fsync per
        copy instead of one per object (issue 26).

        What this gives up: on a filesystem that does not write its metadata in order (ext4 without a journal; ext4
        with one, and xfs, log renames in order), a power cut during the later put, after its rename and before its
        directory fsync, could keep the later name and lose this one. The copy is then not FINISHED in the metadata
        (that is written after the put returns) and its clean-up deletes it; only a recovery from the store alone
        (``rlm recover``, which takes an index object as committed) would meet such an index object."""
        return self._put(key, chunks, sync_dir=False)

    def put_uncommitted(self, key: str, chunks: Iterable[Chunk]) -> int:
        """:meth:`put_deferred` written in place: the object's file is made at its key and written there, no temp
        file, no rename. Its bytes are fsynced before this returns; its name is durable as :meth:`put_deferred`'s
        (the next put into its directory, or :meth:`sync_names`).

        Not atomic: a reader sees the object while it is written, and a write that fails, or a crash, leaves a part
        of it under its key (this removes it when it can). So only for an object that no one reads before a later
        object commits it, under a key no one else writes: a copy's data objects, committed by its index object, named
        by the copy's own segment id (``rsm.manager``). What a failed copy leaves, its clean-up deletes, or, after a
        crash, garbage collection, as any copy without its index object (``remove_stale_temp_files`` knows nothing of
        it: it is no temp file). What it saves (issue 26, a copy per 64 KiB segment on ext4): the temp file's entry
        in ``.tmp``, the rename into the key's directory, the temp file's fsync writing ``.tmp`` too, and a random
        name: 0.1-0.3 ms of system CPU a copy."""
        path = self._path(key)
        self.requests.add("put")
        fd = self._in_dir_of(key, path, lambda: os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        try:
            size = self._write_chunks(key, fd, chunks)
            try:
                if self.fsync:
                    os.fsync(fd)
            except OSError as err:
                raise RemoteStorageError(f"put {key} to {self.root} failed: {err}") from err
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        os.close(fd)
        return size

    def sync_names(self, keys: Iterable[str]) -> None:
        """Make the names of the objects ``keys`` (put with :meth:`put_deferred` or :meth:`put_uncommitted`) durable:
        one fsync per directory they are in, however many they are (a copy run's batch of copies, all in their
        partition's directory: one fsync for the batch, where a :meth:`put` of each index object cost one each, issue
        26). Their bytes were durable already (fsynced before each rename, or each put in place returned)."""
        if not self.fsync:
            return
        for d in dict.fromkeys(self._path(key).parent for key in keys):
            try:
                _fsync_dir(d)
            except OSError as err:
                raise RemoteStorageError(f"fsync of {d} failed: {err}") from err

    def _put(self, key: str, chunks: Iterable[Chunk], *, sync_dir: bool) -> int:
        path = self._path(key)
        self.requests.add("put")
        if self._links_tmpfiles:
            return self._put_linked(key, path, chunks, sync_dir=sync_dir)
        tmp = self.root / TMP_DIR / f"{uuid.uuid4().hex}"
        fd = -1
        renamed = False
        try:
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except OSError as err:
                raise RemoteStorageError(f"put {key} to {self.root} failed: {err}") from err
            size = self._write_chunks(key, fd, chunks)
            try:
                if self.fsync:
                    os.fsync(fd)
                os.close(fd)
                fd = -1
                try:
                    os.replace(tmp, path)
                except FileNotFoundError:  # the key's directory is new (not a mkdir per put: issue 26)
                    self._mkdirs(path.parent)
                    os.replace(tmp, path)
                renamed = True
                if self.fsync and sync_dir:
                    _fsync_dir(path.parent)
            except OSError as err:
                raise RemoteStorageError(f"put {key} to {self.root} failed: {err}") from err
        finally:
            if fd >= 0:
                os.close(fd)
            if not renamed:  # (once renamed, there is no temp file: no unlink of a missing name per put, issue 26)
                tmp.unlink(missing_ok=True)
        return size

    def _put_linked(self, key: str, path: Path, chunks: Iterable[Chunk], *, sync_dir: bool) -> int:
        """:meth:`_put` through an anonymous file: made in the key's directory (``O_TMPFILE``: no name, no entry in
        ``.tmp``, gone by itself if the process dies), written, fsynced, then linked at the key (``linkat`` through
        ``/proc/self/fd``), so the name appears with the whole object or not at all, as a rename gives. No random
        name, no rename across directories, no temp file left by a killed write (issue 26: the index object of each
        copy; ~0.04 ms less CPU than a temp file and its rename, and the directory fsync on the same fd). An object
        already at the key is replaced atomically: the new one linked under a temp name in ``.tmp``, renamed over
        it."""
        dfd = self._in_dir_of(key, path, lambda: os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY))
        try:
            try:
                fd = os.open(".", os.O_WRONLY | os.O_TMPFILE, 0o644, dir_fd=dfd)
            except OSError as err:
                raise RemoteStorageError(f"put {key} to {self.root} failed: {err}") from err
            try:
                size = self._write_chunks(key, fd, chunks)
                try:
                    if self.fsync:
                        os.fsync(fd)
                    try:
                        os.link(f"/proc/self/fd/{fd}", path.name, dst_dir_fd=dfd, follow_symlinks=True)
                    except FileExistsError:  # an overwrite
                        tmp = os.path.abspath(self.root / TMP_DIR / uuid.uuid4().hex)  # (absolute: dfd ignored)
                        os.link(f"/proc/self/fd/{fd}", tmp, dst_dir_fd=dfd, follow_symlinks=True)
                        try:
                            os.replace(tmp, path)
                        except OSError:
                            os.unlink(tmp)
                            raise
                    if self.fsync and sync_dir:
                        os.fsync(dfd)
                except OSError as err:
                    raise RemoteStorageError(f"put {key} to {self.root} failed: {err}") from err
            finally:
                os.close(fd)
        finally:
            os.close(dfd)
        return size

    def _in_dir_of(self, key: str, path: Path, opener: Callable[[], int]) -> int:
        """``opener()`` (an open in or of the directory of ``key``, at ``path``), the directory made first when it is
        new (not a mkdir per put: issue 26); its failure as RemoteStorageError."""
        try:
            try:
                return opener()
            except FileNotFoundError:
                self._mkdirs(path.parent)
                return opener()
        except OSError as err:
            raise RemoteStorageError(f"put {key} to {self.root} failed: {err}") from err

    def _write_chunks(self, key: str, fd: int, chunks: Iterable[Chunk]) -> int:
        """Write ``chunks`` (buffers or gather lists) to ``fd``; the bytes written. Errors of ``chunks`` itself
        propagate unchanged; a write's, as RemoteStorageError naming the byte.

        Chunks of ``bytes`` (immutable: a copy's sections, read from their files, and its index object) are held, up to
        :data:`_HELD_BYTES`, and written in one ``writev`` with what follows them; any other chunk (a block: a view of
        a buffer its producer fills again once it is written) is written at once, with what is held before it. A copy
        of a 64 KiB segment wrote its data object in five or six writes (the block, then each section: each write a
        system call that hands the GIL over), now two (issue 26)."""
        size = 0
        held: list[bytes] = []
        held_bytes = 0
        for chunk in chunks:
            parts = chunk if isinstance(chunk, list) else [chunk]
            n = sum(len(p) for p in parts)
            if held_bytes + n <= _HELD_BYTES and all(type(p) is bytes for p in parts):
                held += parts  # type: ignore[arg-type]
                held_bytes += n
                continue
            try:
                size += _write_all(fd, [*held, *parts])
            except OSError as err:
                raise RemoteStorageError(f"put {key} to {self.root} failed at byte {size}: {err}") from err
            held, held_bytes = [], 0
        if held:
            try:
                size += _write_all(fd, held)  # type: ignore[arg-type]
            except OSError as err:
                raise RemoteStorageError(f"put {key} to {self.root} failed at byte {size}: {err}") from err
        return size

    def _mkdirs(self, d: Path) -> None:
        """Create ``d`` and the missing directories above it, each made durable in its parent (with ``fsync``)."""
        missing = []
        while not d.is_dir():
            missing.append(d)
            d = d.parent
        for m in reversed(missing):
            try:
                m.mkdir()
            except FileExistsError:
                continue  # another put made it meanwhile
            if self.fsync:
                _fsync_dir(m.parent)

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

    def map_range(self, key: str, start: int, n: int) -> memoryview:
        """Bytes ``start..start + n - 1`` of ``key`` as a read-only view of the file mapped into memory (the page
        cache's pages, no copy; ``MAP_POPULATE``: mapped at once, not a fault per 16 pages); the mapping goes when
        the last view of it does. Raises :class:`~rsm.errors.RemoteResourceNotFoundError` when the object is absent,
        :class:`~rsm.errors.CorruptRemoteObjectError` when it ends before ``start + n`` (a page past a file's end
        is never mapped: reading it would kill the process with SIGBUS).

        Safe because an object that can be read is never changed in place: objects are immutable; a delete unlinks
        the file, which keeps a mapping of it valid (its pages stay until the mapping goes); a put replaces the file
        (a rename or a link of a new one); :meth:`put_uncommitted` truncates in place, but only a key no one reads
        before a later object commits it (a copy's data objects, each under its copy's own segment id). A file cut
        short by hand while mapped would kill the process (SIGBUS) where a read would have raised."""
        path = self._path(key)
        self.requests.add("get")
        if n <= 0:
            return memoryview(b"")
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError as err:
            raise RemoteResourceNotFoundError(f"no object {key} in {self.root}") from err
        except OSError as err:
            raise RemoteStorageError(f"get {key} from {self.root} failed: {err}") from err
        try:
            size = os.fstat(fd).st_size
            if start + n > size:
                raise CorruptRemoteObjectError(f"truncated read: expected {n} bytes, found {max(0, size - start)}",
                                               key=key, position=min(start, size))
            lead = start % mmap.ALLOCATIONGRANULARITY
            mapped = MappedFile(fd, lead + n, start - lead)
        except (OSError, ValueError) as err:
            os.close(fd)
            raise RemoteStorageError(f"map {key} from {self.root} failed: {err}") from err
        except BaseException:
            os.close(fd)
            raise
        return memoryview(mapped)[lead:lead + n]

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
        if prefix.startswith("/") or any(p in (".", "..") for p in d.split("/")):
            raise ValueError(f"invalid key prefix {prefix!r}: it would list outside the store root")
        if "\x00" in prefix:
            raise ValueError(f"invalid key prefix {prefix!r}: it holds NUL")  # no key does (put refuses it)
        if d.split("/")[0] == TMP_DIR:
            return iter([])  # temp files are no objects
        top = self.root.joinpath(*_disk_parts(d.split("/"))) if d else self.root
        out = []
        for dirpath, dirnames, filenames in os.walk(top):
            rel = os.path.relpath(dirpath, self.root)
            if rel == ".":
                dirnames[:] = [n for n in dirnames if n != TMP_DIR]
                rel = ""
            for name in filenames:
                key = _key_of([*(rel.split(os.sep) if rel else []), name])
                if key is not None and key.startswith(prefix):
                    try:
                        out.append(ObjectInfo(key, os.stat(os.path.join(dirpath, name)).st_size))
                    except FileNotFoundError:
                        continue
        out.sort(key=lambda o: o.key)
        return iter(out)

    def remove_stale_temp_files(self, cutoff_ms: int) -> list[str]:
        """Remove temp files of writes killed mid-way (``<root>/.tmp/*``) last modified before ``cutoff_ms``
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
                if e.is_file(follow_symlinks=False) and e.stat(follow_symlinks=False).st_mtime * 1000 < cutoff_ms:
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
