"""The sidecar, every operator command and the Spark source against an authenticated cluster: SASL_SSL with
SCRAM-SHA-512 over TLS (a CA made at fixture time), KRaft's StandardAuthorizer with ACLs (``kafka_sasl_ssl``).

One cluster and one tiered topic for the module: ``rlm serve`` (password from the environment) tiers it as a
principal with only the ACLs it needs; ``ls``, ``cat``, ``offsets``, ``verify`` and ``gc`` (password in the config
file) run next to it, and Spark reads it (password as a ``kafka.sasl.password`` option). Principals that lack one
ACL get an error naming the operation, the resource and the principal. No output, log or plan holds a password.
(tests/rlm/test_sidecar_acl.py covers what the sidecar does when a topic's ACLs change under it.)
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from devtools.devkafka import KafkaCluster, free_port
from rlm.tasks.cleaner import group_for
from tests.support.fixtures import SCRAM_PRINCIPAL
from tests.support.kafka import produce
from tests.support.sidecar import make_settings, only, produce_segments, wait_for

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CLI_TIMEOUT_S = 180
ROUNDS = 3
OP = AclOperation
RT = ResourceType


@dataclass
class Run:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str

    def ok(self) -> str:
        assert self.returncode == 0, \
            f"{self.argv}: exit {self.returncode}\n{self.stdout[-3000:]}\n{self.stderr[-3000:]}"
        return self.stdout


@dataclass
class Secured:
    kc: KafkaCluster
    topic: str
    md_topic: str
    tbd_topic: str
    sent: dict[int, tuple[bytes, bytes]]
    config: Path                       # the sidecar principal's YAML (password inside), for the commands
    root: Path                         # the fs store
    serve_log: Path
    serve_exit: int | None = None
    runs: dict[str, Run] = field(default_factory=dict)   # what each command printed
    texts: list[str] = field(default_factory=list)       # everything printed or logged, for the password grep


def grant(kc: KafkaCluster, user: str, *acls: tuple[ResourceType, str, AclOperation],
          pattern: ResourcePatternType = ResourcePatternType.LITERAL) -> None:
    admin = AdminClient(kc.admin_config())
    bindings = [AclBinding(rt, name, pattern, f"User:{user}", "*", op, AclPermissionType.ALLOW)
                for rt, name, op in acls]
    for fut in admin.create_acls(bindings).values():
        fut.result(30)


def rlm(*args: str, config: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = CLI_TIMEOUT_S) -> Run:
    argv = [sys.executable, "-m", "rlm.cli", *args, *(["--config", str(config)] if config else [])]
    base = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
    proc = subprocess.run(argv, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout, env={**base, **(env or {})})
    return Run(argv[3:], proc.returncode, proc.stdout, proc.stderr)


def write_config(path: Path, raw: dict[str, Any], client: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump({**raw, "kafka": {**raw["kafka"], "client": client}}))
    return path


def http_text(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.read().decode()
    except OSError:
        return ""


def b64(v: bytes) -> str:
    return base64.b64encode(v).decode()


@pytest.fixture(scope="module")
def secured(kafka_sasl_ssl: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Any:
    kc = kafka_sasl_ssl
    tmp = tmp_path_factory.mktemp("secure")
    topic = f"secure-{uuid.uuid4().hex[:8]}"
    kc.create_topic(topic, config={"segment.ms": "300"})
    sent = produce_segments(kc, topic, ROUNDS, 150, segment_ms=300, roll=False, **kc.security_config())
    produce(kc, topic, [(b"__roll__", b"r")], **kc.security_config())

    port = free_port()
    settings = make_settings(kc, tmp, topics=only(topic), listen={"host": "127.0.0.1", "port": port},
                             log_level="DEBUG")
    md, tbd = settings.metadata.topic, settings.metadata.to_be_deleted_topic
    # The sidecar's principal: what the README's table says it needs, no more (CREATE on the cluster: its topics do
    # not exist yet; nothing else on the cluster, nothing on other topics, no other group).
    grant(kc, SCRAM_PRINCIPAL, (RT.BROKER, "kafka-cluster", OP.CREATE),
          (RT.TOPIC, md, OP.ALL), (RT.TOPIC, tbd, OP.ALL),
          (RT.TOPIC, topic, OP.DESCRIBE), (RT.TOPIC, topic, OP.DESCRIBE_CONFIGS),
          # the cleaner's group: rlm-cleaner.<topic> for this to-be-deleted topic, not the default's rlm-cleaner (the
          # grant named the default's until session 24: the cleaner was refused, its warning's reason unseen while
          # the text log format dropped extra= fields)
          (RT.GROUP, group_for(tbd), OP.READ))
    # The metadata manager's consumer assigns partitions itself, but librdkafka looks up the coordinator of its
    # throw-away group (rlmm-<uuid>) all the same: without DESCRIBE there, a GROUP_AUTHORIZATION_FAILED warning.
    grant(kc, SCRAM_PRINCIPAL, (RT.GROUP, "rlmm-", OP.DESCRIBE), pattern=ResourcePatternType.PREFIXED)

    raw = settings.model_dump(mode="json", exclude_none=True)
    client = kc.security_config(SCRAM_PRINCIPAL)
    s = Secured(kc, topic, md, tbd, sent, write_config(tmp / "sidecar.yaml", raw, client),
                Path(raw["store"]["root_path"]), tmp / "serve.log")
    # rlm serve: the password comes from the environment only; its config file has none.
    serve_config = write_config(tmp / "serve.yaml", raw, {k: v for k, v in client.items() if k != "sasl.password"})
    assert "sasl.password" not in serve_config.read_text()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RLM_")}
    env["RLM_KAFKA__CLIENT"] = json.dumps({"sasl.password": client["sasl.password"]})  # merged into the file's
    with open(s.serve_log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "rlm.cli", "serve", "--config", str(serve_config)], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
    try:
        copied = f'rlm_segments_copied_total{{topic="{topic}"}} {float(ROUNDS)}'
        wait_for(lambda: copied in http_text(f"http://127.0.0.1:{port}/metrics") or proc.poll() is not None, 90,
                 "rlm serve to tier the topic")
        assert proc.poll() is None, s.serve_log.read_text()[-5000:]
        s.texts.append(http_text(f"http://127.0.0.1:{port}/metrics"))
        s.texts.append(http_text(f"http://127.0.0.1:{port}/health"))
        # The operator commands, next to the running sidecar.
        s.runs["ls"] = rlm("ls", topic, "--json", config=s.config)
        s.runs["cat"] = rlm("cat", topic, "0", config=s.config)
        s.runs["offsets"] = rlm("offsets", topic, "0", config=s.config)
        s.runs["verify"] = rlm("verify", topic, config=s.config)
        segs = [json.loads(line) for line in s.runs["ls"].ok().splitlines()]
        (index,) = list(s.root.rglob(f"{segs[0]['start_offset']:020d}-{segs[0]['segment_id']}-index"))
        orphan = index.parent / f"{segs[-1]['end_offset'] + 1:020d}-{uuid.uuid4()}"
        orphan.write_bytes(b"left behind by a copy that died before its metadata")
        s.runs["gc-dry"] = rlm("gc", topic, "--dry-run", config=s.config)
        s.runs["gc"] = rlm("gc", topic, config=s.config)
        s.runs["gc-orphan-gone"] = Run(["(check)"], 0 if not orphan.exists() else 1, str(orphan.relative_to(s.root)),
                                       "")
        s.runs["help"] = rlm("serve", "--help", env={"RLM_KAFKA__CLIENT": json.dumps(client)})
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            s.serve_exit = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    s.texts.append(s.serve_log.read_text())
    yield s


def test_serve_tiers_through_sasl_ssl(secured: Secured) -> None:
    log = secured.serve_log.read_text()
    assert secured.serve_exit == 0, log[-3000:]
    assert "sidecar started" in log
    segs = [json.loads(line) for line in secured.runs["ls"].ok().splitlines()]
    assert len(segs) == ROUNDS
    assert segs[0]["start_offset"] == 0 and segs[-1]["end_offset"] == max(secured.sent)
    for a, b in zip(segs, segs[1:], strict=False):
        assert b["start_offset"] == a["end_offset"] + 1
    assert {r["state"] for r in segs} == {"COPY_SEGMENT_FINISHED"}
    # The ACLs granted are enough: nothing was refused, not even in a warning.
    for text in [log, *(r.stderr for r in secured.runs.values())]:
        assert "AUTHORIZATION_FAILED" not in text and "not authorized" not in text, text[-3000:]


def test_cat_offsets_verify_gc_through_sasl_ssl(secured: Secured) -> None:
    got = {r["offset"]: (r["key"], r["value"]) for r in map(json.loads, secured.runs["cat"].ok().splitlines())}
    assert got == {o: (b64(k), b64(v)) for o, (k, v) in secured.sent.items()}  # byte-exact, every record
    offsets = json.loads(secured.runs["offsets"].ok())
    assert offsets["earliest_remote_offset"] == 0 and offsets["latest_tiered_offset"] == max(secured.sent)
    assert secured.runs["verify"].ok().strip().splitlines()[-1] == f"verified {ROUNDS} segments: {ROUNDS} ok, 0 bad"
    orphan_key = secured.runs["gc-orphan-gone"].stdout
    assert secured.runs["gc-dry"].ok().splitlines() == [f"orphan {orphan_key}", "1 objects orphaned"]
    assert secured.runs["gc"].ok().splitlines() == [f"deleted {orphan_key}", "1 objects deleted"]
    assert secured.runs["gc-orphan-gone"].returncode == 0, "gc left the orphan"


# --------------------------------------------------------------------------------------------------- Spark
@pytest.fixture(scope="module")
def spark_read(secured: Secured, spark: Any) -> Any:
    """A Spark batch read of the tiered topic, as the sidecar's principal with the password as an option; the
    rows, and every plan string Spark prints for the query (before and after it ran). On the session's
    SparkSession (a JVM of its own would cost ~20 CPU s more)."""
    session = spark
    client = secured.kc.security_config(SCRAM_PRINCIPAL)
    options = {"subscribe": secured.topic, "kafka.bootstrap.servers": secured.kc.bootstrap_servers,
               **{f"kafka.{k}": str(v) for k, v in client.items()},
               "metadata.topic": secured.md_topic, "store": "fs", "store.root_path": str(secured.root)}
    df = session.read.format("kafka-remote").options(**options).load()
    plans = [df._jdf.queryExecution().toString()]
    for mode in ("extended", "formatted"):  # (simple and cost print parts of extended)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            df.explain(mode)
        plans.append(buf.getvalue())
    rows = df.select("key", "value", "topic", "partition", "offset").collect()
    plans.append(df._jdf.queryExecution().toString())
    plans.append(df._jdf.queryExecution().executedPlan().toString())
    by_config = session.read.format("kafka-remote").options(subscribe=secured.topic,
                                                             config=str(secured.config)).load()
    n_by_config = by_config.count()
    plans.append(by_config._jdf.queryExecution().toString())
    # A principal without READ on the metadata topic: the driver names the missing ACL.
    user = "sparknoread"
    secured.kc.add_scram_user(user, f"{user}-{uuid.uuid4().hex}")
    grant(secured.kc, user, (RT.TOPIC, secured.md_topic, OP.DESCRIBE_CONFIGS),
          (RT.TOPIC, secured.md_topic, OP.WRITE), (RT.TOPIC, secured.topic, OP.DESCRIBE))
    denied_options = {**options, **{f"kafka.{k}": str(v) for k, v in secured.kc.security_config(user).items()}}
    try:
        session.read.format("kafka-remote").options(**denied_options).load().count()
        denied_error = ""
    except Exception as err:  # noqa: BLE001 - what Spark raises for the driver's error is checked by the test
        denied_error = str(err)
    yield rows, plans, n_by_config, denied_error


def test_spark_reads_through_sasl_ssl(secured: Secured, spark_read: Any) -> None:
    rows, _plans, n_by_config, _denied = spark_read
    got = {r["offset"]: (bytes(r["key"]), bytes(r["value"])) for r in rows}
    assert got == secured.sent  # byte-exact
    assert {(r["topic"], r["partition"]) for r in rows} == {(secured.topic, 0)}
    assert n_by_config == len(secured.sent)


def test_spark_plans_hold_no_password(secured: Secured, spark_read: Any) -> None:
    """Spark prints no option of a Python data source in its plans (``BatchScan kafka-remote``), so the
    ``kafka.sasl.password`` option appears in none of them: not thanks to ``spark.redaction.regex``."""
    _rows, plans, _n, _denied = spark_read
    password = secured.kc.sasl_users[SCRAM_PRINCIPAL]
    assert "kafka-remote" in plans[0] and "kafka-remote" in plans[3]  # the plans are about this source (before and
    # after it ran)
    for plan in plans:
        assert password not in plan
        assert "sasl.password" not in plan


def test_spark_without_read_on_the_metadata_topic_is_named(secured: Secured, spark_read: Any) -> None:
    denied = spark_read[3]
    assert f"not authorized: READ on topic {secured.md_topic} for principal User:sparknoread" in denied, denied


# ------------------------------------------------------------------------------------------ missing ACLs
@pytest.fixture(scope="module")
def denied(secured: Secured, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Commands run by principals that each lack one ACL (users created through the admin API)."""
    kc, tmp = secured.kc, tmp_path_factory.mktemp("denied")
    raw = yaml.safe_load(secured.config.read_text())
    runs: dict[str, Run] = {}

    def config_of(user: str, **extra: Any) -> Path:
        kc.add_scram_user(user, f"{user}-{uuid.uuid4().hex}")
        metadata = extra.pop("metadata", raw["metadata"])
        r = {**raw, **extra, "metadata": {**metadata, "state_dir": str(tmp / f"state-{user}")}}
        return write_config(tmp / f"{user}.yaml", r, kc.security_config(user))

    md, topic = secured.md_topic, secured.topic
    # No READ on the metadata topic.
    grant(kc, "noread", (RT.TOPIC, md, OP.DESCRIBE), (RT.TOPIC, md, OP.DESCRIBE_CONFIGS), (RT.TOPIC, md, OP.WRITE),
          (RT.TOPIC, topic, OP.DESCRIBE))
    runs["noread"] = rlm("cat", topic, "0", config=config_of("noread"))
    # Only reads: no WRITE on the metadata topic, no IDEMPOTENT_WRITE on the cluster. A reader's metadata manager has
    # no producer (before, its idempotent producer could not get a producer id: a 60 s hang, then an error).
    grant(kc, "reader", (RT.TOPIC, md, OP.READ), (RT.TOPIC, md, OP.DESCRIBE_CONFIGS), (RT.TOPIC, topic, OP.DESCRIBE))
    runs["reader"] = rlm("offsets", topic, "0", config=config_of("reader"))
    # No DESCRIBE on the data topic.
    grant(kc, "notopic", (RT.TOPIC, md, OP.READ), (RT.TOPIC, md, OP.WRITE), (RT.TOPIC, md, OP.DESCRIBE_CONFIGS))
    runs["notopic"] = rlm("offsets", topic, "0", config=config_of("notopic"))
    # rlm serve without WRITE on its to-be-deleted topic (everything else it needs granted).
    serve_listen = {"host": "127.0.0.1", "port": 0}
    grant(kc, "nowrite", (RT.TOPIC, md, OP.ALL), (RT.TOPIC, secured.tbd_topic, OP.READ),
          (RT.TOPIC, topic, OP.DESCRIBE), (RT.TOPIC, topic, OP.DESCRIBE_CONFIGS))
    grant(kc, "nowrite", (RT.GROUP, "rlm", OP.ALL), pattern=ResourcePatternType.PREFIXED)
    # (it would serve until killed if the check let it start)
    runs["nowrite"] = rlm("serve", config=config_of("nowrite", listen=serve_listen), timeout=120)
    # rlm serve whose topics do not exist yet, without CREATE: the broker's refusal, in one line.
    tag = uuid.uuid4().hex[:8]
    fresh = {**raw["metadata"], "topic": f"__rlm_md_{tag}", "to_be_deleted_topic": f"__rlm_tbd_{tag}"}
    grant(kc, "nocreate", (RT.TOPIC, fresh["topic"], OP.DESCRIBE), (RT.TOPIC, fresh["to_be_deleted_topic"],
                                                                    OP.DESCRIBE))
    runs["nocreate"] = rlm("serve", config=config_of("nocreate", listen=serve_listen, metadata=fresh), timeout=120)
    runs["nocreate"].stdout = fresh["topic"]
    secured.texts.extend(t for r in runs.values() for t in (r.stdout, r.stderr))
    return runs


