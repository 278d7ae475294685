"""``devtools.maven.resolve_jars``: the cache is reused while the POM (and overrides) are unchanged; a changed one
re-resolves, and without Maven that fails naming what was being fetched."""

from __future__ import annotations

from pathlib import Path

import pytest

from devtools import maven


class Refused(RuntimeError):
    pass


def test_cache_hit_needs_no_maven_and_a_changed_pom_resolves_again(tmp_path: Path, monkeypatch) -> None:
    pom = tmp_path / "pom.xml"
    pom.write_text("<project/>")
    cache = tmp_path / "cache"
    (cache / "libs").mkdir(parents=True)
    (cache / "resolved-from.pom").write_text("<project/>\n<!-- -Dv=1 -->\n")
    monkeypatch.setattr(maven.shutil, "which", lambda _name: None)  # no Maven on this machine
    assert maven.resolve_jars(pom, cache, overrides=["-Dv=1"], error=Refused) == cache / "libs"
    with pytest.raises(Refused, match="mvn not found on PATH: Maven is needed to fetch the test jars"):
        maven.resolve_jars(pom, cache, overrides=["-Dv=2"], error=Refused, what="the test jars")
    pom.write_text("<project><!-- edited --></project>")
    with pytest.raises(Refused, match="mvn not found"):
        maven.resolve_jars(pom, cache, overrides=["-Dv=1"], error=Refused)
