"""A real S3 API server on 127.0.0.1 for tests and benchmarks: s3proxy over a local filesystem directory.

The jars come from Maven Central through ``config/s3proxy-pom.xml`` and are cached under ``.cache/s3proxy/``
(ignored by git), like the Kafka jars (:mod:`devtools.devkafka`). The server is started as::

    java -Dlogback.configurationFile=config/s3proxy-logback.xml -cp <jars> org.gaul.s3proxy.Main --properties F

with ``F`` holding: an endpoint on 127.0.0.1 and a free port, ``s3proxy.authorization=aws-v2-or-v4`` with one
identity/credential (requests signed with anything else are refused: the client's credentials are really
checked), and the jclouds backend ``filesystem-nio2`` under a temp directory. ``filesystem-nio2`` is s3proxy's
own filesystem backend; jclouds' older ``filesystem`` provider works too (``provider="filesystem"``) but s3proxy
warns that it is deprecated, and its listings return directories as objects (``a/``, 4096 bytes) to a prefix
without a trailing slash. Logging is WARN (s3proxy's default DEBUG logging slows every request).

Clients use path-style addressing (``http://127.0.0.1:PORT/<bucket>/<key>``) and bucket names S3 accepts.

What s3proxy 2.6.0 does (checked by ``tests/rsm/test_s3proxy.py``): ranged GETs answer 206; multipart uploads
work; ``ListMultipartUploads`` lists incomplete uploads (with ``prefix``), but its ``Initiated`` is the time of
the listing (a "bogus value" in s3proxy's source, still so in its 4.x), never the upload's; ``ListParts`` gives
each part's real ``LastModified`` (to the second). It answers 501 NotImplemented to headers it does not know,
among them botocore's ``x-amz-checksum-crc32`` (DeleteObjects: ``rsm.store.s3`` sends ``Content-MD5``) and
``x-amz-checksum-mode`` (sent unless ``response_checksum_validation="when_required"``). Per its source it also
refuses ``key-marker`` / ``max-uploads`` on ``ListMultipartUploads`` (it never truncates that listing). Its
filesystem backends keep each key as a file (a key component over 255 bytes fails with a 500) and an upload's
parts as objects named ``.mpus-<upload id>-<key>-<n>`` plus a ``<upload id>`` object at the bucket root, so
those appear in a bucket-wide listing (not under a key prefix of ours).

Usage::

    with S3ProxyServer() as s3:
        s3.endpoint_url              # "http://127.0.0.1:PORT"
        s3.client().create_bucket(Bucket="rsm-test")

The server's own log is ``<directory>/s3proxy.log``; :meth:`S3ProxyServer.tail_log` returns it for failure
reports.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from devtools.devkafka import free_port, project_root
from devtools.maven import resolve_jars

__all__ = ["S3ProxyServer", "S3ProxyStartError", "ensure_s3proxy_jars"]

MAIN_CLASS = "org.gaul.s3proxy.Main"


class S3ProxyStartError(RuntimeError):
    """s3proxy could not resolve its jars or did not come up; the message has the log tail."""


def ensure_s3proxy_jars(root: Path | None = None) -> Path:
    """Resolve the s3proxy jars with Maven once; return the directory that holds them.

    A marker file records the POM it was resolved from, so editing ``config/s3proxy-pom.xml`` re-resolves.
    ``RLM_S3PROXY_CACHE`` overrides the cache directory (``.cache/s3proxy``).
    """
    root = root or project_root()
    pom = root / "config" / "s3proxy-pom.xml"
    cache = Path(os.environ.get("RLM_S3PROXY_CACHE", root / ".cache" / "s3proxy"))
    return resolve_jars(pom, cache, error=S3ProxyStartError, expect="s3proxy-*.jar", what="the s3proxy jars")


class S3ProxyServer:
    """One s3proxy process serving S3 over HTTP on 127.0.0.1, its objects under ``directory/data``."""

    def __init__(self, *, identity: str = "rlm-test", credential: str = "rlm-test-secret",
                 provider: str = "filesystem-nio2", directory: Path | None = None, heap: str = "512m",
                 start_timeout_s: float = 90.0) -> None:
        self.identity = identity
        self.credential = credential
        self.provider = provider
        self.heap = heap
        self.start_timeout_s = start_timeout_s
        self._own_dir = directory is None
        self.directory = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="s3proxy-"))
        self.data_dir = self.directory / "data"
        self.log_path = self.directory / "s3proxy.log"
        self.port = 0
        self.process: subprocess.Popen | None = None
        self._log_file = None

    def __enter__(self) -> S3ProxyServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _java(self) -> str:
        java_home = os.environ.get("JAVA_HOME")
        java = Path(java_home) / "bin" / "java" if java_home else shutil.which("java")
        if not java:
            raise S3ProxyStartError("java not found (set JAVA_HOME or put java on PATH)")
        return str(java)

    def _write_properties(self) -> Path:
        props = {
            "s3proxy.endpoint": self.endpoint_url,
            "s3proxy.authorization": "aws-v2-or-v4",
            "s3proxy.identity": self.identity,
            "s3proxy.credential": self.credential,
            # botocore signs the payload of plain-HTTP requests (not chunked): s3proxy buffers such a body to
            # check its hash and refuses one above this size (default 32 MiB); our parts can be larger.
            "s3proxy.v4-max-non-chunked-request-size": str(256 * 1024 * 1024),
            "jclouds.provider": self.provider,
            # filesystem-nio2 insists on a jclouds identity/credential of its own (unused by a local backend)
            "jclouds.identity": "local",
            "jclouds.credential": "local",
            "jclouds.filesystem.basedir": str(self.data_dir),
        }
        path = self.directory / "s3proxy.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def command(self, libs: Path, properties: Path) -> list[str]:
        log_cfg = project_root() / "config" / "s3proxy-logback.xml"
        return [self._java(), f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
                f"-Dlogback.configurationFile={log_cfg}", "-cp", f"{libs}/*", MAIN_CLASS,
                "--properties", str(properties)]

    def start(self) -> None:
        """Resolve the jars, start the server and wait until it answers HTTP; raise :class:`S3ProxyStartError`."""
        if self.process is not None:
            return
        libs = ensure_s3proxy_jars()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        props = self._write_properties()
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(self.command(libs, props), stdout=self._log_file,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        cwd=self.directory)
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last: Exception | None = None
        while time.monotonic() < deadline:
            assert self.process is not None
            rc = self.process.poll()
            if rc is not None:
                raise S3ProxyStartError(f"s3proxy exited with code {rc} while starting:\n{self.tail_log()}")
            try:
                urllib.request.urlopen(self.endpoint_url + "/", timeout=2).close()
                return
            except urllib.error.HTTPError:
                return  # any HTTP answer (403 to an anonymous request) means it serves
            except OSError as err:
                last = err
            time.sleep(0.2)
        raise S3ProxyStartError(f"s3proxy did not answer on {self.endpoint_url} within {self.start_timeout_s:.0f} s "
                                f"({last}):\n{self.tail_log()}")

    def tail_log(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no s3proxy log)"

    def stop(self, timeout: float = 20.0) -> None:
        proc, self.process = self.process, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._own_dir:
            shutil.rmtree(self.directory, ignore_errors=True)

    def client(self, **config: object):
        """A boto3 S3 client of this server's identity: path-style, checksums only when required."""
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint_url, region_name="us-east-1",
                            aws_access_key_id=self.identity, aws_secret_access_key=self.credential,
                            config=Config(s3={"addressing_style": "path"},
                                          request_checksum_calculation="when_required",
                                          response_checksum_validation="when_required", **config))
