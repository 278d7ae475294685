"""The memory answers read ahead hold: a bound on the block buffers they keep alive (issue 24).

A Fetch answer from the tier hands its records to the writer as views of the block buffers they were read into
(:class:`rsm.log.batch.RecordParts`): no copy, but an answer keeps its whole blocks alive (4 MiB each by default)
however few of their bytes it carries. An answer being written lets go when the write returns; an answer a proxy reads
ahead for a client's next Fetch (:class:`rlm.listener.upstream.proxy.Prefetched`) is held until that Fetch comes, or
the connection goes. At most ``PREFETCHES_HELD`` are held in the process, but each may name many partitions, each
holding a block of its own: 8 answers of 8 partitions held 256 MiB, outside ``queued_max_response_bytes`` and the
block cache's budget, and more partitions a Fetch held more.

:class:`HeldBlocks` counts what the answers read ahead hold (``rlm_history_read_ahead_held_bytes``): every distinct
buffer their records are views of (its whole size, once however many answers view it) and the answers' own buffers
(records copied out). An answer read ahead keeps its views when the buffers it would add fit within the budget (the
block cache's capacity, ``rsm.block_cache_bytes``: the memory the process already gives to blocks of sequential
reads); otherwise each partition whose blocks do not fit has its records copied out, joined into one buffer of their
own size (the copy: ~38 us per MiB); a partition whose copy does not fit either makes the whole answer not held: the
next Fetch reads again (a read-ahead missed). So the held total never passes the budget. What an answer holds is let
go when its :class:`Claim` goes, with the :class:`~rlm.listener.upstream.proxy.Prefetched` that owns it: used (the
answer is then being written, like any other) or dropped.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter, Gauge

from rlm.listener.tier.context import TierContext
from rsm.log.batch import RecordParts
from rsm.manager import BLOCK_CACHE_BYTES

__all__ = ["Claim", "HeldBlocks", "NotHeld", "budget_of"]

_held: weakref.WeakSet[HeldBlocks] = weakref.WeakSet()
_BYTES = Gauge("rlm_history_read_ahead_held_bytes", "As a proxy: bytes the answers read ahead from the tier hold "
               "until used or dropped: the block buffers their records are views of, and records copied out")
_BYTES.set_function(lambda: sum(h.total for h in list(_held)))
_OUTCOMES = Counter("rlm_history_read_ahead_held", "As a proxy: partitions of answers read ahead, by how their "
                    "records are held: views (of their blocks), copied (out of blocks past the budget), dropped "
                    "(the answer not held: not even a copy fit)", ["how"])
_VIEWS, _COPIED, _DROPPED = _OUTCOMES.labels("views"), _OUTCOMES.labels("copied"), _OUTCOMES.labels("dropped")


def budget_of(ctx: TierContext) -> int:
    """The budget of answers read ahead: the capacity of the block cache the tier reads through
    (``rsm.block_cache_bytes``), its default when the cache is off."""
    cache = getattr(getattr(getattr(ctx.tier, "reader", None), "rsm", None), "block_cache", None)
    return cache.capacity_bytes if cache is not None else BLOCK_CACHE_BYTES


class NotHeld(Exception):
    """An answer read ahead that would take the held total past the budget even with its records copied out."""


class HeldBlocks:
    """The buffers held by answers read ahead, counted against ``budget_bytes`` (see the module doc). Thread-safe:
    answers are held on the listener's workers and let go on its event loop."""

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.total = 0
        """Bytes held now: distinct block buffers, each once, and copies."""
        # re-entrant: a claim may be let go by the cyclic GC (a connection's objects in a cycle), in whatever thread
        # it runs, even one inside hold() holding the lock
        self._lock = threading.RLock()
        self._buffers: dict[int, list[int]] = {}  # id(buffer) -> [claims holding it, its size]
        _held.add(self)

    def claim(self) -> Claim:
        """A claim for one answer read ahead: what :meth:`read` holds for it is let go when the claim goes."""
        return Claim(self)

    def has_room(self) -> bool:
        """Whether anything more may be held (else an answer is not even read ahead)."""
        return self.total < self.budget_bytes

    def read(self, claim: Claim, fetch: Callable[..., dict[str, Any] | None], *args: Any) -> dict[str, Any] | None:
        """``fetch(*args)`` (the answer's values, :func:`rlm.listener.tier.boundary.fetch_from_tier`), its records
        held under ``claim``: as views where their buffers fit, else copied out; raises :class:`NotHeld` when a copy
        does not fit either (then nothing is held for it)."""
        values = fetch(*args)
        if values is not None:
            self.hold(claim, values)
        return values

    def hold(self, claim: Claim, values: dict[str, Any]) -> None:
        """Count the records of ``values`` (a Fetch answer's response values) under ``claim``, copying out those of
        a partition whose buffers do not fit (in place); :class:`NotHeld` when its copy does not fit either."""
        try:
            for t in values["responses"]:
                for p in t["partitions"]:
                    records = p["records"]
                    if isinstance(records, RecordParts):
                        p["records"] = self._hold_parts(claim, records)
                    elif isinstance(records, bytes | bytearray | memoryview) and len(records):
                        self._hold_own(claim, records)
        except NotHeld:
            _DROPPED.inc()
            claim.release()
            raise

    def _hold_parts(self, claim: Claim, records: RecordParts) -> RecordParts:
        """``records`` held as views when their new buffers fit, else copied out (one buffer of their size)."""
        bases: dict[int, Any] = {}
        last = None
        for part in records.parts:  # a partition's batches: runs of views of one block
            base = part.obj
            if base is not last:
                bases.setdefault(id(base), base)
                last = base
        with self._lock:
            new = 0
            for key, base in bases.items():
                if key not in self._buffers and key not in claim.buffers:
                    new += memoryview(base).nbytes
            if self.total + new <= self.budget_bytes:
                for key, base in bases.items():
                    if key in claim.buffers:
                        continue
                    claim.buffers[key] = base  # kept alive by the claim: its id is not reused meanwhile
                    held = self._buffers.get(key)
                    if held is None:
                        size = memoryview(base).nbytes
                        self._buffers[key] = [1, size]
                        self.total += size
                    else:
                        held[0] += 1
                _VIEWS.inc()
                return records
        copied = RecordParts([memoryview(bytes(records))], records.size, records.last_offset)
        self._hold_own(claim, copied.parts[0])
        _COPIED.inc()
        return copied

    def _hold_own(self, claim: Claim, buffer: bytes | bytearray | memoryview) -> None:
        """Count an answer's own buffer (records not viewing a block) under ``claim``, or :class:`NotHeld`."""
        n = len(buffer)
        with self._lock:
            if self.total + n > self.budget_bytes:
                raise NotHeld(f"{n} bytes past the read-ahead budget ({self.total} of {self.budget_bytes} held)")
            self.total += n
            claim.own += n

    def _release(self, claim: Claim) -> None:
        if not claim.buffers and not claim.own:
            return
        with self._lock:
            for key in claim.buffers:
                held = self._buffers[key]
                held[0] -= 1
                if held[0] == 0:
                    del self._buffers[key]
                    self.total -= held[1]
            self.total -= claim.own
            claim.buffers.clear()
            claim.own = 0


class Claim:
    """What one answer read ahead holds (:class:`HeldBlocks`); let go when the claim is, or by :meth:`release`."""

    __slots__ = ("buffers", "holder", "own")

    def __init__(self, holder: HeldBlocks) -> None:
        self.holder = holder
        self.buffers: dict[int, Any] = {}  # id -> the buffer, kept alive
        self.own = 0  # bytes of the answer's own buffers (copies)

    def release(self) -> None:
        """Let go of everything held under this claim (again: nothing)."""
        self.holder._release(self)

    def __del__(self) -> None:
        self.release()
