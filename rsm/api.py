"""The RemoteStorageManager interface, after KIP-405's ``org.apache.kafka.server.log.remote.storage``.

Contracts (each method repeats the ones that concern it):

- Offsets and positions are **inclusive** where the name says ``_inclusive`` (as Kafka's), otherwise a start.
- ``copy_log_segment_data`` is idempotent per ``remote_segment_id``: copying the same id again overwrites the
  same keys with the same bytes. Each copy *attempt* must use a new ``remote_segment_id`` (KIP-405), which
  also gives each attempt its own ledger id and keys, so a crashed attempt never mixes with a later one.
- Writes are atomic: a reader sees a copied segment completely or not at all (the index object is written
  last and is the commit point).
- ``delete_log_segment_data`` is idempotent: deleting twice, or a segment that never existed, is not an error.
- Absent data raises :class:`~rsm.errors.RemoteResourceNotFoundError`, never an empty answer (a segment without
  a transaction index answers ``fetch_index(..., IndexType.TRANSACTION)`` with that error).
- Fetched bytes are exactly the original bytes: ``fetch_log_segment`` returns the original ``.log`` bytes
  between the given positions of the original file, each batch's CRC-32C checked before it is returned.

Beyond Kafka's interface, the read side every reader of ours uses (``rlm``'s reader, the Spark source, garbage
collection, verify) is declared here too, so none of them needs the object format or the store:

- :meth:`RemoteStorageManagerApi.open_segment` gives a :class:`SegmentHandle`: verified batches between two
  offsets (the header parsed once, the bytes a memoryview), a block plan for a byte budget, the first block at a
  timestamp, the copy's aborted transactions, the producer snapshot it was uploaded with;
- :meth:`~RemoteStorageManagerApi.list_copies` / :meth:`~RemoteStorageManagerApi.delete_log_segment_data` /
  :meth:`~RemoteStorageManagerApi.verify_copy`: what is stored under a partition (owned or not), its deletion
  and its verification;
- :meth:`~RemoteStorageManagerApi.close`: the manager owns resources (the S3 store's upload pool).
"""

from __future__ import annotations

import abc
import enum
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from rsm.log.batch import BatchHeader
from rsm.log.checkpoint import EpochEntry
from rsm.log.indexes import AbortedTxn
from rsm.log.producer_snapshot import ProducerStateEntry

__all__ = [
    "BlockRange",
    "CommittedCopy",
    "CopyListing",
    "EpochEntry",
    "IndexType",
    "KeyLayout",
    "LargeBatch",
    "LogPiece",
    "LogRangeData",
    "LogSegmentData",
    "ProducerStateEntry",
    "RemoteSegmentMetadata",
    "RemoteStorageManagerApi",
    "SegmentHandle",
    "StoredCopy",
    "StoredPartition",
    "VerifyReport",
]


class IndexType(enum.IntEnum):
    """Kafka's ``RemoteStorageManager.IndexType``; the value is the stable byte id used in our index object."""

    OFFSET = 0
    TIMESTAMP = 1
    PRODUCER_SNAPSHOT = 2
    TRANSACTION = 3
    LEADER_EPOCH = 4


