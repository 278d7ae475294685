"""The proxy's upstream connection, its parts alone (the proxy tests run them against real brokers): it reads each
broker answer into one buffer of its own, size prefix included (:class:`rlm.listener.upstream.brokers._Answers`,
fed here as the event loop's transport feeds it: get_buffer, then the bytes read into it): answers split across
reads anywhere, several in one read, a size out of bounds ending the connection; and the bounds it learned
(:class:`rlm.listener.upstream.bounds.KnownBounds`)."""

from __future__ import annotations

import asyncio
import struct
import uuid

import pytest

from rlm.listener.tier.boundary import BrokerBounds
from rlm.listener.upstream.bounds import KnownBounds
from rlm.listener.upstream.brokers import SCRATCH_BYTES, UpstreamError, _Answers
from rlmm.api import TopicIdPartition


def _frames(sizes: list[int]) -> list[bytes]:
    return [struct.pack(">i", n) + bytes([i % 251]) * n for i, n in enumerate(sizes)]


def _feed(answers: _Answers, data: bytes, chunk: int) -> None:
    pos = 0
    while pos < len(data):
        buf = answers.get_buffer(-1)
        n = min(chunk, len(buf), len(data) - pos)
        buf[:n] = data[pos:pos + n]
        answers.buffer_updated(n)
        pos += n


@pytest.mark.parametrize("chunk", [1, 3, 4, 5, 1000, SCRATCH_BYTES, 10**7])
def test_answers_come_whole_and_in_order_however_the_reads_split_them(chunk: int) -> None:
    async def run() -> None:
        frames = _frames([4, 5, 100, SCRATCH_BYTES - 4, SCRATCH_BYTES, 3 * SCRATCH_BYTES + 7, 6, 4])
        answers = _Answers(max_response_bytes=1 << 22)
        _feed(answers, b"".join(frames), chunk)
        got = []
        while True:
            a = answers.answer()
            if not isinstance(a, bytearray):
                break
            got.append(bytes(a))
        assert got == frames

    asyncio.run(run())


def test_an_answer_of_a_size_out_of_bounds_ends_the_connection() -> None:
    async def run() -> None:
        answers = _Answers(max_response_bytes=100)
        _feed(answers, struct.pack(">i", 101), 4)
        with pytest.raises(UpstreamError, match="outside 4..100"):
            answers.answer()

    asyncio.run(run())


def test_known_bounds_keep_the_largest_log_start_per_topic_id_and_go_stale() -> None:
    """:class:`rlm.listener.upstream.bounds.KnownBounds`: an offset below a fresh known log start gets the bounds; a
    log start answered lower later (a new leader's) does not lower it; a last stable offset is given for
    read_committed only once asked (a read_uncommitted ListOffsets keeps the one known); a topic created again
    (another id) knows nothing; bounds older than ``fresh_s`` are not used."""
    now = [0.0]
    known = KnownBounds(fresh_s=1.0, clock=lambda: now[0])
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    known.learn(tp, BrokerBounds(100, 200, 200), stable=False)
    assert known.below(tp, 99) == BrokerBounds(100, 200, 200)
    assert known.below(tp, 99, stable=True) is None
    assert known.below(tp, 100) is None and known.below(tp, -1) is None
    known.learn(tp, BrokerBounds(100, 200, 190), stable=True)
    assert known.below(tp, 99, stable=True) == BrokerBounds(100, 200, 190)
    known.learn(tp, BrokerBounds(50, 210, 210), stable=False)
    assert known.below(tp, 99, stable=True) == BrokerBounds(100, 210, 190)
    assert known.below(TopicIdPartition(uuid.uuid4(), "t", 0), 10) is None
    now[0] = 1.5
    assert known.below(tp, 10) is None


def test_a_large_answer_given_back_serves_the_next_and_is_written_over_whole() -> None:
    """:meth:`_Answers.recycle`: an answer sent serves as the next large answer's buffer, sized to it (smaller,
    larger), every byte of the old answer written over; a buffer still viewed (or a small answer's) is not reused."""
    async def run() -> None:
        answers = _Answers(max_response_bytes=1 << 22)
        frames = _frames([3 * SCRATCH_BYTES + 7, 2 * SCRATCH_BYTES, 5 * SCRATCH_BYTES + 1, 2 * SCRATCH_BYTES + 3])
        got = []
        for frame in frames:
            _feed(answers, frame, 5000)
            a = answers.answer()
            assert isinstance(a, bytearray) and a == frame  # each byte its own answer's (the fill differs)
            got.append(a)
            answers.recycle(a)
        assert got[1] is got[0] and got[2] is got[0] and got[3] is got[0]
        view = memoryview(got[3])  # held: the buffer may not change size under it
        answers.recycle(got[3])
        _feed(answers, frames[1], 5000)
        again = answers.answer()
        assert again is not got[3] and again == frames[1]
        view.release()
        answers.recycle(again)
        _feed(answers, _frames([10])[0], 3)  # a small answer: a buffer of its own, the spare kept
        small = answers.answer()
        assert isinstance(small, bytearray) and small is not again
        _feed(answers, frames[0], 5000)
        assert answers.answer() is again

    asyncio.run(run())
