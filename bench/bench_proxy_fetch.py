"""Micro-benchmark of the proxy's history Fetch path (issue 24): the listener as a proxy (:class:`rlm.listener.
upstream.proxy.Proxy` in a :class:`rlm.listener.net.server.ListenerServer`) answering a raw-Fetch client from the
tier, its CPU per Fetch by thread (event loop, workers), user and system apart, and its context switches, in seconds
where ``bench_proxy`` takes minutes.

    .venv/bin/python bench/bench_proxy_fetch.py [--mib 256] [--reads 3] [--rounds 3] [--baseline DIR]
                                                [--profile FILE] [--fetch-version 16]

Set-up: one partition of ``--mib`` MiB on the filesystem store as ``bench_tier_read`` builds it (~250 KiB batches of
1 KiB values, as librdkafka's ``batch.size`` makes them in ``bench_proxy``; 64 MiB segments, 4 MiB blocks), the
listener in this process (its event loop and workers are the listener's own threads, named as in ``rlm serve``), and
a stand-in broker on a thread of its own: ApiVersions, ListOffsets (the log start past the tier's end, so every Fetch
is below it) and Fetch (OFFSET_OUT_OF_RANGE there, as a broker that deleted those segments answers the Fetch the proxy
forwards once its known bounds are a second old). No consumer group, no librdkafka: a client in a subprocess sends
Fetch v16 (``--fetch-version``; the topic by its id, as librdkafka 2.16 in ``bench_proxy`` sends it: v12, by name,
before session 20; one partition, ``max.partition.fetch.bytes`` 1 MiB, one in flight, as librdkafka's fetcher) from
offset 0 to the end, ``--reads`` times, each answer checked (no offset skipped, none twice). The tier's view of the
partition is made before the count begins: its first making walks every batch of a tier without producer snapshots
(the transactions open at its end, once): ``bench_proxy``'s warm-up reads leave it out too, session 19's figures
included it (runs of the same code, load 1.7-2.0: 0.95 / 1.02 CPU s/GiB with it, 0.81-0.94 without). So the path
measured is the one a history read takes in ``bench_proxy`` (the answer read ahead, written in parts, the tier's
blocks sent from their file), without the broker, the consumer's CPU or its group protocol.

``--live``: the live path instead: the stand-in broker's log start is 0 and it answers every Fetch with whole batches
of the partition (read from the tier into memory before the count), as a broker answers from its local log; the
proxy forwards each Fetch and passes the answer on. The stand-in broker's own CPU is counted apart (``broker``),
never as the listener's. First figures (session 21, load ~3, 64-128 MiB, 2-3 reads): loop user 0.48-0.59 and system
0.24-0.32 CPU s/GiB (0.8-0.9 in all, ~0.8 ms a 1 MiB Fetch); cProfile: the socket's ``send`` to the client and
``recv_into`` from the broker (the two copies of every byte) ~25%, a new 1 MiB ``bytearray`` for each answer ~38 us
(its zeroing), five event-loop rounds a Fetch.

Printed per run: the listener's CPU per GiB and per Fetch by thread group (``loop``, ``workers``) and their voluntary
and involuntary context switches per Fetch (``/proc/self/task``); and on the client's clock, p50 / p90 / p99 of a
Fetch sent to its answer's first bytes (the listener's turn) and to its whole answer (that and the transfer: what the
listener's threads take from each other while it writes shows here, not in its CPU). ``--baseline DIR`` (a checkout,
e.g. ``git archive`` of the base commit): each round runs this checkout's code and then DIR's (the order reversed
every other round), each in a process of its own; the medians side by side. On a shared 2-core machine a run's total
swings 1.1-1.7 s/GiB within a minute for the same code (session 19): compare medians of several rounds, run under the
bench lock.
``--profile FILE``: one more run of this checkout with every listener thread under cProfile (thread CPU time),
FILE.loop and FILE.workers in pstats format.

What its first version measured (session 19, 3 reads of 256 MiB a run, 804 Fetches, load 3-7; each figure a run):

- the base (7b26f49): loop 0.50-0.81 ms a Fetch (user ~0.4-0.7, system ~0.13-0.2), workers 0.54-0.80 ms; ~1.2 voluntary
  and ~2.1 involuntary switches a Fetch on the loop, ~3.7 and ~0.9 on the workers;
- writes corked (``TCP_CORK`` around an answer's writev / sendfile calls, so its fields, four ~256 KiB batches and
  closing bytes leave as full segments, not a short one after each call): total 1.07 / 1.33 / 1.65 against the base's
  1.16 / 1.36 / 1.45 s/GiB (alternating), the loop's system time unchanged; a sender alone writing such answers to a
  loopback reader: 67-109 us system time per 1 MiB answer either way. Dropped (``bench_proxy``, one alternating pair,
  load 2.7-5: sidecar 1.62 vs 1.61 s/GiB);
- the next answer's read started after the writes (``call_soon``) instead of before: 1.40 / 1.79 against 1.21 / 1.32
  s/GiB; its switches a Fetch barely moved (loop involuntary 1.6-1.8 vs 2.1, workers voluntary 3.3 vs 3.6). Dropped,
  as ``bench_proxy``'s record says of the same change;
- the read ahead done on the event loop itself (not acceptable as such: a read that waits on the disk holds every
  connection; measured for the bound): 1.62 / 1.21 against 1.73 / 1.52 s/GiB, the workers' ~4.6 switches a Fetch gone.
  A hand-off to a worker and back (``submit`` and ``result``) costs ~32 us on this host with nothing else running.
  In ``bench_proxy`` it did not show: sidecar 1.64 s/GiB (loop 1.43-1.54 of it, workers idle; 0.52 of the consumer's
  CPU) against the base's 1.61, 1.47 and 1.47 (0.57, 0.52, 0.49) in the runs around it (load 3-14). Dropped;
- where it goes (``--profile``): ~380 Python calls a Fetch on the loop (~90 of them rlm.listener's, ~40 asyncio's,
  ~17 prometheus_client's) and ~460 on the workers (~67 rsm.format's, ~31 rlm.listener's, ~18 prometheus_client's,
  ~17 rlm.tier's): no one function holds a large share; each of the changes above moved less than a run's noise. The
  cyclic GC is not it: 6 young collections in 804 Fetches, 1 us a Fetch.

Session 20 (issue 24: why ``bench_proxy``'s history read cost the sidecar 1.6-1.8 CPU s/GiB where this bench said
0.97): a probe of every proxied Fetch (its route, the socket's take) in ``bench_proxy`` runs at load 1-3, and
``--profile`` / ``--perf`` there:

- librdkafka 2.16 sends Fetch v16 (topics by id): the client here sends it too now; v16 and v12 within the noise;
- 22-25 of a 0.25 GiB read's 245-248 proxied Fetches (55 of 1,013 at 1 GiB) were librdkafka reading ahead into the
  broker's active segment, past the read's end, forwarded inside its window: ``bench_proxy`` rolls that segment now
  (5-9 broker Fetches a read remain: the bounds asked once a second). On the sidecar's CPU, within the noise: 1.15 /
  1.05 CPU s/GiB before, 1.79 (a loaded run) / 1.03 after, 0.42 / 0.39 vs 0.47 / 0.41 of the consumer's CPU;
- the answers are not queued: 457 of 461 history answers were taken whole by the socket at once (the first of each
  connection in part, before its send buffer is raised);
- on a quiet host the two agree: ``bench_proxy`` (4 runs of 1 GiB, load 0.4-3.0, the consumer 2.4-2.7 CPU s/GiB)
  gave the sidecar 1.03-1.16 CPU s/GiB (loop 0.50-0.64 with its system time, workers 0.43-0.51) against 0.81-1.10
  here (loop 0.40-0.59, workers 0.40-0.51); one run whose consumer took 3.7 CPU s/GiB (others running) gave 1.79. The
  1.6-1.8 of earlier runs is the host's speed under load: the same calls, slower. cProfile of a listener alone in
  ``bench_proxy`` made the calls this bench makes a Fetch but the topic-id lookups (UUID hashes 24 a Fetch against
  5) and the cluster-ACL check (0.92 a Fetch), each under a microsecond (timeit: a UUID dict lookup 0.18 us);
- where the CPU goes (``perf``, 1 GiB, load 2.0-2.9): the loop 52% of the sidecar's samples, the workers 43%; the
  interpreter's eval loop 23%, CRC-32C 9.6% (22% of the workers'), the loop's kernel (TCP, splice) ~5%; the rest the
  interpreter's long tail. Per Fetch, by timeit: the metrics 4 calls on each side (0.6 us an ``inc``, 1.6 an
  ``observe``: ~8 us a Fetch, 1%), ``_in_file`` 2.6 us a part (the mapping's address by ctypes; a part sent from
  its file is looked at twice: ~10 us), none a lever alone;
- the interpreter: Debian's 3.11.2 (``/usr/bin/python3.11``, the venv's packages) against pyenv's 3.11.7 (built
  without PGO or LTO), alternating 4 runs each (load 2.5-4.0): 0.87-1.03 vs 0.87-1.10 CPU s/GiB. No lever;
- what a Fetch costs by its size (``max.partition.fetch.bytes`` changed here for one experiment, load 0.9-1.2):
  256 KiB 632 us a Fetch (2.70 CPU s/GiB), 1 MiB 871 / 1206 us (0.94 / 1.30), 4 MiB 2451 / 2647 us (0.67 / 0.73):
  ~0.50 ms a Fetch whatever its size plus ~0.51 ms a MiB (the loop ~0.27 ms a Fetch and ~0.27 a MiB, the workers
  ~0.24 and ~0.24, from the 256 KiB and 4 MiB runs). At librdkafka's 1 MiB, half of the listener's CPU is the
  per-request path (decode, route, bounds, authorize, hand-off to a worker and back, encode, write calls, metrics):
  a third of the total is two thirds of that, a redesign of the steady history Fetch's path, not a cut of one part.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from procstat import profile_every_thread  # this checkout's (bench/ is the script's directory), whatever root is

MiB = 1024 * 1024
GiB = 1024 * MiB
TICKS = os.sysconf("SC_CLK_TCK")
FETCH_VERSION = 16  # librdkafka 2.16's (bench_proxy's consumers): topics by id
PARTITION_MAX_BYTES = 1 << 20  # librdkafka's max.partition.fetch.bytes
FETCH_MAX_BYTES = 50 * MiB  # and fetch.max.bytes
GROUPS = ("loop", "workers", "other", "broker")  # broker: the stand-in, never counted as the listener's


def _code(root: Path) -> None:
    """Import rlm, rsm and bench_tier_read from ``root`` (a checkout)."""
    sys.path[:0] = [str(root), str(root / "bench")]


def thread_stats() -> dict[str, list[float]]:
    """This process's threads by group: [user s, system s, voluntary switches, involuntary switches]."""
    from rlm.listener.net.server import LOOP_THREAD_NAME, WORKER_THREAD_NAME

    out: dict[str, list[float]] = {g: [0.0, 0.0, 0, 0] for g in GROUPS}
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            stat = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            status = dict(line.split(":\t", 1) for line in Path(f"/proc/self/task/{tid}/status").read_text()
                          .splitlines() if ":\t" in line)
        except OSError:  # the thread ended meanwhile
            continue
        group = {LOOP_THREAD_NAME: "loop", WORKER_THREAD_NAME: "workers",
                 "stand-in-broker": "broker"}.get(name, "other")  # comm: 15 characters at most
        acc = out[group]
        acc[0] += int(stat[11]) / TICKS
        acc[1] += int(stat[12]) / TICKS
        acc[2] += int(status["voluntary_ctxt_switches"])
        acc[3] += int(status["nonvoluntary_ctxt_switches"])
    return out


