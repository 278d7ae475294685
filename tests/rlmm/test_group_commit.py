"""Group commit of metadata writes (issue 26): writers that come while a write is in flight go out together in the
next one (:mod:`rlmm.group_commit`), each getting its own records' results. The class alone (deterministic: the first
write is held until the others queued), then the topic-based manager on the real broker, whose copy workers write
at the same moments."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections.abc import Callable, Sequence

import pytest

from rlmm.api import RemoteLogSegmentState, TopicIdPartition, UnknownSegmentError
from rlmm.group_commit import GroupCommit
from tests.rlmm.helpers import segment, update

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


def wait_for(cond: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def held_first_write(group_of: Callable[[Callable], GroupCommit]) -> tuple[GroupCommit, list, threading.Event]:
    """A group whose first write blocks until the returned event is set; every write's records are logged."""
    calls: list[list] = []
    release = threading.Event()

    def write(items: Sequence) -> list:
        calls.append(list(items))
        if len(calls) == 1:
            release.wait(30)
        if "boom" in items:
            raise ValueError("the write failed")
        return [f"ok:{x}" for x in items]

    return group_of(write), calls, release


def test_a_writer_alone_writes_at_once() -> None:
    group, calls, release = held_first_write(GroupCommit)
    release.set()
    assert group.write(["a", "b"]) == ["ok:a", "ok:b"]
    assert group.write(["c"]) == ["ok:c"]
    assert calls == [["a", "b"], ["c"]] and group.calls == 2


def test_writers_that_come_during_a_write_go_out_together_with_their_own_results() -> None:
    group, calls, release = held_first_write(GroupCommit)
    got: dict[str, list] = {}

    def writer(name: str, items: list) -> None:
        got[name] = group.write(items)

    first = threading.Thread(target=writer, args=("first", ["f"]))
    first.start()
    wait_for(lambda: calls, "the first write")
    others = [threading.Thread(target=writer, args=(f"w{k}", [f"w{k}.0", f"w{k}.1"])) for k in range(3)]
    for t in others:
        t.start()
    wait_for(lambda: group.waiting == 3, "three writers queued")
    release.set()
    for t in [first, *others]:
        t.join(30)
    assert group.calls == 2  # one per writer before: 4
    assert calls[0] == ["f"] and sorted(calls[1]) == sorted(f"w{k}.{i}" for k in range(3) for i in range(2))
    assert got == {"first": ["ok:f"], **{f"w{k}": [f"ok:w{k}.0", f"ok:w{k}.1"] for k in range(3)}}


def test_a_failed_write_is_raised_to_each_of_its_writers_and_the_next_writes() -> None:
    group, _calls, release = held_first_write(GroupCommit)
    errors: list[BaseException] = []

    def writer(items: list) -> None:
        try:
            group.write(items)
        except ValueError as err:
            errors.append(err)

    first = threading.Thread(target=writer, args=(["x"],))
    first.start()
    wait_for(lambda: group.calls == 1, "the first write")
    failing = [threading.Thread(target=writer, args=(items,)) for items in (["boom"], ["y"])]
    for t in failing:
        t.start()
    wait_for(lambda: group.waiting == 2, "two writers queued")
    release.set()
    for t in [first, *failing]:
        t.join(30)
    assert len(errors) == 2  # both writers of the failed call; the first one's write had succeeded
    assert group.write(["z"]) == ["ok:z"]


def test_a_writer_interrupted_while_queued_leaves_the_queue_and_the_writers_behind_it_still_write() -> None:
    """The writers queued during a write are woken one by one (the first queued leads the next write): one that
    stops waiting (KeyboardInterrupt in the main thread) must not be handed a lead it never takes, or every writer
    queued behind it waits for good."""
    group, calls, release = held_first_write(GroupCommit)
    got: dict[str, list] = {}
    first = threading.Thread(target=lambda: got.setdefault("first", group.write(["f"])), daemon=True)
    first.start()
    wait_for(lambda: calls, "the first write")
    behind = threading.Thread(target=lambda: got.setdefault("behind", group.write(["b"])), daemon=True)

    def interrupt_main() -> None:
        wait_for(lambda: group.waiting == 1, "the main thread queued")
        behind.start()
        wait_for(lambda: group.waiting == 2, "a writer queued behind it")
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    interrupter = threading.Thread(target=interrupt_main)
    interrupter.start()
    with pytest.raises(KeyboardInterrupt):
        group.write(["main"])  # queued behind the held write, interrupted there
    interrupter.join(30)
    assert group.waiting == 1  # the interrupted writer left the queue
    release.set()
    first.join(30)
    behind.join(30)
    assert not behind.is_alive(), "the writer behind the interrupted one was never handed the lead"
    assert got == {"first": ["ok:f"], "behind": ["ok:b"]} and calls == [["f"], ["b"]]


