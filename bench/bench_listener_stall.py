"""Listener event-loop stall benchmark (issue 22, r8): how long one connection's large request holds another's
ApiVersions.

    ./dev bench bench_listener_stall [--partitions 300000] [--rounds 3] [--tree PATH]

The listener's server (:class:`rlm.listener.net.server.ListenerServer`) runs in this process over a stub catalog and
tier (no broker, no store: the cheapest Fetch path, a topic that is not served, as the review's r8 repro); the
clients run in a child process (so their CPU and GIL are not the server's). Each round: one connection pings
ApiVersions back to back for a second (idle), then a second connection sends a Fetch v4 of ``--partitions``
partitions (300,000: a 4.8 MB frame, a 9 MB answer) while the first keeps pinging until the answer arrives.

Two measures, per round, idle and during the large Fetch:

- ``ping``: the ApiVersions round trips the client saw (wall clock, p50/p99/max);
- ``lag``: an event-loop lag probe inside the server (:class:`LagProbe`): a task on the server's loop that sleeps
  1 ms and records how late it wakes.

Both are wall-clock: on a shared, loaded machine they are noise-bound (compare idle with during; run it when the
load is low). A round trip takes the GIL back after each system call the loop makes (epoll, recv, send): with a
worker running Python each costs up to ``sys.getswitchinterval()`` (5 ms), so ``ping`` counts several of those where
``lag`` counts one; ``--switch-interval-ms`` sets it for the server process.

A third measure is not wall-clock: each callback the server's event loop runs is timed by the loop thread's CPU
time (:class:`CallbackClock`), and the longest during the large Fetch are listed with the coroutines they left off
in: what holds the loop itself, whatever the machine's load (the loop's GIL waits are not in it: the switch
interval bounds those).

``--tree PATH`` imports ``rlm`` from another checkout (e.g. a git worktree of an older commit) to compare.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import io
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any


def frame(api_key: int, version: int, body: bytes, correlation_id: int = 1) -> bytes:
    payload = struct.pack(">hhih", api_key, version, correlation_id, 1) + b"x" + body
    return struct.pack(">i", len(payload)) + payload


def recv_exactly(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(min(n - len(buf), 1 << 20))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def recv_frame(s: socket.socket) -> bytes:
    (n,) = struct.unpack(">i", recv_exactly(s, 4))
    return recv_exactly(s, n)


# ------------------------------------------------------------------------------------------------- client
def client(port: int, partitions: int, idle_s: float) -> None:
    """The child process: pings ApiVersions idle, then while the large Fetch is answered; prints JSON."""
    from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
    from kio.serial import entity_writer

    out = io.BytesIO()
    entity_writer(FetchRequest)(out, FetchRequest(max_wait=datetime.timedelta(0), min_bytes=0, topics=(FetchTopic(
        topic="not-served", partitions=tuple(FetchPartition(partition=i, fetch_offset=0, partition_max_bytes=1)
                                             for i in range(partitions))),)))
    big = frame(1, 4, out.getvalue())
    ping = socket.create_connection(("127.0.0.1", port))
    ping.settimeout(300)

    def ping_once() -> float:
        t = time.perf_counter()
        ping.sendall(frame(18, 0, b""))
        recv_frame(ping)
        return time.perf_counter() - t

    def pings(until: Any) -> list[float]:
        out = []
        while not until():
            out.append(ping_once())
            time.sleep(0.002)
        return out

    marks = {"idle_start": time.time()}
    end = time.monotonic() + idle_s
    idle = pings(lambda: time.monotonic() >= end)
    done: dict[str, float] = {}

    def large() -> None:
        c = socket.create_connection(("127.0.0.1", port))
        c.settimeout(600)
        t = time.monotonic()
        c.sendall(big)
        done["bytes"] = len(recv_frame(c))
        done["s"] = time.monotonic() - t

    marks["during_start"] = time.time()
    th = threading.Thread(target=large)
    th.start()
    during = pings(lambda: not th.is_alive())
    marks["during_end"] = time.time()
    print(json.dumps({"idle": idle, "during": during, "frame_bytes": len(big), **done, **marks}))


# ------------------------------------------------------------------------------------------------- server
class CallbackClock:
    """Times every callback the event loop of thread ``thread_name`` runs (asyncio's ``Handle._run``), by that
    thread's CPU time; keeps those over ``min_s`` as (wall time, CPU s, what ran: the callback and, for a task, the
    coroutines it left off in)."""

    def __init__(self, thread_name: str = "rlm-history-loop", min_s: float = 0.001) -> None:
        import asyncio.events

        self.samples: list[tuple[float, float, str]] = []
        handle_run = asyncio.events.Handle._run
        me = self

        def _run(handle: Any) -> None:
            if threading.current_thread().name != thread_name:
                handle_run(handle)
                return
            c = time.thread_time()
            handle_run(handle)
            cpu = time.thread_time() - c
            if cpu > min_s:
                me.samples.append((time.time(), cpu, me.describe(handle)))

        asyncio.events.Handle._run = _run  # type: ignore[method-assign]

    @staticmethod
    def describe(handle: Any) -> str:
        cb = getattr(handle, "_callback", None)
        task = getattr(cb, "__self__", None)
        coro = task.get_coro() if isinstance(task, asyncio.Task) else None
        if coro is None:
            return getattr(cb, "__qualname__", repr(cb))
        where = []
        while coro is not None and hasattr(coro, "cr_frame"):
            frame = coro.cr_frame
            where.append(f"{coro.__qualname__}" + (f":{frame.f_lineno}" if frame is not None else ""))
            coro = coro.cr_await
        return " > ".join(where)

    def window(self, start: float, end: float) -> list[tuple[float, str]]:
        return sorted(((cpu, what) for at, cpu, what in self.samples if start <= at <= end), reverse=True)


class LagProbe:
    """A task on the server's loop: sleeps 1 ms, records (wall time, lateness). Nothing else: any system call it
    made would release the GIL and wait up to a switch interval to take it back, delaying the loop itself."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(0.001)
            self.samples.append((time.time(), loop.time() - t - 0.001))

    def window(self, start: float, end: float) -> list[float]:
        return [late for at, late in self.samples if start <= at <= end]


