"""The tests' stores from the outside: S3 clients of the test servers (moto, s3proxy), fresh buckets, and bit rot
made behind a store's back (a byte, or a copy's index object on the filesystem store for a while)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config

from rlmm.api import TopicIdPartition
from rsm.store.fs import FileSystemStore

__all__ = ["corrupt_byte", "index_base", "index_keys", "new_bucket", "s3_client_for", "unreadable_copy"]


def s3_client_for(endpoint: str) -> Any:
    """A boto3 client of ``endpoint`` with the default credentials, checksums only when required, path-style."""
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                        config=Config(s3={"addressing_style": "path"}, request_checksum_calculation="when_required",
                                      response_checksum_validation="when_required"))


def new_bucket(s3_client: Any) -> str:
    """A bucket of its own (``rsm-`` and a random suffix), created; its name."""
    name = f"rsm-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


def corrupt_byte(store: Any, key: str, position: int) -> None:
    """Flip one byte of a stored object behind the store's back (bit rot)."""
    if isinstance(store, FileSystemStore):
        path = store.root / key
        data = bytearray(path.read_bytes())
        data[position] ^= 0xFF
        path.write_bytes(bytes(data))
    else:
        k = store.key_prefix + key
        data = bytearray(store.client.get_object(Bucket=store.bucket, Key=k)["Body"].read())
        data[position] ^= 0xFF
        store.client.put_object(Bucket=store.bucket, Key=k, Body=bytes(data))


def index_keys(root: Path, tp: TopicIdPartition) -> list[str]:
    """The keys of ``tp``'s copies' index objects (each written last of its copy) in the filesystem store at
    ``root``."""
    return [str(p.relative_to(root)) for p in root.glob(f"*-{tp.topic_id}/{tp.partition}/*-index")]


def index_base(key: str) -> int:
    """The first offset of the copy whose index object is ``key``."""
    return int(key.rsplit("/", 1)[1][:20])


@contextmanager
def unreadable_copy(root: Path, tp: TopicIdPartition, base: int) -> Iterator[None]:
    """The index object of ``tp``'s copy beginning at ``base`` in the filesystem store at ``root`` with one byte
    flipped (its time index, block list and producer snapshot cannot be read:
    :class:`rsm.errors.CorruptRemoteObjectError`), then flipped back."""
    (key,) = [k for k in index_keys(root, tp) if index_base(k) == base]
    store = FileSystemStore(root)
    at = (store.root / key).stat().st_size // 2
    corrupt_byte(store, key, at)
    try:
        yield
    finally:
        corrupt_byte(store, key, at)
