"""Crafted record batches and partition directories, for tests without a broker: the one batch builder.

The batches are Kafka v2 record batches (CRC-32C over the bytes after the CRC field), records uncompressed, no
headers. What they prove is proven against the real broker's own segments too (tests/rsm/log, tests/rlm).
"""

from __future__ import annotations

import base64
import random
import struct
import uuid
from pathlib import Path

from rsm.api import LogSegmentData
from rsm.log.batch import batch_crc

__all__ = ["BASE_TS", "CONTROL", "TXN", "abort_marker", "batch", "one_per_batch", "record", "synthetic_segment",
           "write_partition"]

TXN = 0x10
CONTROL = 0x20
BASE_TS = 1_700_000_000_000


def _zigzag(v: int) -> bytes:
    v = (v << 1) ^ (v >> 63)
    out = bytearray()
    while True:
        b, v = v & 0x7F, v >> 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def record(offset_delta: int, key: bytes | None, value: bytes | None) -> bytes:
    body = b"\x00" + _zigzag(0) + _zigzag(offset_delta)
    body += _zigzag(-1) if key is None else _zigzag(len(key)) + key
    body += _zigzag(-1) if value is None else _zigzag(len(value)) + value
    body += _zigzag(0)  # no headers
    return _zigzag(len(body)) + body


def batch(base: int, values: list[bytes], *, epoch: int = 0, ts: int = BASE_TS, attrs: int = 0,
          producer_id: int = -1, records: bytes | None = None) -> bytes:
    n = len(values)
    recs = records if records is not None else b"".join(record(i, None, v) for i, v in enumerate(values))
    tail = struct.pack(">hiqqqhii", attrs, n - 1, ts, ts, producer_id, 0 if producer_id >= 0 else -1, -1, n)
    after_length = struct.pack(">ibI", epoch, 2, 0) + tail + recs
    data = bytearray(struct.pack(">qi", base, len(after_length)) + after_length)
    data[17:21] = struct.pack(">I", batch_crc(data))
    return bytes(data)


def abort_marker(base: int, producer_id: int, ts: int = BASE_TS) -> bytes:
    key, value = struct.pack(">hh", 0, 0), struct.pack(">hi", 0, 0)  # version 0, type ABORT; coordinator epoch
    return batch(base, [value], ts=ts, attrs=TXN | CONTROL, producer_id=producer_id,
                 records=record(0, key, value))


def one_per_batch(base: int, n: int, tag: bytes, epoch: int = 0) -> list[bytes]:
    return [batch(base + i, [b"%s-%d" % (tag, base + i)], epoch=epoch) for i in range(n)]


def synthetic_segment(tmp: Path, size_bytes: int) -> tuple[LogSegmentData, int]:
    """A ``.log`` of about ``size_bytes`` in ``tmp`` (empty offset and time indexes): one batch per offset 0, 1, 2 ...,
    each of one random 60 KiB record (seeded: the same bytes every time); its data and its last offset."""
    rng = random.Random(5)
    with open(tmp / "0.log", "wb") as f:
        offset = 0
        while offset * 61440 < size_bytes:
            f.write(batch(offset, [rng.randbytes(61440)]))
            offset += 1
    (tmp / "0.index").write_bytes(b"")
    (tmp / "0.timeindex").write_bytes(b"")
    return LogSegmentData(tmp / "0.log", tmp / "0.index", tmp / "0.timeindex", None, None, b"0\n0\n"), offset - 1


def write_partition(path: Path, topic_id: uuid.UUID, segments: dict[int, list[bytes]],
                    epochs: tuple[tuple[int, int], ...] = ((0, 0),)) -> None:
    """A partition dir as the broker leaves it: ``.log`` files (the last one is the active segment), empty
    offset/time indexes, ``partition.metadata`` and ``leader-epoch-checkpoint``."""
    path.mkdir(parents=True, exist_ok=True)
    tid = base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")
    (path / "partition.metadata").write_text(f"version: 0\ntopic_id: {tid}\n")
    lines = ["0", str(len(epochs)), *(f"{e} {o}" for e, o in epochs)]
    (path / "leader-epoch-checkpoint").write_text("\n".join(lines) + "\n")
    for base, batches in segments.items():
        (path / f"{base:020d}.log").write_bytes(b"".join(batches))
        (path / f"{base:020d}.index").write_bytes(b"")
        (path / f"{base:020d}.timeindex").write_bytes(b"")


def write_partition_metadata(pdir: Path, topic_id: uuid.UUID) -> None:
    """A partition dir's ``partition.metadata`` naming ``topic_id``, as the broker writes it: a temp file renamed over
    (a new inode)."""
    b64 = base64.urlsafe_b64encode(topic_id.bytes).rstrip(b"=").decode()
    tmp = pdir / "partition.metadata.tmp"
    tmp.write_text(f"version: 0\ntopic_id: {b64}\n")
    tmp.rename(pdir / "partition.metadata")


def partition_metadata_reads(monkeypatch) -> list[Path]:  # noqa: ANN001 - pytest's MonkeyPatch
    """From now on, every ``partition.metadata`` read through :mod:`rlm.topic_ids` (its path), in a list."""
    import rlm.topic_ids

    reads: list[Path] = []
    inner = rlm.topic_ids.read_partition_metadata

    def counted(path: Path) -> uuid.UUID:
        reads.append(path)
        return inner(path)

    monkeypatch.setattr(rlm.topic_ids, "read_partition_metadata", counted)
    return reads
