"""The log formats of :func:`rlm.logs.setup_logging` (config ``log_format``): the ``extra=`` fields a ``log.*`` call
gives are kept in both, as keys of the JSON object and as ``key=value`` pairs after the text format's message (until
session 24 the text format dropped them: "proxy: a hole ..." came without its partition and range). Records made as
the ``logging`` module makes them, formatted by the formatter ``setup_logging`` installs."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator

import pytest

from rlm.logs import setup_logging

FormatterOf = Callable[[str], logging.Formatter]


@pytest.fixture
def formatter() -> Iterator[FormatterOf]:
    """The formatter ``setup_logging`` installs for a format; the root logger and the quieted ones restored after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    quieted = {name: logging.getLogger(name).level for name in ("botocore", "boto3", "urllib3", "s3transfer",
                                                                 "apscheduler")}

    def of(fmt: str) -> logging.Formatter:
        setup_logging("INFO", fmt)
        formatter = root.handlers[0].formatter
        assert formatter is not None
        return formatter

    try:
        yield of
    finally:
        root.handlers[:], root.level = handlers, level
        for name, was in quieted.items():
            logging.getLogger(name).setLevel(was)


def record(msg: str, extra: dict | None = None, *, exc: bool = False) -> logging.LogRecord:
    """A record as ``logging.getLogger("rlm.test").error(msg, extra=extra, exc_info=exc)`` makes it."""
    exc_info = None
    if exc:
        try:
            raise ValueError("the store said no")
        except ValueError:
            exc_info = sys.exc_info()
    return logging.getLogger("rlm.test").makeRecord("rlm.test", logging.ERROR, __file__, 1, msg, None, exc_info,
                                                     extra=extra)


def test_text_shows_the_extra_fields_after_the_message_in_the_order_given(formatter: FormatterOf) -> None:
    line = formatter("text").format(record("proxy: a hole below the broker's log start", {
        "topic_partition": "t-0", "first_offset": 40, "last_offset_inclusive": 129, "staged": [[40, 59], [60, 79]],
        "confirmed": True, "error": None, "ratio": 0.5}))
    assert line.endswith(" ERROR rlm.test: proxy: a hole below the broker's log start topic_partition=t-0 "
                         "first_offset=40 last_offset_inclusive=129 staged=[[40,59],[60,79]] confirmed=true "
                         "error=null ratio=0.5"), line
    assert formatter("text").format(record("no extras")).endswith(" ERROR rlm.test: no extras")


def test_text_quotes_a_string_with_a_space_quote_equals_sign_or_control_character(formatter: FormatterOf) -> None:
    """Bare where it cannot be misread (a peer, a path), a JSON string otherwise: a reader splitting on spaces
    outside quotes gets each pair back, and ``json.loads`` the value."""
    values = {"peer": "127.0.0.1:50412", "path": "/var/lib/kafka/t-0/00000000000000000040.log",
              "error": 'OSError: [Errno 28] No space left on device: "x"', "reason": "a=b", "empty": "",
              "frame": "line\nbreak\ttab", "principal": "User:alice"}
    line = formatter("text").format(record("m", values))
    assert line.split("rlm.test: m ", 1)[1] == (
        'peer=127.0.0.1:50412 path=/var/lib/kafka/t-0/00000000000000000040.log '
        'error="OSError: [Errno 28] No space left on device: \\"x\\"" reason="a=b" empty="" '
        'frame="line\\nbreak\\ttab" principal=User:alice'), line
    assert "\n" not in line
    assert json.loads('"OSError: [Errno 28] No space left on device: \\"x\\""') == values["error"]


def test_text_writes_what_json_has_no_type_for_as_its_str(formatter: FormatterOf) -> None:
    class Peer:
        def __str__(self) -> str:
            return "10.0.0.7:9092"

    line = formatter("text").format(record("m", {"peer": Peer(), "ids": (1, 2)}))
    assert line.endswith(' m peer="10.0.0.7:9092" ids=[1,2]'), line


def test_text_puts_the_exception_after_the_extra_fields(formatter: FormatterOf) -> None:
    lines = formatter("text").format(record("copy failed", {"segment": "s-1", "offset": 7}, exc=True)).split("\n")
    assert lines[0].endswith(" ERROR rlm.test: copy failed segment=s-1 offset=7"), lines
    assert lines[1] == "Traceback (most recent call last):" and lines[-1] == "ValueError: the store said no", lines


def test_text_repeats_no_standard_attribute(formatter: FormatterOf) -> None:
    """A record's own attributes (its level, logger, message, time, the ones formatting sets: ``message``,
    ``asctime``, ``exc_text``) are not fields: only what ``extra=`` gave, and no underscored name."""
    text = formatter("text")
    rec = record("boom", {"peer": "p", "_private": 1}, exc=True)
    text.format(rec)  # sets message, asctime and exc_text on the record
    line = text.format(rec).split("\n")[0]
    assert line.endswith(" rlm.test: boom peer=p"), line
    for name in ("levelname=", "msg=", "message=", "asctime=", "exc_text=", "exc_info=", "name=", "taskName=",
                 "_private="):
        assert name not in line, name


def test_json_and_text_give_the_same_fields(formatter: FormatterOf) -> None:
    extra = {"peer": "127.0.0.1:1 x", "size": 5, "staged": [[1, 2]]}
    rec = record("m", extra)
    out = json.loads(formatter("json").format(rec))
    assert {k: v for k, v in out.items() if k not in ("ts", "level", "logger", "msg")} == extra
    assert formatter("text").format(rec).endswith(' m peer="127.0.0.1:1 x" size=5 staged=[[1,2]]')
