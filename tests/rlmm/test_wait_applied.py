"""Read-your-writes waiters are woken by the batch that applies their offset, not by every batch (issue 26).

Each copy's metadata write waits (:meth:`rlmm.topic_consumer.ConsumerTask.wait_applied`) for its own record to come
back; a ``notify_all`` per applied batch woke every such waiter on every batch of the burst, whether or not the
batch reached its offset. Against the real broker: a waiter for an offset far ahead sleeps through a run of writes
to its metadata partition (its thread's voluntary context switches, from ``/proc``, stay flat), and is still woken at
once when the partition is unassigned (``None``), and a write still reads itself back.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

import rlmm.topic_consumer
from rlmm.api import RemoteLogMetadataError, TopicIdPartition
from tests.rlmm.helpers import eventually, segment

pytestmark = [pytest.mark.kafka]

WRITES = 40


def _voluntary_switches(tid: int) -> int:
    for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    raise AssertionError(f"no voluntary_ctxt_switches for thread {tid}")


def _state(tid: int) -> str:
    """The thread's scheduler state (``S``: asleep), from ``/proc``."""
    return Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_waiter_sleeps_through_batches_below_its_offset(rlmm_factory, topic_name: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    # no periodic look unwoken during the test: every wake-up of the waiter is one the consumer thread gave it
    monkeypatch.setattr(rlmm.topic_consumer, "WAIT_POLL_S", 600.0, raising=False)
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    m = rlmm_factory(topic_name, "m", num_partitions=1, write_timeout_s=60.0)
    m.on_partition_leadership_changes([tp], [])
    m.wait_ready([tp])
    task, mp = m._consumer, m.cache.mp_of(tp)
    m.add_remote_log_segment_metadata(segment(tp, 0, 9))
    far = task._applied[mp] + 1_000_000
    tid: list[int] = []
    result: list[dict] = []

    def wait() -> None:
        tid.append(threading.get_native_id())
        result.append(task.wait_applied({mp: far}, 600.0))

    waiter = threading.Thread(target=wait, name="far-waiter", daemon=True)
    waiter.start()
    eventually(lambda: tid and _state(tid[0]) == "S")   # asleep in its wait
    before = _voluntary_switches(tid[0])
    for i in range(1, WRITES + 1):   # one batch each: every write waits to read itself back before the next
        m.add_remote_log_segment_metadata(segment(tp, 10 * i, 10 * i + 9))
    woken = _voluntary_switches(tid[0]) - before
    assert waiter.is_alive() and not result
    # the old notify_all woke it once per batch (>= WRITES); now only a stray wake-up or two may happen
    assert woken < WRITES // 4, f"the waiter for offset {far} was woken {woken} times by {WRITES} earlier batches"
    m.on_stop_partitions([tp])   # unassigned: the waiter is woken and told the partition is not consumed
    waiter.join(30)
    assert not waiter.is_alive() and result == [{mp: None}]
    assert not getattr(task, "_waiters", {}).get(mp)


def test_a_timed_out_waiter_leaves_no_entry_behind(rlmm_factory, topic_name: str) -> None:
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    m = rlmm_factory(topic_name, "m", num_partitions=1)
    m.on_partition_leadership_changes([tp], [])
    m.wait_ready([tp])
    task, mp = m._consumer, m.cache.mp_of(tp)
    applied = task._applied[mp]
    assert task.wait_applied({mp: applied + 5}, 0.3) == {mp: applied}   # nothing written: no progress, timed out
    assert not getattr(task, "_waiters", {}).get(mp)
    m.add_remote_log_segment_metadata(segment(tp, 0, 9))                  # and writes still read themselves back
    assert [s.start_offset for s in m.list_remote_log_segments(tp)] == [0]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")   # the thread's death, re-raised
def test_the_consumer_thread_dying_fails_every_waiter_at_once(rlmm_factory, topic_name: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rlmm.topic_consumer, "WAIT_POLL_S", 600.0, raising=False)   # woken, or never
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)
    m = rlmm_factory(topic_name, "m", num_partitions=1)
    m.on_partition_leadership_changes([tp], [])
    m.wait_ready([tp])
    task, mp = m._consumer, m.cache.mp_of(tp)
    far = task._applied[mp] + 1_000_000
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            task.wait_applied({mp: far}, 600.0)
        except BaseException as err:  # noqa: BLE001 - what the test looks at
            errors.append(err)

    waiters = [threading.Thread(target=wait, daemon=True) for _ in range(3)]
    for w in waiters:
        w.start()
    eventually(lambda: len(getattr(task, "_waiters", {}).get(mp, ())) == 3)

    def die() -> None:
        raise RuntimeError("injected: the consumer thread dies")

    task._on_idle = die
    for w in waiters:
        w.join(60)
    assert not any(w.is_alive() for w in waiters)
    assert len(errors) == 3 and all(isinstance(e, RemoteLogMetadataError) and "died" in str(e) for e in errors)