@dataclass(frozen=True, slots=True)
class RemoteSegmentMetadata:
    """What the RemoteStorageManager needs to know about one remote segment copy.

    A small value object of our own: the metadata manager (``rlmm/``) has the richer model with states; the
    sidecar adapts between the two (passing ``custom_metadata`` through). ``remote_segment_id`` is unique per
    copy attempt.
    """

    remote_segment_id: uuid.UUID
    topic_id: uuid.UUID
    topic_name: str
    partition: int
    start_offset: int
    end_offset_inclusive: int
    max_timestamp_ms: int = -1
    segment_size_bytes: int = -1
    broker_id: int = -1
    event_timestamp_ms: int = -1
    segment_leader_epochs: tuple[EpochEntry, ...] = field(default_factory=tuple)
    custom_metadata: bytes | None = None
    """What ``copy_log_segment_data`` returned for this copy (the metadata manager keeps it with the segment):
    the key layout it was written under. None (copies made before it existed): the current configuration."""


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """Where a copy's objects are: the store's key prefix and whether keys carry the entropy prefix (recorded in
    each copy's custom metadata, ``rsm.format.custom_metadata``).

    ``root_topic_id`` / ``root_topic_name``: the topic identity the copy's keys were written under, when it is not
    the segment's own: a copy whose metadata was recovered (``rlm recover``) onto a topic with another id (a
    re-created topic, another cluster) or another name keeps its keys. None: the segment's own id / name."""

    key_prefix: str = ""
    entropy: bool = False
    root_topic_id: uuid.UUID | None = None
    root_topic_name: str | None = None

    def root(self, topic_id: uuid.UUID, topic_name: str) -> tuple[uuid.UUID, str]:
        """(topic id, topic name) the keys of a copy of ``topic_id`` / ``topic_name`` start with under this layout."""
        return (self.root_topic_id if self.root_topic_id is not None else topic_id,
                self.root_topic_name if self.root_topic_name is not None else topic_name)

    def __str__(self) -> str:
        root = ""
        if self.root_topic_id is not None or self.root_topic_name is not None:
            root = f" root={self.root_topic_name or '<own name>'}-{self.root_topic_id or '<own id>'}"
        return f"prefix={self.key_prefix!r} entropy={self.entropy}{root}"


@dataclass(frozen=True, slots=True)
class BlockRange:
    """Consecutive blocks ``first_block..last_block`` (inclusive ordinals) of one copy: a unit of reading.

    Offsets are those of the blocks' batches (inclusive); ``log_bytes`` is their size in the original ``.log``."""

    first_block: int
    last_block: int
    first_offset: int
    last_offset: int
    log_bytes: int


@dataclass(frozen=True, slots=True)
class StoredCopy:
    """The objects of one copy (complete, partial or orphaned) found by listing a partition's keys.

    ``copy`` addresses the objects (segment id, partition, base offset as start and end, the key layout as custom
    metadata): enough for :meth:`RemoteStorageManagerApi.delete_log_segment_data`, nothing more. ``name``: the
    copy's physical key base (store key prefix + partition prefix + base offset + id), unique across layouts;
    ``keys``: its object keys within the store of ``layout``, the layout it was listed under."""

    copy: RemoteSegmentMetadata
    layout: KeyLayout
    name: str
    keys: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CopyListing:
    """What :meth:`RemoteStorageManagerApi.list_copies` found under one partition prefix of one key layout.

    ``foreign_keys``: keys under the prefix that are no copy's (left alone); ``objects``: every key listed."""

    layout: KeyLayout
    prefix: str
    copies: tuple[StoredCopy, ...]
    foreign_keys: tuple[str, ...]
    objects: int


@dataclass(frozen=True, slots=True)
class StoredPartition:
    """A partition found by listing the whole store (:meth:`RemoteStorageManagerApi.list_partitions`): the topic
    identity its keys carry (name and id of the topic the copies were made of, possibly since deleted or on another
    cluster) and its partition number, under ``layout``."""

    topic_id: uuid.UUID
    topic_name: str
    partition: int
    layout: KeyLayout

    def __str__(self) -> str:
        return f"{self.topic_name}-{self.partition}({self.topic_id})"


@dataclass(frozen=True, slots=True)
class CommittedCopy:
    """What a committed copy's index object (its commit point) says of it
    (:meth:`RemoteStorageManagerApi.read_committed_copy`): everything a metadata record holds but the copy's
    state and the leader epoch its copier started under (the index object does not record it).

    ``metadata``: the copy as it was made (its own topic id and name; ``custom_metadata`` records the layout it was
    found under); ``txn_index_empty``: no transaction index was uploaded with it; ``entry_count``: record batches;
    ``data_bytes``: the bytes of its data objects; ``name``: its physical key base (as :attr:`StoredCopy.name`)."""

    metadata: RemoteSegmentMetadata
    txn_index_empty: bool
    entry_count: int
    data_bytes: int
    name: str


