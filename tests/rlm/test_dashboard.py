"""The Grafana dashboard (``config/grafana/rlm-dashboard.json``) is a valid dashboard, and every metric its queries
and the alert rules (``config/prometheus/rlm-alerts.yml``) name is one a real sidecar exports: read from the
``/metrics`` of a sidecar started against the real broker, with its history endpoint started as ``rlm serve`` starts
it (the history endpoint's metrics are registered when its modules load)."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import yaml

from devtools.devkafka import KafkaCluster
from rlm.http import OpsServer
from rlm.sidecar import Sidecar
from tests.support.kafka import produce
from tests.support.processes import http_get
from tests.support.promql import DASHBOARD, RULES, promql_metric_names
from tests.support.sidecar import make_settings, wait_for

PROMETHEUS_OWN = {"up"}  # series Prometheus makes itself for every scrape target


def exported_metric_names(exposition: str) -> set[str]:
    """The series names a ``/metrics`` text exposition can hold, samples or not (a labelled metric never set has
    its ``# TYPE`` line only): histograms as ``_bucket``, ``_count`` and ``_sum``."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            if kind == "histogram":
                names |= {f"{name}_bucket", f"{name}_count", f"{name}_sum"}
            elif kind == "summary":
                names |= {name, f"{name}_count", f"{name}_sum"}
            else:
                names.add(name)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


def _dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def dashboard_queries() -> list[str]:
    dash = _dashboard()
    queries = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            queries.append(var["query"]["query"] if isinstance(var["query"], dict) else var["query"])
    return queries


def rule_queries() -> list[str]:
    return [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_metric_names_are_read_from_promql() -> None:
    assert promql_metric_names(
        'histogram_quantile(0.99, sum by (api, le) (rate(rlm_history_request_seconds_bucket{job=~"$job", '
        'api!="Fetch"}[$__rate_interval])))') == {"rlm_history_request_seconds_bucket"}
    assert promql_metric_names(
        'increase(rlm_segment_gaps_total[15m]) > 0 or (rlm_segment_gaps_total > 0 unless rlm_segment_gaps_total '
        'offset 15m)') == {"rlm_segment_gaps_total"}
    assert promql_metric_names(
        'sum by (job) (rate(a_total{error!="none"}[5m])) / on (job) group_left(x) sum(rate(b_total[5m])) > 1e9 '
        'and c < +Inf') == {"a_total", "b_total", "c"}
    assert promql_metric_names('label_values(rlm_copy_lag_bytes{job=~"$job"}, topic)') == {"rlm_copy_lag_bytes"}
    assert promql_metric_names('up{job="rlm"} == 0') == {"up"}


def test_dashboard_is_a_valid_grafana_dashboard() -> None:
    dash = _dashboard()  # valid JSON, or this raises
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), ids
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "job", "instance", "topic"} <= variables
    titles = set()
    for panel in dash["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["title"] not in titles, panel["title"]
        titles.add(panel["title"])
        assert panel["description"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert promql_metric_names(target["expr"]), (panel["title"], target["expr"])
            assert target["expr"].count("(") == target["expr"].count(")"), target["expr"]
    # What issue 27 asks the dashboard to show, each by the metrics that show it.
    used = set().union(*map(promql_metric_names, dashboard_queries()))
    for wanted in ("rlm_bytes_copied_total", "rlm_copy_lag_bytes", "rlm_copy_lag_segments",  # throughput, lag
                   "rlm_retention_margin_seconds", "rlm_retention_margin_bytes",  # retention margin
                   "rlm_copy_seconds_bucket", "rlm_read_seconds_bucket",  # copy and read latency
                   "rlm_errors_total", "rsm_throttle_bytes_total",  # store errors and traffic
                   "rlmm_applied_records_total",  # metadata
                   "rlm_history_requests_total", "rlm_history_request_seconds_bucket"):  # history endpoint
        assert wanted in used, wanted


def test_every_query_names_a_metric_a_live_sidecar_exports(kafka: KafkaCluster, tmp_path: Path) -> None:
    from rlm.listener import start_listener

    topic = f"dash-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, 1, config={"segment.ms": "300"})
    settings = make_settings(kafka, tmp_path, topics={"include": [topic]}, health={"min_retention_margin_ms": 90_000},
                             history_listener={"host": "127.0.0.1", "port": 0,
                                               "authorization": {"allow_if_no_authorizer": True}})
    sidecar = Sidecar(settings).start()
    history = None
    ops = OpsServer("127.0.0.1", 0, sidecar.health, sidecar.liveness).start()
    try:
        history = start_listener(settings, sidecar.rsm)
        produce(kafka, topic, [(b"k", b"v" * 100)] * 20)
        wait_for(lambda: f'rlm_copy_lag_bytes{{partition="0",topic="{topic}"}}'
                 in http_get(f"http://127.0.0.1:{ops.port}/metrics")[1].decode(), 60, "the partition's copy lag")
        status, body = http_get(f"http://127.0.0.1:{ops.port}/metrics")
        assert status == 200
        exported = exported_metric_names(body.decode())
        assert "rlm_history_requests_total" in exported and "rlm_copy_seconds_bucket" in exported
        # RlmRetentionMarginLow's threshold is the sidecar's own setting
        assert "\nrlm_min_retention_margin_seconds 90.0\n" in body.decode()
        unknown = {(q, n) for q in dashboard_queries() + rule_queries()
                   for n in promql_metric_names(q) - exported - PROMETHEUS_OWN}
        assert not unknown, sorted(unknown)
    finally:
        ops.stop()
        if history is not None:
            history.stop()
        sidecar.stop()
