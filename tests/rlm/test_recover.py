"""Disaster recovery (``rlm recover``) and the read-only sidecar, against the real broker and the filesystem store.

One module-scoped set-up tiers a topic of two partitions with an in-process sidecar, stops it, and litters the
store with a committed duplicate of one segment (an overlapping stale copy) and a copy without index object (a
crashed copy). Recovery then runs as its own process (``python -m rlm.cli recover``) into *new* metadata topics,
as after a lost one; what it rebuilds is compared with what the original metadata said (``rlm ls --json``) and
with what was produced (``rlm cat``), never with the recovery code's own view.
"""

from __future__ import annotations

import base64
import re
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from devtools.devkafka import KafkaCluster
from rlm.config import SidecarSettings
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from rsm.api import EpochEntry, LogSegmentData, RemoteSegmentMetadata
from rsm.manager import RemoteStorageManager
from tests.support.kafka import partition_dir, produce
from tests.support.processes import json_lines, ok, rlm
from tests.support.sidecar import (
    latest_remote,
    make_settings,
    produce_segments,
    remote_segments,
    settings_yaml,
    store_keys,
    wait_for,
)

pytestmark = [pytest.mark.kafka]


@dataclass
class Tiered:
    kafka: KafkaCluster
    tmp: Path
    settings: SidecarSettings
    config: Path
    topic: str
    topic_id: uuid.UUID
    sent: dict[int, dict[int, tuple[bytes, bytes]]]   # partition -> offset -> (key, value)
    ls: list[dict[str, Any]]                          # `rlm ls --json` of the original metadata
    duplicate: uuid.UUID                              # a committed copy of a chain segment's range
    crashed: uuid.UUID                                # a copy without index object


def config_with(t: Tiered, name: str, **overrides: Any) -> Path:
    """The original config with a new metadata topic (as after losing it) and state dir, plus ``overrides``."""
    raw = t.settings.model_dump(mode="json", exclude_none=True)
    tag = uuid.uuid4().hex[:8]
    raw["metadata"] = {**raw["metadata"], "topic": f"__rlm_md_{name}_{tag}", "state_dir": str(t.tmp / f"state-{tag}")}
    for k, v in overrides.items():
        raw[k] = {**raw[k], **v} if isinstance(v, dict) and isinstance(raw.get(k), dict) else v
    path = t.tmp / f"{name}-{tag}.yaml"
    path.write_text(settings_yaml(SidecarSettings(**raw)))
    return path


def metadata_end_offsets(kafka: KafkaCluster, topic: str) -> dict[int, int] | None:
    """Each partition's high watermark of ``topic``; None when the topic does not exist."""
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    md = admin.list_topics(topic, timeout=30).topics.get(topic)
    if md is None or md.error is not None:
        return None
    c = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": f"wm-{uuid.uuid4()}"})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=30)[1] for p in md.partitions}
    finally:
        c.close()


def topic_of(config: Path) -> str:
    return re.search(r"topic: (__rlm_md_\S+)", config.read_text())[1]


def cat(topic: str, partition: int, config: Path) -> dict[int, tuple[bytes, bytes]]:
    rows = json_lines(ok(rlm("cat", topic, str(partition), config=config)))
    return {r["offset"]: (base64.b64decode(r["key"]), base64.b64decode(r["value"])) for r in rows}


def recover(config: Path, *args: str) -> str:
    return ok(rlm("recover", *args, config=config))


def copy_of_local_segment(t: Tiered, rsm: RemoteStorageManager, row: dict[str, Any]) -> RemoteSegmentMetadata:
    """A second committed copy of the chain segment ``row`` (an `rlm ls --json` row), made later from the broker's
    own files: what a zombie leader's copy of the same range looks like."""
    pdir = partition_dir(t.kafka, t.topic, row["partition"])
    base = f"{row['start_offset']:020d}"
    md = RemoteSegmentMetadata(
        remote_segment_id=uuid.uuid4(), topic_id=t.topic_id, topic_name=t.topic, partition=row["partition"],
        start_offset=row["start_offset"], end_offset_inclusive=row["end_offset"],
        max_timestamp_ms=row["max_timestamp_ms"], segment_size_bytes=row["size_bytes"], broker_id=1,
        event_timestamp_ms=int(time.time() * 1000) + 60_000,
        segment_leader_epochs=tuple(EpochEntry(e, o) for e, o in row["leader_epochs"]))
    rsm.copy_log_segment_data(md, LogSegmentData(
        pdir / f"{base}.log", pdir / f"{base}.index", pdir / f"{base}.timeindex", None, None, b""))
    return md


