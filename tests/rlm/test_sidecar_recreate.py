"""Issue 21: a topic deleted while its throttled copy is in flight, and re-created under the same name, is tiered at
once; the old topic's copy is stopped and its remote data purged. Against the real broker, one sidecar through ten
incarnations of one topic name.

Before: the old topic's copy job and the new topic's had the same id (``copy:<topic>-<partition>``), and apscheduler
runs one instance per id: the new topic waited, unstaged, for the old topic's throttled copy to run to its end (then
to be fenced), while the broker's local retention could delete its data; and the purge released the staged files
under that copy. Seen: nothing of the new topic remote after 90 s, in every run.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlmm.api import RemoteLogSegmentState, TopicIdPartition
from tests.rlm.invariants import InvariantChecker, staged_files, store_keys_of_topic_id
from tests.support.sidecar import RecordingRsm, latest_remote, make_settings, produce_segments, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

INCARNATIONS = 10
RATE = 40_000  # bytes/s: a 2.4 MB segment takes a minute to copy, the small ones well under a second each
CONFIG = {"segment.ms": "400", "file.delete.delay.ms": "1000"}


def recreate(kafka: KafkaCluster, admin: AdminClient, name: str) -> TopicIdPartition:
    admin.delete_topics([name], operation_timeout=30)[name].result(60)

    def created():
        try:
            return kafka.create_topic(name, 1, config=CONFIG)
        except Exception:  # noqa: BLE001 - the deletion is still going on
            return None

    return TopicIdPartition(wait_for(created, 60, f"{name} to be re-created", interval_s=0.5), name, 0)


def test_topic_recreated_while_its_throttled_copy_is_in_flight(kafka: KafkaCluster, topic_name: str,
                                                                tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                                ) -> None:
    caplog.set_level(logging.INFO, logger="rlm")
    caplog.set_level(logging.INFO, logger="rlmm")
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    settings = make_settings(kafka, tmp_path, topics={"include": [re.escape(topic_name)]},
                             store={"store": "fs", "root_path": str(tmp_path / "remote"),
                                    "block_size_bytes": 64 * 1024, "copy_rate_bytes_per_second": RATE},
                             metadata={"partitions": 50}, tasks={"purge_grace_ms": 1000})
    root = tmp_path / "remote"
    rsm = RecordingRsm(settings.store)
    tp = TopicIdPartition(kafka.create_topic(topic_name, 1, config=CONFIG), topic_name, 0)
    old: list[TopicIdPartition] = []
    side = Sidecar(settings, rsm=rsm).start()
    try:
        with InvariantChecker.open(settings, tmp_path / "checker") as checker:
            for i in range(INCARNATIONS):
                # small segments: tiered within seconds of the re-creation (while the old copy would still run)
                sent = produce_segments(kafka, topic_name, 3, per_round=100, segment_ms=400, value_size=100)
                last = max(sent)
                wait_for(lambda tp=tp, last=last: latest_remote(side, tp) >= last, 20,
                         f"incarnation {i} ({tp.topic_id}) to be tiered up to {last}", interval_s=0.2)
                checker.follow([tp])
                checker.assert_ok(tp, sent, first_offset=0, tiered_through=last)
                # then a big one, whose throttled copy is in flight when the topic is deleted
                big = produce_segments(kafka, topic_name, 1, per_round=12_000, segment_ms=400, value_size=200)
                wait_for(lambda last=last: any(s > last for s, _e in rsm.copies), 20, "the big segment's copy to start")
                assert latest_remote(side, tp) < max(big), "the big segment was copied already: not in flight"
                old.append(tp)
                tp = recreate(kafka, admin, topic_name)

            # the last incarnation, written to like the others, is tiered completely and exactly
            sent = produce_segments(kafka, topic_name, 3, per_round=100, segment_ms=400, value_size=100)
            last = max(sent)
            wait_for(lambda: latest_remote(side, tp) >= last, 20, f"the last incarnation to be tiered up to {last}")
            checker.follow([tp])
            checker.assert_ok(tp, sent, first_offset=0, tiered_through=last)

            # every earlier incarnation: its copy stopped, its data purged from the store, metadata and staging
            def left() -> list[str]:
                out = []
                for dead in old:
                    out += [f"{dead.topic_id}: object {k}" for k in store_keys_of_topic_id(root, dead.topic_id)[:3]]
                    out += [f"{dead.topic_id}: staged {p}" for p in staged_files(tmp_path / "staging-1", dead)[:3]]
                    checker.follow([dead])
                    out += [f"{dead.topic_id}: segment {m.start_offset}..{m.end_offset_inclusive} {m.state.name}"
                            for m in checker.all_segments(dead)
                            if m.state != RemoteLogSegmentState.DELETE_SEGMENT_FINISHED]
                return out

            wait_for(lambda: not left(), 60, "the deleted incarnations to be purged", interval_s=1.0)
    finally:
        assert side.stop(30)
    # a topic deleted under its copy is an ordinary event: nothing of it is an error (the copy cancelled, its
    # clean-up and the purge racing nothing, the new partition's first empty checkpoint read as empty)
    errors = [f"{r.name}: {r.getMessage()}" for r in caplog.records
              if r.levelno >= logging.ERROR and r.name.startswith(("rlm", "rlmm")) and r.name != "rlm.librdkafka"]
    assert not errors, errors[:10]
    assert any("copy cancelled" in r.getMessage() for r in caplog.records)
