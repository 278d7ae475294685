"""Object keys of remote segment copies.

::

    [<entropy>/]<topic name, percent-encoded>-<topic id>/<partition>/<20-digit base offset>-<remote segment id>
        the first data object (object 0) of a copy; objects 1, 2 ... of a spanning copy add ``.part-<n:05d>``
    ...-<remote segment id>-index
        the index object (written last: the commit point)

The topic name keeps ``[A-Za-z0-9._-]`` and percent-encodes every other byte of its UTF-8 form (and a name of
only dots), so any name makes a safe, single path component (``<encoded name>-<topic id>`` may be longer than a
file name: 249 + 37 bytes for Kafka's longest names; the filesystem store lays such a component out itself). The
encoded name is at most :data:`MAX_ENCODED_TOPIC_NAME` characters (every Kafka topic name fits; keys stay under
S3's 1024 bytes); an empty or longer name is refused.

The optional entropy prefix is 4 hex digits of SHA-256 over the partition part, so all of a partition's objects
share it and listing a partition stays one prefix, while partitions spread over the key space (S3 request-rate
partitioning).
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass

__all__ = ["KEY_BASE_LENGTH", "MAX_ENCODED_TOPIC_NAME", "SegmentKeys", "decode_topic_name", "encode_topic_name",
           "ledger_id_for", "parse_key_tail", "parse_partition_key", "partition_prefix", "segment_id_of_key"]

# The part of a key after the partition prefix: <20-digit base offset>-<remote segment id>[.part-NNNNN | -index]
_KEY_TAIL = re.compile(r"^(?P<base>\d{20})-(?P<id>[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"
                       r"(?:\.part-\d{5}|-index)?$")
KEY_BASE_LENGTH = 20 + 1 + 36
"""Length of ``<base offset>-<segment id>``: a key tail cut to it is the copy's key base after the prefix."""

_UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
# A key from its start: [<entropy>/]<encoded topic name>-<topic id>/<partition>/<rest>
_PARTITION_KEY = re.compile(r"^(?P<name>[^/]+)-(?P<id>" + _UUID + r")/(?P<partition>0|[1-9]\d{0,9})/(?P<rest>.)")

MAX_ENCODED_TOPIC_NAME = 3 * 249
"""The longest percent-encoded topic name a key holds: Kafka's longest name (249) with every byte encoded."""
_PERCENT = re.compile(r"%([0-9A-F]{2})")

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def encode_topic_name(name: str) -> str:
    """Percent-encode ``name`` into one safe key component."""
    raw = name.encode("utf-8")
    if raw.strip(b".") == b"":
        return "".join(f"%{b:02X}" for b in raw) or "%00"
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw)


def decode_topic_name(encoded: str) -> str | None:
    """The topic name :func:`encode_topic_name` encoded as ``encoded``; None when ``encoded`` is not its output."""
    try:
        raw = bytes(ord(c) for c in _PERCENT.sub(lambda m: chr(int(m[1], 16)), encoded))
        name = raw.decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return None
    return name if encode_topic_name(name) == encoded else None


def parse_partition_key(key: str, *, entropy: bool = False) -> tuple[str, uuid.UUID, int, str] | None:
    """(topic name, topic id, partition, partition prefix) of an object key (within a store, its key prefix
    stripped) laid out by :func:`partition_prefix`; None when the key is not laid out so (the entropy prefix
    must be the partition's own)."""
    rest = key
    if entropy:
        if len(key) < 5 or key[4] != "/":
            return None
        rest = key[5:]
    m = _PARTITION_KEY.match(rest)
    if m is None:
        return None
    name = decode_topic_name(m["name"])
    if not name:
        return None
    topic_id, partition = uuid.UUID(m["id"]), int(m["partition"])
    try:
        prefix = partition_prefix(name, topic_id, partition, entropy=entropy)
    except ValueError:
        return None  # no key of ours holds that name
    return (name, topic_id, partition, prefix) if key.startswith(prefix) else None


def _topic_part(topic_name: str, topic_id: uuid.UUID) -> str:
    """``<encoded name>-<topic id>``; ValueError naming a name no key holds."""
    if not topic_name:
        raise ValueError("empty topic name: no object key is made for it")
    try:
        encoded = encode_topic_name(topic_name)
    except UnicodeEncodeError:
        raise ValueError(f"topic name {topic_name!r} is not valid unicode (lone surrogates)") from None
    if len(encoded) > MAX_ENCODED_TOPIC_NAME:
        raise ValueError(f"topic name {topic_name!r} is too long for an object key: {len(encoded)} characters "
                         f"percent-encoded, at most {MAX_ENCODED_TOPIC_NAME}")
    return f"{encoded}-{topic_id}"


def partition_prefix(topic_name: str, topic_id: uuid.UUID, partition: int, *, entropy: bool = False) -> str:
    """The key prefix of all copies of one partition (ends with ``/``); ValueError naming a topic name that no
    key can hold (empty, or longer than :data:`MAX_ENCODED_TOPIC_NAME` percent-encoded)."""
    base = f"{_topic_part(topic_name, topic_id)}/{partition}/"
    if entropy:
        return hashlib.sha256(base.encode()).hexdigest()[:4] + "/" + base
    return base


def ledger_id_for(remote_segment_id: uuid.UUID) -> int:
    """The ledger id of a copy attempt: the top 63 bits of its (random, per attempt) remote segment id."""
    return remote_segment_id.int >> 65


@dataclass(frozen=True, slots=True)
class SegmentKeys:
    """The keys of one segment copy."""

    base: str

    @classmethod
    def for_segment(cls, topic_name: str, topic_id: uuid.UUID, partition: int, base_offset: int,
                    remote_segment_id: uuid.UUID, *, entropy: bool = False) -> SegmentKeys:
        if base_offset < 0:
            raise ValueError(f"negative base offset {base_offset}")
        prefix = partition_prefix(topic_name, topic_id, partition, entropy=entropy)
        return cls(f"{prefix}{base_offset:020d}-{remote_segment_id}")

    def data(self, object_number: int) -> str:
        return self.base if object_number == 0 else f"{self.base}.part-{object_number:05d}"

    @property
    def index(self) -> str:
        return self.base + "-index"

    @property
    def prefix(self) -> str:
        """Every object of this copy (and only of this copy) starts with it."""
        return self.base


def parse_key_tail(key_tail: str) -> tuple[int, uuid.UUID] | None:
    """(base offset, remote segment id) of a key after its partition prefix; None when it is no copy's key."""
    m = _KEY_TAIL.match(key_tail)
    return (int(m["base"]), uuid.UUID(m["id"])) if m else None


def segment_id_of_key(key_tail: str) -> uuid.UUID | None:
    """The remote segment id of a key after its partition prefix; None when it is no copy's key."""
    parsed = parse_key_tail(key_tail)
    return parsed[1] if parsed else None
