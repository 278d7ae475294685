"""The RemoteStorageManager: the ledger/entry object format on a store, with throttles.

Copy (streams; memory is two blocks plus the store's part buffers, S3: ``upload_memory_bytes``, whatever the segment
size):
  1. the ``.log`` is scanned batch by batch (CRC-32C checked) and packed into blocks of ``block_size_bytes``;
     only the batches of ``[start_offset, end_offset_inclusive]`` are kept: leading batches below
     ``start_offset`` (a segment straddling the highest remote offset after a leadership move) are skipped, and
     the first kept one must start exactly at ``start_offset`` (checked before anything is uploaded).
     :func:`kept_range` tells the caller the kept bytes beforehand (its ``segment_size_bytes``). With
     ``check_epochs`` the batches' leader-epoch map is taken on the way (:mod:`rsm.log.epochs`) and must be the
     metadata's ``segment_leader_epochs`` once the last block is out, before any section or the index object;
  2. blocks are streamed into data object 0, 1, ... each closed before it would pass
     ``max_data_object_bytes`` (PIP-76 offload segments: a huge segment spans several objects);
  3. Kafka's five indexes are appended verbatim to the last data object (sections, CRC-32C each);
  4. the index object is written last: it is the commit point (no index, nothing readable). With ``durable=False``
     (a batch of copies) the objects' bytes are durable when the copy returns, their names only once
     :meth:`RemoteStorageManager.make_durable` of the batch returns: on the filesystem store one directory fsync
     for the batch's copies, not one per copy; the caller publishes COPY_SEGMENT_FINISHED after it.
A failed copy removes what it wrote (best effort; leftovers without index are garbage-collected).

Key layouts: a copy returns custom metadata recording the key layout it was written under (the store's key prefix,
the entropy flag; ``rsm.format.custom_metadata``); reads and deletes of a segment use the layout its custom
metadata records, so changing ``key_prefix`` / ``key_entropy`` orphans nothing (segments without custom metadata
use the current configuration).

Reads: the decoded index objects are cached (LRU, bounded by count and by memory: ``index_cache_entries``,
``index_cache_bytes``), so a random read costs 2 requests cold (index + one ranged GET of the blocks needed) and 1
warm.

Encryption at rest (``encryption`` in the config; :mod:`rsm.encryption`, formats in :mod:`rsm.format.crypto`):
when enabled, each copy gets a fresh data key, wrapped by the active key id; its blocks, sections and index object
are sealed with AES-256-GCM as they are written. Reads open whatever a copy is (plain or sealed) with the
configured keys; the opened data key travels with the cached index, so request costs stay the same.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO, Literal

import google_crc32c
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from rsm.api import (
    CommittedCopy,
    CopyListing,
    IndexType,
    KeyLayout,
    LogRangeData,
    LogSegmentData,
    RemoteSegmentMetadata,
    RemoteStorageManagerApi,
    SegmentHandle,
    StoredCopy,
    StoredPartition,
    VerifyReport,
)
from rsm.encryption import EncryptionConfig
from rsm.errors import CopyCancelledError, CorruptRemoteObjectError, RemoteStorageError, StoreConfigError
from rsm.format.block import BLOCK_HEADER_LENGTH
from rsm.format.blockcache import BlockCache
from rsm.format.crypto import SEALED_OVERHEAD, BlockSealer, CopyCipher, decode_copy_index, new_copy_cipher
from rsm.format.custom_metadata import decode_custom_metadata, encode_custom_metadata
from rsm.format.index import (
    BlockInfo,
    IndexObject,
    IndexSection,
    LedgerIndex,
    LedgerMetadata,
    encode_index,
)
from rsm.format.keys import (
    KEY_BASE_LENGTH,
    SegmentKeys,
    ledger_id_for,
    parse_key_tail,
    parse_partition_key,
    partition_prefix,
    segment_id_of_key,
)
from rsm.format.ledger import (
    BlockDraft,
    EntryAddress,
    KeptRange,
    LedgerChangedError,
    LedgerWriter,
    SegmentRangeError,
    kept_range,
)
from rsm.format.reader import SegmentReader
from rsm.log.epochs import BatchEpochError, BatchEpochs, EpochMismatchError
from rsm.log.errors import LogFormatError
from rsm.log.held import held_fd
from rsm.log.indexes import KafkaIndexBuilder
from rsm.store.base import Chunk, Store
from rsm.store.fs import FileSystemStore
from rsm.store.hedge import HEDGE_SHARE
from rsm.store.upload import PART_SIZE_BYTES, UPLOAD_CONCURRENCY, UPLOAD_MEMORY_BYTES
from rsm.throttle import Throttle

__all__ = ["KeptRange", "KeyLayout", "RemoteStorageManager", "RsmConfig", "index_size_bytes", "kept_range",
           "segment_id_of_key"]

log = logging.getLogger(__name__)

MiB = 1024 * 1024
FILE_CHUNK_BYTES = 1 * MiB
BLOCK_CACHE_BYTES = 64 * MiB
"""The block cache: the current blocks of its streams (rsm.format.blockcache): where the store reads ahead (S3) their
requests (8 of 8 MiB), each stream's read-ahead window apart, within the process's read-ahead budget; else the blocks
themselves (16 of 4 MiB)."""

# What an index section is written from: a local file, bytes, or a function giving the bytes once the blocks are out.
_SectionSource = Path | bytes | Callable[[], bytes]


class RsmConfig(BaseModel):
    """Configuration of the RemoteStorageManager (frozen; validated at the edge)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    store: Literal["fs", "s3"] = "fs"
    root_path: Path | None = Field(None, description="fs store: the root directory")
    bucket: str | None = Field(None, description="s3 store: the bucket")
    endpoint_url: str | None = Field(None, description="s3 store: endpoint of an S3-compatible service")
    region: str | None = None
    key_prefix: str = Field("", description="s3 store: prefix of every key in the bucket")
    key_entropy: bool = Field(False, description="prefix each partition's keys with 4 hex digits of a hash")
    block_size_bytes: int = Field(4 * MiB, ge=LedgerWriter.MIN_BLOCK_SIZE_BYTES)
    max_data_object_bytes: int = Field(1024 * MiB, ge=4096)
    part_size_bytes: int = Field(PART_SIZE_BYTES, ge=5 * MiB, description="s3 store: an upload's part "
                                 "(by default S3's smallest, 5 MiB: the most parts in flight within "
                                 "upload_memory_bytes)")
    upload_concurrency: int = Field(UPLOAD_CONCURRENCY, ge=1, description="s3 store: parts uploading at once, all "
                                    "copies together (the upload pool's threads)")
    upload_memory_bytes: int = Field(UPLOAD_MEMORY_BYTES, ge=10 * MiB, description="s3 store: part buffers one "
                                     "object's upload holds at most, the one filling included: parts in flight = "
                                     "upload_memory_bytes // part_size_bytes - 1 (at most upload_concurrency)")
    hedge_share: float = Field(HEDGE_SHARE, ge=0, le=1, description="s3 store: a GET not answered by the p95 of "
                               "recent GETs is sent again (rsm.store.hedge), at most this share of GETs; 0 off")
    retries: int = Field(5, ge=0)
    copy_rate_bytes_per_second: float | None = Field(None, ge=0)
    fetch_rate_bytes_per_second: float | None = Field(None, ge=0)
    index_cache_entries: int = Field(1024, ge=0, description="decoded index objects cached (a warm random read is "
                                     "one request, a cold one two); 0 off")
    index_cache_bytes: int = Field(128 * MiB, ge=0, description="memory the cached indexes may take (about 448 "
                                   "bytes per block: a 1 GiB segment of 4 MiB blocks about 113 KiB, of 64 KiB blocks "
                                   "7 MiB); the least recently used go first")
    read_ahead_bytes: int | None = Field(
        None, ge=0, description="sequential reads of several blocks: bytes of ranged GETs in flight ahead of the "
        "reader (rsm.format.readahead); 0 off; None: the store's own figure (S3: 80 MiB; filesystem: off, where "
        "it measured slower)")
    read_ahead_request_bytes: int = Field(8 * MiB, ge=1, description="bytes one read-ahead GET asks for "
                                          "(whole blocks, one at least)")
    block_cache_bytes: int | None = Field(
        None, ge=0, description="reads of one block at a time (a history Fetch after another): when they are "
        "sequential, a stream per copy reads ahead across them (rsm.format.blockcache); bounds the streams' current "
        "blocks (one read-ahead request each, capacity / read_ahead_request_bytes streams; where the store does "
        "not read ahead, the block each, capacity / block size streams) and keeps each current block verified; 0 "
        "off; None: 64 MiB")
    fsync: bool = True
    create_bucket: bool = False
    encryption: EncryptionConfig = Field(default_factory=EncryptionConfig,
                                         description="encryption at rest (rsm.encryption); off by default")

    @field_validator("encryption", mode="before")
    @classmethod
    def _encryption_json(cls, v: object) -> object:
        # Spark passes options as strings: store.encryption may be the section as JSON
        if isinstance(v, str):
            import json

            try:
                return json.loads(v)
            except ValueError:
                raise ValueError("expected the encryption section, or it as a JSON object") from None
        return v

    @model_validator(mode="after")
    def _two_parts_in_memory(self) -> RsmConfig:
        if self.upload_memory_bytes < 2 * self.part_size_bytes:
            raise ValueError(f"upload_memory_bytes ({self.upload_memory_bytes}) must hold 2 parts of part_size_bytes "
                             f"({self.part_size_bytes}) at least: one filling, one uploading")
        return self

    def make_store(self) -> Store:
        if self.store == "fs":
            if self.root_path is None:
                raise StoreConfigError("store 'fs' needs root_path")
            return FileSystemStore(self.root_path, fsync=self.fsync)
        if not self.bucket:
            raise StoreConfigError("store 's3' needs bucket")
        from rsm.store.s3 import S3Store

        return S3Store(self.bucket, endpoint_url=self.endpoint_url, region_name=self.region,
                       key_prefix=self.key_prefix, part_size_bytes=self.part_size_bytes,
                       upload_concurrency=self.upload_concurrency, upload_memory_bytes=self.upload_memory_bytes,
                       hedge_share=self.hedge_share, retries=self.retries, create_bucket=self.create_bucket)


