"""A real Apache Kafka cluster (KRaft) on 127.0.0.1 for tests, the demo and benchmarks.

The jars come from Maven Central through ``config/kafka-pom.xml`` and are cached under ``.cache/kafka/``
(ignored by git). Node 1 is broker+controller (a static one-voter quorum); nodes 2.. are brokers only.
Every node gets free ports, its own ``log.dirs`` under a temp directory and small segment/roll settings so
tests see rolled segments quickly.

This module lives in the source checkout (``devtools/``), not in the installed ``rlm`` package: the tests import
it from the repository root, ``./dev`` puts the checkout on ``PYTHONPATH`` for the demo and the benchmarks.

Usage::

    with KafkaCluster(brokers=1) as kc:
        kc.bootstrap_servers          # "127.0.0.1:PORT,..."
        kc.log_dir(1)                 # Path of node 1's log dir
        kc.run_class("org.apache.kafka.tools.consumer.ConsoleConsumer", [...])

The broker's own log is ``<node dir>/broker.log``; :meth:`KafkaCluster.tail_logs` returns it for failure
reports.

An authenticated cluster: ``KafkaCluster(sasl_users={"alice": "alice-secret"})`` serves SASL_PLAINTEXT with the
PLAIN mechanism on every listener (the controller's too) and authorizes with KRaft's ``StandardAuthorizer``
(no ACL = denied). The user :data:`ADMIN_USER` is added as the brokers' own identity and the only super user;
the other users start with no ACLs (grant them with ``AdminClient.create_acls`` on :meth:`KafkaCluster.admin_config`).
Client configurations::

    kc.admin_config()            # bootstrap + SASL settings of the super user (what create_topic uses)
    kc.client_config("alice")    # bootstrap + SASL settings of alice
    kc.security_config("alice")  # the SASL settings alone (e.g. for a sidecar's ``kafka.client``)

SASL_SSL with SCRAM: ``KafkaCluster(sasl_users={...}, sasl_mechanism="SCRAM-SHA-512", tls=True)``. A CA and a
broker certificate (``127.0.0.1``/``localhost``) are generated at start (:mod:`devtools.certs`, under
``<base dir>/tls``); every listener (the controller's too) speaks TLS. The client listener authenticates with
SCRAM-SHA-512, whose credentials (every user's, the admin's included) are written into the metadata log when the
storage is formatted (``kafka-storage format --add-scram``); the controller listener keeps PLAIN (over TLS).
``security_config(user)`` then holds ``security.protocol=SASL_SSL``, the mechanism and ``ssl.ca.location``
(:attr:`KafkaCluster.ca_file`).

The JVMs: every Kafka JVM maps the class-data sharing archive of its JDK and jars when there is one
(:mod:`devtools.cds`; ``./dev setup`` makes it with :func:`ensure_kafka_cds_archive`). ``jvm`` picks the rest
(:data:`JVM_PROFILES`): ``"throughput"`` (the default: G1 and both JIT tiers, the broker as in production, what the
benchmarks measure) or ``"quick"`` (the serial collector and the C1 compiler only: a broker's start and stop cost
~40% less CPU, 3.2-3.7 vs 5.1-6.0 s with the archive, 8.7-10.7 s with neither; the suite's brokers move little data
and start often). ``RLM_KAFKA_JVM`` sets the default; the
suite's fixtures plugin sets it to ``quick``.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from devtools import cds
from devtools.maven import resolve_jars

if TYPE_CHECKING:
    from devtools.certs import TlsFiles

__all__ = ["ADMIN_USER", "JVM_PROFILES", "LOG_TASKS_FROM_START", "KafkaCluster", "KafkaNode", "KafkaStartError",
           "ensure_kafka_cds_archive", "ensure_kafka_jars", "project_root"]

KB = 1024
MB = 1024 * KB

ADMIN_USER = "admin"  # with sasl_users: the brokers' own identity and the super user
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-512")
STANDARD_AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"

C1_ONLY = "-XX:TieredStopAtLevel=1"  # the client compiler alone: less compiling at start, slower peak code
JVM_PROFILES: dict[str, tuple[str, ...]] = {
    "throughput": ("-XX:+UseG1GC",),
    "quick": ("-XX:+UseSerialGC", C1_ONLY),
}
"""A broker's JVM options by ``KafkaCluster(jvm=...)``; the command-line tools always run C1 only."""