@pytest.fixture(scope="module")
def tiered(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Tiered:
    tmp = tmp_path_factory.mktemp("recover")
    topic = f"recover-{uuid.uuid4().hex[:8]}"
    topic_id = kafka.create_topic(topic, 2, config={"segment.ms": "400"})
    sent = {p: produce_segments(kafka, topic, 3, 150, segment_ms=400, roll=False, partition=p) for p in (0, 1)}
    for p in (0, 1):  # a last record rolls each partition's last segment
        produce(kafka, topic, [(b"__roll__", b"r")], partition=p)
    settings = make_settings(kafka, tmp, topics={"include": [re.escape(topic)]})
    config = tmp / "sidecar.yaml"
    config.write_text(settings_yaml(settings))
    with Sidecar(settings) as sidecar:
        for p in (0, 1):
            tp = TopicIdPartition(topic_id, topic, p)
            wait_for(lambda tp=tp, p=p: latest_remote(sidecar, tp) >= max(sent[p]), 120, f"{tp} to be remote")
            assert len(remote_segments(sidecar, tp)) >= 3
    t = Tiered(kafka, tmp, settings, config, topic, topic_id, sent, [], uuid.UUID(int=0), uuid.UUID(int=0))
    t.ls = json_lines(ok(rlm("ls", topic, "--json", config=config)))
    rsm = RemoteStorageManager(settings.store)
    try:
        second = [r for r in t.ls if r["partition"] == 0][1]
        t.duplicate = copy_of_local_segment(t, rsm, second).remote_segment_id
        crashed = copy_of_local_segment(t, rsm, second)
        rsm.store.delete(rsm.keys(crashed).index)  # the commit point never written: a crashed copy
        t.crashed = crashed.remote_segment_id
    finally:
        rsm.close()
    return t


@pytest.mark.slow
def test_recover_rebuilds_the_lost_metadata_topic(tiered: Tiered) -> None:
    t = tiered
    config = config_with(t, "lost")
    md_topic = topic_of(config)
    keys_before = store_keys(t.settings.store.root_path)

    # --dry-run: says what it would write, writes nothing (the metadata topic is not even created)
    dry = recover(config, "--dry-run")
    assert len(re.findall(r"^would write ", dry, re.M)) == len(t.ls), dry
    assert metadata_end_offsets(t.kafka, md_topic) is None

    out = recover(config)
    assert len(re.findall(r"^recovered ", out, re.M)) == len(t.ls), out
    assert f"wrote {len(t.ls)} segments" in out and "0 conflicts" in out and "2 orphans" in out, out
    assert re.search(rf"^orphan .*segment {t.duplicate}: outside the chain", out, re.M), out
    assert re.search(rf"^orphan \S*{t.crashed}: no index object", out, re.M), out
    assert store_keys(t.settings.store.root_path) == keys_before  # recover deletes nothing

    # the recovered chain is the original one: offsets, epochs, sizes, timestamps, segment ids, states
    assert json_lines(ok(rlm("ls", t.topic, "--json", config=config))) == t.ls
    # every record byte-exact through the recovered metadata
    for p in (0, 1):
        got = cat(t.topic, p, config)
        assert {o: kv for o, kv in got.items() if o in t.sent[p]} == t.sent[p]

    # a second run writes nothing: every chain segment is known by its segment id
    ends = metadata_end_offsets(t.kafka, md_topic)
    again = recover(config)
    assert "wrote 0 segments" in again and f"{len(t.ls)} already in the metadata" in again, again
    assert metadata_end_offsets(t.kafka, md_topic) == ends

    # into the live, original metadata topic: nothing duplicated either
    live_ends = metadata_end_offsets(t.kafka, t.settings.metadata.topic)
    live = recover(t.config)
    assert "wrote 0 segments" in live, live
    assert metadata_end_offsets(t.kafka, t.settings.metadata.topic) == live_ends


def test_read_only_sidecar_writes_nothing(tiered: Tiered) -> None:
    t = tiered
    # A sidecar that would expire everything at once, collect garbage with no grace and tier a new topic...
    other = f"recover-ro-{uuid.uuid4().hex[:8]}"
    other_id = t.kafka.create_topic(other, 1, config={"segment.ms": "300"})
    base = t.settings.model_dump(mode="json", exclude_none=True)
    settings = SidecarSettings(**{
        **base, "mode": "read_only",
        "metadata": {**base["metadata"], "state_dir": str(t.tmp / "state-ro"),
                     "to_be_deleted_topic": f"__rlm_tbd_ro_{uuid.uuid4().hex[:8]}"},
        "topics": {"include": [re.escape(t.topic), re.escape(other)]},
        "retention": [{"pattern": ".*", "retention_ms": 1, "retention_bytes": 1}],
        "tasks": {**base["tasks"], "gc_interval_ms": 1000, "gc_grace_ms": 0, "expiration_interval_ms": 300}})
    md_ends = metadata_end_offsets(t.kafka, t.settings.metadata.topic)
    root = t.settings.store.root_path
    before = {k: (root / k).stat().st_mtime_ns for k in store_keys(root)}
    with Sidecar(settings) as sidecar:
        assert sidecar.read_only
        produce_segments(t.kafka, other, 3, 50, segment_ms=300)  # rolled segments it must not copy
        tp = TopicIdPartition(t.topic_id, t.topic, 0)
        wait_for(lambda: latest_remote(sidecar, tp) >= max(t.sent[0]), 60, "the read-only sidecar to serve reads")
        time.sleep(2.5)  # several discovery, expiration and gc intervals
        got = {r.offset: (r.key, r.value) for r in sidecar.reader.read(tp, 0) if r.offset in t.sent[0]}
        assert got == t.sent[0]
        assert latest_remote(sidecar, TopicIdPartition(other_id, other, 0)) == -1
    assert {k: (root / k).stat().st_mtime_ns for k in store_keys(root)} == before
    assert metadata_end_offsets(t.kafka, t.settings.metadata.topic) == md_ends
    assert metadata_end_offsets(t.kafka, settings.metadata.to_be_deleted_topic) is None


@pytest.mark.slow
def test_recover_onto_a_recreated_topic_by_name_and_by_map(tiered: Tiered) -> None:
    t = tiered
    admin = AdminClient({"bootstrap.servers": t.kafka.bootstrap_servers})
    admin.delete_topics([t.topic])[t.topic].result(30)

    def recreated() -> uuid.UUID | None:
        try:
            return t.kafka.create_topic(t.topic, 2)
        except Exception:  # noqa: BLE001 - still being deleted
            return None

    new_id = wait_for(recreated, 90, "the topic to be re-created", interval_s=1.0)
    assert new_id != t.topic_id
    renamed = f"recover-renamed-{uuid.uuid4().hex[:8]}"
    t.kafka.create_topic(renamed, 2)

    # by name: the stored topic id maps to the cluster's new id of the same name
    config = config_with(t, "recreated")
    out = recover(config, "--topic", t.topic)
    assert f"wrote {len(t.ls)} segments" in out and f"-> {t.topic}-0({new_id})" in out, out
    rows = json_lines(ok(rlm("ls", t.topic, "--json", config=config)))
    assert rows == t.ls  # the same segments (ids, offsets ...) now listed under the new topic id
    for p in (0, 1):
        got = cat(t.topic, p, config)  # objects still under the old topic id's keys
        assert {o: kv for o, kv in got.items() if o in t.sent[p]} == t.sent[p]
    assert "wrote 0 segments" in recover(config, "--topic", t.topic)

    # by --map: the stored id recovered as another topic name; --topic filters the others out
    config2 = config_with(t, "mapped")
    out = recover(config2, "--map", f"{t.topic_id}={renamed}", "--topic", renamed)
    assert f"wrote {len(t.ls)} segments" in out, out
    got = cat(renamed, 1, config2)
    assert {o: kv for o, kv in got.items() if o in t.sent[1]} == t.sent[1]
    rows = json_lines(ok(rlm("ls", renamed, "--json", config=config2)))
    assert [{**r, "topic": t.topic} for r in rows] == t.ls


def test_topic_mapping_rules() -> None:
    """map_partitions: by name to the cluster's id; --map first; ambiguity and absence are skipped, never guessed."""
    from rlm.recovery import ClusterTopic, map_partitions
    from rsm.api import KeyLayout, StoredPartition

    old, older, cur, other = (uuid.uuid4() for _ in range(4))
    sp = lambda tid, name, p=0: StoredPartition(tid, name, p, KeyLayout())  # noqa: E731
    cluster = {"a": ClusterTopic("a", cur, frozenset({0, 1})), "b": ClusterTopic("b", other, frozenset({0}))}

    # the same cluster: the stored id is the cluster's; a former "a" beside it is not merged in
    mapped, skipped = map_partitions([sp(cur, "a"), sp(old, "a")], cluster)
    assert mapped == {sp(cur, "a"): TopicIdPartition(cur, "a", 0)}
    assert [s for s, _ in skipped] == [sp(old, "a")] and "--map" in skipped[0][1]
    # a new cluster: the one stored id of a name maps to the cluster's id; a missing partition is skipped
    mapped, skipped = map_partitions([sp(old, "a", 1), sp(old, "a", 5)], cluster)
    assert mapped == {sp(old, "a", 1): TopicIdPartition(cur, "a", 1)}
    assert "no partition 5" in skipped[0][1]
    # two stored ids, neither the cluster's: ambiguous until --map chooses
    mapped, skipped = map_partitions([sp(old, "a"), sp(older, "a")], cluster)
    assert mapped == {} and len(skipped) == 2 and all("--map" in r for _, r in skipped)
    mapped, skipped = map_partitions([sp(old, "a"), sp(older, "a")], cluster, explicit={older: "a"})
    assert mapped == {sp(older, "a"): TopicIdPartition(cur, "a", 0)} and [s for s, _ in skipped] == [sp(old, "a")]
    # renamed by --map; a topic absent from the cluster is skipped; --topic filters by target name
    mapped, skipped = map_partitions([sp(old, "x"), sp(older, "gone")], cluster, explicit={old: "b"})
    assert mapped == {sp(old, "x"): TopicIdPartition(other, "b", 0)}
    assert "no topic gone on the cluster" in skipped[0][1]
    assert map_partitions([sp(old, "x"), sp(cur, "a")], cluster, explicit={old: "b"}, topics=["a"])[0] == {
        sp(cur, "a"): TopicIdPartition(cur, "a", 0)}
