"""``devtools.spark_kafka.spark_kafka_jars``: two callers at once in a clean checkout (the suite's two workers, each
starting a module that runs Spark's ``kafka`` source) resolve the connector once; the second gets the first's jars."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from devtools import spark_kafka


def test_two_callers_at_once_resolve_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "spark-kafka-pom.xml").write_text("<project/>")
    monkeypatch.setenv("RLM_PROJECT_ROOT", str(tmp_path))
    runs: list[str] = []

    def mvn(cmd: list[str], **_kw: object) -> subprocess.CompletedProcess:
        """Maven's copy-dependencies, slowly: a jar, a pause, another jar."""
        out = Path(next(a for a in cmd if a.startswith("-DoutputDirectory=")).split("=", 1)[1])
        version = next(a for a in cmd if a.startswith("-Dspark.version=")).split("=", 1)[1]
        runs.append(version)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"spark-sql-kafka-0-10_2.13-{version}.jar").write_bytes(b"jar")
        time.sleep(0.5)
        (out / f"spark-token-provider-kafka-0-10_2.13-{version}.jar").write_bytes(b"jar")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(spark_kafka.subprocess, "run", mvn)
    got: list[tuple[str, list[Path]]] = []
    errors: list[BaseException] = []

    def call() -> None:
        try:
            got.append(spark_kafka.spark_kafka_jars("9.9.9"))
        except BaseException as err:  # noqa: BLE001 - handed to the test thread
            errors.append(err)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert runs == ["9.9.9"], runs  # the second caller found the first's resolution
    assert len(got) == 2 and got[0] == got[1], got
    version, jars = got[0]
    assert version == "9.9.9"
    assert [j.name for j in jars] == ["spark-sql-kafka-0-10_2.13-9.9.9.jar",
                                      "spark-token-provider-kafka-0-10_2.13-9.9.9.jar"]