def test_missing_read_on_the_metadata_topic_is_named(secured: Secured, denied: dict[str, Run]) -> None:
    r = denied["noread"]
    assert r.returncode == 5, r
    assert f"rlm: not authorized: READ on topic {secured.md_topic} for principal User:noread" in r.stderr
    assert "Traceback" not in r.stderr


def test_a_principal_that_only_reads_needs_no_write(secured: Secured, denied: dict[str, Run]) -> None:
    ok = json.loads(denied["reader"].ok())
    assert ok["latest_tiered_offset"] == max(secured.sent)


def test_missing_describe_on_the_topic_is_named(secured: Secured, denied: dict[str, Run]) -> None:
    r = denied["notopic"]
    assert r.returncode == 5, r
    assert f"rlm: not authorized: DESCRIBE on topic {secured.topic} for principal User:notopic" in r.stderr


def test_serve_without_write_on_its_topic_is_named(secured: Secured, denied: dict[str, Run]) -> None:
    r = denied["nowrite"]
    assert r.returncode == 5, r
    assert f"not authorized: WRITE on topic {secured.tbd_topic} for principal User:nowrite" in r.stderr


def test_serve_refused_creating_its_topic_says_so(denied: dict[str, Run]) -> None:
    r = denied["nocreate"]
    assert r.returncode == 5, r
    assert "not authorized on a topic for principal User:nocreate (TOPIC_AUTHORIZATION_FAILED)" in r.stderr
    assert f"cannot create metadata topic {r.stdout}" in r.stderr
    assert "Traceback" not in r.stderr


# -------------------------------------------------------------------------------------------- no password
def test_no_password_in_any_output_or_log(secured: Secured, spark_read: Any, denied: dict[str, Run]) -> None:
    kc = secured.kc
    passwords = {u: pw for u, pw in kc.sasl_users.items() if u != "admin"}  # the admin's is in server.properties
    assert SCRAM_PRINCIPAL in passwords and "noread" in passwords
    help_text = secured.runs["help"].ok()
    assert "--config" in help_text
    texts = [*secured.texts, help_text, *(t for r in secured.runs.values() for t in (r.stdout, r.stderr)),
             *spark_read[1], spark_read[3], kc.tail_logs(lines=100_000)]
    assert any("sidecar started" in t for t in texts) and any("DEBUG" in t for t in texts)  # the logs are in
    for text in texts:
        for user, pw in passwords.items():
            assert pw not in text, f"{user}'s password printed"
    # The files under the state directories (caches, gc state) hold none either.
    for path in secured.root.parent.rglob("*"):
        if path.is_file() and path.suffix not in (".yaml",) and path.stat().st_size < 10 * 1024 * 1024:
            data = path.read_bytes()
            for user, pw in passwords.items():
                assert pw.encode() not in data, f"{user}'s password in {path}"
