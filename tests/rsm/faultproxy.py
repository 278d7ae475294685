"""A fault-injecting HTTP proxy for S3 tests: sits on 127.0.0.1 in front of the moto server and, for a share
of requests, answers 500 or 503, drops the connection before or after forwarding, or cuts a response body
short. Seeded, so a failing run can be replayed."""

from __future__ import annotations

import http.client
import random
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

__all__ = ["FaultProxy"]

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "expect", "upgrade", "te", "trailer"}
FAULTS = ("status500", "status503", "drop_before", "drop_after", "truncate")


class FaultProxy:
    """``with FaultProxy(upstream, rate=0.3) as proxy: ... proxy.url ...``; ``proxy.injected`` counts faults."""

    def __init__(self, upstream_url: str, *, rate: float, seed: int = 1, faults: tuple[str, ...] = FAULTS) -> None:
        u = urlsplit(upstream_url)
        self.upstream = (u.hostname or "127.0.0.1", u.port or 80)
        self.rate = rate
        self.faults = faults
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.injected: Counter[str] = Counter()
        self.forwarded = 0
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                return None

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                fault = proxy._pick()
                if fault == "drop_before":
                    self.close_connection = True
                    return
                if fault in ("status500", "status503"):
                    code = 500 if fault == "status500" else 503
                    err = b"<Error><Code>%s</Code><Message>injected</Message></Error>" % (
                        b"InternalError" if code == 500 else b"SlowDown")
                    self.send_response(code)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(err)))
                    self.end_headers()
                    self.wfile.write(err)
                    return
                conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    with proxy._lock:
                        proxy.forwarded += 1
                finally:
                    conn.close()
                if fault == "drop_after":
                    self.close_connection = True
                    return
                self.send_response(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in _HOP and (k.lower() != "content-length" or self.command == "HEAD"):
                        self.send_header(k, v)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if fault == "truncate" and self.command == "GET" and len(data) > 1:
                    self.wfile.write(data[:len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)

    def _pick(self) -> str | None:
        with self._lock:
            if self._rng.random() >= self.rate:
                return None
            fault = self._rng.choice(self.faults)
            self.injected[fault] += 1
            return fault

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