@pytest.mark.kafka
def test_concurrent_metadata_writes_share_one_flush_and_one_wait(rlmm_factory) -> None:
    """Four writers on four threads while a fifth's write is held at its produce: the four go out in one produce
    flush and one read-your-writes wait, each gets its own records' outcome (one refused), all read back."""
    m = rlmm_factory(f"__rlmm_group_{uuid.uuid4().hex[:8]}", "cache", serve_all=True)
    tps = [TopicIdPartition(uuid.uuid4(), "group", p) for p in range(5)]
    segs = {tp: [segment(tp, i * 10, i * 10 + 9) for i in range(3)] for tp in tps}
    sends: list[int] = []
    release = threading.Event()
    inner = m._producer.send

    def send(records, timeout_s):  # type: ignore[no-untyped-def]
        sends.append(len(records))
        if len(sends) == 1:
            release.wait(30)
        return inner(records, timeout_s)

    m._producer.send = send
    got: dict[TopicIdPartition, list] = {}

    def writer(tp: TopicIdPartition) -> None:
        records = list(segs[tp])
        if tp == tps[3]:
            records.append(update(segment(tp, 100, 109), FINISHED))  # never added: refused
        got[tp] = m.write_segment_metadata_many(records)

    threads = [threading.Thread(target=writer, args=(tp,)) for tp in tps]
    threads[0].start()
    wait_for(lambda: sends, "the first write's produce")
    for t in threads[1:]:
        t.start()
    wait_for(lambda: m._group.waiting == 4, "four writers queued")
    release.set()
    for t in threads:
        t.join(60)
    assert sends == [3, 12]  # five sends (flush, wait) before; the refused update is refused before it is sent
    assert {tp: [type(e) for e in errs] for tp, errs in got.items()} == {
        tp: [type(None)] * 3 + ([UnknownSegmentError] if tp == tps[3] else []) for tp in tps}
    for tp in tps:  # applied on return, for every writer
        assert [s.remote_log_segment_id for s in m.list_remote_log_segments(tp)] == \
            [s.remote_log_segment_id for s in segs[tp]]


def test_in_a_burst_the_leader_lingers_so_writers_coming_meanwhile_share_its_write() -> None:
    """While writes follow each other (the last one began less than busy_s ago), the next write's leader first sleeps
    linger_s, and a writer that comes during that sleep goes out in the same write (issue 26: 2,000 partitions'
    copy workers writing STARTED and FINISHED); a write after a quiet spell does not wait."""
    calls: list[list] = []
    now = [100.0]
    joined: dict[str, list] = {}
    group: GroupCommit

    def write(items: Sequence) -> list:
        calls.append(list(items))
        return [f"ok:{x}" for x in items]

    def sleep(s: float) -> None:  # the linger: another writer comes meanwhile, and queues behind the leader
        assert s == 0.002
        t = threading.Thread(target=lambda: joined.setdefault("late", group.write(["late"])))
        t.start()
        wait_for(lambda: group.waiting == 2, "the late writer to queue")
        now[0] += s

    group = GroupCommit(write, linger_s=0.002, busy_s=0.1, clock=lambda: now[0], sleep=sleep)
    assert group.write(["first"]) == ["ok:first"] and group.lingered == 0  # the first write: nothing to wait for
    now[0] += 0.05  # within busy_s of the last: a burst
    assert group.write(["second"]) == ["ok:second"] and group.lingered == 1
    wait_for(lambda: "late" in joined, "the late writer's results")
    assert joined["late"] == ["ok:late"]
    assert calls == [["first"], ["second", "late"]] and group.calls == 2
    now[0] += 1.0  # a quiet spell: the next writer writes at once
    assert group.write(["alone"]) == ["ok:alone"] and group.lingered == 1


def test_a_negative_linger_is_refused() -> None:
    with pytest.raises(ValueError, match="linger_s"):
        GroupCommit(lambda items: items, linger_s=-1)
