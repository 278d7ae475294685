"""The sidecar: wires discovery, staging, the copy tasks, expiration, the cleaner and GC onto one scheduler.

Wiring only: which partitions are led and followed, their copy jobs and the lock the jobs share are the leadership
registry's (:mod:`rlm.tasks.leadership`); a round's split of the log dirs into led, followed and skipped partitions
is :func:`rlm.discovery.classify`; readiness and liveness are :func:`rlm.health.readiness` and
:func:`rlm.health.liveness`; the metadata manager is :func:`rlm.rlmm_config.make_rlmm`'s.

Each mode runs one list of jobs, :data:`JOBS` (apscheduler 3, a thread each; every job coalesced with
``max_instances=1``, so one run at a time), and in ``normal`` mode a copy job per led partition on the copy jobs' own
scheduler (:class:`rlm.tasks.dispatch.CopyJobs`: ``tasks.copy_workers`` threads; apscheduler's dispatch of thousands
of copy jobs cost a tenth of a burst's CPU, issue 26). ``normal``:

- ``discovery`` (``tasks.discovery_interval_ms``): partitions in the log dirs x leaders in the cluster. Starts a
  copy job for each partition this broker leads, stops the ones it no longer leads (the running copy stops between
  segments), tells the metadata manager which partitions to follow (followers keep remote state current for
  reads), and purges the remote data of topics deleted on the cluster. A round is *cheap* (one Metadata request,
  the last full round's answer kept) while nothing it rests on changed: no partition directory came or went
  (:attr:`rlm.watch.LogDirWatcher.layout_version`), the leaders and replicas of the topics are the same
  (:meth:`rlm.discovery.ClusterView.metadata_fingerprint`), no deleted topic's evidence is being gathered, and the
  last full round (topics described, configs read, ``partition.metadata`` files read) is less than
  ``tasks.rescan_interval_ms`` old and its Metadata and DescribeTopics answers named the same leaders (two brokers
  may answer from two versions of the cluster's metadata: :meth:`rlm.discovery.MetadataAnswer.agrees`).
- ``copy:<topic>-<partition>`` per led partition (``tasks.copy_interval_ms``, on :class:`~rlm.tasks.dispatch.CopyJobs`):
  :class:`rlm.tasks.copier.PartitionCopier`; for a topic in streaming mode (``offload`` rules) every
  ``poll_interval_ms``: :class:`rlm.tasks.offload.StreamingOffloader`. A segment-mode job whose run found the
  partition caught up sleeps until its directory changes (:meth:`rlm.tasks.leadership.Leadership.sleep`).
- ``stage`` (the shorter of the discovery and copy intervals): the partition directories the log-dir watcher saw
  change (:mod:`rlm.watch`: inotify, and a full listing every ``tasks.rescan_interval_ms``): their newly rolled
  segments are hard-linked between copy runs, so local retention shorter than the copy interval loses nothing, and
  their sleeping copy jobs are woken. Where the topic's ``file.delete.delay.ms`` is long against this interval,
  a rolled segment is left unstaged for a while instead (half that delay at most, until retention renames it):
  the copy run that copies it first opens its files in place (:mod:`rlm.tasks.in_place`).
- ``expiration`` (``tasks.expiration_interval_ms``): remote retention from the sidecar's own settings.
- ``gc`` (``tasks.gc_interval_ms``): objects no metadata owns, after a grace period.
- ``gauges`` (every 5 s): staging bytes, metadata caught up, log dirs, retention margins.
- the cleaner (its own thread): retries deletes the store refused, from the to-be-deleted topic.

``read_only`` (reads a store and metadata topic this sidecar does not own): ``discovery`` follows every tiered
partition in the log dirs, led here or not (:meth:`Sidecar.follow`), and ``gauges`` refreshes what reads report. A
read-only sidecar constructs no writer (:data:`WRITERS`): no producer, no to-be-deleted topic, no staging (which
creates and cleans directories), no deleter, cleaner, copier, garbage collector, purge or known-partitions file;
its metadata manager has no producer either (:func:`rlm.rlmm_config.make_rlmm`). What it has: the metadata manager,
the storage manager, the reader, the cluster view and health.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from rlm import metrics
from rlm.coalesce import Coalescer
from rlm.config import SidecarSettings, TaskSettings
from rlm.discovery import ClusterView, PartitionInfo, Skip, classify, scan_log_dirs
from rlm.health import Margin, MarginCache, StoreHealth, liveness, log_dir_problems, readiness
from rlm.known import KnownPartitions
from rlm.rlmm_config import make_rlmm
from rlm.state import StateDir
from rlm.tasks.cleaner import Cleaner
from rlm.tasks.deleter import SegmentDeleter, ToBeDeletedQueue, ensure_topic
from rlm.tasks.dispatch import CopyJobs
from rlm.tasks.expiration import expire_partition
from rlm.tasks.gc import GarbageCollector
from rlm.tasks.in_place import staging_deferral_s
from rlm.tasks.leadership import Leadership, LeadershipChangeError, Led
from rlm.tasks.purge import DeletionEvidence, purge_deleted_topics, purge_partition
from rlm.tasks.staging import Staging, staging_roots
from rlm.tier import RemoteReader
from rlm.topic_ids import TopicIdFiles
from rlm.watch import LogDirWatcher
from rlmm.api import PartitionNotServedError, RemoteLogMetadataManager, TopicIdPartition
from rsm.errors import RemoteStorageError
from rsm.log.checkpoint import EpochEntry
from rsm.log.errors import LogFormatError
from rsm.log.partition import PartitionDir
from rsm.manager import RemoteStorageManager

__all__ = ["JOBS", "WRITERS", "Sidecar"]


class _SkippedRunFilter(logging.Filter):
    """apscheduler warns whenever a run is skipped because the previous one still runs. For a copy task that is
    the normal state of a backfill (the copy lag is in the metrics): not worth a warning every interval."""

    def filter(self, record: logging.LogRecord) -> bool:
        # the message's template, not the message: formatting it (the job's repr) cost more than the filter saved
        return "maximum number of running instances reached" not in str(record.msg)


logging.getLogger("apscheduler.scheduler").addFilter(_SkippedRunFilter())

log = logging.getLogger(__name__)


class Sidecar:
    """Everything ``rlm serve`` runs. ``start()`` returns at once; ``stop()`` shuts down gracefully."""

    def __init__(self, settings: SidecarSettings, *, rlmm: RemoteLogMetadataManager | None = None,
                 rsm: RemoteStorageManager | None = None) -> None:
        self.settings = settings
        s = settings
        s.metadata.state_dir.mkdir(parents=True, exist_ok=True)
        self.client_config = s.kafka.client_config()
        self._owns_rsm = rsm is None
        self.rsm = rsm or RemoteStorageManager(s.store)
        self.rlmm = rlmm or make_rlmm(s)
        self.read_only = s.mode == "read_only"
        """Reads only (``mode: read_only``): the jobs of :data:`JOBS` ``["read_only"]``, and no writer constructed."""
        self.jobs = JOBS[s.mode]
        self.view = ClusterView(self.client_config)
        # copy jobs running at once share one ListOffsets (rlm.coalesce): streaming partitions ask every poll
        self._stable_offsets: Coalescer[tuple[str, int], tuple[int, int]] = Coalescer(
            self.view.stable_offsets_and_epochs, linger_s=LIST_OFFSETS_LINGER_S)
        # (LSO, leader epoch) of copy jobs waiting for a worker, asked along with a run's start (_run_start), and
        # when they were asked: (topic, partition) -> (answer, time.monotonic() before the request)
        self._run_starts: dict[tuple[str, int], tuple[tuple[int, int], float]] = {}
        self._run_starts_lock = threading.Lock()
        self.reader = RemoteReader(self.rlmm, self.rsm)
        if not self.read_only:
            self._open_writers()
        self._scheduler = BackgroundScheduler(  # the periodic jobs of JOBS, a thread each
            executors={"default": ThreadPoolExecutor(len(self.jobs))},
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        self._copy_jobs = CopyJobs(s.tasks.copy_workers, coalesce_s=s.tasks.copy_coalesce_ms / 1000)
        """The copy jobs, one per led partition (added, paused, woken and removed by :attr:`leadership`)."""
        self.leadership = Leadership(s, self._copy_jobs, rlmm=self.rlmm, rsm=self.rsm,
                                     staging=None if self.read_only else self.staging,
                                     deleter=None if self.read_only else self.deleter, run=self._copy_run)
        """The partitions led (a copy job each) and followed, and the lock the jobs share
        (:mod:`rlm.tasks.leadership`)."""
        self.last_discovery_ok: float | None = None
        self.last_discovery_attempt: float | None = None
        self.last_error: str | None = None
        # Health (rlm.health): store requests failing in a row (probes; copies), local retention per topic
        # (retention.ms, retention.bytes from the cluster), each led partition's retention margin.
        self.store_probes = StoreHealth()
        self.store_copies = StoreHealth()
        self._local_retention: dict[str, tuple[int | None, int | None]] = {}
        # file.delete.delay.ms per topic, from the last full discovery round (absent: unknown): how long staging may
        # wait for a copy run to copy a rolled segment in place (rlm.tasks.in_place.staging_deferral_s)
        self._delete_delay_ms: dict[str, int | None] = {}
        self.margins: dict[TopicIdPartition, Margin] = {}
        self._margin_cache = MarginCache()  # each led partition's segment listing while its directory is unchanged
        metrics.MIN_RETENTION_MARGIN_SECONDS.set(s.health.min_retention_margin_ms / 1000)  # the alert's threshold
        self.log_dir_problems: dict[str, str] = log_dir_problems(s.log_dirs)
        self.watcher = LogDirWatcher(s.log_dirs, rescan_interval_s=s.tasks.rescan_interval_ms / 1000)
        """Which partition directories changed (inotify, and a rescan every ``tasks.rescan_interval_ms``)."""
        self._last_full: _FullRound | None = None  # what the last full discovery round saw (cheap rounds reuse it)
        self._topic_ids = TopicIdFiles()  # each partition dir's partition.metadata, read by full rounds when it changed
        self.full_rounds = 0
        """Discovery rounds that described every topic (the others were cheap: see the module doc)."""
        self.disagreeing_rounds = 0
        """Full rounds whose Metadata and DescribeTopics answers named other leaders (the next round was full too)."""

    # ------------------------------------------------------------------------------------------ writers
    def _open_writers(self) -> None:
        """The writers of ``normal`` mode (:data:`WRITERS`): the to-be-deleted topic (created when absent) and its
        producer, the deleter, staging (creates its directories, removes what a crash left), the known partitions,
        the deletion evidence, the garbage collector and the cleaner."""
        s = self.settings
        ensure_topic(self.client_config, s.metadata.to_be_deleted_topic, partitions=1,
                     replication_factor=s.metadata.replication_factor)
        self.queue = ToBeDeletedQueue(self.client_config, s.metadata.to_be_deleted_topic)
        self.deleter = SegmentDeleter(s.broker_id, self.rlmm, self.rsm, self.queue)
        self.staging = Staging(staging_roots(s.log_dirs, s.staging_dir), max_bytes=s.staging_max_bytes)
        state = StateDir(s.metadata.state_dir)
        self.known = KnownPartitions(state.known_partitions)
        self.deletions = DeletionEvidence(s.tasks.purge_grace_ms, s.tasks.purge_rounds)
        self.gc = GarbageCollector(self.rlmm, self.rsm, grace_ms=s.tasks.gc_grace_ms,
                                   state_path=state.gc_orphans)
        self.cleaner = Cleaner(self.client_config, s.metadata.to_be_deleted_topic, self.rlmm, self.rsm,
                               s.broker_id, deleter=self.deleter)

    def __getattr__(self, name: str) -> object:
        """Only called for an attribute the sidecar does not have: a writer of a read-only sidecar says why."""
        if name in WRITERS:
            raise AttributeError(f"a read-only sidecar (mode: read_only) has no {name}: it constructs no writer",
                                 name=name, obj=self)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}", name=name, obj=self)

    # ---------------------------------------------------------------------------------------- lifecycle
    def start(self) -> Sidecar:
        """Schedule this mode's :data:`JOBS` (the first discovery round at once), and in ``normal`` mode start the
        cleaner's thread."""
        t = self.settings.tasks
        for job in self.jobs:
            self._scheduler.add_job(types.MethodType(job.run, self), "interval", id=job.id,
                                    seconds=job.interval_ms(t) / 1000,
                                    **({"next_run_time": _now()} if job.first_run_now else {}))
        self._scheduler.start()
        self._copy_jobs.start()
        log.info("sidecar started", extra={"broker_id": self.settings.broker_id, "mode": self.settings.mode,
                                           "jobs": [job.id for job in self.jobs],
                                           "log_dirs": [str(d) for d in self.settings.log_dirs]})
        if self.read_only:
            log.warning("read-only mode: serving reads only; nothing is copied, staged, expired, deleted, "
                        "garbage-collected, purged or written to the metadata topic")
        else:
            self.cleaner.start()
        return self

    def __enter__(self) -> Sidecar:
        """``with Sidecar(settings) as sidecar:`` starts it, and stops it however the block ends."""
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout_s: float = 60.0) -> bool:
        """Stop scheduling, let in-flight copies finish their current segment, close clients.

        Waits at most ``timeout_s`` for running jobs; returns False when one was still running then (it is
        abandoned: a copy left COPY_SEGMENT_STARTED is cleaned up by the next start). ``rlm serve`` then exits
        without waiting for that thread.
        """
        if self.leadership.stopping:
            return True
        self.leadership.stop()  # after this, no job adds or removes jobs (apscheduler's shutdown would deadlock)
        # apscheduler's shutdown joins the job threads without a bound: join it with one, the copy workers' too
        deadline = time.monotonic() + timeout_s
        clean = True
        if self._scheduler.running:  # a sidecar never started has no scheduler to shut down
            shutdown = threading.Thread(target=self._scheduler.shutdown, kwargs={"wait": True}, daemon=True,
                                        name="rlm-scheduler-shutdown")
            shutdown.start()
            shutdown.join(timeout_s)
            clean = not shutdown.is_alive()
        clean = self._copy_jobs.shutdown(wait=True, timeout_s=max(0.0, deadline - time.monotonic())) and clean
        if not clean:
            # Nothing is lost (what they leave is cleaned up at the next start, as after a crash): no operator action.
            log.warning("jobs still running at shutdown: abandoned, left as after a crash for the next start",
                        extra={"timeout_s": timeout_s})
        if not self.read_only:
            self.cleaner.stop(timeout_s)
            self.queue.close()
        self.rlmm.close()
        if clean:
            self.view.close()  # no admin client left retrying a cluster that may be stopping too
        self.watcher.close()
        if self._owns_rsm:
            self.rsm.close()
        log.info("sidecar stopped", extra={"clean": clean})
        return clean

    def health(self) -> tuple[bool, dict[str, object]]:
        """Readiness (``/health``): every check of :func:`rlm.health.readiness`, each ``{"ok": bool, ...reason}``."""
        ok, checks = readiness(self.settings.health, discovery_interval_ms=self.settings.tasks.discovery_interval_ms,
                               last_discovery_ok=self.last_discovery_ok, last_error=self.last_error,
                               not_caught_up=[str(tp) for tp in self._not_caught_up(self.leadership.served())],
                               log_dir_problems=self.log_dir_problems, store_probes=self.store_probes,
                               store_copies=self.store_copies, margins=self.margins)
        leading, following = self.leadership.counts()
        # not a check (a refused copy is the local log's, not the sidecar's): where copying is held, and why
        held = {str(led.tp): {"reason": h[0], "start_offset": h[1]}
                for led in self.leadership.each_led() if (h := led.copier.held) is not None}
        return ok, {"checks": checks, "last_discovery_ok": self.last_discovery_ok, "last_error": self.last_error,
                    "leading": leading, "following": following, "copy_held": held}

    def _not_caught_up(self, served: list[TopicIdPartition]) -> list[TopicIdPartition]:
        return [tp for tp in served if not self.rlmm.is_ready(tp)]

    def liveness(self) -> tuple[bool, dict[str, object]]:
        """Liveness (``/health/live``, :func:`rlm.health.liveness`): the scheduler runs and attempted a discovery
        round lately."""
        return liveness(discovery_interval_ms=self.settings.tasks.discovery_interval_ms,
                        scheduler_running=self._scheduler.running and self._copy_jobs.running,
                        last_discovery_attempt=self.last_discovery_attempt)

    # ----------------------------------------------------------------------------------------- discovery
    def discover(self) -> None:
        """A discovery round of ``normal`` mode: partitions led here are copied (a copy job each), the others
        followed; every one served is remembered (:class:`rlm.known.KnownPartitions`), what is staged for partitions
        not led is released, and topics proven deleted are purged. A round that fails or is cut short by
        :meth:`stop` breaks the consecutive rounds of deletion evidence."""
        found = self._discovery_round()
        if found is None:
            self.deletions.reset()
            return
        leaders, followers, full = found
        if full:  # a cheap round hands the last full round's answer again: remembered then (2,000 hashed, ~0.8 ms)
            try:
                self.known.add(list(leaders) + list(followers))
            except BaseException:
                self._last_full = None  # not remembered: the next round is full and remembers them
                raise
        # What is staged for partitions not led is looked for in full rounds only: a cheap round leads what the last
        # full one led, and listing every partition's staging dir each round was 3% of a burst's CPU (issue 26). A
        # stage run that raced a loss of leadership leaves its segment until the next full round (the rescan).
        if not self._serve(leaders, followers, self.release_unled_staging if full else None):
            self.deletions.reset()
            self._last_full = None
            return
        if full:  # a cheap round is one where no known topic left the cluster's answer and no evidence is pending
            self._purge_deleted_topics()
        else:  # (a full round read every config)
            waiting = {led.tp.topic for led in self.leadership.each_led() if led.copier.deferring}
            if waiting:
                self._refresh_delete_delays(waiting)
        self.last_discovery_ok = time.time()

    def follow(self) -> None:
        """A discovery round of ``mode: read_only``: every tiered partition in the log dirs is followed, led here
        or not; none is copied, remembered or purged, and nothing is staged."""
        found = self._discovery_round()
        if found is None:
            return
        leaders, followers, _full = found
        if self._serve({}, followers | set(leaders)):
            self.last_discovery_ok = time.time()

    def _discovery_round(self) -> tuple[dict[TopicIdPartition, Path], set[TopicIdPartition], bool] | None:
        """The tiered partitions in the log dirs, as (led here -> partition dir, followed, whether this round was a
        full one), from the cluster's leaders, topic ids and configs; None when stopping or the cluster did not answer
        (logged, in /health). A cheap round (see the module doc) answers what the last full round found."""
        if self.leadership.stopping:
            return None
        s = self.settings
        self.last_discovery_attempt = time.time()
        self.log_dir_problems = log_dir_problems(s.log_dirs)
        self._probe_store()
        try:
            layout = self.watcher.poll()
            last = self._last_full
            now = time.monotonic()
            if (last is not None and layout == last.layout and now - last.at < s.tasks.rescan_interval_ms / 1000
                    and not (not self.read_only and self.deletions.pending())
                    and self.view.metadata_fingerprint(last.fingerprinted) == last.fingerprint):
                return last.leaders, last.followers, False
            local = scan_log_dirs(s.log_dirs)
            tiered = {t: s.topics.tiered(t) for t in {k[0] for k in local}}  # (a topic's patterns matched once)
            candidates = {k: v for k, v in local.items() if tiered[k[0]]}
            names = {t for t, _ in candidates}
            # before describing: a change between the two shows in the next round's fingerprint
            fingerprinted = frozenset(self._fingerprinted(names))
            metadata = self.view.metadata(fingerprinted)
            cluster: dict[tuple[str, int], PartitionInfo] = {}
            if names:
                cluster = self.view.partitions(names, skip_unauthorized=True)
            configs = self.view.topic_configs(names) if names else {}
            compaction = self.view.compaction(names, configs)
            self._local_retention = {t: (_int(c.get("retention.ms")), _int(c.get("retention.bytes")))
                                     for t, c in configs.items() if c is not None}
            self._delete_delay_ms = {t: _int(c.get("file.delete.delay.ms")) for t, c in configs.items()
                                     if c is not None}
        except Exception as err:  # noqa: BLE001 - the broker may be down: keep going, report unhealthy
            self.last_error = f"discovery: {err}"
            self._last_full = None
            log.warning("discovery failed", extra={"error": str(err)})
            return None
        found = classify(candidates, cluster, compaction, s.broker_id, self._topic_ids)
        self.full_rounds += 1
        # A partition skipped for want of an answer (not described, config unknown, no partition.metadata yet) may
        # get one next round with the same fingerprint: the next round is full too (as every round was before). So
        # is the next round after one whose two answers disagree (two brokers, one not yet past a leader election:
        # MetadataAnswer.agrees): its fingerprint may be the new leaders' while it acted on the old ones.
        agreed = metadata.agrees(cluster, names)
        if not agreed:
            self.disagreeing_rounds += 1
            log.info("discovery: the cluster's answers disagree on leaders (brokers at different metadata versions): "
                     "the next round is full too")
        self._last_full = None if not agreed or any(why in _UNANSWERED for why in found.skipped.values()) else \
            _FullRound(now, layout, metadata.fingerprint, fingerprinted, frozenset(names), found.leaders,
                       found.followers)
        return found.leaders, found.followers, True

    def _fingerprinted(self, names: Iterable[str]) -> set[str]:
        """The topics whose metadata a cheap round compares: the tiered ones in the log dirs, and every topic once
        served (a deleted one leaves the answer, and the next round is full: the deleted-topic check runs)."""
        return set(names) | ({tp.topic for tp in self.known.all()} if not self.read_only else set())

    def _serve(self, leaders: dict[TopicIdPartition, Path], followers: set[TopicIdPartition],
               then: Callable[[set[TopicIdPartition]], object] | None = None) -> bool:
        """:meth:`Leadership.serve <rlm.tasks.leadership.Leadership.serve>`: False when stopping or the metadata
        manager failed (a warning, ``last_error`` in /health; the next round does it again)."""
        try:
            return self.leadership.serve(leaders, followers, then)
        except LeadershipChangeError as err:  # e.g. a metadata partition's offsets not readable while a broker restarts
            self.last_error = f"discovery: metadata manager: {err}"
            log.warning("discovery failed: metadata manager", extra={"error": str(err)})
            return False

    def release_unled_staging(self, leaders: set[TopicIdPartition]) -> int:
        """:meth:`Leadership.release_unled_staging <rlm.tasks.leadership.Leadership.release_unled_staging>`: what
        is staged for partitions not led, unless a copy run of it still goes. Returns how many segments were
        released."""
        return self.leadership.release_unled_staging(leaders)

    # ---------------------------------------------------------------------------------------------- copy
    def _leader_epoch(self, led: Led) -> tuple[int, int] | None:
        """(LSO, leader epoch) when this broker leads ``led`` now (:meth:`_leading`)."""
        leading = self._leading(led)
        return None if leading is None else leading[:2]

    def _cluster_epoch(self, led: Led, *, linger: bool = False) -> tuple[int, int] | None:
        """(LSO, leader epoch) as the partition's leader answers now, while ``led`` is still the registry's.
        ``linger``: a copy run's (its fence), whose request may wait for others' (:data:`LIST_OFFSETS_LINGER_S`)."""
        key = (led.tp.topic, led.tp.partition)
        got = self._stable_offsets.get([key], linger=linger).get(key)
        return None if got is None or self.leadership.get(*key) is not led else got

    def _run_start(self, led: Led) -> tuple[int, int] | None:
        """(LSO, leader epoch) for the start of a copy run of ``led``, as :meth:`_cluster_epoch` answers, from a request
        sent at most :data:`RUN_START_MAX_AGE_S` ago: one made for it at the start of another run while its job
        waited for a worker, or one made now, which also asks for up to :data:`RUN_START_AHEAD` other copy jobs
        waiting (:meth:`rlm.tasks.dispatch.CopyJobs.due_args`), for their runs to take.

        In a burst the copy jobs wait in a backlog: each run's start asked the cluster alone (the Coalescer shares a
        request only among the runs asking at the same moment: 1.5 partitions a request), so a burst's copy runs made
        0.8 ListOffsets a segment, 0.09-0.14 ms a segment of the admin client's thread besides the asking (issue 26;
        500 partitions rolling 1,500 segments at once, side by side, one run at load 2.9-3.9: 0.46 against 0.89
        requests a segment, 3.75 against 4.15 ms of the sidecar's CPU a segment). A run's start needs no newer answer:
        the LSO only bounds what it copies (an older one is lower, so less is copied
        and the next run copies the rest), and the leader epoch its copies carry is checked again after each batch's
        copies, by a request sent then (the fence, :meth:`_copy_run`), as against an epoch that moves during a run.
        The answer was asked after the job was due (its directory changed before), so it covers the rolls that woke
        it; one woken again since is run again (:meth:`rlm.tasks.leadership.Leadership.run_copy`)."""
        key = (led.tp.topic, led.tp.partition)
        with self._run_starts_lock:
            got = self._run_starts.pop(key, None)
        if got is not None and time.monotonic() - got[1] <= RUN_START_MAX_AGE_S:
            answer: tuple[int, int] | None = got[0]
        else:
            asked = time.monotonic()
            with self._run_starts_lock:
                fresh = {k for k, (_a, at) in self._run_starts.items() if asked - at <= RUN_START_MAX_AGE_S}
            ahead = [k for args in self._copy_jobs.due_args(RUN_START_AHEAD)
                     if args and isinstance(x := args[0], Led) and (k := (x.tp.topic, x.tp.partition)) != key
                     and k not in fresh]
            answers = self._stable_offsets.get([key, *ahead], linger=True)
            with self._run_starts_lock:
                for k in [k for k, (_a, at) in self._run_starts.items() if asked - at > RUN_START_MAX_AGE_S]:
                    del self._run_starts[k]  # (jobs removed, or run by then with an answer of their own)
                for k in ahead:
                    if k in answers:
                        self._run_starts[k] = (answers[k], asked)
            answer = answers.get(key)
        return None if answer is None or self.leadership.get(*key) is not led else answer

    def _leading(self, led: Led, *, run_start: bool = False) -> tuple[int, int, list[EpochEntry]] | None:
        """(LSO, leader epoch, this broker's leader-epoch checkpoint) when this broker leads ``led`` now: the
        cluster's leader answers with an epoch that is the newest in this broker's own checkpoint (the broker
        writes it when made leader). An answer without an epoch (seen around elections) is no proof: None (no copy
        this round; a copy waiting to finish is deleted and done again later). ``run_start``: for a copy run's
        start, the answer of :meth:`_run_start`."""
        got = self._run_start(led) if run_start else self._cluster_epoch(led)
        if got is None:
            return None
        epochs = PartitionDir(led.path).leader_epochs()
        if not epochs or epochs[-1].epoch != got[1]:
            log.info("not leading under the cluster's leader epoch: not copying this round", extra={
                "partition": str(led.tp), "leader_epoch": got[1],
                "local_epoch": epochs[-1].epoch if epochs else None})
            return None
        return got[0], got[1], epochs

    def _copy_run(self, led: Led) -> bool:
        """One copy run of ``led``; True when it ended with the partition caught up (segment mode: every rolled
        segment tiered, nothing staged; :meth:`PartitionCopier.caught_up`): its job may sleep until the directory
        changes."""
        tp = led.tp
        try:
            try:
                self._wait_ready([tp])
            except PartitionNotServedError:
                if led.stop.is_set():
                    return False  # no longer led: discovery stopped serving it while this run waited
                raise
            got = self._leading(led, run_start=True)
            if got is None or led.stop.is_set():
                return False  # leadership lost while waiting (up to 30 s for the cache): a stale run does nothing
            lso, epoch, epochs = got

            def current_epoch() -> int | None:
                # The fence before COPY_SEGMENT_FINISHED: the cluster's leader epoch now, and the registry still
                # leading. The local checkpoint is not read again: it was checked against ``epoch`` above, and its
                # newest epoch changes only when this broker is made leader under a new epoch, which the cluster's
                # answer then shows (issue 26: a checkpoint read per fence, nine system calls).
                now = self._cluster_epoch(led, linger=True)
                return None if now is None else now[1]

            rule = self.settings.retention_for(tp.topic)
            led.copier.defer_staging_s = self._staging_deferral_s(led)
            led.copier.min_max_timestamp_ms = (int(time.time() * 1000) - rule.retention_ms
                                               if rule.retention_ms >= 0 else None)
            task = led.offloader if led.offloader is not None else led.copier
            result = task.run_once(lso, led.stop, leader_epoch=epoch, current_leader_epoch=current_epoch,
                                   epochs=epochs)
            self.store_copies.ok()
            return (task is led.copier and not result.fenced and not result.cancelled and not led.stop.is_set()
                    and led.copier.caught_up())
        except Exception as err:  # noqa: BLE001 - logged, counted; the next run retries
            if led.cancel.is_set():
                # the partition went away under the run (its directory deleted with its topic, leadership moved):
                # what failed was cut short by that, not a fault; the new leader or the purge takes over
                log.info("copy run ended early: the partition is no longer led here", extra={
                    "partition": str(tp), "error": str(err)})
                return False
            if isinstance(err, RemoteStorageError) or isinstance(err.__cause__, RemoteStorageError):
                self.store_copies.failed(err)
            metrics.ERRORS.labels("copy-task").inc()
            self.last_error = f"copy {tp}: {err}"
            log.exception("copy task failed", extra={"partition": str(tp)})
            return False

    def _staging_deferral_s(self, led: Led) -> float | None:
        """How long ``led``'s rolled segments may wait unstaged (:func:`rlm.tasks.in_place.staging_deferral_s` of its
        topic's ``file.delete.delay.ms``; None, staged at once: unknown, short, or a streaming offloader's)."""
        if led.offloader is not None:
            return None
        return staging_deferral_s(self._delete_delay_ms.get(led.tp.topic), stage_interval_ms(self.settings.tasks))

    def _refresh_delete_delays(self, topics: set[str]) -> None:
        """``file.delete.delay.ms`` of ``topics`` (those with segments waiting unstaged) read again, by each cheap
        discovery round while they wait: a delay lowered since the last full round (a minute at most) has them
        staged at the next stage round, not after the next full one. A topic whose config is not read counts as
        unknown (staged at once). One DescribeConfigs call a round, only while segments wait; on the discovery
        thread, which waits on the cluster anyway, never on the stage job's."""
        try:
            configs = self.view.topic_configs(topics)
        except Exception as err:  # noqa: BLE001 - unknown: what waits is staged at once
            log.info("topic configs not read: segments waiting for a copy in place are staged", extra={
                "topics": sorted(topics), "error": str(err)})
            configs = dict.fromkeys(topics)
        delays = dict(self._delete_delay_ms)
        for topic in topics:
            config = configs.get(topic)
            delay = _int(config.get("file.delete.delay.ms")) if config is not None else None
            if delay is None:
                delays.pop(topic, None)
            else:
                delays[topic] = delay
        self._delete_delay_ms = delays

    def _wait_ready(self, tps: list[TopicIdPartition]) -> None:
        """Block until the metadata cache has caught up for ``tps`` (raises when it does not within 30 s)."""
        self.rlmm.wait_ready(tps, timeout_s=30)

    # ------------------------------------------------------------------------------------------- staging
    def stage(self) -> None:
        """The led partitions whose directory changed (:meth:`LogDirWatcher.changes <rlm.watch.LogDirWatcher.changes>`):
        their sleeping copy jobs woken, their newly rolled segments hard-linked (between copy runs: see
        stage_rolled), and those with rolled segments left unstaged for a copy in place that waited long enough
        (changed or not, :mod:`rlm.tasks.in_place`); paused topics are not staged (they are not copied either)."""
        changes = self.watcher.changes()
        woken = self.leadership.wake(changes.partitions)
        seen = {id(led) for led in woken}
        # (a waiting segment renamed by retention shows as a change; one waited long enough is looked for without
        # a listing: a listing of every waiting partition each round was as dear as the staging it saves, issue 26)
        waiting = [led for led in self.leadership.each_led() if led.copier.deferring and id(led) not in seen
                   and led.copier.staging_due(self._staging_deferral_s(led))]
        for led in [*woken, *waiting]:
            if self.settings.topics.is_paused(led.tp.topic):
                continue
            try:
                led.copier.defer_staging_s = self._staging_deferral_s(led)
                # (the watcher's listing of the dir, made as it read the events: not listed again, issue 26)
                led.copier.stage_rolled(changes.listings.get(led.path))
            except Exception as err:  # noqa: BLE001 - the copy run stages too, and reports
                if isinstance(err, FileNotFoundError) and not led.path.exists():
                    # Its directory is gone with its topic (deleted, or the replica moved): the next discovery round
                    # stops leading it. Normal in a cluster: not an error, not /health's last error.
                    log.info("staging skipped: the partition's directory is gone", extra={
                        "partition": str(led.tp), "path": str(led.path)})
                    continue
                self.last_error = f"staging {led.tp}: {err}"
                log.warning("staging failed", extra={"partition": str(led.tp), "error": str(err)})

    # ---------------------------------------------------------------------------------------- expiration
    def expire(self) -> None:
        for led in self.leadership.each_led():
            try:
                # Never on a half-rebuilt metadata cache (after a restart): its oldest segments may not be the
                # partition's oldest, and retention would delete from the middle of the remote range.
                self._wait_ready([led.tp])
                # Only while leading under the cluster's epoch: a broker that lost leadership and does not know
                # yet would judge segments by a stale lineage.
                if self._leader_epoch(led) is None:
                    continue
                pdir = PartitionDir(led.path)
                try:
                    same = pdir.topic_id == led.tp.topic_id
                except (FileNotFoundError, NotADirectoryError):
                    same = False
                if not same:
                    # The directory is gone, or is another incarnation's (the topic deleted and re-created under its
                    # name): its checkpoint is not this partition's lineage. The next discovery round stops leading
                    # it; a deleted topic's segments are the purge's.
                    log.info("expiration skipped: the partition's directory is not this topic id's", extra={
                        "partition": str(led.tp), "path": str(led.path)})
                    continue
                expire_partition(self.rlmm, self.deleter, led.tp, self.settings.retention_for(led.tp.topic),
                                 local_epochs=pdir.leader_epochs())
            except Exception as err:  # noqa: BLE001
                if led.cancel.is_set():  # the partition went away under the run: not a fault
                    log.info("expiration ended early: the partition is no longer led here", extra={
                        "partition": str(led.tp), "error": str(err)})
                    continue
                metrics.ERRORS.labels("expiration").inc()
                self.last_error = f"expiration {led.tp}: {err}"
                log.exception("expiration failed", extra={"partition": str(led.tp)})

    # ------------------------------------------------------------------------------------------------ gc
    def collect_garbage(self, dry_run: bool = False) -> list[str]:
        gc = self.gc  # a read-only sidecar has none: AttributeError (not a failed run)
        tps = self.leadership.led_partitions()
        try:
            self._wait_ready(tps)  # a half-rebuilt cache would make live segments look orphaned
            return gc.run(tps, dry_run=dry_run)
        except Exception as err:  # noqa: BLE001
            metrics.ERRORS.labels("gc").inc()
            self.last_error = f"gc: {err}"
            log.exception("gc failed")
            return []

    # ---------------------------------------------------------------------------------- deleted topics
    def _purge_deleted_topics(self) -> None:
        """Partitions we once served whose topic id is proven deleted on the cluster: purged (rlm.tasks.purge)."""
        purge_deleted_topics(self.known, self.view, self.deletions, self.purge_partition)

    def purge_partition(self, tp: TopicIdPartition) -> bool:
        """Purge ``tp``'s remote data through the partition-delete states, and release what staging holds of it.
        Not while a copy run of ``tp`` still goes: it is cancelled, and the purge waits for a later round (False),
        so it neither releases the staged files under the copy nor deletes a segment the copy then finishes."""
        running = self.leadership.copy_running(tp)
        if running is not None:
            running.cancel.set()
            log.info("purge of a deleted topic's partition waits for its copy run to end", extra={"partition": str(tp)})
            return False
        purge_partition(self.rlmm, self.deleter, tp, self.settings.broker_id,
                        release_staging=self.staging.release_partition)
        return True

    def _refresh_gauges(self) -> None:
        """``normal`` mode's gauges: staging, what reads report, retention margins."""
        metrics.STAGING_BYTES.set(self.staging.held_bytes())  # (each segment's bytes counted once, not walked)
        self._refresh_read_gauges()
        self._refresh_margins()

    def _refresh_read_gauges(self) -> None:
        """What reads report (``mode: read_only``'s gauges): partitions not caught up, log dirs."""
        metrics.METADATA_NOT_CAUGHT_UP.set(len(self._not_caught_up(self.leadership.served())))
        for d in self.settings.log_dirs:
            metrics.LOG_DIR_OK.labels(str(d)).set(0 if str(d) in self.log_dir_problems else 1)

    def _refresh_margins(self) -> None:
        """Each led partition's retention margin (:func:`rlm.health.retention_margin`, listings kept while a directory
        is unchanged: :class:`rlm.health.MarginCache`), as gauges."""
        margins: dict[TopicIdPartition, Margin] = {}
        staged: dict[TopicIdPartition, list[int]] | None = None  # walked when a partition's margin needs it
        # Topics whose local retention deletes something: the others' partitions have nothing at risk, whatever is
        # tiered, and are not listed (every 5 s, a listing of each directory that changed: in a burst, every one,
        # issue 26); an unknown retention counts as none, as in rlm.health.retention_margin.
        limited = {t: r for t, r in self._local_retention.items() if not (_unlimited(r[0]) and _unlimited(r[1]))}
        previous = self.margins
        for led in self.leadership.each_led():
            tp = led.tp
            retention = limited.get(tp.topic)
            if retention is None:
                m = _NOTHING_AT_RISK
            else:
                if staged is None:
                    staged = {}
                    for x in self.staging.staged():  # one walk of the staging area, not one look per led partition
                        staged.setdefault(x.tp, []).append(x.base_offset)
                held = staged.get(tp, [])
                if led.copier.deferring:  # (left unstaged for a copy in place: staged at retention's rename)
                    held = [*held, *led.copier.deferred_bases()]
                try:
                    m = self._margin_cache.margin(led.path, led.copier.tiered_offset, held,
                                                  retention_ms=retention[0], retention_bytes=retention[1])
                except (FileNotFoundError, LogFormatError):
                    continue  # the partition dir went away (moved, deleted): the next discovery round says
            margins[tp] = m
            if previous.get(tp) != m:  # (set when it changed: two label lookups per led partition every 5 s)
                metrics.RETENTION_MARGIN_SECONDS.labels(tp.topic, str(tp.partition)).set(m.seconds)
                metrics.RETENTION_MARGIN_BYTES.labels(tp.topic, str(tp.partition)).set(m.bytes)
        for tp in previous.keys() - margins.keys():
            for gauge in (metrics.RETENTION_MARGIN_SECONDS, metrics.RETENTION_MARGIN_BYTES):
                try:
                    gauge.remove(tp.topic, str(tp.partition))
                except KeyError:
                    pass
        self.margins = margins
        self._margin_cache.keep_only(led.path for led in self.leadership.each_led())

    def _probe_store(self) -> None:
        try:
            self.rsm.probe()
        except Exception as err:  # noqa: BLE001 - any failure to answer counts
            self.store_probes.failed(err)
            log.warning("store probe failed", extra={"error": str(err),
                                                     "in_a_row": self.store_probes.consecutive_failures})
        else:
            self.store_probes.ok()


