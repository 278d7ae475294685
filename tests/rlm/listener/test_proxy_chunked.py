"""The proxy's Fetch answers carrying a batch too large to hold (PDP-43) are the frames encoded with the batch's bytes
in them, byte for byte, on both of its tier paths: from the tier alone (written field by field,
:func:`rlm.listener.protocol.codec.encode_fetch_response`) and merged into the broker's answer (kio entities,
:func:`rlm.listener.net.chunked.encode_streamed_response`); the batch stays a :class:`rlm.tier.StreamedBatch` read
when the answer is written. ``tests/rlm/test_proxy_large_event.py`` reads a 200 MiB record so through a real
broker's proxy."""

from __future__ import annotations

import dataclasses
import functools
import uuid

import pytest

from rlm.listener.net.chunked import ChunkedAnswer, encode_streamed, encode_streamed_response
from rlm.listener.protocol.codec import build, encode_fetch_response, encode_response, response_type
from rlm.listener.protocol.frame import RequestHeader
from rlm.listener.tier.boundary import BrokerBounds, _with_bounds
from rlm.tier import StreamedBatch
from tests.support.bigrecord import KnownBatch


def _values(records: list[object]) -> dict:
    parts = [{"partition_index": i, "error_code": 0, "high_watermark": 10, "last_stable_offset": 10,
              "log_start_offset": 0, "aborted_transactions": None, "preferred_read_replica": -1, "records": r}
             for i, r in enumerate(records)]
    return {"throttle_time": 0, "error_code": 0, "session_id": 0,
            "responses": [{"topic": "t", "topic_id": uuid.UUID(int=5), "partitions": parts}]}


def _written(answer: bytes | ChunkedAnswer) -> bytes:
    assert isinstance(answer, ChunkedAnswer)
    return b"".join(b"".join(bytes(c) for c in p.chunks()) if isinstance(p, StreamedBatch) else bytes(p)
                    for p in answer)


BIG = bytes(range(256)) * 800 + b"x" * 7  # a 3-byte varint length


@pytest.mark.parametrize("version", [4, 11, 12, 13, 16, 18])
def test_an_answer_from_the_tier_alone_is_the_whole_frame(version: int) -> None:
    header = RequestHeader(1, version, 42, "c", version >= 12, 0)
    plain = encode_fetch_response(header, _values([b"small", BIG]))
    got = encode_streamed(_values([b"small", KnownBatch(BIG)]), functools.partial(encode_fetch_response, header),
                          flexible=header.flexible)
    assert len(got) == len(plain) and _written(got) == plain


@pytest.mark.parametrize("version", [4, 11, 12, 13, 16])
def test_an_answer_merged_into_the_brokers_is_the_whole_frame(version: int) -> None:
    header = RequestHeader(1, version, 42, "c", version >= 12, 0)
    rtype = response_type(header)
    plain = encode_response(header, build(rtype, _values([b"small", BIG])))
    entity = build(rtype, _values([b"small", b""]))
    (t,) = entity.responses
    small, tier = t.partitions
    # the tier's part as the merge builds it: its records left as the tier gave them
    tier = build(type(tier), {**{f.name: getattr(tier, f.name) for f in dataclasses.fields(tier)},
                              **_with_bounds({"error_code": 0, "records": KnownBatch(BIG), "aborted_transactions": None,
                                              "log_start_offset": 0}, BrokerBounds(5, 10, 10))})
    assert isinstance(tier.records, StreamedBatch)  # never read whole
    merged = dataclasses.replace(entity, responses=(dataclasses.replace(t, partitions=(small, tier)),))
    got = encode_streamed_response(merged, functools.partial(encode_response, header), flexible=header.flexible)
    assert len(got) == len(plain) and _written(got) == plain
    # no streamed batch: the encoded bytes as they are
    assert encode_streamed_response(entity, functools.partial(encode_response, header),
                                    flexible=header.flexible) == encode_response(header, entity)
