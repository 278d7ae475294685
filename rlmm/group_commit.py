"""Group commit: writers that arrive while a write is in flight go out together in the next one.

The topic-based manager's one write path (produce, flush until acknowledged, wait until the consumer task applied the
records: :meth:`rlmm.topic_manager.TopicBasedRemoteLogMetadataManager._write_many`) costs about the same for one record
as for a hundred: a flush, a wake-up of the consumer task, a read-your-writes wait. The sidecar's copy workers write
at the same moments (2,000 partitions rolling at once: issue 26), each its own segments' records; through
:class:`GroupCommit` a writer that finds a write in flight queues its records, and when that write ends one of the
waiting writers (the first to wake) writes every queued writer's records in one call and hands each its results.
Nothing waits on purpose: a writer alone writes at once, as before.

Each writer's records keep their order, and a writer's results are those of its own records, in order. A failure of
the whole call (an exception) is raised to every writer of that call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["GroupCommit"]

T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False)
class _Waiter(Generic[T, R]):
    items: Sequence[T]
    results: list[R] | None = None
    error: BaseException | None = None
    done: bool = False


class GroupCommit(Generic[T, R]):
    """``write(items) -> results`` (one result per item, in order), called by one writer at a time for the records
    of every writer queued meanwhile. Counters for tests: ``calls`` (writes made), ``waiting`` (writers queued)."""

    def __init__(self, write: Callable[[Sequence[T]], Sequence[R]]) -> None:
        self._write = write
        self._cond = threading.Condition()
        self._queue: list[_Waiter[T, R]] = []
        self._busy = False
        self.calls = 0

    @property
    def waiting(self) -> int:
        with self._cond:
            return len(self._queue)

    def write(self, items: Sequence[T]) -> list[R]:
        """Write ``items`` (with whatever other writers queued meanwhile); their results, in order."""
        me: _Waiter[T, R] = _Waiter(items)
        with self._cond:
            self._queue.append(me)
            while self._busy and not me.done:
                self._cond.wait()
            if not me.done:  # nobody writing, and ours not written: write the queue, ours first among it
                batch, self._queue, self._busy = self._queue, [], True
        if not me.done:
            self._lead(batch)
        if me.error is not None:
            raise me.error
        assert me.results is not None
        return me.results

    def _lead(self, batch: list[_Waiter[T, R]]) -> None:
        flat = [item for w in batch for item in w.items]
        try:
            self.calls += 1
            results = list(self._write(flat))
            if len(results) != len(flat):
                raise RuntimeError(f"group commit: {len(results)} results for {len(flat)} records")
        except BaseException as err:  # noqa: BLE001 - handed to every writer of the call (and raised by ours)
            outcome: list[R] | BaseException = err
        else:
            outcome = results
        with self._cond:
            at = 0
            for w in batch:
                if isinstance(outcome, BaseException):
                    w.error = outcome
                else:
                    w.results = outcome[at:at + len(w.items)]
                    at += len(w.items)
                w.done = True
            self._busy = False
            self._cond.notify_all()
