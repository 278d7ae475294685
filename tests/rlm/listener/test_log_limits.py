"""The lines a client can make the listener log are limited per line of code (:class:`rlm.logs.LinesPerSite`): a
client sending undecodable requests or failing SASL logins gets every answer it is owed, and the log gets ten lines
of each kind a minute, the rest counted (``rlm_log_lines_suppressed``) and their number given by the next line of the
kind. Over real sockets against the real server (the stub tier of :mod:`tests.support.stub_listener`: no broker
needed)."""

from __future__ import annotations

import logging
import socket
import struct
import time

import pytest
from prometheus_client import REGISTRY

from rlm.config import HistorySaslSettings
from rlm.listener.net.server import ConnectionLimits
from rlm.logs import CLIENT_LINES, LINES_PER_SITE, LinesPerSite
from tests.rlm.listener.raw_wire import plain_login, recv_frame, request
from tests.support.stub_listener import serving

METADATA = 3
INVALID_REQUEST = 42


def suppressed(logger: str) -> float:
    return REGISTRY.get_sample_value("rlm_log_lines_suppressed_total", {"logger": logger}) or 0


def lines(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


def test_undecodable_requests_are_all_answered_and_ten_are_logged(caplog: pytest.LogCaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """500 undecodable requests on one connection (a Metadata v1 body of one byte): 500 INVALID_REQUEST answers, 10
    "request does not decode" lines (500 before: 4,000 lines a second from one client), 490 counted. Once the
    minute is over (the limiter's clock moved by hand) the next such line says 490 were left out."""
    caplog.set_level(logging.INFO)
    now = [time.monotonic()]
    monkeypatch.setattr(CLIENT_LINES, "_clock", lambda: now[0])
    logger = "rlm.listener.net.server"
    before = suppressed(logger)
    with serving(ConnectionLimits()) as srv, socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
        for i in range(500):
            s.sendall(request(METADATA, 1, b"\xff", correlation_id=i))
            frame = recv_frame(s)
            assert frame is not None and struct.unpack_from(">i", frame)[0] == i, f"request {i} answered"
        assert len(lines(caplog, "request does not decode")) == LINES_PER_SITE
        assert suppressed(logger) - before == 500 - LINES_PER_SITE
        now[0] += CLIENT_LINES.interval_s
        s.sendall(request(METADATA, 1, b"\xff", correlation_id=501))
        assert recv_frame(s) is not None
    last = lines(caplog, "request does not decode")[-1]
    assert len(lines(caplog, "request does not decode")) == LINES_PER_SITE + 1
    assert last.suppressed == 500 - LINES_PER_SITE  # type: ignore[attr-defined]
    assert f"{500 - LINES_PER_SITE} more line(s) of this kind" in last.getMessage()


def test_failed_logins_are_limited_and_a_good_login_still_logged(caplog: pytest.LogCaptureFixture) -> None:
    """40 failed SASL PLAIN logins, each on its own connection, each refused: 10 "SASL authentication failed" lines,
    30 counted. A good login then still gets its own line (another line of code, its own allowance)."""
    caplog.set_level(logging.INFO)
    sasl = HistorySaslSettings(mechanisms=["PLAIN"], users={"alice": "pw-secret-123"})
    logger = "rlm.listener.net.sasl"
    before = suppressed(logger)
    with serving(ConnectionLimits(), sasl) as srv:
        for _ in range(40):
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
                assert not plain_login(s, "alice", "wrong")
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
            assert plain_login(s, "alice", "pw-secret-123")
    assert len(lines(caplog, "SASL authentication failed")) == LINES_PER_SITE
    assert suppressed(logger) - before == 40 - LINES_PER_SITE
    assert len(lines(caplog, "client authenticated")) == 1


def test_the_allowance_is_per_line_of_code_and_per_window() -> None:
    """Two call sites, a clock moved by hand: each site has its own 3 lines a window; a new window starts with the
    site's first line after it, which carries the count left out."""
    now = [100.0]
    limit = LinesPerSite(3, 60.0, clock=lambda: now[0])

    def record(lineno: int) -> logging.LogRecord:
        return logging.LogRecord("rlm.listener.x", logging.WARNING, "/x.py", lineno, "bad %s", ("frame",), None)

    assert [limit.filter(record(1)) for _ in range(5)] == [True, True, True, False, False]
    assert [limit.filter(record(2)) for _ in range(4)] == [True, True, True, False]
    now[0] += 59.9
    assert not limit.filter(record(1))
    now[0] += 0.1
    first = record(1)
    assert limit.filter(first)
    assert first.suppressed == 3  # type: ignore[attr-defined]
    assert first.getMessage() == "bad frame (3 more line(s) of this kind in the 60 s before were not logged)"
    assert [limit.filter(record(1)) for _ in range(3)] == [True, True, False]
