"""Fixtures for the rlmm tests: Kafka's own classes as an oracle, metadata manager factories."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.devkafka import ensure_kafka_jars

PROBE_SRC = Path(__file__).with_name("KafkaRlmmProbe.java")


class KafkaProbe:
    """Runs ``KafkaRlmmProbe`` (compiled against the broker's jars): one JVM per batch of commands."""

    def __init__(self, classes: Path, libs: Path) -> None:
        self.classpath = f"{classes}:{libs}/*"

    def run(self, commands: list[str]) -> list[str]:
        proc = subprocess.run(["java", "-Xmx128m", "-XX:TieredStopAtLevel=1", "-cp", self.classpath,
                               "KafkaRlmmProbe"], input="\n".join(commands) + "\n", capture_output=True, text=True,
                              timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"KafkaRlmmProbe failed: {proc.stderr[-3000:]}")
        return proc.stdout.splitlines()


@pytest.fixture(scope="session")
def kafka_probe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaProbe]:
    if shutil.which("javac") is None:
        pytest.fail("javac is needed to ask Kafka's own classes (tests never skip it)", pytrace=False)
    libs = ensure_kafka_jars()
    out = tmp_path_factory.mktemp("probe")
    proc = subprocess.run(["javac", "-d", str(out), "-cp", f"{libs}/*", str(PROBE_SRC)], capture_output=True,
                          text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"javac KafkaRlmmProbe failed:\n{proc.stderr}", pytrace=False)
    yield KafkaProbe(out, libs)


@pytest.fixture
def rlmm_factory(kafka, tmp_path: Path):
    """Make TopicBasedRemoteLogMetadataManagers on the session broker; all are closed after the test."""
    from rlmm.topic_manager import TopicBasedRemoteLogMetadataManager, TopicBasedRlmmConfig

    made: list = []

    def make(topic: str, cache_name: str, **kw) -> TopicBasedRemoteLogMetadataManager:
        kw.setdefault("num_partitions", 5)
        kw.setdefault("replication_factor", 1)
        cfg = TopicBasedRlmmConfig(bootstrap_servers=kafka.bootstrap_servers, cache_dir=tmp_path / cache_name,
                                   topic=topic, **kw)
        m = TopicBasedRemoteLogMetadataManager(cfg)
        made.append(m)
        return m

    yield make
    for m in made:
        m.close()
