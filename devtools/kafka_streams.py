"""Kafka Streams for the tests that run a small Streams app (a Java source file compiled at test time).

The ``kafka-streams`` jar (and its dependencies, without RocksDB's JNI jar: see ``config/kafka-streams-pom.xml``) is
resolved with Maven once into ``.cache/kafka-streams/<version>/libs``, at the dev broker's Kafka version
(``kafka.version`` of ``config/kafka-pom.xml``, or ``RLM_KAFKA_VERSION``: the one
:func:`devtools.devkafka.ensure_kafka_jars` uses). A failure raises :class:`KafkaStreamsError` (a test fails, never
skips).
A Java source is compiled with ``javac`` into ``.cache/kafka-streams/classes/<hash>``, the hash taken over the source
and the jars it was compiled against, so an unchanged source is compiled once::

    classes = compile_app(Path("tests/support/java/StreamsCount.java"))
    subprocess.run(java_app_cmd(classes, "StreamsCount", [...]))

``./dev setup`` resolves the jars (:func:`ensure_kafka_streams_jars`), so a clean clone under CI has them.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

from devtools.devkafka import project_root
from devtools.maven import resolve_jars

__all__ = ["KafkaStreamsError", "compile_app", "ensure_kafka_streams_jars", "java_app_cmd", "kafka_version"]


class KafkaStreamsError(RuntimeError):
    """Maven could not resolve Kafka Streams, or ``javac`` could not compile an app; the message says why."""


def kafka_version(root: Path | None = None) -> str:
    """The Kafka version the dev broker runs: ``RLM_KAFKA_VERSION``, else ``kafka.version`` of the Kafka POM."""
    override = os.environ.get("RLM_KAFKA_VERSION", "").strip()
    if override:
        return override
    pom = ((root or project_root()) / "config" / "kafka-pom.xml").read_text()
    found = re.search(r"<kafka\.version>([^<]+)</kafka\.version>", pom)
    if found is None:
        raise KafkaStreamsError("config/kafka-pom.xml names no <kafka.version>")
    return found.group(1).strip()


def ensure_kafka_streams_jars(root: Path | None = None) -> Path:
    """Resolve kafka-streams with Maven once (at :func:`kafka_version`); return the directory of its jars."""
    root = root or project_root()
    version = kafka_version(root)
    return resolve_jars(root / "config" / "kafka-streams-pom.xml", root / ".cache" / "kafka-streams" / version,
                        overrides=[f"-Dkafka.version={version}"], error=KafkaStreamsError,
                        expect=f"kafka-streams-{version}.jar", what="kafka-streams")


def compile_app(source: Path, root: Path | None = None) -> Path:
    """The directory of ``source``'s compiled classes (compiled against the Streams jars unless cached)."""
    root = root or project_root()
    libs = ensure_kafka_streams_jars(root)
    digest = hashlib.sha256(source.read_bytes())
    for jar in sorted(libs.glob("*.jar")):
        digest.update(jar.name.encode())
    out = root / ".cache" / "kafka-streams" / "classes" / digest.hexdigest()[:16]
    if (out / ".compiled").exists():
        return out
    javac = _jdk_tool("javac")
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    proc = subprocess.run([javac, "--release", "17", "-Xlint:none", "-cp", f"{libs}/*", "-d", str(tmp), str(source)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise KafkaStreamsError(f"javac could not compile {source}:\n{proc.stdout}{proc.stderr}")
    (tmp / ".compiled").write_text(str(source) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def java_app_cmd(classes: Path, main_class: str, args: Sequence[str], *, heap: str = "256m",
                 root: Path | None = None) -> list[str]:
    """A java command line running ``main_class`` from ``classes`` over the Streams jars."""
    libs = ensure_kafka_streams_jars(root)
    return [_jdk_tool("java"), f"-Xmx{heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-Dorg.slf4j.simpleLogger.showDateTime=true", "-cp", f"{classes}{os.pathsep}{libs}/*", main_class, *args]


def _jdk_tool(name: str) -> str:
    java_home = os.environ.get("JAVA_HOME")
    tool = str(Path(java_home) / "bin" / name) if java_home else shutil.which(name)
    if not tool or not Path(tool).exists():
        raise KafkaStreamsError(f"{name} not found (set JAVA_HOME or put a JDK 17's {name} on PATH)")
    return tool
