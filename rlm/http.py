"""``/metrics`` (Prometheus text format) and the health endpoints (JSON) on the configured listen address.

``/health`` and ``/health/ready``: readiness (200 or 503, the checks of :mod:`rlm.health`); ``/health/live``:
liveness (200 or 503), for Kubernetes-style probes."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

__all__ = ["OpsServer"]

HealthCheck = Callable[[], tuple[bool, dict[str, object]]]


class OpsServer:
    """A small threaded HTTP server; ``health`` returns (healthy, details) and maps to 200 or 503."""

    def __init__(self, host: str, port: int, health: HealthCheck, live: HealthCheck | None = None) -> None:
        handler = _make_handler(health, live or health)
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="rlm-http", daemon=True)

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def start(self) -> OpsServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _make_handler(health: HealthCheck, live: HealthCheck) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path.startswith("/metrics"):
                body, status, ctype = generate_latest(REGISTRY), 200, CONTENT_TYPE_LATEST
            elif self.path.startswith("/health"):
                ok, details = live() if self.path.startswith("/health/live") else health()
                body = json.dumps({"status": "ok" if ok else "unhealthy", **details}, default=str).encode()
                status, ctype = (200 if ok else 503), "application/json"
            else:
                body, status, ctype = b"not found\n", 404, "text/plain"
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # keep access logs out of the structured log
            return None

    return Handler
