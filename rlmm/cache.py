"""The metadata topic materialized into RocksDB (rocksdict, raw bytes keys).

Every consumed batch of records is applied together with the next offset of each metadata partition in ONE
``WriteBatch``, so a restart resumes exactly where it stopped. All keys are big-endian, so RocksDB's byte order
is numeric order; signed ints are stored with their sign bit flipped (``u = v ^ 1 << (bits - 1)``).

    Key layout (table byte first; every state key then has MetadataPartition:u16, so a metadata partition's
    state can be dropped with one range delete per table):

    0x00 Name:ascii                                         -> meta: b"format" (FORMAT_VERSION), b"topic",
                                                               b"partitions" (u32)
    0x01 MP:u16                                             -> Progress => NextOffset:i64 CaughtUpWallMs:i64
    0x10 MP TopicId:uuid Partition:s32 SegmentId:uuid       -> segment: RemoteLogSegmentMetadataRecord bytes
                                                               (rlmm.serde, current state; read by rlmm.scan)
    0x13 MP TopicId Partition Epoch:s32 EpochStartOffset:s64
                                                            -> Floor => SegmentId:uuid EpochEndOffset:i64
                                                               (COPY_SEGMENT_FINISHED segments only)
    0x15 MP TopicId Partition                               -> RemotePartitionDeleteMetadataRecord bytes
    0x16 MP TopicId Partition SegmentId                     -> Deleted => EventTimestampMs:i64 BrokerId:i32
                                                               (DELETE_SEGMENT_FINISHED, tombstones pending)
    0x17 MP TopicId Partition                               -> CopyFence => MaxBrokerLeaderEpoch:i32
                                                               (highest broker leader epoch of any applied
                                                               COPY_SEGMENT_STARTED of the partition; never
                                                               lowered; dropped with DELETE_PARTITION_FINISHED)

(Table 0x12, an index of every segment by epoch, is gone since format 2: it cost ~1/8 of a bootstrap's CPU for
``segments(tp, epoch)``, which the sidecar never calls; that listing now scans the partition's 0x10 values.)

The format: ``FORMAT_VERSION`` under meta ``format``. A cache of another rlmm format is rebuilt on open (the
directory's database destroyed and created empty: the cache is disposable, the topic the source of truth), never
read as this one; another topic or partition count, or a directory that is not an rlmm cache, is an error.

A floor lookup (segment holding offset X under epoch E) is one ``seek_for_prev`` on table 0x13 plus one get;
the highest copied offset of epoch E is one ``seek_for_prev`` to the end of E's range in 0x13. Unlike Kafka's
in-memory cache (which remembers an epoch's highest offset after its segments are deleted) it is computed from the
live COPY_SEGMENT_FINISHED segments, so a cache rebuilt from the compacted topic answers the same as one that
never restarted.

Refusals are decided by :mod:`rlmm.rules` (the one copy of the rules, which the managers' checks use too), applied
here in the metadata topic's total order, so every cache agrees. Copy fencing (KIP-405's leader-epoch fencing of
zombie copies): a COPY_SEGMENT_STARTED -> COPY_SEGMENT_FINISHED of a segment whose ``broker_leader_epoch`` is below
the partition's CopyFence is refused (:class:`rlmm.api.CopyFencedError`, reported as a refused record with
``fenced=True``). Segments without an epoch are never fenced. A COPY_SEGMENT_STARTED for a partition with any
partition-delete state is refused. The fence is rebuilt from the STARTED records still on the topic: once every
segment started under the highest epoch is fully deleted and its tombstones compacted, a rebuilt cache has a lower
fence, and a refused FINISHED still on the topic would then apply. So the writer of a fenced copy must delete it
(DELETE_SEGMENT_STARTED -> DELETE_SEGMENT_FINISHED), whose tombstones remove that FINISHED record too.

Durability: the topic is the source of truth, so by default writes skip RocksDB's WAL (``wal=False``) and the
memtables are flushed on close and before each caught-up mark (written with WAL). A WriteBatch lands in the
memtable whole, so a crash loses a suffix of batches together with their progress key: the restart resumes from
the older offset and re-applies them.
"""

from __future__ import annotations

import ctypes
import logging
import struct
import threading
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rocksdict import BlockBasedOptions, Cache, DBCompressionType, Options, Rdict, WriteBatch, WriteOptions

