"""The scan of a ``.log`` holds a read buffer no larger than what it scans (issue 26: a copy's CRC scan of a 64 KiB
segment zero-filled a 1 MiB buffer, half the scan's CPU). No broker needed."""

from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

from rsm.log.batch import CHUNK_BYTES, iter_batches_with_bytes, scan_batches
from tests.support.batches import batch


def test_a_small_segment_is_scanned_through_a_buffer_of_its_size(tmp_path: Path) -> None:
    log = tmp_path / f"{0:020d}.log"
    batches = [batch(i * 8, [os.urandom(1000) for _ in range(8)]) for i in range(8)]
    log.write_bytes(b"".join(batches))
    size = log.stat().st_size
    assert size < CHUNK_BYTES // 8
    tracemalloc.start()
    try:
        headers = list(scan_batches(log))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [h.size_bytes for h in headers] == [len(b) for b in batches]
    assert peak < size + 64 * 1024, peak  # the file's size and some, not CHUNK_BYTES
    mid = headers[4].position  # from a position: what is left
    assert [bytes(d) for _h, d in iter_batches_with_bytes(log, start_position=mid)] == batches[4:]
