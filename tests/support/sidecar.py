"""Building a sidecar against the test broker: settings with short intervals, a per-test metadata topic."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from devtools.devkafka import KafkaCluster
from rlm.config import SidecarSettings
from rsm.manager import RemoteStorageManager, RsmConfig

__all__ = ["RecordingRsm", "assert_contiguous", "assert_readable", "copy_state", "discovery_state", "latest_remote",
           "make_settings", "only", "produce_segments", "remote_segments", "settings_yaml", "store_keys", "wait_for"]


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

    def copy_log_segment_data(self, segment_metadata, segment_data, **kw):  # type: ignore[no-untyped-def]
        self.copies.append((segment_metadata.start_offset, segment_metadata.end_offset_inclusive))
        return super().copy_log_segment_data(segment_metadata, segment_data, **kw)

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
                  "gc_interval_ms": 3_600_000, "gc_grace_ms": 0, "purge_grace_ms": 1000, "copy_settle_ms": 0},
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
             interval_s: float = 0.2, detail: Callable[[], str] | None = None) -> Any:
    """``cond()``'s first true value, asked every ``interval_s``; an AssertionError after ``timeout_s``, naming
    ``what`` and, with ``detail``, what it says at that moment (the state that would tell why the wait was long)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}"
                                 + (f": {detail()}" if detail is not None else ""))
        time.sleep(interval_s)


# ------------------------------------------------------------------------------------ shared by test_sidecar_*
def produce_segments(kafka: KafkaCluster, topic: str, rounds: int, per_round: int = 200, *,
                     segment_ms: int = 400, value_size: int = 100, timestamp_ms: int = 0,
                     roll: bool = True, **producer_conf: Any) -> dict[int, tuple[bytes, bytes]]:
    """Produce ``rounds`` batches of records, one segment each (the topic's ``segment.ms`` <= ``segment_ms``);
    with ``roll`` a last one-record append rolls the segment holding the last round. Returns offset -> (k, v)."""
    from tests.support.kafka import ROLL_KEY, produce

    sent: dict[int, tuple[bytes, bytes]] = {}
    tag = uuid.uuid4().hex[:6]
    for r in range(rounds):
        recs = [(f"{tag}-{r}-{i}".encode(), (f"{tag}-{r}-{i}-".encode() * value_size)[:value_size],
                 None, timestamp_ms) for i in range(per_round)]
        for (_p, off), rec in zip(produce(kafka, topic, recs, **producer_conf), recs, strict=True):
            sent[off] = (rec[0], rec[1])
        time.sleep(segment_ms / 1000 + 0.05)
    if roll:
        produce(kafka, topic, [(ROLL_KEY, b"r")])
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


def copy_state(sidecar: Any, tp: Any) -> str:
    """What an in-process sidecar's copy of ``tp`` is doing, for a failure message that names the stalled step: led
    or not, its copy job asleep / running / due, the offset its copier tiered, the end of the newest rolled local
    segment (work waiting when above it), what is staged, and the sidecar's last error."""
    from rsm.log.partition import PartitionDir

    node = f"node {sidecar.settings.broker_id}"
    led = sidecar.leadership.get(tp.topic, tp.partition)
    if led is None or led.tp != tp:
        return f"{node} does not lead {tp} (last error: {sidecar.last_error}; {discovery_state(sidecar)})"
    job = sidecar._copy_jobs.get_job(led.job_id)
    due = "no job" if job is None else "paused" if job.due is None else f"due in {job.due - time.monotonic():.1f}s"
    rolled = PartitionDir(led.path).rolled_ranges()
    staged = [s.base_offset for s in sidecar.staging.staged(tp)]
    return (f"{node}: copy job asleep={led.asleep} running={led.running.locked()} changed={led.changed.is_set()} "
            f"({due}); tiered up to {led.copier.tiered_offset}; newest rolled local segment ends at "
            f"{rolled[-1][1] if rolled else None}; staged bases {staged[:8]}; last error: {sidecar.last_error}")


def discovery_state(sidecar: Any) -> str:
    """An in-process sidecar's discovery, for a failure message: when its last round began and when one last
    succeeded (a round in flight when the broker went away runs its cluster calls to their timeouts, 15-20 s each,
    before the next round fails), how many full rounds it made (and in how many two brokers named other leaders:
    ``Sidecar.disagreeing_rounds``), and its last error."""
    now = time.time()

    def ago(at: float | None) -> str:
        return "never" if at is None else f"{now - at:.1f}s ago"

    return (f"last discovery round began {ago(sidecar.last_discovery_attempt)}, last succeeded "
            f"{ago(sidecar.last_discovery_ok)}, {sidecar.full_rounds} full rounds ({sidecar.disagreeing_rounds} "
            f"answered with other leaders by two brokers); last error: {sidecar.last_error}")


def print_thread_stacks() -> None:
    """Every thread's stack in this process, printed (captured with a failing test's output): where in-process
    sidecars wait when a step stalls without an error (e.g. a leadership change that neither finishes nor fails)."""
    import sys
    import threading
    import traceback

    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        print(f"--- thread {names.get(ident, ident)}")
        print("".join(traceback.format_stack(frame)[-12:]), end="")


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


# ------------------------------------------------------------------- cluster events (issue 9: test_cluster_events,
# test_chaos, scripts/chaos.py): a producer that remembers every acknowledged record, leadership and ISR, moves.
def _uuid_of(tid: Any) -> uuid.UUID:
    msb, lsb = tid.get_most_significant_bits(), tid.get_least_significant_bits()
    return uuid.UUID(int=((msb & (2**64 - 1)) << 64) | (lsb & (2**64 - 1)))


