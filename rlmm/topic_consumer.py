"""The consumer task: the one thread that owns the metadata topic's consumer and writes the cache (Kafka's
``ConsumerTask``).

It consumes the metadata partitions it is told to (``assign``, never ``subscribe``, no group commits) and applies
their records into :class:`rlmm.cache.MetadataCache`, whose rules refuse or apply each record in the topic's order.
On (re)assignment of a metadata partition the cache resumes from its stored next offset, unless it has been away
longer than the topic's ``delete.retention.ms`` (it might have missed tombstones) or the stored offset fell below the
log start: then that partition's state is dropped and rebuilt from the beginning.

Other threads talk to it through :meth:`ConsumerTask.call` (run a function on the thread), and wait on it:
:meth:`ConsumerTask.wait_ready` (caught up with a partition), :meth:`ConsumerTask.wait_applied` (a written offset
applied: read-your-writes), :meth:`ConsumerTask.holding` (keep a partition consumed while a write uses it).

A consumer that stops delivering is renewed: when a record acknowledged to a writer (a read-your-writes waiter's
offset) is not delivered for ``stall_renew_s``, or a partition's high watermark stays above what was applied over
two looks :data:`HIGH_WATERMARK_CHECK_S` apart (records other sidecars wrote), while the thread keeps polling, the
thread replaces its librdkafka consumer by a new one assigned at the offsets applied so far (nothing skipped,
nothing applied twice). librdkafka's
assign()-mode consumer can stop fetching a partition after a broker restart with no error (confluentinc/librdkafka
#5153, open; seen here once: no delivery past offset 5 for 90+ s); a new consumer is the cure reported there.
"""

from __future__ import annotations

import collections
import gc
import heapq
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition
from prometheus_client import Counter

from rlmm.api import (
    MetadataWriteError,
    PartitionNotServedError,
    ReadYourWritesTimeoutError,
    RemoteLogMetadataError,
    TopicIdPartition,
)
from rlmm.cache import MetadataCache, Progress, SkippedRecord, release_free_heap
from rlmm.group_commit import taken_lock
from rlmm.topic_admin import MetadataTopic

__all__ = ["APPLIED_RECORDS", "CONSUMER_RENEWALS", "SKIPPED_RECORDS", "ConsumerTask"]

log = logging.getLogger(__name__)

SKIPPED_RECORDS = Counter("rlmm_skipped_records_total",
                          "Metadata records skipped by the cache (undecodable or refused transitions)", ["reason"])
APPLIED_RECORDS = Counter("rlmm_applied_records_total", "Metadata records applied into the cache")
CONSUMER_RENEWALS = Counter("rlmm_consumer_renewals_total",
                            "Metadata consumers replaced because an acknowledged record was not delivered in time")

PREFETCH_KBYTES = 8192
PREFETCH_MESSAGES = 20_000
PREFETCH_BACKOFF_MS = 20
"""librdkafka's prefetch bounds (``queued.max.messages.kbytes``, ``queued.min.messages``) and the pause of a
partition's fetches once they are reached (``fetch.queue.backoff.ms``); ``consumer_config`` may override them. Its
defaults (64 MiB, 100,000 messages per partition) let a bootstrap, whose apply loop falls behind the fetcher, hold
up to the whole topic decoded in librdkafka's queue: at 1 M segments (2 M records, 50 partitions) that queue was
~450 of the process's ~750 MiB of heap above start. With bounds, the default 1 s pause starved the loop (50 empty
polls, 2.6 s of a 32 s bootstrap); at 20 ms it does not (2 empty polls, 0.1 s). 1 MiB and 2,000 messages starved it
even so (a third of the rate)."""

COMPACT_AFTER_RECORDS = 100_000
"""Once every assigned partition is caught up after at least this many records applied (a bootstrap, a rebuild),
and at least a quarter as many as the cache holds keys (so a steady trickle rewrites the cache rarely; a bootstrap
writes about one key per record, and RocksDB's key estimate counts overwrites not yet compacted), the cache is
compacted in the background: lookups then seek one sorted run (:meth:`MetadataCache.compact_in_background`)."""

