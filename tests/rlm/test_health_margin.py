"""The retention margin's time part from a rolled segment's own time index (Kafka's ``LogSegment.largestTimestamp``)."""

from __future__ import annotations

import struct
from pathlib import Path

from rlm.health import retention_margin


def test_margin_uses_the_time_index_of_a_rolled_segment(tmp_path: Path) -> None:
    pdir = tmp_path / "orders-0"
    pdir.mkdir()
    ts = 1_700_000_000_000
    (pdir / f"{0:020d}.log").write_bytes(b"x" * 100)
    (pdir / f"{0:020d}.index").write_bytes(b"")
    (pdir / f"{0:020d}.timeindex").write_bytes(struct.pack(">qi", ts - 5_000, 3) + struct.pack(">qi", ts, 7))
    (pdir / f"{10:020d}.log").write_bytes(b"y" * 50)  # the active segment
    m = retention_margin(pdir, -1, [], retention_ms=60_000, retention_bytes=None, now_ms=ts + 20_000)
    assert (m.seconds, m.segment) == (40.0, 0)
