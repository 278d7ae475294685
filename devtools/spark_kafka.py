"""Spark's own Kafka source (``spark-sql-kafka-0-10``) for the benchmarks and tests that compare against it.

The connector is resolved with Maven from ``config/spark-kafka-pom.xml`` into ``.cache/spark-kafka/<version>/`` at
the installed pyspark's version, or, when Maven Central has none at that version, the newest it has (the version
returned says which). Pass the jars with ``spark.jars`` when the SparkSession (its JVM) is created::

    version, jars = spark_kafka_jars(pyspark.__version__)
    SparkSession.builder.config("spark.jars", ",".join(map(str, jars)))...
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import time
from pathlib import Path

from devtools.devkafka import project_root

__all__ = ["FALLBACK_VERSIONS", "spark_kafka_jars"]

FALLBACK_VERSIONS = ("4.2.0", "4.1.3")  # newest connectors on Maven Central, tried when the installed one is absent
UNAVAILABLE_TTL_S = 24 * 3600  # a version Maven could not resolve is not asked for again for this long
MAVEN_SETTINGS = """<settings><mirrors><mirror><id>central-only</id><mirrorOf>*,!central</mirrorOf>
<url>https://repo.maven.apache.org/maven2</url></mirror></mirrors></settings>
"""


def spark_kafka_jars(version: str) -> tuple[str, list[Path]]:
    """(connector version, jars not already shipped with pyspark), resolving with Maven once per version."""
    import pyspark

    root = project_root()
    pom = root / "config" / "spark-kafka-pom.xml"
    cache = root / ".cache" / "spark-kafka"
    pyspark_jars = Path(pyspark.__file__).parent / "jars"
    shipped = {_artifact(j.name) for j in pyspark_jars.glob("*.jar")}
    cache.mkdir(parents=True, exist_ok=True)
    # One resolution at a time: in a clean checkout the suite's two workers may both ask first, and each would
    # delete the other's half-copied .partial directory. The second then finds the first's result.
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _resolve(version, pom, cache, shipped)


def _resolve(version: str, pom: Path, cache: Path, shipped: set[str]) -> tuple[str, list[Path]]:
    settings = cache / "maven-settings.xml"  # Spark's parent POM names a mirror host that may not resolve
    settings.write_text(MAVEN_SETTINGS)
    errors = []
    for v in dict.fromkeys((version, *FALLBACK_VERSIONS)):
        out = cache / v
        missing = cache / f"{v}.unavailable"  # Maven's answer for a version Central does not have, kept a while
        if (not (out / ".resolved").exists() and missing.exists()
                and time.time() - missing.stat().st_mtime < UNAVAILABLE_TTL_S):
            errors.append(f"{v}: {missing.read_text().strip()} (cached; delete {missing} to retry)")
            continue
        if not (out / ".resolved").exists():
            tmp = cache / f"{v}.partial"
            shutil.rmtree(tmp, ignore_errors=True)
            cmd = ["mvn", "-q", "-B", "-s", str(settings), "-f", str(pom), "dependency:copy-dependencies",
                   "-DincludeScope=runtime", f"-Dspark.version={v}", f"-DoutputDirectory={tmp}"]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                error = next((ln for ln in r.stdout.splitlines() if "ERROR" in ln), r.stdout[-300:])
                errors.append(f"{v}: {error}")
                missing.write_text(error + "\n")
                shutil.rmtree(tmp, ignore_errors=True)
                continue
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
            (out / ".resolved").write_text(v)
        jars = [j for j in sorted(out.glob("*.jar")) if _artifact(j.name) not in shipped]
        return v, jars
    raise RuntimeError("cannot resolve spark-sql-kafka-0-10:\n  " + "\n  ".join(errors))


def _artifact(jar_name: str) -> str:
    """``kafka-clients-3.9.2.jar`` -> ``kafka-clients`` (the name without its version)."""
    parts = jar_name[:-4].split("-")
    while parts and parts[-1][:1].isdigit():
        parts.pop()
    return "-".join(parts)
