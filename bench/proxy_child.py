"""The child processes of ``bench_proxy``: a reader, a live-tail reader, and a profiled listener.

    python bench/proxy_child.py consume BOOTSTRAP TOPIC RECORDS PIDS GROUP
    python bench/proxy_child.py tail BOOTSTRAP TOPIC GROUP
    python bench/proxy_child.py listener SETTINGS_JSON PROFILE_OUT

``consume`` is one confluent-kafka consumer (librdkafka defaults but ``group.id`` GROUP, ``auto.offset.reset=earliest``
and ``$PROXY_BENCH_CONSUMER``) that ``subscribe()``s to TOPIC and reads RECORDS records of each partition
(comma-separated: partition 0's, 1's, ...; one number: one partition), checking that each partition's are its offsets
0.. in order, each once; records past a partition's count are left out (not counted). The read window starts at the
group's assignment (``on_assign``: after JoinGroup / SyncGroup, before OffsetFetch, ListOffsets and the first Fetch)
and ends at the last record. At both ends it reads the CPU seconds of the processes PIDS (comma-separated: the
sidecar's, the broker's) from ``/proc/<pid>/stat``. It prints one JSON line ``{"window_s", "records", "bytes" (keys
+ values), "first_s" (the window's start to the first record: OffsetFetch, ListOffsets, the first Fetch), "cpu":
{pid: s}, "consumer_cpu_s", "consumer_main_s"}`` (its own CPU over the window: a consumer whose CPU is about its window
bounds the read, whatever serves it; and of it, its main thread's, the poll loop that hands each record to Python, apart
from librdkafka's threads that fetch and parse: a main thread busy the whole window is the read's bound).

``tail`` is a live-tail consumer (the same settings, ``auto.offset.reset=latest``): it prints ``ready`` once
assigned, then ``poll()``s, and for every record whose value starts with ``seq`` (8 bytes) and the producer's
``time.monotonic_ns()`` (8 bytes; CLOCK_MONOTONIC is one clock for every process of the machine) notes the latency
to its arrival (when ``poll()`` hands it over); a record keyed ``end`` stops it. Prints
``{"seq": [...], "latency_ns": [...]}``.

``listener`` runs :func:`rlm.listener.start_listener` alone (no tiering) with every Python thread under
:mod:`cProfile` (each thread its own profiler, installed by wrapping :meth:`threading.Thread.run` before the listener
starts its threads; merged at the end), timed by the thread's CPU clock (:func:`time.thread_time`), so a thread
waiting (epoll, a queue, a lock, librdkafka's poll) costs nothing and the times add up to CPU seconds. It prints
``{"port": ...}``, and at the end of stdin stops and writes the merged stats to PROFILE_OUT (:mod:`pstats` format).
"""

from __future__ import annotations

import json
import os
import struct
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.procstat import profile_every_thread, thread_times  # noqa: E402

__all__ = ["consume", "listener", "tail"]

TICKS = os.sysconf("SC_CLK_TCK")
CLIENT_TIMEOUT_S = 1800
CONSUME_BATCH = 10_000  # records a consume() call asks for at most
STAMP = struct.Struct(">qq")  # seq, producer's monotonic_ns


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14, 15 of proc(5))