class LargeBatch:
    """A batch stored as fragments (larger than a block, PDP-43), handed out without holding it: its header (parsed
    once), its size, and its bytes as chunks read from the store as they are asked for (:meth:`chunks`, one pass).

    Each chunk is verified before it is handed out (its fragment's CRC-32C, or its block's authentication in an
    encrypted copy); the batch's own CRC-32C is checked across them and a mismatch raises
    :class:`~rsm.errors.CorruptRemoteObjectError` after the last chunk. Valid only until the iteration that handed it
    out moves on: the chunks are read from that iteration's stream (what was not taken is then read and checked)."""

    __slots__ = ("_chunks", "header", "size")

    def __init__(self, header: BatchHeader, chunks: Iterator[memoryview]) -> None:
        self.header = header
        self.size = header.size_bytes
        self._chunks: Iterator[memoryview] | None = chunks

    def __len__(self) -> int:
        return self.size

    def chunks(self) -> Iterator[memoryview]:
        """The batch's bytes, in order, in chunks of about a block (the first holds the batch header whole); once."""
        chunks, self._chunks = self._chunks, None
        if chunks is None:
            raise RuntimeError(f"the chunks of the batch at offset {self.header.base_offset} were already taken")
        return chunks

    def read(self) -> bytes:
        """The whole batch (holds it: for batches known to be small enough only)."""
        return b"".join(self.chunks())


class SegmentHandle(abc.ABC):
    """Reads one remote segment copy (:meth:`RemoteStorageManagerApi.open_segment`). Block ordinals count from 0.

    Every batch handed out has been verified (block framing, CRC-32C); bad data raises
    :class:`~rsm.errors.CorruptRemoteObjectError` naming the key and position, never returns bad bytes."""

    name: str
    """The copy's key base: names it in error messages (``path`` of :func:`rsm.log.records.iter_raw_records`)."""

    @abc.abstractmethod
    def batches(self, from_offset: int, end_offset_inclusive: int, *, first_block: int | None = None,
                last_block: int | None = None, large: bool = False,
                ) -> Iterator[tuple[BatchHeader, memoryview | LargeBatch]]:
        """The batches holding offsets ``from_offset..end_offset_inclusive``, in order: the header (parsed once;
        ``position`` is the batch's position in the original ``.log``) and the batch's bytes.

        Streams blocks ``first_block..last_block`` (inclusive; default: from the block holding ``from_offset`` to
        the last), one ranged GET per data object. Batches are whole: the first may start below ``from_offset``,
        the last end past ``end_offset_inclusive``; records outside are the caller's to drop.

        A batch stored as fragments (larger than a block) is put together whole in memory, unless ``large``: then
        it is a :class:`LargeBatch` (read in chunks, never held whole). Only a caller that handles
        :class:`LargeBatch` passes ``large``; all batches small enough for a block are memoryviews either way."""

    @abc.abstractmethod
    def block_plan(self, from_offset: int, end_offset_inclusive: int, max_log_bytes: int, *,
                   min_timestamp_ms: int | None = None, from_block: int = 0,
                   runs: int | None = None) -> list[BlockRange]:
        """Runs of consecutive blocks, each up to ``max_log_bytes`` of ``.log`` bytes (at least one block), covering
        the blocks from ``from_block`` on that hold offsets ``from_offset..end_offset_inclusive`` and (with
        ``min_timestamp_ms``) a batch whose max timestamp is at least it; the first ``runs`` of them only, when
        given. Reads the index only."""

    @abc.abstractmethod
    def block_at_timestamp(self, timestamp_ms: int) -> BlockRange | None:
        """The first block holding a batch whose max timestamp is >= ``timestamp_ms``, None when none does.
        Reads the index only."""

    @abc.abstractmethod
    def aborted_transactions(self) -> list[AbortedTxn]:
        """The aborted transactions the copy's transaction index lists (none when the copy has no index). An index
        that does not parse raises :class:`~rsm.errors.CorruptRemoteObjectError` naming the key and position."""

    @abc.abstractmethod
    def producer_snapshot(self) -> list[ProducerStateEntry] | None:
        """The producer snapshot the copy was uploaded with, parsed: the partition's producer state after the
        segment's last offset (Kafka uploads ``<end_offset_inclusive + 1>.snapshot``), one entry per producer id
        in no particular order (``rsm.log.producer_snapshot``). Reads that section only (one ranged GET).

        None when the copy has no producer snapshot (it was copied without one): "not found", not an error. An
        empty list is a snapshot with no producer state. A snapshot that does not parse (bad version, truncated,
        CRC-32C mismatch) raises :class:`~rsm.errors.CorruptRemoteObjectError` naming the key and position."""


