"""A Fetch answer carrying a batch too large to hold (PDP-43) is the same frame, byte for byte, as the one encoded
with the batch's bytes in it: the parts around it, the records' length prefix and the frame's size rewritten."""

from __future__ import annotations

import uuid

import pytest

from rlm.listener.net.chunked import ChunkedAnswer, encode_streamed
from rlm.listener.protocol.codec import build, encode_response, response_type
from rlm.listener.protocol.frame import RequestHeader
from rlm.tier import StreamedBatch
from tests.support.bigrecord import KnownBatch


def _values(records: list[object]) -> dict:
    parts = [{"partition_index": i, "error_code": 0, "high_watermark": 10, "last_stable_offset": 10,
              "log_start_offset": 0, "aborted_transactions": None, "preferred_read_replica": -1, "records": r}
             for i, r in enumerate(records)]
    return {"throttle_time": 0, "error_code": 0, "session_id": 0,
            "responses": [{"topic": "t", "topic_id": uuid.UUID(int=5), "partitions": parts}]}


@pytest.mark.parametrize("version", [4, 11, 12, 16])
@pytest.mark.parametrize("size", [100, 200_000])  # a varint length of 1 and of 3 bytes
def test_chunked_fetch_answer_is_the_whole_frame(version, size):
    header = RequestHeader(1, version, 42, "c", version >= 12, 0)
    rtype = response_type(header)
    big = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    other = b"small records"
    plain = encode_response(header, build(rtype, _values([other, big, b"", big])))
    got = encode_streamed(_values([other, KnownBatch(big, 1000), b"", KnownBatch(big, 1000)]),
                          lambda v: encode_response(header, build(rtype, v)), flexible=header.flexible)
    assert isinstance(got, ChunkedAnswer) and len(got) == len(plain)
    out = b"".join(b"".join(bytes(c) for c in p.chunks()) if isinstance(p, StreamedBatch) else bytes(p)
                   for p in got)
    assert out == plain
    # no streamed batch: the encoded bytes as they are
    assert encode_streamed(_values([other]), lambda v: encode_response(header, build(rtype, v)),
                           flexible=header.flexible) == encode_response(header, build(rtype, _values([other])))