STALL_CHECK_S = 1.0
"""How often the thread looks for a stalled partition (a dict walk of the partitions with waiters)."""
HIGH_WATERMARK_CHECK_S = 30.0
"""How often the thread asks the cluster for its partitions' high watermarks (one ListOffsets a leader, on the thread):
a partition that was behind its high watermark at the last look and has applied nothing since is stalled."""
STALL_MIN_POLLS = 20
"""Polls the thread must have made over a stall (50 ms each when nothing comes): a thread busy elsewhere (a long
command, a compaction start) is not a consumer that stopped fetching."""

WAIT_POLL_S = 0.5
"""How often a :meth:`ConsumerTask.wait_applied` waiter looks at its partition's progress unwoken (its timeout counts
from the last progress it saw) and a :meth:`ConsumerTask.wait_ready` waiter at its partitions."""


# Errors of a watermark read that pass as the cluster settles, retried like the retriable ones: leadership moving,
# and a broker handle librdkafka destroyed under the request (a broker left the cluster's metadata; seen in the chaos
# run after a broker restart, where the request's broker was gone for a moment).
_SETTLING = frozenset({KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
                       KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._DESTROY_BROKER, KafkaError._TRANSPORT})


class _Holding:
    """The context manager of :meth:`ConsumerTask.holding` (a class: a write enters one per call, and a generator's
    context manager cost several times as much)."""

    __slots__ = ("by_mp", "task", "timeout_s")

    def __init__(self, task: ConsumerTask, by_mp: Mapping[int, TopicIdPartition], timeout_s: float) -> None:
        self.task, self.by_mp, self.timeout_s = task, by_mp, timeout_s

    def __enter__(self) -> None:
        self.task._hold(self.by_mp, self.timeout_s)

    def __exit__(self, *exc: object) -> None:
        self.task._release(self.by_mp)


