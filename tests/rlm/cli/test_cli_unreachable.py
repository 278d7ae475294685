"""The command line against a Kafka cluster it cannot reach (issue 27): a closed port (no broker ever), and a real
broker that ran (the metadata topic exists, the sidecar tiered a topic) and was stopped.

Every command family: one line ``rlm: cannot reach the Kafka cluster at <bootstrap servers>: <cause>``, no traceback,
exit code 6 (``EXIT_UNREACHABLE``), with ``--timeout 3``. Each process runs under a hard limit (:data:`HARD_LIMIT_S`)
far above what the command needs, so a command that hangs fails the test instead of hanging it; nothing asserts how
fast a command was. ``rlm serve`` at start does the same; stopped with SIGTERM once its broker is gone, it abandons
the job stuck on the broker (``--stop-timeout 3``) instead of waiting for it.

The module's own one-broker cluster is stopped by the serve test (mid-way: serve running) or by the ``stopped``
fixture, whichever comes first; the closed-port cases need no broker at all.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from devtools.devkafka import KafkaCluster, free_port
from rlm.cli.context import EXIT_UNREACHABLE
from rlm.rlmm_config import sidecar_rlmm_config
from rlmm.topic_manager import TopicBasedRemoteLogMetadataManager
from tests.support.sidecar import make_settings, only, produce_segments, settings_yaml, wait_for

ROOT = Path(__file__).resolve().parents[3]
HARD_LIMIT_S = 60  # per process: a command that does not return by then hangs (it needs --timeout 3 and imports)
TOPIC = "unreachable-t"

READING = [["ls", TOPIC], ["cat", TOPIC, "0"], ["offsets", TOPIC, "0"]]
MAINTENANCE = [["verify", TOPIC], ["gc", TOPIC, "--dry-run"], ["recover", "--dry-run"]]
STATUS = [["status"], ["status", TOPIC, "--json"]]


@dataclass(frozen=True)
class Target:
    """A config whose ``kafka.bootstrap_servers`` does not answer."""

    name: str
    config: Path
    bootstrap: str


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}  # the config file alone configures it


def rlm(argv: Sequence[str], config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rlm.cli", *argv, "--config", str(config), "--timeout", "3"],
                          cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=HARD_LIMIT_S,
                          env=env())


def run_all(commands: list[list[str]], config: Path) -> dict[str, subprocess.CompletedProcess]:
    with ThreadPoolExecutor(3) as pool:
        procs = list(pool.map(lambda argv: rlm(argv, config), commands))
    return {" ".join(argv): proc for argv, proc in zip(commands, procs, strict=True)}


def assert_unreachable(procs: dict[str, subprocess.CompletedProcess], bootstrap: str) -> None:
    for what, proc in procs.items():
        shown = f"rlm {what}: exit {proc.returncode}\nstdout:\n{proc.stdout[-2000:]}\nstderr:\n{proc.stderr[-3000:]}"
        assert proc.returncode == EXIT_UNREACHABLE, shown
        assert "Traceback" not in proc.stderr, shown
        assert proc.stdout == "", shown
        (line,) = proc.stderr.splitlines()  # one line, nothing else (no librdkafka log lines either)
        assert line.startswith(f"rlm: cannot reach the Kafka cluster at {bootstrap}: no answer within 3s"), shown
        assert "Connection refused" in line, shown  # librdkafka's cause, as it said it


# ---------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def kafka() -> Iterator[KafkaCluster]:
    with KafkaCluster(brokers=1) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def live_config(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The config of a sidecar tiering :data:`TOPIC` (three rolled segments) on the module's broker, its metadata
    topic created."""
    tmp = tmp_path_factory.mktemp("unreachable")
    kafka.create_topic(TOPIC, 1, config={"segment.ms": "300"})
    produce_segments(kafka, TOPIC, 3, 50, segment_ms=300)
    settings = make_settings(kafka, tmp, topics=only(TOPIC))
    TopicBasedRemoteLogMetadataManager(sidecar_rlmm_config(settings)).close()  # creates the metadata topic
    config = tmp / "sidecar.yaml"
    config.write_text(settings_yaml(settings))
    return config


@pytest.fixture(scope="module")
def closed(live_config: Path) -> Target:
    """The same config, bootstrapping from a port nothing listens on."""
    bootstrap = f"127.0.0.1:{free_port()}"
    text = live_config.read_text()
    config = live_config.with_name("closed.yaml")
    raw = yaml.safe_load(text)
    raw["kafka"]["bootstrap_servers"] = bootstrap
    config.write_text(yaml.safe_dump(raw))
    return Target("closed port", config, bootstrap)


