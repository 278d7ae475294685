"""A partition's producer-state snapshot, the ``<offset>.snapshot`` files of a partition directory.

Mirrors Kafka's ``ProducerStateManager.readSnapshot``/``writeSnapshot`` and the generated ``ProducerSnapshot``
message they use
(https://github.com/apache/kafka/blob/trunk/storage/src/main/java/org/apache/kafka/storage/internals/log/ProducerStateManager.java,
https://github.com/apache/kafka/blob/trunk/storage/src/main/resources/message/ProducerSnapshot.json: version 1
only, not a flexible version, so no tagged fields and a plain ``Int32`` array length). All integers big-endian::

    ProducerSnapshot =>
      Version => Int16                    = 1 (written by Kafka's MessageUtil.toVersionPrefixedByteBuffer)
      Crc => Uint32                       CRC-32C of every byte after this field, to the end of the file
      ProducerEntries => Int32 count, then count times (one per producer id, in no particular order):
        ProducerId => Int64
        Epoch => Int16                    the producer epoch
        LastSequence => Int32             sequence of the last record of its last data batch
        LastOffset => Int64               offset of that record; -1 when the producer has no batch metadata
        OffsetDelta => Int32              last offset - first offset of that data batch
        Timestamp => Int64                max timestamp (ms) of its last batch, data or transaction marker
        CoordinatorEpoch => Int32         epoch of the coordinator of its last transaction marker (-1: none)
        CurrentTxnFirstOffset => Int64    first offset of its ongoing transaction; -1 when none is open

``<N>.snapshot`` holds the state after every offset below ``N`` (Kafka takes one whenever a segment rolls, named
by the new segment's base offset; with a remote copy of the segment ``[base, end]`` it uploads
``<end + 1>.snapshot``). Kafka's reader checks the version, parses, then checks the CRC; a snapshot failing any
of these is deleted and the state rebuilt from an older snapshot and the log. We are stricter in one way: bytes
after the last entry (which Kafka's writer never produces) are an error too.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from dataclasses import astuple, dataclass
from pathlib import Path

from rsm.log._crc32c import buffer_address, crc32c_at
from rsm.log.errors import CorruptProducerSnapshotError

__all__ = [
    "ENTRY",
    "PREFIX",
    "SNAPSHOT_VERSION",
    "ProducerStateEntry",
    "format_producer_snapshot",
    "ongoing_txn_first_offsets",
    "parse_producer_snapshot",
    "read_producer_snapshot",
]

PREFIX = struct.Struct(
    ">"
    "h"  # version: Int16
    "I"  # crc: Uint32, CRC-32C of every byte after it
    "i"  # producer_entries count: Int32 (the array length; negative is a null array, invalid here)
)
ENTRY = struct.Struct(
    ">"
    "q"  # producer_id: Int64
    "h"  # producer_epoch: Int16
    "i"  # last_sequence: Int32
    "q"  # last_offset: Int64
    "i"  # offset_delta: Int32
    "q"  # timestamp_ms: Int64
    "i"  # coordinator_epoch: Int32
    "q"  # current_txn_first_offset: Int64
)
SNAPSHOT_VERSION = 1
CRC_OFFSET = struct.calcsize(">h")  # 2: after Version
CRC_COVERS_FROM = CRC_OFFSET + struct.calcsize(">I")  # 6: the CRC covers the count and every entry
ENTRIES_OFFSET = PREFIX.size  # 10: the first entry
# Kafka's names of the prefix and entry fields, in file order, and where each ends (from the struct formats:
# field i of ">hIi" ends at calcsize of the format up to and including it).
_PREFIX_FIELDS = ("Version", "Crc", "ProducerEntries count")
_ENTRY_FIELDS = ("ProducerId", "Epoch", "LastSequence", "LastOffset", "OffsetDelta", "Timestamp",
                 "CoordinatorEpoch", "CurrentTxnFirstOffset")
_PREFIX_ENDS = tuple(struct.calcsize(PREFIX.format[:i + 2]) for i in range(len(_PREFIX_FIELDS)))
_ENTRY_ENDS = tuple(struct.calcsize(ENTRY.format[:i + 2]) for i in range(len(_ENTRY_FIELDS)))


@dataclass(frozen=True, slots=True)
class ProducerStateEntry:
    """One producer's state in a snapshot (Kafka's ``ProducerSnapshot.ProducerEntry``), fields in file order.

    Offsets are absolute partition offsets; ``last_offset`` is -1 when Kafka had no batch metadata for the
    producer, ``current_txn_first_offset`` -1 when it had no ongoing transaction."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_offset: int
    offset_delta: int
    timestamp_ms: int
    coordinator_epoch: int
    current_txn_first_offset: int

    @property
    def has_ongoing_txn(self) -> bool:
        """Whether the producer had a transaction open at the snapshot's offset."""
        return self.current_txn_first_offset >= 0


