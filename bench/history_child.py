"""The child processes of ``bench_history``: the history endpoint under test, and one history reader.

    python bench/history_child.py endpoint SETTINGS_JSON     # serves the rlm found first on PYTHONPATH
    python bench/history_child.py consume BOOTSTRAP TOPIC RECORDS [KEY=VALUE ...]

``endpoint`` starts :func:`rlm.listener.start_listener` from whichever tree ``PYTHONPATH`` names first (so the bench
can serve this tree's endpoint and an older commit's, checked out in a git worktree, side by side), prints one JSON
line ``{"port": ..., "rlm": <the rlm package directory it imported>}``, then answers commands on stdin, one a line:
``stats`` prints ``{"fetch_s", "fetches", "queued_peak_bytes"}`` (the endpoint's Fetch latency sum and count, and the
highest ``rlm_history_queued_response_bytes`` seen since the last ``stats``, sampled every 100 ms once ``watch``
has been sent; ``null`` where the tree has no such gauge). End of stdin stops it. Its process is the endpoint
alone, so the bench reads its CPU and RSS from ``/proc/<pid>``.

``consume`` is one confluent-kafka consumer (librdkafka) in a process of its own: it prints ``ready`` once created,
waits for a line on stdin, then ``assign()``s partition 0 of TOPIC at offset 0 and reads RECORDS records; it prints
``{"start": <wall clock at assign>, "end": <wall clock at the last record>, "records": n}``. Extra KEY=VALUE pairs
are consumer settings.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["consume", "endpoint"]

CLIENT_TIMEOUT_S = 1800


def count_calls() -> collections.Counter[str]:
    """Python and C calls counted by function in every thread started from now on (``RLM_BENCH_CALLS=PREFIX``: each
    ``stats`` writes the counts so far to PREFIX.<pid>.<n>.json): a measure of the work per request that the
    machine's load does not change. Slows the endpoint several times: not for its timings."""
    calls: collections.Counter[str] = collections.Counter()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            code = frame.f_code
            calls[f"{code.co_name} ({Path(code.co_filename).name}:{code.co_firstlineno})"] += 1
        elif event == "c_call":
            calls[f"C {getattr(arg, '__qualname__', arg)}"] += 1

    threading.setprofile(profile)
    return calls


def endpoint(settings_path: str) -> None:
    logging.basicConfig(level=logging.WARNING)
    from prometheus_client import REGISTRY

    import rlm
    from rlm.config import SidecarSettings
    try:
        from rlm.listener import start_listener
    except ImportError:  # --compare-before a commit older than rlm/listener/ (the endpoint was rlm/history/)
        from rlm.history import start_history as start_listener
    from rsm.manager import RemoteStorageManager

    settings = SidecarSettings(**json.loads(Path(settings_path).read_text()))
    calls = count_calls() if os.environ.get("RLM_BENCH_CALLS") else None
    history = start_listener(settings, RemoteStorageManager(settings.store))
    print(json.dumps({"port": history.port, "rlm": str(Path(rlm.__file__).parent)}), flush=True)
    peak: list[float | None] = [None]
    stop = threading.Event()

    def queued() -> float | None:
        return REGISTRY.get_sample_value("rlm_history_queued_response_bytes")

    def watch() -> None:
        while not stop.wait(0.1):
            q = queued()
            if q is not None:
                peak[0] = max(peak[0] or 0.0, q)

    stats_n = 0
    try:
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "watch":
                threading.Thread(target=watch, daemon=True).start()
            elif cmd == "stats":
                labels = {"api": "fetch"}
                print(json.dumps({
                    "fetch_s": REGISTRY.get_sample_value("rlm_history_request_seconds_sum", labels) or 0.0,
                    "fetches": REGISTRY.get_sample_value("rlm_history_request_seconds_count", labels) or 0.0,
                    "queued_peak_bytes": peak[0]}), flush=True)
                peak[0] = queued()
                if calls is not None:  # a snapshot per stats: the calls of one read are two snapshots' difference
                    stats_n += 1
                    Path(f"{os.environ['RLM_BENCH_CALLS']}.{os.getpid()}.{stats_n}.json").write_text(
                        json.dumps(dict(calls)))
    finally:
        stop.set()
        history.stop()


def consume(bootstrap: str, topic: str, records: int, properties: list[str]) -> None:
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    conf: dict[str, object] = {"bootstrap.servers": bootstrap, "group.id": "bench-history-unused",
                               "enable.auto.commit": False, "enable.auto.offset.store": False}
    conf.update(p.split("=", 1) for p in properties)  # type: ignore[arg-type]
    c = Consumer(conf)
    print("ready", flush=True)
    sys.stdin.readline()
    start = time.time()
    c.assign([TopicPartition(topic, 0, 0)])
    n, last = 0, -1
    while last < records - 1:
        if time.time() - start > CLIENT_TIMEOUT_S:
            raise RuntimeError(f"read {n} records of {records} in {CLIENT_TIMEOUT_S} s")
        msgs = c.consume(min(10_000, records - 1 - last), 1.0)  # not more than are left: consume(n, timeout) waits
        # for n records or the timeout (asking 10,000 waited 1 s after the last record, in every read's time)
        for m in msgs:
            if m.error():
                raise KafkaException(m.error())
        if msgs:
            n += len(msgs)
            last = msgs[-1].offset()
    end = time.time()
    c.close()
    print(json.dumps({"start": start, "end": end, "records": n}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "endpoint":
        endpoint(sys.argv[2])
    elif sys.argv[1] == "consume":
        consume(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:])
    else:
        raise SystemExit(__doc__)
