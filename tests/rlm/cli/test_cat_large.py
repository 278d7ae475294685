"""rlm cat writes a record whose value is streamed (PDP-43) as the same JSON line it writes for one held whole."""

from __future__ import annotations

import base64
import io
import json

import pytest

from rlm.cli.cat import _b64, write_large
from rlm.tier import LargeRemoteRecord
from rsm.log.batch import header_from_bytes
from rsm.log.records import iter_raw_records, iter_streamed_records
from tests.support.bigbatch import RECORDS, chunked, make_batch


@pytest.mark.parametrize("text", [False, True])
def test_cat_writes_a_streamed_record_as_it_writes_a_whole_one(text):
    raw = make_batch(RECORDS)
    h = header_from_bytes(raw)
    enc = (lambda v: None if v is None else v.decode("utf-8", "replace")) if text else _b64
    whole = {r.offset: r for r in iter_raw_records(h, raw)}
    lines = 0
    for sr in iter_streamed_records(h, chunked(raw, 333), inline_bytes=1000):
        if not sr.streamed:
            continue
        out = io.StringIO()
        write_large(out, LargeRemoteRecord("t", 0, sr, 0, 7), enc, text)
        w = whole[sr.offset]
        expected = json.dumps({"offset": w.offset, "timestamp": w.timestamp, "key": enc(w.key),
                               "value": enc(w.value), "headers": [[k, _b64(v)] for k, v in w.headers],
                               "leader_epoch": 7}) + "\n"
        assert out.getvalue() == expected
        if not text:
            assert base64.b64decode(json.loads(out.getvalue())["value"]) == w.value
        lines += 1
    assert lines == 2
