"""Verify a remote segment copy against its index object.

Checks, in object order: the index object (magic, length, CRC-32C), each data object's size, every block
(magic, header and block lengths, first entry id, ledger id), every entry (id sequence, length, the batch's
own length field, magic and CRC-32C, offsets within the block's range, original ``.log`` byte counts), and
the CRC-32C of each of Kafka's indexes stored with it. An encrypted copy's parts are authenticated and opened
first (:mod:`rsm.format.crypto`), then checked the same way. Stops at the first problem and reports its key, byte
position and Kafka offset. Streams: one ranged GET per data object, one batch in memory at a time.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence

from rsm.api import IndexType, LargeBatch, VerifyReport
from rsm.encryption import KeyProvider
from rsm.errors import CorruptRemoteObjectError
from rsm.format.crypto import decode_copy_index
from rsm.format.index import INDEX_KEY_SUFFIX
from rsm.format.keys import SegmentKeys
from rsm.format.reader import SegmentReader
from rsm.store.base import Store

__all__ = ["main", "verify_prefix", "verify_segment"]


def verify_segment(store: Store, keys: SegmentKeys, *, key_provider: KeyProvider | None = None,
                   require_sealed: bool = False) -> VerifyReport:
    """Verify one segment copy; raises :class:`RemoteResourceNotFoundError` when its index object is absent.

    An encrypted copy is opened with ``key_provider`` (every part authenticated, then checked as a plain one);
    without the key id it was written under, :class:`~rsm.encryption.KeyNotConfiguredError` naming the key id.
    With ``require_sealed`` a plain copy is reported bad."""
    blocks = entries = checked = 0

    def bad(err: CorruptRemoteObjectError) -> VerifyReport:
        return VerifyReport(keys.index, False, blocks, entries, checked, err.key, err.position, err.kafka_offset,
                            str(err))

    try:
        raw = store.get_bytes(keys.index)
        index = decode_copy_index(raw, key=keys.index, key_base=keys.base, provider=key_provider,
                                  require_sealed=require_sealed)
        checked += len(raw)
        for ledger in index.ledgers:
            for n, expected in enumerate(ledger.metadata.data_object_lengths):
                actual = store.head(keys.data(n))
                if actual is None:
                    raise CorruptRemoteObjectError(f"data object of {keys.index} is missing", key=keys.data(n),
                                                   position=0)
                if actual != expected:
                    raise CorruptRemoteObjectError(f"data object has {actual} bytes, the index says {expected}",
                                                   key=keys.data(n), position=min(actual, expected))
            reader = SegmentReader(store, keys, ledger)
            last_block = -1
            for e in reader.iter_entries(large=True):
                if e.block.part_id != last_block:
                    blocks += 1 + max(0, e.block.fragment_count - 1)  # a batch in fragments: all its blocks
                    last_block = e.block.part_id
                entries += 1
                if isinstance(e.data, LargeBatch):
                    for _ in e.data.chunks():  # each fragment checked, then the batch's CRC-32C across them
                        pass
                checked += len(e.data)
            if entries != ledger.metadata.entry_count:
                raise CorruptRemoteObjectError(
                    f"{entries} entries in the blocks, the ledger metadata says {ledger.metadata.entry_count}",
                    key=keys.index, position=0)
            for section in ledger.metadata.sections:
                with reader.open_section(IndexType(section.index_type)) as f:
                    checked += len(f.read())
    except CorruptRemoteObjectError as err:
        return bad(err)
    return VerifyReport(keys.index, True, blocks, entries, checked)


def verify_prefix(store: Store, prefix: str, *, key_provider: KeyProvider | None = None) -> Iterator[VerifyReport]:
    """Verify every segment copy whose index object key starts with ``prefix`` (e.g. a partition's prefix)."""
    for info in store.list(prefix):
        if info.key.endswith(INDEX_KEY_SUFFIX):
            yield verify_segment(store, SegmentKeys(info.key[:-len(INDEX_KEY_SUFFIX)]), key_provider=key_provider)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m rsm.verify (--root DIR | --bucket B [--endpoint-url URL]) [--prefix P]``; exit 1 if any is bad."""
    ap = argparse.ArgumentParser(prog="python -m rsm.verify", description="Verify remote segment copies.")
    ap.add_argument("--root", help="filesystem store root")
    ap.add_argument("--bucket", help="S3 bucket")
    ap.add_argument("--endpoint-url", default=None)
    ap.add_argument("--key-prefix", default="", help="S3 store key prefix")
    ap.add_argument("--prefix", default="", help="verify only copies under this key prefix")
    ap.add_argument("--key-file", default=None, help="encryption key file (JSON: key id -> base64 key)")
    ap.add_argument("--key-env", default=None, help="environment variable holding the encryption keys")
    args = ap.parse_args(argv)
    if bool(args.root) == bool(args.bucket):
        ap.error("give exactly one of --root and --bucket")
    if args.root:
        from rsm.store.fs import FileSystemStore

        store: Store = FileSystemStore(args.root)
    else:
        from rsm.store.s3 import S3Store

        store = S3Store(args.bucket, endpoint_url=args.endpoint_url, key_prefix=args.key_prefix)
    from rsm.encryption import EncryptionConfig

    provider = EncryptionConfig(key_file=args.key_file, key_env=args.key_env).key_provider()
    bad = 0
    for report in verify_prefix(store, args.prefix, key_provider=provider):
        print(report)
        bad += not report.ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
