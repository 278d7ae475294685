"""Spark's own ``kafka`` source (``spark-sql-kafka-0-10``) run in a child Python process, for tests that compare its
rows with what was produced (``tests/rlm/listener/test_java_spark.py``, ``test_proxy_apps.py``).

The child gets its own JVM, started with the connector's jars (:func:`devtools.spark_kafka.spark_kafka_jars`), so a
test process's other SparkSession (the ``spark`` fixture, without those jars) is left alone. The parent starts the
child with :func:`start` (it writes the spec), waits for it, and reads ``{read name: [row, ...]}`` with
:func:`load`; :func:`rows` turns one read's rows into a dict keyed by (topic, partition, offset). Run as a script,
this module is the child::

    python tests/support/spark_kafka_child.py SPEC.json
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[2]

__all__ = ["ROOT", "load", "rows", "spark_child", "start"]

Row = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...] | None, int | None, int]


def start(jars: list[Path], reads: dict[str, dict[str, str]], out: Path, spec: Path, log: IO[bytes]
          ) -> subprocess.Popen:
    """Start a child that runs each read (name -> the ``kafka`` source's options, one batch ``load()`` each) and
    writes the rows as JSON to ``out``; its output goes to ``log``."""
    spec.write_text(json.dumps({"jars": [str(j) for j in jars], "reads": reads, "out": str(out)}))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, __file__, str(spec)], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def load(out: Path) -> dict[str, list[dict[str, Any]]]:
    """The child's rows per read, from its ``out`` file."""
    return json.loads(out.read_text())


def rows(got: list[dict[str, Any]], *, timestamps: bool = True) -> dict[tuple[str, int, int], Row]:
    """(topic, partition, offset) -> (key, value, headers or None, timestamp ms or None, timestampType) of one
    read's rows; fails on a row returned twice."""
    out: dict[tuple[str, int, int], Row] = {}
    for r in got:
        k = (r["topic"], r["partition"], r["offset"])
        assert k not in out, f"{k} returned twice"
        hdrs = None if r["headers"] is None else tuple((hk, _unb64(hv)) for hk, hv in r["headers"])
        out[k] = (_unb64(r["key"]), _unb64(r["value"]), hdrs, r["ts"] if timestamps else None, r["timestampType"])
    return out


def _b64(v: bytes | bytearray | None) -> str | None:
    return None if v is None else base64.b64encode(bytes(v)).decode()


def _unb64(v: str | None) -> bytes | None:
    return None if v is None else base64.b64decode(v)


def spark_child(spec_path: str) -> None:
    """Run every read of the spec in one local SparkSession (its JVM started with the connector's jars); write
    ``{name: [row, ...]}`` as JSON to the spec's ``out``."""
    spec = json.loads(Path(spec_path).read_text())
    from pyspark.sql import SparkSession

    from devtools.devkafka import JVM_PROFILES

    spark = (SparkSession.builder.master("local[2]").appName("rlm-spark-kafka-child")
             .config("spark.jars", ",".join(spec["jars"]))
             .config("spark.pyspark.python", sys.executable)
             .config("spark.driver.memory", "1g")
             .config("spark.driver.extraJavaOptions", " ".join(JVM_PROFILES["quick"]))
             .config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    out: dict[str, list[dict[str, Any]]] = {}
    try:
        for name, options in spec["reads"].items():
            df = spark.read.format("kafka").options(**options).load()
            got = df.selectExpr("*", "unix_millis(timestamp) AS ts").collect()
            out[name] = [{"topic": r["topic"], "partition": r["partition"], "offset": r["offset"], "ts": r["ts"],
                          "timestampType": r["timestampType"], "key": _b64(r["key"]), "value": _b64(r["value"]),
                          "headers": None if r["headers"] is None else [[x["key"], _b64(x["value"])]
                                                                        for x in r["headers"]]}
                         for r in got]
    finally:
        spark.stop()
    tmp = Path(spec["out"]).with_suffix(".partial")
    tmp.write_text(json.dumps(out))
    tmp.rename(spec["out"])


if __name__ == "__main__":
    spark_child(sys.argv[1])
