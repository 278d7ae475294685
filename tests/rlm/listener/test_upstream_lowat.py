"""The proxy's reader of its broker's answers (:class:`rlm.listener.upstream.brokers._Answers`) awaits the rest of
a large answer in the kernel (SO_RCVLOWAT): answers arrive whole and in order whatever the chunks they come in, the
low-water mark is back at one byte between answers (a small answer is never held back), and a broker that closes
in the middle of an answer is seen at once, not when the awaited bytes would have come."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time

from rlm.listener.upstream.brokers import LOWAT_MAX_BYTES, UpstreamError, _Answers


def _broker(frames: list[bytes], chunk: int, *, close_after: int | None = None) -> tuple[socket.socket, int]:
    """A listening socket whose one connection gets ``frames`` (size-prefixed) ``chunk`` bytes at a time, with a
    pause between chunks; ``close_after`` bytes in all, then it closes."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        data = b"".join(struct.pack(">i", len(f)) + f for f in frames)
        if close_after is not None:
            data = data[:close_after]
        with conn:
            for i in range(0, len(data), chunk):
                conn.sendall(data[i:i + chunk])
                time.sleep(0.002)
            if close_after is None:
                time.sleep(1)

    threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


async def _answers(port: int, n: int) -> tuple[list[bytes], _Answers]:
    loop = asyncio.get_running_loop()
    _t, answers = await loop.create_connection(lambda: _Answers(64 << 20, low_water=True), "127.0.0.1", port)
    got = []
    while len(got) < n:
        a = answers.answer()
        if isinstance(a, bytearray):
            got.append(bytes(a[4:]))
        else:
            await asyncio.wait_for(a, 10)
    return got, answers


def test_large_answers_arrive_whole_and_in_order_and_the_low_water_mark_is_reset_between_them() -> None:
    frames = [bytes([i]) * size for i, size in enumerate((9 * 2**20, 10, LOWAT_MAX_BYTES + 5, 70_000, 4))]
    srv, port = _broker(frames, 100_000)
    with srv:
        got, answers = asyncio.run(_answers(port, len(frames)))
    assert got == frames
    assert answers._lowat == 1


def test_a_broker_closing_in_the_middle_of_an_awaited_answer_is_seen_at_once() -> None:
    frames = [b"x" * (2 * 2**20)]
    srv, port = _broker(frames, 100_000, close_after=300_000)

    async def run() -> float:
        loop = asyncio.get_running_loop()
        _t, answers = await loop.create_connection(lambda: _Answers(64 << 20, low_water=True), "127.0.0.1", port)
        start = loop.time()
        waited = answers.answer()
        assert not isinstance(waited, bytearray)
        await asyncio.wait_for(waited, 10)
        try:
            answers.answer()
        except UpstreamError:
            return loop.time() - start
        raise AssertionError("an answer from a broker that closed mid-answer")

    with srv:
        assert asyncio.run(run()) < 5
