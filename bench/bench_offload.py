"""Streaming offload (PIP-76) next to segment mode: remote lag, PUT requests per GiB, copy throughput, CPU per GiB.

    .venv/bin/python bench/bench_offload.py [--quiet-s 90] [--quiet-kib-s 50] [--offload-max-ms 5000]
                                            [--busy-mib 512] [--segment-mib 64]

One broker (KRaft, 127.0.0.1), the sidecar in-process with the filesystem store, every row on the same machine:

- **Quiet topic**: a producer writes ``--quiet-kib-s`` KiB/s (1 KiB records, acks=all) for ``--quiet-s`` seconds.
  A record's *remote lag* is the time from its acknowledgement to the first poll (every 50 ms, of the sidecar's own
  metadata) that finds its offset remote. Rows: streaming mode (``offload_max_ms``, topic ``segment.ms`` = 1 h);
  segment mode with the same topic (nothing rolls within the run: no record gets remote); segment mode with
  ``segment.ms`` = ``offload_max_ms`` (the broker rolls that often: what segment mode needs for the same lag).
- **Busy topic**: ``--busy-mib`` produced first (``segment.bytes`` = ``--segment-mib``), then the sidecar is started
  and drains the backlog: segment mode copies the rolled segments, streaming mode cuts offload segments of
  ``offload_max_bytes`` = ``--segment-mib`` from the same log. Both run until the last rolled segment's end is
  remote (the tail of the active segment is not counted: segment mode never copies it, streaming cuts it
  ``offload_max_ms`` later). Throughput is the bytes tiered by then over the time from the sidecar's start; CPU is
  the process's CPU time (all threads) over that window (the producer finished before it).
- PUTs: every object the store writes (``FileSystemStore.put``), per offload/remote segment and per GiB tiered.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024
GiB = 1024 * MiB
HOUR_MS = 3_600_000


class PutCounter:
    """Counts the objects the filesystem store writes (patched onto the class for the bench's lifetime)."""

    def __init__(self) -> None:
        from rsm.store.fs import FileSystemStore

        self.n = 0
        self._orig = FileSystemStore.put
        counter = self

        def put(store, key, chunks):  # noqa: ANN001, ANN202
            counter.n += 1
            return counter._orig(store, key, chunks)

        FileSystemStore.put = put  # type: ignore[method-assign]


def settings_for(kc, topic: str, work: Path, offload: list[dict]):  # noqa: ANN001, ANN201
    from rlm.config import SidecarSettings

    tag = uuid.uuid4().hex[:8]
    return SidecarSettings(**{
        "broker_id": 1,
        "log_dirs": [str(d) for d in kc.node(1).log_dirs],
        "staging_dir": str(work / f"staging-{tag}"),
        "kafka": {"bootstrap_servers": kc.bootstrap_servers},
        "store": {"store": "fs", "root_path": str(work / f"remote-{tag}")},
        "metadata": {"topic": f"__rlm_md_{tag}", "partitions": 3, "replication_factor": 1,
                     "state_dir": str(work / f"state-{tag}"), "to_be_deleted_topic": f"__rlm_tbd_{tag}"},
        "tasks": {"copy_interval_ms": 500, "discovery_interval_ms": 500},
        "topics": {"include": [topic]},
        "retention": [{"pattern": ".*", "retention_ms": -1, "retention_bytes": -1}],
        "offload": offload,
        "listen": {"host": "127.0.0.1", "port": 0},
        "log_format": "text",
        "log_level": "WARNING",
    })


def latest(sidecar, tp) -> int:  # noqa: ANN001
    from rlmm.api import PartitionNotServedError

    try:
        v = sidecar.reader.latest_offset(tp)
    except PartitionNotServedError:
        return -1
    return -1 if v is None else v


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def quiet_run(kc, work: Path, puts: PutCounter, *, name: str, segment_ms: int, offload: list[dict],  # noqa: ANN001
              seconds: float, kib_s: int) -> dict:
    """Produce at kib_s for seconds with the sidecar running; lag of every acknowledged record."""
    from confluent_kafka import Producer

    from rlm.sidecar import Sidecar
    from rlmm.api import TopicIdPartition

    topic = f"bench-quiet-{name}-{uuid.uuid4().hex[:6]}"
    topic_id = kc.create_topic(topic, 1, config={"segment.ms": str(segment_ms), "segment.bytes": str(GiB),
                                                 "retention.ms": "-1"})
    tp = TopicIdPartition(topic_id, topic, 0)
    sidecar = Sidecar(settings_for(kc, topic, work, [{**r, "pattern": topic} for r in offload])).start()
    acked: dict[int, float] = {}
    polls: list[tuple[float, int]] = []
    stop = threading.Event()

    def poller() -> None:
        while not stop.is_set():
            polls.append((time.monotonic(), latest(sidecar, tp)))
            time.sleep(0.05)

    th = threading.Thread(target=poller, daemon=True)
    th.start()
    p = Producer({"bootstrap.servers": kc.bootstrap_servers, "linger.ms": 0, "acks": "all"})
    value = random.Random(3).randbytes(1024)

    def cb(err, msg) -> None:  # noqa: ANN001
        if err is None:
            acked[msg.offset()] = time.monotonic()

    puts_before = puts.n
    t0 = time.monotonic()
    sent = 0
    try:
        while (elapsed := time.monotonic() - t0) < seconds:
            due = int(elapsed * kib_s)  # 1 KiB records
            while sent < due:
                p.produce(topic, value, b"k%d" % sent, on_delivery=cb)
                sent += 1
            p.poll(0.01)
        p.flush(30)
        last = max(acked)
        # Streaming: wait for the last offload segment; segment mode: a little while (nothing rolls).
        deadline = time.monotonic() + (max(o.get("offload_max_ms", 0) for o in offload) / 1000 + 10 if offload
                                       else segment_ms / 1000 + 10 if segment_ms < HOUR_MS else 5)
        while time.monotonic() < deadline and latest(sidecar, tp) < last:
            time.sleep(0.1)
    finally:
        stop.set()
        th.join(5)
        segs = sidecar.reader.segments(tp) if latest(sidecar, tp) >= 0 else []
        sidecar.stop()
    lags = []
    j = 0
    for off in sorted(acked):
        while j < len(polls) and polls[j][1] < off:
            j += 1
        if j == len(polls):
            break
        lags.append(polls[j][0] - acked[off])
    tiered = sum(s.segment_size_bytes for s in segs)
    return {"name": name, "records": len(acked), "remote": len(lags), "segments": len(segs),
            "puts": puts.n - puts_before, "tiered": tiered,
            "p50": percentile(lags, 0.5) if lags else None, "p99": percentile(lags, 0.99) if lags else None}


def busy_run(kc, work: Path, puts: PutCounter, *, name: str, total_mib: int, segment_mib: int,  # noqa: ANN001
             offload: list[dict]) -> dict:
    from confluent_kafka import Producer

    from rlm.sidecar import Sidecar
    from rlmm.api import TopicIdPartition
    from rsm.log.partition import PartitionDir

    topic = f"bench-busy-{name}-{uuid.uuid4().hex[:6]}"
    topic_id = kc.create_topic(topic, 1, config={"segment.bytes": str(segment_mib * MiB), "segment.ms": str(HOUR_MS),
                                                 "retention.ms": "-1"})
    tp = TopicIdPartition(topic_id, topic, 0)
    p = Producer({"bootstrap.servers": kc.bootstrap_servers, "linger.ms": 20, "batch.size": 256 * 1024,
                  "queue.buffering.max.kbytes": 256 * 1024, "acks": "1"})
    rng = random.Random(7)
    pool = rng.randbytes(1024 * 64)
    n = total_mib * MiB // 1064
    for i in range(n):
        j = i % 63
        while True:
            try:
                p.produce(topic, pool[j * 1024: (j + 1) * 1024 + 17], b"k%d" % i)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(120)
    pdir = kc.log_dir() / f"{topic}-0"
    for f in sorted(pdir.glob("*.log")):  # warm the page cache: both modes read from memory
        with open(f, "rb") as fh:
            while fh.read(8 * MiB):
                pass
    # Both modes until the end of the last rolled segment is remote: segment mode never copies the active segment;
    # streaming would cut its tail only offload_max_ms after seeing it (its byte bound is not reached).
    target = PartitionDir(pdir).rolled_ranges()[-1][1]
    settings = settings_for(kc, topic, work, [{**r, "pattern": topic} for r in offload])
    puts_before = puts.n
    cpu0, t0 = time.process_time(), time.monotonic()
    sidecar = Sidecar(settings).start()
    try:
        while latest(sidecar, tp) < target:
            time.sleep(0.05)
        wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
        segs = sidecar.reader.segments(tp)
    finally:
        sidecar.stop()
    tiered = sum(s.segment_size_bytes for s in segs)
    return {"name": name, "segments": len(segs), "tiered": tiered, "wall": wall, "cpu": cpu,
            "puts": puts.n - puts_before}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quiet-s", type=float, default=90)
    ap.add_argument("--quiet-kib-s", type=int, default=50)
    ap.add_argument("--offload-max-ms", type=int, default=5000)
    ap.add_argument("--busy-mib", type=int, default=512)
    ap.add_argument("--segment-mib", type=int, default=64)
    args = ap.parse_args()

    import logging

    logging.basicConfig(level=logging.WARNING)
    from devtools.devkafka import KafkaCluster

    work = Path(tempfile.mkdtemp(prefix="bench-offload-"))
    puts = PutCounter()
    stream = [{"mode": "streaming", "offload_max_ms": args.offload_max_ms, "poll_interval_ms": 200,
               "offload_max_bytes": args.segment_mib * MiB}]
    with KafkaCluster(brokers=1, heap="1g") as kc:
        quiet = [
            quiet_run(kc, work, puts, name="streaming", segment_ms=HOUR_MS, offload=stream,
                      seconds=args.quiet_s, kib_s=args.quiet_kib_s),
            quiet_run(kc, work, puts, name="segment", segment_ms=HOUR_MS, offload=[],
                      seconds=args.quiet_s, kib_s=args.quiet_kib_s),
            quiet_run(kc, work, puts, name="segment-roll", segment_ms=args.offload_max_ms, offload=[],
                      seconds=args.quiet_s, kib_s=args.quiet_kib_s),
        ]
        busy = [busy_run(kc, work, puts, name=n, total_mib=args.busy_mib, segment_mib=args.segment_mib, offload=o)
                for n, o in (("segment", []), ("streaming", stream))]

    print(f"\nQuiet topic: {args.quiet_kib_s} KiB/s for {args.quiet_s:.0f} s, 1 KiB records; "
          f"offload_max_ms = {args.offload_max_ms} ms")
    print(f"{'mode':<40} {'remote':>14} {'lag p50':>9} {'lag p99':>9} {'segments':>9} {'PUTs':>6} "
          f"{'PUTs/seg':>9} {'PUTs/GiB':>10}")
    labels = {"streaming": "streaming (segment.ms 1 h)", "segment": "segment (segment.ms 1 h)",
              "segment-roll": f"segment (segment.ms {args.offload_max_ms} ms)"}
    for r in quiet:
        lag = (f"{r['p50']:>8.2f}s {r['p99']:>8.2f}s" if r["p50"] is not None else f"{'-':>9} {'-':>9}")
        per_seg = f"{r['puts'] / r['segments']:.2f}" if r["segments"] else "-"
        per_gib = f"{r['puts'] / (r['tiered'] / GiB):,.0f}" if r["tiered"] else "-"
        print(f"{labels[r['name']]:<40} {r['remote']:>6}/{r['records']:<7} {lag} {r['segments']:>9} "
              f"{r['puts']:>6} {per_seg:>9} {per_gib:>10}")
    print(f"\nBusy topic: {args.busy_mib} MiB backlog, segment.bytes = offload_max_bytes = {args.segment_mib} MiB")
    print(f"{'mode':<12} {'tiered':>10} {'seconds':>8} {'MB/s':>8} {'CPU s/GiB':>10} {'segments':>9} {'PUTs/seg':>9}")
    for r in busy:
        print(f"{r['name']:<12} {r['tiered'] / MiB:>8.0f}Mi {r['wall']:>8.2f} {r['tiered'] / MiB / r['wall']:>8.0f} "
              f"{r['cpu'] / (r['tiered'] / GiB):>10.2f} {r['segments']:>9} {r['puts'] / r['segments']:>9.2f}")
    seg, st = busy
    ratio = (st["tiered"] / st["wall"]) / (seg["tiered"] / seg["wall"])
    print(f"streaming / segment throughput: {ratio:.2f}x (goal: >= 0.90x)")


if __name__ == "__main__":
    main()
