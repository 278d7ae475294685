"""Errors of the RemoteStorageManager (everything in ``rsm/`` outside ``rsm/log/``).

One root, :class:`RemoteStorageError`, as Kafka's ``org.apache.kafka.server.log.remote.storage``. Third-party
errors (botocore, OSError) are wrapped with ``raise ... from err`` so callers catch only these.
"""

from __future__ import annotations

__all__ = [
    "CopyCancelledError",
    "CorruptRemoteObjectError",
    "RemoteResourceNotFoundError",
    "RemoteStorageError",
    "StoreConfigError",
]


class RemoteStorageError(Exception):
    """A remote storage operation failed (store unreachable, request refused, local file unreadable).

    The operation may be retried: every RemoteStorageManager write is idempotent and never leaves a partial
    object visible. The message names the key (or local path) concerned.
    """


class RemoteResourceNotFoundError(RemoteStorageError):
    """The remote object does not exist: the segment was never copied, was deleted, or (for a transaction
    index) the segment had none. Never answered with empty bytes."""


class CorruptRemoteObjectError(RemoteStorageError):
    """A remote object's bytes do not match its format or checksum (bit rot, truncation, a foreign object).

    ``key`` is the object, ``position`` the byte position in it where the problem was seen, ``kafka_offset``
    the Kafka offset concerned when known. The data was not returned; an operator should re-copy the segment
    from a replica that still has it locally, or delete the remote copy.
    """

    def __init__(self, message: str, *, key: str, position: int, kafka_offset: int | None = None) -> None:
        where = f"{key} at byte {position}"
        if kafka_offset is not None:
            where += f" (Kafka offset {kafka_offset})"
        super().__init__(f"{where}: {message}")
        self.key = key
        self.position = position
        self.kafka_offset = kafka_offset


class StoreConfigError(RemoteStorageError):
    """The RemoteStorageManager or store configuration is unusable (bad root, bucket missing); fix the config."""


class CopyCancelledError(Exception):
    """A copy was cancelled by its caller (the ``cancel`` event of ``copy_log_segment_data`` / ``copy_log_range``)
    before it completed: what it wrote was removed, nothing is readable. Not a store failure, so not a
    :class:`RemoteStorageError`: the store did nothing wrong (a partition no longer led, its topic deleted)."""
