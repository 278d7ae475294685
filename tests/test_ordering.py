"""``tests/support/ordering.py`` under pytest-xdist as ``./dev test`` runs it: a module holding a ``slow`` test is
handed out before modules with more tests (xdist's own order), which keep their collection order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

MODULES = {
    # collected in this order (by name); xdist's own order would be: many, fast, long
    "test_a_fast.py": "def test_one():\n    pass\n\ndef test_two():\n    pass\n",
    "test_b_many.py": "".join(f"def test_{i}():\n    pass\n\n" for i in range(5)),
    "test_c_long.py": "import pytest\n\n@pytest.mark.slow\ndef test_long():\n    pass\n",
}


def test_slow_modules_are_handed_out_first(tmp_path: Path) -> None:
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # one worker: it runs the modules in the order the controller hands them out
    out = subprocess.run([sys.executable, "-m", "pytest", "-p", "xdist", "-p", "tests.support.ordering", "-n", "1",
                          "--dist", "loadfile", "--no-loadscope-reorder", "-v", "-p", "no:cacheprovider",
                          "-o", "markers=slow", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout + out.stderr
    ran = [line.split("::", 1)[0].split()[-1] for line in out.stdout.splitlines() if " PASSED " in line]
    modules = list(dict.fromkeys(ran))
    assert modules == ["test_c_long.py", "test_a_fast.py", "test_b_many.py"], out.stdout
    assert len(ran) == 8, out.stdout
