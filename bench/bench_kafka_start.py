"""What a dev Kafka cluster's life costs the suite: CPU and wall of start, a little work and stop, by JVM set-up.

    .venv/bin/python bench/bench_kafka_start.py [--brokers 1] [--rounds 3]

Each run is a child process (its CPU, the JVMs' included, is its own; ``RUSAGE_CHILDREN`` after they exit): a
``devtools.devkafka.KafkaCluster`` started (the storage formats too), a topic of 3 partitions (replication factor
= brokers), 20,000 records of 1 KB produced with ``acks=all``, the cluster stopped. The variants take turns, round
after round, so a shared machine's load falls on all of them alike:

- ``g1-c2``: the ``throughput`` profile (G1, both JIT tiers: what the benchmarks' brokers run) without the
  class-data sharing archive;
- ``g1-c2+cds``: the same with the archive (``devtools.cds``, made by ``./dev setup`` or here when missing);
- ``quick+cds``: the ``quick`` profile (the serial collector, C1 alone: what the suite's brokers run) with it.

The table: per variant the median and the range of the children's CPU seconds and of the wall seconds of start
(to every broker registered), work and stop. The load average is printed with it: the figures are this machine's
at that load, compare rows of one run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
VARIANTS = {"g1-c2": ("throughput", False), "g1-c2+cds": ("throughput", True), "quick+cds": ("quick", True)}


def child(brokers: int, jvm: str, archive: bool) -> dict[str, float]:
    """One cluster's life in this process; the measured figures."""
    from confluent_kafka import Producer

    from devtools import cds
    from devtools.devkafka import KafkaCluster

    if not archive:
        cds.use_options = lambda _java, _libs: []  # this process's JVMs start without it
    t0 = time.monotonic()
    kc = KafkaCluster(brokers=brokers, jvm=jvm)
    kc.start()
    t1 = time.monotonic()
    kc.create_topic("bench", partitions=3, replication_factor=brokers)
    producer = Producer({"bootstrap.servers": kc.bootstrap_servers, "linger.ms": 5, "acks": "all"})
    for _ in range(20_000):
        while True:
            try:
                producer.produce("bench", b"x" * 1000)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(60)
    del producer
    t2 = time.monotonic()
    kc.stop()
    t3 = time.monotonic()
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"cpu": ru.ru_utime + ru.ru_stime, "start": t1 - t0, "work": t2 - t1, "stop": t3 - t2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--brokers", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("JVM", "ARCHIVE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.brokers, args.child[0], args.child[1] == "1")))
        return
    from devtools.devkafka import ensure_kafka_cds_archive

    print(f"archive: {ensure_kafka_cds_archive()}", flush=True)
    got: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    loads = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for r in range(args.rounds):
        for name, (jvm, archive) in VARIANTS.items():
            out = subprocess.run([sys.executable, __file__, "--brokers", str(args.brokers), "--child", jvm,
                                  "1" if archive else "0"], capture_output=True, text=True, env=env, check=True)
            got[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            loads.append(os.getloadavg()[0])
            print(f"round {r + 1} {name:10s} " + " ".join(f"{k}={v:.2f}" for k, v in got[name][-1].items()),
                  flush=True)
    print(f"\n{args.brokers} broker(s), {args.rounds} alternating rounds, load average {min(loads):.1f}-"
          f"{max(loads):.1f}")
    print(f"{'variant':12s} {'CPU s':>18s} {'start s':>18s} {'work s':>18s} {'stop s':>18s}")
    for name, runs in got.items():
        cells = []
        for key in ("cpu", "start", "work", "stop"):
            vals = [run[key] for run in runs]
            cells.append(f"{statistics.median(vals):6.2f} ({min(vals):.1f}-{max(vals):.1f})")
        print(f"{name:12s} " + " ".join(f"{c:>18s}" for c in cells))


if __name__ == "__main__":
    main()
