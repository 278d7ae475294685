"""Secrets under ``kafka.client`` (sasl.password, ssl.key.password ...) are SecretStr: never in repr, str,
model_dump, config errors, the metadata manager's config or the Spark options' repr; unwrapped for the clients."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from pydantic import SecretStr

from rlm.config import ConfigError, load_settings
from rlm.kafka_secrets import MASK, RedactedConfig, is_secret_client_property, redacted
from rlm.rlmm_config import sidecar_rlmm_config
from rlm.spark.options import parse_options

PASSWORD = "pw-7f3a9c1e-do-not-print"
KEY_PASSWORD = "kp-55d0b2-do-not-print"


def write_config(tmp_path: Path, extra: str = "") -> Path:
    p = tmp_path / "sidecar.yaml"
    p.write_text(f"""
broker_id: 1
log_dirs: [{tmp_path / "data"}]
kafka:
  bootstrap_servers: 127.0.0.1:9093
  client:
    security.protocol: SASL_SSL
    sasl.mechanism: SCRAM-SHA-512
    sasl.username: rlm
    sasl.password: {PASSWORD}
    ssl.key.password: {KEY_PASSWORD}
metadata:
  state_dir: {tmp_path / "state"}
{extra}""")
    return p


@pytest.mark.parametrize("name,secret", [
    ("sasl.password", True), ("ssl.key.password", True), ("ssl.keystore.password", True),
    ("sasl.oauthbearer.client.secret", True), ("ssl.key.pem", True), ("sasl.oauthbearer.config", True),
    ("sasl.username", False), ("ssl.ca.location", False), ("security.protocol", False),
    ("ssl.key.location", False)])
def test_secret_properties(name: str, secret: bool) -> None:
    assert is_secret_client_property(name) is secret


def test_settings_never_show_the_password(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    s = load_settings(write_config(tmp_path))
    assert isinstance(s.kafka.client["sasl.password"], SecretStr)
    assert s.kafka.client["sasl.username"] == "rlm"  # not a secret: as given
    logging.getLogger("test").warning("settings %s %r", s, s.kafka)
    shown = [repr(s), str(s), repr(s.kafka), str(s.kafka.client), s.model_dump_json(), str(s.model_dump()),
             json.dumps(s.model_dump(mode="json")), caplog.text]
    for text in shown:
        assert PASSWORD not in text and KEY_PASSWORD not in text
    assert s.model_dump(mode="json")["kafka"]["client"]["sasl.password"] == MASK
    # ... and the clients get the real values
    conf = s.kafka.client_config()
    assert conf["sasl.password"] == PASSWORD and conf["ssl.key.password"] == KEY_PASSWORD
    assert PASSWORD not in repr(conf) and PASSWORD not in str(conf) and MASK in repr(conf)
    assert dict(conf)["sasl.password"] == PASSWORD and {**conf}["sasl.password"] == PASSWORD


def test_password_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLM_KAFKA__CLIENT", json.dumps({"sasl.password": "env-" + PASSWORD}))
    s = load_settings(write_config(tmp_path))
    assert s.kafka.client_config()["sasl.password"] == "env-" + PASSWORD
    assert s.kafka.client_config()["sasl.username"] == "rlm"  # the file's other properties stay
    assert PASSWORD not in repr(s) and PASSWORD not in s.model_dump_json()


def test_config_error_does_not_echo_the_password(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(write_config(tmp_path, "tasks:\n  copy_interval_ms: nope\n"))
    assert "tasks.copy_interval_ms" in str(err.value)
    assert PASSWORD not in str(err.value)
    with pytest.raises(ConfigError) as err:  # a bad kafka.client itself
        load_settings(write_config(tmp_path).parent / "sidecar.yaml", kafka={
            "bootstrap_servers": "a:1", "client": {"sasl.password": PASSWORD, "group.id": "g"}})
    assert "kafka.client" in str(err.value) and PASSWORD not in str(err.value)


def test_metadata_manager_config_masks_the_password(tmp_path: Path) -> None:
    cfg = sidecar_rlmm_config(load_settings(write_config(tmp_path)))
    assert cfg.client_config["sasl.password"] == PASSWORD  # what librdkafka gets
    assert PASSWORD not in repr(cfg) and PASSWORD not in str(cfg)


def test_spark_options_mask_the_password(tmp_path: Path) -> None:
    opts = parse_options({"subscribe": "t", "kafka.bootstrap.servers": "127.0.0.1:9093",
                          "kafka.sasl.password": PASSWORD, "store": "fs", "store.root_path": str(tmp_path)})
    assert dict(opts.client_config)["sasl.password"] == PASSWORD
    assert PASSWORD not in repr(opts)
    from_file = parse_options({"subscribe": "t", "config": str(write_config(tmp_path))})
    assert dict(from_file.client_config)["sasl.password"] == PASSWORD
    assert PASSWORD not in repr(from_file)


def test_redacted_config_pickles_with_its_values() -> None:
    import pickle

    conf = RedactedConfig({"sasl.password": PASSWORD, "sasl.username": "u"})
    back = pickle.loads(pickle.dumps(conf))
    assert back == conf and isinstance(back, RedactedConfig)
    assert redacted(conf) == {"sasl.password": MASK, "sasl.username": "u"}
