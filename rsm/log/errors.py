"""Errors raised while reading Kafka's on-disk log format (``rsm/log``).

One root, :class:`LogFormatError`. Every message names the file and, where there is one, the byte position,
and says what was expected and what was found. Operator action: the file is damaged or is not what its name
says; do not upload it; compare it with another replica's copy or let the broker recover the segment.
"""

from __future__ import annotations

from os import PathLike

__all__ = ["CorruptCheckpointError", "CorruptIndexError", "CorruptProducerSnapshotError", "CorruptRecordBatchError",
           "LogFormatError"]


class LogFormatError(Exception):
    """A Kafka log file (segment, index, checkpoint, metadata) is malformed.

    ``path`` is the file, ``position`` the byte offset in it where the problem was found (``None`` when the
    problem is not tied to one position, e.g. a text file's line: then the line number is in the message).
    ``detail`` is the message without the file and position (for callers that name the file their own way).
    """

    def __init__(self, path: str | PathLike[str], position: int | None, message: str) -> None:
        self.path = str(path)
        self.position = position
        self.detail = message
        where = f"{self.path}" if position is None else f"{self.path} at byte {position}"
        super().__init__(f"{where}: {message}")


class CorruptRecordBatchError(LogFormatError):
    """A record batch in a ``.log`` file is malformed: bad magic, impossible length, CRC-32C mismatch,
    truncated, offsets going backwards, or records that do not decode."""


class CorruptIndexError(LogFormatError):
    """An ``.index``/``.timeindex``/``.txnindex`` file is malformed: its length is not a multiple of the entry
    size, or its entries are out of order."""


class CorruptCheckpointError(LogFormatError):
    """A ``leader-epoch-checkpoint`` or ``partition.metadata`` text file is malformed; the message names the
    line and what was expected there."""


class CorruptProducerSnapshotError(LogFormatError):
    """A producer-state ``.snapshot`` file is malformed: unknown version, truncated (the message names the entry
    and field the file ends in), bytes after the last entry, or a CRC-32C mismatch. Kafka itself deletes such a
    snapshot and rebuilds the producer state from an older snapshot and the log; do not upload it."""