def _field_at(rel: int, ends: tuple[int, ...], names: tuple[str, ...]) -> str:
    """The name of the field holding byte ``rel`` of a struct whose fields end (exclusive) at ``ends``."""
    return next(name for name, end in zip(names, ends, strict=True) if rel < end)


def parse_producer_snapshot(data: bytes | bytearray | memoryview, *, path: str | os.PathLike[str]
                            ) -> list[ProducerStateEntry]:
    """The entries of a producer snapshot's bytes (a local file's or fetched from remote storage).

    Raises :class:`CorruptProducerSnapshotError` naming ``path``, the byte position and the field: for an
    unknown version, a file cut short (the entry and field it ends in), bytes after the last entry, or a CRC-32C
    mismatch. An empty entry array is valid (no producer state)."""
    buf = bytearray(data)  # snapshots are small (46 bytes a producer); the CRC helper reads a writable buffer
    n = len(buf)
    if n < PREFIX.size:
        field = _field_at(n, _PREFIX_ENDS, _PREFIX_FIELDS)
        raise CorruptProducerSnapshotError(
            path, n, f"truncated producer snapshot: {n} bytes, expected at least {PREFIX.size} (Version, Crc, "
            f"ProducerEntries count); the file ends in the {field} field")
    version, stored_crc, count = PREFIX.unpack_from(buf)
    if version != SNAPSHOT_VERSION:
        raise CorruptProducerSnapshotError(
            path, 0, f"Version: expected producer snapshot version {SNAPSHOT_VERSION}, found {version}")
    computed_crc = crc32c_at(buf, buffer_address(buf), CRC_COVERS_FROM, n - CRC_COVERS_FROM)
    crc_note = "" if computed_crc == stored_crc else (
        f" (and the stored CRC-32C 0x{stored_crc:08X} does not match the computed 0x{computed_crc:08X})")
    if count < 0:
        raise CorruptProducerSnapshotError(
            path, CRC_COVERS_FROM, f"ProducerEntries count: {count} (a null array), expected >= 0{crc_note}")
    expected = ENTRIES_OFFSET + count * ENTRY.size
    if n < expected:
        i, rel = divmod(n - ENTRIES_OFFSET, ENTRY.size)
        field = _field_at(rel, _ENTRY_ENDS, _ENTRY_FIELDS)
        raise CorruptProducerSnapshotError(
            path, n, f"truncated producer snapshot: ProducerEntries count {count} needs {expected} bytes, found "
            f"{n}; entry {i} (bytes {ENTRIES_OFFSET + i * ENTRY.size}..{ENTRIES_OFFSET + (i + 1) * ENTRY.size - 1}) is "
            f"cut short in its {field} field ({rel} of its {ENTRY.size} bytes present){crc_note}")
    if n > expected:
        raise CorruptProducerSnapshotError(
            path, expected, f"{n - expected} bytes after the last of {count} entries (expected {expected} bytes, "
            f"found {n}){crc_note}")
    if computed_crc != stored_crc:
        raise CorruptProducerSnapshotError(
            path, CRC_OFFSET, f"Crc: stored CRC-32C 0x{stored_crc:08X} does not match 0x{computed_crc:08X} computed "
            f"over bytes {CRC_COVERS_FROM}..{n - 1} ({count} entries)")
    return [ProducerStateEntry(*fields) for fields in ENTRY.iter_unpack(memoryview(buf)[ENTRIES_OFFSET:])]


def read_producer_snapshot(path: str | os.PathLike[str]) -> list[ProducerStateEntry]:
    """The entries of a local ``.snapshot`` file (see :func:`parse_producer_snapshot`)."""
    return parse_producer_snapshot(Path(path).read_bytes(), path=path)


def format_producer_snapshot(entries: Iterable[ProducerStateEntry]) -> bytes:
    """The bytes Kafka writes for ``entries`` (the inverse of :func:`parse_producer_snapshot`)."""
    entries = list(entries)
    buf = bytearray(PREFIX.pack(SNAPSHOT_VERSION, 0, len(entries)))
    for e in entries:
        buf += ENTRY.pack(*astuple(e))
    struct.pack_into(">I", buf, CRC_OFFSET, crc32c_at(buf, buffer_address(buf), CRC_COVERS_FROM,
                                                      len(buf) - CRC_COVERS_FROM))
    return bytes(buf)


def ongoing_txn_first_offsets(entries: Iterable[ProducerStateEntry]) -> dict[int, int]:
    """Producer id -> first offset of its ongoing transaction, for the producers that had one open."""
    return {e.producer_id: e.current_txn_first_offset for e in entries if e.has_ongoing_txn}
