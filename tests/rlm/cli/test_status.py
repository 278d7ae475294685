"""``rlm status`` against a real broker (issue 27): one module-scoped scene of three topics, checked field by field.

- ``hole``: tiered by a sidecar up to offset 299, the sidecar stopped, more segments produced and rolled, then a
  local retention of 500 ms: the broker deletes every local segment, so offsets 300.. are neither local nor remote;
- ``diverged``: local data, and metadata as an unclean election leaves it (written to the real metadata topic
  through the real metadata manager): the old leader's epoch-0 copy of 0..199 covered by the new leader's copy of
  0..249 (epoch 1 from 150), a second old-leader copy of 250..279 nothing covers yet, a duplicate of the new copy;
- ``fresh``: two rolled segments and an active one, nothing remote yet; local retention 1 h and 10 MB, so the
  retention margin is finite in both time and bytes.

Expectations come from the broker (watermarks through a consumer, the partition's ``.log`` files) and from the
records the test wrote, not from the read model under test. The command runs in-process through ``rlm.cli.main``.
The real unclean election is exercised by tests/rlm/test_cluster_events.py (3 brokers, ~1 min): too slow to repeat
here for a view over the metadata it leaves.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from devtools.devkafka import KafkaCluster
from rlm.cli import main
from rlm.cli.status import holes
from rlm.rlmm_config import make_rlmm
from rlm.sidecar import Sidecar
from rlm.tasks.staging import staged_ranges, staging_roots
from rlmm.api import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from rsm.errors import RemoteStorageError
from rsm.manager import RemoteStorageManager
from tests.support.kafka import partition_dir, produce, set_topic_config
from tests.support.sidecar import latest_remote, make_settings, only, produce_segments, settings_yaml, wait_for

FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED


@dataclass
class Scene:
    config: Path
    hole: str
    diverged: str
    fresh: str
    ids: dict[str, uuid.UUID]
    remote_end: int  # hole: the last offset the sidecar tiered
    crafted: dict[str, RemoteLogSegmentMetadata]  # diverged: old, old_uncovered, new, duplicate
    watermarks: dict[str, tuple[int, int]]  # topic -> (earliest, high watermark), from a consumer


def watermarks(kafka: KafkaCluster, topic: str) -> tuple[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"status-{uuid.uuid4().hex[:6]}"})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
    finally:
        c.close()


def segment(tp: TopicIdPartition, start: int, end: int, epochs: tuple[tuple[int, int], ...], leader_epoch: int,
            broker_id: int, event_ms: int) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.uuid4()), start, end, event_ms, broker_id, event_ms,
                                    1000 + end - start, epochs, broker_leader_epoch=leader_epoch)


@pytest.fixture(scope="module")
def scene(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Scene:
    tmp = tmp_path_factory.mktemp("status")
    tag = uuid.uuid4().hex[:8]
    hole, diverged, fresh = f"status-hole-{tag}", f"status-diverged-{tag}", f"status-fresh-{tag}"
    ids = {hole: kafka.create_topic(hole, 1, config={"segment.ms": "300", "retention.ms": "-1"}),
           diverged: kafka.create_topic(diverged, 1),
           fresh: kafka.create_topic(fresh, 1, config={"segment.ms": "300", "retention.ms": "3600000",
                                                       "retention.bytes": "10000000"})}
    produce_segments(kafka, fresh, 2, 25, segment_ms=300)  # 0..24, 25..49 rolled; the roll record 50 active
    produce(kafka, diverged, [(None, b"v%d" % i) for i in range(300)])

    # hole: tiered up to 299 (three rolled segments; the roll record 300 stays in the active segment).
    settings = make_settings(kafka, tmp, topics=only(hole))
    config = tmp / "sidecar.yaml"
    config.write_text(settings_yaml(settings))
    produce_segments(kafka, hole, 3, 100, segment_ms=300)
    with Sidecar(settings) as sidecar:
        tp = TopicIdPartition(ids[hole], hole, 0)
        wait_for(lambda: latest_remote(sidecar, tp) >= 299, 60, f"{hole}-0 tiered through 299")
        remote_end = latest_remote(sidecar, tp)
    # The copy paused (no sidecar): more segments, then a local retention shorter than the pause.
    produce_segments(kafka, hole, 3, 100, segment_ms=300)
    set_topic_config(kafka, hole, retention_ms="500")
    # Every segment goes, the active one too (Kafka rolls it first): the range is empty and stays so.
    wait_for(lambda: (w := watermarks(kafka, hole))[0] == w[1] > remote_end + 1, 60,
             f"the broker to delete {hole}-0's local segments")

    # diverged: what an unclean election leaves in the metadata (copies of leader epochs 0 and 1).
    tp = TopicIdPartition(ids[diverged], diverged, 0)
    now = int(time.time() * 1000)
    crafted = {"old": segment(tp, 0, 199, ((0, 0),), 0, 2, now - 3000),
               "old_uncovered": segment(tp, 250, 279, ((0, 250),), 0, 2, now - 2000),
               "new": segment(tp, 0, 249, ((0, 0), (1, 150)), 1, 1, now - 1000),
               "duplicate": segment(tp, 0, 249, ((0, 0), (1, 150)), 1, 1, now)}
    writer = make_rlmm(settings, cache_dir=tmp / "writer-cache", read_only=False)
    try:
        writer.on_partition_leadership_changes([tp], [])
        writer.wait_ready([tp], timeout_s=60)
        for md in crafted.values():  # in this order: a copy under epoch 0 cannot finish after one under epoch 1
            writer.add_remote_log_segment_metadata(md)
            writer.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
                md.remote_log_segment_id, md.event_timestamp_ms + 1, None, FINISHED, md.broker_id))
    finally:
        writer.close()
    return Scene(config, hole, diverged, fresh, ids, remote_end, crafted,
                 {t: watermarks(kafka, t) for t in (hole, diverged, fresh)})


def status(scene: Scene, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["status", "--config", str(scene.config), *args])
    return code, capsys.readouterr().out


def test_json_field_by_field_and_exit_code_on_a_hole(scene: Scene, kafka: KafkaCluster,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    code, out = status(scene, capsys, scene.hole, scene.diverged, scene.fresh, "--json")
    docs = {d["topic"]: d for d in map(json.loads, out.splitlines())}
    assert list(docs) == [scene.hole, scene.diverged, scene.fresh]
    assert code == 1, f"a hole in {scene.hole}-0: exit code 1 expected, got {code}\n{out}"
    assert {t: d["topic_id"] for t, d in docs.items()} == {t: str(i) for t, i in scene.ids.items()}

    # hole: the broker deleted 300..(its log start - 1) before they were copied.
    lo, hw = scene.watermarks[scene.hole]
    assert watermarks(kafka, scene.hole) == (lo, hw), "the broker's range moved while the test ran"
    (p,) = docs[scene.hole]["partitions"]
    assert p["partition"] == 0 and p["leader"] == 1 and p["error"] is None
    assert p["local"]["start_offset"] == lo and p["local"]["high_watermark"] == hw
    assert p["local"]["end_offset_inclusive"] == (hw - 1 if hw > lo else None)
    assert isinstance(p["local"]["leader_epoch"], int)
    assert p["remote"] == {"start_offset": 0, "end_offset_inclusive": scene.remote_end, "segments": 3,
                           "size_bytes": p["remote"]["size_bytes"]} and p["remote"]["size_bytes"] > 0
    assert p["holes"] == [{"first_offset": scene.remote_end + 1, "last_offset": lo - 1,
                           "offsets": lo - scene.remote_end - 1, "where": "before_local"}]
    assert p["copy_lag"] == {"offsets": hw - lo, "segments": 0, "bytes": 0}
    # nothing rolled is left locally: nothing at risk (null: infinite)
    assert p["retention_margin"] == {"seconds": None, "bytes": None, "segment_base_offset": None}
    assert (p["duplicate_copies"], p["diverged_copies"], p["kept_unserved_copies"]) == (0, [], 0)
    s = docs[scene.hole]["summary"]
    assert (s["partitions"], s["partitions_remote"], s["remote_segments"]) == (1, 1, 3)
    assert (s["partitions_with_holes"], s["hole_offsets"], s["partitions_unknown"]) == (1, lo - scene.remote_end - 1, 0)
    assert s["remote_bytes"] == p["remote"]["size_bytes"]

    # diverged: the new leader's copy is served; the old leader's copies are diverged, one of them covered.
    c = scene.crafted
    lo, hw = scene.watermarks[scene.diverged]
    assert (lo, hw) == (0, 300)
    (p,) = docs[scene.diverged]["partitions"]
    assert p["local"] == {"start_offset": 0, "end_offset_inclusive": 299, "high_watermark": 300,
                          "leader_epoch": p["local"]["leader_epoch"]}
    assert p["remote"] == {"start_offset": 0, "end_offset_inclusive": 249, "segments": 1,
                           "size_bytes": c["new"].segment_size_bytes}
    assert p["holes"] == []
    assert p["copy_lag"]["offsets"] == 50  # 250..299: local only
    assert p["duplicate_copies"] == 1 and p["kept_unserved_copies"] == 0
    assert p["diverged_copies"] == [
        {"segment_id": str(md.remote_log_segment_id.id), "start_offset": md.start_offset,
         "end_offset_inclusive": md.end_offset_inclusive, "size_bytes": md.segment_size_bytes,
         "leader_epochs": [[0, md.start_offset]], "broker_id": 2, "awaiting_deletion": awaiting}
        for md, awaiting in ((c["old"], True), (c["old_uncovered"], False))]
    s = docs[scene.diverged]["summary"]
    assert (s["duplicate_copies"], s["diverged_copies"], s["diverged_awaiting_deletion"]) == (1, 2, 1)
    assert s["partitions_with_holes"] == 0

    # fresh: nothing remote; two rolled segments and the active one local, all of it copy lag.
    lo, hw = scene.watermarks[scene.fresh]
    assert (lo, hw) == (0, 51)
    (p,) = docs[scene.fresh]["partitions"]
    assert p["remote"] is None and p["holes"] == [] and p["error"] is None
    sizes = {int(f.stem): f.stat().st_size for f in partition_dir(kafka, scene.fresh).glob("*.log")}
    rolled = sorted(sizes)[:-1]
    assert rolled == [0, 25]
    assert p["copy_lag"] == {"offsets": 51, "segments": 2, "bytes": sizes[0] + sizes[25]}
    m = p["retention_margin"]
    assert m["segment_base_offset"] == 0
    assert m["bytes"] == 10_000_000 + sizes[0] - sum(sizes.values())
    assert 3600 - 120 < m["seconds"] <= 3600, m  # retention.ms 1 h from the first segment's newest record
    s = docs[scene.fresh]["summary"]
    assert (s["partitions_remote"], s["remote_segments"], s["remote_bytes"]) == (0, 0, 0)
    assert (s["copy_lag_offsets"], s["copy_lag_segments"], s["copy_lag_bytes"]) == (51, 2, sizes[0] + sizes[25])
    assert s["min_retention_margin_seconds"] == m["seconds"]


def test_text_summary_exit_0_without_a_hole_and_default_topics(scene: Scene,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    code, out = status(scene, capsys, scene.diverged, scene.fresh)
    assert code == 0, f"no hole in {scene.diverged} or {scene.fresh}: exit code 0 expected, got {code}\n{out}"
    summaries = [line for line in out.splitlines() if line.startswith("status-")]
    assert [line.split(":")[0] for line in summaries] == [scene.diverged, scene.fresh]
    assert "no holes" in summaries[0] and "1 diverged and 1 duplicate copies awaiting deletion" in summaries[0]
    assert "0 with remote data" in summaries[1] and "copy lag 51 offsets, 2 segments" in summaries[1]
    assert "HOLE" not in out, out

    # No topic named: every topic the config tiers (only the hole topic), and its hole.
    code, out = status(scene, capsys)
    summaries = [line for line in out.splitlines() if line.startswith("status-")]
    assert code == 1 and [line.split(":")[0] for line in summaries] == [scene.hole], out
    assert f"HOLE {scene.remote_end + 1}.." in out and "HOLES in 1 partition (" in summaries[0]


def test_unknown_topic_exits_2(scene: Scene, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["status", "--config", str(scene.config), f"status-missing-{uuid.uuid4().hex[:8]}"])
    assert exc.value.code == 2
    assert "no such topic partition on the cluster" in capsys.readouterr().err


def test_holes_edges() -> None:
    """What counts as a hole: chain gaps below the local start (clipped to it), the span after the remote end."""
    tp = TopicIdPartition(uuid.uuid4(), "t", 0)

    def seg(start: int, end: int) -> RemoteLogSegmentMetadata:
        return segment(tp, start, end, ((0, start),), 0, 1, 1)

    chain = [seg(0, 99), seg(200, 299), seg(400, 499)]
    assert holes([], 1000) == []  # nothing remote: nothing judged
    assert holes(chain, 0) == []  # everything still local
    for local_start in (450, 500):  # inside the last segment, right after it: no hole above the chain
        assert [(x.first_offset, x.last_offset) for x in holes(chain, local_start)] == [(100, 199), (300, 399)]
    assert [(x.first_offset, x.last_offset, x.where) for x in holes(chain, 250)] == [(100, 199, "remote_chain")]
    assert [(x.first_offset, x.last_offset, x.where) for x in holes(chain, 150)] == [(100, 149, "remote_chain")]
    assert [(x.first_offset, x.last_offset, x.where) for x in holes(chain, 700)] == [
        (100, 199, "remote_chain"), (300, 399, "remote_chain"), (500, 699, "before_local")]


def test_offsets_staged_below_the_local_start_await_their_copy_and_are_no_hole() -> None:
    """Between the remote end and the local start, what the sidecar's staged segments hold (on the leader's host)
    awaits its copy: no hole; the rest of that span is one; chain gaps are holes whatever is staged."""
    from rlm.cli.status import awaiting_copy

    tp = TopicIdPartition(uuid.uuid4(), "t", 0)

    def seg(start: int, end: int) -> RemoteLogSegmentMetadata:
        return segment(tp, start, end, ((0, start),), 0, 1, 1)

    chain = [seg(0, 99), seg(200, 299)]

    def judged(staged: list[tuple[int, int]]) -> tuple[list[tuple[int, int, str]], list[tuple[int, int]]]:
        return ([(x.first_offset, x.last_offset, x.where) for x in holes(chain, 700, staged)],
                awaiting_copy(chain, 700, staged))

    gap = (100, 199, "remote_chain")
    assert judged([]) == ([gap, (300, 699, "before_local")], [])
    assert judged([(300, 499), (500, 699)]) == ([gap], [(300, 499), (500, 699)])  # all staged: only the gap
    assert judged([(300, 399), (600, 799)]) == ([gap, (400, 599, "before_local")], [(300, 399), (600, 699)])
    assert judged([(100, 199), (250, 349)]) == ([gap, (350, 699, "before_local")], [(300, 349)])
    assert judged([(700, 799)]) == ([gap, (300, 699, "before_local")], [])  # local already: nothing awaits
    assert awaiting_copy([], 700, [(0, 699)]) == []  # nothing remote: nothing judged


class _FailingFrom(RemoteStorageManager):
    """The real storage manager, failing every copy of a segment from ``fail_from`` on (a store refusing writes):
    the sidecar keeps such segments staged for its next attempt."""

    fail_from = 1 << 62

    def copy_log_segment_data(self, segment_metadata, data, **kw):  # type: ignore[no-untyped-def]
        if segment_metadata.start_offset >= self.fail_from:
            raise RemoteStorageError(f"test: the store refuses the copy of {segment_metadata.start_offset}..")
        return super().copy_log_segment_data(segment_metadata, data, **kw)


def test_segments_the_broker_deleted_while_staged_await_their_copy(
        kafka: KafkaCluster, topic_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The first segment is tiered; the store then refuses every copy, so the next segments stay staged (hard links)
    while the broker's retention deletes them; the sidecar stops. ``rlm status`` on the leader's host: the offsets
    between the remote end and the local start are awaiting their copy (the staged segments' ranges), no hole, exit
    0 (before: a hole, exit 1)."""
    tid = kafka.create_topic(topic_name, 1, config={"segment.ms": "300", "retention.ms": "-1"})
    tp = TopicIdPartition(tid, topic_name, 0)
    settings = make_settings(kafka, tmp_path, topics=only(topic_name))
    config = tmp_path / "sidecar.yaml"
    config.write_text(settings_yaml(settings))
    rsm = _FailingFrom(settings.store)
    produce_segments(kafka, topic_name, 1, 20, segment_ms=300)  # 0..19 rolled, the roll record 20 active
    with Sidecar(settings, rsm=rsm) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= 19, 60, "the first segment tiered")
        rsm.fail_from = 20
        produce_segments(kafka, topic_name, 2, 20, segment_ms=300, roll=False)
        # the roll, by a record timestamped ahead: the segment it starts neither rolls nor is deleted by retention
        ((_p, active),) = produce(kafka, topic_name, [(b"ahead", b"a", None, int(time.time() * 1000) + 600_000)])
        roots = list(staging_roots(settings.log_dirs, settings.staging_dir).values())
        wait_for(lambda: (got := staged_ranges(roots, tp)) and got[-1][1] == active - 1, 60,
                 "the next segments staged")
    staged = staged_ranges(roots, tp)
    set_topic_config(kafka, topic_name, retention_ms="500")
    wait_for(lambda: watermarks(kafka, topic_name)[0] == active, 60, "the broker to delete them")
    start = active
    capsys.readouterr()
    code = main(["status", topic_name, "--config", str(config), "--json"])
    (part,) = json.loads(capsys.readouterr().out)["partitions"]
    assert part["remote"]["end_offset_inclusive"] == 19
    assert part["holes"] == [] and code == 0, part
    assert [(a["first_offset"], a["last_offset"]) for a in part["awaiting_copy"]] == [
        (max(a, 20), min(b, start - 1)) for a, b in staged if b >= 20 and a < start]
    assert part["awaiting_copy"][0]["first_offset"] == 20 and part["awaiting_copy"][-1]["last_offset"] == start - 1
