"""OffsetForLeaderEpoch through the proxy when leadership moves between the broker's answer and the proxy's ask of
the broker's log start (ListOffsets EARLIEST, sent after the answer: :meth:`rlm.listener.upstream.proxy.Proxy.answer`).

The set-up of ``test_proxy_epochs`` (:func:`tests.support.proxy_epochs.forgotten_epochs`: three brokers, E0 under a
first leader, E1 under the new one, the broker's log start put inside E1, so the broker answers E0 with its log start;
the tier read), in a module of its own: the test moves the partition's leadership for real, and the other module's
tests ask E1 as the current epoch. The move is made to happen in the one moment it matters, by a test hook around the
proxy's ``_log_starts`` that runs Kafka's reassignment tool and a preferred election before the proxy's ask goes out;
the broker's answers on both sides of it are its own.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devtools.devkafka import KafkaCluster
from rlm.listener.protocol.codec import ErrorCode
from rlm.listener.upstream.proxy import Proxy
from tests.rlm.listener.raw_wire import EARLIEST, list_offsets
from tests.support.proxy_epochs import INTO_E1, NODES, Epochs, end_offset, forgotten_epochs
from tests.support.sidecar import PartitionStates, reassign, wait_for


@pytest.fixture(scope="module")
def epochs(kafka_cluster3: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Epochs]:
    with forgotten_epochs(kafka_cluster3, tmp_path_factory.mktemp("proxy-epochs-moved")) as e:
        yield e


def test_an_epoch_answered_by_a_leader_that_lost_the_partition_before_its_log_start_was_asked_is_asked_again(
        epochs: Epochs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The new leader answers E0 with its log start (its checkpoint no longer holds E0); before the proxy asks it for
    that log start, leadership moves to another broker, which it then answers NOT_LEADER_OR_FOLLOWER. The proxy, its
    tier read, cannot tell that answer from one out of the broker's checkpoint: OFFSET_NOT_AVAILABLE, which clients
    retry (with a metadata refresh: to the new leader's proxy, which answers E0 from the tier's lineage). Before, the
    broker's log start went out as E0's end, past where E0 ended (E1's start): a consumer whose position claims E0
    past its real end would have passed validation."""
    e0, e1 = epochs.epochs
    topic, old = epochs.topic, epochs.leader
    broker = ("127.0.0.1", epochs.kafka.node(old).port)
    ctx = epochs.listener.server.router.ctx
    tp = ctx.catalog.by_name(topic).tp(0)
    assert ctx.tier.ready(tp)  # the premise: the proxy has read the tier
    assert end_offset(broker, topic, e0, e1) == (0, e0, epochs.e1_start + INTO_E1)  # Kafka: its log start
    states = PartitionStates(epochs.kafka)
    new = next(n for n in NODES if n != old)
    original = Proxy._log_starts
    moved: list[int] = []

    def move() -> None:
        reassign(epochs.kafka, {(topic, 0): [new, *(n for n in NODES if n != new)]}, tmp_path)
        wait_for(lambda: states.elect(topic, [0]) and states.leader(topic) == new, 60, f"node {new} to lead")

    async def moved_first(self: Proxy, upstream: Any, partitions: dict[str, list[int]]) -> dict[tuple[str, int], int]:
        if not moved and topic in partitions:
            await asyncio.to_thread(move)
            moved.append(new)
        return await original(self, upstream, partitions)

    monkeypatch.setattr(Proxy, "_log_starts", moved_first)
    assert end_offset(("127.0.0.1", epochs.listener.port), topic, e0, e1) == (
        ErrorCode.offset_not_available, -1, -1)
    assert moved == [new]
    with socket.create_connection(broker, timeout=30) as sock:  # the premise: what the proxy's ask was answered
        assert list_offsets(sock, topic, EARLIEST).error_code == ErrorCode.not_leader_or_follower
    # the client's next try, at the new leader's proxy: E0 from the tier's lineage
    wait_for(lambda: end_offset(("127.0.0.1", epochs.proxies[new]), topic, e0, -1) == (0, e0, epochs.e1_start), 30,
             f"node {new}'s proxy to answer E0 from the tier")
