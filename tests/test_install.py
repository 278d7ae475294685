"""The sidecar installs without Spark: ``pip install .`` (no extras) into a fresh venv gives a working ``rlm`` and
an ``rlm.spark`` that names the extra it needs."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with the package installed without extras (pip's cache makes it quick after the first time)."""
    env_dir = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    # Built from a copy of the sources (the checkout may hold a large .venv that a build would walk).
    src = tmp_path_factory.mktemp("src")
    subprocess.run(["cp", "-r", *(str(ROOT / n) for n in ("pyproject.toml", "README.md", "rlm", "rlmm", "rsm")),
                    str(src)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(src)], check=True,
                   timeout=900, stdin=subprocess.DEVNULL)
    return env_dir


def _run(env_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(list(args), cwd=env_dir, env=env, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def test_sidecar_runs_without_spark(bare_venv: Path) -> None:
    pip_list = _run(bare_venv, str(bare_venv / "bin" / "python"), "-m", "pip", "list", "--format=freeze").stdout
    names = {line.split("==")[0].lower() for line in pip_list.splitlines()}
    assert "rlm-sidecar" in names
    assert not names & {"pyspark", "pyarrow", "pandas"}, sorted(names & {"pyspark", "pyarrow", "pandas"})
    out = _run(bare_venv, str(bare_venv / "bin" / "rlm"), "--help")
    assert out.returncode == 0 and "serve" in out.stdout, out.stderr
    out = _run(bare_venv, str(bare_venv / "bin" / "rlm"), "serve", "--help")
    assert out.returncode == 0 and "--config" in out.stdout, out.stderr
    # The sidecar's own modules import without Spark.
    out = _run(bare_venv, str(bare_venv / "bin" / "python"), "-c",
               "import rlm.sidecar, rlm.listener, rlm.cli.cat, rlm.tasks.copier")
    assert out.returncode == 0, out.stderr


def test_spark_names_the_extra(bare_venv: Path) -> None:
    out = _run(bare_venv, str(bare_venv / "bin" / "python"), "-c", "import rlm.spark")
    assert out.returncode != 0
    assert "rlm.spark needs the 'spark' extra: pip install 'rlm-sidecar[spark]'" in out.stderr, out.stderr


def test_this_interpreter_has_the_extra() -> None:
    """The suite's own venv (./dev) installs the extras: the Spark tests run."""
    import rlm.spark

    assert rlm.spark.register is not None and sys.prefix
