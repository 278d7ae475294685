"""The custom metadata a copy returns (KIP-405's ``CustomMetadata``): the key layout the copy was written under.

``copy_log_segment_data`` returns these bytes; the metadata manager stores them with the segment
(``RemoteLogSegmentMetadata.custom_metadata``) and hands them back in ``RemoteSegmentMetadata.custom_metadata``, so
fetches, reads and deletes address the objects where they were written whatever ``key_prefix`` / ``key_entropy``
say now. Segments without custom metadata (copied before it existed) use the current configuration.

Layout (big-endian), at most :data:`MAX_CUSTOM_METADATA_BYTES` (Kafka's default
``remote.log.metadata.custom.metadata.max.bytes`` is 128)::

    CustomMetadata =>
      magic => 2 bytes                  ("RK")
      version => uint8                  (1)
      flags => uint8                    (bit 0: key entropy prefix; other bits 0)
      key_prefix_len => uint8           (bytes of key_prefix)
      key_prefix => utf-8 bytes         (the store's key prefix, "" when none)

Unknown magic, version or flags, or trailing bytes, raise :class:`CustomMetadataError`: a reader or deleter never
guesses where a copy lives (a delete on guessed keys would "succeed" and orphan the objects).
"""

from __future__ import annotations

import struct

from rsm.api import KeyLayout  # the value type lives with the API; encoded here
from rsm.errors import RemoteStorageError

__all__ = ["CUSTOM_METADATA_VERSION", "MAX_CUSTOM_METADATA_BYTES", "CustomMetadataError", "KeyLayout",
           "decode_custom_metadata", "encode_custom_metadata"]

MAGIC = b"RK"
CUSTOM_METADATA_VERSION = 1
MAX_CUSTOM_METADATA_BYTES = 100
_FLAG_ENTROPY = 0x01
_HEADER = struct.Struct(
    ">"
    "2s"  # magic
    "B"   # version
    "B"   # flags
    "B"   # key_prefix_len
)
MAX_KEY_PREFIX_BYTES = MAX_CUSTOM_METADATA_BYTES - _HEADER.size


class CustomMetadataError(RemoteStorageError):
    """Custom metadata this storage manager cannot read (another writer's, or a newer version's)."""


def encode_custom_metadata(layout: KeyLayout) -> bytes:
    """The custom metadata of a copy made under ``layout``; ValueError when it would pass the size limit."""
    prefix = layout.key_prefix.encode("utf-8")
    if len(prefix) > MAX_KEY_PREFIX_BYTES:
        raise ValueError(f"key prefix of {len(prefix)} bytes: at most {MAX_KEY_PREFIX_BYTES} fit in the "
                         f"{MAX_CUSTOM_METADATA_BYTES}-byte custom metadata")
    return _HEADER.pack(MAGIC, CUSTOM_METADATA_VERSION, _FLAG_ENTROPY if layout.entropy else 0, len(prefix)) + prefix


def decode_custom_metadata(data: bytes) -> KeyLayout:
    """The key layout recorded by :func:`encode_custom_metadata`."""
    if len(data) < _HEADER.size:
        raise CustomMetadataError(f"custom metadata of {len(data)} bytes is not ours (too short)")
    magic, version, flags, n = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise CustomMetadataError(f"custom metadata starts with {bytes(magic)!r}, not {MAGIC!r}: not ours")
    if version != CUSTOM_METADATA_VERSION:
        raise CustomMetadataError(f"custom metadata version {version} is unknown (this reader knows "
                                  f"{CUSTOM_METADATA_VERSION})")
    if flags & ~_FLAG_ENTROPY:
        raise CustomMetadataError(f"custom metadata has unknown flags 0x{flags:02X}")
    if len(data) != _HEADER.size + n:
        raise CustomMetadataError(f"custom metadata of {len(data)} bytes, its key prefix length says "
                                  f"{_HEADER.size + n}")
    try:
        prefix = bytes(data[_HEADER.size:]).decode("utf-8")
    except UnicodeDecodeError as err:
        raise CustomMetadataError(f"custom metadata key prefix is not utf-8: {err}") from err
    return KeyLayout(prefix, bool(flags & _FLAG_ENTROPY))