class StandInBroker:
    """ApiVersions, ListOffsets (log start ``log_start``) and Fetch (OFFSET_OUT_OF_RANGE below it) on a thread; with
    ``log`` (``--live``: the partition's batches in one buffer, and each batch's base offset and place in it), a
    Fetch at or past the log start is answered with whole batches from ``log``, up to the partition's max bytes (at
    least one), as a broker answers from its local log."""

    def __init__(self, log_start: int, log: tuple[bytes, list[int], list[int]] | None = None) -> None:
        self.log_start = log_start
        self.log = log
        self.port = 0
        self._ready = threading.Event()
        threading.Thread(target=self._run, name="stand-in-broker", daemon=True).start()
        self._ready.wait()

    def _run(self) -> None:
        from rlm.listener.net.server import name_os_thread

        name_os_thread("stand-in-broker")  # its CPU apart from the listener's (thread_stats)

        async def main() -> None:
            server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            self.port = server.sockets[0].getsockname()[1]
            self._ready.set()
            await server.serve_forever()

        asyncio.run(main())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        from rlm.listener.protocol.codec import (
            build,
            decode_request,
            encode_fetch_response,
            encode_response,
            response_type,
        )
        from rlm.listener.protocol.frame import read_header

        try:
            while True:
                (n,) = struct.unpack(">i", await reader.readexactly(4))
                frame = await reader.readexactly(n)
                header = read_header(frame)
                req = decode_request(frame, header)
                if header.api_key == 18:  # ApiVersions
                    keys = [{"api_key": 18, "min_version": 0, "max_version": 3},
                            {"api_key": 1, "min_version": 4, "max_version": 16},
                            {"api_key": 2, "min_version": 0, "max_version": 8}]
                    out = encode_response(header, build(response_type(header), {"error_code": 0, "api_keys": keys}))
                elif header.api_key == 2:  # ListOffsets: EARLIEST the log start, LATEST past it
                    topics = [{"name": t.name, "partitions": [
                        {"partition_index": p.partition_index, "error_code": 0, "timestamp": -1, "leader_epoch": 0,
                         "offset": self.log_start if p.timestamp == -2 else self.log_start + 1000}
                        for p in t.partitions]} for t in req.topics]
                    out = encode_response(header, build(response_type(header), {"topics": topics}))
                elif header.api_key == 1 and self.log is not None:  # Fetch, --live: from the log
                    out = encode_fetch_response(header, {"responses": [
                        {"topic": getattr(t, "topic", None), "topic_id": getattr(t, "topic_id", None), "partitions": [
                            self._local(p.partition, p.fetch_offset, p.partition_max_bytes) for p in t.partitions]}
                        for t in req.topics]})
                elif header.api_key == 1:  # Fetch: below the log start
                    out = encode_fetch_response(header, {"responses": [
                        {"topic": getattr(t, "topic", None), "topic_id": getattr(t, "topic_id", None), "partitions": [
                            {"partition_index": p.partition, "error_code": 1, "high_watermark": self.log_start + 1000,
                             "last_stable_offset": self.log_start + 1000, "log_start_offset": self.log_start,
                             "aborted_transactions": None, "records": None} for p in t.partitions]}
                        for t in req.topics]})
                else:
                    raise RuntimeError(f"stand-in broker: api key {header.api_key} not served")
                writer.write(out)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass


    def _local(self, partition: int, offset: int, max_bytes: int) -> dict[str, Any]:
        """A partition's answer from :attr:`log`: whole batches from the one holding ``offset``."""
        assert self.log is not None
        blob, bases, places = self.log
        i = max(bisect.bisect_right(bases, offset) - 1, 0)
        j = i + 1
        while j < len(bases) and places[j + 1] - places[i] <= max_bytes:
            j += 1
        end = self.log_start + (bases[-1] if bases else 0)  # stands for the high watermark: past every batch
        return {"partition_index": partition, "error_code": 0, "high_watermark": end + 1_000_000,
                "last_stable_offset": end + 1_000_000, "log_start_offset": self.log_start,
                "aborted_transactions": None, "records": blob[places[i]:places[j]]}


