"""The object store protocol every store implements (and the contract tests run against).

Contracts:
- ``put`` streams the object from an iterable of chunks (buffers or gather lists of buffers, each valid only
  until the next is requested: a store copies what it keeps) and makes it visible atomically: before it returns a
  reader sees the old object or none, never part of the new one; if it raises, nothing new is visible.
- ``get`` is ranged, ``end_inclusive`` inclusive (HTTP Range semantics); an absent key raises
  :class:`~rsm.errors.RemoteResourceNotFoundError`; a range past the end is clamped; the returned stream
  must be closed (use ``with``).
- ``delete`` is idempotent: deleting an absent key is not an error.
- ``requests`` counts the store requests made, per kind, for benchmarks and the request-count targets, and in
  the process's Prometheus metrics: ``rsm_store_requests_total{store,kind}`` (S3: every HTTP request sent,
  retries included, ``kind`` the S3 operation; filesystem: each operation) and
  ``rsm_store_request_errors_total{store,kind,status}`` (S3: calls that failed after botocore's retries, by HTTP
  status, ``connection`` when no response came; a 404 is an answer, not an error). Label values come from closed
  sets (S3 operation names, HTTP statuses).

Beyond :class:`Store`, a store may have optional capabilities, each declared below as a protocol of its own
(:data:`OPTIONAL_MEMBERS` lists them by name). :class:`~rsm.manager.RemoteStorageManager` looks each one up on the
store (``getattr``, so a wrapping store that delegates with ``__getattr__`` keeps its inner store's) and does what the
protocol's docstring says when it is absent:

- :class:`PrefixedStore` (``key_prefix``, ``with_key_prefix``): keys under a configured prefix, and views of the
  store under another one (S3). Without: no prefix, and a copy recorded under another prefix cannot be addressed.
- :class:`ProbedStore` (``probe``): a health probe of its own (filesystem). Without: a HEAD of a key no copy uses.
- :class:`StaleUploadsStore` (``abort_stale_uploads``): unfinished uploads a killed writer left (S3 multipart
  uploads). Without: there are none.
- :class:`TempFilesStore` (``remove_stale_temp_files``): temp files a killed write left (filesystem). Without: none.
- :class:`ClosableStore` (``close``): resources to release (S3's upload pool). Without: nothing to release.
- :class:`ReadAheadStore` (``read_ahead_bytes``): sequential reads gain from ranged GETs in flight (S3: one
  connection carries far less than several). Without: no read-ahead (a filesystem read is one stream).
- :class:`MappedStore` (``map_range``): a range of an object mapped into memory, read without a copy
  (filesystem). Without: ranges are read into buffers.

``cutoff_ms`` is an instant (epoch milliseconds), not an age: what was last touched before it is stale.
"""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO, Protocol, runtime_checkable

from prometheus_client import Counter as PromCounter

__all__ = ["IOV_MAX", "OPTIONAL_MEMBERS", "Chunk", "ClosableStore", "MappedStore", "ObjectInfo", "PrefixedStore",
           "ProbedStore", "ReadAheadStore", "RequestCounter", "StaleUploadsStore", "Store", "TempFilesStore",
           "iter_buffers"]

IOV_MAX = min(os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024, 1024)
"""The most buffers one ``readv`` / ``writev`` / ``preadv`` call takes (scatter and gather lists go in groups)."""

Chunk = bytes | bytearray | memoryview | list[bytes | bytearray | memoryview]
"""A chunk of an object being put: a buffer, or a gather list of buffers (written with one ``writev``)."""


def iter_buffers(chunks: Iterable[Chunk]) -> Iterator[bytes | bytearray | memoryview]:
    """The buffers of ``chunks``, gather lists flattened."""
    for chunk in chunks:
        if isinstance(chunk, list):
            yield from chunk
        else:
            yield chunk


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    key: str
    size_bytes: int


STORE_REQUESTS = PromCounter("rsm_store_requests", "Requests sent to the remote store", ["store", "kind"])
STORE_ERRORS = PromCounter("rsm_store_request_errors", "Remote store requests that failed, by HTTP status "
                           "('connection': no response)", ["store", "kind", "status"])


class RequestCounter:
    """Thread-safe counts of store requests by kind (``get``, ``put``, ``list``, ...) of one store (``store``:
    ``s3``, ``fs``), also counted in the process's metrics (``rsm_store_requests_total``)."""

    def __init__(self, store: str = "other") -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._metric_children: dict[str, PromCounter] = {}   # kind -> its rsm_store_requests_total child
        self.store = store

    def add(self, kind: str, n: int = 1) -> None:
        """Count ``n`` requests of ``kind``. The metric's child per kind is looked up once and kept: ``labels()``
        on every request was ~57% of this call's CPU (1.71 -> 0.73 us), and a copy makes several store requests."""
        with self._lock:
            self._counts[kind] += n
            child = self._metric_children.get(kind)
            if child is None:
                child = self._metric_children[kind] = STORE_REQUESTS.labels(self.store, kind)
        child.inc(n)

    def error(self, kind: str, status: str) -> None:
        """A request of ``kind`` failed with HTTP ``status`` (or ``connection``)."""
        STORE_ERRORS.labels(self.store, kind, status).inc()

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())


