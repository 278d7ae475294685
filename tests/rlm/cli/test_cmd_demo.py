"""``rlm demo`` and the packaging of the dev Kafka launcher: ``devtools/`` stays in the checkout, never in the
installed package, and ``rlm demo`` from an install without the checkout says to run ``./dev demo``."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from setuptools import find_packages

from rlm import cli
from rlm.cli import demo as cmd_demo

ROOT = Path(__file__).resolve().parents[3]


def test_the_installed_packages_leave_devtools_out() -> None:
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(str(ROOT), include=include)
    assert {"rlm", "rlmm", "rsm"} <= set(packages)
    assert not [p for p in packages if p.split(".")[0] in ("devtools", "tests", "bench", "scripts")]
    assert not (ROOT / "rlm" / "devkafka.py").exists()
    assert (ROOT / "devtools" / "devkafka.py").is_file()


def test_only_the_demo_imports_devtools() -> None:
    """The installed packages never need ``devtools``; the demo imports it lazily and handles its absence."""
    users = set()
    for path in [p for pkg in ("rlm", "rlmm", "rsm") for p in (ROOT / pkg).rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            if any(n == "devtools" or n.startswith("devtools.") for n in names):
                users.add(path.relative_to(ROOT).as_posix())
    assert users == {"rlm/cli/demo.py"}


def test_dev_kafka_comes_from_the_checkout() -> None:
    assert Path(cmd_demo.dev_kafka().__file__).resolve() == ROOT / "devtools" / "devkafka.py"


def test_demo_outside_a_checkout_says_to_use_dev_demo(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "devtools", None)  # not importable, as in an installed wheel
    with pytest.raises(cmd_demo.DemoUnavailableError, match=r"run `\./dev demo` from a source checkout"):
        cmd_demo.dev_kafka(tmp_path)
    monkeypatch.setattr(cmd_demo, "CHECKOUT", tmp_path)
    out_dir = tmp_path / "demo-data"
    assert cli.main(["demo", "--dir", str(out_dir)]) == 2
    err = capsys.readouterr().err
    assert "not part of the installed package" in err and "run `./dev demo` from a source checkout" in err
    assert not out_dir.exists()  # failed before touching anything


def test_demo_from_an_installed_copy_without_the_checkout(tmp_path: Path) -> None:
    """The packages alone (what the wheel installs) in a directory of their own, run as ``rlm demo`` would be."""
    site = tmp_path / "site-packages"
    for pkg in ("rlm", "rlmm", "rsm"):
        shutil.copytree(ROOT / pkg, site / pkg, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RLM_PROJECT_ROOT")}
    code = (f"import sys; sys.path.insert(0, {str(site)!r}); import rlm; assert rlm.__file__.startswith({str(site)!r})"
            f"; from rlm.cli import main; sys.exit(main(['demo', '--dir', 'demo-data']))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "rlm: error: rlm demo needs the dev Kafka launcher" in proc.stderr
    assert "run `./dev demo` from a source checkout" in proc.stderr
    assert not (tmp_path / "demo-data").exists()


@pytest.mark.slow
def test_demo_runs_quietly(tmp_path: Path) -> None:
    """The demo's quick form, as a user runs it: it shows offset 0 served remotely, and its whole output has no
    ERROR line and no librdkafka line (``%3|`` errors, ``%4|`` warnings): clients close before the broker stops,
    and librdkafka logs go to our logging (the sidecar log file), capped at WARNING."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RLM_")}, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "rlm.cli", "demo", "--records", "3000", "--dir",
                           str(tmp_path / "demo")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          stdin=subprocess.DEVNULL)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "offset 0 is served from the remote tier" in out, out[-4000:]
    noisy = [line for line in out.splitlines() if "ERROR" in line or re.match(r"%\d\|", line)]
    assert noisy == [], noisy
    log = (tmp_path / "demo" / "sidecar.log").read_text()
    assert '"level": "ERROR"' not in log, [line for line in log.splitlines() if '"level": "ERROR"' in line][:5]