INDEX_BYTES_PER_BLOCK = 448
"""Memory of one block's entry in a decoded index (tracemalloc of decoding: 17 / 262 / 1,046 blocks took 8.4 / 113 /
458 KiB, 5.6-5.9x the index object's stored size)."""
INDEX_BYTES_BASE = 1024
"""Memory of a decoded index besides its blocks (ledger metadata, sections)."""


def index_size_bytes(ledger: LedgerIndex) -> int:
    """About what a decoded index holds in memory: what the index cache counts it as."""
    return INDEX_BYTES_BASE + INDEX_BYTES_PER_BLOCK * len(ledger.blocks)


class _LruCache:
    """Decoded indexes, least recently used evicted first while more than ``capacity`` entries or ``capacity_bytes``
    (by :func:`index_size_bytes`) are held. An index larger than ``capacity_bytes`` alone is not cached."""

    def __init__(self, capacity: int, capacity_bytes: int) -> None:
        self._capacity = capacity
        self._capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._items: OrderedDict[str, tuple[LedgerIndex, int]] = OrderedDict()
        self._bytes = 0

    @property
    def size_bytes(self) -> int:
        """What the cached indexes hold (by :func:`index_size_bytes`)."""
        with self._lock:
            return self._bytes

    def get(self, key: str) -> LedgerIndex | None:
        with self._lock:
            item = self._items.get(key)
            if item is None:
                return None
            self._items.move_to_end(key)
            return item[0]

    def put(self, key: str, value: LedgerIndex) -> None:
        size = index_size_bytes(value)
        if self._capacity == 0 or size > self._capacity_bytes:
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            self._items[key] = (value, size)
            self._bytes += size
            while len(self._items) > self._capacity or self._bytes > self._capacity_bytes:
                _, (_, dropped) = self._items.popitem(last=False)
                self._bytes -= dropped

    def drop(self, key: str) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]


