"""After the broker really compacted the metadata topic, a fresh cache rebuilds exactly the live state."""

from __future__ import annotations

import time
import uuid

from confluent_kafka import Consumer, TopicPartition

from rlmm.api import RemoteLogSegmentState, TopicIdPartition
from rlmm.keys import decode_key
from tests.rlmm.helpers import eventually, segment, update

S = RemoteLogSegmentState
COMPACT_FAST = {"segment.ms": "100", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "500",
                "min.compaction.lag.ms": "0"}


def read_all(kafka, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    """Every record now in partition 0 of ``topic``: (offset, key, value)."""
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"probe-{uuid.uuid4()}",
                  "enable.auto.commit": False})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        c.assign([TopicPartition(topic, 0, low)])
        out: list = []
        deadline = time.monotonic() + 30
        while (not out or out[-1][0] < high - 1) and time.monotonic() < deadline and high > low:
            for msg in c.consume(1000, timeout=0.5):
                if msg.error() is None:
                    out.append((msg.offset(), msg.key(), msg.value()))
        return out
    finally:
        c.close()


def test_fresh_cache_rebuilds_the_compacted_topic(kafka, rlmm_factory, topic_name: str) -> None:
    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    tp2 = TopicIdPartition(tp.topic_id, "orders", 1)
    a = rlmm_factory(topic_name, "never-restarted", num_partitions=1, serve_all=True, broker_id=1,
                     topic_config=COMPACT_FAST, tombstone_delay_ms=0, tombstone_check_interval_s=0.2)
    segs = []
    for i in range(20):
        md = segment(tp if i % 2 else tp2, i * 100, i * 100 + 99, {i // 5: i * 100})
        a.add_remote_log_segment_metadata(md)
        a.update_remote_log_segment_metadata(update(md, S.COPY_SEGMENT_FINISHED))
        a.update_remote_log_segment_metadata(update(md, S.COPY_SEGMENT_FINISHED, custom=b"retry"))  # same key again
        segs.append(md)
    deleted = segs[:8]
    for md in deleted:
        a.update_remote_log_segment_metadata(update(md, S.DELETE_SEGMENT_STARTED))
        a.update_remote_log_segment_metadata(update(md, S.DELETE_SEGMENT_FINISHED))
    for md in segs[8:11]:
        a.update_remote_log_segment_metadata(update(md, S.DELETE_SEGMENT_STARTED))
    produced = 20 * 3 + 8 * 2 + 3
    # the never-restarted manager writes tombstones for the 8 deleted segments and consumes them
    eventually(lambda: a.cache.deleted_segments(0) == [], timeout_s=30)
    deleted_ids = {md.remote_log_segment_id.id for md in deleted}
    filler = segs[-1]

    def compacted() -> bool:
        # appends roll the active segment (segment.ms) so the cleaner has work; tombstones go after
        # delete.retention.ms on a later pass
        a.update_remote_log_segment_metadata(update(filler, S.COPY_SEGMENT_FINISHED))
        time.sleep(0.5)
        recs = read_all(kafka, topic_name)
        left = [r for r in recs if decode_key(r[1]).segment_id in deleted_ids]
        keys = [r[1] for r in recs]
        return not left and len(set(keys)) >= len(keys) - 2 and len(recs) < produced

    eventually(compacted, timeout_s=150, interval_s=0.1)
    recs = read_all(kafka, topic_name)
    assert all(v is not None for _o, _k, v in recs)                       # tombstones gone too
    assert recs[0][0] > 0                                                 # the log start moved or holes exist

    fresh = rlmm_factory(topic_name, "fresh", num_partitions=1, serve_all=True, broker_id=2)
    fresh.wait_ready([tp, tp2])
    # the cleaner may compact again while the fresh manager reads (a later pass removes what the last one left):
    # it consumed what the log held at the time, between the read before it and one after it
    after = read_all(kafka, topic_name)
    assert len(after) <= fresh.records_consumed <= len(recs) < produced
    assert fresh.skipped_records == 0
    assert fresh.cache.dump() == a.cache.dump()
    for t in (tp, tp2):
        assert fresh.list_remote_log_segments(t) == a.list_remote_log_segments(t)
        for e in range(4):
            assert fresh.highest_offset_for_epoch(t, e) == a.highest_offset_for_epoch(t, e)
            assert fresh.list_remote_log_segments(t, e) == a.list_remote_log_segments(t, e)
    assert {m.remote_log_segment_id.id for m in fresh.list_remote_log_segments(tp)} | {
        m.remote_log_segment_id.id for m in fresh.list_remote_log_segments(tp2)} == {
        md.remote_log_segment_id.id for md in segs[8:]}
    live = segs[11]
    assert fresh.remote_log_segment_metadata(live.topic_id_partition, 2, live.start_offset + 5).custom_metadata == \
        b"retry"