@dataclass(frozen=True, slots=True)
class LogSegmentData:
    """The local files of one rolled segment (Kafka's ``LogSegmentData``).

    ``leader_epoch_checkpoint`` is the checkpoint's bytes already sliced to the segment (as Kafka passes it).
    ``transaction_index_path`` is ``None`` when the segment has none; ``producer_snapshot_path`` may be ``None``
    for segments written before snapshots existed (then fetching that index answers not found).
    """

    log_path: Path
    offset_index_path: Path
    time_index_path: Path
    transaction_index_path: Path | None
    producer_snapshot_path: Path | None
    leader_epoch_checkpoint: bytes


@dataclass(frozen=True, slots=True)
class LogPiece:
    """``[start_position, end_position)`` of a local ``.log`` file: whole record batches, at batch boundaries.

    The file may be the partition's *active* segment, still growing: only the bytes below ``end_position`` are
    read (they must not change while being read; a change fails the copy)."""

    log_path: Path
    start_position: int
    end_position: int


@dataclass(frozen=True, slots=True)
class LogRangeData:
    """A run of committed batches cut from the local log at any batch boundaries (a PIP-76 *offload segment*):
    the tail of one local segment and the head of the next, or a part of one huge or still active segment.

    ``pieces`` in offset order, contiguous in offsets. The storage manager writes the offset and time indexes
    Kafka would have written for a segment holding exactly these batches (positions in the offload segment:
    the pieces' bytes one after the other, from 0). ``transaction_index`` holds the aborted transactions with
    records in the range (``None`` when none). There is no producer snapshot: fetching it answers not found.
    """

    pieces: tuple[LogPiece, ...]
    transaction_index: bytes | None
    leader_epoch_checkpoint: bytes


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """The outcome of verifying a copy (:meth:`RemoteStorageManagerApi.verify_copy`). ``ok`` is False with the
    first bad key, its byte position and the Kafka offset there (when known)."""

    index_key: str
    ok: bool
    blocks: int
    entries: int
    bytes_checked: int
    bad_key: str | None = None
    bad_position: int | None = None
    bad_offset: int | None = None
    message: str = ""

    def __str__(self) -> str:
        if self.ok:
            return f"OK {self.index_key}: {self.blocks} blocks, {self.entries} entries, {self.bytes_checked} bytes"
        where = f"{self.bad_key} at byte {self.bad_position}"
        if self.bad_offset is not None:
            where += f" (Kafka offset {self.bad_offset})"
        return f"BAD {self.index_key}: {where}: {self.message}"