from rlmm import scan, serde
from rlmm.api import (
    CopyFencedError,
    CorruptMetadataRecordError,
    InvalidStateTransitionError,
    MetadataCacheFormatError,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
    UnknownSegmentError,
)
from rlmm.keys import KeyKind, decode_key
from rlmm.partitioner import metadata_partition
from rlmm.rules import raised_fence, refuse_new_segment, refuse_partition_delete, refuse_segment_update

__all__ = ["FORMAT_VERSION", "ApplyOutcome", "DeletedSegment", "MetadataCache", "Progress", "SkippedRecord",
           "release_free_heap"]

log = logging.getLogger(__name__)

FORMAT_VERSION = b"rlmm-cache-2"     # 2: without table 0x12
_FORMAT_PREFIX = b"rlmm-cache-"
MB = 1024 * 1024

T_META = b"\x00"
T_PROGRESS = b"\x01"
T_SEGMENT = b"\x10"
T_EPOCH_FLOOR = b"\x13"
T_PARTITION_DELETE = b"\x15"
T_DELETED = b"\x16"
T_COPY_FENCE = b"\x17"
STATE_TABLES = (T_SEGMENT, T_EPOCH_FLOOR, T_PARTITION_DELETE, T_DELETED, T_COPY_FENCE)

_MP = struct.Struct(">H")
_TP = struct.Struct(">H16sI")          # MP, TopicId, Partition (sign-flipped)
_U32 = struct.Struct(">I")
_I32 = struct.Struct(">i")
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_PROGRESS = struct.Struct(
    ">q"   # NextOffset
    "q"    # CaughtUpWallMs
)
_FLOOR = struct.Struct(
    ">16s"  # SegmentId
    "q"    # EpochEndOffset
)
_pack_floor = _FLOOR.pack
_pack_tp = _TP.pack
_DELETED = struct.Struct(
    ">q"   # EventTimestampMs
    "i"    # BrokerId
)
_API_SEGMENT = serde.MetadataApiKey.REMOTE_LOG_SEGMENT_METADATA
_API_UPDATE = serde.MetadataApiKey.REMOTE_LOG_SEGMENT_METADATA_UPDATE
_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
_DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED
_DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED
_consume = deque           # deque(iterator, 0): run an iterator to its end in C, keeping nothing
_KEPT = 8192   # MetadataCache._views and _fences: cleared when they hold more
_S32_FLIP = 1 << 31
_S64_FLIP = 1 << 63


_pack_u32 = _U32.pack
_pack_u64 = _U64.pack


def _s32(v: int) -> bytes:
    """A signed int32 as order-preserving big-endian bytes (v is in range, so no mask is needed)."""
    return _pack_u32(v + _S32_FLIP)


def _s64(v: int) -> bytes:
    return _pack_u64(v + _S64_FLIP)


# Epoch:s32 then an offset:s64, the suffix of the 0x13 keys, in one pack (both sign-flipped by the caller)
_pack_epoch_offset = struct.Struct(">IQ").pack


class _SegmentName(tuple):
    """A segment's name for refusal messages, ``(topic id, partition, segment id)`` raw, formatted only when a
    record is refused (a tuple: built in C, once per record of the apply loop)."""

    __slots__ = ()

    def __str__(self) -> str:
        tid, part, sid = self
        return f"RemoteLogSegmentId({uuid.UUID(bytes=tid)}-{part}, {uuid.UUID(bytes=sid)})"


_UNNAMED = "segment"
"""The name the apply loop gives the rules (:mod:`rlmm.rules`) first: a refused record is asked again with its
:class:`_SegmentName` (one object per record otherwise, for messages almost never formatted)."""


def _no_fence() -> None:
    """The fence passed for a segment that is not there or has no copy epoch (never asked: an unknown segment is
    refused first, and a copy without an epoch is never fenced)."""
    return None