class RemoteStorageManager(RemoteStorageManagerApi):
    """KIP-405 RemoteStorageManager over a :class:`~rsm.store.base.Store`. Thread-safe."""

    checks_epochs = True
    """Its copies take ``check_epochs``: with it, the copied batches' leader epochs (:mod:`rsm.log.epochs`, from the
    copy's own walk of the batches) must be the metadata's ``segment_leader_epochs``; else
    :class:`~rsm.log.epochs.EpochMismatchError` (or :class:`~rsm.log.epochs.BatchEpochError`: batches without a map),
    raised as is, not as a :class:`RemoteStorageError` (the store did nothing wrong), nothing readable."""

    def __init__(self, config: RsmConfig, store: Store | None = None, *, copy_throttle: Throttle | None = None,
                 fetch_throttle: Throttle | None = None) -> None:
        self.config = config
        self.store = store if store is not None else config.make_store()
        self.copy_throttle = copy_throttle or Throttle("copy", config.copy_rate_bytes_per_second)
        self.fetch_throttle = fetch_throttle or Throttle("fetch", config.fetch_rate_bytes_per_second)
        self._cache = _LruCache(config.index_cache_entries, config.index_cache_bytes)
        self.layout = KeyLayout(getattr(self.store, "key_prefix", "") or "", config.key_entropy)  # PrefixedStore
        """The key layout new copies are written under (what their custom metadata records)."""
        try:  # the encoder refuses a layout past MAX_CUSTOM_METADATA_BYTES
            self._custom_metadata = encode_custom_metadata(self.layout)
        except ValueError as err:
            raise StoreConfigError(f"key_prefix: {err}") from err
        self._stores: dict[str, Store] = {self.layout.key_prefix: self.store}
        self._stores_lock = threading.Lock()
        cache_bytes = config.block_cache_bytes
        if cache_bytes is None:
            cache_bytes = BLOCK_CACHE_BYTES
        self.block_cache = BlockCache(cache_bytes) if cache_bytes else None
        """Whole blocks of sequential one-block reads (rsm.format.blockcache), shared by this manager's readers."""
        self.key_provider = config.encryption.key_provider()
        """The encryption keys (:mod:`rsm.encryption`), read from the key file / environment; None without."""

    # -- key layouts -------------------------------------------------------------------------------------------

    def layout_of(self, m: RemoteSegmentMetadata) -> KeyLayout:
        """The key layout of a copy: the one its custom metadata records, the current one when it has none.

        Raises :class:`~rsm.format.custom_metadata.CustomMetadataError` for custom metadata not ours."""
        return self.layout if m.custom_metadata is None else decode_custom_metadata(m.custom_metadata)

    def store_for(self, layout: KeyLayout) -> Store:
        """The store addressing keys under ``layout.key_prefix`` (the configured store, or a view of it)."""
        store = self._stores.get(layout.key_prefix)
        if store is not None:
            return store
        with_prefix: Callable[[str], Store] | None = getattr(self.store, "with_key_prefix", None)  # PrefixedStore
        if with_prefix is None:
            raise RemoteStorageError(f"{self.store!r} cannot address keys under prefix {layout.key_prefix!r} "
                                     "(recorded with a copy)")
        with self._stores_lock:
            return self._stores.setdefault(layout.key_prefix, with_prefix(layout.key_prefix))

    PROBE_KEY = ".rlm-probe"
    """Asked for by :meth:`probe`: no copy's key (keys start with a topic name, never with a dot)."""

    def probe(self) -> None:
        probe: Callable[[], None] | None = getattr(self.store, "probe", None)  # ProbedStore
        if probe is not None:
            probe()
        else:
            self.store.head(self.PROBE_KEY)

    def partition_prefix(self, topic_name: str, topic_id, partition: int, layout: KeyLayout | None = None) -> str:
        """The key prefix (within ``store_for(layout)``) of every copy of one partition under ``layout``."""
        layout = self.layout if layout is None else layout
        root_id, root_name = layout.root(topic_id, topic_name)
        return partition_prefix(root_name, root_id, partition, entropy=layout.entropy)

    def keys(self, m: RemoteSegmentMetadata) -> SegmentKeys:
        """The keys of a copy, under its recorded layout (within ``store_for(layout_of(m))``)."""
        return self._keys(m, self.layout_of(m))

    @staticmethod
    def _keys(m: RemoteSegmentMetadata, layout: KeyLayout) -> SegmentKeys:
        root_id, root_name = layout.root(m.topic_id, m.topic_name)
        return SegmentKeys.for_segment(root_name, root_id, m.partition, m.start_offset, m.remote_segment_id,
                                       entropy=layout.entropy)

    def _located(self, m: RemoteSegmentMetadata) -> tuple[Store, SegmentKeys, str]:
        """(store, keys, cache key) of a copy."""
        layout = self.layout_of(m)
        keys = self._keys(m, layout)
        return self.store_for(layout), keys, layout.key_prefix + keys.index

    # -- copy --------------------------------------------------------------------------------------------------

    def copy_log_segment_data(self, segment_metadata: RemoteSegmentMetadata,
                              segment_data: LogSegmentData, *, cancel: threading.Event | None = None,
                              durable: bool = True, check_epochs: bool = False) -> bytes | None:
        """See :meth:`RemoteStorageManagerApi.copy_log_segment_data`. Always written under the current layout
        (``self.layout``), whatever ``segment_metadata.custom_metadata`` says; returns that layout's custom
        metadata (``rsm.format.custom_metadata``). ``durable=False``: the copy is durable only once
        :meth:`make_durable` of it returns (see the module doc). ``check_epochs``: the copied batches' leader epochs
        must be ``segment_metadata.segment_leader_epochs`` (:attr:`checks_epochs`)."""
        m = segment_metadata
        data = segment_data
        epochs = BatchEpochs(m.start_offset, m.end_offset_inclusive, data.log_path) if check_epochs else None
        writer = LedgerWriter(ledger_id_for(m.remote_segment_id), self.config.block_size_bytes, epochs=epochs)
        sections: list[tuple[IndexType, _SectionSource]] = [
            (IndexType.OFFSET, data.offset_index_path), (IndexType.TIMESTAMP, data.time_index_path)]
        if data.producer_snapshot_path is not None:
            sections.append((IndexType.PRODUCER_SNAPSHOT, data.producer_snapshot_path))
        if data.transaction_index_path is not None:
            sections.append((IndexType.TRANSACTION, data.transaction_index_path))
        sections.append((IndexType.LEADER_EPOCH, data.leader_epoch_checkpoint))
        return self._copy_guarded(m, writer, lambda: _epochs_checked(writer.blocks(
            data.log_path, verify_crc=True, start_offset=m.start_offset,
            end_offset_inclusive=m.end_offset_inclusive), epochs, m), sections, cancel, durable)

    def copy_log_range(self, segment_metadata: RemoteSegmentMetadata, range_data: LogRangeData, *,
                       cancel: threading.Event | None = None, durable: bool = True,
                       check_epochs: bool = False) -> bytes | None:
        """See :meth:`RemoteStorageManagerApi.copy_log_range`: the offset and time indexes are written here
        (:class:`~rsm.log.indexes.KafkaIndexBuilder`) as the blocks are, and appended after them as sections.
        ``durable``, ``check_epochs``: as :meth:`copy_log_segment_data`'s."""
        m = segment_metadata
        where = range_data.pieces[0].log_path if range_data.pieces else "<no piece>"
        epochs = BatchEpochs(m.start_offset, m.end_offset_inclusive, where) if check_epochs else None
        writer = LedgerWriter(ledger_id_for(m.remote_segment_id), self.config.block_size_bytes, epochs=epochs)
        indexes = KafkaIndexBuilder(m.start_offset)
        sections: list[tuple[IndexType, _SectionSource]] = [
            (IndexType.OFFSET, indexes.offset_index), (IndexType.TIMESTAMP, indexes.time_index)]
        if range_data.transaction_index is not None:
            sections.append((IndexType.TRANSACTION, range_data.transaction_index))
        sections.append((IndexType.LEADER_EPOCH, range_data.leader_epoch_checkpoint))
        return self._copy_guarded(m, writer, lambda: _epochs_checked(writer.piece_blocks(
            range_data.pieces, start_offset=m.start_offset, end_offset_inclusive=m.end_offset_inclusive,
            on_batch=indexes.add), epochs, m), sections, cancel, durable)

    def make_durable(self, segment_metadatas: Iterable[RemoteSegmentMetadata]) -> None:
        """Make copies written with ``durable=False`` durable (their objects' names: their bytes are already): on the
        filesystem store one fsync per directory, for all of them (:meth:`FileSystemStore.sync_names`); nothing on a
        store whose puts are durable when they return (S3). Raises :class:`RemoteStorageError` when it fails: the
        copies are then not durable, and must not be published COPY_SEGMENT_FINISHED."""
        by_store: dict[int, tuple[Store, list[str]]] = {}
        for m in segment_metadatas:
            store, keys, _ = self._located(m)
            by_store.setdefault(id(store), (store, []))[1].append(keys.index)
        for store, index_keys in by_store.values():
            sync: Callable[[Iterable[str]], None] | None = getattr(store, "sync_names", None)  # FileSystemStore
            if sync is not None:
                sync(index_keys)

    def _copy_guarded(self, m: RemoteSegmentMetadata, writer: LedgerWriter,
                      blocks: Callable[[], Iterator[tuple[BlockDraft, memoryview]]],
                      sections: list[tuple[IndexType, _SectionSource]],
                      cancel: threading.Event | None = None, durable: bool = True) -> bytes | None:
        """Copy under the current layout; on any failure (or ``cancel`` set before the index object is written)
        remove what was written and raise as the API says."""
        keys = self._keys(m, self.layout)
        try:
            ledger = self._copy(m, keys, writer, blocks(), sections, cancel, durable)
        except BaseException as err:
            self._cleanup(keys)
            if isinstance(err, BatchEpochError | EpochMismatchError):
                raise  # (check_epochs) the local segment's epochs refused: no store failure, as CopyCancelledError
            if isinstance(err, SegmentRangeError):
                raise RemoteStorageError(f"copy of {keys.base} (offsets {m.start_offset}..{m.end_offset_inclusive}): "
                                         f"{err}; nothing uploaded") from err
            if isinstance(err, LogFormatError | LedgerChangedError):
                raise RemoteStorageError(f"copy of {keys.base}: the local segment is unreadable: {err}") from err
            if isinstance(err, OSError):
                raise RemoteStorageError(f"copy of {keys.base}: {err}") from err
            raise
        self._cache.put(self.layout.key_prefix + keys.index, ledger)
        return self._custom_metadata

    def _copy(self, m: RemoteSegmentMetadata, keys: SegmentKeys, writer: LedgerWriter,
              block_iter: Iterator[tuple[BlockDraft, memoryview]],
              sections_src: list[tuple[IndexType, _SectionSource]],
              cancel: threading.Event | None = None, durable: bool = True) -> LedgerIndex:
        ledger_id = writer.ledger_id
        # The first block before any put: a .log that does not hold the range fails with nothing uploaded.
        first_block = next(block_iter, None)
        cipher = self._new_cipher(keys)  # None: a plain copy

        blocks: list[BlockInfo] = []
        sections: list[IndexSection] = []
        object_lengths: list[int] = []
        state = {"pending": first_block, "done": False}
        limit = self.config.max_data_object_bytes
        throttle = self.copy_throttle

        def paid(n_bytes: int) -> None:
            """The throttle's toll for the next ``n_bytes``; a cancelled copy stops here (between blocks)."""
            throttle.acquire(n_bytes, cancel)
            if cancel is not None and cancel.is_set():
                raise CopyCancelledError(f"copy of {keys.base} (offsets {m.start_offset}..{m.end_offset_inclusive}) "
                                         "cancelled: nothing uploaded")

        def object_chunks(obj: int) -> Iterator[Chunk]:
            pos = 0
            while True:
                item = state["pending"] if state["pending"] is not None else next(block_iter, None)
                state["pending"] = None
                if item is None:
                    break
                draft, block = item
                stored = draft.block_length if cipher is None else draft.block_length + SEALED_OVERHEAD
                # objects split between batches: a batch's fragments stay in one object (which may then pass
                # the limit by up to that batch)
                if pos > 0 and pos + stored > limit and draft.fragment_number == 0:
                    state["pending"] = item
                    if sealer is not None and (sealed := sealer.flush()) is not None:
                        yield sealed
                    return
                blocks.append(BlockInfo(draft.first_entry_id, draft.part_id, obj, pos, stored,
                                        draft.entry_count, draft.first_offset, draft.last_offset,
                                        draft.max_timestamp_ms, draft.log_position, draft.log_bytes,
                                        draft.fragment_number, draft.fragment_count))
                paid(stored)
                if sealer is None:
                    yield block
                else:
                    sealed = sealer.push(block, ledger_id=ledger_id, object_number=obj, position=pos)
                    if sealed is not None:
                        yield sealed
                pos += stored
            if sealer is not None and (sealed := sealer.flush()) is not None:
                yield sealed
            for kind, src in sections_src:
                crc = [0]  # of the plain section
                chunks = _crc_tracked(_file_chunks(src), crc)
                if cipher is not None:
                    chunks = cipher.seal_section(chunks, ledger_id=ledger_id, object_number=obj, position=pos)
                length = 0
                for chunk in chunks:
                    length += len(chunk)
                    paid(len(chunk))
                    yield chunk
                sections.append(IndexSection(kind, obj, pos, length, crc[0]))
                pos += length
            state["done"] = True

        sealer = None if cipher is None else BlockSealer(cipher)
        obj = 0
        # The data objects' names need not be durable before the index object's: it is put into the same directory
        # last, and on the filesystem store its put makes every name there durable (FileSystemStore.put_deferred).
        # Nor need they be atomic: no one reads them before the index object commits them, and the key is this copy's
        # own (FileSystemStore.put_uncommitted: written in place, no temp file, no rename).
        put_index_deferred = getattr(self.store, "put_deferred", self.store.put)
        put_data = getattr(self.store, "put_uncommitted", put_index_deferred)
        try:
            while True:
                object_lengths.append(put_data(keys.data(obj), object_chunks(obj)))
                if state["done"]:
                    break
                obj += 1
        finally:
            if sealer is not None:
                sealer.close()

        meta = LedgerMetadata(
            remote_segment_id=m.remote_segment_id, topic_id=m.topic_id, topic_name=m.topic_name,
            partition=m.partition, start_offset=m.start_offset, end_offset_inclusive=m.end_offset_inclusive,
            max_timestamp_ms=max(m.max_timestamp_ms, writer.max_timestamp_ms),
            event_timestamp_ms=m.event_timestamp_ms if m.event_timestamp_ms >= 0 else int(time.time() * 1000),
            broker_id=m.broker_id, segment_size_bytes=writer.log_bytes, entry_count=writer.entry_count,
            leader_epochs=tuple(m.segment_leader_epochs), data_object_lengths=tuple(object_lengths),
            sections=tuple(sections))
        ledger = LedgerIndex(ledger_id, meta, tuple(blocks), cipher=cipher)
        index = IndexObject(sum(object_lengths), BLOCK_HEADER_LENGTH, (ledger,))
        raw = encode_index(index)
        paid(0)  # the last point of no return: without the index object, nothing of the copy is readable
        # not durable: its name (and the data objects') made so by make_durable, when the store can (sync_names)
        put_index = put_index_deferred if not durable and hasattr(self.store, "sync_names") else self.store.put
        put_index(keys.index, [raw if cipher is None else cipher.seal_index(raw, key_base=keys.base)])
        return ledger

    def _new_cipher(self, keys: SegmentKeys) -> CopyCipher | None:
        """A new copy's data key, wrapped by the active key id; None when encryption is off."""
        enc = self.config.encryption
        if not enc.enabled:
            return None
        if self.key_provider is None or enc.active_key_id is None:  # the config validators rule this out
            raise StoreConfigError("encryption is enabled without an active key id and keys")
        return new_copy_cipher(self.key_provider, enc.active_key_id, key_base=keys.base)

    def _cleanup(self, keys: SegmentKeys) -> None:
        try:
            self._delete_keys(keys)
        except RemoteStorageError as err:
            log.warning("could not remove the partial copy %s: %s", keys.base, err)

    # -- reads -------------------------------------------------------------------------------------------------

    def load_index(self, keys: SegmentKeys, store: Store | None = None, cache_key: str | None = None) -> LedgerIndex:
        """The segment's ledger index, from the cache or one GET (of ``store``, the configured one by default)."""
        store = self.store if store is None else store
        cache_key = (self.layout.key_prefix + keys.index) if cache_key is None else cache_key
        cached = self._cache.get(cache_key)
        if cached is not None:
            return cached
        data = store.get_bytes(keys.index)
        index = decode_copy_index(data, key=keys.index, key_base=keys.base, provider=self.key_provider,
                                  require_sealed=self.config.encryption.require_encrypted)
        if len(index.ledgers) != 1:
            raise RemoteStorageError(f"{keys.index} holds {len(index.ledgers)} ledgers, expected 1")
        ledger = index.ledgers[0]
        self._cache.put(cache_key, ledger)
        return ledger

    def reader(self, segment_metadata: RemoteSegmentMetadata) -> SegmentReader:
        """A reader of the copy, under its recorded key layout (with this package's entry-level access)."""
        store, keys, cache_key = self._located(segment_metadata)
        ahead = self.config.read_ahead_bytes
        if ahead is None:
            ahead = getattr(store, "read_ahead_bytes", 0)  # ReadAheadStore
        return SegmentReader(store, keys, self.load_index(keys, store, cache_key),
                             on_bytes=self.fetch_throttle.acquire, read_ahead_bytes=ahead,
                             read_ahead_request_bytes=self.config.read_ahead_request_bytes,
                             block_cache=self.block_cache, map_range=getattr(store, "map_range", None))  # MappedStore

    def open_segment(self, segment_metadata: RemoteSegmentMetadata) -> SegmentHandle:
        """See :meth:`RemoteStorageManagerApi.open_segment`."""
        return self.reader(segment_metadata)

    def verify_copy(self, segment_metadata: RemoteSegmentMetadata) -> VerifyReport:
        """:func:`rsm.verify.verify_segment` of the copy, under its recorded key layout."""
        from rsm.verify import verify_segment

        store, keys, _ = self._located(segment_metadata)
        return verify_segment(store, keys, key_provider=self.key_provider,
                              require_sealed=self.config.encryption.require_encrypted)

    # -- what is stored (garbage collection) -------------------------------------------------------------------

    def list_copies(self, topic_id: uuid.UUID, topic_name: str, partition: int, layout: KeyLayout) -> CopyListing:
        """See :meth:`RemoteStorageManagerApi.list_copies` (one listing of the store, materialized)."""
        store = self.store_for(layout)
        prefix = self.partition_prefix(topic_name, topic_id, partition, layout)
        found: dict[str, tuple[int, uuid.UUID, list[str]]] = {}
        foreign: list[str] = []
        n = 0
        for obj in store.list(prefix):
            n += 1
            tail = obj.key[len(prefix):]
            parsed = parse_key_tail(tail)
            if parsed is None:
                foreign.append(obj.key)
                continue
            found.setdefault(prefix + tail[:KEY_BASE_LENGTH], (*parsed, []))[2].append(obj.key)
        custom = encode_custom_metadata(layout)
        copies = tuple(StoredCopy(RemoteSegmentMetadata(
            remote_segment_id=sid, topic_id=topic_id, topic_name=topic_name, partition=partition,
            start_offset=base_offset, end_offset_inclusive=base_offset, custom_metadata=custom),
            layout, layout.key_prefix + base, tuple(keys)) for base, (base_offset, sid, keys) in found.items())
        return CopyListing(layout, prefix, copies, tuple(foreign), n)

    # -- recovery: the store alone -----------------------------------------------------------------------------

    def list_partitions(self, layout: KeyLayout | None = None) -> list[StoredPartition]:
        """See :meth:`RemoteStorageManagerApi.list_partitions` (one listing of the whole store under ``layout``)."""
        layout = self.layout if layout is None else layout
        store = self.store_for(layout)
        found: set[tuple[str, uuid.UUID, int]] = set()
        last = None
        for obj in store.list(""):
            if last is not None and obj.key.startswith(last):
                continue  # keys come in key order: the rest of a partition already seen
            parsed = parse_partition_key(obj.key, entropy=layout.entropy)
            if parsed is None:
                continue
            name, topic_id, partition, last = parsed
            found.add((name, topic_id, partition))
        return [StoredPartition(topic_id, name, partition, layout) for name, topic_id, partition in sorted(found)]

    def read_committed_copy(self, stored: StoredCopy) -> CommittedCopy:
        """See :meth:`RemoteStorageManagerApi.read_committed_copy`."""
        m = stored.copy
        layout = self.layout_of(m)
        store, keys, _ = self._located(m)
        # From the store itself, never the cache: the store is the truth recovery rebuilds from.
        index = decode_copy_index(store.get_bytes(keys.index), key=keys.index, key_base=keys.base,
                                  provider=self.key_provider, require_sealed=self.config.encryption.require_encrypted)
        if len(index.ledgers) != 1:
            raise CorruptRemoteObjectError(f"{len(index.ledgers)} ledgers in one copy's index object, expected 1",
                                           key=keys.index, position=0)
        ledger = index.ledgers[0]
        meta = ledger.metadata
        root_id, _ = layout.root(m.topic_id, m.topic_name)
        if (meta.remote_segment_id != m.remote_segment_id or meta.topic_id != root_id
                or meta.partition != m.partition or meta.start_offset != m.start_offset):
            raise CorruptRemoteObjectError(
                f"the index object names segment {meta.remote_segment_id} of {meta.topic_name}-{meta.partition}"
                f"({meta.topic_id}) from offset {meta.start_offset}, its key another copy", key=keys.index,
                position=0)
        md = RemoteSegmentMetadata(
            remote_segment_id=meta.remote_segment_id, topic_id=m.topic_id, topic_name=m.topic_name,
            partition=meta.partition, start_offset=meta.start_offset, end_offset_inclusive=meta.end_offset_inclusive,
            max_timestamp_ms=meta.max_timestamp_ms, segment_size_bytes=meta.segment_size_bytes,
            broker_id=meta.broker_id, event_timestamp_ms=meta.event_timestamp_ms,
            segment_leader_epochs=tuple(meta.leader_epochs), custom_metadata=encode_custom_metadata(layout))
        return CommittedCopy(md, ledger.section(IndexType.TRANSACTION) is None, meta.entry_count,
                             sum(meta.data_object_lengths), stored.name)

    def relocated(self, segment_metadata: RemoteSegmentMetadata, topic_id: uuid.UUID,
                  topic_name: str) -> RemoteSegmentMetadata:
        """See :meth:`RemoteStorageManagerApi.relocated`."""
        m = segment_metadata
        layout = self.layout_of(m)
        root_id, root_name = layout.root(m.topic_id, m.topic_name)
        if (root_id, root_name) == (topic_id, topic_name):
            moved = KeyLayout(layout.key_prefix, layout.entropy)
        else:
            moved = KeyLayout(layout.key_prefix, layout.entropy, root_id,
                              None if root_name == topic_name else root_name)
        try:
            custom = encode_custom_metadata(moved)
        except ValueError as err:
            raise RemoteStorageError(f"segment {m.remote_segment_id} of {m.topic_name}-{m.partition} cannot be "
                                     f"relocated to {topic_name} ({topic_id}): {err}") from err
        return replace(m, topic_id=topic_id, topic_name=topic_name, custom_metadata=custom)

    def abort_stale_uploads(self, listing: CopyListing, cutoff_ms: int) -> list[str]:
        """See :meth:`RemoteStorageManagerApi.abort_stale_uploads` (:class:`~rsm.store.base.StaleUploadsStore`:
        S3 multipart uploads; keys in the layout's store)."""
        abort: Callable[[str, int], list[str]] | None = getattr(
            self.store_for(listing.layout), "abort_stale_uploads", None)
        return [] if abort is None else abort(listing.prefix, cutoff_ms)

    def remove_stale_temp_files(self, cutoff_ms: int) -> list[str]:
        """See :meth:`RemoteStorageManagerApi.remove_stale_temp_files` (:class:`~rsm.store.base.TempFilesStore`:
        the filesystem store's ``.tmp``)."""
        remove: Callable[[int], list[str]] | None = getattr(self.store, "remove_stale_temp_files", None)
        return [] if remove is None else remove(cutoff_ms)

    def close(self) -> None:
        """See :meth:`RemoteStorageManagerApi.close`: closes the block cache's streams (their read-ahead goes back
        to the process) and the store (:class:`~rsm.store.base.ClosableStore`; views of it share its resources)."""
        if self.block_cache is not None:
            self.block_cache.close()
        close: Callable[[], None] | None = getattr(self.store, "close", None)
        if close is not None:
            close()

    def fetch_log_segment(self, segment_metadata: RemoteSegmentMetadata, start_position: int,
                          end_position_inclusive: int | None = None) -> BinaryIO:
        return self.reader(segment_metadata).open_log(start_position, end_position_inclusive)

    def fetch_index(self, segment_metadata: RemoteSegmentMetadata, index_type: IndexType) -> BinaryIO:
        return self.reader(segment_metadata).open_section(IndexType(index_type))

    def locate_offset(self, segment_metadata: RemoteSegmentMetadata, offset: int) -> EntryAddress:
        """Kafka offset -> (ledger id, entry id, index in batch)."""
        return self.reader(segment_metadata).locate(offset)

    def offset_of(self, segment_metadata: RemoteSegmentMetadata, address: EntryAddress) -> int:
        """(ledger id, entry id, index in batch) -> Kafka offset."""
        return self.reader(segment_metadata).offset_of(address)

    # -- delete ------------------------------------------------------------------------------------------------

    def delete_log_segment_data(self, segment_metadata: RemoteSegmentMetadata) -> None:
        store, keys, cache_key = self._located(segment_metadata)
        self._cache.drop(cache_key)
        self._delete_keys(keys, store)

    def _delete_keys(self, keys: SegmentKeys, store: Store | None = None) -> None:
        store = self.store if store is None else store
        # The index first: readers stop seeing the copy before its data goes.
        store.delete(keys.index)
        rest = [o.key for o in store.list(keys.prefix) if o.key != keys.index]
        if rest:
            store.delete_many(rest)


