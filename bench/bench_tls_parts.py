"""How asyncio's TLS transport takes an answer handed to it in parts (issue 24): the listener's CPU per GiB written.

    ./dev bench tls_parts [--mib 512] [--rounds 3] [--tls-only]

A Fetch answered from the tier is handed to the socket as its parts (:func:`rlm.listener.protocol.codec.
fetch_response_parts`: the fields between the records joined, each partition's records its own part, never copied
into one frame). Over plaintext each ``write`` is a ``send`` from the part's own buffer. asyncio's TLS transport
(``asyncio.sslproto``) encrypts each ``write`` on its own: an ``SSLObject.write`` (a TLS record or more), a read of
the outgoing BIO and a ``transport.write`` (a ``send``) per part; ``writelines`` appends every part first, so they
are encrypted in one pass and sent with one ``transport.write``. This script measures the three ways of handing over
the same answers, the way the listener writes them (``writer.write`` per part, then ``drain`` when the transport
holds some; ``set_write_buffer_limits(high=1)`` as the listener sets it for TLS):

- ``parts``: ``writer.write`` per part (the listener's way);
- ``writelines``: ``writer.writelines(parts)``;
- ``joined``: ``writer.write(b"".join(parts))`` (a copy of the answer first);
- ``writev`` (plaintext only): :func:`rlm.listener.net.vectored.write_parts`, one ``writev`` of every part from its
  own buffer, only what the socket does not take copied into the transport (the listener's way over plaintext).

Answers of two shapes, as a consumer's history Fetch gets them: one partition of 1 MiB of records (3 parts), and 8
partitions of 128 KiB (17 parts). A client process (a blocking ``ssl`` socket) sends a 4-byte request and reads the
whole answer before the next, one in flight, as a consumer does; the server's CPU seconds (``time.process_time``,
its process holds only the event loop, with the listener's :func:`~rlm.listener.net.server.steady_malloc`) per GiB
written, and MB/s. Ways and shapes take turns each round; the median of ``--rounds`` counts. Plaintext is measured
too, for scale (``writelines`` on Python 3.11's selector transport joins the parts).

Measured 2026-11-26 (``--mib 256 --rounds 5 --tls-only``, Python 3.11.7, OpenSSL 3.0.19, a shared 2-core machine,
load 7-9), server CPU s/GiB, median (min-max):

================  ==================  ==================  ==================
shape             parts               writelines          joined
================  ==================  ==================  ==================
1 x 1 MiB         0.60 (0.59-0.67)    0.64 (0.57-1.05)    0.67 (0.64-0.73)
8 x 128 KiB       0.78 (0.71-0.80)    0.65 (0.58-0.67)    0.71 (0.59-0.76)
================  ==================  ==================  ==================

Plaintext, ``--plaintext-only --send-buffer-bytes 1048576`` (the listener's raised send buffer), 2026-11-26, load
12-16, 256 MiB x 3 rounds, server CPU s/GiB median (min-max): 1 x 1 MiB parts 0.201 (0.171-0.239), writelines 0.177,
joined 0.181, writev 0.096 (0.092-0.225); 8 x 128 KiB parts 0.512 (0.364-0.525), writelines 0.202, joined 0.189,
writev 0.098 (0.096-0.266).

So the parts cost nothing over TLS at the shape a consumer's history Fetch gets (1 MiB of records a partition: two
parts a MiB), and ~0.13 CPU s/GiB (16%) more than ``writelines`` at 17 parts a MiB; joining costs more than
either (without ``steady_malloc`` the joined answer cost 2.0-2.2 s/GiB: its buffer page-faulted in each time).
Again 2026-11-26 (``--mib 128 --rounds 3 --tls-only``, load 8-21): 1 x 1 MiB parts 0.700, writelines 0.757, joined
0.756; 8 x 128 KiB parts 0.924, writelines 0.736, joined 0.865. The listener hands TLS connections an answer's
parts with one ``writelines`` (no worse at one partition, a fifth less at eight), plaintext ones with ``writev``.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import socket
import ssl
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024
GiB = 1024 * MiB
WAYS = ("parts", "writelines", "joined", "writev")  # writev: plaintext only
SHAPES = {"1 x 1 MiB": (1, MiB), "8 x 128 KiB": (8, 128 * 1024)}
SIZE = struct.Struct(">i")
SEND_BUFFER_BYTES = 0  # --send-buffer-bytes (0: the OS's auto-tuned one)


def answer_parts(partitions: int, records_bytes: int) -> list[bytes]:
    """An answer's parts as fetch_response_parts lays them out: the fields before the first records joined (~60 B),
    each partition's records (one buffer each), the fields between them (~40 B), the trailer."""
    records = os.urandom(records_bytes)
    parts: list[bytes] = [b"h" * 60]
    for i in range(partitions):
        parts.append(bytes(records))  # a buffer of its own per partition, as the tier's reads give
        parts.append(b"f" * (40 if i < partitions - 1 else 3))
    size = sum(map(len, parts)) - SIZE.size
    parts[0] = SIZE.pack(size) + parts[0][SIZE.size:]
    return parts


