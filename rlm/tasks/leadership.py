"""The leadership registry: which partitions this sidecar leads (a copy job each) and which it follows.

A discovery round hands :meth:`Leadership.serve` the partitions led here and the ones followed
(:func:`rlm.discovery.classify`); the registry tells the metadata manager, starts a copy job for each partition newly
led and stops the job of each one no longer led. A copy job runs :meth:`Leadership.run_copy`, which runs the
sidecar's copy run (``run``) while holding the partition's ``running`` lock, and releases its staging when the run
ends after leadership moved.

**The lock and what it guards.** :attr:`Leadership.lock` (re-entrant) guards the registry's collections (the led
partitions by ``(topic, partition)``, the ones *ending*: no longer led while their copy run still goes, and the
followed set) and the stopping flag. Whenever it is free:

1. the metadata manager has been told of exactly the partitions led and followed (a call that raised changed
   nothing: :class:`LeadershipChangeError`, the next round tries again), and a copy job is scheduled for each led
   partition and for no other;
2. once :meth:`stop` has set the stopping flag (under the lock), no copy job is added, removed, paused or woken:
   apscheduler's shutdown holds the scheduler's locks while it joins the job threads, and a job changing one then
   would deadlock it. :meth:`serve` refuses (returns False) from then on;
3. a partition is ending only while its copy run holds ``running`` (the ended ones are forgotten when
   :meth:`still_running` is read).

**Sleeping copy jobs.** A copy run that finds its partition caught up (every rolled segment tiered, nothing staged)
pauses its own job (:meth:`sleep`): with thousands of partitions, running every idle one each copy interval was most of
the sidecar's idle CPU. The stage job wakes it (:meth:`wake`: its next run now, or ``tasks.copy_settle_ms`` from now, so
that the rolls following the first copy with it) when the log-dir watcher sees its directory change (a roll, retention,
a rewritten checkpoint: :mod:`rlm.watch`), the watcher's slow rescan included. A change seen while the run goes sets
``changed``, and a run that began before it does not sleep but asks the scheduler to run it again now (up to
:data:`RERUNS_ON_CHANGE` times in a row): no roll is missed between a run's listing and its pause. A job awake and not
running is also run now by a wake. "Now" is the scheduler's: :class:`rlm.tasks.dispatch.CopyJobs` runs a job woken while
it runs once the run ends, and puts off a wake that closely follows the job's last run (``tasks.copy_coalesce_ms``), so
that rolls following each other are copied in one run (a run again in place, as before, copied a partition rolling
quickly one segment a run). A run that did not catch up (waiting for the last stable offset, failed, not leading under
the cluster's epoch) keeps its interval.

Every change takes the lock; readers copy what they need under it and work on the copy outside
(:meth:`each_led`, :meth:`served`, :meth:`led_partitions`). A :class:`Led`'s ``stop`` and ``cancel`` are set under
the lock and read anywhere; its ``running`` lock is held by its copy run alone, the registry only tests it
(``locked()``, one non-blocking acquire in :meth:`stop_leading`). A partition's staging is released by whichever ends
last: :meth:`stop_leading` when no run goes, else the run's end, unless the partition is led again by then.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from rlm import metrics
from rlm.config import SidecarSettings
from rlm.errors import RlmError
from rlm.state import StateDir
from rlm.tasks.copier import PartitionCopier, forget_held
from rlm.tasks.deleter import SegmentDeleter
from rlm.tasks.offload import StreamingOffloader
from rlm.tasks.staging import Staging
from rlmm.api import RemoteLogMetadataManager, TopicIdPartition
from rsm.manager import RemoteStorageManager

__all__ = ["RERUNS_ON_CHANGE", "Leadership", "LeadershipChangeError", "Led", "Scheduler", "copy_job_id"]

log = logging.getLogger(__name__)


class LeadershipChangeError(RlmError):
    """The metadata manager did not take a change of the partitions served (``on_partition_leadership_changes`` or
    ``on_stop_partitions`` raised: e.g. a metadata partition's offsets not readable while a broker restarts).
    Nothing changed in the registry; the sidecar reports it (a warning, ``last_error`` in ``/health``) and its next
    discovery round tries again. No action unless it persists: then the metadata topic's brokers are the cause."""


class Scheduler(Protocol):
    """What the registry needs of the copy jobs' scheduler (the sidecar's :class:`rlm.tasks.dispatch.CopyJobs`;
    apscheduler's scheduler has the same calls): adding and removing a copy job, letting it sleep (pause) and waking
    it (its next run now)."""

    def add_job(self, func: Callable[..., Any], trigger: str, **kwargs: Any) -> object: ...

    def remove_job(self, job_id: str) -> None: ...

    def pause_job(self, job_id: str) -> object: ...

    def modify_job(self, job_id: str, **changes: Any) -> object: ...


@dataclass
class Led:
    """A partition led here: its partition dir, its copy task and the events its copy job runs by."""

    tp: TopicIdPartition
    path: Path
    copier: PartitionCopier
    offloader: StreamingOffloader | None  # streaming mode (rlm.tasks.offload); None: segment mode
    stop: threading.Event = field(default_factory=threading.Event)  # no further copy starts (also at shutdown)
    cancel: threading.Event = field(default_factory=threading.Event)  # no longer led: the copy in flight stops too
    running: threading.Lock = field(default_factory=threading.Lock)  # held by the copy run
    changed: threading.Event = field(default_factory=threading.Event)  # its directory changed since its run began
    asleep: bool = False  # its copy job is paused: caught up, until its directory changes (under the registry's lock)
    reruns: int = 0  # runs asked for in a row because the directory changed during the run (run_copy; the lock's)

    @property
    def job_id(self) -> str:
        """The copy job's id: by topic id, so a topic re-created under its name gets a job of its own and never waits
        for the old topic's run (apscheduler runs one instance per id)."""
        return copy_job_id(self.tp)


RERUNS_ON_CHANGE = 3
"""How many times in a row a copy job that caught up is run again at once (the scheduler's "now") because its
directory changed during the run; then it waits for its interval (a partition whose directory changes during every
run, faster than its runs end, does not run back to back for good)."""


def copy_job_id(tp: TopicIdPartition) -> str:
    return f"copy:{tp.topic}-{tp.partition}:{tp.topic_id}"


class Leadership:
    """The partitions led (a copy job each) and followed; see the module doc for what :attr:`lock` guards.

    ``run``: the sidecar's copy run of one led partition (called by :meth:`run_copy`, the copy job); it returns True
    when the partition is caught up (nothing to do until its directory changes: the job sleeps, :meth:`wake`).
    ``staging`` and ``deleter``: the copier's; None in ``mode: read_only``, which leads nothing (it only follows)."""

    def __init__(self, settings: SidecarSettings, scheduler: Scheduler, *, rlmm: RemoteLogMetadataManager,
                 rsm: RemoteStorageManager, staging: Staging | None, deleter: SegmentDeleter | None,
                 run: Callable[[Led], bool | None]) -> None:
        self.settings = settings
        self.lock = threading.RLock()
        self._scheduler = scheduler
        self._rlmm = rlmm
        self._rsm = rsm
        self._staging = staging
        self._deleter = deleter
        self._run = run
        self._led: dict[tuple[str, int], Led] = {}
        # _led by partition directory, for wake (a few paths among thousands led); kept by start_ and stop_leading
        self._led_by_path: dict[Path, Led] = {}
        self._ending: dict[TopicIdPartition, Led] = {}  # no longer led, its copy run still going (stop_leading)
        self._followed: set[TopicIdPartition] = set()
        self._stopping = threading.Event()
        # the arguments of the last serve() that changed what is served as asked (see serve)
        self._last_served: tuple[object, object] = (None, None)

    # ------------------------------------------------------------------------------------------------ reads
    @property
    def stopping(self) -> bool:
        """:meth:`stop` was called: no copy job is added or removed any more."""
        return self._stopping.is_set()

    def get(self, topic: str, partition: int) -> Led | None:
        """The partition led now under this name, if any."""
        with self.lock:
            return self._led.get((topic, partition))

    def each_led(self) -> Iterator[Led]:
        """The partitions led when called, skipping one whose copy task is stopped by the time its turn comes."""
        with self.lock:
            leds = list(self._led.values())
        for led in leds:
            if not led.stop.is_set():
                yield led

    def led_partitions(self) -> list[TopicIdPartition]:
        with self.lock:
            return [led.tp for led in self._led.values()]

    def served(self) -> list[TopicIdPartition]:
        """The partitions led and followed."""
        with self.lock:
            return [led.tp for led in self._led.values()] + list(self._followed)

    def counts(self) -> tuple[int, int]:
        """(partitions led, partitions followed)."""
        with self.lock:
            return len(self._led), len(self._followed)

    def still_running(self) -> dict[TopicIdPartition, Led]:
        """The partitions no longer led whose copy run, started while led, is still going (forgetting the others)."""
        with self.lock:
            for tp, led in list(self._ending.items()):
                if not led.running.locked():
                    del self._ending[tp]
            return dict(self._ending)

    def copy_running(self, tp: TopicIdPartition) -> Led | None:
        """The copy run of ``tp`` still going, led or no longer led; None when none goes."""
        with self.lock:
            return self.still_running().get(tp) or next(
                (led for led in self._led.values() if led.tp == tp and led.running.locked()), None)

    def leads_again(self, led: Led) -> bool:
        """``led``'s partition is led again, by a newer copy job of the same replica."""
        now = self.get(led.tp.topic, led.tp.partition)
        return now is not None and now is not led and now.tp == led.tp

    # ---------------------------------------------------------------------------------------------- changes
    def serve(self, leaders: dict[TopicIdPartition, Path], followers: set[TopicIdPartition],
              then: Callable[[set[TopicIdPartition]], object] | None = None) -> bool:
        """Serve ``leaders`` (partition -> its dir; a copy job each) and ``followers``: tell the metadata manager,
        start and stop copy jobs, then call ``then(set(leaders))`` under the same lock. False when stopping. The very
        objects of the last call that served (not mutated since: a cheap discovery round hands them again) change
        nothing and are not compared.

        Raises :class:`LeadershipChangeError` when the metadata manager raised (nothing changed)."""
        with self.lock:
            if self._stopping.is_set():
                return False  # stop() holds the scheduler's locks while it waits for us: add or remove no job now
            if leaders is self._last_served[0] and followers is self._last_served[1]:
                # a cheap discovery round hands the last full round's answer again (the same objects, unchanged):
                # what it served then is served now, nothing to compare (2,000 partitions each round, issue 26)
                if then is not None:
                    then(set(leaders))
                return True
            led_now = {led.tp for led in self._led.values()}
            new_served = set(leaders) | followers
            old_served = led_now | self._followed
            try:
                if new_served - old_served or set(leaders) - led_now:
                    self._rlmm.on_partition_leadership_changes(list(leaders), list(followers))
                gone = old_served - new_served
                if gone:
                    self._rlmm.on_stop_partitions(list(gone))
            except Exception as err:
                raise LeadershipChangeError(str(err)) from err
            self._followed = set(followers)
            for key in list(self._led):
                led = self._led[key]
                if led.tp not in leaders or leaders[led.tp] != led.path:
                    self.stop_leading(key)
            for tp, path in leaders.items():
                if (tp.topic, tp.partition) not in self._led:
                    self.start_leading(tp, path)
            self._last_served = (leaders, followers)
            if then is not None:
                then(set(leaders))
        return True

    def start_leading(self, tp: TopicIdPartition, path: Path) -> Led:
        """Led here from now: its copier (a streaming offloader over it in streaming mode) and its copy job, the first
        run at once."""
        s = self.settings
        if self._staging is None or self._deleter is None:
            raise RuntimeError("a read-only sidecar leads nothing: it has no staging and no deleter")
        cancel = threading.Event()
        copier = PartitionCopier(broker_id=s.broker_id, tp=tp, partition_dir=path, rlmm=self._rlmm, rsm=self._rsm,
                                 staging=self._staging, deleter=self._deleter,
                                 watermark_path=StateDir(s.metadata.state_dir).copy_watermark(tp), cancel=cancel)
        offload = s.offload_for(tp.topic)
        offloader = None
        interval_ms = s.tasks.copy_interval_ms
        if offload.mode == "streaming":
            offloader = StreamingOffloader(copier, max_bytes=offload.offload_max_bytes, max_ms=offload.offload_max_ms)
            interval_ms = offload.poll_interval_ms
        led = Led(tp, path, copier, offloader, cancel=cancel)
        with self.lock:
            self._last_served = (None, None)  # (called outside serve too: the next serve compares again)
            self._led[(tp.topic, tp.partition)] = led
            self._led_by_path[path] = led
            self._scheduler.add_job(self.run_copy, "interval", args=[led], id=led.job_id,
                                    seconds=interval_ms / 1000, next_run_time=datetime.now(UTC),
                                    replace_existing=True)
        log.info("leading partition: copy task started", extra={
            "partition": str(tp), "path": str(path), "retention_ms": s.retention_for(tp.topic).retention_ms,
            "mode": offload.mode})
        return led

    def stop_leading(self, key: tuple[str, int]) -> None:
        """No longer led (leadership moved, the topic deleted or re-created): the copy job goes, and the copy in
        flight, if any, is cancelled at its next block (not run to its end only to be fenced: throttled, that took
        minutes) and removed by its run."""
        with self.lock:
            self._last_served = (None, None)  # (called outside serve too: the next serve compares again)
            led = self._led.pop(key)
            if self._led_by_path.get(led.path) is led:
                del self._led_by_path[led.path]
            led.stop.set()
            led.cancel.set()
            try:
                self._scheduler.remove_job(led.job_id)
            except Exception:  # noqa: BLE001 - already gone
                pass
            # The new leader copies from its own replica: drop what we staged (now, or when the running copy ends).
            if led.running.acquire(blocking=False):
                try:
                    self._release(led.tp)
                finally:
                    led.running.release()
            else:
                self._ending[led.tp] = led  # its run is still going: release_unled_staging leaves its staging to it
        _forget_gauges(led.tp)
        log.info("no longer leading: copy task stopped", extra={"partition": str(led.tp)})

    def stop(self) -> None:
        """Shutdown: no copy starts and no copy job is added or removed from now on."""
        with self.lock:
            self._stopping.set()
            for led in self._led.values():
                led.stop.set()

    # --------------------------------------------------------------------------------------------- copy job
    def run_copy(self, led: Led) -> None:
        """The copy job of ``led``: its copy run, holding ``running``; a run that ends after leadership moved
        releases the partition's staging, unless the partition is led again (a new run, of the same replica, goes
        on from it)."""
        if led.stop.is_set() or self.settings.topics.is_paused(led.tp.topic):
            return
        with led.running:
            try:
                led.changed.clear()  # a change from now on is the next run's (see sleep)
                again = self._run(led) and not self.sleep(led) and led.changed.is_set()
                # caught up, but the directory changed while the run went (its listing may predate a roll): look again
                # now rather than at the next interval, through the scheduler (rolls that follow are coalesced)
                self._run_again(led, again)
            finally:
                if led.stop.is_set() and not self._stopping.is_set() and not self.leads_again(led):
                    self._release(led.tp)
                    _forget_gauges(led.tp)  # (a run that was starting may have set them after stop_leading)

    def _run_again(self, led: Led, again: bool) -> None:
        """``again``: ask the scheduler for another run of ``led`` now (its run is going: CopyJobs runs it once the run
        ends, or ``tasks.copy_coalesce_ms`` after), unless it was asked :data:`RERUNS_ON_CHANGE` times in a row
        already (then its interval), or no longer led, or stopping."""
        with self.lock:
            if (not again or led.reruns >= RERUNS_ON_CHANGE or self._stopping.is_set() or led.stop.is_set()
                    or self._led.get((led.tp.topic, led.tp.partition)) is not led):
                led.reruns = 0
                return
            led.reruns += 1
            self._scheduler.modify_job(led.job_id, next_run_time=datetime.now(UTC))

    # ---------------------------------------------------------------------------------------- sleep, wake
    def sleep(self, led: Led) -> bool:
        """Pause ``led``'s copy job (its run found the partition caught up): no run until :meth:`wake`. Not when its
        directory changed since its run began (the run may not have seen it), it is no longer led, or stopping
        (apscheduler's shutdown would deadlock). True when paused."""
        with self.lock:
            if (self._stopping.is_set() or led.stop.is_set() or led.changed.is_set()
                    or self._led.get((led.tp.topic, led.tp.partition)) is not led):
                return False
            self._scheduler.pause_job(led.job_id)
            led.asleep = True
            return True

    def wake(self, paths: Collection[Path]) -> list[Led]:
        """The led partitions whose directory is in ``paths`` (they changed: :mod:`rlm.watch`): each is marked
        changed (a run going now looks again when it ends: :meth:`run_copy`), and a job not running now runs
        ``tasks.copy_settle_ms`` from now, sleeping or not (the scheduler's time: ``tasks.copy_coalesce_ms`` after its
        last run, when that is later; a job due earlier keeps its time, so a wake never puts a run off further).
        Returns them (nothing when stopping)."""
        if not paths:
            return []
        with self.lock:
            if self._stopping.is_set():
                return []
            # looked up by path, not a walk of every led partition (2,000) at each stage run (issue 26)
            found = (self._led_by_path.get(path) for path in dict.fromkeys(paths))
            woken = [led for led in found if led is not None and not led.stop.is_set()]
            due = datetime.now(UTC) + timedelta(milliseconds=self.settings.tasks.copy_settle_ms)
            for led in woken:
                led.changed.set()
                if led.asleep or not led.running.locked():
                    # (a run starting right now is skipped by apscheduler and rescheduled at its interval; it lists
                    # the directory after the change anyway)
                    self._scheduler.modify_job(led.job_id, next_run_time=due)
                    led.asleep = False
            return woken

    def sleeping(self) -> int:
        """How many copy jobs sleep now."""
        with self.lock:
            return sum(1 for led in self._led.values() if led.asleep)

    # -------------------------------------------------------------------------------------------- staging
    def release_unled_staging(self, leaders: set[TopicIdPartition]) -> int:
        """Drop what is staged for partitions this broker does not lead (the leader copies from its own replica):
        left by a sidecar killed while it led, or staged by a stage run that raced the loss of leadership. Not while
        a copy run of the partition, started when it was led, is still running: it releases its staging when it
        ends (:meth:`run_copy`); released under it, its copy failed on a missing file and its gap check saw what it
        had staged as deleted by the broker. Returns how many segments were released."""
        if self._staging is None:
            return 0
        running = set(self.still_running())
        n = 0
        for tp in self._staging.partitions() - leaders - running:
            released = self._release(tp)  # (its dir too: an empty one, kept for its next segment, is dropped)
            n += released
            if released:
                log.info("staged segments of a partition not led released", extra={"partition": str(tp),
                                                                                    "segments": released})
        return n

    def _release(self, tp: TopicIdPartition) -> int:
        return 0 if self._staging is None else self._staging.release_partition(tp)


def _forget_gauges(tp: TopicIdPartition) -> None:
    """Drop the copy-lag and offload gauges of a partition no longer led: the new leader's sidecar reports them; kept
    here, the last value stayed for good and per-topic sums counted the partition twice after a move."""
    for gauge in (metrics.COPY_LAG_BYTES, metrics.COPY_LAG_SEGMENTS, metrics.OFFLOAD_OPEN_SECONDS):
        try:
            gauge.remove(tp.topic, str(tp.partition))
        except KeyError:
            pass  # never set (nothing staged yet, segment mode)
    forget_held(tp)
