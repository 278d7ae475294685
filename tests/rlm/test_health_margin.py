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


def test_the_margin_cache_answers_as_a_fresh_listing_through_appends_rolls_and_deletes(tmp_path: Path) -> None:
    """The gauges job keeps each directory's listing while its mtime is unchanged (issue 26: listing 2,000 directories
    every 5 s was a third of the idle CPU); appends to the active segment, a roll and retention's delete still show."""
    import os
    import time

    from rlm.health import MarginCache

    pdir = tmp_path / "orders-0"
    pdir.mkdir()
    ts = 1_700_000_000_000
    (pdir / f"{0:020d}.log").write_bytes(b"x" * 100)
    (pdir / f"{0:020d}.timeindex").write_bytes(struct.pack(">qi", ts, 7))
    active = pdir / f"{10:020d}.log"
    active.write_bytes(b"y" * 50)
    (pdir / f"{10:020d}.timeindex").write_bytes(b"")  # preallocated (here: empty) until it rolls
    cache = MarginCache()
    kw = {"retention_ms": 60_000, "retention_bytes": 1_000, "now_ms": ts + 20_000}

    def settle() -> None:  # as a directory unchanged for a while (a listing is kept only then)
        old = time.time() - 10
        os.utime(pdir, (old, old))

    def same() -> None:
        for tiered in (-1, 9):
            assert cache.margin(pdir, tiered, [], **kw) == retention_margin(pdir, tiered, [], **kw)

    settle()
    same()
    assert cache.margin(pdir, -1, [], **kw).bytes == 1_000 + 100 - 150
    with open(active, "ab") as f:  # an append: no directory change
        f.write(b"y" * 300)
    same()
    assert cache.margin(pdir, -1, [], **kw).bytes == 1_000 + 100 - 450
    assert cache.margin(pdir, 9, [], **kw).segment == 10  # the active segment at risk once the rolled one is tiered
    (pdir / f"{20:020d}.log").write_bytes(b"z")  # a roll
    same()
    settle()
    same()
    assert cache.margin(pdir, 9, [], **kw).segment == 10  # segment 10 is rolled now: its time index (empty: mtime)
    (pdir / f"{0:020d}.log").rename(pdir / f"{0:020d}.log.deleted")  # retention
    settle()
    same()
    cache.keep_only([])
    same()
