"""Jars resolved once with Maven from a POM in ``config/`` into a cache directory (the dev Kafka, s3proxy).

``<cache>/libs`` holds the jars; ``<cache>/resolved-from.pom`` records the POM text (and the ``-D`` overrides) they
were resolved from, so editing the POM re-resolves and an unchanged one costs nothing. A resolution goes to
``libs.partial`` first and replaces ``libs`` only once Maven succeeded.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

__all__ = ["resolve_jars"]


def resolve_jars(pom: Path, cache: Path, *, overrides: Sequence[str] = (), error: type[Exception] = RuntimeError,
                 expect: str | None = None, what: str = "the jars") -> Path:
    """The directory of the jars ``pom`` depends on, resolved with ``mvn dependency:copy-dependencies`` unless the
    cache holds them already. ``overrides``: ``-Dname=value`` arguments (part of the cache's identity). ``expect``:
    a glob one resolved jar must match. Failures raise ``error`` with Maven's output."""
    libs = cache / "libs"
    marker = cache / "resolved-from.pom"
    pom_text = pom.read_text() + (f"\n<!-- {' '.join(overrides)} -->\n" if overrides else "")
    if libs.is_dir() and marker.exists() and marker.read_text() == pom_text:
        return libs
    if shutil.which("mvn") is None:
        raise error(f"mvn not found on PATH: Maven is needed to fetch {what}")
    tmp = cache / "libs.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    cmd = ["mvn", "-q", "-B", "-f", str(pom), "dependency:copy-dependencies", f"-DoutputDirectory={tmp}",
           *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise error(f"maven could not resolve {pom}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    if expect is not None and not any(tmp.glob(expect)):
        raise error(f"maven resolved {pom} but no {expect} is in {tmp}")
    shutil.rmtree(libs, ignore_errors=True)
    tmp.rename(libs)
    marker.write_text(pom_text)
    return libs
