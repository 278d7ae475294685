"""The history endpoint's test set-up (:mod:`tests.support.history`): the ``history`` fixture."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from devtools.devkafka import KafkaCluster
from tests.support.history import HistorySetup, served_history


@pytest.fixture(scope="module")
def history(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HistorySetup]:
    """The topics of :mod:`tests.support.history`, tiered, served by the endpoint, gone from the broker."""
    yield from served_history(kafka, tmp_path_factory)
