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
    """A venv with the package installed without extras (pip's cache makes it quick after the first time).

    The venv gets no pip of its own: this interpreter's pip installs into it (``pip --python``), which resolves and
    installs the same distributions, and nothing is byte-compiled ahead (``--no-compile``: the checks' imports
    compile what they load). Both cut what the set-up did before, ensurepip and compiling every installed module
    (botocore's among them): 49 and 70 s before, 23 and 21 s after, alternating, load average 2-6."""
    env_dir = tmp_path_factory.mktemp("bare-venv")
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    # Built from a copy of the sources (the checkout may hold a large .venv that a build would walk).
    src = tmp_path_factory.mktemp("src")
    subprocess.run(["cp", "-r", *(str(ROOT / n) for n in ("pyproject.toml", "README.md", "rlm", "rlmm", "rsm")),
                    str(src)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--disable-pip-version-check",
                    "--no-compile", str(src)], check=True, timeout=900, stdin=subprocess.DEVNULL, env=_env())
    return env_dir


def _env() -> dict[str, str]:
    """This environment without what would put the checkout or the suite's venv on the bare venv's path."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _run(env_dir: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), cwd=env_dir, env=_env(), capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


@pytest.mark.slow
def test_sidecar_runs_without_spark(bare_venv: Path) -> None:
    # The distributions the venv's own interpreter sees installed.
    listed = _run(bare_venv, str(bare_venv / "bin" / "python"), "-c",
                  "import importlib.metadata as m; print('\\n'.join(d.metadata['Name'] for d in m.distributions()))")
    assert listed.returncode == 0, listed.stderr
    names = {line.strip().lower().replace("_", "-") for line in listed.stdout.splitlines()}
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


@pytest.mark.slow
def test_spark_names_the_extra(bare_venv: Path) -> None:
    out = _run(bare_venv, str(bare_venv / "bin" / "python"), "-c", "import rlm.spark")
    assert out.returncode != 0
    assert "rlm.spark needs the 'spark' extra: pip install 'rlm-sidecar[spark]'" in out.stderr, out.stderr


def test_this_interpreter_has_the_extra() -> None:
    """The suite's own venv (./dev) installs the extras: the Spark tests run."""
    import rlm.spark

    assert rlm.spark.register is not None and sys.prefix