class RemoteStorageManagerApi(abc.ABC):
    """KIP-405's RemoteStorageManager. Implementations are thread-safe."""

    @abc.abstractmethod
    def copy_log_segment_data(self, segment_metadata: RemoteSegmentMetadata,
                              segment_data: LogSegmentData, *, cancel: threading.Event | None = None) -> bytes | None:
        """Copy the segment's ``.log`` and its five indexes to remote storage; return custom metadata or None.

        Exactly the batches of ``[start_offset, end_offset_inclusive]`` are copied: leading batches of the
        ``.log`` whose last offset is below ``start_offset`` are skipped (a new leader's local segment that
        straddles the highest remote offset), and the first kept batch must start exactly at ``start_offset``;
        otherwise :class:`~rsm.errors.RemoteStorageError` naming the file and offsets, with nothing uploaded.
        ``rsm.format.ledger.kept_range`` gives the kept bytes beforehand (the segment's ``segment_size_bytes``).

        The custom metadata (``rsm.format.custom_metadata``, under 100 bytes) records the key layout the copy
        was written under; the caller stores it with the segment and passes it back in
        ``RemoteSegmentMetadata.custom_metadata`` to every later fetch and delete.

        Idempotent per ``segment_metadata.remote_segment_id``; atomic (nothing readable until all is written).
        Raises :class:`~rsm.errors.RemoteStorageError` on failure, after removing what it wrote where it can;
        leftovers of a crash are unreadable (no index object) and found by garbage collection.

        ``cancel`` (not in Kafka's API, whose remote log manager interrupts the copy's thread): once it is set the
        copy stops at the next block (a throttled copy's wait ends at once), removes what it wrote and raises
        :class:`~rsm.errors.CopyCancelledError`. Set after the copy's last write, it changes nothing.
        """

    def copy_log_range(self, segment_metadata: RemoteSegmentMetadata, range_data: LogRangeData, *,
                       cancel: threading.Event | None = None) -> bytes | None:
        """Copy an offload segment (:class:`LogRangeData`) as one remote segment; as
        :meth:`copy_log_segment_data` otherwise (custom metadata, idempotence, atomicity, errors, ``cancel``).

        The pieces must hold exactly the batches of ``[start_offset, end_offset_inclusive]``, every one CRC-checked:
        the first starts at ``start_offset``, each next one right after the one before, the last ends at
        ``end_offset_inclusive``; otherwise :class:`~rsm.errors.RemoteStorageError` with nothing uploaded.
        Positions (``fetch_log_segment``, the offset index) are positions in the offload segment: its batches one
        after the other from 0.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot copy offload segments")

    @abc.abstractmethod
    def fetch_log_segment(self, segment_metadata: RemoteSegmentMetadata, start_position: int,
                          end_position_inclusive: int | None = None) -> BinaryIO:
        """A stream of the original ``.log`` bytes from ``start_position`` to ``end_position_inclusive``.

        Positions are byte positions in the original ``.log`` file; ``None`` means to the end of the segment,
        an end past the end is clamped. A copy that skipped leading batches holds the file's bytes from its
        first kept batch on; a start position below that batch begins at it. Raises
        :class:`~rsm.errors.RemoteResourceNotFoundError` when the segment is not in remote storage,
        ``ValueError`` for a start beyond the segment, and (possibly while reading)
        :class:`~rsm.errors.CorruptRemoteObjectError` naming the key and position of bad data.
        """

    @abc.abstractmethod
    def fetch_index(self, segment_metadata: RemoteSegmentMetadata, index_type: IndexType) -> BinaryIO:
        """A stream of the original bytes of one of the segment's indexes.

        Raises :class:`~rsm.errors.RemoteResourceNotFoundError` when the segment or that index is absent (a
        segment without transaction index: not found, never empty bytes).
        """

    @abc.abstractmethod
    def delete_log_segment_data(self, segment_metadata: RemoteSegmentMetadata) -> None:
        """Delete every object of this segment copy. Idempotent: absent or already deleted is not an error.

        The objects are found under the layout recorded in ``custom_metadata`` (the current one when None);
        custom metadata this manager cannot read raises instead of deleting guessed keys. The index object (the
        commit point) goes first. Deletes a :class:`StoredCopy` too (its ``copy``)."""

    # -- beyond KIP-405: the read side of our own readers, garbage collection, verify --------------------------

    layout: KeyLayout
    """The key layout new copies are written under."""

    @abc.abstractmethod
    def layout_of(self, segment_metadata: RemoteSegmentMetadata) -> KeyLayout:
        """The key layout a copy was written under (its custom metadata; the current layout when it has none).
        Raises :class:`~rsm.errors.RemoteStorageError` for custom metadata this manager cannot read."""

    @abc.abstractmethod
    def open_segment(self, segment_metadata: RemoteSegmentMetadata) -> SegmentHandle:
        """A reader of the copy, under its recorded key layout (loads its index: one GET, or the cache).
        Raises :class:`~rsm.errors.RemoteResourceNotFoundError` when the copy is absent."""

    @abc.abstractmethod
    def verify_copy(self, segment_metadata: RemoteSegmentMetadata) -> VerifyReport:
        """Check every object of the copy against its index (:func:`rsm.verify.verify_segment`), streaming.
        Raises :class:`~rsm.errors.RemoteResourceNotFoundError` when its index object is absent."""

    @abc.abstractmethod
    def list_copies(self, topic_id: uuid.UUID, topic_name: str, partition: int, layout: KeyLayout) -> CopyListing:
        """Every object stored under the partition's prefix in ``layout``, grouped by copy (owned or not, complete
        or not). Raises :class:`~rsm.errors.RemoteStorageError` when the layout is not addressable here."""

    @abc.abstractmethod
    def list_partitions(self, layout: KeyLayout | None = None) -> list[StoredPartition]:
        """Every partition with objects in the store under ``layout`` (default: the current one), by the topic
        identity their keys carry, sorted by topic name, topic id and partition. Lists the whole store (one
        listing, materialized: one entry per partition). Keys that are no copy's are skipped. For recovery."""

    @abc.abstractmethod
    def read_committed_copy(self, stored: StoredCopy) -> CommittedCopy:
        """The copy's metadata from its index object (one GET): the commit point of a copy, written last.

        Raises :class:`~rsm.errors.RemoteResourceNotFoundError` when it has none (a crashed or half-deleted copy:
        no copy), :class:`~rsm.errors.CorruptRemoteObjectError` when it does not decode or names another copy
        (its segment id, partition or base offset disagree with its key)."""

    @abc.abstractmethod
    def relocated(self, segment_metadata: RemoteSegmentMetadata, topic_id: uuid.UUID,
                  topic_name: str) -> RemoteSegmentMetadata:
        """The same copy as a segment of topic ``topic_id`` / ``topic_name``: its custom metadata records the layout
        it was written under and, when they differ from the new ones, the topic identity its keys carry (the key
        root), so reads, deletes and garbage collection keep finding its objects. Idempotent (relocating back to
        the key root records none). Raises :class:`~rsm.errors.RemoteStorageError` when the key root does not fit
        the custom metadata's size limit (a renamed topic with a long old name)."""

    @abc.abstractmethod
    def abort_stale_uploads(self, listing: CopyListing, cutoff_ms: int) -> list[str]:
        """Abort uploads under ``listing``'s prefix left unfinished, untouched since before the instant
        ``cutoff_ms`` (epoch ms; a killed copy's S3 multipart uploads); their keys. Nothing for stores without such
        uploads."""

    @abc.abstractmethod
    def remove_stale_temp_files(self, cutoff_ms: int) -> list[str]:
        """Remove the store's own temp files last modified before the instant ``cutoff_ms`` (epoch ms; a killed
        write's); their names."""

    def probe(self) -> None:  # noqa: B027 - optional: a store-less manager has nothing to probe
        """One cheap request to the store (a HEAD of a key no copy uses); raises
        :class:`~rsm.errors.RemoteStorageError` when the store does not answer it. For health checks."""

    def close(self) -> None:  # noqa: B027 - optional: nothing to release by default
        """Release what the manager owns (the S3 store's upload pool). Idempotent; a later copy re-creates the
        pool on demand."""