def start_server() -> Any:
    from rlm.listener.net.principals import Client  # noqa: F401 - the API the stubs answer
    from rlm.listener.net.server import ListenerServer
    from rlm.listener.routing import Router
    from rlm.listener.tier.catalog import ServedTopic
    from rlm.listener.tier.context import TierContext
    from rlm.listener.tier.node import NodeAnswers, NodeInfo

    served = ServedTopic("served", uuid.UUID(int=1), (0,))

    class Catalog:
        def topics(self) -> dict[str, Any]:
            return {served.name: served}

        def by_name(self, name: str) -> Any:
            return served if name == served.name else None

        def by_id(self, topic_id: Any) -> Any:
            return served if topic_id == served.topic_id else None

    class Tier:
        def partition(self, tp: Any) -> None:
            return None

    class AllowAll:
        def allowed(self, principal: str, host: str, operation: str, topics: Any) -> set[str]:
            return set(topics)

    ctx = TierContext(Catalog(), Tier(), AllowAll())  # type: ignore[arg-type]
    router = Router(ctx, NodeAnswers(ctx, NodeInfo(1, "127.0.0.1", 0, "bench")))
    return ListenerServer(router, "127.0.0.1", 0).start()


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(int(q * len(xs)), len(xs) - 1)] * 1000 if xs else float("nan")


def row(name: str, xs: list[float]) -> str:
    return f"{name:<9} {len(xs):>6} {pct(xs, .5):>8.2f} {pct(xs, .99):>8.2f} {max(xs, default=0) * 1000:>8.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=300_000, help="partitions of the large Fetch v4")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=1.0, help="idle pinging before each large Fetch")
    ap.add_argument("--switch-interval-ms", type=float, default=None,
                    help="sys.setswitchinterval for the server process (Python's default: 5 ms)")
    ap.add_argument("--tree", type=Path, default=None, help="import rlm from this checkout instead")
    ap.add_argument("--client", type=int, default=None, help=argparse.SUPPRESS)  # the child process: server port
    args = ap.parse_args()
    if args.client is not None:
        client(args.client, args.partitions, args.idle_s)
        return
    if args.tree is not None:
        sys.path.insert(0, str(args.tree.resolve()))
    import rlm

    if args.switch_interval_ms is not None:
        sys.setswitchinterval(args.switch_interval_ms / 1000)
    clock = CallbackClock()
    srv = start_server()
    probe = LagProbe()
    task = asyncio.run_coroutine_threadsafe(probe.run(), srv._loop)
    print(f"rlm from {Path(rlm.__file__).parent.parent}; load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores; Fetch v4 of {args.partitions} partitions; switch interval "
          f"{sys.getswitchinterval() * 1000:g} ms; times in ms")
    worst: dict[str, list[float]] = {"ping": [], "lag": [], "callback": []}
    try:
        for r in range(args.rounds):
            out = subprocess.run([sys.executable, __file__, "--client", str(srv.port), "--partitions",
                                  str(args.partitions), "--idle-s", str(args.idle_s)],
                                 capture_output=True, text=True, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            lag_idle = probe.window(res["idle_start"], res["during_start"])
            lag_during = probe.window(res["during_start"], res["during_end"])
            print(f"\nround {r + 1}: frame {res['frame_bytes'] / 1e6:.1f} MB, answered in {res['s']:.1f} s "
                  f"({res['bytes'] / 1e6:.1f} MB)")
            print(f"{'':<9} {'n':>6} {'p50':>8} {'p99':>8} {'max':>8}")
            for name, idle, during in (("ping", res["idle"], res["during"]), ("lag", lag_idle, lag_during)):
                print(row(f"{name}", idle) + "   idle")
                print(row(f"{name}", during) + "   during the large Fetch")
                worst[name].append(max(during, default=0) * 1000)
            longest = clock.window(res["during_start"], res["during_end"])
            worst["callback"].append(longest[0][0] * 1000 if longest else 0.0)
            print("longest event-loop callbacks during the large Fetch, by the loop's CPU (ms): " + (
                "; ".join(f"{cpu * 1000:.1f} ({what})" for cpu, what in longest[:3]) or "none over 1 ms"))
    finally:
        task.cancel()
        srv.stop()
    print("\nworst during the large Fetch, per round (ms): " + "; ".join(
        f"{k} {', '.join(f'{v:.1f}' for v in vs)}" for k, vs in worst.items()))


if __name__ == "__main__":
    main()
