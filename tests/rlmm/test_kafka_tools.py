"""Kafka's own console consumer + RemoteLogMetadataFormatter decodes what the manager writes (real broker)."""

from __future__ import annotations

import base64
import re
import uuid
from dataclasses import replace

from rlmm import envelope
from rlmm.api import (
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from tests.rlmm.helpers import segment, update

FORMATTER = "org.apache.kafka.server.log.remote.metadata.storage.serialization.RemoteLogMetadataSerde$" \
            "RemoteLogMetadataFormatter"
LINE = re.compile(r"^partition: (\d+), offset: (\d+), value: (\w+)\{(.*)\}$")


def kafka_uuid(u: uuid.UUID) -> str:
    """Kafka's ``Uuid.toString()``: URL-safe base64 without padding."""
    return base64.urlsafe_b64encode(u.bytes).decode().rstrip("=")


def test_console_consumer_decodes_every_value(kafka, rlmm_factory, topic_name: str) -> None:
    tp = TopicIdPartition(uuid.uuid4(), "payments.eu", 11)
    m = rlmm_factory(topic_name, "c", num_partitions=50, broker_id=4)
    m.on_partition_leadership_changes([tp], [])
    a = segment(tp, 1000, 1999, {2: 1000, 5: 1500}, broker_id=4, size=123456, custom=b"\x01\x02\x03")
    b = segment(tp, 2000, 2999, {5: 2000}, broker_id=4)
    c = replace(segment(tp, 3000, 3999, {12: 3000}, broker_id=4, custom=b"\x01\x02\x03"), broker_leader_epoch=12)
    written = [a, update(a, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, broker_id=4), b,
               update(b, RemoteLogSegmentState.DELETE_SEGMENT_STARTED, broker_id=4),
               RemotePartitionDeleteMetadata(tp, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 77, 4)]
    m.add_remote_log_segment_metadata(written[0])
    m.update_remote_log_segment_metadata(written[1])
    m.add_remote_log_segment_metadata(written[2])
    # a segment carrying its broker leader epoch in the CustomMetadata envelope (before the partition delete,
    # which refuses new copies)
    m.add_remote_log_segment_metadata(c)
    m.update_remote_log_segment_metadata(written[3])
    m.put_remote_partition_delete_metadata(written[4])
    written.insert(3, c)

    proc = kafka.run_class("org.apache.kafka.tools.consumer.ConsoleConsumer", [
        "--bootstrap-server", kafka.bootstrap_servers, "--topic", topic_name, "--from-beginning",
        "--max-messages", str(len(written)), "--formatter", FORMATTER, "--timeout-ms", "60000"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [LINE.match(x) for x in proc.stdout.splitlines() if x.startswith("partition:")]
    assert len(lines) == len(written) and all(lines), proc.stdout
    mp = m.cache.mp_of(tp)
    assert [(int(x[1]), int(x[2])) for x in lines] == [(mp, i) for i in range(len(written))]

    tp_str = f"topicIdPartition={kafka_uuid(tp.topic_id)}:{tp.topic}-{tp.partition}"
    kinds = [x[3] for x in lines]
    assert kinds == ["RemoteLogSegmentMetadata", "RemoteLogSegmentMetadataUpdate", "RemoteLogSegmentMetadata",
                     "RemoteLogSegmentMetadata", "RemoteLogSegmentMetadataUpdate", "RemotePartitionDeleteMetadata"]
    body = [x[4] for x in lines]
    for text, md in zip(body[:5], written[:5], strict=True):
        assert tp_str in text
        assert f"id={kafka_uuid(md.remote_log_segment_id.id)}" in text
        assert f"state={md.state.name}" in text and f"eventTimestampMs={md.event_timestamp_ms}" in text
        assert f"brokerId={md.broker_id}" in text
    assert (f"startOffset=1000, endOffset=1999, brokerId=4, maxTimestampMs={a.max_timestamp_ms}, "
            f"eventTimestampMs={a.event_timestamp_ms}, segmentLeaderEpochs={{2=1000, 5=1500}}, "
            "segmentSizeInBytes=123456, customMetadata=Optional[CustomMetadata{3 bytes}], "
            "state=COPY_SEGMENT_STARTED, txnIdxEmpty=false") in body[0]
    assert "customMetadata=Optional.empty" in body[1]
    assert "segmentLeaderEpochs={5=2000}" in body[2] and "startOffset=2000, endOffset=2999" in body[2]
    n = len(envelope.wrap(12, b"\x01\x02\x03"))
    assert n == 17 and (f"startOffset=3000, endOffset=3999, brokerId=4, maxTimestampMs={c.max_timestamp_ms}, "
                        f"eventTimestampMs={c.event_timestamp_ms}, segmentLeaderEpochs={{12=3000}}, "
                        f"segmentSizeInBytes=1000, customMetadata=Optional[CustomMetadata{{{n} bytes}}], "
                        "state=COPY_SEGMENT_STARTED, txnIdxEmpty=false") in body[3]
    assert body[5] == (f"topicPartition={kafka_uuid(tp.topic_id)}:{tp.topic}-{tp.partition}, "
                       "state=DELETE_PARTITION_MARKED, eventTimestampMs=77, brokerId=4")
