"""The dashboard and alert rules shipped in ``config/``, and the metric names a PromQL expression selects."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["DASHBOARD", "RULES", "promql_metric_names"]

CONFIG = Path(__file__).resolve().parents[2] / "config"

DASHBOARD = CONFIG / "grafana" / "rlm-dashboard.json"

RULES = CONFIG / "prometheus" / "rlm-alerts.yml"

_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left",
             "group_right", "inf", "nan"}

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"' + r"|'(?:[^'\\]|\\.)*'")

_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")

_NAME = re.compile(r"(?<![\w.$])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()")

_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*\w+\s*\)\s*$")

def promql_metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers outside strings, label matchers, ranges and
    grouping clauses that are neither functions nor keywords. Grafana's ``label_values(SELECTOR, LABEL)`` is
    taken as its selector."""
    m = _LABEL_VALUES.match(expr)
    if m:
        expr = m.group(1)
    expr = _STRING.sub('""', expr)
    expr = re.sub(r"\{[^}]*\}", " ", expr)
    expr = re.sub(r"\[[^\]]*\]", " ", expr)
    expr = _GROUPING.sub(" ", expr)
    return {n for n in _NAME.findall(expr) if n.lower() not in _KEYWORDS}