@pytest.fixture(scope="module")
def stopped(kafka: KafkaCluster, live_config: Path) -> Target:
    """The live config, its broker stopped (if the serve test has not stopped it already)."""
    kafka.stop_node(1)
    return Target("stopped broker", live_config, kafka.bootstrap_servers)


# ------------------------------------------------------------------------------------------------------ serve
@pytest.mark.slow
def test_serve_stopped_once_its_broker_is_gone_abandons_the_stuck_job(kafka: KafkaCluster, live_config: Path,
                                                                      tmp_path: Path) -> None:
    """Serve tiers the topic; the broker stops; SIGTERM: the discovery round waiting on the gone broker (up to 20 s)
    is abandoned at --stop-timeout, the process exits 1 ("as after a crash"), with no traceback."""
    kafka.start_node(1)  # a no-op unless a test before this one stopped it
    kafka.wait_ready()
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rlm.cli", "serve", "--config", str(live_config),
                                 "--timeout", "10", "--stop-timeout", "3"], cwd=ROOT, env=env(),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: "segment copied" in log.read_text() or proc.poll() is not None, HARD_LIMIT_S,
                 "serve to copy a segment")
        assert proc.poll() is None, log.read_text()[-5000:]
        kafka.stop_node(1)
        wait_for(lambda: "discovery failed" in log.read_text().split("segment copied", 1)[1], HARD_LIMIT_S,
                 "a discovery round to fail on the stopped broker")
        time.sleep(1)  # the next round (every 300 ms) is waiting on the broker now
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(HARD_LIMIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    text = log.read_text()
    assert "signal received: shutting down" in text, text[-5000:]
    assert "Traceback" not in text, text[-5000:]
    # Usually a round is waiting on the gone broker when the signal lands: abandoned, exit 1. Should the signal fall
    # between two rounds, nothing is left to abandon and the stop is clean (exit 0): either way it has returned.
    assert code in (0, 1), text[-5000:]
    assert (code == 1) == ("jobs still running at shutdown: abandoned" in text), text[-5000:]


def test_serve_start_against_a_closed_port(closed: Target) -> None:
    proc = subprocess.run([sys.executable, "-m", "rlm.cli", "serve", "--config", str(closed.config),
                           "--timeout", "3"], cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=HARD_LIMIT_S, env=env())
    out = proc.stdout + proc.stderr
    assert proc.returncode == EXIT_UNREACHABLE, out
    assert "Traceback" not in out, out
    (line,) = out.splitlines()
    assert f"ERROR rlm.serve: cannot start: cannot reach the Kafka cluster at {closed.bootstrap}: " in line, out


# ------------------------------------------------------------------------------------------ the other commands
@pytest.mark.parametrize("target", ["closed", "stopped"])
def test_listing_and_reading_commands(target: str, request: pytest.FixtureRequest) -> None:
    t: Target = request.getfixturevalue(target)
    assert_unreachable(run_all(READING, t.config), t.bootstrap)


@pytest.mark.parametrize("target", ["closed", "stopped"])
def test_maintenance_commands(target: str, request: pytest.FixtureRequest) -> None:
    t: Target = request.getfixturevalue(target)
    assert_unreachable(run_all(MAINTENANCE, t.config), t.bootstrap)


@pytest.mark.parametrize("target", ["closed", "stopped"])
def test_status(target: str, request: pytest.FixtureRequest) -> None:
    t: Target = request.getfixturevalue(target)
    assert_unreachable(run_all(STATUS, t.config), t.bootstrap)


def test_serve_raises_its_open_files_limit_to_the_hard_limit(closed: Target) -> None:
    """``rlm serve`` started with a soft limit of 256 open files (many systems give 1,024: less than the listener's
    1,000 connections and the copies' files in place) raises it to the hard limit before it reaches for the cluster,
    as the JVM does for Kafka's broker; seen in ``/proc/<pid>/limits`` while it waits for the closed port."""
    import resource

    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = 256
    assert hard == resource.RLIM_INFINITY or hard > low, f"this machine's hard limit {hard} leaves nothing to raise"

    def lowered() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))

    proc = subprocess.Popen([sys.executable, "-m", "rlm.cli", "serve", "--config", str(closed.config),
                             "--timeout", "5"], cwd=ROOT, env=env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=lowered)
    seen: set[str] = set()
    try:
        while proc.poll() is None:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                for line in Path(f"/proc/{proc.pid}/limits").read_text().splitlines():
                    if line.startswith("Max open files"):
                        seen.add(line.split()[3])  # the soft limit
            if str(hard) in seen or (hard == resource.RLIM_INFINITY and "unlimited" in seen):
                break
            time.sleep(0.02)
    finally:
        proc.kill()
        out = proc.communicate(timeout=HARD_LIMIT_S)[0].decode()
    assert seen and (str(hard) in seen or "unlimited" in seen), (seen, out[-2000:])
