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


def test_while_rounds_follow_each_other_the_sender_lingers_and_callers_coming_meanwhile_join_its_round() -> None:
    """Callers 5 ms apart against a remote that answers at once: alone, each sends a round of its own; once a round was
    sent less than ``busy_s`` ago, the next round's sender first waits ``linger_s`` (here 200 ms), and the seven callers
    after it join that round (a caller that does not ask to linger is sent at once). Every answer still comes from a
    request sent after its caller asked."""
    remote = Remote(0)
    c = Coalescer(remote, linger_s=0.2, busy_s=10)
    c.get([100], linger=True)  # a round sent: rounds now follow each other (busy_s)
    assert c.lingered == 0  # the first one, alone, did not wait
    c.get([101])  # one that does not ask to linger: sent at once
    assert c.lingered == 0 and len(remote.requests) == 2
    answers: dict[int, tuple[float, tuple[int, float]]] = {}

    def ask(k: int) -> None:
        asked = time.monotonic()
        answers[k] = (asked, c.get([k], linger=True)[k])

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
        time.sleep(0.005)
    for t in threads:
        t.join(10)
    assert c.rounds == len(remote.requests) == 3, remote.requests  # without the linger: 10
    assert c.lingered == 1
    for k, (asked, (seq, sent)) in answers.items():
        assert k in remote.requests[seq][1]
        assert sent >= asked, f"key {k}: answered by a request sent before it asked"
