"""The history endpoint's codecs without a socket: what real clients sent or needed that a first version got wrong."""

from __future__ import annotations

import datetime
import io

from kio.schema.produce.v9.response import ProduceResponse
from kio.serial import entity_reader, entity_writer

from rlm.listener.protocol.codec import build, decode_request
from rlm.listener.protocol.frame import read_header

# librdkafka 2.x's Metadata v12 for all topics, as captured on the socket (header v2, client id "rdkafka"): the body
# is 3 bytes longer than the schema's. Kafka's broker ignores what follows a request's body; so must we.
LIBRDKAFKA_ALL_TOPICS_METADATA = bytes.fromhex("0003000c00000004000772646b61666b610000000000000000")


def test_bytes_after_a_request_body_are_ignored() -> None:
    header = read_header(LIBRDKAFKA_ALL_TOPICS_METADATA)
    assert (header.api_key, header.api_version, header.client_id, header.flexible) == (3, 12, "rdkafka", True)
    req = decode_request(LIBRDKAFKA_ALL_TOPICS_METADATA, header)
    assert req.topics is None and not req.allow_auto_topic_creation


def test_timestamps_in_milliseconds_build_kios_datetimes() -> None:
    """Produce's ``log_append_time`` (a nullable datetime in kio) given as Kafka's -1 or as milliseconds."""
    values = {"throttle_time": 0, "responses": [{"name": "t", "partition_responses": [
        {"index": 0, "error_code": 44, "base_offset": -1, "log_append_time": -1, "log_start_offset": -1},
        {"index": 1, "error_code": 0, "base_offset": 5, "log_append_time": 1_700_000_000_123}]}]}
    res = build(ProduceResponse, values)
    out = io.BytesIO()
    entity_writer(ProduceResponse)(out, res)
    back, _n = entity_reader(ProduceResponse)(out.getvalue(), 0)
    first, second = back.responses[0].partition_responses
    assert first.log_append_time is None
    assert second.log_append_time == datetime.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=datetime.UTC)
