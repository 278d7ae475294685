"""The README's operations section stays true to the code (issue 27): its metrics table lists exactly the metrics
the sidecar's modules register in prometheus_client's default registry (the one ``/metrics`` serves), each with its
type, its labels, and the alerts, dashboard panels and dashboard variables that read it; and its panel-by-panel
description of the dashboard names every row and panel of ``config/grafana/rlm-dashboard.json``, in the JSON's
order. No broker: the metrics are read from the registry after importing every module of ``rlm``, ``rlmm`` and
``rsm`` that uses prometheus_client (a metric is made with its classes, so its module imports it)."""

from __future__ import annotations

import importlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml
from prometheus_client import REGISTRY

from tests.support.promql import DASHBOARD, RULES, promql_metric_names

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PACKAGES = ("rlm", "rlmm", "rsm")

# A row of the metrics table: | `name` | type | labels | meaning | used by |
_METRIC_ROW = re.compile(r"^\| `([a-zA-Z_:][a-zA-Z0-9_:]*)` \| (counter|gauge|histogram|summary|info) \|"
                         r"(.*)\|(.*)\|(.*)\|\s*$")
# The dashboard's description: "- Row **Title**: ..." then, indented, "  - **Title**: ..." per panel.
_DASHBOARD_START = "**The dashboard, panel by panel.**"
_ROW_LINE = re.compile(r"^- Row \*\*(.+?)\*\*")
_PANEL_LINE = re.compile(r"^  - \*\*(.+?)\*\*")


@dataclass(frozen=True, slots=True)
class Metric:
    name: str         # as scraped: counters with _total; a histogram by its base name
    type: str
    labels: tuple[str, ...]  # without a histogram's le


def registered_metrics() -> dict[str, Metric]:
    """Every metric in the default registry once the packages' metric-defining modules are imported: the process
    and platform collectors prometheus_client registers itself, and ours."""
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if "prometheus_client" in path.read_text():
                importlib.import_module(".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(
                    ".__init__"))
    out: dict[str, Metric] = {}
    for collector in list(REGISTRY._collector_to_names):  # noqa: SLF001 - the registry lists its collectors only here
        for family in collector.collect() if not hasattr(collector, "_labelnames") else [None]:
            if family is None:  # one of ours (a Counter, Gauge, ...): its label names even before any sample
                kind = collector._type  # noqa: SLF001
                name = collector._name + ("_total" if kind == "counter" else "")  # noqa: SLF001
                labels = tuple(collector._labelnames)  # noqa: SLF001
            else:  # a custom collector (process, platform, gc): its labels from its samples
                kind = family.type
                name = family.name + ("_total" if kind == "counter" else "")
                labels = tuple(dict.fromkeys(k for s in family.samples for k in s.labels if k != "le"))
            out[name] = Metric(name, kind, labels)
    return out


def readme_metric_rows() -> dict[str, tuple[str, str, str]]:
    """The README's metric rows: name -> (type, labels cell, used-by cell)."""
    rows: dict[str, tuple[str, str, str]] = {}
    for line in README.read_text().splitlines():
        m = _METRIC_ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} has two rows in the README's metrics table"
            rows[m.group(1)] = (m.group(2), m.group(3).strip(), m.group(5).strip())
    return rows


def _series(metric: Metric) -> set[str]:
    if metric.type == "histogram":
        return {f"{metric.name}_bucket", f"{metric.name}_sum", f"{metric.name}_count"}
    if metric.type == "summary":
        return {metric.name, f"{metric.name}_sum", f"{metric.name}_count"}
    return {metric.name}


def used_by(metric: Metric) -> tuple[set[str], set[str], set[str]]:
    """The alerts, panels and dashboard variables whose queries name one of the metric's series."""
    series = _series(metric)
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]
              if promql_metric_names(r["expr"]) & series}
    dash = json.loads(DASHBOARD.read_text())
    panels = {p["title"] for p in dash["panels"]
              if any(promql_metric_names(t["expr"]) & series for t in p.get("targets", []))}
    variables = {v["name"] for v in dash["templating"]["list"] if v["type"] == "query"
                 and promql_metric_names(v["query"]["query"] if isinstance(v["query"], dict) else v["query"]) & series}
    return alerts, panels, variables


def test_the_metrics_table_lists_exactly_the_registered_metrics() -> None:
    registered = registered_metrics()
    rows = readme_metric_rows()
    assert len(registered) > 40, sorted(registered)  # the modules were found and imported
    missing = sorted(set(registered) - set(rows))
    assert not missing, f"registered but not in the README's metrics table: {missing}"
    unknown = sorted(set(rows) - set(registered))
    assert not unknown, f"in the README's metrics table but registered by no module: {unknown}"


def test_each_row_says_the_metrics_type_labels_and_users() -> None:
    rows = readme_metric_rows()
    wrong = []
    for name, metric in sorted(registered_metrics().items()):
        if name not in rows:
            continue  # reported by the test above
        kind, labels_cell, used_cell = rows[name]
        if kind != metric.type:
            wrong.append(f"{name}: type {kind} in the README, {metric.type} registered")
        labels = re.findall(r"`(\w+)`", labels_cell)
        if sorted(labels) != sorted(metric.labels):
            wrong.append(f"{name}: labels {labels} in the README, {list(metric.labels)} registered")
        alerts, panels, variables = used_by(metric)
        said = (set(re.findall(r"`(Rlm\w+)`", used_cell)), set(re.findall(r'"([^"]+)"', used_cell)),
                set(re.findall(r"`\$(\w+)`", used_cell)))
        for what, readme, truth in zip(("alerts", "panels", "variables"), said, (alerts, panels, variables),
                                       strict=True):
            if readme != truth:
                wrong.append(f"{name}: {what} {sorted(readme)} in the README, {sorted(truth)} in the rules and "
                             f"dashboard")
    assert not wrong, "\n".join(wrong)


def test_every_dashboard_row_and_panel_is_described_in_order() -> None:
    text = README.read_text()
    assert _DASHBOARD_START in text
    described: list[str] = []
    for line in text[text.index(_DASHBOARD_START):].splitlines()[1:]:
        if line.startswith("**"):
            break  # the next paragraph of the operations section
        m = _ROW_LINE.match(line) or _PANEL_LINE.match(line)
        if m:
            described.append(("row " if line.startswith("- Row") else "") + m.group(1))
    panels = [("row " if p["type"] == "row" else "") + p["title"]
              for p in json.loads(DASHBOARD.read_text())["panels"]]
    assert described == panels, (f"not described: {[p for p in panels if p not in described]}; described but not "
                                 f"in the dashboard: {[d for d in described if d not in panels]}; or out of order")