LIST_OFFSETS_LINGER_S = 0.003
"""While ListOffsets requests follow each other, how long the next one of a copy run (its start or a fence) waits for
other askers to go out with it (:class:`rlm.coalesce.Coalescer`; the expiration job, asking for one partition after
another, does not wait). 500 partitions rolling 1,500 segments at once, side by side with 0 (one run, load 2.2-3.5):
0.32 against 0.50 requests a segment, 3.39 against 3.57 ms of CPU a segment (issue 26)."""
RUN_START_AHEAD = 64
"""How many copy jobs waiting for a worker a run's start asks the cluster for too (:meth:`Sidecar._run_start`)."""
RUN_START_MAX_AGE_S = 5.0
"""How old an answer asked ahead for a copy run's start may be when the run takes it (:meth:`Sidecar._run_start`)."""

_UNANSWERED = frozenset({Skip.NOT_DESCRIBED, Skip.CONFIG_UNKNOWN, Skip.NO_PARTITION_METADATA})
"""Skips that the next round may answer otherwise without a change in the metadata fingerprint or the log dirs."""


@dataclass(frozen=True, slots=True)
class _FullRound:
    """What a full discovery round saw, and the answer it gave (a cheap round gives it again)."""

    at: float  # time.monotonic()
    layout: int  # the watcher's layout_version
    fingerprint: int  # ClusterView.metadata_fingerprint of ``fingerprinted``
    # the topics it hashes (the tiered ones in the log dirs and every one once served): a cheap round hashes the same
    # ones (not the known partitions listed and sorted again every round: 4% of a burst's GIL samples, issue 26)
    fingerprinted: frozenset[str]
    names: frozenset[str]  # the tiered topics in the log dirs
    leaders: dict[TopicIdPartition, Path]
    followers: set[TopicIdPartition]