class ConsumerTask:
    """See the module docstring. ``on_idle`` runs on the thread once per loop (the manager's tombstones and producer
    polls); ``kafka_timeout_s`` bounds each wait on the cluster when a partition is assigned. Counters for tests:
    ``records_consumed``, ``records_applied``, ``skipped_records`` (and ``skipped``, the last ones),
    ``rebuilt_partitions``, ``resumed_partitions``."""

    def __init__(self, topic: MetadataTopic, cache: MetadataCache, client_config: Mapping[str, object], *,
                 caught_up_refresh_s: float, close_drain_s: float, max_batch_records: int,
                 kafka_timeout_s: float = 30.0, stall_renew_s: float = 10.0,
                 on_idle: Callable[[], None] | None = None) -> None:
        self.topic = topic.name
        self.delete_retention_ms = topic.delete_retention_ms
        self.cache = cache
        self._caught_up_refresh_s = caught_up_refresh_s
        self._close_drain_s = close_drain_s
        self._max_batch_records = max_batch_records
        self._kafka_timeout_s = kafka_timeout_s
        self._on_idle = on_idle
        self._stall_renew_s = stall_renew_s
        self._consumer_config = {"group.id": f"rlmm-{uuid.uuid4()}", "enable.auto.commit": False,
                                 "enable.partition.eof": True, "auto.offset.reset": "earliest",
                                 "fetch.wait.max.ms": 50, "queued.max.messages.kbytes": PREFETCH_KBYTES,
                                 "queued.min.messages": PREFETCH_MESSAGES,
                                 "fetch.queue.backoff.ms": PREFETCH_BACKOFF_MS, **client_config}
        self._consumer = Consumer(self._consumer_config)
        self._polls = 0
        # partitions with a waiter for an offset not applied yet: (applied then, since when, polls then)
        self._stall_seen: dict[int, tuple[int, float, int]] = {}
        # partitions behind their high watermark at the last look: (applied then, polls then)
        self._behind_seen: dict[int, tuple[int, int]] = {}
        self._last_hw_check = time.monotonic()
        self.renewals = 0
        self._cond = threading.Condition()
        self._applied: dict[int, int] = {}        # metadata partition -> next offset applied (consumer thread)
        # read-your-writes waiters per metadata partition: a heap of (offset awaited, seq, lock taken at birth), each
        # lock released once its offset is applied (or the partition unassigned, or the thread dead), so a batch
        # applied wakes only the waiters it satisfies, not all of them (a notify_all per batch woke every copy's
        # writer each time); a lock, not an Event (rlmm.group_commit.taken_lock)
        self._waiters: dict[int, list[tuple[int, int, threading.Lock]]] = {}
        self._waiter_seq = itertools.count()
        self._assigned: set[int] = set()
        self._ready: set[int] = set()
        self._at_eof: set[int] = set()
        self._held: dict[int, int] = {}  # metadata partitions a write is using: how many writes use each
        # calls for the thread (call()): a deque, not a queue.Queue, since the thread looks at it every loop (each
        # record applied in a burst) and Queue.get_nowait took its lock and raised Empty each time: ~6% of the
        # thread's samples in bench_rlmm_writes (issue 26); append and popleft are atomic, the thread the one taker
        self._commands: collections.deque[tuple[Callable[[], object], list]] = collections.deque()
        self._skipped_at: collections.OrderedDict[tuple[int, int], SkippedRecord] = collections.OrderedDict()
        self._stop = threading.Event()
        self.error: BaseException | None = None   # what killed the thread
        self.records_consumed = 0
        self._applied_since_compaction = 0
        self.records_applied = 0
        self.skipped_records = 0
        self.skipped: collections.deque[SkippedRecord] = collections.deque(maxlen=1000)
        self.rebuilt_partitions: list[int] = []
        self.resumed_partitions: list[int] = []
        self._thread = threading.Thread(target=self._run, name=f"rlmm-consumer-{self.topic}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Drain to the end of every partition (up to ``close_drain_s``), mark caught up, stop, close the consumer."""
        self._stop.set()
        self._thread.join(60)
        self._consumer.close()

    def check_alive(self) -> None:
        if self.error is not None:
            raise RemoteLogMetadataError(f"the metadata consumer thread died: {self.error!r}")

    # ------------------------------------------------------------------------------------- other threads
    def call(self, fn: Callable[[], object], timeout_s: float = 60.0) -> object:
        """Run ``fn`` on the consumer thread (it owns the consumer and the cache writes); wait for it."""
        if threading.current_thread() is self._thread:
            return fn()
        box: list = []
        done = threading.Event()
        self._commands.append((fn, [box, done]))
        if not done.wait(timeout_s):
            raise RemoteLogMetadataError(f"consumer thread did not answer within {timeout_s}s")
        if box and isinstance(box[0], BaseException):
            raise box[0]
        return box[0] if box else None

    def consumes(self, mp: int) -> bool:
        return mp in self._assigned

    def is_ready(self, mp: int) -> bool:
        return mp in self._ready

    def assigned_partitions(self) -> set[int]:
        with self._cond:
            return set(self._assigned)

    def wait_ready(self, by_mp: Mapping[int, TopicIdPartition], timeout_s: float) -> None:
        """Block until every metadata partition of ``by_mp`` is caught up; :class:`PartitionNotServedError` at once for
        one not consumed (never assigned, or unassigned meanwhile), :class:`ReadYourWritesTimeoutError` after
        ``timeout_s``."""
        mps = set(by_mp)
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while not mps <= self._ready:
                gone = sorted(mps - self._assigned)
                if gone:  # never applied again here: waiting could only time out
                    raise PartitionNotServedError(
                        f"{by_mp[gone[0]]}: metadata partition {self.topic}-{gone[0]} is not consumed by this "
                        "manager (not served, or stopped while waiting): call on_partition_leadership_changes first")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ReadYourWritesTimeoutError(f"metadata partitions {sorted(mps - self._ready)} not caught "
                                                     f"up within {timeout_s}s")
                self._cond.wait(min(left, WAIT_POLL_S))

    def wait_caught_up(self, by_mp: Mapping[int, TopicIdPartition], timeout_s: float) -> None:
        """Block until each metadata partition of ``by_mp`` is applied up to its high watermark as read now (on the
        thread); :class:`ReadYourWritesTimeoutError` after ``timeout_s`` without progress,
        :class:`PartitionNotServedError` for one no longer consumed."""
        highs = {mp: self.call(lambda mp=mp: self._watermarks(mp)[1]) for mp in by_mp}
        reached = self.wait_applied({mp: high - 1 for mp, high in highs.items() if high > 0}, timeout_s)
        for mp, nxt in reached.items():
            if nxt is None:
                raise PartitionNotServedError(f"{by_mp[mp]}: metadata partition {self.topic}-{mp} is no longer "
                                              "consumed by this manager")
            if nxt < highs[mp]:
                raise ReadYourWritesTimeoutError(f"metadata partition {self.topic}-{mp}: applied up to {nxt}, not "
                                                 f"its high watermark {highs[mp]}, within {timeout_s}s")

    def wait_applied(self, offsets: Mapping[int, int], timeout_s: float) -> dict[int, int | None]:
        """Wait until the record at ``offsets[mp]`` of each metadata partition is applied, allowing ``timeout_s``
        without progress per partition. Returns per partition the next offset applied by then (above the record's
        once applied), or None when the partition is no longer consumed.

        Each partition's wait is a lock of its own in the partition's waiter heap, released by the consumer thread once
        a batch takes the partition past ``offset`` (:meth:`_wake_applied`), by :meth:`unassign`, or by the thread's
        death; unwoken, the waiter looks at the progress every :data:`WAIT_POLL_S` (a batch that does not reach its
        offset does not wake it, so a progress is seen up to that late: a timeout is never shorter)."""
        out: dict[int, int | None] = {}
        for mp, offset in offsets.items():
            progress_at, seen = time.monotonic(), self._applied.get(mp, -1)
            entry: tuple[int, int, threading.Lock] | None = None
            woken = False  # entry's lock acquired: it was popped and released (woken), it is no longer in the heap
            try:
                while True:
                    with self._cond:
                        applied = self._applied.get(mp, -1)
                        if applied > offset or mp not in self._assigned:
                            break
                        self.check_alive()
                        if applied != seen:
                            progress_at, seen = time.monotonic(), applied
                        left = progress_at + timeout_s - time.monotonic()
                        if left <= 0:
                            break
                        if entry is None or woken:   # (woken but not past it: the partition reassigned)
                            entry, woken = (offset, next(self._waiter_seq), taken_lock()), False
                            heapq.heappush(self._waiters.setdefault(mp, []), entry)
                    woken = entry[2].acquire(timeout=min(left, WAIT_POLL_S))
            finally:
                with self._cond:
                    out[mp] = self._applied.get(mp)
                    heap = self._waiters.get(mp)
                    # not woken: still in the heap (timed out: no longer awaited), unless taken out just now
                    if entry is not None and not woken and heap and entry in heap:
                        heap.remove(entry)
                        heapq.heapify(heap)
        return out

    def _wake_applied(self, mp: int, next_offset: int | None, wake: list[threading.Lock]) -> None:
        """Take ``mp``'s waiters whose offset is below ``next_offset`` (all of them if None) out of its heap, their
        locks into ``wake``: the caller releases them once it let go of the lock (under which this runs), so a waiter
        woken does not at once block on that lock again (a wake-up that preempts the waker while it holds the lock
        and the GIL is a second hand-off back: issue 26)."""
        heap = self._waiters.get(mp)
        while heap and (next_offset is None or heap[0][0] < next_offset):
            wake.append(heapq.heappop(heap)[2])
        if not heap:
            self._waiters.pop(mp, None)

    def skipped_at(self, mp: int, offset: int) -> SkippedRecord | None:
        """The record at ``offset`` of ``mp`` if the cache refused it (among the last 10,000 refused). Asked for every
        record written: none refused yet (the usual case) is answered without the lock the consumer thread applies
        under (a writer that saw its offset applied saw what that batch refused: both are set under that lock)."""
        if not self._skipped_at:
            return None
        with self._cond:
            return self._skipped_at.get((mp, offset))

    def holding(self, by_mp: Mapping[int, TopicIdPartition], timeout_s: float) -> _Holding:
        """Consume these metadata partitions (if not yet), wait until caught up, and keep them consumed until the
        block ends (a context manager): a write checks against them, then waits to read itself back. :meth:`unassign`
        leaves a held partition assigned: unassigned, it would never be applied again, and the read-your-writes wait
        on it could only time out (a fenced copy's clean-up once waited its full timeout on the metadata partition of
        its just-deleted topic). What a write assigned stays assigned until the next unassign."""
        return _Holding(self, by_mp, timeout_s)

    def _hold(self, by_mp: Mapping[int, TopicIdPartition], timeout_s: float) -> None:
        """:meth:`holding`'s start: held (before the check below: unassign runs under the same lock and skips held
        partitions), assigned, caught up; released again if that fails."""
        held = self._held
        with self._cond:
            for mp in by_mp:
                held[mp] = held.get(mp, 0) + 1
        try:
            missing = [mp for mp in by_mp if mp not in self._assigned]
            if missing:
                self.call(lambda: self.assign(missing))
            if not self._ready.issuperset(by_mp):
                self.wait_ready({mp: tp for mp, tp in by_mp.items() if mp not in self._ready}, timeout_s)
        except BaseException:
            self._release(by_mp)
            raise

    def _release(self, mps: Iterable[int]) -> None:
        """:meth:`holding`'s end."""
        held = self._held
        with self._cond:
            for mp in mps:
                n = held[mp] - 1
                if n > 0:
                    held[mp] = n
                else:
                    del held[mp]

    # --------------------------------------------------------------------------------- on the thread
    def assign(self, mps: Iterable[int]) -> None:
        """Start consuming ``mps`` (resumed from the cache's progress, or rebuilt). On the thread: use :meth:`call`."""
        new = sorted(set(mps) - self._assigned)
        if not new:
            return
        now_ms = int(time.time() * 1000)
        tps, wipe = [], []
        for mp in new:
            low, high = self._watermarks(mp)
            prog = self.cache.progress(mp)
            if (prog is not None and prog.caught_up_wall_ms > 0
                    and now_ms - prog.caught_up_wall_ms <= self.delete_retention_ms and prog.next_offset >= low):
                start = prog.next_offset
                self.resumed_partitions.append(mp)
            else:
                if prog is not None:   # (no progress, no state: apply writes both in one batch, wipe drops both)
                    log.info("metadata partition %d: cache away since %d ms (delete.retention.ms %d) or below log "
                             "start %d: rebuilding from the beginning", mp, prog.caught_up_wall_ms,
                             self.delete_retention_ms, low)
                    wipe.append(mp)   # (a range delete on a fresh cache would only slow every read after it)
                start = low
                self.rebuilt_partitions.append(mp)
            tps.append(TopicPartition(self.topic, mp, start if start > 0 else OFFSET_BEGINNING))
            with self._cond:
                self._applied[mp] = start
                if start >= high:
                    self._ready.add(mp)
                    self._at_eof.add(mp)
        if wipe:
            self.cache.wipe(wipe)
        self._consumer.incremental_assign(tps)
        with self._cond:
            self._assigned.update(new)
            self._cond.notify_all()

    def _watermarks(self, mp: int) -> tuple[int, int]:
        """(log start, high watermark) of a metadata partition; retried while leadership settles."""
        timeout_s = self._kafka_timeout_s
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self._consumer.get_watermark_offsets(TopicPartition(self.topic, mp),
                                                            timeout=min(10.0, timeout_s))
            except KafkaException as err:
                if time.monotonic() > deadline or not err.args[0].retriable() and err.args[0].code() not in _SETTLING:
                    raise MetadataWriteError(f"cannot read the offsets of {self.topic}-{mp}: {err}") from err
                time.sleep(0.2)

    def unassign(self, mps: Iterable[int]) -> None:
        """Stop consuming ``mps``, except those a write holds (:meth:`holding`): under the lock the writers take to
        hold one, so a write either sees its partition unassigned (and assigns it again) or keeps it."""
        wake: list[threading.Lock] = []
        with self._cond:
            gone = sorted(set(mps) & self._assigned - set(self._held))
            if not gone:
                return
            self._consumer.incremental_unassign([TopicPartition(self.topic, mp) for mp in gone])
            for mp in gone:
                self._assigned.discard(mp)
                self._ready.discard(mp)
                self._at_eof.discard(mp)
                self._applied.pop(mp, None)
                self._wake_applied(mp, None, wake)
            self._cond.notify_all()
        for lock in wake:
            lock.release()

    def _run(self) -> None:
        last_caught_up = last_stall_check = 0.0
        try:
            while not self._stop.is_set():
                self._run_commands()
                self._consume_once()
                now = time.monotonic()
                if now - last_stall_check >= STALL_CHECK_S:
                    self._check_stalled(now)
                    last_stall_check = now
                if self._at_eof and now - last_caught_up >= self._caught_up_refresh_s:
                    self._mark_caught_up()
                    last_caught_up = now
                if self._on_idle is not None:
                    self._on_idle()
            self._drain_to_eof(self._close_drain_s)
            self._mark_caught_up()
        except BaseException as err:  # noqa: BLE001 - reported to every waiter, then re-raised
            log.exception("metadata consumer thread died")
            self.error = err
            wake: list[threading.Lock] = []
            with self._cond:
                for mp in list(self._waiters):
                    self._wake_applied(mp, None, wake)
                self._cond.notify_all()
            for lock in wake:
                lock.release()
            raise

    def _consume_once(self) -> None:
        """One poll: apply the records fetched, note the partitions that reached their end."""
        # consume(n, timeout) waits for n messages or the whole timeout: a writer waiting for its own record would
        # wait the full timeout each time. Wait for the first message only, then take what is already fetched.
        first = self._consumer.poll(0.05)
        self._polls += 1
        if first is None:
            msgs, records = [], []
        else:
            # Python's cyclic GC held off while a batch is taken and applied: every message, record tuple and
            # segment view is a tracked object, none forms a cycle, and a collection every 700 of them (each batch
            # promoted through the generations while it is alive) took ~11% of a bootstrap's consumer thread
            gc_was_on = gc.isenabled()
            gc.disable()
            try:
                msgs = [first, *self._consumer.consume(num_messages=max(1, self._max_batch_records - 1), timeout=0)]
                assigned = self._assigned
                # one comprehension over the batch (the bootstrap's hot loop: ~10,000 messages a call), errors after
                records = [(mp, m.offset(), m.key(), m.value()) for m in msgs
                           if m.error() is None and (mp := m.partition()) in assigned]
                if records:
                    self._apply(records)
            finally:
                if gc_was_on:
                    gc.enable()
        eofs = []
        if len(records) != len(msgs):
            for m in msgs:
                err = m.error()
                if err is None:
                    continue
                if err.code() == KafkaError._PARTITION_EOF:
                    eofs.append((m.partition(), m.offset()))
                else:
                    log.warning("metadata consumer error: %s", err)
        if eofs:
            with self._cond:
                for mp, _off in eofs:
                    if mp in self._assigned:
                        self._at_eof.add(mp)
                        self._ready.add(mp)
                n = self._applied_since_compaction
                # (started before the waiters wake: one that waits for the compaction then finds it)
                compacting = self._assigned <= self._at_eof and n >= COMPACT_AFTER_RECORDS \
                    and n >= self.cache.estimated_keys() // 4 and self.cache.compact_in_background()
                self._cond.notify_all()
            if compacting:
                log.info("metadata cache caught up after %d records: compacting it in the background", n)
                self._applied_since_compaction = 0
                release_free_heap()   # what the catch-up freed (the compaction releases its own when done)

    def _check_stalled(self, now: float) -> None:
        """Renew the consumer when a partition has had a waiter for an offset not yet applied, with no progress, for
        ``stall_renew_s`` over at least :data:`STALL_MIN_POLLS` polls. A waiter's offset was acknowledged by the
        cluster (acks=all): the record is there to fetch, so a consumer that polls and does not deliver it is stuck."""
        seen = self._stall_seen
        stalled = []
        with self._cond:
            for mp, heap in self._waiters.items():
                applied = self._applied.get(mp, -1)
                if not heap or heap[0][0] < applied:
                    continue
                was = seen.get(mp)
                if was is None or was[0] != applied:
                    seen[mp] = (applied, now, self._polls)
                elif now - was[1] >= self._stall_renew_s and self._polls - was[2] >= STALL_MIN_POLLS:
                    stalled.append((mp, applied, heap[0][0], now - was[1]))
            for mp in [mp for mp in seen if mp not in self._waiters]:
                del seen[mp]
        if now - self._last_hw_check >= HIGH_WATERMARK_CHECK_S:
            self._last_hw_check = now
            stalled += self._behind_twice()
        if stalled:
            for mp, applied, awaited, for_s in stalled:
                log.warning("metadata partition %s-%d: offset %d is in the partition but nothing was delivered past "
                            "%d for %.1f s: renewing the metadata consumer", self.topic, mp, awaited, applied, for_s)
            self._renew_consumer()

    def _behind_twice(self) -> list[tuple[int, int, int, float]]:
        """The assigned partitions behind their high watermark now and at the last look, with nothing applied in
        between (and the thread polling): (partition, applied, high watermark, seconds). A failed look finds none."""
        with self._cond:
            applied = {mp: self._applied.get(mp, -1) for mp in self._assigned}
        if not applied:
            self._behind_seen.clear()
            return []
        try:   # (a timestamp of -1 asks ListOffsets for the latest offset: the high watermark)
            found = self._consumer.offsets_for_times([TopicPartition(self.topic, mp, -1) for mp in applied],
                                                     timeout=min(5.0, self._kafka_timeout_s))
        except (KafkaException, RuntimeError) as err:
            log.debug("metadata partitions' high watermarks not read: %s", err)
            return []
        behind, out = {}, []
        for tp in found:
            mp, hw = tp.partition, tp.offset
            if tp.error is not None or mp not in applied or hw <= applied[mp]:
                continue
            behind[mp] = (applied[mp], self._polls)
            was = self._behind_seen.get(mp)
            if was is not None and was[0] == applied[mp] and self._polls - was[1] >= STALL_MIN_POLLS:
                out.append((mp, applied[mp], hw - 1, HIGH_WATERMARK_CHECK_S))
        self._behind_seen = behind
        return out

    def _renew_consumer(self) -> None:
        """Replace the librdkafka consumer by a new one assigned where the cache stands (each assigned partition at
        its next offset to apply); what the old one had fetched and not handed over is fetched again. On the thread."""
        with self._cond:
            tps = [TopicPartition(self.topic, mp, self._applied[mp] if self._applied.get(mp, 0) > 0
                                  else OFFSET_BEGINNING) for mp in sorted(self._assigned)]
            old, self._consumer = self._consumer, Consumer(self._consumer_config)
            self._consumer.incremental_assign(tps)
            self._stall_seen.clear()
            self._behind_seen.clear()
            self.renewals += 1
        CONSUMER_RENEWALS.inc()
        try:
            old.close()
        except (KafkaException, RuntimeError) as err:   # the old one is dropped whatever it says
            log.warning("metadata consumer being replaced did not close cleanly: %s", err)

    def _drain_to_eof(self, timeout_s: float) -> None:
        """On stop: consume until every assigned partition is at its end again (or ``timeout_s``), so the last
        caught-up mark covers them all. A partition whose last records were applied but whose end-of-partition
        event had not come yet would otherwise keep its old mark (none, on a young cache) and be rebuilt from the
        beginning on the next start."""
        deadline = time.monotonic() + timeout_s
        while self._assigned - self._at_eof and time.monotonic() < deadline:
            self._consume_once()

    def _run_commands(self) -> None:
        commands = self._commands
        while commands:
            fn, (box, done) = commands.popleft()
            try:
                box.append(fn())
            except BaseException as err:  # noqa: BLE001 - handed to the caller
                box.append(err)
            done.set()

    def _apply(self, records: list) -> None:
        self.records_consumed += len(records)
        self._applied_since_compaction += len(records)
        out = self.cache.apply(records, {})
        self.records_applied += out.applied
        APPLIED_RECORDS.inc(out.applied)
        wake: list[threading.Lock] = []
        try:
            with self._cond:
                for mp, nxt in out.next_offsets.items():
                    self._applied[mp] = nxt
                    self._at_eof.discard(mp)
                    self._wake_applied(mp, nxt, wake)
                self._note_skipped(out.skipped)
        finally:
            for lock in wake:
                lock.release()

    def _note_skipped(self, skipped: list[SkippedRecord] | None) -> None:
        """Log, count and keep (for :meth:`skipped_at`) the records a batch skipped. Under the lock."""
        for s in skipped or ():
            # a second deleter's record is normal in a cluster (not corruption): INFO; any other refusal: ERROR
            log.log(logging.INFO if s.deleted_already else logging.ERROR,
                    "metadata partition %d offset %d skipped (%s%s): %s", s.metadata_partition, s.offset,
                    s.reason, ", deleted already" if s.deleted_already else "", s.error)
            SKIPPED_RECORDS.labels(s.reason).inc()
            self.skipped_records += 1
            self.skipped.append(s)
            self._skipped_at[(s.metadata_partition, s.offset)] = s
            while len(self._skipped_at) > 10_000:
                self._skipped_at.popitem(last=False)
        # (no notify_all: a batch changes no state wait_ready waits on; wait_applied's waiters are woken by _apply)

    def _mark_caught_up(self) -> None:
        with self._cond:
            mps = {mp: self._applied[mp] for mp in self._at_eof if mp in self._applied}
        if mps:
            now_ms = int(time.time() * 1000)
            self.cache.mark_caught_up({mp: Progress(nxt, now_ms) for mp, nxt in mps.items()})