@runtime_checkable
class Store(Protocol):
    requests: RequestCounter

    def put(self, key: str, chunks: Iterable[Chunk]) -> int:
        """Write the object from ``chunks``; return its size in bytes. Atomic, overwrites."""
        ...

    def get(self, key: str, start: int = 0, end_inclusive: int | None = None) -> BinaryIO:
        """A readable stream of the object's bytes ``start..end_inclusive``."""
        ...

    def get_bytes(self, key: str, start: int = 0, end_inclusive: int | None = None) -> bytes:
        """The bytes ``start..end_inclusive`` in memory (for small reads: index objects, one block)."""
        ...

    def head(self, key: str) -> int | None:
        """The object's size in bytes, or None when absent."""
        ...

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        """Objects whose key starts with ``prefix``, in key order."""
        ...

    def delete(self, key: str) -> None:
        """Delete the object; absent is not an error."""
        ...

    def delete_many(self, keys: Iterable[str]) -> None:
        """Delete several objects; absent ones are not an error."""
        ...


# -- optional capabilities (see the module doc): a store has each one whole or not at all ------------------------


class PrefixedStore(Protocol):
    """Optional: keys under a configured prefix (S3). Without: the prefix is ``""`` and only it is addressable."""

    key_prefix: str

    def with_key_prefix(self, key_prefix: str) -> Store:
        """The same store under another key prefix, sharing its clients and resources (for a copy recorded under
        an earlier ``key_prefix``)."""
        ...


class ProbedStore(Protocol):
    """Optional: a health probe of the store's own (the filesystem root is a writable directory). Without: a HEAD."""

    def probe(self) -> None:
        """Raise :class:`~rsm.errors.RemoteStorageError` when the store is unusable."""
        ...


class StaleUploadsStore(Protocol):
    """Optional: uploads that can be left unfinished by a killed writer (S3 multipart uploads). Without: none."""

    def abort_stale_uploads(self, prefix: str, cutoff_ms: int) -> list[str]:
        """Abort the unfinished uploads under ``prefix`` last touched before ``cutoff_ms`` (epoch ms); their keys."""
        ...


class TempFilesStore(Protocol):
    """Optional: temp files a killed write can leave behind (the filesystem store's ``.tmp``). Without: none."""

    def remove_stale_temp_files(self, cutoff_ms: int) -> list[str]:
        """Remove the temp files last modified before ``cutoff_ms`` (epoch ms); their names."""
        ...


class ClosableStore(Protocol):
    """Optional: resources to release (S3's upload pool). Without: nothing to release."""

    def close(self) -> None:
        """Release them. Idempotent."""
        ...


class DeferredNameStore(Protocol):
    """Optional: a put whose object name is made durable by a later put into the same directory, not by its own (the
    filesystem store: one directory fsync per copy, not one per object; ``rsm.manager`` puts a copy's data objects so,
    its index object last, beside them), or by :meth:`sync_names` (a batch of copies, ``RemoteStorageManager.
    make_durable``: one fsync per directory for the batch). Without: the manager uses ``put``."""

    def put_deferred(self, key: str, chunks: Iterable[Chunk]) -> int:
        """:meth:`Store.put`, except that the name is durable only once a later ``put`` in its directory returned, or
        :meth:`sync_names` of it."""
        ...

    def put_uncommitted(self, key: str, chunks: Iterable[Chunk]) -> int:
        """:meth:`put_deferred`, not atomic: written in place (seen while written; a failure can leave a part), for
        an object no one reads before a later object commits it, under a key no one else writes (a copy's data
        objects, committed by its index object)."""
        ...

    def sync_names(self, keys: Iterable[str]) -> None:
        """Make the names of ``keys`` (put with :meth:`put_deferred` or :meth:`put_uncommitted`) durable."""
        ...


class ReadAheadStore(Protocol):
    """Optional: the read-ahead budget a sequential read of this store gets by default (S3). Without: none."""

    read_ahead_bytes: int
    """Bytes of ranged GETs in flight ahead of one reader (:mod:`rsm.format.readahead`)."""


class MappedStore(Protocol):
    """Optional: a range of an object as a view of it mapped into memory (the filesystem: the page cache's pages, not
    a copy of them), valid for as long as the view is held whatever happens to the object meanwhile (so an object is
    never changed in place). Without: ranges are read into buffers (``get``)."""

    def map_range(self, key: str, start: int, n: int) -> memoryview:
        """Bytes ``start..start + n - 1`` of ``key``, read-only; the object ending before them is an error."""
        ...


OPTIONAL_MEMBERS: dict[str, type] = {
    "key_prefix": PrefixedStore, "with_key_prefix": PrefixedStore, "probe": ProbedStore,
    "abort_stale_uploads": StaleUploadsStore, "remove_stale_temp_files": TempFilesStore, "close": ClosableStore,
    "read_ahead_bytes": ReadAheadStore, "put_deferred": DeferredNameStore, "put_uncommitted": DeferredNameStore,
    "sync_names": DeferredNameStore, "map_range": MappedStore,
}
"""Every optional member of a store, by name: the protocol declaring it."""
