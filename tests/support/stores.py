"""The tests' stores from the outside: S3 clients of the test servers (moto, s3proxy), fresh buckets, and bit rot
made behind a store's back."""

from __future__ import annotations

import uuid
from typing import Any

import boto3
from botocore.config import Config

from rsm.store.fs import FileSystemStore

__all__ = ["corrupt_byte", "new_bucket", "s3_client_for"]


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
