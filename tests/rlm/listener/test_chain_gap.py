"""A gap in the remote chain is never crossed silently by the history endpoint: offsets no remote segment holds
(the broker deleted them before they were tiered) are answered OFFSET_OUT_OF_RANGE, as Kafka answers a remote read of
an offset no segment holds, and each gap is counted once (``rlm_history_tier_gaps_total``); a Fetch from below the
gap ends at it. Before: a Fetch inside the gap was served from the next segment, and one from below it ran on past
the gap: the consumer skipped the lost offsets without an error. Against the real broker and sidecar; the gap is
made by deleting a middle segment as the sidecar's deleter does."""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from devtools.devkafka import KafkaCluster
from rlm.listener import Listener, start_listener
from rlm.rlmm_config import make_rlmm
from rlm.sidecar import Sidecar
from rlm.tier import to_rsm
from rlmm.api import RemoteLogSegmentMetadataUpdate, RemoteLogSegmentState, TopicIdPartition
from rsm.log.batch import header_from_bytes
from rsm.manager import RemoteStorageManager
from tests.rlm.listener.raw_wire import call
from tests.support.sidecar import latest_remote, make_settings, only, produce_segments, remote_segments, wait_for

pytestmark = [pytest.mark.kafka]


@dataclass
class Gapped:
    listener: Listener
    tp: TopicIdPartition
    gap: tuple[int, int]  # the lost offsets, first and last
    end: int  # the tier's high watermark


@pytest.fixture(scope="module")
def gapped(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gapped]:
    tmp = tmp_path_factory.mktemp("gap")
    topic = f"gap-{uuid.uuid4().hex[:8]}"
    topic_id = kafka.create_topic(topic, 1, config={"segment.ms": "300"})
    tp = TopicIdPartition(topic_id, topic, 0)
    sent = produce_segments(kafka, topic, 4, 100, segment_ms=300)
    settings = make_settings(kafka, tmp, topics=only(topic),
                             history_listener={"host": "127.0.0.1", "port": 0,
                                               "authorization": {"allow_if_no_authorizer": True}})
    with Sidecar(settings) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent) - 1, 90, "the topic to be remote")
        segs = remote_segments(sidecar, tp)
        assert len(segs) >= 3
        lost = segs[1]
        _delete(settings, tp, lost, tmp / "gap-writer")
        wait_for(lambda: lost.remote_log_segment_id not in {m.remote_log_segment_id
                                                            for m in remote_segments(sidecar, tp)},
                 60, "the sidecar to see the segment gone")
        listener = start_listener(settings, sidecar.rsm)
        try:
            yield Gapped(listener, tp, (lost.start_offset, lost.end_offset_inclusive),
                         segs[-1].end_offset_inclusive + 1)
        finally:
            listener.stop()


def _delete(settings: Any, tp: TopicIdPartition, md: Any, cache: Path) -> None:
    """The segment's objects and metadata deleted as the sidecar's deleter does: the chain has a gap."""
    rlmm = make_rlmm(settings, cache_dir=cache, read_only=False)
    rsm = RemoteStorageManager(settings.store)
    try:
        rlmm.on_partition_leadership_changes([tp], [])
        rlmm.wait_ready([tp], timeout_s=60)
        for state in (RemoteLogSegmentState.DELETE_SEGMENT_STARTED, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED):
            if state == RemoteLogSegmentState.DELETE_SEGMENT_FINISHED:
                rsm.delete_log_segment_data(to_rsm(md))
            rlmm.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
                md.remote_log_segment_id, int(time.time() * 1000), md.custom_metadata, state, 1))
    finally:
        rsm.close()
        rlmm.close()


def _fetch(port: int, tp: TopicIdPartition, offset: int) -> Any:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        resp = call(sock, 1, 11, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 24, "isolation_level": 0,
            "session_id": 0, "session_epoch": -1, "rack_id": "", "topics": [{"topic": tp.topic, "partitions": [
                {"partition": 0, "fetch_offset": offset, "current_leader_epoch": -1, "log_start_offset": -1,
                 "partition_max_bytes": 1 << 24}]}]})
    (t,) = resp.responses
    (p,) = t.partitions
    return p


def _offsets(records: bytes | None) -> list[int]:
    out, pos, data = [], 0, records or b""
    while pos < len(data):
        size = struct.unpack_from(">i", data, pos + 8)[0] + 12
        h = header_from_bytes(data[pos:pos + size])
        out += range(h.base_offset, h.last_offset + 1)
        pos += size
    return out


def _gaps_counted(topic: str) -> float:
    return REGISTRY.get_sample_value("rlm_history_tier_gaps_total", {"topic": topic}) or 0.0


def test_a_fetch_inside_the_gap_is_out_of_range_and_counted_once(gapped: Gapped) -> None:
    first, last = gapped.gap
    before = _gaps_counted(gapped.tp.topic)
    for offset in (first, (first + last) // 2, last):
        p = _fetch(gapped.listener.port, gapped.tp, offset)
        assert p.error_code == 1, f"offset {offset} of the gap {gapped.gap}: error {p.error_code}"  # OUT_OF_RANGE
        assert not p.records
    assert _gaps_counted(gapped.tp.topic) == before + 1


def test_a_fetch_from_below_the_gap_stops_at_it_and_the_next_segment_reads_on(gapped: Gapped) -> None:
    first, last = gapped.gap
    below = _fetch(gapped.listener.port, gapped.tp, 0)
    assert below.error_code == 0 and _offsets(below.records) == list(range(0, first))  # up to the gap, not past it
    above = _fetch(gapped.listener.port, gapped.tp, last + 1)
    got = _offsets(above.records)
    assert above.error_code == 0 and got[0] == last + 1 and got == list(range(last + 1, got[-1] + 1))