class KafkaStartError(RuntimeError):
    """The dev cluster could not resolve its jars or a node did not come up; the message has the log tail."""


def project_root() -> Path:
    """The checkout this module lives in, ``devtools/..`` (``config/`` and ``.cache/`` are resolved against it)."""
    return Path(os.environ.get("RLM_PROJECT_ROOT", Path(__file__).resolve().parents[1]))


def ensure_kafka_jars(root: Path | None = None) -> Path:
    """Resolve the Kafka jars with Maven once; return the directory that holds them.

    A marker file records the POM it was resolved from, so editing ``config/kafka-pom.xml`` re-resolves.
    ``RLM_KAFKA_VERSION`` overrides the POM's ``kafka.version`` (the suite against another Kafka:
    ``RLM_KAFKA_VERSION=4.3.1 ./dev test``), ``RLM_KAFKA_TOOLS_VERSION`` its ``kafka.tools.version`` (console tools
    and LocalTieredStorage); each combination has a cache of its own.
    """
    root = root or project_root()
    pom = root / "config" / "kafka-pom.xml"
    version = os.environ.get("RLM_KAFKA_VERSION", "").strip()
    tools = os.environ.get("RLM_KAFKA_TOOLS_VERSION", "").strip()
    tag = "-".join(v for v in (version, tools and f"tools{tools}") if v)
    default_cache = root / ".cache" / (f"kafka-{tag}" if tag else "kafka")
    cache = Path(os.environ.get("RLM_KAFKA_CACHE", default_cache))
    overrides = [*([f"-Dkafka.version={version}"] if version else []),
                 *([f"-Dkafka.tools.version={tools}"] if tools else [])]
    return resolve_jars(pom, cache, overrides=overrides, error=KafkaStartError, what="the Kafka jars")


def ensure_kafka_cds_archive() -> Path | None:
    """Make the class-data sharing archive of this JDK and the Kafka jars (:mod:`devtools.cds`) unless it exists:
    a one-broker cluster started with ``-XX:ArchiveClassesAtExit``, given a topic, a produce and a fetch, stopped
    cleanly. Returns the archive, or None when the JVM dumped none (the brokers then start without one)."""
    from confluent_kafka import Consumer, Producer

    kc = KafkaCluster(brokers=1, jvm="throughput")
    java = kc._java()
    if cds.archive_path(java, kc.libs).is_file():
        shutil.rmtree(kc.base_dir, ignore_errors=True)
        return cds.archive_path(java, kc.libs)
    kc._cds_dump = cds.dump_path(java, kc.libs)
    quiet = {"bootstrap.servers": kc.bootstrap_servers, "log_level": 0, "logger": _SilentLogger()}
    with kc:
        kc.create_topic("cds-training", partitions=2)
        producer = Producer({**quiet, "compression.type": "lz4"})
        for i in range(1000):
            producer.produce("cds-training", value=b"%d" % i, key=b"k%d" % (i % 7))
        producer.flush(30)
        del producer
        consumer = Consumer({**quiet, "group.id": "cds-training", "auto.offset.reset": "earliest"})
        consumer.subscribe(["cds-training"])
        deadline = time.monotonic() + 30
        seen = 0
        while seen < 1000 and time.monotonic() < deadline:
            seen += len(consumer.consume(500, timeout=1))
        consumer.close()
    archive = cds.finish_dump(kc._cds_dump)
    shutil.rmtree(kc.base_dir, ignore_errors=True)
    return archive


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# The broker's log manager starts its tasks (retention, the removal of deleted topics' logs, the checkpoints)
# log.initial.task.delay.ms after the broker starts: 30 s by default, so a broker just started deletes nothing for
# 30 s whatever a topic's retention. For a cluster whose user waits for retention (the tests' session broker, the
# demo): 1 s, the retention check interval below. Measured, run first on a fresh broker: test_proxy_pending_holes'
# tier test 38-40 s -> 12 s; `rlm demo --records 3000` 36-41 s -> 17-19 s.
LOG_TASKS_FROM_START: dict[str, str] = {"log.initial.task.delay.ms": "1000"}