def _epochs_checked(blocks: Iterator[tuple[BlockDraft, memoryview]], epochs: BatchEpochs | None,
                    m: RemoteSegmentMetadata) -> Iterator[tuple[BlockDraft, memoryview]]:
    """``blocks``, then (``check_epochs``: ``epochs`` fed by their writer) the batches' leader epochs checked against
    the metadata's, after the last block and before the sections and the index object: a mismatch leaves nothing
    readable."""
    yield from blocks
    if epochs is not None:
        epochs.expect(m.segment_leader_epochs)


def _crc_tracked(chunks: Iterator[bytes], crc: list[int]) -> Iterator[bytes]:
    """``chunks`` passed through, their CRC-32C accumulated in ``crc[0]``."""
    for chunk in chunks:
        crc[0] = google_crc32c.extend(crc[0], chunk)
        yield chunk


def _file_chunks(src: _SectionSource) -> Iterator[bytes]:
    if callable(src):
        src = src()  # bytes known only once the blocks are written (indexes built while copying)
    if isinstance(src, bytes | bytearray):
        if src:
            yield bytes(src)
        return
    # A file this process holds open, named through /proc/self/fd (a segment copied from the log dir in place, its
    # files held open: rlm.tasks.in_place): read with pread on that descriptor, not opened again (an open of a
    # /proc/self/fd name walks procfs, and two system calls a section, three sections a copy, issue 26).
    held = held_fd(src)
    pos = 0
    while held is not None:
        try:
            chunk = os.pread(held, FILE_CHUNK_BYTES, pos)
        except OSError as err:
            if pos or err.errno != errno.EBADF:
                raise
            break  # not a descriptor it can read (closed, or write-only): opened by its name below, as any file
        if not chunk:
            return
        pos += len(chunk)
        yield chunk
    # os.open and os.read: a buffered open's fstat, ioctl and lseeks are most of the system calls of reading an
    # index file of a few hundred bytes, three or four per copy (issue 26)
    try:
        fd = os.open(src, os.O_RDONLY)
    except FileNotFoundError as err:
        raise RemoteStorageError(f"local index file {src} is missing") from err
    try:
        while chunk := os.read(fd, FILE_CHUNK_BYTES):
            yield chunk
    finally:
        os.close(fd)
