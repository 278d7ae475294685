"""The proxy's live Fetch path without decoding (issue 24): the client's Fetch forwarded with its session fields
patched (:func:`rlm.listener.protocol.codec.fetch_sessionless`) and the broker's answer walked
(:func:`rlm.listener.protocol.codec.fetch_answer`), checked against kio's decode of real broker answers at every Fetch
version both the proxy and the broker speak: partitions with records and aborted transactions, OFFSET_OUT_OF_RANGE,
an unknown partition and an unknown topic, read_uncommitted and read_committed.
"""

from __future__ import annotations

import socket
import struct
import uuid
from typing import Any

import pytest

from devtools.devkafka import KafkaCluster
from rlm.listener.protocol.apis import API_KEYS, PROXY_API_KEYS, ApiKey
from rlm.listener.protocol.codec import (
    BadRequestError,
    build,
    decode_response,
    encode_fetch_response,
    encode_response,
    fetch_answer,
    fetch_records_end,
    fetch_sessionless,
    last_offset,
    new_request,
    response_type,
)
from rlm.listener.protocol.frame import read_header
from tests.rlm.listener.raw_wire import recv_frame
from tests.support.batches import batch
from tests.support.kafka import produce
from tests.support.txn import TxnProducer

OUT_OF_RANGE = 1
NEW_SESSION_EPOCH = 0  # session id 0, epoch 0: "make me a session" (KIP-227)


def _send(sock: socket.socket, frame: bytes) -> bytes:
    """``frame`` (size prefix included) sent; the answer without its size prefix."""
    sock.sendall(frame)
    answer = recv_frame(sock)
    assert answer is not None, "connection closed"
    return answer


def _fetch_values(topic: str, topic_id: uuid.UUID, isolation: int) -> dict[str, Any]:
    part = {"current_leader_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20}
    return {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": isolation,
            "session_id": 0, "session_epoch": NEW_SESSION_EPOCH, "rack_id": "", "topics": [
                {"topic": topic, "topic_id": topic_id, "partitions": [
                    {**part, "partition": 0, "fetch_offset": 0},
                    {**part, "partition": 1, "fetch_offset": 10**9},
                    {**part, "partition": 7, "fetch_offset": 0}]},
                {"topic": f"{topic}-none", "topic_id": uuid.uuid4(), "partitions": [
                    {**part, "partition": 0, "fetch_offset": 0}]}]}


def _broker_fetch_versions(sock: socket.socket) -> tuple[int, int]:
    frame, header = new_request(ApiKey.API_VERSIONS, 3, 5, "t", {"client_software_name": "t",
                                                                  "client_software_version": "1"})
    body = decode_response(_send(sock, frame), header)
    (fetch,) = [k for k in body.api_keys if k.api_key == ApiKey.FETCH]
    return int(fetch.min_version), int(fetch.max_version)


def test_the_walk_agrees_with_kio_on_every_fetch_version_and_no_session_is_made(kafka: KafkaCluster) -> None:
    topic = f"fetch-walk-{uuid.uuid4().hex[:6]}"
    topic_id = uuid.UUID(str(kafka.create_topic(topic, 2)))
    produce(kafka, topic, [(b"k", b"plain")] * 3)
    txn = TxnProducer(kafka, topic)
    txn.txn("aborted", 4, commit=False)
    txn.txn("committed", 4, commit=True)
    produce(kafka, topic, [(b"k", b"v")], partition=1)
    host, port = kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)
    ours = PROXY_API_KEYS.get(ApiKey.FETCH) or API_KEYS[ApiKey.FETCH]
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        lo, hi = _broker_fetch_versions(sock)
        versions = range(max(lo, ours[0]), min(hi, ours[1]) + 1)
        assert versions and versions[-1] >= 18, (lo, hi, ours)  # Kafka 4.3 serves v18
        for version in versions:
            for isolation in (0, 1):
                frame, header = new_request(ApiKey.FETCH, version, 11, "t", _fetch_values(topic, topic_id,
                                                                                            isolation))
                asked = read_header(frame[4:])
                assert asked.body_offset == header.body_offset
                forwarded = fetch_sessionless(frame[4:], asked)
                answer = _send(sock, struct.pack(">i", len(forwarded)) + forwarded)
                body = decode_response(answer, header)
                walk = fetch_answer(answer, header)
                assert walk is not None
                keyed = [(t.topic if version < 13 else t.topic_id, p.partition_index, int(p.error_code))
                         for t in body.responses for p in t.partitions]
                assert walk.errors == tuple(k for k in keyed if k[2]), (version, keyed)
                assert (walk.error_code, walk.size, walk.names_leaders) == (
                    int(getattr(body, "error_code", 0)), len(answer), bool(getattr(body, "node_endpoints", ()))
                ), version
                key = topic if version < 13 else topic_id
                assert walk.out_of_range() == [(key, 1)], (version, walk)
                assert len(walk.errors) == 3, (version, keyed)  # out of range, unknown partition, unknown topic
                (p0,) = [p for t in body.responses for p in t.partitions if p.partition_index == 0 and p.records]
                assert (p0.aborted_transactions is not None and len(p0.aborted_transactions) == 1) is (
                    isolation == 1), (version, p0.aborted_transactions)
                if version >= 7:  # the patched request asked for no session: the broker made none
                    assert body.session_id == 0, version
                with pytest.raises(BadRequestError):
                    fetch_answer(answer[:-1], header)
                assert fetch_answer(answer, header, max_partitions=3) is None  # 4 partitions
                assert fetch_answer(answer, header, max_partitions=4) == walk
                assert fetch_answer(memoryview(answer), header) == walk  # as the proxy reads it
        # Unpatched, the broker makes the session the request asks for: the patch is what declines it.
        frame, header = new_request(ApiKey.FETCH, versions[-1], 12, "t", _fetch_values(topic, topic_id, 0))
        assert decode_response(_send(sock, frame), header).session_id != 0


