"""``mode: read_only`` as a principal that only reads (issue 23, item 3), on the SASL cluster with KRaft's
StandardAuthorizer (``kafka_sasl``).

A normal sidecar, as the cluster's super user, tiers a topic and stops. Then ``viewer`` (``SASL_VIEWER``), granted
only the ACLs of the README's "Authenticated clusters" table for a reader, runs a read-only sidecar, the history
endpoint and ``rlm cat`` (in process, :func:`rlm.cli.main`): each reads every tiered record, no log line and no
librdkafka output speaks of an authorization failure, no Kafka producer and no staging are constructed, and no
directory is created or removed but the readers' own metadata caches in the state dir.

``viewer`` is never granted anything on the cluster resource, except here: the history endpoint fetches the
cluster's ACLs with DescribeAcls (``rlm.listener.authz``), which needs DESCRIBE on the cluster whatever its
``super_users`` say. That one binding is removed when the module ends, as are the others granted here.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from devtools.devkafka import KafkaCluster
from rlm.cli import main as rlm_main
from rlm.config import KafkaSettings, SidecarSettings
from rlm.listener import start_listener
from rlm.sidecar import Sidecar
from rlm.state import StateDir
from rlmm.api import TopicIdPartition
from tests.support.fixtures import SASL_VIEWER
from tests.support.kafka import grant, produce
from tests.support.sidecar import latest_remote, make_settings, produce_segments, wait_for

pytestmark = [pytest.mark.kafka]

READER = f"User:{SASL_VIEWER}"
Sent = dict[int, tuple[bytes, bytes]]


@dataclass
class Tiered:
    kafka: KafkaCluster
    tp: TopicIdPartition
    sent: Sent
    settings: SidecarSettings  # the normal sidecar's (super user)


def allow(rtype: ResourceType, name: str, op: AclOperation,
          pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> AclBinding:
    return AclBinding(rtype, name, pattern, READER, "*", op, AclPermissionType.ALLOW)


@pytest.fixture(scope="module")
def tiered(kafka_sasl: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiered]:
    """A topic tiered by a normal sidecar running as the super user, then stopped; ``viewer``'s ACLs for it."""
    kc = kafka_sasl
    tmp = tmp_path_factory.mktemp("read-only-sasl")
    topic = f"ro-sasl-{uuid.uuid4().hex[:8]}"
    tp = TopicIdPartition(kc.create_topic(topic, 1, config={"segment.ms": "300"}), topic, 0)
    sent = produce_segments(kc, topic, rounds=2, per_round=30, segment_ms=300, roll=False, **kc.security_config())
    produce(kc, topic, [(b"__roll__", b"r")], **kc.security_config())  # rolls the last round's segment
    settings = make_settings(kc, tmp, topics={"include": [topic]}).model_copy(update={"kafka": KafkaSettings(
        bootstrap_servers=kc.bootstrap_servers, client=kc.security_config())})
    with Sidecar(settings) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 60, f"{topic} to be tiered")
    # The minimum a reader needs (README, "Authenticated clusters"):
    bindings = [
        allow(ResourceType.TOPIC, topic, AclOperation.DESCRIBE),  # discovery, the endpoint's catalog, rlm cat
        allow(ResourceType.TOPIC, topic, AclOperation.DESCRIBE_CONFIGS),  # compaction: only a non-compacted topic
        allow(ResourceType.TOPIC, settings.metadata.topic, AclOperation.READ),  # (READ implies DESCRIBE)
        allow(ResourceType.TOPIC, settings.metadata.topic, AclOperation.DESCRIBE_CONFIGS),  # delete.retention.ms
        allow(ResourceType.GROUP, "rlmm-", AclOperation.DESCRIBE, ResourcePatternType.PREFIXED),
        allow(ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE),  # the history endpoint's DescribeAcls
    ]
    grant(kc, *bindings)
    try:
        yield Tiered(kc, tp, sent, settings)
    finally:
        admin = AdminClient(kc.admin_config())
        filters = [AclBindingFilter(b.restype, b.name, b.resource_pattern_type, b.principal, b.host, b.operation,
                                    b.permission_type) for b in bindings]
        for fut in admin.delete_acls(filters).values():
            fut.result(30)


def read_only_settings(t: Tiered, tmp: Path) -> SidecarSettings:
    """The reader's read-only sidecar: the tiered store and metadata topic, a state dir and staging dir of its own,
    a to-be-deleted topic nobody created, and a history endpoint whose (anonymous, loopback) clients are super
    users of the endpoint."""
    raw = t.settings.model_dump(mode="json", exclude_none=True)
    return SidecarSettings(**{
        **raw, "mode": "read_only", "staging_dir": str(tmp / "staging-ro"),
        "kafka": {"bootstrap_servers": t.kafka.bootstrap_servers, "client": t.kafka.security_config(SASL_VIEWER)},
        "metadata": {**raw["metadata"], "state_dir": str(tmp / "state-ro"),
                     "to_be_deleted_topic": f"__rlm_tbd_ro_{uuid.uuid4().hex[:8]}"},
        "history_listener": {"host": "127.0.0.1", "port": 0, "fetch_poll_ms": 50, "fetch_max_wait_ms": 100,
                             "authorization": {"super_users": ["User:ANONYMOUS"]}}})


def tree(root: Path) -> set[str]:
    """Every directory under ``root`` (``root`` itself as ``.``), relative to it; empty when it does not exist."""
    if not root.exists():
        return set()
    return {"."} | {str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir()}


