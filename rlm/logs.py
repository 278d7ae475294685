"""Structured logging: one JSON object per line (or plain text), with ``extra=`` fields kept as keys (text:
``key=value`` pairs after the message)."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import Counter

__all__ = ["CLIENT_LINES", "JsonFormatter", "LinesPerSite", "TextFormatter", "kafka_logger", "limited_logger",
           "setup_logging"]

_STANDARD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime", "taskName"}


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a ``log.*`` call gave in ``extra=`` (every attribute of ``record`` a bare LogRecord lacks, but
    those named with a leading underscore), in the order given."""
    return {key: value for key, value in vars(record).items() if key not in _STANDARD and not key.startswith("_")}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(_extras(record))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message key=value ...``, the ``extra=`` fields (:func:`_extras`) in the order given, then
    the exception's traceback on the lines after, as :class:`logging.Formatter` writes it. A value is written as the
    JSON format writes it (``json.dumps``, ``str`` of what JSON has no type for), without spaces after its
    separators; a ``str`` bare unless it is empty or holds a space, a quote, ``=`` or a character that is not
    printable: then as a JSON string (``peer=127.0.0.1:50412 error="unexpected end of data"``)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging.Formatter's name)
        line = super().formatMessage(record)
        fields = _extras(record)
        if not fields:
            return line
        return line + " " + " ".join(f"{key}={_text_value(value)}" for key, value in fields.items())


def _text_value(value: Any) -> str:
    if isinstance(value, str):
        if value and value.isprintable() and not any(c in value for c in ' "='):
            return value
        return json.dumps(value)
    return json.dumps(value, default=str, separators=(",", ":"))


def setup_logging(level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("botocore", "boto3", "urllib3", "s3transfer", "apscheduler"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))


class _CappedAtWarning(logging.Filter):
    """librdkafka logs what its clients retry on their own (a broker that is down or restarting, a coordinator
    still loading) at error level; failures that matter reach us through the client's API (exceptions, error
    events). Its lines are capped at WARNING, so an ERROR in our logs is ours."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.WARNING:
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_KAFKA_LOGGER = logging.getLogger("rlm.librdkafka")
_KAFKA_LOGGER.addFilter(_CappedAtWarning())


def kafka_logger() -> logging.Logger:
    """The logger librdkafka's clients write to (confluent-kafka's ``logger`` property) instead of stderr.

    confluent-kafka hands a client's log lines over when the client is polled, so a client that is not polled
    otherwise (an AdminClient) is polled after use (:class:`rlm.discovery.ClusterView`)."""
    return _KAFKA_LOGGER


SUPPRESSED = Counter("rlm_log_lines_suppressed", "Log lines left out by a per-line rate limit (the Kafka listener's: "
                     "lines a client can cause)", ["logger"])

LINES_PER_SITE = 10
"""Lines of one call site (a ``log.*`` line in the code) written per :data:`SITE_INTERVAL_S` at most."""
SITE_INTERVAL_S = 60.0


class LinesPerSite(logging.Filter):
    """At most ``lines`` records of one call site (file and line of the ``log.*`` call) per ``interval_s``.

    For what clients cause: the Kafka listener writes a line for each bad frame, undecodable request, refused
    certificate or failed SASL login, and a client can cause thousands a second (measured: 4,000 lines/s from one
    connection sending undecodable requests, ~1 MB/s of JSON; failed logins run in parallel on up to
    ``max_connections_per_ip`` connections). A line left out is counted (``rlm_log_lines_suppressed``, by logger);
    the first line of the site's next window says how many of its lines the window before left out (``suppressed``
    and the message). Keyed by call site, not message, as messages name peers. A site's window starts with its first
    line; sites are the code's lines, a bounded set."""

    def __init__(self, lines: int = LINES_PER_SITE, interval_s: float = SITE_INTERVAL_S, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.lines, self.interval_s, self._clock = lines, interval_s, clock
        self._sites: dict[tuple[str, int], list] = {}  # site -> [window start, lines written, lines left out]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        site = (record.pathname, record.lineno)
        with self._lock:
            now = self._clock()
            window = self._sites.get(site)
            if window is None or now - window[0] >= self.interval_s:
                left_out = window[2] if window is not None else 0
                self._sites[site] = [now, 1, 0]
                if left_out:
                    record.suppressed = left_out
                    record.msg = (f"{record.msg} ({left_out} more line(s) of this kind in the "
                                  f"{self.interval_s:.0f} s before were not logged)")
                return True
            if window[1] < self.lines:
                window[1] += 1
                return True
            window[2] += 1
        SUPPRESSED.labels(record.name).inc()
        return False

    def reset(self) -> None:
        """Forget every site's window (tests: each starts with a full allowance)."""
        with self._lock:
            self._sites.clear()


CLIENT_LINES = LinesPerSite()


def limited_logger(name: str) -> logging.Logger:
    """``logging.getLogger(name)`` with :class:`LinesPerSite`: for modules whose lines clients can cause (the Kafka
    listener's). One limiter for all of them."""
    logger = logging.getLogger(name)
    if CLIENT_LINES not in logger.filters:
        logger.addFilter(CLIENT_LINES)
    return logger
