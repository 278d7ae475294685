"""The ``rlm`` command line and ``rlm serve`` run as their own processes, as an operator runs them."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["CLI_TIMEOUT_S", "ROOT", "b64", "http_get", "json_lines", "ok", "rlm", "serve"]

ROOT = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 240  # one CLI process: imports, metadata catch-up, reads; generous for a loaded 2-core box

def rlm(*args: str, config: Path | None = None, timeout: float = CLI_TIMEOUT_S) -> subprocess.CompletedProcess:
    """``python -m rlm.cli ARGS [--config FILE]`` as its own process; stdout and stderr captured as text."""
    argv = [sys.executable, "-m", "rlm.cli", *args]
    if config is not None:
        argv += ["--config", str(config)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}  # the file alone configures it
    return subprocess.run(argv, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, env=env)

def ok(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, \
        f"exit {proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return proc.stdout

def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]

def b64(v: bytes | None) -> str | None:
    return None if v is None else base64.b64encode(v).decode()


def serve(config: Path, log: Path) -> subprocess.Popen:
    """``rlm serve --config FILE`` as its own process (stderr to ``log``)."""
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "rlm.cli", "serve", "--config", str(config)], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except OSError:
        return 0, b""