def release_free_heap() -> bool:
    """Hand the heap's free pages back to the kernel (glibc's ``malloc_trim(0)``, every arena); False where there is
    no glibc. A bootstrap frees most of what it allocated (librdkafka's fetched batches, the memtables flushed, the
    Python objects of each batch) on several threads, and glibc keeps such free chunks inside its arenas: at 1 M
    segments 205 of the 262 MiB of heap after the bootstrap were free chunks (``RssAnon`` 262 -> 57 MiB after a
    trim; RocksDB's memtables held 10 MiB). Called once a bulk catch-up is over, and after the compaction that
    follows it."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    return bool(trim(0))


def _prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (prefix has a non-0xff byte)."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    p[-1] += 1
    return bytes(p)


@dataclass(frozen=True, slots=True)
class Progress:
    next_offset: int
    caught_up_wall_ms: int


@dataclass(frozen=True, slots=True)
class SkippedRecord:
    metadata_partition: int
    offset: int
    reason: str          # "corrupt" or "refused"
    error: str
    fenced: bool = False  # refused by copy fencing (rlmm.api.CopyFencedError)
    deleted_already: bool = False  # a delete of a segment deleted (or being deleted) already: normal, two deleters


@dataclass(frozen=True, slots=True)
class DeletedSegment:
    topic_id: uuid.UUID
    partition: int
    segment_id: uuid.UUID
    event_timestamp_ms: int
    broker_id: int


@dataclass(slots=True)
class ApplyOutcome:
    applied: int = 0
    tombstones: int = 0
    skipped: list[SkippedRecord] | None = None
    next_offsets: dict[int, int] = field(default_factory=dict)   # per metadata partition: after its last record


class _Batch:
    """Pending writes of one apply call, readable before they are written (read-through overlay). ``views`` and
    ``fences`` are the cache's own (:attr:`MetadataCache._views`): what the state holds, kept from call to call."""

    __slots__ = ("db", "wo", "puts", "deletes", "ranges", "views", "fences", "undeleted")

    def __init__(self, db: Rdict, wo: WriteOptions, views: dict[bytes, scan.SegmentView],
                 fences: dict[bytes, int | None]) -> None:
        self.db = db
        self.wo = wo
        self.puts: dict[bytes, bytes | None] = {}
        self.deletes = False                               # some value of puts may be None (a delete)
        self.ranges: list[tuple[bytes, bytes]] = []
        self.views = views     # scanned segment values by 0x10 key
        self.fences = fences   # CopyFence epoch by partition key (read through)
        self.undeleted: set[bytes] = set()                # partition keys with no partition-delete state in db

    def fence(self, tpk: bytes) -> int | None:
        try:
            return self.fences[tpk]
        except KeyError:
            raw = self.get(T_COPY_FENCE + tpk)
            epoch = self.fences[tpk] = None if raw is None else _I32.unpack(raw)[0]
            return epoch

    def set_fence(self, tpk: bytes, epoch: int) -> None:
        self.fences[tpk] = epoch
        self.puts[T_COPY_FENCE + tpk] = _I32.pack(epoch)

    def get(self, key: bytes) -> bytes | None:
        if key in self.puts:
            return self.puts[key]
        return self.db.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.puts[key] = value

    def delete(self, key: bytes) -> None:
        self.puts[key] = None
        self.deletes = True
        self.views.pop(key, None)

    def write(self, extra: dict[bytes, bytes]) -> None:
        wb = WriteBatch(raw_mode=True)
        for begin, end in self.ranges:
            wb.delete_range(begin, end)
        put, delete = wb.put, wb.delete
        # in key order: each memtable insert then lands next to the previous one (RocksDB keeps the skiplist
        # position between the inserts of a batch), instead of a search from the top through random keys
        puts = self.puts
        keys = sorted(puts)        # (the keys alone: sorting (key, value) pairs costs ~3x as much)
        if self.deletes:
            for k in keys:
                v = puts[k]
                if v is None:
                    delete(k)
                else:
                    put(k, v)
        else:                      # puts only (a bootstrap's batches): the loop in C
            _consume(map(put, keys, map(puts.__getitem__, keys)), 0)
        _consume(map(put, extra, extra.values()), 0)
        self.db.write(wb, self.wo)
        self.puts.clear()
        self.deletes = False
        if self.ranges:   # (dropped state, which the views and fences may hold)
            self.views.clear()
            self.fences.clear()
        self.ranges.clear()
        self.undeleted.clear()


