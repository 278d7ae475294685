"""Encryption at rest end to end: a real broker, the sidecar tiering with ``store.encryption`` enabled, and the
operator CLI (``rlm cat`` / ``rlm verify``, their own processes) reading the encrypted copies back byte-exact.

Expectations come from what was produced, never from the read path under test."""

from __future__ import annotations

import base64
import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from rsm.format.crypto import SEALED_INDEX_MAGIC
from tests.support.processes import json_lines, ok, rlm
from tests.support.sidecar import latest_remote, make_settings, produce_segments, settings_yaml, wait_for

pytestmark = [pytest.mark.kafka]

KEY1 = bytes(range(32))
KEY2 = bytes(range(100, 132))


def b64(v: bytes) -> str:
    return base64.b64encode(v).decode()


def write_keys(path: Path, keys: dict[str, bytes]) -> Path:
    path.write_text(json.dumps({k: b64(v) for k, v in keys.items()}))
    return path


@dataclass
class Encrypted:
    tmp: Path
    config: Path
    settings: Any
    root: Path
    topic: str
    sent: dict[int, tuple[bytes, bytes]]
    key_file: Path


@pytest.fixture(scope="module")
def encrypted(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Encrypted:
    tmp = tmp_path_factory.mktemp("enc-e2e")
    topic = f"enc-{uuid.uuid4().hex[:8]}"
    topic_id = kafka.create_topic(topic, 1, config={"segment.ms": "300"})
    sent = produce_segments(kafka, topic, 3, 150, segment_ms=300, value_size=120)
    key_file = write_keys(tmp / "keys.json", {"k1": KEY1})
    settings = make_settings(kafka, tmp, topics={"include": [re.escape(topic)]},
                             store={"encryption": {"enabled": True, "active_key_id": "k1",
                                                   "key_file": str(key_file)}})
    config = tmp / "sidecar.yaml"
    config.write_text(settings_yaml(settings))
    with Sidecar(settings) as sidecar:
        tp = TopicIdPartition(topic_id, topic, 0)
        wait_for(lambda: latest_remote(sidecar, tp) >= max(sent), 180, f"{tp} to be remote")
    return Encrypted(tmp, config, settings, tmp / "remote", topic, sent, key_file)


def cat_records(e: Encrypted, config: Path | None = None) -> dict[int, tuple[bytes, bytes]]:
    out = ok(rlm("cat", e.topic, "0", "--from-offset", "0", config=config or e.config))
    return {r["offset"]: (base64.b64decode(r["key"]), base64.b64decode(r["value"])) for r in json_lines(out)}


def config_with(e: Encrypted, name: str, **encryption: Any) -> Path:
    raw = json.loads(json.dumps(e.settings.model_dump(mode="json", exclude_none=True)))
    raw["store"]["encryption"] = encryption
    path = e.tmp / name
    import yaml

    path.write_text(yaml.safe_dump(raw))
    return path


def test_rlm_cat_reads_encrypted_copies_byte_exact(encrypted: Encrypted) -> None:
    e = encrypted
    # every copy is sealed, and no produced value is in the store in the clear
    index_files = [p for p in e.root.rglob("*-index")]
    data_files = [p for p in e.root.rglob("*") if p.is_file() and not p.name.endswith("-index")
                  and ".tmp" not in p.parts]
    assert len(index_files) >= 3 and data_files
    for p in index_files:
        assert int.from_bytes(p.read_bytes()[:4], "big") == SEALED_INDEX_MAGIC, p
    stored = b"".join(p.read_bytes() for p in data_files)
    for offset in list(e.sent)[::37]:
        assert e.sent[offset][1] not in stored
    # byte-exact through the CLI, which decrypts with the key file named in the config
    assert cat_records(e) == e.sent
    # keys needed only to read: a config with encryption off but the key file still reads
    assert cat_records(e, config_with(e, "read-only-keys.yaml", key_file=str(e.key_file))) == e.sent
    out = ok(rlm("verify", e.topic, config=e.config))
    assert out.strip().splitlines()[-1].endswith(" ok, 0 bad"), out


def test_rotated_keys_read_old_copies_and_a_missing_key_id_is_named(encrypted: Encrypted) -> None:
    e = encrypted
    rotated = write_keys(e.tmp / "rotated.json", {"k1": KEY1, "k2": KEY2})
    cfg = config_with(e, "rotated.yaml", enabled=True, active_key_id="k2", key_file=str(rotated))
    assert cat_records(e, cfg) == e.sent  # copies written under k1 stay readable with k2 active
    only_new = write_keys(e.tmp / "only-new.json", {"k2": KEY2})
    cfg = config_with(e, "only-new.yaml", enabled=True, active_key_id="k2", key_file=str(only_new))
    proc = rlm("cat", e.topic, "0", "--from-offset", "0", config=cfg)
    assert proc.returncode != 0 and proc.stdout == ""
    assert "key id 'k1'" in proc.stderr and "not configured" in proc.stderr, proc.stderr
    # no key material in anything the CLI printed or the config files hold
    for text in (proc.stdout, proc.stderr, cfg.read_text(), e.config.read_text()):
        for key in (KEY1, KEY2):
            assert b64(key) not in text and key.hex() not in text
    no_keys = config_with(e, "no-keys.yaml")
    proc = rlm("cat", e.topic, "0", "--from-offset", "0", config=no_keys)
    assert proc.returncode != 0 and "key id 'k1'" in proc.stderr, proc.stderr


def test_a_flipped_byte_fails_rlm_cat_naming_the_object(encrypted: Encrypted) -> None:
    e = encrypted
    index = sorted(e.root.rglob("*-index"))[-1]
    (data_path,) = [p for p in index.parent.iterdir() if p.name == index.name[:-len("-index")]]
    raw = bytearray(data_path.read_bytes())
    raw[200] ^= 0x01  # inside the first sealed block
    data_path.write_bytes(bytes(raw))
    key = str(data_path.relative_to(e.root))
    try:
        proc = rlm("cat", e.topic, "0", "--from-offset", "0", config=e.config)
        assert proc.returncode != 0, proc.stdout[-500:]
        assert key in proc.stderr and "block 0" in proc.stderr and "fails authentication" in proc.stderr, \
            proc.stderr
        out = rlm("verify", e.topic, config=e.config)
        bad = [line for line in out.stdout.splitlines() if line.startswith("BAD ")]
        assert len(bad) == 1 and key in bad[0] and "block 0" in bad[0], out.stdout
    finally:
        raw[200] ^= 0x01
        data_path.write_bytes(bytes(raw))


def test_sidecar_config_encryption_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlm.config import ConfigError, load_settings

    key_file = write_keys(tmp_path / "keys.json", {"k1": KEY1, "k2": KEY2})
    base = {"broker_id": 1, "log_dirs": [str(tmp_path / "logs")], "kafka": {"bootstrap_servers": "127.0.0.1:9"},
            "store": {"store": "fs", "root_path": str(tmp_path / "remote"),
                      "encryption": {"enabled": True, "active_key_id": "k1", "key_file": str(key_file)}}}
    path = tmp_path / "sidecar.yaml"
    path.write_text(json.dumps(base))
    enc = load_settings(path).store.encryption
    assert enc.enabled and enc.active_key_id == "k1" and enc.key_file == key_file
    # rotation from the environment, as any other field
    monkeypatch.setenv("RLM_STORE__ENCRYPTION__ACTIVE_KEY_ID", "k2")
    assert load_settings(path).store.encryption.active_key_id == "k2"
    monkeypatch.delenv("RLM_STORE__ENCRYPTION__ACTIVE_KEY_ID")
    del base["store"]["encryption"]["active_key_id"]
    path.write_text(json.dumps(base))
    with pytest.raises(ConfigError, match=r"store\.encryption: .*enabled needs active_key_id"):
        load_settings(path)
