"""Building a sidecar against the test broker: settings with short intervals, a per-test metadata topic."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlm.config import SidecarSettings
from rlm.devkafka import KafkaCluster
from rsm.manager import RemoteStorageManager, RsmConfig

__all__ = ["RecordingRsm", "assert_contiguous", "assert_readable", "latest_remote", "make_settings", "only",
           "produce_segments", "remote_segments", "settings_yaml", "store_keys", "wait_for"]


class RecordingRsm(RemoteStorageManager):
    """The real storage manager, remembering every copy it is asked for (offset ranges, in order) and the start
    offset of every segment it deleted (in order)."""

    def __init__(self, config: RsmConfig) -> None:
        super().__init__(config)
        self.copies: list[tuple[int, int]] = []
        self.deleted: list[int] = []

    @property
    def copied(self) -> list[int]:
        """Start offsets of the copies asked for, in order."""
        return [start for start, _end in self.copies]

    def copy_log_segment_data(self, segment_metadata, segment_data):  # type: ignore[no-untyped-def]
        self.copies.append((segment_metadata.start_offset, segment_metadata.end_offset_inclusive))
        return super().copy_log_segment_data(segment_metadata, segment_data)

    def delete_log_segment_data(self, segment_metadata) -> None:  # type: ignore[no-untyped-def]
        super().delete_log_segment_data(segment_metadata)
        self.deleted.append(segment_metadata.start_offset)


def make_settings(kafka: KafkaCluster, tmp_path: Path, node_id: int = 1, **overrides: Any) -> SidecarSettings:
    tag = uuid.uuid4().hex[:8]
    raw: dict[str, Any] = {
        "broker_id": node_id,
        "log_dirs": [str(d) for d in kafka.node(node_id).log_dirs],
        "staging_dir": str(tmp_path / f"staging-{node_id}"),
        "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
        "store": {"store": "fs", "root_path": str(tmp_path / "remote"), "block_size_bytes": 64 * 1024},
        "metadata": {"topic": f"__rlm_md_{tag}", "partitions": 3, "replication_factor": 1,
                     "state_dir": str(tmp_path / f"state-{node_id}"), "tombstone_delay_ms": 1000,
                     "to_be_deleted_topic": f"__rlm_tbd_{tag}"},
        "tasks": {"copy_interval_ms": 300, "expiration_interval_ms": 500, "discovery_interval_ms": 300,
                  "gc_interval_ms": 3_600_000, "gc_grace_ms": 0, "cleaner_interval_ms": 300},
        "retention": [{"pattern": ".*", "retention_ms": -1, "retention_bytes": -1}],
        "listen": {"host": "127.0.0.1", "port": 0},
        "log_format": "text",
    }
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(raw.get(k), dict):
            raw[k] = {**raw[k], **v}
        else:
            raw[k] = v
    return SidecarSettings(**raw)


def wait_for(cond: Callable[[], Any], timeout_s: float = 60.0, what: str = "condition",
             interval_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(interval_s)


# ------------------------------------------------------------------------------------ shared by test_sidecar_*
def produce_segments(kafka: KafkaCluster, topic: str, rounds: int, per_round: int = 200, *,
                     segment_ms: int = 400, value_size: int = 100, timestamp_ms: int = 0,
                     roll: bool = True, **producer_conf: Any) -> dict[int, tuple[bytes, bytes]]:
    """Produce ``rounds`` batches of records, one segment each (the topic's ``segment.ms`` <= ``segment_ms``);
    with ``roll`` a last one-record append rolls the segment holding the last round. Returns offset -> (k, v)."""
    from tests.kafka_util import produce

    sent: dict[int, tuple[bytes, bytes]] = {}
    tag = uuid.uuid4().hex[:6]
    for r in range(rounds):
        recs = [(f"{tag}-{r}-{i}".encode(), (f"{tag}-{r}-{i}-".encode() * value_size)[:value_size],
                 None, timestamp_ms) for i in range(per_round)]
        for (_p, off), rec in zip(produce(kafka, topic, recs, **producer_conf), recs, strict=True):
            sent[off] = (rec[0], rec[1])
        time.sleep(segment_ms / 1000 + 0.05)
    if roll:
        produce(kafka, topic, [(b"__roll__", b"r")])
    return sent


def remote_segments(sidecar: Any, tp: Any) -> list[Any]:
    """The partition's COPY_SEGMENT_FINISHED segments, or [] while the sidecar does not serve it yet."""
    from rlmm.api import PartitionNotServedError

    try:
        return sidecar.reader.segments(tp)
    except PartitionNotServedError:
        return []


def latest_remote(sidecar: Any, tp: Any) -> int:
    segs = remote_segments(sidecar, tp)
    return segs[-1].end_offset_inclusive if segs else -1


def assert_contiguous(segs: list[Any], first_offset: int | None = 0) -> None:
    """No gap and no offset range remote twice: each segment starts right after the previous one ends."""
    assert segs, "no remote segments"
    if first_offset is not None:
        assert segs[0].start_offset == first_offset, [(s.start_offset, s.end_offset_inclusive) for s in segs]
    for a, b in zip(segs, segs[1:], strict=False):
        assert b.start_offset == a.end_offset_inclusive + 1, [(s.start_offset, s.end_offset_inclusive)
                                                               for s in segs]


def assert_readable(sidecar: Any, tp: Any, sent: dict[int, tuple[bytes, bytes]], from_offset: int = 0,
                    what: str = "") -> None:
    """Every offset of ``sent`` read back through the sidecar's remote reader, key and value byte-exact."""
    got = {r.offset: (r.key, r.value) for r in sidecar.reader.read(tp, from_offset) if r.offset in sent}
    assert got == sent, what


def store_keys(root: Path) -> set[str]:
    """Every object key of a file-system store (relative paths under its root)."""
    keys = (str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return {k for k in keys if not k.startswith(".tmp/")}


def only(topic: str) -> dict[str, list[str]]:
    """``topics`` settings tiering this one topic only (the session broker holds every test's topics)."""
    return {"include": [re.escape(topic)]}


def settings_yaml(settings: SidecarSettings) -> str:
    """The YAML an operator would write for these settings (for ``rlm serve --config``)."""
    import yaml

    return yaml.safe_dump(settings.model_dump(mode="json", exclude_none=True))