def log_dir_entries(settings: SidecarSettings) -> set[str]:
    """The entries of the log dirs, but the directories of topics the broker is deleting (``*-delete``: removed
    by the broker ``file.delete.delay.ms`` after an earlier test deleted their topic)."""
    return {str(e) for d in settings.log_dirs for e in Path(d).iterdir() if not e.name.endswith("-delete")}


def authorization_failures(records: list[logging.LogRecord], output: str) -> list[str]:
    """Log records (their message and extras) and lines of captured output that speak of a refusal."""
    def refused(text: str) -> bool:
        low = text.lower()
        return "authorization_failed" in low or "not authorized" in low or "authorization failed" in low

    found = [f"{r.name}: {r.getMessage()} {r.__dict__}" for r in records
             if refused(f"{r.getMessage()} {r.__dict__}")]
    return found + [line for line in output.splitlines() if refused(line)]


def consume_endpoint(port: int, tp: TopicIdPartition, want: int, timeout_s: float = 20.0) -> Sent:
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": f"unused-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "check.crcs": True, "fetch.wait.max.ms": 100})
    got: Sent = {}
    try:
        c.assign([TopicPartition(tp.topic, tp.partition, 0)])
        deadline = time.monotonic() + timeout_s
        while len(got) < want and time.monotonic() < deadline:
            for m in c.consume(500, timeout=0.5):
                if m.error() is None:
                    got[m.offset()] = (m.key(), m.value())
    finally:
        c.close()
    return got


def test_a_reader_runs_read_only_sidecar_history_and_cat_without_authorization_errors(
        tiered: Tiered, tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    t = tiered
    settings = read_only_settings(t, tmp_path)
    config = tmp_path / "read-only.yaml"
    raw = settings.model_dump(mode="json", exclude_none=True)
    config.write_text(yaml.safe_dump({**raw, "kafka": {**raw["kafka"],
                                                       "client": t.kafka.security_config(SASL_VIEWER)}}))
    state, staging = settings.metadata.state_dir, Path(str(settings.staging_dir))
    state.mkdir()  # provisioned, as an operator would: the readers' metadata caches go there

    # Writers, recorded wherever one could be constructed (a producer: the to-be-deleted queue's, the metadata
    # manager's; staging: the sidecar's).
    constructed: list[str] = []

    def recording(name: str, real: Any) -> Any:
        def construct(*args: Any, **kwargs: Any) -> Any:
            constructed.append(name)
            return real(*args, **kwargs)
        return construct

    import rlm.sidecar
    import rlm.tasks.deleter
    import rlmm.topic_producer
    monkeypatch.setattr(rlm.tasks.deleter, "Producer", recording("Producer", rlm.tasks.deleter.Producer))
    monkeypatch.setattr(rlmm.topic_producer, "Producer", recording("Producer", rlmm.topic_producer.Producer))
    monkeypatch.setattr(rlm.sidecar, "Staging", recording("Staging", rlm.sidecar.Staging))

    before = {"state": tree(state), "staging": tree(staging), "log dirs": log_dir_entries(settings)}
    caplog.set_level(logging.INFO)
    ro = Sidecar(settings).start()
    history = None
    try:
        # the read-only sidecar serves the tiered records
        wait_for(lambda: latest_remote(ro, t.tp) >= max(t.sent), 30, "the read-only sidecar to follow the tier")
        got = {r.offset: (r.key, r.value) for r in ro.reader.read(t.tp, 0) if r.offset in t.sent}
        assert got == t.sent
        # the history endpoint, as the same principal
        history = start_listener(settings, ro.rsm)
        assert consume_endpoint(history.port, t.tp, len(t.sent)) == t.sent
        # rlm cat, in process, as the same principal
        earlier = capfd.readouterr()
        assert rlm_main(["cat", t.tp.topic, "0", "--config", str(config)]) == 0
        cat_out = capfd.readouterr()
        rows = [json.loads(line) for line in cat_out.out.splitlines() if line.strip()]
        assert {r["offset"]: (base64.b64decode(r["key"]), base64.b64decode(r["value"])) for r in rows} == t.sent
    finally:
        if history is not None:
            history.stop()
        ro.stop(30)
    output = capfd.readouterr()

    assert constructed == [], f"a read-only sidecar constructed writers: {constructed}"
    assert [job.id for job in ro.jobs] == ["discovery", "gauges"]
    assert not hasattr(ro, "staging") and not hasattr(ro, "queue") and not hasattr(ro, "cleaner")
    printed = "\n".join([earlier.out, earlier.err, cat_out.err, output.out, output.err])
    assert authorization_failures(caplog.records, printed) == []
    caches = {str(StateDir(state).metadata_cache(user).relative_to(state)) for user in ("sidecar", "history", "cli")}
    after = {"state": tree(state), "staging": tree(staging), "log dirs": log_dir_entries(settings)}
    assert after["state"] - before["state"] == caches, "only the readers' metadata caches are created"
    assert not list(state.glob("*.json")), "no state file (known partitions, gc orphans) is written"
    assert {**after, "state": after["state"] - caches} == before, "no directory created or removed"
    assert not staging.exists()
    admin = AdminClient(t.kafka.admin_config())
    assert settings.metadata.to_be_deleted_topic not in admin.list_topics(timeout=30).topics