@dataclass(frozen=True, slots=True)
class Job:
    """A scheduler job of the sidecar: ``run(sidecar)`` every ``interval_ms(settings.tasks)``, the first run at
    start when ``first_run_now``, else one interval later."""

    id: str
    run: Callable[[Sidecar], object]
    interval_ms: Callable[[TaskSettings], float]
    first_run_now: bool = False


def _every_5_s(_t: TaskSettings) -> float:
    return 5000


def stage_interval_ms(t: TaskSettings) -> int:
    """The stage job's interval: the shorter of the discovery and copy intervals."""
    return min(t.discovery_interval_ms, t.copy_interval_ms)


JOBS: dict[str, tuple[Job, ...]] = {
    "normal": (
        Job("discovery", Sidecar.discover, lambda t: t.discovery_interval_ms, first_run_now=True),
        Job("stage", Sidecar.stage, stage_interval_ms),
        Job("expiration", Sidecar.expire, lambda t: t.expiration_interval_ms),
        Job("gc", Sidecar.collect_garbage, lambda t: t.gc_interval_ms),
        Job("gauges", Sidecar._refresh_gauges, _every_5_s),
    ),
    "read_only": (
        Job("discovery", Sidecar.follow, lambda t: t.discovery_interval_ms, first_run_now=True),
        Job("gauges", Sidecar._refresh_read_gauges, _every_5_s),
    ),
}
"""The scheduler jobs of each mode (``SidecarSettings.mode``). ``normal`` mode also adds a copy job per partition
it leads (:meth:`Sidecar.discover`) and runs the cleaner's thread."""

WRITERS = frozenset({"queue", "deleter", "staging", "known", "deletions", "gc", "cleaner"})
"""The sidecar's attributes that write (the to-be-deleted topic's producer, the deletes, staging's directories,
state files, the purge's evidence): constructed in ``normal`` mode only (:meth:`Sidecar._open_writers`)."""


_NOTHING_AT_RISK = Margin(math.inf, math.inf, None)
"""The margin of a partition whose local retention deletes nothing."""


def _unlimited(retention: int | None) -> bool:
    """A local retention (``retention.ms`` or ``retention.bytes``) that deletes nothing: -1, or unknown (None: the
    margin counts an unknown retention as none, :func:`rlm.health.retention_margin`)."""
    return retention is None or retention < 0


def _int(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _now():
    from datetime import datetime

    return datetime.now(UTC)
