"""A record batch of hundreds of MiB, written and checked without holding it, and peak memory of a child process.

Issue 26 (PDP-43): a batch larger than a block is copied and read back in bounded memory. The batch here is one
uncompressed record whose value is :func:`value_chunks` (a deterministic pattern, regenerated to check a read
byte-exact); the segment around it holds small batches (:mod:`tests.support.batches`). The memory is measured in
a child process (:func:`run_measured`): the peak resident set above the process's idle size, from ``/proc``
(``VmHWM`` after resetting it through ``/proc/self/clear_refs``), so the test's own buffers do not count.
"""

from __future__ import annotations

import base64
import hashlib
import json
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from aiokafka.record.default_records import _DefaultRecordBatchBuilderPy as _Builder

from rsm.log._crc32c import buffer_address, crc32c_at
from tests.support.batches import BASE_TS, _zigzag, one_per_batch

__all__ = ["CHUNK", "RECORDS", "big_batch_segment", "cat_lines", "chunked", "make_batch", "peak_above_idle",
           "peak_kib", "reset_peak", "run_measured", "value_chunks"]

CHUNK = 1 << 20
MiB = 1 << 20


def value_chunks(size: int) -> Iterator[bytes]:
    """The big record's value, ``CHUNK`` bytes at a time: chunk ``k`` is its index, then a fixed pattern (so a
    misplaced chunk is seen)."""
    pattern = bytes(range(256)) * (CHUNK // 256)
    for k in range(0, size, CHUNK):
        n = min(CHUNK, size - k)
        yield (struct.pack(">q", k) + pattern)[:n]


def _write_big_batch(f, base_offset: int, value_size: int) -> int:
    """Append a v2 batch of one record (no key, ``value_size`` bytes of :func:`value_chunks`) to ``f``; its CRC
    is computed as it is written. Returns the batch's size."""
    body_head = b"\x00" + _zigzag(0) + _zigzag(0) + _zigzag(-1) + _zigzag(value_size)
    body_len = len(body_head) + value_size + 1  # + the header count (0)
    record_head = _zigzag(body_len) + body_head
    tail = struct.pack(">hiqqqhii", 0, 0, BASE_TS, BASE_TS, -1, -1, -1, 1)
    batch_length = 4 + 1 + 4 + len(tail) + len(record_head) + value_size + 1
    start = f.tell()
    f.write(struct.pack(">qiibI", base_offset, batch_length, 0, 2, 0))
    crc = 0
    for part in (tail, record_head, *value_chunks(value_size), b"\x00"):
        buf = bytearray(part)
        crc = crc32c_at(buf, buffer_address(buf), 0, len(buf), crc)
        f.write(buf)
    end = f.tell()
    f.seek(start + 17)
    f.write(struct.pack(">I", crc))
    f.seek(end)
    return end - start


def big_batch_segment(path: Path, value_size: int, *, small_before: int = 10, small_after: int = 10) -> dict:
    """A ``.log`` at ``path``: ``small_before`` one-record batches from offset 0, the big batch, then
    ``small_after`` more. Returns its offsets: ``{"big_offset", "end_offset", "big_size"}``."""
    with open(path, "wb") as f:
        for b in one_per_batch(0, small_before, b"before"):
            f.write(b)
        size = _write_big_batch(f, small_before, value_size)
        for b in one_per_batch(small_before + 1, small_after, b"after"):
            f.write(b)
    return {"big_offset": small_before, "end_offset": small_before + small_after, "big_size": size}


def _status_kib(field: str, pid: int | str = "self") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise LookupError(field)


def reset_peak(pid: int | str = "self") -> int:
    """Reset process ``pid``'s peak RSS (``VmHWM``) to its current RSS; returns that RSS in KiB (the idle size)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")
    return _status_kib("VmRSS", pid)


def peak_above_idle(idle_kib: int, pid: int | str = "self") -> int:
    """Bytes process ``pid``'s peak RSS reached above ``idle_kib`` since :func:`reset_peak`."""
    return (_status_kib("VmHWM", pid) - idle_kib) * 1024


def peak_kib(pid: int | str = "self") -> int:
    """Process ``pid``'s peak RSS (``VmHWM``), KiB."""
    return _status_kib("VmHWM", pid)


def run_measured(code: str, *, timeout: float = 600) -> dict:
    """Run ``code`` in a child Python (this checkout on its path); it prints one JSON object as its last line,
    which is returned. The code measures itself with :func:`reset_peak` / :func:`peak_above_idle`."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise AssertionError(f"child failed ({out.returncode}):\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


RECORDS = [
    (b"k0", b"small", [("h", b"x"), ("null", None)]),
    (None, None, []),  # a tombstone without a key
    (b"big", bytes(range(256)) * 40, [("after", b"the value")]),  # 10 KiB: streamed at inline_bytes=1000
    (b"", "é€😀 text split across chunks ".encode() * 50, []),
    (b"k4", b"", [("", b"")]),
]
"""Records of every shape (keys, tombstones, headers, multi-byte UTF-8) for :func:`make_batch`."""


def make_batch(records: list, *, compression: int = 0, base_offset: int = 100) -> bytes:
    """A v2 batch (aiokafka's builder) of ``(key, value, headers)`` records, offsets from ``base_offset``."""
    b = _Builder(magic=2, compression_type=compression, is_transactional=0, producer_id=-1, producer_epoch=-1,
                 base_sequence=-1, batch_size=1 << 30)
    for i, (key, value, headers) in enumerate(records):
        b.append(i, 1_700_000_000_000 + i, key, value, headers)
    raw = bytearray(b.build())
    raw[0:8] = base_offset.to_bytes(8, "big")  # not covered by the CRC
    return bytes(raw)


def chunked(raw: bytes, n: int) -> Iterator[memoryview]:
    """``raw`` in views of ``n`` bytes (the last shorter)."""
    return (memoryview(raw)[i:i + n] for i in range(0, len(raw), n))


def cat_lines(path: Path) -> Iterator[tuple[dict, str, int]]:
    """The lines ``rlm cat`` wrote to ``path``, each as ``(its object with "value" set to "", sha256 hex of the
    value's bytes, their length)``, read in bounded memory (a value of hundreds of MiB is decoded as it is read).
    A null value is length -1."""
    marker = b'"value": '
    with open(path, "rb") as f:
        while True:
            head = f.readline(1 << 20)
            if not head:
                return
            if head.endswith(b"\n"):
                obj = json.loads(head)
                value = obj["value"]
                obj["value"] = ""
                data = b"" if value is None else base64.b64decode(value)
                yield obj, hashlib.sha256(data).hexdigest(), -1 if value is None else len(data)
                continue
            i = head.index(marker) + len(marker) + 1  # past the value's opening quote
            prefix, rest = head[:i], head[i:]
            digest, n, carry = hashlib.sha256(), 0, b""
            while True:
                j = rest.find(b'"')
                data = carry + (rest if j < 0 else rest[:j])
                cut = len(data) if j >= 0 else len(data) - len(data) % 4
                decoded = base64.b64decode(data[:cut])
                digest.update(decoded)
                n += len(decoded)
                carry = data[cut:]
                if j >= 0:
                    tail = rest[j:] + (b"" if rest.endswith(b"\n") else f.readline())
                    break
                rest = f.readline(1 << 20)
            obj = json.loads(prefix + tail)
            yield obj, digest.hexdigest(), n