async def serve(port_q: multiprocessing.Queue, tls: tuple[str, str] | None, way: str, parts: list[bytes],
                answers: int, out: multiprocessing.Queue) -> None:
    from rlm.listener.net.vectored import write_parts

    ctx = None
    if tls is not None:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.load_cert_chain(*tls)
    done = asyncio.get_running_loop().create_future()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.set_write_buffer_limits(high=1 if ctx is not None else 0)
        if SEND_BUFFER_BYTES:  # as the listener raises it for connections taking large answers
            writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for _ in range(answers):
            await reader.readexactly(4)
            if way == "parts":
                for p in parts:
                    writer.write(p)
            elif way == "writelines":
                writer.writelines(parts)
            elif way == "writev":
                write_parts(writer.transport, parts)
            else:
                writer.write(b"".join(parts))
            if writer.transport.get_write_buffer_size():
                await writer.drain()
        await reader.readexactly(4)  # the client has read the last answer whole
        out.put((time.process_time() - cpu0, time.perf_counter() - t0))
        writer.close()
        done.set_result(None)

    server = await asyncio.start_server(connection, "127.0.0.1", 0, ssl=ctx)
    port_q.put(server.sockets[0].getsockname()[1])
    await done
    server.close()


def server_main(port_q: multiprocessing.Queue, tls: tuple[str, str] | None, way: str, shape: tuple[int, int],
                answers: int, out: multiprocessing.Queue) -> None:
    from rlm.listener.net.server import steady_malloc

    steady_malloc()  # as the listener's process: a joined answer's buffer is not page-faulted in again each time
    asyncio.run(serve(port_q, tls, way, answer_parts(*shape), answers, out))


def client_main(port: int, ca: str | None, answer_bytes: int, answers: int) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    if ca is not None:
        ctx = ssl.create_default_context(cafile=ca)
        sock = ctx.wrap_socket(sock, server_hostname="127.0.0.1")
    buf = memoryview(bytearray(1 << 20))
    for _ in range(answers + 1):
        sock.sendall(b"next")
        left = answer_bytes if _ < answers else 0
        while left:
            n = sock.recv_into(buf, min(left, len(buf)))
            if not n:
                raise RuntimeError("server closed")
            left -= n
    sock.close()


def one(tls: tuple[str, str] | None, ca: str | None, way: str, shape: tuple[int, int], total: int
        ) -> tuple[float, float]:
    """CPU s per GiB and MB/s of one run."""
    answer_bytes = sum(map(len, answer_parts(*shape)))
    answers = max(1, total // answer_bytes)
    port_q: multiprocessing.Queue = multiprocessing.Queue()
    out: multiprocessing.Queue = multiprocessing.Queue()
    srv = multiprocessing.Process(target=server_main, args=(port_q, tls, way, shape, answers, out))
    srv.start()
    port = port_q.get(timeout=30)
    cli = multiprocessing.Process(target=client_main, args=(port, ca, answer_bytes, answers))
    cli.start()
    cpu, wall = out.get(timeout=600)
    cli.join(60)
    srv.join(60)
    gib = answers * answer_bytes / GiB
    return cpu / gib, answers * answer_bytes / 1e6 / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=512, help="answers' bytes per run")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tls-only", action="store_true", help="leave plaintext out")
    ap.add_argument("--plaintext-only", action="store_true", help="leave TLS out")
    ap.add_argument("--send-buffer-bytes", type=int, default=0,
                    help="the server socket's SO_SNDBUF (the listener raises it to 1 MiB: 1048576); 0: the OS's")
    args = ap.parse_args()
    global SEND_BUFFER_BYTES
    SEND_BUFFER_BYTES = args.send_buffer_bytes
    from devtools.certs import make_tls_files

    got: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    load = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="bench-tls-parts-") as tmp:
        files = make_tls_files(Path(tmp), "unused")
        tls = (str(files.server_pem), str(files.server_key_pem))
        for rnd in range(args.rounds):
            for name, shape in SHAPES.items():
                protos = ("TLS",) if args.tls_only else ("plaintext",) if args.plaintext_only else ("TLS", "plaintext")
                for proto in protos:
                    ways = [w for w in WAYS if proto == "plaintext" or w != "writev"]
                    for way in ways if rnd % 2 == 0 else ways[::-1]:
                        r = one(tls if proto == "TLS" else None, str(files.ca_pem) if proto == "TLS" else None, way,
                                shape, args.mib * MiB)
                        got.setdefault((proto, name, way), []).append(r)
                        print(f"  {proto} {name} {way}: {r[0]:.3f} CPU s/GiB, {r[1]:.0f} MB/s", file=sys.stderr)
    load.append(os.getloadavg())
    print(f"\n{'':32} {'server CPU s/GiB (median, min-max)':>36} {'MB/s median':>12}")
    for (proto, name, way), rs in got.items():
        cpus = [c for c, _ in rs]
        print(f"{proto + ' ' + name + ' ' + way:32} {statistics.median(cpus):>20.3f} "
              f"({min(cpus):.3f}-{max(cpus):.3f}) {statistics.median(m for _, m in rs):>12.0f}")
    print(f"\n{args.mib} MiB per run, {args.rounds} rounds; Python {sys.version.split()[0]}, {ssl.OPENSSL_VERSION}; "
          f"{os.cpu_count()} cores; load average (1/5/15 min) before {'/'.join(f'{x:.1f}' for x in load[0])}, "
          f"after {'/'.join(f'{x:.1f}' for x in load[1])}")


if __name__ == "__main__":
    main()
