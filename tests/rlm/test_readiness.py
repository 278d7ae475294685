"""Readiness and liveness (:func:`rlm.health.readiness`, :func:`rlm.health.liveness`) from made-up inputs."""

from __future__ import annotations

import math

from rlm.config import HealthSettings
from rlm.health import Margin, StoreHealth, liveness, readiness

NOW = 1_000_000.0


def _ready(**kwargs: object) -> tuple[bool, dict[str, dict[str, object]]]:
    args: dict[str, object] = {"discovery_interval_ms": 1000, "last_discovery_ok": NOW - 1, "last_error": None,
                               "not_caught_up": [], "log_dir_problems": {}, "store_probes": StoreHealth(),
                               "store_copies": StoreHealth(), "margins": {}, "now": NOW, **kwargs}
    return readiness(HealthSettings(), **args)  # type: ignore[arg-type]


def test_ready_when_every_check_passes() -> None:
    ok, checks = _ready(margins={"t-0": Margin(math.inf, math.inf, None)})
    assert ok and all(c["ok"] for c in checks.values())
    assert set(checks) == {"broker", "log_dirs", "metadata", "store", "retention_margin"}


def test_each_check_says_why() -> None:
    copies = StoreHealth()
    for _ in range(3):
        copies.failed(OSError("disk full"))
    ok, checks = _ready(last_discovery_ok=NOW - 61, last_error="discovery: timed out", not_caught_up=["t-0"],
                        log_dir_problems={"/kafka": "missing"}, store_copies=copies,
                        margins={"t-1": Margin(30.0, 10.0, 42)})
    assert not ok and not any(c["ok"] for c in checks.values())
    assert checks["broker"]["reason"] == "discovery: timed out"
    assert checks["metadata"]["not_caught_up"] == ["t-0"]
    assert checks["store"] == {"ok": False, "failures_in_a_row": 3, "last_error": "OSError: disk full"}
    assert checks["retention_margin"]["below_min"] == {"t-1": {"seconds": 30.0, "bytes": 10.0, "segment": 42}}
    assert _ready(last_discovery_ok=None)[1]["broker"]["reason"] == "no discovery round succeeded yet"


def test_the_broker_window_is_at_least_six_rounds() -> None:
    assert _ready(discovery_interval_ms=20_000, last_discovery_ok=NOW - 100)[1]["broker"]["ok"]
    assert not _ready(discovery_interval_ms=20_000, last_discovery_ok=NOW - 121)[1]["broker"]["ok"]


def test_liveness() -> None:
    assert liveness(discovery_interval_ms=1000, scheduler_running=True, last_discovery_attempt=NOW - 119, now=NOW)[0]
    assert not liveness(discovery_interval_ms=1000, scheduler_running=True, last_discovery_attempt=NOW - 121,
                        now=NOW)[0]
    assert not liveness(discovery_interval_ms=1000, scheduler_running=False, last_discovery_attempt=NOW, now=NOW)[0]
    assert not liveness(discovery_interval_ms=1000, scheduler_running=True, last_discovery_attempt=None, now=NOW)[0]