class PartitionStates:
    """Topic id, leader and ISR of a topic's partitions through DescribeTopics. After a failure (a stopped broker
    librdkafka still takes for the controller) the next call uses a fresh AdminClient; returns None then."""

    def __init__(self, kafka: KafkaCluster) -> None:
        self.config = {**kafka.admin_config(), "topic.metadata.refresh.interval.ms": 2000}
        self._new()

    def _new(self) -> None:
        from confluent_kafka.admin import AdminClient

        self.admin = AdminClient(self.config)

    def describe(self, topic: str) -> tuple[uuid.UUID, dict[int, tuple[int, list[int], list[int]]]] | None:
        """(topic id, {partition: (leader or -1, replicas, sorted isr)}) or None."""
        from confluent_kafka import KafkaException, TopicCollection

        try:
            desc = self.admin.describe_topics(TopicCollection([topic]), request_timeout=10)[topic].result(15)
        except (KafkaException, TimeoutError):
            self._new()
            return None
        parts = {p.id: (p.leader.id if p.leader is not None else -1, [r.id for r in p.replicas],
                        sorted(r.id for r in p.isr)) for p in desc.partitions}
        return _uuid_of(desc.topic_id), parts

    def leader(self, topic: str, partition: int = 0) -> int:
        d = self.describe(topic)
        return d[1][partition][0] if d and partition in d[1] else -1

    def isr(self, topic: str, partition: int = 0) -> list[int]:
        d = self.describe(topic)
        return d[1][partition][2] if d and partition in d[1] else []

    def topic_id(self, topic: str) -> uuid.UUID | None:
        d = self.describe(topic)
        return d[0] if d else None

    def elect(self, topic: str, partitions: list[int], unclean: bool = False) -> dict[int, str | None]:
        """Preferred (or unclean) leader election; partition -> error text or None."""
        from confluent_kafka import ElectionType, KafkaException, TopicPartition

        kind = ElectionType.UNCLEAN if unclean else ElectionType.PREFERRED
        try:
            # (confluent-kafka 2.16 refuses request_timeout here: "more argument specifiers than keyword list")
            res = self.admin.elect_leaders(kind, [TopicPartition(topic, p) for p in partitions]).result(20)
        except (KafkaException, TimeoutError) as err:
            self._new()
            return dict.fromkeys(partitions, str(err))
        return {tp.partition: (str(err) if err is not None else None) for tp, err in res.items()}


def reassign(kafka: KafkaCluster, assignment: dict[tuple[str, int], list[int]], work_dir: Path) -> None:
    """Kafka's reassignment tool (``--execute``) with these replica lists (the first is the preferred leader);
    a reordering of the same replicas completes at once."""
    import json

    work_dir.mkdir(parents=True, exist_ok=True)
    f = work_dir / f"reassign-{uuid.uuid4().hex[:6]}.json"
    f.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": t, "partition": p, "replicas": r} for (t, p), r in assignment.items()]}))
    proc = kafka.run_class("org.apache.kafka.tools.reassign.ReassignPartitionsCommand",
                           ["--bootstrap-server", kafka.bootstrap_servers, "--reassignment-json-file", str(f),
                            "--execute"], timeout=90)
    if proc.returncode != 0:
        raise AssertionError(f"reassignment {assignment} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


class AckedProducer:
    """Produces unique records (key ``<tag>-<seq>``) to partitions of a topic from a thread until stopped; remembers
    every acknowledged record (``acked[partition][offset] = (key, value)``) and every record sent, acknowledged or
    not (``produced[key] = value``)."""

    def __init__(self, kafka: KafkaCluster, topic: str, partitions: list[int], *, tag: str, value_size: int = 100,
                 batch: int = 20, pause_s: float = 0.05, **conf: Any) -> None:
        from confluent_kafka import Producer

        self.topic = topic
        self.partitions = partitions
        self.tag = tag
        self.value_size = value_size
        self.batch = batch
        self.pause_s = pause_s
        self.conf = {"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5, "acks": "all",
                     "message.timeout.ms": 30000, **conf}
        self.producer = Producer(self.conf)
        self.acked: dict[int, dict[int, tuple[bytes, bytes]]] = {p: {} for p in partitions}
        self.produced: dict[bytes, bytes] = {}
        self.failed = 0
        self.seq = 0
        self._stop = __import__("threading").Event()
        self._thread: Any = None

    def value(self, key: bytes) -> bytes:
        return (key + b"|" + self.tag.encode() + b"|") * (self.value_size // (len(key) + len(self.tag) + 2) + 1)

    def _cb(self, key: bytes, value: bytes):
        def cb(err, msg) -> None:
            if err is not None:
                self.failed += 1
                return
            self.acked[msg.partition()][msg.offset()] = (key, value)
        return cb

    def send(self, n: int) -> None:
        """Send ``n`` records round-robin over the partitions (not waiting for acknowledgements)."""
        for _ in range(n):
            p = self.partitions[self.seq % len(self.partitions)]
            key = f"{self.tag}-{self.seq:08d}".encode()
            value = self.value(key)[: self.value_size]
            self.seq += 1
            self.produced[key] = value
            while True:
                try:
                    self.producer.produce(self.topic, key=key, value=value, partition=p,
                                          on_delivery=self._cb(key, value))
                    break
                except BufferError:
                    self.producer.poll(0.1)
            self.producer.poll(0)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.send(self.batch)
            self.producer.poll(self.pause_s)

    def start(self) -> AckedProducer:
        import threading

        self._thread = threading.Thread(target=self._run, name=f"producer-{self.topic}", daemon=True)
        self._thread.start()
        return self

    def stop(self, flush_s: float = 60.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        self.producer.flush(flush_s)

    def last_acked(self, partition: int) -> int:
        return max(self.acked[partition], default=-1)

    def total_acked(self) -> int:
        return sum(len(a) for a in self.acked.values())
