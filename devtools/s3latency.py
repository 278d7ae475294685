"""A latency-emulating S3: an HTTP proxy on 127.0.0.1 in front of a real S3 server (s3proxy, moto) that makes each
request cost what it costs on a real object store, for benchmarks and tests (issue 25).

The model (defaults: S3 Standard as measured; put your provider's own figures on the command line):

- first byte: every request but a PUT answers after a delay drawn lognormal, median ``first_byte_median_ms``
  (27 ms), shape ``first_byte_sigma`` (0.6: p99 about 110 ms), never under ``first_byte_floor_ms`` (10 ms);
  the time the upstream server took counts towards it;
- PUT: ``put_base_ms + put_ms_per_mib * MiB`` (60 ms + 20 ms per MiB): the request body is taken from the client
  at 1 MiB per ``put_ms_per_mib`` and the answer sent once the whole cost has passed;
- bandwidth: each connection's response bodies are paced to ``bandwidth_bytes_per_s`` (88 MB/s), as one
  connection to S3 carries (a client gets more only with more connections);
- outliers: with probability ``outlier_rate`` a request waits ``outlier_min_s..outlier_max_s`` (0.4-2 s, uniform)
  more before its first byte (the slow requests hedging is for);
- seeded: one generator (``seed``) draws every delay, in the order requests arrive.

Bodies stream through in chunks of ``CHUNK_BYTES`` both ways: no object is ever held whole. One thread per client
connection, each with its own keep-alive connection to the upstream server. Request bodies need a
``Content-Length`` (what boto3 sends); a chunked request body is answered 411.

Usage, in a test or benchmark (like :class:`tests.rsm.faultproxy.FaultProxy`)::

    with S3Latency(s3.endpoint_url, LatencyModel(outlier_rate=0.01), seed=3) as lat:
        client = boto3.client("s3", endpoint_url=lat.url, ...)
        lat.stats()                     # requests, outliers, bytes, by method

or as a process (prints ``listening on http://127.0.0.1:PORT`` on stdout; its stats on stderr at exit)::

    python -m devtools.s3latency --upstream http://127.0.0.1:9000 [--port 0] [--first-byte-median-ms 27]
        [--first-byte-sigma 0.6] [--first-byte-floor-ms 10] [--put-base-ms 60] [--put-ms-per-mib 20]
        [--bandwidth-mb-per-s 88] [--outlier-rate 0] [--outlier-min-s 0.4] [--outlier-max-s 2] [--seed 1]
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import random
import select
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

__all__ = ["CHUNK_BYTES", "LatencyModel", "S3Latency", "model_from_argv"]

MiB = 1024 * 1024
CHUNK_BYTES = 256 * 1024
"""Bodies move through the proxy in chunks of this size (and are paced per chunk)."""

# Hop-by-hop headers: never forwarded (RFC 9110 7.6.1), plus Expect (the proxy answers 100-continue itself).
_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "expect", "upgrade", "te",
                  "trailer"})


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """What each request costs (see the module doc). Units are in the names."""

    first_byte_median_ms: float = 27.0
    first_byte_sigma: float = 0.6
    first_byte_floor_ms: float = 10.0
    put_base_ms: float = 60.0
    put_ms_per_mib: float = 20.0
    bandwidth_bytes_per_s: float = 88e6
    outlier_rate: float = 0.0
    outlier_min_s: float = 0.4
    outlier_max_s: float = 2.0

    def __post_init__(self) -> None:
        if self.first_byte_median_ms < 0 or self.first_byte_sigma < 0 or self.first_byte_floor_ms < 0:
            raise ValueError("first-byte figures must be >= 0")
        if self.put_base_ms < 0 or self.put_ms_per_mib < 0:
            raise ValueError("PUT costs must be >= 0")
        if self.bandwidth_bytes_per_s <= 0:
            raise ValueError(f"bandwidth_bytes_per_s must be > 0, got {self.bandwidth_bytes_per_s}")
        if not 0 <= self.outlier_rate <= 1:
            raise ValueError(f"outlier_rate must be in [0, 1], got {self.outlier_rate}")
        if not 0 <= self.outlier_min_s <= self.outlier_max_s:
            raise ValueError(f"need 0 <= outlier_min_s <= outlier_max_s, got {self.outlier_min_s}, "
                             f"{self.outlier_max_s}")


class _Pacer:
    """Paces a stream of bytes to ``rate`` bytes/s from ``start`` (monotonic seconds): :meth:`sent` sleeps until
    the bytes so far would have taken that long."""

    __slots__ = ("_n", "_rate", "_start")

    def __init__(self, rate: float, start: float) -> None:
        self._rate, self._start, self._n = rate, start, 0

    def sent(self, n: int) -> None:
        self._n += n
        delay = self._start + self._n / self._rate - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class S3Latency:
    """``with S3Latency(upstream_url, model, seed=1) as lat: ... lat.url ...``: the proxy, serving on a thread."""

    def __init__(self, upstream_url: str, model: LatencyModel | None = None, *, seed: int = 1, port: int = 0,
                 upstream_timeout_s: float = 120.0) -> None:
        u = urlsplit(upstream_url)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.model = model or LatencyModel()
        self.upstream_timeout_s = upstream_timeout_s
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler_class(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="s3latency", daemon=True)
        self._serving = False

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> S3Latency:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._serving = True
        self._thread.start()

    def stop(self) -> None:
        """Stop serving (if it was) and close the listening socket. Idempotent."""
        if self._serving:
            self._serving = False
            self._server.shutdown()  # waits for serve_forever to return: never call it where that runs
        self._server.server_close()

    def serve_forever(self) -> None:
        """Serve on the calling thread until :meth:`stop` is called from another."""
        self._serving = True
        self._server.serve_forever()

    def stats(self) -> dict[str, int]:
        """Counts so far: ``requests``, ``requests_<METHOD>``, ``outliers``, ``bytes_in``, ``bytes_out``."""
        with self._lock:
            return dict(self._counts)

    def _count(self, **kinds: int) -> None:
        with self._lock:
            self._counts.update(kinds)

    def draw_delay_s(self, method: str, body_bytes: int) -> float:
        """The delay of one request before its first byte (PUT: its whole cost, body upload included)."""
        m = self.model
        with self._lock:
            if method == "PUT":
                delay = (m.put_base_ms + m.put_ms_per_mib * body_bytes / MiB) / 1000
            else:
                drawn = m.first_byte_median_ms * math.exp(self._rng.gauss(0.0, m.first_byte_sigma))
                delay = max(m.first_byte_floor_ms, drawn) / 1000
            if m.outlier_rate and self._rng.random() < m.outlier_rate:
                delay += self._rng.uniform(m.outlier_min_s, m.outlier_max_s)
                self._counts["outliers"] += 1
        return delay


def _handler_class(proxy: S3Latency) -> type[BaseHTTPRequestHandler]:
    model = proxy.model

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        _upstream: http.client.HTTPConnection | None = None

        def log_message(self, *args: object) -> None:
            return None

        def finish(self) -> None:
            if self._upstream is not None:
                self._upstream.close()
            super().finish()

        def _connection(self) -> http.client.HTTPConnection:
            """The keep-alive upstream connection, new if the server closed the last one while it was idle."""
            conn = self._upstream
            if conn is not None and conn.sock is not None:
                readable, _, _ = select.select([conn.sock], [], [], 0)
                if readable:  # an idle connection with something to read: the server closed it
                    conn.close()
            if conn is None:
                conn = self._upstream = http.client.HTTPConnection(*proxy.upstream, timeout=proxy.upstream_timeout_s)
            return conn

        def _handle(self) -> None:
            t0 = time.monotonic()
            if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                self.send_error(411, "a chunked request body is not supported: send Content-Length")
                self.close_connection = True
                return
            length = int(self.headers.get("Content-Length") or 0)
            delay = proxy.draw_delay_s(self.command, length)
            conn = self._connection()
            try:
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for k, v in self.headers.items():
                    if k.lower() not in _HOP:
                        conn.putheader(k, v)
                conn.endheaders()
                if length:
                    self._forward_request_body(conn, length, t0)
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException):
                conn.close()
                self.close_connection = True  # no answer: the client sees a dropped connection and retries
                return
            wait = t0 + delay - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            proxy._count(requests=1, **{f"requests_{self.command}": 1}, bytes_in=length)
            self._forward_response(conn, resp)

        def _forward_request_body(self, conn: http.client.HTTPConnection, length: int, t0: float) -> None:
            # a PUT's body is taken at its per-MiB cost (or the bandwidth, if that is slower); others at the bandwidth
            rate = model.bandwidth_bytes_per_s
            if self.command == "PUT" and model.put_ms_per_mib > 0:
                rate = min(rate, MiB / (model.put_ms_per_mib / 1000))
            pacer = _Pacer(rate, t0)
            buf = bytearray(min(CHUNK_BYTES, length))
            view = memoryview(buf)
            left = length
            while left:
                n = self.rfile.readinto(view[:min(left, len(buf))])
                if not n:
                    raise ConnectionError(f"client body ended {left} bytes early")
                conn.send(view[:n])
                left -= n
                pacer.sent(n)

        def _forward_response(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
            self.send_response_only(resp.status, resp.reason)
            known_length = resp.getheader("Content-Length") is not None
            for k, v in resp.getheaders():
                if k.lower() not in _HOP:
                    self.send_header(k, v)
            has_body = self.command != "HEAD" and resp.status not in (204, 304) and not 100 <= resp.status < 200
            chunked = has_body and not known_length
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            if resp.will_close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            if not has_body:
                resp.read()
                return
            pacer = _Pacer(model.bandwidth_bytes_per_s, time.monotonic())
            buf = bytearray(CHUNK_BYTES)
            view = memoryview(buf)
            sent = 0
            try:
                while True:
                    n = resp.readinto(view)
                    if not n:
                        break
                    if chunked:
                        self.wfile.write(b"%x\r\n" % n)
                        self.wfile.write(view[:n])
                        self.wfile.write(b"\r\n")
                    else:
                        self.wfile.write(view[:n])
                    sent += n
                    pacer.sent(n)
                if chunked:
                    self.wfile.write(b"0\r\n\r\n")
            except (OSError, http.client.HTTPException):
                conn.close()  # the upstream body broke, or the client went away: neither connection is reusable
                self.close_connection = True
            finally:
                proxy._count(bytes_out=sent)
            if resp.will_close:
                conn.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    d = LatencyModel()
    p = argparse.ArgumentParser(prog="python -m devtools.s3latency", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--upstream", required=True, help="the S3 server's URL, e.g. http://127.0.0.1:9000")
    p.add_argument("--port", type=int, default=0, help="port to listen on, 127.0.0.1 (0: a free one)")
    p.add_argument("--first-byte-median-ms", type=float, default=d.first_byte_median_ms)
    p.add_argument("--first-byte-sigma", type=float, default=d.first_byte_sigma, help="lognormal shape")
    p.add_argument("--first-byte-floor-ms", type=float, default=d.first_byte_floor_ms)
    p.add_argument("--put-base-ms", type=float, default=d.put_base_ms)
    p.add_argument("--put-ms-per-mib", type=float, default=d.put_ms_per_mib)
    p.add_argument("--bandwidth-mb-per-s", type=float, default=d.bandwidth_bytes_per_s / 1e6,
                   help="per connection, MB = 10^6 bytes")
    p.add_argument("--outlier-rate", type=float, default=d.outlier_rate, help="share of requests slowed")
    p.add_argument("--outlier-min-s", type=float, default=d.outlier_min_s)
    p.add_argument("--outlier-max-s", type=float, default=d.outlier_max_s)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def _model(a: argparse.Namespace) -> LatencyModel:
    return LatencyModel(a.first_byte_median_ms, a.first_byte_sigma, a.first_byte_floor_ms, a.put_base_ms,
                        a.put_ms_per_mib, a.bandwidth_mb_per_s * 1e6, a.outlier_rate, a.outlier_min_s, a.outlier_max_s)


def model_from_argv(argv: list[str]) -> LatencyModel:
    """The model the command line ``argv`` (without ``--upstream``) gives: what a benchmark passing those arguments
    to the process runs against. Raises ValueError for a model that makes no sense."""
    return _model(_parse_args(["--upstream", "http://127.0.0.1:9", *argv]))


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    try:
        model = _model(a)
    except ValueError as err:
        print(f"s3latency: {err}", file=sys.stderr)
        return 2
    lat = S3Latency(a.upstream, model, seed=a.seed, port=a.port)

    def stop(*_: object) -> None:
        threading.Thread(target=lat.stop, daemon=True).start()  # shutdown() waits for serve_forever: not here

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"listening on {lat.url}", flush=True)
    print(f"model: {json.dumps(asdict(model))}", file=sys.stderr, flush=True)
    lat.serve_forever()
    print(f"stats: {json.dumps(lat.stats())}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
