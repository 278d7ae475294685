"""A Fetch answered from the tier alone is handed to the socket as its parts (issue 24): the small fields joined, each
partition's records the tier's own buffer (not copied into one frame: ~5 ms of the event loop per 8 MiB answer), a
batch too large to hold a :class:`rlm.tier.StreamedBatch`; written in order, they are kio's encoding byte for byte,
at every Fetch version the proxy answers. The server writes parts a slice at a time without joining them
(``_slices``); the proxy's tests (``test_proxy*.py``) read such answers through a real broker's proxy."""

from __future__ import annotations

import uuid

import pytest

from rlm.listener.net.chunked import ChunkedAnswer
from rlm.listener.net.server import _slices
from rlm.listener.protocol.codec import (
    RECORDS_PART_MIN_BYTES,
    build,
    encode_fetch_response,
    encode_response,
    fetch_response_parts,
    response_type,
)
from rlm.listener.protocol.frame import RequestHeader
from rlm.tier import StreamedBatch
from tests.support.bigrecord import KnownBatch


def _values(records: list[object]) -> dict:
    parts = [{"partition_index": i, "error_code": 0, "high_watermark": 10, "last_stable_offset": 10,
              "log_start_offset": 0, "aborted_transactions": None if i % 2 else [
                  {"producer_id": 7, "first_offset": 3}], "preferred_read_replica": -1, "records": r}
             for i, r in enumerate(records)]
    return {"throttle_time": 0, "error_code": 0, "session_id": 0,
            "responses": [{"topic": "t", "topic_id": uuid.UUID(int=5), "partitions": parts[:2]},
                          {"topic": "u", "topic_id": uuid.UUID(int=6), "partitions": parts[2:]}]}


def _written(parts: list[object]) -> bytes:
    return b"".join(b"".join(bytes(c) for c in p.chunks()) if isinstance(p, StreamedBatch) else bytes(p)
                    for p in parts)


@pytest.mark.parametrize("version", range(4, 19))
def test_a_tier_answer_in_parts_is_kios_encoding_and_keeps_the_records_buffers(version: int) -> None:
    header = RequestHeader(1, version, 42, "c", version >= 12, 0)
    big = bytes(range(256)) * 400  # 100 KiB: a 3-byte varint length
    held = bytearray(b"m" * RECORDS_PART_MIN_BYTES)
    view = memoryview(held)
    streamed = b"s" * (RECORDS_PART_MIN_BYTES + 5)
    parts, size = fetch_response_parts(header, _values([b"small", big, None, view, KnownBatch(streamed)]))
    plain = encode_response(header, build(response_type(header), _values([b"small", big, None, bytes(held),
                                                                           streamed])))
    answer = ChunkedAnswer(parts, size)
    assert len(answer) == len(plain) and _written(answer.parts) == plain
    assert not answer.in_memory()
    # the tier's buffers are parts as they are; the fields (and the small records) between them one part each run
    assert sum(p is big for p in parts) == 1 and sum(p is view for p in parts) == 1
    # fields+small, big, fields, view, fields, streamed, and the tagged fields after it (flexible versions)
    assert len(parts) == (7 if version >= 12 else 6)
    in_memory = _values([b"small", big, None, view, b"tiny"])
    assert encode_fetch_response(header, in_memory) == b"".join(bytes(p) for p in fetch_response_parts(
        header, in_memory)[0])


def test_parts_are_cut_into_slices_without_copying_them() -> None:
    big = bytes(range(250)) * 40  # 10,000 bytes
    parts = [b"head", big, b"mid", big, b"tail"]
    runs = list(_slices(parts, 3000))
    assert [sum(map(len, r)) for r in runs] == [3000] * 6 + [2011]
    assert b"".join(bytes(p) for r in runs for p in r) == b"".join(parts)
    assert runs[0][0] is parts[0]  # a part that fits whole is itself
    assert all(isinstance(p, memoryview) for r in runs for p in r if len(p) not in (3, 4))  # big: views of it
    assert list(_slices([b"ab", b"c"], 3)) == [[b"ab", b"c"]]
