"""A partition whose copying a refused copy holds is visible to an operator, against the real broker: a segment the
broker wrote whose last batch's leader epoch disagrees with the broker's leader-epoch checkpoint (the epoch field, which
the batch's CRC does not cover, rewritten in place) is refused by every copy run (:mod:`rlm.tasks.segment_epochs`: the
storage manager's copy finds the batches' map is not the checkpoint's), the segments after it wait, and the sidecar's
``/metrics`` shows ``rlm_copy_held{reason="epoch-mismatch"} 1`` and counts ``rlm_copy_refusals_total``, ``/health``
names the partition under ``copy_held``, its log an ERROR naming the segment file and the offsets. With the field as
the broker wrote it again, the next run copies the segment and every later one, each offset once, and the gauge and
the ``/health`` entry are gone."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest

from devtools.devkafka import KafkaCluster
from rlm.http import OpsServer
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from rsm.log.batch import scan_batches
from tests.support.kafka import partition_dir
from tests.support.processes import http_get
from tests.support.sidecar import (
    assert_contiguous,
    assert_readable,
    copy_state,
    make_settings,
    only,
    produce_segments,
    remote_segments,
    wait_for,
)

pytestmark = pytest.mark.kafka

EPOCH_FIELD = slice(12, 16)  # PartitionLeaderEpoch: after BaseOffset (8) and BatchLength (4), before the CRC'd bytes


def _metric(port: int, name: str, labels: dict[str, str]) -> float | None:
    """The sample of ``name`` with exactly ``labels`` on the sidecar's ``/metrics``; None when it has none."""
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    m = re.search(rf"^{name}{{{re.escape(want)}}} (\S+)$", body.decode(), re.MULTILINE)
    return float(m.group(1)) if m else None


def test_a_held_partition_is_visible_until_its_segment_copies(kafka: KafkaCluster, topic_name: str, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    tid = kafka.create_topic(topic_name, 1, config={"segment.ms": "300"})
    tp = TopicIdPartition(tid, topic_name, 0)
    sent = produce_segments(kafka, topic_name, 3, 100, segment_ms=300)
    pdir = partition_dir(kafka, topic_name)
    logs = sorted(pdir.glob("*.log"))
    assert len(logs) >= 4  # the premise: three rolled segments and the active one
    seg = logs[1]
    headers = list(scan_batches(seg))
    assert len({h.partition_leader_epoch for h in headers}) == 1  # the premise: one epoch, the checkpoint's
    last = headers[-1]
    held_from, held_end = headers[0].base_offset, last.last_offset
    fd = os.open(seg, os.O_RDWR)
    try:
        written = os.pread(fd, 4, last.position + EPOCH_FIELD.start)
        os.pwrite(fd, (last.partition_leader_epoch + 1).to_bytes(4, "big", signed=True),
                  last.position + EPOCH_FIELD.start)
    finally:
        os.close(fd)
    assert list(scan_batches(seg))[-1].partition_leader_epoch == last.partition_leader_epoch + 1  # its CRC still holds
    held = {"topic": topic_name, "partition": "0", "reason": "epoch-mismatch"}

    settings = make_settings(kafka, tmp_path, topics=only(topic_name))
    with caplog.at_level(logging.INFO, logger="rlm.tasks.copier"), Sidecar(settings) as sidecar:
        ops = OpsServer("127.0.0.1", 0, sidecar.health, sidecar.liveness).start()
        try:
            wait_for(lambda: _metric(ops.port, "rlm_copy_held", held) == 1.0, 60, "rlm_copy_held to show the hold",
                     detail=lambda: copy_state(sidecar, tp))
            # held: run after run refuses it; nothing from it on is copied
            wait_for(lambda: (_metric(ops.port, "rlm_copy_refusals_total",
                                      {"topic": topic_name, "reason": "epoch-mismatch"}) or 0) >= 3, 60,
                     "three refusals", detail=lambda: copy_state(sidecar, tp))
            assert [(m.start_offset, m.end_offset_inclusive) for m in remote_segments(sidecar, tp)] == [
                (0, held_from - 1)]
            lines = [r for r in caplog.records if r.getMessage().startswith("copy refused")]
            assert lines and all(r.levelno == logging.ERROR for r in lines)
            r = lines[0]
            assert (r.partition, Path(r.segment).name, r.start_offset, r.offset, r.reason) == (  # type: ignore[attr-defined]
                str(tp), seg.name, held_from, held_from, "epoch-mismatch")
            assert f"epoch {last.partition_leader_epoch + 1} from {last.base_offset}" in r.error  # type: ignore[attr-defined]
            health = json.loads(http_get(f"http://127.0.0.1:{ops.port}/health")[1])
            assert health["copy_held"] == {str(tp): {"reason": "epoch-mismatch", "start_offset": held_from}}

            fd = os.open(seg, os.O_RDWR)  # the field as the broker wrote it
            try:
                os.pwrite(fd, written, last.position + EPOCH_FIELD.start)
            finally:
                os.close(fd)
            ends = [int(p.stem) - 1 for p in logs[1:]]
            segs = wait_for(lambda: (s := remote_segments(sidecar, tp)) and s[-1].end_offset_inclusive == ends[-1]
                            and s, 60, "every rolled segment copied", detail=lambda: copy_state(sidecar, tp))
            assert [m.end_offset_inclusive for m in segs] == ends and segs[1].start_offset == held_from
            assert segs[1].end_offset_inclusive == held_end
            assert_contiguous(segs)
            assert_readable(sidecar, tp, {o: kv for o, kv in sent.items() if o <= ends[-1]})
            wait_for(lambda: _metric(ops.port, "rlm_copy_held", held) is None, 30, "rlm_copy_held to be gone")
            assert json.loads(http_get(f"http://127.0.0.1:{ops.port}/health")[1])["copy_held"] == {}
        finally:
            ops.stop()