# Broker settings for tests: small, fast-rolling segments and quick housekeeping. Callers override per cluster.
DEFAULT_BROKER_CONFIG: dict[str, str] = {
    "num.partitions": "1",
    "default.replication.factor": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "4",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "4",
    "group.initial.rebalance.delay.ms": "0",
    "log.segment.bytes": str(1 * MB),
    "log.roll.ms": str(10 * 60 * 1000),
    "log.retention.check.interval.ms": "1000",
    "log.segment.delete.delay.ms": "1000",
    "log.cleaner.backoff.ms": "1000",
    "log.flush.interval.messages": "1",
    "auto.create.topics.enable": "false",
    "delete.topic.enable": "true",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
}


@dataclass
class KafkaNode:
    node_id: int
    port: int
    controller_port: int | None
    directory: Path
    log_dirs: list[Path]
    process: subprocess.Popen | None = None
    config: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def roles(self) -> str:
        return "broker,controller" if self.controller_port else "broker"


class KafkaCluster:
    """Start ``brokers`` Kafka nodes as one KRaft cluster; stop them (and remove their data) on exit."""

    def __init__(
        self,
        brokers: int = 1,
        *,
        broker_config: Mapping[str, str] | None = None,
        log_dirs_per_broker: int = 1,
        base_dir: Path | None = None,
        heap: str = "512m",
        start_timeout_s: float = 120.0,
        keep_data: bool = False,
        sasl_users: Mapping[str, str] | None = None,
        sasl_mechanism: str = "PLAIN",
        tls: bool = False,
        jvm: str | None = None,
    ) -> None:
        if brokers < 1:
            raise ValueError("brokers must be >= 1")
        if sasl_mechanism not in SASL_MECHANISMS:
            raise ValueError(f"sasl_mechanism {sasl_mechanism!r}: one of {', '.join(SASL_MECHANISMS)}")
        if tls and sasl_users is None:
            raise ValueError("tls=True needs sasl_users (the dev cluster serves SASL_SSL, not SSL alone)")
        self.jvm = jvm or os.environ.get("RLM_KAFKA_JVM", "").strip() or "throughput"
        if self.jvm not in JVM_PROFILES:
            raise ValueError(f"jvm {self.jvm!r}: one of {', '.join(JVM_PROFILES)}")
        self._cds_dump: Path | None = None  # ensure_kafka_cds_archive's run: the archive node 1 dumps at exit
        self.sasl_mechanism = sasl_mechanism
        self.tls = tls
        # user -> password of an authenticated cluster (SASL_PLAINTEXT/PLAIN + StandardAuthorizer), else None
        self.sasl_users: dict[str, str] | None = None
        if sasl_users is not None:
            if ADMIN_USER in sasl_users:
                raise ValueError(f"{ADMIN_USER!r} is the cluster's own super user: choose another name")
            self.sasl_users = {ADMIN_USER: f"{ADMIN_USER}-{uuid.uuid4().hex[:12]}", **sasl_users}
        self.libs = ensure_kafka_jars()
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="rlm-kafka-"))
        self.cluster_id = _kafka_uuid()
        self.heap = heap
        self.start_timeout_s = start_timeout_s
        self.keep_data = keep_data
        self.overrides = dict(DEFAULT_BROKER_CONFIG)
        if brokers > 1:
            rf = str(min(brokers, 3))
            self.overrides.update({
                "offsets.topic.replication.factor": rf,
                "transaction.state.log.replication.factor": rf,
                "share.coordinator.state.topic.replication.factor": rf,
            })
        self.overrides.update(broker_config or {})
        self.nodes: list[KafkaNode] = []
        controller_port = free_port()
        for i in range(1, brokers + 1):
            d = self.base_dir / f"node-{i}"
            dirs = [d / f"data-{j}" for j in range(log_dirs_per_broker)]
            self.nodes.append(KafkaNode(i, free_port(), controller_port if i == 1 else None, d, dirs))
        self.controller_port = controller_port
        self.tls_files: TlsFiles | None = None

    # ----------------------------------------------------------------------------------------- lifecycle
    def __enter__(self) -> KafkaCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.address for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return self.nodes[node_id - 1]

    def log_dir(self, node_id: int = 1, index: int = 0) -> Path:
        return self.node(node_id).log_dirs[index]

    def _java(self) -> str:
        java_home = os.environ.get("JAVA_HOME")
        java = Path(java_home) / "bin" / "java" if java_home else shutil.which("java")
        if not java:
            raise KafkaStartError("java not found (set JAVA_HOME or put java on PATH)")
        return str(java)

    def java_cmd(self, main_class: str, args: Sequence[str], *, heap: str = "256m",
                 log_dir: Path | None = None, tool: bool = True) -> list[str]:
        """A java command line over the Kafka jars: the ``jvm`` profile's options, and ``tool`` trades peak speed for
        a fast start (C1 only); the class-data sharing archive when there is one."""
        log_cfg = project_root() / "config" / "kafka-log4j2.xml"
        java = self._java()
        opts = list(JVM_PROFILES[self.jvm])
        if tool and C1_ONLY not in opts:
            opts.append(C1_ONLY)
        return [
            java, f"-Xmx{heap}", *opts, *cds.use_options(java, self.libs),
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={log_cfg}",
            f"-Dkafka.logs.dir={log_dir or self.base_dir}",
            "-cp", f"{self.libs}/*", main_class, *args,
        ]

    def run_class(self, main_class: str, args: Sequence[str], *, timeout: float = 120.0,
                  input_text: str | None = None) -> subprocess.CompletedProcess:
        """Run one of Kafka's command-line classes (console consumer, storage tool...) against the jars."""
        return subprocess.run(self.java_cmd(main_class, args), capture_output=True, text=True,
                              timeout=timeout, input=input_text)

    @property
    def _listener(self) -> str:
        if self.sasl_users is None:
            return "PLAINTEXT"
        return "SASL_SSL" if self.tls else "SASL_PLAINTEXT"

    @property
    def ca_file(self) -> Path | None:
        """The CA certificate (PEM) clients trust on a TLS cluster (after :meth:`start`), else None."""
        return self.tls_files.ca_pem if self.tls_files is not None else None

    def _ensure_tls_files(self) -> TlsFiles:
        if self.tls_files is None:
            from devtools.certs import make_tls_files

            self.tls_files = make_tls_files(self.base_dir / "tls", f"ks-{uuid.uuid4().hex}")
        return self.tls_files

    def _sasl_properties(self) -> dict[str, str]:
        assert self.sasl_users is not None
        listener = self._listener
        users = " ".join(f'user_{u}="{pw}"' for u, pw in self.sasl_users.items())
        plain_jaas = (f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{ADMIN_USER}" '
                      f'password="{self.sasl_users[ADMIN_USER]}" {users};')
        mech = self.sasl_mechanism
        props = {
            "listener.security.protocol.map": f"{listener}:{listener},CONTROLLER:{listener}",
            f"listener.name.{listener.lower()}.sasl.enabled.mechanisms": mech,
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "sasl.mechanism.inter.broker.protocol": mech,
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config": plain_jaas,
            "authorizer.class.name": STANDARD_AUTHORIZER,
            "super.users": f"User:{ADMIN_USER}",
            "allow.everyone.if.no.acl.found": "false",
        }
        if mech == "PLAIN":
            props[f"listener.name.{listener.lower()}.plain.sasl.jaas.config"] = plain_jaas
        else:  # SCRAM: the credentials live in the metadata log (format --add-scram); this is the broker's own
            props[f"listener.name.{listener.lower()}.{mech.lower()}.sasl.jaas.config"] = (
                f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN_USER}" '
                f'password="{self.sasl_users[ADMIN_USER]}";')
        if self.tls:
            tls = self._ensure_tls_files()
            props.update({
                "ssl.keystore.type": "PKCS12",
                "ssl.keystore.location": str(tls.keystore_p12),
                "ssl.keystore.password": tls.keystore_password,
                "ssl.key.password": tls.keystore_password,
                "ssl.truststore.type": "PEM",
                "ssl.truststore.location": str(tls.ca_pem),
                "ssl.endpoint.identification.algorithm": "https",
            })
        return props

    def _properties(self, node: KafkaNode) -> dict[str, str]:
        listener = self._listener
        props = {
            "process.roles": node.roles,
            "node.id": str(node.node_id),
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": listener,
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "advertised.listeners": f"{listener}://{node.address}",
            "log.dirs": ",".join(str(p) for p in node.log_dirs),
            "metadata.log.dir": str(node.directory / "metadata"),
        }
        listeners = [f"{listener}://{node.address}"]
        if node.controller_port:
            listeners.append(f"CONTROLLER://127.0.0.1:{node.controller_port}")
        props["listeners"] = ",".join(listeners)
        if self.sasl_users is not None:
            props.update(self._sasl_properties())
        props.update(self.overrides)
        props.update(node.config)
        return props

    def _write_props(self, node: KafkaNode) -> Path:
        node.directory.mkdir(parents=True, exist_ok=True)
        path = node.directory / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in sorted(self._properties(node).items())))
        return path

    @staticmethod
    def _is_formatted(node: KafkaNode) -> bool:
        """Every dir of ``node`` holds its ``meta.properties``: ``format --ignore-formatted`` would do nothing."""
        return all((d / "meta.properties").is_file() for d in (node.directory / "metadata", *node.log_dirs))

    def _format(self, nodes: Sequence[KafkaNode]) -> None:
        """Format the storage of ``nodes`` (those not formatted yet), their storage tools run side by side."""
        scram = []
        if self.sasl_users is not None and self.sasl_mechanism.startswith("SCRAM-"):
            for user, pw in self.sasl_users.items():
                scram += ["--add-scram", f'{self.sasl_mechanism}=[name="{user}",password="{pw}"]']
        procs = []
        for node in nodes:
            if self._is_formatted(node):
                continue
            props = node.directory / "server.properties"
            args = ["format", f"--cluster-id={self.cluster_id}", "-c", str(props), "--ignore-formatted", *scram]
            procs.append((node, subprocess.Popen(
                self.java_cmd("kafka.tools.StorageTool", args, log_dir=node.directory),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)))
        failures = []
        for node, proc in procs:
            try:
                out, err = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, err = proc.communicate()
            if proc.returncode != 0:
                failures.append(f"formatting node {node.node_id} failed:\n{out}\n{err}")
        if failures:
            raise KafkaStartError("\n".join(failures))

    def start(self) -> None:
        try:
            for node in self.nodes:
                self._write_props(node)
            self._format(self.nodes)
            for node in self.nodes:
                self.start_node(node.node_id)
            self.wait_ready()
        except KafkaStartError as err:
            logs = self.tail_logs()
            self.stop()
            raise KafkaStartError(f"{err}\n{logs}") from None
        except BaseException:
            self.stop()
            raise

    def start_node(self, node_id: int) -> None:
        """(Re)start one node; its data is kept, so a stopped broker comes back with its logs (formatted only when a
        dir of it is not: a restart runs no storage tool)."""
        node = self.node(node_id)
        if node.process and node.process.poll() is None:
            return
        props = self._write_props(node)
        self._format([node])
        cmd = self.java_cmd("kafka.Kafka", [str(props)], heap=self.heap, log_dir=node.directory, tool=False)
        if self._cds_dump is not None and node_id == 1:
            cmd[1:1] = [f"-XX:ArchiveClassesAtExit={self._cds_dump}"]
        out = open(node.directory / "stdout.log", "ab")
        node.process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        start_new_session=True)
        out.close()

    def stop_node(self, node_id: int, *, kill: bool = False, timeout: float = 60.0) -> None:
        node = self.node(node_id)
        proc = node.process
        if proc is None or proc.poll() is not None:
            return
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)

    def stop(self) -> None:
        """Stop every node; remove the data unless it is kept (``keep_data``, or a ``base_dir`` given).

        Data that is kept gets a clean shutdown: the brokers first (all at once), the controller last, so that the
        brokers can shut down cleanly. Data about to be removed needs none: every node is killed (a 3-broker
        cluster's clean shutdown moves its leaders first: ~9 s)."""
        discard = self._own_dir and not self.keep_data and self._cds_dump is None
        brokers = [n for n in self.nodes if not n.controller_port]
        for node in brokers:
            if node.process and node.process.poll() is None and not discard:
                node.process.terminate()
        for node in [*brokers, *(n for n in self.nodes if n.controller_port)]:
            self.stop_node(node.node_id, kill=discard)
        if discard:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    # ------------------------------------------------------------------------------------------ readiness
    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until every node is registered and a metadata request lists all brokers."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + (timeout or self.start_timeout_s)
        admin = AdminClient({**self.admin_config(), "log_level": 0, "logger": _SilentLogger()})
        last_err: object = None
        while time.monotonic() < deadline:
            for node in self.nodes:
                if node.process and node.process.poll() is not None:
                    raise KafkaStartError(f"kafka node {node.node_id} exited with {node.process.returncode}")
            try:
                md = admin.list_topics(timeout=2)
                if len(md.brokers) == len(self.nodes):
                    return
                last_err = f"{len(md.brokers)} of {len(self.nodes)} brokers registered"
            except Exception as err:  # noqa: BLE001 - retried until the deadline
                last_err = err
            time.sleep(0.3)
        raise KafkaStartError(f"kafka cluster not ready after {timeout or self.start_timeout_s}s: {last_err}")

    def tail_logs(self, lines: int = 80) -> str:
        parts = []
        for node in self.nodes:
            for name in ("broker.log", "stdout.log"):
                path = node.directory / name
                if path.exists():
                    text = path.read_text(errors="replace").splitlines()[-lines:]
                    parts.append(f"----- node {node.node_id} {name} (last {len(text)} lines) -----")
                    parts.extend(text)
        return "\n".join(parts)

    # ---------------------------------------------------------------------------------------- conveniences
    def security_config(self, user: str = ADMIN_USER) -> dict[str, object]:
        """librdkafka's security settings for ``user`` ({} on a cluster without SASL)."""
        if self.sasl_users is None:
            return {}
        if user not in self.sasl_users:
            raise KeyError(f"no SASL user {user!r} on this cluster (users: {sorted(self.sasl_users)})")
        conf: dict[str, object] = {"security.protocol": self._listener, "sasl.mechanism": self.sasl_mechanism,
                                   "sasl.username": user, "sasl.password": self.sasl_users[user]}
        if self.tls:
            conf["ssl.ca.location"] = str(self._ensure_tls_files().ca_pem)
        return conf

    def add_scram_user(self, user: str, password: str, iterations: int = 4096) -> None:
        """Create (or change) a SCRAM user on the running cluster through the admin API (AlterUserScramCredentials,
        as the super user); :meth:`security_config` knows it afterwards. SCRAM clusters only."""
        from confluent_kafka.admin import (
            AdminClient,
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        if self.sasl_users is None or not self.sasl_mechanism.startswith("SCRAM-"):
            raise ValueError("add_scram_user needs a cluster started with sasl_mechanism='SCRAM-SHA-512'")
        mech = ScramMechanism.SCRAM_SHA_512 if self.sasl_mechanism == "SCRAM-SHA-512" else ScramMechanism.SCRAM_SHA_256
        admin = AdminClient({**self.admin_config(), "logger": logging.getLogger("devkafka.librdkafka")})
        upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(mech, iterations), password.encode())
        for fut in admin.alter_user_scram_credentials([upsert]).values():
            fut.result(30)
        self.sasl_users[user] = password

    def client_config(self, user: str = ADMIN_USER) -> dict[str, object]:
        """Bootstrap servers and ``user``'s security settings: a client configuration for confluent-kafka."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.security_config(user)}

    def admin_config(self) -> dict[str, object]:
        """A client configuration with every right: the super user's on an authenticated cluster."""
        return self.client_config(ADMIN_USER)

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1,
                     config: Mapping[str, str] | None = None, timeout: float = 30.0) -> uuid.UUID:
        """Create a topic and wait until every partition has a leader; return its topic id.

        The leaders are seen in one broker's metadata and the id asked of another, which may not know the topic yet
        (UNKNOWN_TOPIC_OR_PART: seen once on the 3-broker cluster): asked again until ``timeout``."""
        from confluent_kafka import KafkaError, KafkaException, TopicCollection
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({**self.admin_config(), "logger": logging.getLogger("devkafka.librdkafka")})
        fut = admin.create_topics([NewTopic(name, partitions, replication_factor, config=dict(config or {}))])
        fut[name].result(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            md = admin.list_topics(name, timeout=5).topics.get(name)
            if md and md.error is None and len(md.partitions) == partitions and all(
                p.leader >= 0 for p in md.partitions.values()
            ):
                try:
                    desc = admin.describe_topics(TopicCollection([name]))[name].result(timeout)
                except KafkaException as err:
                    if err.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise
                    time.sleep(0.1)
                    continue
                tid = desc.topic_id
                msb, lsb = tid.get_most_significant_bits(), tid.get_least_significant_bits()
                return uuid.UUID(int=((msb & (2**64 - 1)) << 64) | (lsb & (2**64 - 1)))
            time.sleep(0.1)
        raise KafkaStartError(f"topic {name} has no leader after {timeout}s")


class _SilentLogger:
    """librdkafka logs every refused connection while the broker starts; keep the test output clean."""

    def log(self, *args: object, **kwargs: object) -> None:
        return None

    def __getattr__(self, name: str):  # debug, info, warning... all no-ops
        return self.log


def _kafka_uuid() -> str:
    """A random cluster id in Kafka's URL-safe base64 form (22 chars, no padding)."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
