"""``config/sidecar.example.yaml`` says what the code does: it loads, and every value it sets is the default except
the site-specific ones listed here (each with the reason an operator must set it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from rlm.config import SidecarSettings, load_settings

EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "sidecar.example.yaml"

SITE_SPECIFIC = {
    "broker_id",  # the broker's node.id
    "log_dirs",  # the broker's log.dirs
    "kafka",  # the cluster's address and security (no default for bootstrap_servers)
    "store.block_size_bytes",  # shown for tuning: the default is the same 4 MiB (checked below)
    "retention",  # a rule set showing pattern order; the default is one rule for every topic
}


def _flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(f"{prefix}.{k}" if prefix else str(k), v))
        return out
    return {prefix: value}


def _default_of(path: str) -> Any:
    """The default of a dotted field of :class:`SidecarSettings` (the model's own default, no file involved)."""
    head, _, rest = path.partition(".")
    field = SidecarSettings.model_fields[head]
    value = field.get_default(call_default_factory=True)
    for part in rest.split(".") if rest else []:
        assert isinstance(value, BaseModel), path
        value = getattr(value, part)
    return value


def test_example_loads() -> None:
    settings = load_settings(EXAMPLE)
    assert settings.metadata.replication_factor == 3
    assert settings.listen.host == "127.0.0.1"


def _differences(raw: dict[str, Any]) -> list[str]:
    """The values ``raw`` (a config file's content) sets to something other than the default."""
    settings = SidecarSettings(**raw)
    differs = []
    for path, _value in _flatten("", raw).items():
        if path in SITE_SPECIFIC or path.split(".")[0] in SITE_SPECIFIC:
            continue
        loaded = settings
        for part in path.split("."):
            loaded = getattr(loaded, part)
        if loaded != _default_of(path):
            differs.append(f"{path}: example {loaded!r}, default {_default_of(path)!r}")
    return differs


def test_example_sets_defaults_except_site_specific_values() -> None:
    assert _differences(yaml.safe_load(EXAMPLE.read_text())) == []


def test_shown_tuning_values_are_the_defaults() -> None:
    settings = load_settings(EXAMPLE)
    assert settings.store.block_size_bytes == _default_of("store").block_size_bytes


def test_the_check_sees_a_difference() -> None:
    """Not vacuous: an example that changes a default is caught."""
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["tasks"]["copy_interval_ms"] = 12345
    raw["listen"]["host"] = "0.0.0.0"
    assert _differences(raw) == ["tasks.copy_interval_ms: example 12345, default 30000",
                                 "listen.host: example '0.0.0.0', default '127.0.0.1'"]
