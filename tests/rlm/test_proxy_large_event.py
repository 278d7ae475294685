"""A 200 MiB record read through the proxy (issues 24 and 26, PDP-43): tiered by ``rlm serve``, deleted from the
broker (DeleteRecords), then read by consumers through the sidecar's listener in proxy mode, byte-exact (and
``check.crcs``), with the sidecar's peak RSS above idle bounded as the history endpoint's is
(``tests/rlm/test_large_event.py``): the batch is read from the store and written to the socket a chunk at a time on
both of the proxy's tier paths, never held whole (both called ``bytes()`` on it: +200 MiB).

- a consumer from offset 0: its first Fetch reaches the broker (OFFSET_OUT_OF_RANGE, the tier's part merged into the
  broker's answer: :func:`rlm.listener.tier.boundary.fetch_below_log_start`), which carries the small records before
  the big one; the Fetch of the big record is answered from the tier alone (the bounds known:
  :func:`rlm.listener.tier.boundary.fetch_from_tier`);
- a consumer assigned at the big record's offset, on a connection of its own (no bounds known): its first Fetch
  reaches the broker, and the big batch comes in the merged answer.

Its own broker, ``test_large_event``'s (``kafka_big``: ``socket.request.max.bytes`` is static).
"""

from __future__ import annotations

import hashlib
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from devtools.devkafka import free_port
from tests.support.bigbatch import (
    peak_above_idle,
    reset_peak,
    value_chunks,
)
from tests.support.bigrecord import BIG_RECORD_LIMIT, index_objects, listening
from tests.support.kafka import partition_dir, produce, roll_and_wait, rolled_logs
from tests.support.processes import serve
from tests.support.sidecar import make_settings, settings_yaml, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MiB = 1 << 20
BIG = 200 * MiB
LIMIT = BIG_RECORD_LIMIT
READ_BOUND = 96 * MiB  # the history endpoint's bound for the same read (test_large_event)


def _read(port: int, topic: str, offset: int, until: bytes) -> dict[int, tuple[bytes | None, str, int]]:
    """A consumer through the proxy from ``offset`` up to the record keyed ``until``: offset -> (key, sha256 of the
    value, its length)."""
    c = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": f"g-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "check.crcs": True, "fetch.wait.max.ms": 100,
                  "fetch.max.bytes": LIMIT, "max.partition.fetch.bytes": LIMIT,
                  "receive.message.max.bytes": LIMIT + MiB})
    got: dict[int, tuple[bytes | None, str, int]] = {}
    try:
        c.assign([TopicPartition(topic, 0, offset)])
        deadline = time.monotonic() + 300
        while not any(k == until for k, *_ in got.values()):
            assert time.monotonic() < deadline, sorted(got)
            msg = c.poll(1.0)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            v = msg.value() or b""
            got[msg.offset()] = (msg.key(), hashlib.sha256(v).hexdigest(), len(v))
            del v, msg
    finally:
        c.close()
    return got


def test_a_200_mib_record_is_read_through_the_proxy_in_bounded_memory(kafka_big, tmp_path):
    topic = f"large-proxy-{uuid.uuid4().hex[:8]}"
    kafka_big.create_topic(topic, 1, 1, {"max.message.bytes": str(LIMIT), "segment.bytes": str(2 * LIMIT),
                                         "segment.ms": "500", "retention.ms": "-1"})
    port = free_port()
    settings = make_settings(kafka_big, tmp_path, topics={"include": [topic]},
                             store={"block_size_bytes": 4 * MiB},
                             listen={"host": "127.0.0.1", "port": free_port()},
                             history_listener={"host": "127.0.0.1", "port": port, "proxy": True,
                                               "authorization": {"allow_if_no_authorizer": True}})
    config = tmp_path / "sidecar.yaml"
    config.write_text(settings_yaml(settings))
    remote = Path(settings.store.root_path)
    sidecar = serve(config, tmp_path / "serve.log")
    try:
        wait_for(lambda: listening(port), 120, "rlm serve's listener")
        small = [(b"k%d" % i, b"small-%d" % i) for i in range(10)]
        produce(kafka_big, topic, small)
        roll_and_wait(kafka_big, topic, rolled=1, segment_ms=500)
        wait_for(lambda: index_objects(remote) >= 1, 120, "the first segment tiered")

        value = b"".join(value_chunks(BIG))
        want_digest = hashlib.sha256(value).hexdigest()
        p = Producer({"bootstrap.servers": kafka_big.bootstrap_servers, "message.max.bytes": LIMIT,
                      "compression.type": "none", "linger.ms": 0, "message.timeout.ms": 120_000})
        errors: list[object] = []
        p.produce(topic, key=b"big", value=value, on_delivery=lambda err, _m: err and errors.append(err))
        del value
        after = [(b"after%d" % i, b"small-after-%d" % i) for i in range(5)]
        for k, v in after:
            p.produce(topic, key=k, value=v, on_delivery=lambda err, _m: err and errors.append(err))
        assert p.flush(120) == 0 and not errors, errors
        pdir = partition_dir(kafka_big, topic)
        logs = roll_and_wait(kafka_big, topic, rolled=len(rolled_logs(pdir)) + 1, segment_ms=500, timeout=120)
        wait_for(lambda: index_objects(remote) >= len(logs), 300, "the big record's segment tiered")
        # Every tiered offset only in the tier: the broker's log start moved to its active segment's first offset.
        active = max(int(f.stem) for f in pdir.glob("*.log"))
        admin = AdminClient({"bootstrap.servers": kafka_big.bootstrap_servers})
        for fut in admin.delete_records([TopicPartition(topic, 0, active)]).values():
            fut.result(60)

        time.sleep(1)
        idle = reset_peak(sidecar.pid)
        from_start = _read(port, topic, 0, b"after4")
        (big_offset,) = [o for o, r in from_start.items() if r[0] == b"big"]
        at_big = _read(port, topic, big_offset, b"after4")
        read_peak = peak_above_idle(idle, sidecar.pid)
    finally:
        sidecar.terminate()
        try:
            sidecar.wait(60)
        except subprocess.TimeoutExpired:
            sidecar.kill()
            sidecar.wait(60)
            raise AssertionError("rlm serve did not stop within 60 s of SIGTERM") from None

    def digests(records: list[tuple[bytes, bytes]]) -> dict[bytes, tuple[str, int]]:
        return {k: (hashlib.sha256(v).hexdigest(), len(v)) for k, v in records}

    for got in (from_start, at_big):
        assert [r for r in got.values() if r[0] == b"big"] == [(b"big", want_digest, BIG)]
        assert {r[0]: r[1:] for r in got.values() if r[0].startswith(b"after")} == digests(after)
    assert {r[0]: r[1:] for r in from_start.values() if r[0].startswith(b"k")} == digests(small)
    assert sorted(from_start) == list(range(len(from_start)))  # every offset from 0 once (roll fillers included)
    print(f"sidecar (proxy) peak above idle over both reads: {read_peak / MiB:.1f} MiB")
    assert read_peak <= READ_BOUND
