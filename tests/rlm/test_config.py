from __future__ import annotations

from pathlib import Path

import pytest

from rlm.config import ConfigError, load_settings
from rlm.logs import kafka_logger

GOOD = """
broker_id: 1
log_dirs: [/var/lib/kafka/data]
kafka:
  bootstrap_servers: 127.0.0.1:9092
  client: {security.protocol: SASL_SSL, sasl.mechanism: PLAIN}
retention:
  - {pattern: "orders\\\\..*", retention_ms: 1000, retention_bytes: 5000}
  - {pattern: ".*", retention_ms: -1}
topics: {include: [".*"], exclude: ["tmp-.*"], paused: ["slow"]}
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "sidecar.yaml"
    p.write_text(text)
    return p


def test_good_config_and_rules(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, GOOD))
    assert s.kafka.client_config(**{"group.id": "g"}) == {
        "bootstrap.servers": "127.0.0.1:9092", "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
        "group.id": "g", "logger": kafka_logger()}  # librdkafka's log lines go to our logging
    assert s.retention_for("orders.eu").retention_bytes == 5000
    assert s.retention_for("clicks").retention_ms == -1
    assert s.topics.tiered("orders.eu") and not s.topics.tiered("tmp-1") and not s.topics.tiered("__consumer_offsets")
    assert s.topics.is_paused("slow") and not s.topics.is_paused("slower")


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ("tasks: {copy_interval_ms: 5}", "tasks.copy_interval_ms"),
        ("topics: {include: ['(']}", "topics.include"),
        ("unknown_key: 1", "unknown_key"),
        ("metadata: {partitions: 0}", "metadata.partitions"),
    ],
)
def test_bad_field_is_named(tmp_path: Path, patch: str, field: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_settings(write(tmp_path, GOOD + patch + "\n"))
    assert field in str(exc.value) and "sidecar.yaml" in str(exc.value)


def test_retired_cleaner_interval_is_ignored(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``tasks.cleaner_interval_ms`` was never read: a file that still sets it loads, with a warning naming it."""
    s = load_settings(write(tmp_path, GOOD + "tasks: {cleaner_interval_ms: 300, copy_interval_ms: 2500}\n"))
    assert s.tasks.copy_interval_ms == 2500 and not hasattr(s.tasks, "cleaner_interval_ms")
    assert "tasks.cleaner_interval_ms" in caplog.text


def test_config_error_is_an_rlm_error(tmp_path: Path) -> None:
    from rlm.errors import RlmError

    with pytest.raises(RlmError):
        load_settings(write(tmp_path, GOOD + "unknown_key: 1\n"))


def test_reserved_client_key_refused(tmp_path: Path) -> None:
    text = GOOD.replace("sasl.mechanism: PLAIN", "group.id: mine")
    with pytest.raises(ConfigError, match="kafka.client"):
        load_settings(write(tmp_path, text))


def test_missing_required_and_bad_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="broker_id"):
        load_settings(write(tmp_path, "log_dirs: [/x]\nkafka: {bootstrap_servers: a:1}\n"))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(write(tmp_path, "a: [\n"))
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "absent.yaml")


def test_environment_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLM_KAFKA__BOOTSTRAP_SERVERS", "10.0.0.1:9093")
    monkeypatch.setenv("RLM_TASKS__COPY_INTERVAL_MS", "2500")
    s = load_settings(write(tmp_path, GOOD))
    assert s.kafka.bootstrap_servers == "10.0.0.1:9093"
    assert s.kafka.client["security.protocol"] == "SASL_SSL"  # the rest of the section comes from the file
    assert s.tasks.copy_interval_ms == 2500


def test_example_config_loads() -> None:
    from devtools.devkafka import project_root

    s = load_settings(project_root() / "config" / "sidecar.example.yaml")
    assert s.store.store == "fs" and s.metadata.topic == "__remote_log_metadata"
    assert s.retention_for("audit.x").retention_ms == -1


def test_store_field_errors_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"store\.block_size_bytes"):
        load_settings(write(tmp_path, GOOD + "store: {store: fs, root_path: /x, block_size_bytes: 1}\n"))
