"""``rlm demo``: the sidecar end to end on this machine.

Starts a local Kafka broker (KRaft, from the Maven jars), creates a topic with small segments and short *local*
retention, starts the sidecar (filesystem store under ``demo-data/``), produces data, waits until the broker's own
retention has deleted the oldest segments, and then shows with ``rlm ls`` and ``rlm cat`` that those offsets,
gone from the broker, are still served from the remote tier.

The broker comes from the dev Kafka launcher, ``devtools/devkafka.py``, which lives in the source checkout and is
not part of the installed package: ``./dev demo`` puts the checkout on ``PYTHONPATH``; ``rlm demo`` from an
editable install finds the checkout next to the ``rlm`` package; from an installed wheel it stops with a message
saying to run ``./dev demo`` from a source checkout.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType

import yaml

from rlm.logs import kafka_logger, setup_logging

__all__ = ["DemoUnavailableError", "register", "run"]

# Where a source checkout would be if this package is imported from one (an editable install): ``<checkout>/rlm``.
CHECKOUT = Path(__file__).resolve().parents[2]

NOT_IN_CHECKOUT = ("rlm demo needs the dev Kafka launcher (devtools/devkafka.py), which is not part of the installed "
                   "package: run `./dev demo` from a source checkout of rlm-sidecar")


class DemoUnavailableError(RuntimeError):
    """``rlm demo`` runs outside a source checkout: the dev Kafka launcher is not installed."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the sidecar against a local broker and read back what the broker deleted")
    p.add_argument("--records", type=int, default=30_000, help="records to produce (default 30000)")
    p.add_argument("--topic", default="demo-events", help="topic name (default demo-events)")
    p.add_argument("--dir", default="demo-data", help="where the store, state and logs go (default ./demo-data)")
    p.add_argument("--keep", action="store_true", help="leave broker and sidecar running until Ctrl-C")
    p.set_defaults(func=run)


def _say(msg: str) -> None:
    print(f"demo: {msg}", flush=True)


def _broker_earliest(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "rlm-demo-probe", "logger": kafka_logger()})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)[0]
    finally:
        c.close()


def dev_kafka(checkout: Path | None = None) -> ModuleType:
    """``devtools.devkafka``: from ``sys.path`` (``./dev`` exports the checkout), else from ``checkout`` if it is one.

    Raises :class:`DemoUnavailableError` (message: run ``./dev demo`` from a source checkout) otherwise.
    """
    checkout = checkout or CHECKOUT
    try:
        from devtools import devkafka
    except ImportError:
        if not ((checkout / "devtools" / "devkafka.py").is_file() and (checkout / "pyproject.toml").is_file()):
            raise DemoUnavailableError(NOT_IN_CHECKOUT) from None
        sys.path.insert(0, str(checkout))
        try:
            from devtools import devkafka
        except ImportError as err:
            raise DemoUnavailableError(f"{NOT_IN_CHECKOUT} ({err})") from err
    return devkafka


