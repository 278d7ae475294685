"""Issue 21: a copy can be cancelled (``cancel`` of copy_log_segment_data / copy_log_range): the sidecar cancels the
copy in flight of a partition it no longer leads (leadership moved, topic deleted), instead of letting a throttled
copy run for minutes to its end only to be fenced. A cancelled copy stops at its next block, leaves nothing in the
store and raises CopyCancelledError; the throttle gives back what the cancelled copy did not wait for."""

from __future__ import annotations

import threading

import pytest

from rsm.errors import CopyCancelledError
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.throttle import Throttle

pytestmark = [pytest.mark.kafka]


def test_a_cancelled_copy_stops_mid_copy_and_leaves_nothing(store, broker_segments) -> None:
    seg = max(broker_segments, key=lambda s: s.data.log_path.stat().st_size)
    md = seg.metadata()
    # 4 KiB blocks at 4 KiB/s: the copy would take as many seconds as the segment has blocks
    rsm = RemoteStorageManager(RsmConfig(block_size_bytes=4096, copy_rate_bytes_per_second=4096), store)
    assert seg.data.log_path.stat().st_size > 8 * 4096
    cancel = threading.Event()
    timer = threading.Timer(1.5, cancel.set)
    timer.start()
    try:
        with pytest.raises(CopyCancelledError, match="cancelled: nothing uploaded"):
            rsm.copy_log_segment_data(md, seg.data, cancel=cancel)
    finally:
        timer.cancel()
    assert list(store.list(rsm.keys(md).prefix)) == []
    # set before the copy starts: nothing is written at all; an unset event changes nothing
    with pytest.raises(CopyCancelledError):
        rsm.copy_log_segment_data(md, seg.data, cancel=cancel)
    assert list(store.list(rsm.keys(md).prefix)) == []
    rsm.copy_throttle.set_rate(None)
    rsm.copy_log_segment_data(md, seg.data, cancel=threading.Event())
    with rsm.fetch_log_segment(md, 0) as f:
        assert f.read() == seg.data.log_path.read_bytes()


def test_a_cancelled_wait_gives_the_bytes_back() -> None:
    slept: list[float] = []
    now = [0.0]
    throttle = Throttle("test-cancel", 1000, clock=lambda: now[0], sleep=slept.append)  # a full bucket: 1000 bytes
    cancel = threading.Event()
    cancel.set()
    throttle.acquire(5000, cancel)  # owes 4 s: cancelled at once
    assert throttle.acquire(500) == 0.0 and slept == []  # nothing owed by the cancelled copy
    assert throttle.acquire(1500) == pytest.approx(1.0) and slept == [pytest.approx(1.0)]
