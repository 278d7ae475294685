"""The copy path's metadata writes alone: CPU per segment of COPY_SEGMENT_STARTED and COPY_SEGMENT_FINISHED written
by concurrent copy workers, as in a burst where thousands of partitions roll at once (issue 26).

    .venv/bin/python bench/bench_rlmm_writes.py [--partitions 500] [--segments 3] [--workers 6]
    .venv/bin/python bench/bench_rlmm_writes.py --baseline /tmp/h4base --rounds 3

One broker (``devtools.devkafka``), then per round a child process (its CPU is its own) with one
:class:`rlmm.topic_manager.TopicBasedRemoteLogMetadataManager` on a metadata topic of its own (10 partitions, as
the sidecar's bench config) serving ``--partitions`` user partitions. ``--workers`` threads take the partitions'
segments from one queue, each as a copy run of one segment does: the partition's listing (the run's clean-up),
COPY_SEGMENT_STARTED (one write), the store's copy (``--copy-ms`` of sleep: the GIL let go, as the store's
system calls do), the partition's listing again (the fence reads none: a ListOffsets), COPY_SEGMENT_FINISHED (one
write). What is measured: the child's CPU from the first write to the last (user / system, by thread kind: python,
librdkafka, rocksdb), per segment, and how many write calls the group commit made (``rounds``) per segment.

``--baseline DIR``: another checkout (``git archive <commit> | tar -x -C DIR``); its ``rlmm`` runs the same workload
in a child of its own, the two taking turns ``--rounds`` times on the same broker: CPU per segment side by side
(medians), which holds on a shared machine where wall times do not.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLK_TCK = os.sysconf("SC_CLK_TCK")


def thread_kinds(consumer: int | None = None) -> dict[int, tuple[str, float]]:
    """CPU seconds of each live thread of this process by id, with its kind (rocksdb, librdkafka, the metadata
    consumer's thread, whose native id is ``consumer``, python: the others)."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        f = stat.rsplit(")", 1)[1].split()
        kind = "rocksdb" if comm.startswith("rocksdb") else "librdkafka" if comm.startswith("rdk:") else \
            "consumer" if int(task.name) == consumer else "python"
        out[int(task.name)] = (kind, (int(f[11]) + int(f[12])) / CLK_TCK)
    return out


def child(bootstrap: str, partitions: int, segments: int, workers: int, copy_ms: float) -> dict:
    """The workload, in this (child) process: see the module docstring. Returns its measures."""
    from rlmm.api import (
        RemoteLogSegmentId,
        RemoteLogSegmentMetadata,
        RemoteLogSegmentMetadataUpdate,
        RemoteLogSegmentState,
        TopicIdPartition,
    )
    from rlmm.topic_manager import TopicBasedRemoteLogMetadataManager, TopicBasedRlmmConfig

    tmp = Path(tempfile.mkdtemp(prefix="bench-rlmm-writes-"))
    cfg = TopicBasedRlmmConfig(bootstrap_servers=bootstrap, cache_dir=tmp / "cache", broker_id=1,
                               topic=f"__rlm_md_w{uuid.uuid4().hex[:8]}", num_partitions=10, replication_factor=1)
    m = TopicBasedRemoteLogMetadataManager(cfg)
    try:
        tps = [TopicIdPartition(uuid.uuid4(), f"t{i % 5}", i // 5) for i in range(partitions)]
        m.on_partition_leadership_changes(tps, [])
        m.wait_ready(tps, 120)
        work: queue.Queue[tuple[TopicIdPartition, int]] = queue.Queue()
        for k in range(segments):
            for tp in tps:
                work.put((tp, k))
        locks = {tp: threading.Lock() for tp in tps}  # one copy run of a partition at a time
        failures: list[BaseException] = []

        def worker() -> None:
            while True:
                try:
                    tp, k = work.get_nowait()
                except queue.Empty:
                    return
                try:
                    with locks[tp]:
                        m.list_remote_log_segments(tp)  # the run's clean-up and resume point
                        now = int(time.time() * 1000)
                        md = RemoteLogSegmentMetadata(
                            RemoteLogSegmentId.generate(tp), k * 1000, k * 1000 + 999, now, 1, now, 65536,
                            ((0, k * 1000),), None, RemoteLogSegmentState.COPY_SEGMENT_STARTED,
                            broker_leader_epoch=0)
                        errs = m.write_segment_metadata_many([md])
                        time.sleep(copy_ms / 1000)
                        errs += m.write_segment_metadata_many([RemoteLogSegmentMetadataUpdate(
                            md.remote_log_segment_id, now, None, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 1)])
                        if any(errs):
                            raise next(e for e in errs if e is not None)
                except BaseException as err:  # noqa: BLE001 - reported by the parent
                    failures.append(err)
                    return

        consumer = m._consumer._thread.native_id
        before, r0, w0 = thread_kinds(consumer), resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        calls0 = m._group.calls
        threads = [threading.Thread(target=worker) for _ in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after, r1, w1 = thread_kinds(consumer), resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
        if failures:
            raise failures[0]
        n = partitions * segments
        kinds: dict[str, float] = {"python": 0.0, "consumer": 0.0, "librdkafka": 0.0, "rocksdb": 0.0}
        for tid, (kind, cpu) in after.items():
            kinds[kind] += cpu - before.get(tid, (kind, 0.0))[1]
        return {"segments": n, "wall_s": w1 - w0,
                "user_ms": 1000 * (r1.ru_utime - r0.ru_utime) / n, "system_ms": 1000 * (r1.ru_stime - r0.ru_stime) / n,
                "kinds_ms": {k: 1000 * v / n for k, v in kinds.items()},
                "rounds_per_segment": (m._group.calls - calls0) / n,
                "ctx_switches_per_segment": ((r1.ru_nvcsw + r1.ru_nivcsw) - (r0.ru_nvcsw + r0.ru_nivcsw)) / n}
    finally:
        m.close()


def run_child(root: Path, bootstrap: str, args: argparse.Namespace, profile: Path | None = None) -> dict:
    """The workload in a child process running ``root``'s ``rlmm``; ``profile``: under py-spy (GIL samples, raw
    collapsed stacks into that file)."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", bootstrap, "--partitions", str(args.partitions),
           "--segments", str(args.segments), "--workers", str(args.workers), "--copy-ms", str(args.copy_ms)]
    if profile is not None:
        spy = Path(sys.executable).parent / "py-spy"
        cmd = [str(spy), "record", "--gil", "--rate", "500", "--format", "raw", "--output", str(profile), "--", *cmd]
    out = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"child of {root} failed: {out.stderr[-3000:]}")
    return json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])  # (py-spy prints too)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--partitions", type=int, default=500)
    ap.add_argument("--segments", type=int, default=3, help="segments per partition")
    ap.add_argument("--workers", type=int, default=6, help="concurrent writers (the sidecar's copy workers)")
    ap.add_argument("--copy-ms", type=float, default=2.0, help="the simulated store copy between the two writes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--baseline", type=Path, help="another checkout, run in turns with this one")
    ap.add_argument("--bootstrap-servers", help="a running broker to use instead of starting one")
    ap.add_argument("--profile", type=Path, help="py-spy (GIL samples) of this checkout's last round into this file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, os.getcwd())
        print(json.dumps(child(args.child, args.partitions, args.segments, args.workers, args.copy_ms)))
        return
    sys.path.insert(0, str(ROOT))
    from devtools.devkafka import KafkaCluster

    sides = [("this checkout", ROOT)] + ([("baseline", args.baseline)] if args.baseline else [])
    results: dict[str, list[dict]] = {name: [] for name, _ in sides}
    with contextlib.ExitStack() as stack:
        bootstrap = args.bootstrap_servers or stack.enter_context(KafkaCluster(brokers=1)).bootstrap_servers
        for r in range(args.rounds):
            for name, root in sides if r % 2 == 0 else sides[::-1]:
                spy = args.profile if root == ROOT and r == args.rounds - 1 else None
                res = run_child(root, bootstrap, args, spy)
                results[name].append(res)
                print(f"round {r} {name}: {json.dumps(res)} (load {os.getloadavg()[0]:.1f})", file=sys.stderr)
    print(f"\n{args.partitions} partitions x {args.segments} segments, {args.workers} writers, copy {args.copy_ms} ms;"
          f" medians of {args.rounds} rounds, ms of CPU per segment")
    for name, rs in results.items():
        def med(f, rs=rs) -> float:  # noqa: ANN001
            return statistics.median(f(x) for x in rs)
        print(f"  {name:<14} user {med(lambda x: x['user_ms']):.3f}  system {med(lambda x: x['system_ms']):.3f}  "
              f"total {med(lambda x: x['user_ms'] + x['system_ms']):.3f}  live threads: python "
              f"{med(lambda x: x['kinds_ms']['python'] + x['kinds_ms'].get('consumer', 0.0)):.3f} (the metadata "
              f"consumer's "
              f"{med(lambda x: x['kinds_ms'].get('consumer', 0.0)):.3f})  librdkafka "
              f"{med(lambda x: x['kinds_ms']['librdkafka']):.3f}  rocksdb {med(lambda x: x['kinds_ms']['rocksdb']):.3f}"
              f"  write calls/segment {med(lambda x: x['rounds_per_segment']):.2f}  context switches/segment "
              f"{med(lambda x: x['ctx_switches_per_segment']):.1f}  wall {med(lambda x: x['wall_s']):.1f} s")


if __name__ == "__main__":
    main()