def run(args: argparse.Namespace) -> int:
    try:
        devkafka = dev_kafka()
    except DemoUnavailableError as err:
        print(f"rlm: error: {err}", file=sys.stderr)
        return 2

    from confluent_kafka import Producer

    from rlm.cli import main as rlm_main
    from rlm.config import load_settings
    from rlm.http import OpsServer
    from rlm.sidecar import Sidecar
    from rlmm.api import TopicIdPartition

    base = Path(args.dir).resolve()
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(parents=True)
    setup_logging("INFO", "json")
    handler = logging.FileHandler(base / "sidecar.log")
    handler.setFormatter(logging.getLogger().handlers[0].formatter)
    logging.getLogger().handlers[:] = [handler]  # the console is for the demo's own lines

    _say("starting a local Kafka broker (KRaft) on 127.0.0.1 ...")
    # retention from the broker's start, not 30 s after it: the demo waits for retention
    with devkafka.KafkaCluster(brokers=1, base_dir=base / "kafka", broker_config=devkafka.LOG_TASKS_FROM_START) as kc:
        _say(f"broker up at {kc.bootstrap_servers}, log dir {kc.log_dir()}")
        local_retention_ms = 8000
        # file.delete.delay.ms at Kafka's default (the dev broker's is 1 s): a segment retention deletes lingers as
        # .deleted for a minute, as on a real broker, so the sidecar stages it even when it is slow (the "roll"
        # record's segment, deleted by retention with no roll before it, was lost once at 1 s on a loaded machine),
        # and the others are copied in place (rlm.tasks.in_place)
        topic_id = kc.create_topic(args.topic, 1, config={
            "segment.ms": "1000", "retention.ms": str(local_retention_ms), "file.delete.delay.ms": "60000"})
        _say(f"topic {args.topic} (id {topic_id}): segment.ms=1000, local retention.ms={local_retention_ms}")
        config = {
            "broker_id": 1,
            "log_dirs": [str(kc.log_dir())],
            "staging_dir": str(base / "staging"),
            "kafka": {"bootstrap_servers": kc.bootstrap_servers},
            "store": {"store": "fs", "root_path": str(base / "remote"), "block_size_bytes": 256 * 1024},
            "metadata": {"partitions": 5, "replication_factor": 1, "state_dir": str(base / "state")},
            "tasks": {"copy_interval_ms": 500, "discovery_interval_ms": 500, "expiration_interval_ms": 5000},
            "retention": [{"pattern": ".*", "retention_ms": -1, "retention_bytes": -1}],
            "listen": {"host": "127.0.0.1", "port": 0},
        }
        config_path = base / "sidecar.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        settings = load_settings(config_path)
        sidecar = Sidecar(settings).start()
        ops = OpsServer("127.0.0.1", 0, sidecar.health).start()
        _say(f"sidecar running: store {base / 'remote'}, metrics http://127.0.0.1:{ops.port}/metrics, "
             f"logs {base / 'sidecar.log'}")
        try:
            producer = Producer({"bootstrap.servers": kc.bootstrap_servers, "compression.type": "zstd",
                                 "linger.ms": 20, "logger": kafka_logger()})
            t0 = time.monotonic()
            for i in range(args.records):
                while True:
                    try:
                        producer.produce(args.topic, key=f"user-{i % 97}".encode(),
                                         value=json.dumps({"seq": i, "at": time.time()}).encode())
                        break
                    except BufferError:
                        producer.poll(0.05)
                if i % 2000 == 1999:
                    producer.flush()
                    time.sleep(0.3)  # let segment.ms pass now and then so the broker rolls segments
            producer.flush()
            _say(f"produced {args.records} records (offsets 0..{args.records - 1}) in "
                 f"{time.monotonic() - t0:.1f}s")
            time.sleep(1.1)
            producer.produce(args.topic, key=b"demo", value=b"roll")  # rolls the last data segment
            producer.flush()
            producer.close()  # before the broker stops: no client left retrying it
            tp = TopicIdPartition(topic_id, args.topic, 0)
            _say("waiting for the sidecar to tier every rolled segment and the broker to delete old ones ...")
            deadline = time.monotonic() + 180
            earliest = 0
            while time.monotonic() < deadline:
                earliest = _broker_earliest(kc.bootstrap_servers, args.topic)
                try:
                    latest_remote = sidecar.reader.latest_offset(tp) or -1
                except Exception:  # noqa: BLE001 - not served yet
                    latest_remote = -1
                if earliest > 0 and latest_remote >= args.records - 1:
                    break
                time.sleep(1)
            _say(f"the broker's earliest offset is now {earliest}: offsets 0..{earliest - 1} are gone locally")
            print(f"\n$ rlm ls {args.topic} 0 --config {config_path}", flush=True)
            rlm_main(["ls", args.topic, "0", "--config", str(config_path)])
            print(f"\n$ rlm cat {args.topic} 0 --from-offset 0 --max-records 5 --text --config {config_path}",
                  flush=True)
            rlm_main(["cat", args.topic, "0", "--from-offset", "0", "--max-records", "5", "--text",
                      "--config", str(config_path)])
            print(f"\n$ rlm offsets {args.topic} 0 --config {config_path}", flush=True)
            rlm_main(["offsets", args.topic, "0", "--config", str(config_path)])
            print(flush=True)
            _say(f"offset 0 is served from the remote tier although the broker starts at {earliest}")
            if args.keep:
                _say("broker and sidecar left running; Ctrl-C to stop")
                try:
                    while True:
                        time.sleep(1)
                except KeyboardInterrupt:
                    pass
        finally:
            sidecar.stop()
            ops.stop()
    _say(f"done; the remote store and logs stay in {base}")
    return 0