class MetadataCache:
    """RocksDB state of the metadata partitions; one writer (the consumer thread), many readers."""

    def __init__(self, path: str | Path, *, topic: str, num_partitions: int, wal: bool = False,
                 block_cache_bytes: int = 256 * MB) -> None:
        self.path = Path(path)
        self.topic = topic
        self.num_partitions = num_partitions
        self.path.mkdir(parents=True, exist_ok=True)
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        table = BlockBasedOptions()
        table.set_bloom_filter(10, False)            # absent-id checks on every COPY_SEGMENT_STARTED stay cheap
        table.set_block_cache(Cache(block_cache_bytes))
        opts.set_block_based_table_factory(table)
        opts.set_write_buffer_size(64 * MB)
        # a whole-key bloom filter over the memtable too: the absent-id check of every COPY_SEGMENT_STARTED would
        # otherwise search the memtable's skiplist (random keys: cache misses), ~4x its cost with the filter
        opts.set_memtable_prefix_bloom_ratio(0.05)
        opts.set_memtable_whole_key_filtering(True)
        opts.set_compression_type(DBCompressionType.none())   # lookups are random: no block decompression
        opts.set_allow_mmap_reads(True)
        self._opts = opts
        self.rebuilt_format: bytes | None = None   # the format of a cache found and rebuilt on open (else None)
        self.db = self._open()
        self._wo = WriteOptions()
        self._wo.disable_wal = not wal
        self._dirty = False
        # per metadata partition, the caught-up wall time its progress key holds, as last written here (this cache
        # is the one writer): each apply rewrites the key with it, instead of reading it back for every batch
        self._walls: dict[int, int] = {}
        # what the state holds, kept from one apply call to the next (the consumer thread's, as the writes): the
        # segment values scanned and the CopyFence epochs. In a burst each segment's COPY_SEGMENT_FINISHED comes in
        # the call after its STARTED, and read the value just written back from RocksDB and scanned it again, and
        # both records read the partition's fence (issue 26). Cleared by a range delete and a wipe (state dropped),
        # a call that failed (its puts maybe not written) and once they hold more than _KEPT entries.
        self._views: dict[bytes, scan.SegmentView] = {}
        self._fences: dict[bytes, int | None] = {}
        self._compaction: threading.Thread | None = None
        self.compactions = 0      # full compactions started (compact_in_background), for tests and logs
        self._check_format()

    # ------------------------------------------------------------------------------------------ meta / open
    def _open(self) -> Rdict:
        try:
            return Rdict(str(self.path), self._opts)
        except Exception as err:  # noqa: BLE001 - rocksdict raises plain Exception
            raise MetadataCacheFormatError(f"cannot open the metadata cache at {self.path}: {err}; if it is "
                                           "corrupt, delete the directory and it rebuilds from the topic") from err

    def _check_format(self) -> None:
        db = self.db
        fmt = db.get(T_META + b"format")
        if fmt is not None and fmt != FORMAT_VERSION and fmt.startswith(_FORMAT_PREFIX):
            # another rlmm format (older or newer): not readable as this one; the topic rebuilds it
            log.warning("metadata cache %s has format %r, this manager writes %r: rebuilding it from the topic",
                        self.path, fmt, FORMAT_VERSION)
            db.close()
            Rdict.destroy(str(self.path), self._opts)
            self.db = db = self._open()
            self.rebuilt_format = fmt
            fmt = None
        expected = {b"format": FORMAT_VERSION, b"topic": self.topic.encode(),
                    b"partitions": _U32.pack(self.num_partitions)}
        if fmt is None:
            if any(True for _ in db.keys()):
                raise MetadataCacheFormatError(
                    f"{self.path} holds data but no format key: it is not an rlmm metadata cache; "
                    "point the manager at an empty directory")
            wb = WriteBatch(raw_mode=True)
            for k, v in expected.items():
                wb.put(T_META + k, v)
            db.write(wb)
            return
        for k, v in expected.items():
            found = db.get(T_META + k)
            if found != v:
                raise MetadataCacheFormatError(
                    f"metadata cache {self.path}: {k.decode()} is {found!r}, this manager needs {v!r}; the cache "
                    "is disposable: delete the directory (or use another one) and it rebuilds from the topic")

    def flush(self) -> None:
        """Persist the memtables (needed for durability when the WAL is off)."""
        self.db.flush()

    def close(self) -> None:
        if self._compaction is not None:
            self._compaction.join()
        self.db.flush()
        self.db.close()

    def compact_in_background(self) -> bool:
        """Start a full compaction on its own thread (rocksdict releases the GIL: readers and the consumer go on)
        unless one is running; return whether it started. After a bootstrap the state is spread over L0 files and
        levels, and a floor lookup's seek visits each of them: one sorted run cut a lookup's CPU by about a
        quarter (1M events, 19.6 -> 14.9 us). The heap's free pages are released after it
        (:func:`release_free_heap`). :meth:`close` waits for it."""
        if self._compaction is not None and self._compaction.is_alive():
            return False
        compaction = threading.Thread(target=self._compact, daemon=True, name=f"rlmm-compact-{self.topic}")
        compaction.start()
        self._compaction = compaction   # (started: a reader may join it)
        self.compactions += 1
        return True

    def wait_for_compaction(self, timeout_s: float | None = None) -> bool:
        """Wait for the background compaction, if one runs; return whether none runs now (for benchmarks)."""
        if self._compaction is not None:
            self._compaction.join(timeout_s)
            return not self._compaction.is_alive()
        return True

    def _compact(self) -> None:
        self.db.compact_range(None, None)
        release_free_heap()

    def estimated_keys(self) -> int:
        """RocksDB's estimate of the keys held (cheap: from table properties and the memtables)."""
        return self.db.property_int_value("rocksdb.estimate-num-keys") or 0

    # ------------------------------------------------------------------------------------------- progress
    def progress(self, mp: int) -> Progress | None:
        raw = self.db.get(T_PROGRESS + _MP.pack(mp))
        return None if raw is None else Progress(*_PROGRESS.unpack(raw))

    def mark_caught_up(self, progress: dict[int, Progress]) -> None:
        """Record that these partitions were fully consumed at a wall time: flush the state first (it was written
        without WAL), then write the progress keys with WAL, so a recovered WAL never gets ahead of the state."""
        if self._dirty:
            self.db.flush()
            self._dirty = False
        wb = WriteBatch(raw_mode=True)
        for mp, p in progress.items():
            wb.put(T_PROGRESS + _MP.pack(mp), _PROGRESS.pack(p.next_offset, p.caught_up_wall_ms))
        self.db.write(wb)
        for mp, p in progress.items():
            self._walls[mp] = p.caught_up_wall_ms

    def wipe(self, mps: Sequence[int]) -> None:
        """Forget all state and progress of these metadata partitions (before a rebuild from the start)."""
        wb = WriteBatch(raw_mode=True)
        for mp in mps:
            m = _MP.pack(mp)
            for t in STATE_TABLES:
                wb.delete_range(t + m, _prefix_end(t + m))
            wb.delete(T_PROGRESS + m)
        self.db.write(wb)
        for mp in mps:
            self._walls.pop(mp, None)
        self._views.clear()
        self._fences.clear()

    # ----------------------------------------------------------------------------------------------- keys
    def mp_of(self, tp: TopicIdPartition) -> int:
        return metadata_partition(tp.topic_id, tp.partition, self.num_partitions)

    def _tp_key(self, tp: TopicIdPartition, mp: int | None = None) -> bytes:
        if mp is None:
            mp = self.mp_of(tp)
        return _TP.pack(mp, tp.topic_id.bytes, (tp.partition + _S32_FLIP) & 0xFFFFFFFF)

    # ---------------------------------------------------------------------------------------------- apply
    def apply(self, records: Sequence[tuple[int, int, bytes | None, bytes | None]], caught_up: dict[int, int],
              ) -> ApplyOutcome:
        """Apply ``(metadata partition, offset, key, value)`` records in order; write state and each partition's
        next offset in one WriteBatch (two when a partition delete finishes). Undecodable records and refused
        transitions are skipped and reported in the outcome. ``caught_up`` maps partition -> caught-up wall ms
        (kept as stored for partitions not in it)."""
        out = ApplyOutcome(skipped=[])
        views, fences = self._views, self._fences
        if len(views) > _KEPT or len(fences) > _KEPT:
            views.clear()
            fences.clear()
        try:
            self._apply_batch(_Batch(self.db, self._wo, views, fences), records, caught_up, out)
        except BaseException:
            views.clear()   # what this call put there may not have been written
            fences.clear()
            raise
        self._dirty = True
        out.applied = len(records) - out.tombstones - len(out.skipped)   # (counted once, not per record)
        return out

    def _apply_batch(self, batch: _Batch, records: Sequence[tuple[int, int, bytes | None, bytes | None]],
                     caught_up: dict[int, int], out: ApplyOutcome) -> None:
        next_offsets = out.next_offsets
        api_key_of = scan.api_key_of
        scan_update, scan_segment = scan.scan_update, scan.scan_segment
        apply_update, apply_add = self._apply_update, self._apply_add
        for mp, offset, key, value in records:
            next_offsets[mp] = offset + 1
            try:
                if value is None:
                    self._apply_tombstone(batch, mp, key)
                    out.tombstones += 1
                    continue
                api = value[1] if len(value) > 3 and value[0] == 1 and value[1] < 3 and value[2] == 0 \
                    else api_key_of(value)
                if api == _API_UPDATE:
                    apply_update(batch, mp, scan_update(value))
                elif api == _API_SEGMENT:
                    apply_add(batch, mp, scan_segment(value))
                else:
                    md = serde.decode(value)
                    if md.state == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                        # range deletes cannot be read through the overlay: commit what came before first
                        next_offsets[mp] = offset
                        batch.write(self._progress_puts(next_offsets, caught_up))
                        next_offsets[mp] = offset + 1
                    self._apply_partition_delete(batch, mp, md, value)
                    if md.state == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                        # and after it: later records of this call must not read the dropped state through the
                        # overlay (or the cached views), which a range delete does not cover
                        batch.write(self._progress_puts(next_offsets, caught_up))
            except CorruptMetadataRecordError as err:
                out.skipped.append(SkippedRecord(mp, offset, "corrupt", str(err)))
            except (InvalidStateTransitionError, UnknownSegmentError) as err:
                out.skipped.append(SkippedRecord(mp, offset, "refused", str(err), isinstance(err, CopyFencedError),
                                                 getattr(err, "deleted_already", False)))
        batch.write(self._progress_puts(next_offsets, caught_up))

    def _progress_puts(self, next_offsets: dict[int, int], caught_up: dict[int, int]) -> dict[bytes, bytes]:
        puts = {}
        walls = self._walls
        for mp, nxt in next_offsets.items():
            wall = caught_up.get(mp)
            if wall is None:
                wall = walls.get(mp)
                if wall is None:
                    old = self.progress(mp)
                    wall = old.caught_up_wall_ms if old else 0
            walls[mp] = wall
            puts[T_PROGRESS + _MP.pack(mp)] = _PROGRESS.pack(nxt, wall)
        return puts

    def _load(self, batch: _Batch, skey: bytes) -> scan.SegmentView | None:
        view = batch.views.get(skey)
        if view is None:
            raw = batch.get(skey)
            if raw is None:
                return None
            view = scan.scan_segment(raw)
            batch.views[skey] = view
        return view

    def _apply_add(self, batch: _Batch, mp: int, v: scan.SegmentView) -> None:
        tid, part, sid = v[1], v[2], v[3]
        tpk = _pack_tp(mp, tid, (part + _S32_FLIP) & 0xFFFFFFFF)
        puts = batch.puts
        deleting = None
        if tpk not in batch.undeleted:
            pkey = T_PARTITION_DELETE + tpk
            raw = batch.get(pkey) if pkey in puts or self.db.key_may_exist(pkey) else None
            if raw is not None:
                deleting = serde.decode(raw).state   # type: ignore[union-attr]
            elif pkey not in puts:
                batch.undeleted.add(tpk)
        skey = T_SEGMENT + tpk + sid
        views = batch.views
        # A new id is the common case: the bloom filters (memtable's, tables') answer "absent" without a search.
        fresh = skey not in puts and skey not in views and not self.db.key_may_exist(skey)
        old = None if fresh else self._load(batch, skey)
        known = None if old is None else old.state
        if refuse_new_segment(_UNNAMED, v.state, known, deleting) is not None:   # type: ignore[arg-type]
            raise refuse_new_segment(_SegmentName((tid, part, sid)), v.state, known, deleting)  # type: ignore[arg-type,misc]
        if old is not None:
            self._drop_segment(batch, tpk, old)
        puts[skey] = v.value
        views[skey] = v
        copy_epoch = v.broker_leader_epoch
        if copy_epoch is not None:
            fence = batch.fence(tpk)
            raised = raised_fence(fence, copy_epoch)
            if raised != fence:
                batch.set_fence(tpk, raised)   # type: ignore[arg-type]

    def _drop_segment(self, batch: _Batch, tpk: bytes, v: scan.SegmentView) -> None:
        batch.delete(T_SEGMENT + tpk + v.segment_id)
        self._drop_floor(batch, tpk, v)

    def _drop_floor(self, batch: _Batch, tpk: bytes, v: scan.SegmentView) -> None:
        for epoch, epoch_start in v.epochs:
            fk = T_EPOCH_FLOOR + tpk + _s32(epoch) + _s64(epoch_start)
            raw = batch.get(fk)
            if raw is not None and raw[:16] == v.segment_id:
                batch.delete(fk)

    def _apply_update(self, batch: _Batch, mp: int, u: scan.UpdateView) -> None:
        tid, part, sid = u[0], u[1], u[2]
        state = u.state
        tpk = _pack_tp(mp, tid, (part + _S32_FLIP) & 0xFFFFFFFF)
        skey = T_SEGMENT + tpk + sid
        old = batch.views.get(skey) or self._load(batch, skey)
        if old is None:
            refused = refuse_segment_update(_SegmentName((tid, part, sid)), state, None, copy_epoch=None,
                                            fence_epoch=_no_fence,
                                            deleted=batch.get(T_DELETED + tpk + sid) is not None)
        else:
            copy_epoch = old.broker_leader_epoch   # (no epoch: the fence is never asked, and no closure is built)
            fence_epoch = _no_fence if copy_epoch is None else lambda: batch.fence(tpk)
            refused = refuse_segment_update(_UNNAMED, state, old.state, copy_epoch=copy_epoch, fence_epoch=fence_epoch)
            if refused is not None:
                refused = refuse_segment_update(_SegmentName((tid, part, sid)), state, old.state,
                                                copy_epoch=copy_epoch, fence_epoch=fence_epoch)
        if refused is not None:
            raise refused
        puts = batch.puts
        if state == _DELETE_FINISHED:
            self._drop_segment(batch, tpk, old)
            puts[T_DELETED + tpk + sid] = _DELETED.pack(u.event_timestamp_ms, u.broker_id)
            return
        new = scan.patch_segment(old, u)
        puts[skey] = new.value
        batch.views[skey] = new
        if state == _FINISHED and old.state != _FINISHED:
            epochs = new.epochs
            floor_prefix = T_EPOCH_FLOOR + tpk
            if len(epochs) == 1:                   # the usual case
                epoch, epoch_start = epochs[0]
                puts[floor_prefix + _pack_epoch_offset(epoch + _S32_FLIP, epoch_start + _S64_FLIP)] = \
                    _pack_floor(sid, new.end_offset_inclusive)
                return
            last = len(epochs) - 1
            for i, (epoch, epoch_start) in enumerate(epochs):
                end = epochs[i + 1][1] - 1 if i < last else new.end_offset_inclusive
                puts[floor_prefix + _pack_epoch_offset(epoch + _S32_FLIP, epoch_start + _S64_FLIP)] = \
                    _pack_floor(sid, end)
        elif state == _DELETE_STARTED and old.state == _FINISHED:
            self._drop_floor(batch, tpk, old)

    def _apply_partition_delete(self, batch: _Batch, mp: int, p: RemotePartitionDeleteMetadata,
                                value: bytes) -> None:
        tpk = self._tp_key(p.topic_id_partition, mp)
        pk = T_PARTITION_DELETE + tpk
        raw = batch.get(pk)
        refused = refuse_partition_delete(p.topic_id_partition, p.state,
                                          None if raw is None else serde.decode(raw).state)  # type: ignore[union-attr]
        if refused is not None:
            raise refused
        if p.state == RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
            for t in (T_SEGMENT, T_EPOCH_FLOOR, T_COPY_FENCE):
                batch.ranges.append((t + tpk, _prefix_end(t + tpk)))
        batch.put(pk, bytes(value))
        batch.undeleted.discard(tpk)

    def _apply_tombstone(self, batch: _Batch, mp: int, key: bytes | None) -> None:
        k = decode_key(key)
        if k.kind == KeyKind.SEGMENT and k.state == RemoteLogSegmentState.DELETE_SEGMENT_FINISHED:
            tpk = _TP.pack(mp, k.topic_id.bytes, (k.partition + _S32_FLIP) & 0xFFFFFFFF)
            batch.delete(T_DELETED + tpk + k.segment_id.bytes)   # type: ignore[union-attr]

    # ---------------------------------------------------------------------------------------------- reads
    def segment_floor(self, tp: TopicIdPartition, epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
        tpk = self._tp_key(tp)
        prefix = T_EPOCH_FLOOR + tpk + _s32(epoch)
        it = self.db.iter()
        it.seek_for_prev(prefix + _s64(offset))
        if not it.valid():
            return None
        k = it.key()
        if not k.startswith(prefix):
            return None
        sid, epoch_end = _FLOOR.unpack(it.value())
        if offset > epoch_end:
            return None
        raw = self.db.get(T_SEGMENT + tpk + sid)
        return None if raw is None else scan.decode(raw)

    def highest_offset_for_epoch(self, tp: TopicIdPartition, epoch: int) -> int | None:
        prefix = T_EPOCH_FLOOR + self._tp_key(tp) + _s32(epoch)
        it = self.db.iter()
        it.seek_for_prev(_prefix_end(prefix))
        if not it.valid() or not it.key().startswith(prefix):
            return None
        return _FLOOR.unpack(it.value())[1]

    def _scan(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        it = self.db.iter()
        it.seek(prefix)
        while it.valid():
            k = it.key()
            if not k.startswith(prefix):
                return
            yield k, it.value()
            it.next()

    def segments(self, tp: TopicIdPartition, epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        """The partition's segments in any state, by start offset (then id); with ``epoch``, those holding it
        (a scan of the partition's segments: no index by epoch is kept, see the module docstring)."""
        tpk = self._tp_key(tp)
        if epoch is None:
            segs = [scan.decode(v) for _k, v in self._scan(T_SEGMENT + tpk)]
            segs.sort(key=lambda md: (md.start_offset, md.remote_log_segment_id.id.bytes))
            return segs
        found = []
        for _k, raw in self._scan(T_SEGMENT + tpk):
            v = scan.scan_segment(raw)
            if any(e == epoch for e, _o in v.epochs):
                found.append((v.start_offset, v.segment_id, raw))
        found.sort(key=lambda f: (f[0], f[1]))
        return [scan.decode(raw) for _start, _sid, raw in found]

    def segment(self, tp: TopicIdPartition, segment_id: uuid.UUID) -> RemoteLogSegmentMetadata | None:
        tpk = self._tp_key(tp)
        raw = self.db.get(T_SEGMENT + tpk + segment_id.bytes)
        return None if raw is None else scan.decode(raw)

    def segment_view(self, tp: TopicIdPartition, segment_id: uuid.UUID) -> scan.SegmentView | None:
        """The segment's stored value scanned, not decoded (its state, copy epoch, offsets: :class:`scan.SegmentView`;
        a write's check needs no more, issue 26), or None."""
        raw = self.db.get(T_SEGMENT + self._tp_key(tp) + segment_id.bytes)
        return None if raw is None else scan.scan_segment(raw)

    def copy_fence_epoch(self, tp: TopicIdPartition) -> int | None:
        """The highest broker leader epoch of any applied COPY_SEGMENT_STARTED of ``tp`` (None: none had one)."""
        raw = self.db.get(T_COPY_FENCE + self._tp_key(tp))
        return None if raw is None else _I32.unpack(raw)[0]

    def partition_delete(self, tp: TopicIdPartition) -> RemotePartitionDeleteMetadata | None:
        raw = self.db.get(T_PARTITION_DELETE + self._tp_key(tp))
        return None if raw is None else serde.decode(raw)  # type: ignore[return-value]

    def deleted_segments(self, mp: int) -> list[DeletedSegment]:
        """Fully deleted segments of metadata partition ``mp`` whose tombstones were not consumed yet."""
        out = []
        for k, v in self._scan(T_DELETED + _MP.pack(mp)):
            _mp, tid, part = _TP.unpack_from(k, 1)
            sid = k[1 + _TP.size:]
            ts, broker = _DELETED.unpack(v)
            out.append(DeletedSegment(uuid.UUID(bytes=tid), part - _S32_FLIP, uuid.UUID(bytes=sid), ts, broker))
        return out

    def dump(self) -> dict[bytes, bytes]:
        """Every state key and value (progress and meta excluded): for comparing two caches."""
        return {k: v for k, v in self.db.items() if k[:1] not in (T_META, T_PROGRESS)}

