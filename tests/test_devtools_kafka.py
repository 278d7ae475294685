"""``devtools.devkafka``'s JVMs: the class-data sharing archive (``devtools.cds``) is named after the JDK and the
exact jars, put in place atomically, and maps into a Kafka JVM of this machine; the suite's brokers run the
``quick`` profile. And ``create_topic`` asks a new topic's id again of a broker that does not know it yet."""

from __future__ import annotations

import os
import subprocess
import uuid
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from devtools import cds
from devtools.devkafka import KafkaCluster, ensure_kafka_cds_archive


def _jar(libs: Path, name: str, data: bytes = b"PK") -> Path:
    path = libs / name
    path.write_bytes(data)
    return path


def test_the_archive_is_named_after_the_jdk_and_every_jar(tmp_path: Path) -> None:
    libs = tmp_path / "libs"
    libs.mkdir()
    java = str(_jar(tmp_path, "java"))
    jar = _jar(libs, "kafka-clients-4.3.1.jar")
    first = cds.archive_path(java, libs)
    assert first.parent == tmp_path / "cds" and first.suffix == ".jsa"
    assert cds.archive_path(java, libs) == first  # stable
    assert cds.use_options(java, libs) == []  # none yet: the JVM starts without one
    os.utime(jar, ns=(1, 1))
    assert cds.archive_path(java, libs) != first  # a jar rewritten
    touched = cds.archive_path(java, libs)
    _jar(libs, "extra-1.0.jar")
    assert cds.archive_path(java, libs) not in (first, touched)  # a jar added
    other_java = str(_jar(tmp_path, "java2", b"another jdk"))
    assert cds.archive_path(other_java, libs) != cds.archive_path(java, libs)


def test_a_dump_is_put_in_place_whole_or_not_at_all(tmp_path: Path) -> None:
    libs = tmp_path / "libs"
    libs.mkdir()
    java = str(_jar(tmp_path, "java"))
    _jar(libs, "a.jar")
    partial = cds.dump_path(java, libs)
    assert partial.parent.is_dir() and not partial.exists()
    assert cds.finish_dump(partial) is None  # the JVM was killed: nothing dumped
    partial.write_bytes(b"")
    assert cds.finish_dump(partial) is None and not partial.exists()  # an empty file is no archive
    partial = cds.dump_path(java, libs)
    partial.write_bytes(b"archive")
    assert cds.finish_dump(partial) == cds.archive_path(java, libs)
    assert not partial.exists()
    assert cds.use_options(java, libs) == [f"-XX:SharedArchiveFile={cds.archive_path(java, libs)}"]


def test_the_archive_maps_into_a_kafka_jvm(kafka: KafkaCluster) -> None:
    """``-Xshare:on`` makes a JVM fail when it cannot map its archive: the one ``./dev setup`` makes is valid for
    this JDK and these jars, and every Kafka command line names it."""
    archive = ensure_kafka_cds_archive()
    assert archive is not None and archive.is_file()
    cmd = kafka.java_cmd("kafka.tools.StorageTool", ["random-uuid"])
    assert f"-XX:SharedArchiveFile={archive}" in cmd
    proc = subprocess.run([cmd[0], "-Xshare:on", *cmd[1:]], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert len(proc.stdout.strip()) == 22  # a Kafka uuid


def test_the_suite_brokers_run_the_quick_profile(kafka: KafkaCluster) -> None:
    """The fixtures plugin sets ``RLM_KAFKA_JVM=quick``: the broker runs the serial collector and C1 alone."""
    proc = kafka.node(1).process
    assert proc is not None
    argv = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
    assert b"-XX:+UseSerialGC" in argv and b"-XX:TieredStopAtLevel=1" in argv, argv[:8]
    with pytest.raises(ValueError, match="jvm 'fast': one of throughput, quick"):
        KafkaCluster(jvm="fast")


def test_create_topic_asks_the_id_again_of_a_broker_not_knowing_the_topic_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    """The topic's leaders are in one broker's metadata, its id asked of another that answers UNKNOWN_TOPIC_OR_PART
    (a test's setup failed so on the 3-broker cluster): create_topic asks again and returns the id. Another error
    is raised as it came (the admin client stubbed: the broker's timing cannot be made on purpose)."""
    import confluent_kafka.admin
    from confluent_kafka import KafkaError, KafkaException

    answers: list[Any] = []

    def done(value: Any = None, error: Exception | None = None) -> Future:
        fut: Future = Future()
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(value)
        return fut

    class Admin:
        def __init__(self, conf: dict) -> None:
            pass

        def create_topics(self, topics: list) -> dict:
            return {t.topic: done() for t in topics}

        def list_topics(self, name: str, timeout: float) -> Any:
            leader = SimpleNamespace(leader=2)
            return SimpleNamespace(topics={name: SimpleNamespace(error=None, partitions={0: leader})})

        def describe_topics(self, topics: Any) -> dict:
            (name,) = topics.topic_names
            return {name: done(error=answers.pop(0)) if isinstance(answers[0], Exception) else done(answers.pop(0))}

    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", Admin)
    tid = uuid.uuid4()
    desc = SimpleNamespace(topic_id=SimpleNamespace(get_most_significant_bits=lambda: tid.int >> 64,
                                                    get_least_significant_bits=lambda: tid.int & (2**64 - 1)))
    cluster = KafkaCluster()
    try:
        answers[:] = [KafkaException(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PART)), desc]
        assert cluster.create_topic("t", timeout=5) == tid and answers == []
        answers[:] = [KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)), desc]
        with pytest.raises(KafkaException, match="TOPIC_AUTHORIZATION_FAILED"):
            cluster.create_topic("t", timeout=5)
    finally:
        cluster.stop()