def local_log(ctx: Any, tp: Any, records: int) -> tuple[bytes, list[int], list[int]]:
    """The partition's batches read from the tier into one buffer, each batch's base offset, and where each begins
    (one more place: the buffer's end): the log a broker would serve ``--live`` from its local segments."""
    out = bytearray()
    bases: list[int] = []
    places: list[int] = []
    offset = 0
    while offset < records:
        got = bytes(ctx.tier.fetch(tp, offset, 8 * MiB).records)
        pos = 0
        while pos + 12 <= len(got):
            base, length = struct.unpack_from(">qi", got, pos)
            bases.append(base)
            places.append(len(out) + pos)
            last = base + struct.unpack_from(">i", got, pos + 23)[0]
            pos += 12 + length
        out += got[:pos]
        offset = last + 1
    places.append(len(out))
    return bytes(out), bases, places


def client(port: int, topic: str, topic_id: str, records: int, reads: int, version: int) -> None:
    """Fetch ``topic``'s partition 0 from offset 0 to ``records``, ``reads`` times, one Fetch in flight, Fetch
    ``version`` (from v13 the topic named by its id, ``topic_id``); each answer checked; a line per read: Fetches,
    record bytes."""
    import uuid

    from rlm.listener.protocol.codec import decode_response, last_offset, new_request

    by_id = {"topic_id": uuid.UUID(topic_id)} if version >= 13 else {"topic": topic}
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    correlation = 0
    for _ in range(reads):
        offset = fetches = size = 0
        firsts: list[float] = []  # a Fetch sent -> its answer's size prefix read (the listener's turn)
        wholes: list[float] = []  # a Fetch sent -> its answer read whole (that turn and the answer's transfer)
        while offset < records:
            correlation += 1
            frame, header = new_request(1, version, correlation, "bench", {
                "replica_id": -1, "max_wait": 500, "min_bytes": 1, "max_bytes": FETCH_MAX_BYTES, "isolation_level": 0,
                "session_id": 0, "session_epoch": -1, "rack_id": "", "topics": [{**by_id, "partitions": [
                    {"partition": 0, "fetch_offset": offset, "current_leader_epoch": 0, "last_fetched_epoch": -1,
                     "log_start_offset": -1, "partition_max_bytes": PARTITION_MAX_BYTES}]}]})
            sent = time.perf_counter()
            sock.sendall(frame)
            (n,) = struct.unpack(">i", _receive(sock, 4))
            first = time.perf_counter()
            body = bytes(_receive(sock, n))
            firsts.append(first - sent)
            wholes.append(time.perf_counter() - sent)
            p = decode_response(body, header).responses[0].partitions[0]
            last = last_offset(p.records)
            if p.error_code != 0 or last is None or struct.unpack_from(">q", p.records)[0] > offset or last < offset:
                raise RuntimeError(f"bad answer at offset {offset}: error {p.error_code}, last offset {last}")
            size += len(p.records)
            offset = last + 1
            fetches += 1
        print(json.dumps({"fetches": fetches, "bytes": size, "first_ms": _quantiles(firsts),
                          "whole_ms": _quantiles(wholes)}), flush=True)
    sock.close()


