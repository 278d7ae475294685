"""Records decoded from a batch read in chunks (iter_streamed_records, PDP-43) equal the whole-batch decoder's."""

from __future__ import annotations

import pytest

from rsm.log.batch import header_from_bytes
from rsm.log.errors import CorruptRecordBatchError
from rsm.log.records import iter_raw_records, iter_streamed_records
from tests.support.bigbatch import RECORDS, chunked, make_batch


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_streamed_records_equal_the_whole_batch_decoder(chunk):
    raw = make_batch(RECORDS)
    h = header_from_bytes(raw)
    whole = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in iter_raw_records(h, raw)]
    got = []
    for r in iter_streamed_records(h, chunked(raw, chunk), inline_bytes=1000):
        value = b"".join(bytes(c) for c in r.value_chunks()) if r.streamed else r.value
        if r.streamed or r.value is not None:
            assert r.value_size == len(value)
        got.append((r.offset, r.timestamp, r.key, value, r.headers()))
    assert got == whole
    streamed = [r.streamed for r in iter_streamed_records(h, chunked(raw, chunk), inline_bytes=1000)]
    assert streamed == [False, False, True, True, False]


def test_untaken_values_are_skipped_and_bad_bytes_named():
    raw = make_batch(RECORDS)
    h = header_from_bytes(raw)
    # values never taken: the next record still comes right
    assert [r.offset for r in iter_streamed_records(h, chunked(raw, 100), inline_bytes=10)] == list(range(100, 105))
    with pytest.raises(CorruptRecordBatchError, match="ends"):
        list(iter_streamed_records(h, chunked(raw[:-3], 100)))
    with pytest.raises(ValueError, match="compressed"):
        list(iter_streamed_records(header_from_bytes(make_batch(RECORDS, compression=1)), iter([])))
