"""rlm.coalesce: concurrent lookups share requests, and every answer comes from a request sent after the question."""

from __future__ import annotations

import threading
import time

import pytest

from rlm.coalesce import Coalescer


class Remote:
    """A lookup that takes a while; its answer for a key is the request's sequence number."""

    def __init__(self, delay_s: float = 0.05) -> None:
        self.delay_s = delay_s
        self.requests: list[tuple[float, set[int]]] = []  # (sent at, keys)
        self.lock = threading.Lock()

    def __call__(self, keys: set[int]) -> dict[int, tuple[int, float]]:
        with self.lock:
            seq = len(self.requests)
            sent = time.monotonic()
            self.requests.append((sent, set(keys)))
        time.sleep(self.delay_s)
        return {k: (seq, sent) for k in keys if k >= 0}  # negative keys: no answer


def test_concurrent_callers_share_requests_and_answers_are_fresh() -> None:
    remote = Remote()
    c = Coalescer(remote)
    answers: dict[int, tuple[float, tuple[int, float]]] = {}
    start = threading.Barrier(16)

    def ask(k: int) -> None:
        start.wait()
        asked = time.monotonic()
        got = c.get([k, -1])
        assert set(got) == {k}
        answers[k] = (asked, got[k])

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(answers) == 16
    assert c.rounds == len(remote.requests) < 16  # shared: 16 questions, fewer requests (2 or 3 here)
    assert sorted(k for _sent, keys in remote.requests for k in keys if k >= 0) == list(range(16))
    for k, (asked, (seq, sent)) in answers.items():
        assert k in remote.requests[seq][1]
        assert sent >= asked, f"key {k}: answered by a request sent before it asked"


def test_one_caller_alone_gets_its_own_request() -> None:
    remote = Remote(0)
    c = Coalescer(remote)
    assert c.get([1]) == {1: (0, remote.requests[0][0])}
    assert c.get([2, 3]) == {2: (1, remote.requests[1][0]), 3: (1, remote.requests[1][0])}
    assert [keys for _t, keys in remote.requests] == [{1}, {2, 3}]


def test_an_error_reaches_every_caller_of_its_round_and_the_next_round_works() -> None:
    calls = []

    def fetch(keys: set[int]) -> dict[int, int]:
        calls.append(keys)
        if len(calls) == 1:
            raise RuntimeError("broker unreachable")
        return {k: k for k in keys}

    c = Coalescer(fetch)
    with pytest.raises(RuntimeError, match="unreachable"):
        c.get([1])
    assert c.get([1]) == {1: 1}
