"""A partition directory's text files: ``leader-epoch-checkpoint`` and ``partition.metadata``.

Mirrors Kafka's ``LeaderEpochCheckpointFile`` (``CheckpointFile`` text format) and ``PartitionMetadataFile``
(https://github.com/apache/kafka/tree/trunk/storage/src/main/java/org/apache/kafka/storage/internals/checkpoint)::

    leader-epoch-checkpoint =>         UTF-8 text, one item per line
      Version => "0"
      Count => decimal
      Entry => "<epoch> <startOffset>"   Count lines, epochs and start offsets ascending

    partition.metadata =>
      "version: 0"
      "topic_id: <uuid>"               Kafka's Uuid.toString(): URL-safe base64 of the 16 bytes, no padding
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import uuid
from dataclasses import dataclass

from rsm.log.errors import CorruptCheckpointError
from rsm.log.held import read_bytes

__all__ = ["EpochEntry", "format_leader_epoch_checkpoint", "parse_leader_epoch_checkpoint",
           "parse_partition_metadata", "read_leader_epoch_checkpoint",
           "read_partition_metadata"]

CHECKPOINT_VERSION = 0
PARTITION_METADATA_VERSION = 0
_INT = re.compile(r"-?[0-9]+")  # what Java's Integer/Long.parseLong take, less '+': no '--5', '1_0', '٣'


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """From ``start_offset`` on (inclusive), the partition's leader epoch was ``epoch``."""

    epoch: int
    start_offset: int


def _lines(path: str | os.PathLike[str], text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _int(path: str | os.PathLike[str], lineno: int, token: str, what: str) -> int:
    if _INT.fullmatch(token) is None:
        raise CorruptCheckpointError(path, None, f"line {lineno}: expected {what} (an integer), found {token!r}")
    return int(token)


def parse_leader_epoch_checkpoint(text: str, path: str | os.PathLike[str] = "<leader-epoch-checkpoint>"
                                  ) -> list[EpochEntry]:
    """Parse the text of a ``leader-epoch-checkpoint``; errors name ``path`` and the line. An empty file holds no
    entry: Kafka's ``CheckpointFile`` creates the file empty when it opens a new partition's checkpoint, before its
    first write, and reads an empty file as no entries."""
    if text == "":
        return []
    lines = _lines(path, text)
    if len(lines) < 2:
        raise CorruptCheckpointError(path, None, f"expected a version line and a count line, found {len(lines)} lines")
    version = _int(path, 1, lines[0].strip(), "the version")
    if version != CHECKPOINT_VERSION:
        raise CorruptCheckpointError(path, None, f"line 1: expected version {CHECKPOINT_VERSION}, found {version}")
    count = _int(path, 2, lines[1].strip(), "the entry count")
    if count < 0 or len(lines) - 2 != count:
        raise CorruptCheckpointError(path, None, f"line 2: count says {count} entries, found {len(lines) - 2} lines")
    out: list[EpochEntry] = []
    for lineno, line in enumerate(lines[2:], start=3):
        parts = line.split()
        if len(parts) != 2:
            raise CorruptCheckpointError(path, None, f"line {lineno}: expected '<epoch> <startOffset>', found {line!r}")
        epoch = _int(path, lineno, parts[0], "the epoch")
        start = _int(path, lineno, parts[1], "the start offset")
        if epoch < 0 or start < 0 or (out and (epoch <= out[-1].epoch or start < out[-1].start_offset)):
            raise CorruptCheckpointError(path, None, f"line {lineno}: epoch {epoch} at offset {start} does not "
                                         "follow the previous entry in ascending order")
        out.append(EpochEntry(epoch, start))
    return out


def read_leader_epoch_checkpoint(path: str | os.PathLike[str]) -> list[EpochEntry]:
    """Read a ``leader-epoch-checkpoint`` file (see :func:`parse_leader_epoch_checkpoint`)."""
    return parse_leader_epoch_checkpoint(_read_text(path), path)


def parse_partition_metadata(text: str, path: str | os.PathLike[str] = "<partition.metadata>") -> uuid.UUID:
    """Parse the text of a ``partition.metadata`` file into its topic id; errors name ``path`` and the line."""
    fields: dict[str, tuple[int, str]] = {}
    for lineno, line in enumerate(_lines(path, text), start=1):
        if not line.strip():
            continue
        key, sep, value = line.partition(":")
        if not sep:
            raise CorruptCheckpointError(path, None, f"line {lineno}: expected 'key: value', found {line!r}")
        fields[key.strip()] = (lineno, value.strip())
    if "version" not in fields or "topic_id" not in fields:
        raise CorruptCheckpointError(path, None, f"expected 'version' and 'topic_id' lines, found keys "
                                     f"{sorted(fields)}")
    lineno, version = fields["version"]
    if version != str(PARTITION_METADATA_VERSION):
        raise CorruptCheckpointError(path, None, f"line {lineno}: expected version {PARTITION_METADATA_VERSION}, "
                                     f"found {version!r}")
    lineno, tid = fields["topic_id"]
    try:
        raw = base64.urlsafe_b64decode(tid + "=" * (-len(tid) % 4)) if tid.isascii() else b""
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 16:
        raise CorruptCheckpointError(path, None, f"line {lineno}: expected a base64 topic id of 16 bytes, found "
                                     f"{tid!r}")
    return uuid.UUID(bytes=raw)


def read_partition_metadata(path: str | os.PathLike[str]) -> uuid.UUID:
    """Read a ``partition.metadata`` file's topic id (see :func:`parse_partition_metadata`)."""
    return parse_partition_metadata(_read_text(path), path)


def _read_text(path: str | os.PathLike[str]) -> str:
    data = read_bytes(path)  # (os.open and os.read: a copy run reads its checkpoint, issue 26)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise CorruptCheckpointError(path, err.start, f"not UTF-8 text: {err.reason}") from err


def format_leader_epoch_checkpoint(entries: list[EpochEntry]) -> bytes:
    """The bytes of a ``leader-epoch-checkpoint`` holding ``entries`` (the layout above; what Kafka writes)."""
    lines = [str(CHECKPOINT_VERSION), str(len(entries))] + [f"{e.epoch} {e.start_offset}" for e in entries]
    return ("\n".join(lines) + "\n").encode()