def test_where_a_one_partition_answers_records_end_is_read_from_its_first_bytes(kafka: KafkaCluster) -> None:
    """:func:`fetch_records_end` (the proxy's cut-through, rlm.listener.upstream.relay) on the broker's answers at every
    Fetch version: the end of the one partition's records (kio's decode of the same bytes), the same from every prefix
    that holds the partition's fields, "too short" from those that do not; None for an answer of two partitions, a
    partition's error, no records."""
    topic = f"fetch-end-{uuid.uuid4().hex[:6]}"
    topic_id = uuid.UUID(str(kafka.create_topic(topic, 2)))
    produce(kafka, topic, [(b"k", b"plain")] * 3)
    txn = TxnProducer(kafka, topic)
    txn.txn("aborted", 4, commit=False)
    host, port = kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)
    ours = PROXY_API_KEYS.get(ApiKey.FETCH) or API_KEYS[ApiKey.FETCH]
    part = {"current_leader_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 1 << 20}

    def ask(version: int, isolation: int, parts: list[tuple[int, int]]) -> tuple[bytes, Any]:
        frame, header = new_request(ApiKey.FETCH, version, 13, "t", {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": isolation,
            "session_id": 0, "session_epoch": -1, "rack_id": "", "topics": [{"topic": topic, "topic_id": topic_id,
                "partitions": [{**part, "partition": p, "fetch_offset": o} for p, o in parts]}]})
        return _send(sock, frame), header

    with socket.create_connection((host, int(port)), timeout=30) as sock:
        lo, hi = _broker_fetch_versions(sock)
        for version in range(max(lo, ours[0]), min(hi, ours[1]) + 1):
            for isolation in (0, 1):
                answer, header = ask(version, isolation, [(0, 0)])
                (p0,) = [p for t in decode_response(answer, header).responses for p in t.partitions]
                assert p0.records and (p0.aborted_transactions is not None) is (isolation == 1), version
                end = fetch_records_end(answer, header)
                assert end is not None and answer[end - len(p0.records):end] == bytes(p0.records), version
                assert end == len(answer) - (3 if version >= 12 else 0), version  # then the three tagged fields
                fields = end - len(p0.records)
                for cut in range(fields - 1):
                    with pytest.raises((IndexError, struct.error)):
                        fetch_records_end(answer[:cut], header)
                assert all(fetch_records_end(memoryview(answer)[:cut], header) == end
                           for cut in range(fields, len(answer) + 1, 97))
            for parts in ([(0, 0), (1, 0)], [(0, 10**9)], [(1, 0)]):  # two, out of range, no records
                answer, header = ask(version, 0, parts)
                assert fetch_records_end(answer, header) is None, (version, parts)


@pytest.mark.parametrize("version", [16, 17, 18])
def test_an_answer_naming_leaders_is_told_apart(version: int) -> None:
    """Leaders' addresses (v16+ ``node_endpoints``, a top-level tagged field after the partitions) need the rewrite;
    a 1-broker cluster never names one, so this answer is kio's encoding of what a 3-broker cluster sends (as in
    test_proxy_produce's real one)."""
    frame, header = new_request(ApiKey.FETCH, version, 9, "t", {"topics": []})
    header = read_header(frame[4:])
    rtype = response_type(header)
    assert rtype is not None
    for endpoints in ([], [{"node_id": 3, "host": "b3", "port": 9092, "rack": None}]):
        body = build(rtype, {"error_code": 0, "session_id": 0, "node_endpoints": endpoints, "responses": [
            {"topic_id": uuid.uuid4(), "partitions": [
                {"partition_index": 0, "error_code": 6, "high_watermark": -1, "records": None,
                 "current_leader": {"leader_id": 3, "leader_epoch": 2}}]}]})
        answer = encode_response(header, body)[4:]
        walk = fetch_answer(answer, header)
        assert walk is not None and walk.names_leaders is bool(endpoints) and walk.size == len(answer)
        assert [code for _k, _p, code in walk.errors] == [6]


@pytest.mark.parametrize("version", range(4, 19))
def test_the_fetch_answer_written_field_by_field_is_kios_encoding(version: int) -> None:
    """:func:`rlm.listener.protocol.codec.encode_fetch_response` (the proxy's answers from the tier) gives the bytes
    of kio's encoding of the same values, at every Fetch version the proxy offers; and the walk reads them back."""
    frame, _header = new_request(ApiKey.FETCH, version, 9, "t", {"topics": []})
    header = read_header(frame[4:])
    rtype = response_type(header)
    assert rtype is not None

    def part(index: int, code: int, aborted: Any, records: Any) -> dict[str, Any]:
        return {"partition_index": index, "error_code": code, "high_watermark": 1000 + index,
                "last_stable_offset": 900 + index, "log_start_offset": 7, "aborted_transactions": aborted,
                "preferred_read_replica": -1, "records": records}

    values = {"throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [
        {"topic": "a-topic", "topic_id": uuid.uuid4(), "partitions": [
            part(0, 0, None, bytearray(b"x" * 300)),
            part(1, 0, [], b""),
            part(2, 0, [{"producer_id": 5, "first_offset": 17}, {"producer_id": 6, "first_offset": 40}], b"yz"),
            part(3, 1, None, None)]},
        {"topic": "b" * 200, "topic_id": uuid.uuid4(), "partitions": []}]}
    ours = encode_fetch_response(header, values)
    assert ours == encode_response(header, build(rtype, values))
    walk = fetch_answer(ours[4:], header)
    assert walk is not None and walk.size == len(ours) - 4
    key = "a-topic" if version < 13 else values["responses"][0]["topic_id"]
    assert walk.errors == ((key, 3, 1),)


def test_the_last_offset_is_the_last_whole_batchs() -> None:
    """:func:`rlm.listener.protocol.codec.last_offset` (where the proxy expects a client's next Fetch): the last
    offset of the last whole batch, a batch cut at the end of the records left out, None for none."""
    two = batch(10, [b"a", b"b", b"c"]) + batch(13, [b"d", b"e"])
    assert last_offset(two) == 14
    assert last_offset(two + batch(15, [b"f"])[:-3]) == 14
    assert last_offset(bytearray(two[:40])) is None and last_offset(b"") is None and last_offset(None) is None
