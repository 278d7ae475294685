"""The copy path's own cost per segment, without a broker: where a rolled segment's CPU goes (issue 26).

    .venv/bin/python bench/bench_copy_path.py [--partitions 300] [--segments 3] [--per-run 1] [--dir /tmp]
    .venv/bin/python bench/bench_copy_path.py --syscalls       # also count system calls per segment (strace -f -c)
    .venv/bin/python bench/bench_copy_path.py --checkout DIR   # another checkout's code (git archive <commit>)
    .venv/bin/python bench/bench_copy_path.py --profile 40     # the copy loop's 40 costliest functions (cProfile)
    mkfifo ctl ack; BENCH_PERF_CTL=ctl BENCH_PERF_ACK=ack perf record -g --control fifo:ctl,ack -D -1 -- \
        .venv/bin/python bench/bench_copy_path.py                # kernel and C stacks of the copy phase alone

``--partitions`` crafted partition dirs (:func:`tests.support.batches.write_partition`) of ``--segments`` rolled
segments of 64 KiB (eight batches of eight 1,000-byte records) and an active one, copied by
:class:`rlm.tasks.copier.PartitionCopier` as ``rlm serve`` does in a burst: the stage job's staging
(:meth:`~rlm.tasks.copier.PartitionCopier.stage_rolled`), then a copy run (``run_once``) and the caught-up check,
partition after partition, one segment per run (``--per-run 0``: every segment in one run). One thread; the
in-memory metadata manager (no Kafka: the metadata topic's and ListOffsets' share is ``bench_scale``'s to measure);
the filesystem store with fsync on, staging and the copy watermark as the sidecar has them, all under ``--dir``.

Prints the process's CPU per segment (user / system) and the thread CPU (``time.thread_time``) of each part of the
path per segment; with ``--syscalls`` the system calls per segment by name (the same run under ``strace -f -c``, minus
a run that only builds the partitions). The CPU figures swing with the machine's load (inode creation and fsync
cost most on a busy ext4); the system call counts do not: compare two checkouts by them, and by CPU side by side.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECORD_BYTES = 1000
BATCHES = 8  # per segment, of eight records each: 64 KiB of records
OFFSETS_PER_SEGMENT = BATCHES * 8

PARTS = [  # (label, module, class, method): the parts of the path timed
    ("Staging.stage_many (the stage job's and the run's)", "rlm.tasks.staging", "Staging", "stage_many"),
    ("Staging.stage (before stage_many: per segment)", "rlm.tasks.staging", "Staging", "stage"),
    ("stage job: stage_rolled", "rlm.tasks.copier", "PartitionCopier", "stage_rolled"),
    ("copy run: run_once (all)", "rlm.tasks.copier", "PartitionCopier", "run_once"),
    ("  clean-up of unfinished copies", "rlm.tasks.copier", "PartitionCopier", "clean_up_unfinished"),
    ("  prepare (max timestamp, txn index)", "rlm.tasks.copier", "PartitionCopier", "_prepare"),
    ("  store copy (all)", "rsm.manager", "RemoteStorageManager", "copy_log_segment_data"),
    ("    store puts", "rsm.store.fs", "FileSystemStore", "_put"),
    ("  release of staging", "rlm.tasks.staging", "Staging", "release"),
    ("  copy watermark", "rlm.tasks.copier", "PartitionCopier", "write_watermark"),
    ("caught_up check", "rlm.tasks.copier", "PartitionCopier", "caught_up"),
]


def _timed(acc: collections.Counter[str], label: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[label] += time.thread_time() - t
    return wrapper


def _perf_control(command: str) -> None:
    """``perf record --control fifo:CTL,ACK -D -1`` samples the copy phase alone (the partitions' set-up excluded),
    with ``BENCH_PERF_CTL=CTL BENCH_PERF_ACK=ACK`` in the environment: "enable" before it, "disable" after."""
    ctl, ack = os.environ.get("BENCH_PERF_CTL"), os.environ.get("BENCH_PERF_ACK")
    if ctl and ack:
        with open(ctl, "w") as c:
            c.write(command + "\n")
        with open(ack) as a:
            a.readline()


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Build the partitions, copy them (unless ``--setup-only``); the CPU per segment and per part."""
    sys.path.insert(0, str(args.checkout))
    import importlib

    acc: collections.Counter[str] = collections.Counter()
    if not args.child:  # (timing costs a clock_gettime per call: not when counting system calls)
        for label, module, cls, method in PARTS:
            klass = getattr(importlib.import_module(module), cls)
            if hasattr(klass, method):  # (another checkout's code may not have it: Staging.stage_many)
                setattr(klass, method, _timed(acc, label, getattr(klass, method)))
        fsync = os.fsync
        os.fsync = _timed(acc, "fsync, all of them", fsync)  # type: ignore[assignment]

    root = Path(tempfile.mkdtemp(prefix="bench-copy-path-", dir=args.dir))
    try:
        return _copy_all(args, root, acc)
    finally:
        if not args.child:  # (a child's --dir is its parent's to remove: no system call of the removal counted)
            shutil.rmtree(root, ignore_errors=True)


def _broker_indexes(pdir: Path, base: int) -> None:
    """A rolled segment's ``.index`` and ``.timeindex`` as the broker leaves them (:class:`KafkaIndexBuilder`: the
    time index holds the roll's entry at least). ``write_partition`` leaves them empty, and the copy then took the
    segment's max timestamp from a scan of its ``.log`` (``PartitionCopier._max_timestamp``), which a broker's
    segment never needs: ~0.3 ms of "prepare" a segment that no burst pays."""
    from rsm.log.batch import scan_batches
    from rsm.log.indexes import KafkaIndexBuilder

    builder = KafkaIndexBuilder(base)
    for h in scan_batches(pdir / f"{base:020d}.log"):
        builder.add(h, h.position)
    (pdir / f"{base:020d}.index").write_bytes(builder.offset_index())
    (pdir / f"{base:020d}.timeindex").write_bytes(builder.time_index())


def _copy_all(args: argparse.Namespace, root: Path, acc: collections.Counter[str]) -> dict[str, Any]:
    from rlm.tasks.copier import PartitionCopier
    from rlm.tasks.deleter import SegmentDeleter
    from rlm.tasks.staging import Staging
    from rlmm.api import TopicIdPartition
    from rsm.manager import RemoteStorageManager, RsmConfig
    from tests.support.batches import batch, write_partition
    from tests.support.rlmm import SyncRlmm

    rlmm = SyncRlmm()
    rsm = RemoteStorageManager(RsmConfig(store="fs", root_path=root / "remote", fsync=True))
    log_dir = root / "logs"
    staging = Staging({log_dir: root / "staging"})
    value = b"x" * RECORD_BYTES
    copiers = []
    for p in range(args.partitions):
        tp = TopicIdPartition(uuid.uuid4(), f"t{p % 20}", p)
        segments = {base: [batch(base + 8 * i, [value] * 8) for i in range(BATCHES)]
                    for base in range(0, OFFSETS_PER_SEGMENT * (args.segments + 1), OFFSETS_PER_SEGMENT)}
        pdir = log_dir / f"{tp.topic}-{tp.partition}"
        write_partition(pdir, tp.topic_id, segments)
        for base in list(segments)[:-1]:
            _broker_indexes(pdir, base)
        copiers.append(PartitionCopier(broker_id=1, tp=tp, partition_dir=pdir, rlmm=rlmm, rsm=rsm, staging=staging,
                                       deleter=SegmentDeleter(1, rlmm, rsm, None),
                                       watermark_path=root / "watermarks" / f"{tp.topic_id}-{tp.partition}"))
    if args.setup_only:
        return {}
    acc.clear()
    profiler = None
    if args.profile:
        import cProfile
        profiler = cProfile.Profile(time.thread_time)  # CPU, not wall: fsync waits are not CPU
        profiler.enable()
    _perf_control("enable")
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    copied = 0
    rounds = [None] if args.per_run == 0 else list(range(args.segments))
    for r in rounds:
        for c in copiers:
            if c._highest is None:  # noqa: SLF001 - as the first copy run leaves it: stage_rolled stages from there
                c._highest = -1  # noqa: SLF001
            c.stage_rolled()
            lso = 10**12 if r is None else OFFSETS_PER_SEGMENT * (r + 1)  # one more segment below it per round
            copied += len(c.run_once(lso, leader_epoch=0, current_leader_epoch=lambda: 0).copied)
            c.caught_up()
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    _perf_control("disable")
    if profiler is not None:
        import pstats
        profiler.disable()
        stats = pstats.Stats(profiler).sort_stats(args.profile_sort)
        stats.print_stats(args.profile)
        if args.profile_callers:
            stats.print_callers(args.profile_callers)
    return {"segments": copied, "user_ms": 1000 * (r1.ru_utime - r0.ru_utime) / copied,
            "system_ms": 1000 * (r1.ru_stime - r0.ru_stime) / copied, "wall_ms": 1000 * (t1 - t0) / copied,
            "parts": {k: 1000 * v / copied for k, v in acc.items()}}


def syscalls(args: argparse.Namespace) -> dict[str, float]:
    """System calls per segment by name: this script under ``strace -f -c``, minus a run that only builds."""
    def count(extra: list[str]) -> collections.Counter[str]:
        with tempfile.NamedTemporaryFile("r", suffix=".strace") as out, \
                tempfile.TemporaryDirectory(prefix="bench-copy-path-", dir=args.dir) as work:
            cmd = ["strace", "-f", "-c", "-o", out.name, sys.executable, __file__, "--child",
                   "--partitions", str(args.partitions), "--segments", str(args.segments), "--per-run",
                   str(args.per_run), "--dir", work, "--checkout", str(args.checkout), *extra]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            calls: collections.Counter[str] = collections.Counter()
            for line in out.read().splitlines():
                parts = line.split()
                if len(parts) >= 5 and parts[0][0].isdigit() and parts[-1] != "total":
                    calls[parts[-1]] = int(parts[3])
            return calls
    full, setup = count([]), count(["--setup-only"])
    n = args.partitions * args.segments
    return {k: (full[k] - setup.get(k, 0)) / n for k in full if full[k] > setup.get(k, 0)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, default=300)
    ap.add_argument("--segments", type=int, default=3, help="rolled segments per partition")
    ap.add_argument("--per-run", type=int, default=1, choices=(0, 1),
                    help="1: one segment per copy run, as a burst's rolls wake the copy jobs; 0: all in one run")
    ap.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()), help="where the files go (its fs)")
    ap.add_argument("--checkout", type=Path, default=ROOT, help="the code to measure (default: this checkout)")
    ap.add_argument("--syscalls", action="store_true", help="count system calls per segment (strace)")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="print the copy loop's N costliest functions (cProfile; its overhead inflates the CPU)")
    ap.add_argument("--profile-sort", default="tottime", help="the cProfile sort key (tottime, cumulative)")
    ap.add_argument("--profile-callers", default="", help="with --profile: the callers of the functions matching this")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--setup-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.checkout = args.checkout.resolve()
    r = run(args)
    if args.child:
        return
    print(f"{r['segments']:,} segments ({args.partitions} partitions x {args.segments}, "
          f"{'one per run' if args.per_run else 'all in one run'}), code of {args.checkout}, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"  process CPU per segment: {r['user_ms'] + r['system_ms']:.3f} ms (user {r['user_ms']:.3f}, system "
          f"{r['system_ms']:.3f}); wall {r['wall_ms']:.3f} ms")
    print("  thread CPU per segment, by part (nested parts indented, counted in their parent too):")
    for label, _m, _c, _meth in PARTS:
        print(f"    {label:<46} {r['parts'].get(label, 0.0):7.3f} ms")
    print(f"    {'fsync, all of them':<46} {r['parts'].get('fsync, all of them', 0.0):7.3f} ms")
    if args.syscalls:
        calls = syscalls(args)
        top = sorted(calls.items(), key=lambda kv: -kv[1])
        print(f"  system calls per segment: {sum(calls.values()):.1f} (" +
              ", ".join(f"{k} {v:.1f}" for k, v in top[:14]) + ")")


if __name__ == "__main__":
    main()
