"""``bench/bench_proxy_fetch.py`` runs end to end on today's code, both paths, at a size of seconds.

The bench builds the proxy in one process around stand-ins (a tier context, an authorizer, a broker); a product change
that a stand-in does not follow breaks the bench without failing any other test (c766879: the proxy's host check read
``authorizer.cache``, which the stand-in lacked, and every connection was closed; found in session 24 only when the
bench was next run). Its client reads the partition from offset 0 to its end and fails on an answer that errs or does
not move the offset on, so a run that ends well is a read of every record through the proxy."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_proxy_fetch.py"


@pytest.mark.parametrize("path", ["history", "live"])
def test_the_bench_reads_the_partition_through_the_proxy(path: str) -> None:
    out = subprocess.run([sys.executable, str(BENCH), "--mib", "8", "--reads", "1", "--rounds", "1",
                          *(["--live"] if path == "live" else [])],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    fetches = re.search(r"this: [\d.]+ CPU s/GiB \(\d+ us a Fetch, (\d+) Fetches", out.stdout + out.stderr)
    assert fetches is not None and int(fetches.group(1)) > 1, out.stdout[-2000:]
