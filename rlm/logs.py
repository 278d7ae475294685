"""Structured logging: one JSON object per line (or plain text), with ``extra=`` fields kept as keys."""

from __future__ import annotations

import json
import logging
import sys
import time

__all__ = ["JsonFormatter", "kafka_logger", "setup_logging"]

_STANDARD = set(vars(logging.LogRecord("x", 0, "x", 0, "x", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str = "INFO", fmt: str = "json") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
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