def consumer_config(bootstrap: str, group: str, reset: str) -> dict[str, object]:
    """The consumer settings of every read, through the proxy or not: librdkafka's defaults but these, and those
    of the JSON object in ``$PROXY_BENCH_CONSUMER`` (``bench_proxy --consumer-setting``, both sides) on top."""
    extra = json.loads(os.environ.get("PROXY_BENCH_CONSUMER") or "{}")
    return {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": reset, **extra}


def consume(bootstrap: str, topic: str, records: list[int], pids: list[int], group: str) -> None:
    from confluent_kafka import Consumer, KafkaException

    c = Consumer(consumer_config(bootstrap, group, "earliest"))
    mark: list[tuple[float, dict[int, float], float, float]] = []

    def on_assign(_consumer: object, partitions: list) -> None:
        if partitions and not mark:
            mark.append((time.monotonic(), {p: cpu_seconds(p) for p in pids}, time.process_time(), main_cpu_s()))

    c.subscribe([topic], on_assign=on_assign)
    start = time.monotonic()
    n = size = 0
    first = 0.0  # when the first record came
    expect = [0] * len(records)
    wanted = sum(records)
    left = len(records)  # partitions not read to their count yet
    while left:
        if time.monotonic() - start > CLIENT_TIMEOUT_S:
            raise RuntimeError(f"read {n} records of {sum(records)} in {CLIENT_TIMEOUT_S} s")
        # No more than the records still wanted: consume(n, timeout) returns once n records came or the timeout
        # passed, so asking 10,000 when fewer are left waited out the whole timeout after the last record (1 s
        # in every read's window, both sides: session 22 found it in librdkafka's debug log, the last Fetch
        # answered ~1 s before the window closed).
        for m in c.consume(min(CONSUME_BATCH, wanted - n), 1.0):
            if m.error():
                raise KafkaException(m.error())
            p = m.partition()
            if expect[p] == records[p]:
                continue  # past its count
            if m.offset() != expect[p]:
                raise RuntimeError(f"{topic}-{p}: offset {m.offset()} where {expect[p]} was expected")
            expect[p] += 1
            if not n:
                first = time.monotonic()
            n += 1
            size += len(m.value() or b"") + len(m.key() or b"")
            if expect[p] == records[p]:
                left -= 1
                if not left:
                    break
    end = time.monotonic()
    cpu = {p: cpu_seconds(p) - mark[0][1][p] for p in pids}
    own = time.process_time() - mark[0][2]
    main = main_cpu_s() - mark[0][3]
    c.close()
    print(json.dumps({"window_s": end - mark[0][0], "first_s": first - mark[0][0], "records": n, "bytes": size,
                      "cpu": cpu, "consumer_cpu_s": own, "consumer_main_s": main}), flush=True)


def main_cpu_s() -> float:
    """CPU seconds so far of this process's main thread (its thread id is the process id)."""
    return sum(user + system for (tid, _comm), (user, system) in thread_times(os.getpid()).items()
               if tid == os.getpid())


def tail(bootstrap: str, topic: str, group: str) -> None:
    from confluent_kafka import Consumer, KafkaException

    c = Consumer(consumer_config(bootstrap, group, "latest"))
    ready = threading.Event()
    c.subscribe([topic], on_assign=lambda _c, parts: ready.set() if parts else None)
    seqs: list[int] = []
    lat: list[int] = []
    announced = False
    start = time.monotonic()
    while True:
        if time.monotonic() - start > CLIENT_TIMEOUT_S:
            raise RuntimeError(f"no end record in {CLIENT_TIMEOUT_S} s")
        m = c.poll(0.1)  # one record a call: consume(n, timeout) would wait for n records or the timeout
        now = time.monotonic_ns()
        msgs = [m] if m is not None else []
        if ready.is_set() and not announced:
            print("ready", flush=True)
            announced = True
        done = False
        for m in msgs:
            if m.error():
                raise KafkaException(m.error())
            if m.key() == b"end":
                done = True
                continue
            seq, sent = STAMP.unpack_from(m.value())
            seqs.append(seq)
            lat.append(now - sent)
        if done:
            break
    c.close()
    print(json.dumps({"seq": seqs, "latency_ns": lat}), flush=True)


def listener(settings_path: str, out: str) -> None:
    import logging
    import pstats

    logging.basicConfig(level=logging.WARNING)
    profiles = profile_every_thread()  # the serving threads; the main thread's start-up is left out
    from rlm.config import SidecarSettings
    from rlm.listener import start_listener
    from rsm.manager import RemoteStorageManager

    settings = SidecarSettings(**json.loads(Path(settings_path).read_text()))
    served = start_listener(settings, RemoteStorageManager(settings.store))
    print(json.dumps({"port": served.port}), flush=True)
    sys.stdin.read()
    served.stop()
    time.sleep(0.5)
    stats = None
    for _thread, p in profiles:
        try:
            stats = pstats.Stats(p) if stats is None else stats.add(p)  # type: ignore[union-attr]
        except TypeError:  # a profiler that never ran
            continue
    if stats is not None:
        stats.dump_stats(out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["consume"]:
        consume(sys.argv[2], sys.argv[3], [int(n) for n in sys.argv[4].split(",")],
                [int(p) for p in sys.argv[5].split(",")], sys.argv[6])
    elif sys.argv[1:2] == ["tail"]:
        tail(sys.argv[2], sys.argv[3], sys.argv[4])
    elif sys.argv[1:2] == ["listener"]:
        listener(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(__doc__)
