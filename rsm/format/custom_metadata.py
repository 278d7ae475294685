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
      flags => uint8                    (bit 0: key entropy prefix; bit 1: key root follows; other bits 0)
      key_prefix_len => uint8           (bytes of key_prefix)
      key_prefix => utf-8 bytes         (the store's key prefix, "" when none)
      KeyRoot =>                        (only with flag bit 1)
        topic_id => 16 bytes            (the topic id the copy's keys carry)
        topic_name_len => uint8         (0: the keys carry the segment's own topic name)
        topic_name => utf-8 bytes       (the topic name the copy's keys carry)

The key root is written by ``rlm recover`` only, for a copy whose metadata it recovered onto a topic with another id
(re-created, or on another cluster) or another name: the copy's keys keep the identity they were written under
(``KeyLayout.root_topic_id`` / ``root_topic_name``). A reader that knows only flag bit 0 refuses such metadata.

Unknown magic, version or flags, or trailing bytes, raise :class:`CustomMetadataError`: a reader or deleter never
guesses where a copy lives (a delete on guessed keys would "succeed" and orphan the objects).
"""

from __future__ import annotations

import struct
import uuid

from rsm.api import KeyLayout  # the value type lives with the API; encoded here
from rsm.errors import RemoteStorageError

__all__ = ["CUSTOM_METADATA_VERSION", "MAX_CUSTOM_METADATA_BYTES", "CustomMetadataError", "KeyLayout",
           "decode_custom_metadata", "encode_custom_metadata"]

MAGIC = b"RK"
CUSTOM_METADATA_VERSION = 1
MAX_CUSTOM_METADATA_BYTES = 100
_FLAG_ENTROPY = 0x01
_FLAG_KEY_ROOT = 0x02
_KNOWN_FLAGS = _FLAG_ENTROPY | _FLAG_KEY_ROOT
_HEADER = struct.Struct(
    ">"
    "2s"  # magic
    "B"   # version
    "B"   # flags
    "B"   # key_prefix_len
)
_ROOT = struct.Struct(
    ">"
    "16s"  # topic_id
    "B"    # topic_name_len
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
    flags = _FLAG_ENTROPY if layout.entropy else 0
    root = b""
    if layout.root_topic_id is not None:
        name = (layout.root_topic_name or "").encode("utf-8")
        if len(name) > 255:
            raise ValueError(f"key root topic name of {len(name)} bytes: at most 255")
        flags |= _FLAG_KEY_ROOT
        root = _ROOT.pack(layout.root_topic_id.bytes, len(name)) + name
    elif layout.root_topic_name is not None:
        raise ValueError("a key root names its topic id (root_topic_name without root_topic_id)")
    out = _HEADER.pack(MAGIC, CUSTOM_METADATA_VERSION, flags, len(prefix)) + prefix + root
    if len(out) > MAX_CUSTOM_METADATA_BYTES:
        raise ValueError(f"custom metadata of {len(out)} bytes (key prefix and key root): at most "
                         f"{MAX_CUSTOM_METADATA_BYTES}")
    return out


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
    if flags & ~_KNOWN_FLAGS:
        raise CustomMetadataError(f"custom metadata has unknown flags 0x{flags:02X}")
    end = _HEADER.size + n
    root_id: uuid.UUID | None = None
    root_name: str | None = None
    if flags & _FLAG_KEY_ROOT:
        if len(data) < end + _ROOT.size:
            raise CustomMetadataError(f"custom metadata of {len(data)} bytes, its key root needs at least "
                                      f"{end + _ROOT.size}")
        raw_id, name_len = _ROOT.unpack_from(data, end)
        root_id = uuid.UUID(bytes=bytes(raw_id))
        name_at = end + _ROOT.size
        end = name_at + name_len
        if name_len and len(data) >= end:
            try:
                root_name = bytes(data[name_at:end]).decode("utf-8")
            except UnicodeDecodeError as err:
                raise CustomMetadataError(f"custom metadata key root topic name is not utf-8: {err}") from err
    if len(data) != end:
        raise CustomMetadataError(f"custom metadata of {len(data)} bytes, its lengths say {end}")
    try:
        prefix = bytes(data[_HEADER.size:_HEADER.size + n]).decode("utf-8")
    except UnicodeDecodeError as err:
        raise CustomMetadataError(f"custom metadata key prefix is not utf-8: {err}") from err
    return KeyLayout(prefix, bool(flags & _FLAG_ENTROPY), root_id, root_name)
