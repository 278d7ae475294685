"""Class-data sharing (AppCDS) for the dev Kafka's JVMs: the classes a broker loads, parsed and verified once.

A Kafka JVM spends most of its start loading, verifying and interpreting its classes (a broker: ~10 CPU s on a
loaded 2-core box, the suite starts dozens). A *dynamic* CDS archive (JDK 13+) taken at the exit of one broker run
(``-XX:ArchiveClassesAtExit``) maps those classes into every later JVM over the same jars
(``-XX:SharedArchiveFile``): a broker's start costs ~30% less CPU (7.0-7.2 vs 9.5-11.3 s), a command-line tool's ~40%.

The archive is only valid for the JDK and the exact class path it was dumped with, so its name is a hash of both
(the ``java`` binary and its runtime image; every jar's name, size and mtime): another JDK or other jars look for
another file. The JVM checks again when it maps one (``-Xshare:auto``, the default) and silently runs without it on
a mismatch, so a stale or missing archive only costs speed, never a failure. It lives next to the jars' ``libs``
directory (``<cache>/cds/``) and is made by :func:`devtools.devkafka.ensure_kafka_cds_archive` (``./dev setup``).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from pathlib import Path

__all__ = ["archive_path", "dump_path", "finish_dump", "use_options"]


def _fingerprint(java: str, libs: Path) -> str:
    h = hashlib.sha256()
    real = Path(os.path.realpath(java))
    for p in (real, real.parent.parent / "lib" / "modules"):  # the launcher and the JDK's runtime image
        if p.exists():
            st = p.stat()
            h.update(f"{p}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    for jar in sorted(libs.glob("*.jar")):
        st = jar.stat()
        h.update(f"{jar.name}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def archive_path(java: str, libs: Path) -> Path:
    """Where the archive for ``java`` over the jars of ``libs`` lives (whether or not it exists yet)."""
    return libs.parent / "cds" / f"{_fingerprint(java, libs)}.jsa"


def use_options(java: str, libs: Path) -> list[str]:
    """The JVM options that map the archive, or none while it does not exist."""
    archive = archive_path(java, libs)
    return [f"-XX:SharedArchiveFile={archive}"] if archive.is_file() else []


def dump_path(java: str, libs: Path) -> Path:
    """A temporary file for a JVM to dump the archive to at its exit (``-XX:ArchiveClassesAtExit=``); hand it to
    :func:`finish_dump` once the JVM has exited."""
    archive = archive_path(java, libs)
    archive.parent.mkdir(parents=True, exist_ok=True)
    return archive.with_name(f"{archive.stem}.{uuid.uuid4().hex[:8]}.partial")


def finish_dump(tmp: Path) -> Path | None:
    """Put a dumped archive in its place (atomically: a JVM starting meanwhile maps the old one or the new one);
    None when the JVM dumped nothing (it was killed, or the dump failed)."""
    if not tmp.is_file() or tmp.stat().st_size == 0:
        tmp.unlink(missing_ok=True)
        return None
    final = tmp.with_name(tmp.name.split(".")[0] + ".jsa")
    os.replace(tmp, final)
    return final
