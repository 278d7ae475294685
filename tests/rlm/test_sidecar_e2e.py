"""End to end against the real broker: the sidecar tiers rolled segments, local retention removes them, and every
record produced is still readable from the remote tier. Once per store: the file system, moto, s3proxy."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlmm.api import RemoteLogSegmentState, TopicIdPartition
from tests.support.kafka import broker_watermarks, partition_dir, produce, set_topic_config
from tests.support.sidecar import assert_readable, latest_remote, make_settings, only, wait_for


@pytest.fixture(params=["fs", "moto", "s3proxy"])
def remote_store(request: pytest.FixtureRequest, tmp_path: Path) -> dict:
    """The sidecar's store section: the file system, or S3 over HTTP (moto's mock, s3proxy: a real S3 server)."""
    if request.param == "fs":
        return {"store": "fs", "root_path": str(tmp_path / "remote"), "block_size_bytes": 64 * 1024}
    endpoint = request.getfixturevalue("s3_endpoint" if request.param == "moto" else "s3proxy_endpoint")
    return {"store": "s3", "bucket": f"rlm-e2e-{uuid.uuid4().hex[:10]}", "endpoint_url": endpoint,
            "region": "us-east-1", "create_bucket": True, "block_size_bytes": 64 * 1024}


def test_tiered_records_survive_local_retention(kafka: KafkaCluster, topic_name: str, tmp_path: Path,
                                                remote_store: dict) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "400"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    sent: dict[int, tuple[bytes, bytes]] = {}
    for round_ in range(6):
        recs = [(f"k{round_}-{i}".encode(), f"v{round_}-{i}".encode() * 20) for i in range(300)]
        for (_p, off), (k, v) in zip(produce(kafka, topic_name, recs, **{"compression.type": "lz4"}), recs,
                                     strict=True):
            sent[off] = (k, v)
        import time

        time.sleep(0.5)
    produce(kafka, topic_name, [(b"last", b"roll")])  # rolls the segment holding the last round
    # Only this topic: the session broker holds every earlier test's topics, which would be tiered into the bucket too.
    settings = make_settings(kafka, tmp_path, store=remote_store, topics=only(topic_name))
    with Sidecar(settings) as sidecar:
        last_sent = max(sent)
        wait_for(lambda: latest_remote(sidecar, tp) >= last_sent, 90, "every produced offset to be remote")
        segs = sidecar.rlmm.list_remote_log_segments(tp)
        assert all(s.state == RemoteLogSegmentState.COPY_SEGMENT_FINISHED for s in segs)
        for a, b in zip(segs, segs[1:], strict=False):  # contiguous, no range remote twice
            assert b.start_offset == a.end_offset_inclusive + 1
        assert segs[0].start_offset == 0
        store = sidecar.rsm.store  # the copies are where the test says: in the bucket, on this server
        assert getattr(store, "bucket", None) == remote_store.get("bucket")
        if remote_store["store"] == "s3":
            assert store.client.meta.endpoint_url == remote_store["endpoint_url"]
            prefix = sidecar.rsm.partition_prefix(topic_name, topic_id, 0)
            objects = store.client.list_objects_v2(Bucket=remote_store["bucket"], Prefix=prefix).get("Contents", [])
            assert sum(o["Key"].endswith("-index") for o in objects) == len(segs)

        # Local retention takes the segments away from the broker...
        set_topic_config(kafka, topic_name, retention_ms="1000")
        # (Kafka moves the log start offset first, then renames the segments it deletes: wait for both)
        first_log = partition_dir(kafka, topic_name) / "00000000000000000000.log"
        wait_for(lambda: broker_watermarks(kafka, topic_name)[0] > last_sent // 2 and not first_log.exists(), 90,
                 "the broker to delete old local segments")
        # ... and every record is still there, remotely, byte-exact.
        assert_readable(sidecar, tp, sent)
        # Staging is emptied after the copies. (Retention may also roll and delete the active segment holding
        # the rolling record: staged from its .deleted files, it is copied and released on the next runs.)
        wait_for(lambda: sidecar.staging.staged() == [], 30, "staging to be emptied by the copies")
