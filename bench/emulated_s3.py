"""An S3 store with real S3's latency for the benches that tier through the sidecar (issue 25): s3proxy
(``devtools/s3proxy.py``, a real S3 server over a directory) behind the latency-emulating proxy
(``devtools/s3latency.py``, its own process so its pacing does not share the bench's interpreter).

    with EmulatedS3(work / "s3", bucket="bench") as s3:
        store = s3.store(key_prefix="plain/")   # an RsmConfig section: {"store": "s3", "bucket": ..., ...}

The emulator's defaults are the issue's S3 Standard figures (first byte lognormal, median 27 ms, sigma 0.6, floor
10 ms; PUT 60 ms + 20 ms/MiB; 88 MB/s per connection); ``latency_args`` are passed to it as they are
(``--first-byte-median-ms=40`` ...). The credentials go into this process's environment (``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``) so that child processes (a history endpoint, Spark's Python
workers) inherit them. ``bench_s3.py``, ``bench_history.py`` and ``bench_spark.py`` all start it through this
module. ``stats`` holds the emulator's counts (requests by method, bytes, outliers) once it has stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from devtools.s3proxy import S3ProxyServer

__all__ = ["EmulatedS3"]

ROOT = Path(__file__).resolve().parents[1]


class EmulatedS3:
    """s3proxy over ``directory`` with one bucket, behind ``devtools.s3latency``; ``url`` is the emulator's."""

    def __init__(self, directory: Path, *, bucket: str = "bench", seed: int = 1,
                 latency_args: list[str] | tuple[str, ...] = ()) -> None:
        self.bucket, self.seed, self.latency_args = bucket, seed, list(latency_args)
        self.server = S3ProxyServer(directory=directory, heap="1g")
        self.url = ""
        self.command: list[str] = []
        self.stats: dict[str, int] = {}
        """The emulator's counts, read from its last ``stats:`` line once it has stopped (``__exit__``)."""
        self._stderr = Path(directory) / "s3latency.stderr"
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> EmulatedS3:
        self.server.start()
        try:
            os.environ["AWS_ACCESS_KEY_ID"] = self.server.identity
            os.environ["AWS_SECRET_ACCESS_KEY"] = self.server.credential
            os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
            self.server.client().create_bucket(Bucket=self.bucket)
            self.command = [sys.executable, "-m", "devtools.s3latency", "--upstream", self.server.endpoint_url,
                            "--seed", str(self.seed), *self.latency_args]
            self._stderr.parent.mkdir(parents=True, exist_ok=True)
            with self._stderr.open("w") as err:
                self._proc = subprocess.Popen(self.command, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, text=True)
            line = self._proc.stdout.readline().strip()  # type: ignore[union-attr]
            if not line.startswith("listening on "):
                raise RuntimeError(f"s3latency did not start ({self._proc.poll()}): {line!r}")
            self.url = line.removeprefix("listening on ")
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            if self._stderr.exists():
                lines = [ln for ln in self._stderr.read_text().splitlines() if ln.startswith("stats: ")]
                if lines:
                    self.stats = json.loads(lines[-1].removeprefix("stats: "))
        self.server.stop()

    def describe(self) -> str:
        """One line: where the store is and the emulator's command line."""
        return (f"s3proxy {self.server.endpoint_url} behind the S3 latency emulator {self.url}: "
                + " ".join(self.command[2:]))

    def store(self, **extra: object) -> dict:
        """An ``RsmConfig`` section for this bucket through the emulator (``extra``: more fields)."""
        return {"store": "s3", "bucket": self.bucket, "endpoint_url": self.url, "region": "us-east-1", **extra}