def _quantiles(seconds: list[float]) -> list[float]:
    """p50, p90, p99 of ``seconds``, in ms."""
    q = statistics.quantiles(seconds, n=100, method="inclusive")
    return [q[49] * 1e3, q[89] * 1e3, q[98] * 1e3]


def _receive(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:])
        if not k:
            raise EOFError("the listener closed the connection")
        got += k
    return buf


def serve(root: Path, mib: int, reads: int, profile: str | None, version: int = FETCH_VERSION,
          live: bool = False) -> dict[str, Any]:
    """One run of ``root``'s code: the tier built, the listener started, the client's reads (Fetch ``version``;
    ``live``: every Fetch forwarded to the stand-in broker and answered from its log); the threads' use. The tier's
    view of the partition is made before the count begins (its chain, and the transactions open at its end: walked
    once over every batch of a tier without producer snapshots, which a history read after the first does not pay
    again)."""
    _code(root)
    import bench_tier_read

    from rlm.listener.net.server import ListenerServer
    from rlm.listener.routing import Router
    from rlm.listener.tier.node import NodeAnswers, NodeInfo
    from rlm.listener.upstream.proxy import Proxy
    from rlm.listener.upstream.rewrite import PeerAddresses

    profiles = profile_every_thread() if profile else []
    with tempfile.TemporaryDirectory(prefix="bench-proxy-fetch-") as tmp:
        world, tps, records = bench_tier_read.build(Path(tmp), 1, mib)
        ctx = bench_tier_read.context(world, tps)
        ctx.parallel_reads = False  # a filesystem store's (rlm.listener.tier.context.reads_wait_on_network)
        broker = StandInBroker(0, local_log(ctx, tps[0], records)) if live else StandInBroker(records)
        proxy = Proxy(ctx, PeerAddresses(1, lambda: ("127.0.0.1", 0), {}), f"127.0.0.1:{broker.port}",
                      timeout_s=30, max_response_bytes=100 * MiB)
        server = ListenerServer(Router(ctx, NodeAnswers(ctx, NodeInfo(1, "127.0.0.1", 0, "bench")), proxy=proxy),
                                "127.0.0.1", 0)
        server.start()
        for tp in tps:
            ctx.tier.partition(tp)
        try:
            before = thread_stats()
            proc = subprocess.Popen([sys.executable, __file__, "--client", str(root), str(server.port),
                                     tps[0].topic, str(tps[0].topic_id), str(records), str(reads), str(version)],
                                    stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None
            done = [json.loads(line) for line in proc.stdout]
            if proc.wait() != 0 or len(done) != reads:
                raise RuntimeError(f"the client failed (exit {proc.returncode})")
            after = thread_stats()
        finally:
            server.stop()
    if profile:
        import pstats

        merged: dict[str, pstats.Stats] = {}
        for thread, prof in profiles:
            group = "loop" if thread.name == "rlm-history-loop" else "workers"
            try:
                merged[group] = pstats.Stats(prof) if group not in merged else merged[group].add(prof)
            except TypeError:  # a profiler that never ran
                continue
        for group, stats in merged.items():
            stats.dump_stats(f"{profile}.{group}")
    used = {g: [a - b for a, b in zip(after[g], before[g], strict=True)] for g in GROUPS}
    return {"fetches": sum(d["fetches"] for d in done), "bytes": sum(d["bytes"] for d in done), "threads": used,
            "load": os.getloadavg()[0],
            **{k: [statistics.median(d[k][i] for d in done) for i in range(3)] for k in ("first_ms", "whole_ms")}}


def report(label: str, run: dict[str, Any]) -> str:
    gib, fetches = run["bytes"] / GiB, run["fetches"]
    total = sum(u + s for g, (u, s, _v, _i) in run["threads"].items() if g != "broker")
    parts = [f"{label}: {total / gib:.3f} CPU s/GiB ({total / fetches * 1e6:.0f} us a Fetch, {fetches} Fetches, "
             f"load {run['load']:.1f})"]
    for g in ("loop", "workers"):
        u, s, v, i = run["threads"][g]
        parts.append(f"{g} user {u / gib:.3f} sys {s / gib:.3f} s/GiB, switches a Fetch {v / fetches:.1f} voluntary "
                     f"{i / fetches:.1f} involuntary")
    bu, bs, _bv, _bi = run["threads"].get("broker", (0, 0, 0, 0))
    if bu or bs:  # --live: the stand-in broker's (not the listener's)
        parts.append(f"stand-in broker {(bu + bs) / gib:.3f} CPU s/GiB")
    if "first_ms" in run:  # the client's clock, p50 / p90 / p99 (the median of its reads')
        parts.append("client: first byte " + " / ".join(f"{v:.3f}" for v in run["first_ms"]) + " ms, whole answer "
                     + " / ".join(f"{v:.3f}" for v in run["whole_ms"]) + " ms (p50 / p90 / p99)")
    return "; ".join(parts)


def total_s_gib(run: dict[str, Any]) -> float:
    return sum(u + s for g, (u, s, _v, _i) in run["threads"].items() if g != "broker") / (run["bytes"] / GiB)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="data of the partition (MiB)")
    ap.add_argument("--reads", type=int, default=3, help="reads from offset 0 to the end, a run")
    ap.add_argument("--rounds", type=int, default=3, help="runs (of each checkout, with --baseline)")
    ap.add_argument("--baseline", type=Path, default=None, metavar="DIR", help="a checkout to compare with")
    ap.add_argument("--profile", type=Path, default=None, metavar="FILE")
    ap.add_argument("--fetch-version", type=int, default=FETCH_VERSION,
                    help="the client's Fetch version (12: topics by name, as before session 20)")
    ap.add_argument("--live", action="store_true",
                    help="the live path instead: every Fetch forwarded to the stand-in broker, its answer passed on")
    args = ap.parse_args()
    here = Path(__file__).resolve().parents[1]
    sides = [("this", here)] + ([("baseline", args.baseline.resolve())] if args.baseline else [])
    print(f"load average at start {os.getloadavg()}", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in sides}
    for r in range(args.rounds):
        for label, root in (sides if r % 2 == 0 else sides[::-1]):
            out = subprocess.run([sys.executable, __file__, "--serve", str(root), str(args.mib), str(args.reads),
                                  str(args.fetch_version), str(int(args.live))],
                                 check=True, capture_output=True, text=True).stdout
            run = json.loads(out.strip().splitlines()[-1])
            runs[label].append(run)
            print(report(label, run), flush=True)
    for label, done in runs.items():
        values = sorted(total_s_gib(run) for run in done)
        each = ", ".join(f"{v:.3f}" for v in values)
        print(f"{label}: median {statistics.median(values):.3f} CPU s/GiB (runs {each})")
    if args.profile:
        run = serve(here, args.mib, args.reads, str(args.profile), args.fetch_version, args.live)
        print(report("profiled (cProfile: slower than unprofiled)", run))
        print(f"stats in {args.profile}.loop, {args.profile}.workers")
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--client"]:
        _code(Path(sys.argv[2]))
        client(int(sys.argv[3]), sys.argv[4], sys.argv[5], int(sys.argv[6]), int(sys.argv[7]), int(sys.argv[8]))
    elif sys.argv[1:2] == ["--serve"]:
        print(json.dumps(serve(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), None, int(sys.argv[5]),
                               bool(int(sys.argv[6])))))
    else:
        main()
