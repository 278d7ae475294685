"""The listener's api table against kio's schemas (Kafka's own message definitions)."""

from __future__ import annotations

import importlib
import pkgutil

import kio.schema

from rlm.listener.protocol.apis import API_KEYS, API_NAMES, PROXY_API_KEYS, SASL_API_KEYS, ApiKey, api_label


def _kio_api_keys() -> dict[int, str]:
    """api key -> the name of the kio schema module whose requests carry it."""
    out: dict[int, str] = {}
    for m in pkgutil.iter_modules(kio.schema.__path__):
        for version in range(20):
            try:
                request = importlib.import_module(f"kio.schema.{m.name}.v{version}.request")
            except ImportError:
                continue
            for obj in vars(request).values():
                key = getattr(obj, "__api_key__", None)
                if key is not None:
                    out[int(key)] = m.name
            break
    return out


def test_metric_labels_are_kafkas_api_names() -> None:
    kio_names = _kio_api_keys()
    assert {k: kio_names.get(k) for k in API_NAMES} == API_NAMES
    for key in ApiKey:  # every key the listener names, answered or forwarded, has its own label
        assert api_label(key) == kio_names[key]
    for key in {*API_KEYS, *PROXY_API_KEYS, *SASL_API_KEYS}:
        assert api_label(key) != "other"


def test_unknown_and_internal_api_keys_are_other() -> None:
    assert api_label(-1) == api_label(1000) == api_label(32767) == "other"
    assert api_label(4) == api_label(5) == api_label(6) == "other"  # LeaderAndIsr, StopReplica, UpdateMetadata
