"""RequestCounter: its own counts and the process's ``rsm_store_requests_total`` agree per kind, also when the
metric's child per kind is the one kept from an earlier request (issue 26)."""

from __future__ import annotations

import uuid

from prometheus_client import REGISTRY

from rsm.store.base import RequestCounter


def _metric(store: str, kind: str) -> float:
    return REGISTRY.get_sample_value("rsm_store_requests_total", {"store": store, "kind": kind}) or 0.0


def test_counts_reach_the_metric_per_kind_and_store() -> None:
    store = f"test-{uuid.uuid4().hex[:8]}"   # a label of its own: other tests' requests do not count here
    a, b = RequestCounter(store), RequestCounter(store)
    for _ in range(3):
        a.add("put")
    a.add("get", 5)
    b.add("put", 2)       # a second counter of the same store adds to the same child
    assert a.snapshot() == {"put": 3, "get": 5}
    assert b.snapshot() == {"put": 2}
    assert (_metric(store, "put"), _metric(store, "get")) == (5.0, 5.0)
    assert a.total() == 8
