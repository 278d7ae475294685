"""A Fetch's partitions read from the tier at once (issue 24), answered as if read one after the other: the one byte
budget spent in order, the first partition with data allowed past it, partitions in the request's order. Without a
broker: the sidecar's copier writes the copies (crafted partition dirs), the in-memory metadata manager lists them,
the listener's one tier read (:func:`rlm.listener.tier.fetch.fetch`) answers."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlm.listener.net.principals import Client
from rlm.listener.protocol.codec import ErrorCode
from rlm.listener.tier import fetch as tier_fetch
from rlm.listener.tier.catalog import ServedTopic
from rlm.listener.tier.context import TierContext
from rlm.tier import RemoteReader, TierView
from rlmm.api import TopicIdPartition
from rsm.manager import RemoteStorageManager, RsmConfig
from tests.support.batches import batch, write_partition
from tests.support.world import World

KiB = 1024
CLIENT = Client("User:c", "127.0.0.1")


def _tier(tmp_path: Path) -> tuple[World, list[TopicIdPartition]]:
    """Four partitions of one topic: batches of 2, 5, 9 and 1 KiB values (20, 12, 6, 40 of them)."""
    world = World(tmp_path)
    world.rsm = RemoteStorageManager(RsmConfig(store="fs", root_path=tmp_path / "remote", fsync=False,
                                               block_size_bytes=64 * KiB))
    world.reader = RemoteReader(world.rlmm, world.rsm)
    tid = uuid.uuid4()
    tps = []
    for p, (kib, n) in enumerate([(2, 20), (5, 12), (9, 6), (1, 40)]):
        tp = TopicIdPartition(tid, "par", p)
        value = bytes([p]) * (kib * KiB)
        batches = [batch(i * 3, [value] * 3) for i in range(n)]
        write_partition(world.pdir(1, tp), tid, {0: batches, 3 * n: [batch(3 * n, [b"x"])]})
        world.copier(1, tp).run_once(3 * n)
        tps.append(tp)
    return world, tps


def _context(world: World, tps: list[TopicIdPartition], tier: Any = None) -> TierContext:
    topic = ServedTopic(tps[0].topic, tps[0].topic_id, tuple(tp.partition for tp in tps))
    catalog = SimpleNamespace(by_name=lambda n: topic if n == topic.name else None,
                              by_id=lambda i: topic if i == topic.topic_id else None)
    authorizer = SimpleNamespace(allowed=lambda _p, _h, _op, names: set(names))
    return TierContext(catalog, tier or TierView(world.reader, ttl_s=60), authorizer)  # type: ignore[arg-type]


def _request(topic: str, asks: list[tuple[int, int, int]], max_bytes: int) -> Any:
    """A Fetch of (partition, fetch offset, partition_max_bytes) asks."""
    return SimpleNamespace(max_bytes=max_bytes, isolation_level=0, topics=[SimpleNamespace(
        topic=topic, partitions=[SimpleNamespace(partition=p, fetch_offset=o, partition_max_bytes=m)
                                 for p, o, m in asks])])


def _one_after_the_other(view: TierView, tps: list[TopicIdPartition], asks: list[tuple[int, int, int]],
                         cap: int) -> list[tuple[int, bytes]]:
    """What the rule gives, read in order: each partition with the budget the ones before it left."""
    out, total, left = [], 0, cap
    for p, offset, pmb in asks:
        res = view.fetch(tps[p], offset, max(min(pmb, left), 0), at_least_one=total == 0)
        out.append((p, bytes(res.records)))
        total += res.size
        left -= res.size
    return out


@pytest.mark.parametrize(("asks", "cap"), [
    ([(0, 0, 20 * KiB), (1, 0, 20 * KiB), (2, 0, 20 * KiB), (3, 0, 20 * KiB)], 1 << 20),  # room for all
    ([(0, 0, 20 * KiB), (1, 0, 20 * KiB), (2, 0, 20 * KiB), (3, 0, 20 * KiB)], 45 * KiB),  # the budget ends inside
    ([(0, 60, 20 * KiB), (1, 0, 20 * KiB), (2, 0, 20 * KiB), (3, 0, 20 * KiB)], 45 * KiB),  # the first at its end
    ([(0, 60, 1), (1, 36, 1), (2, 0, 1), (3, 0, 1)], 1 << 20),  # the first with data passes its room, alone
    ([(2, 0, 1), (1, 0, 40 * KiB), (3, 0, 40 * KiB), (0, 0, 40 * KiB)], 50 * KiB),  # order of the request's
    ([(3, 0, 1), (2, 3, 20 * KiB), (1, 0, 100), (0, 0, 0)], 30 * KiB),  # rooms below a batch, and none
])
@pytest.mark.parametrize("parallel", [4, 0])
def test_the_answer_is_that_of_reading_in_order(tmp_path: Path, asks: list[tuple[int, int, int]], cap: int,
                                                parallel: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tier_fetch, "PARALLEL_READS", parallel)
    world, tps = _tier(tmp_path)
    ctx = _context(world, tps)
    want = _one_after_the_other(TierView(world.reader, ttl_s=60), tps, asks, cap)
    values, size = tier_fetch.fetch(ctx, _request(tps[0].topic, asks, cap), CLIENT)
    got = [(p["partition_index"], bytes(p["records"])) for p in values["responses"][0]["partitions"]]
    assert got == want
    assert size == sum(len(r) for _p, r in want) and size > 0
    assert all(p["error_code"] == ErrorCode.none for p in values["responses"][0]["partitions"])


class _Meeting:
    """A tier view whose reads of partitions 0 and 1 each wait for the other to begin: read one after the other,
    the first waits in vain."""

    def __init__(self, view: TierView) -> None:
        self.view = view
        self.barrier = threading.Barrier(2, timeout=10)

    def fetch(self, tp: TopicIdPartition, *args: Any, **kw: Any) -> Any:
        if tp.partition in (0, 1):
            self.barrier.wait()
        return self.view.fetch(tp, *args, **kw)


def test_partitions_are_read_at_once(tmp_path: Path) -> None:
    world, tps = _tier(tmp_path)
    ctx = _context(world, tps, _Meeting(TierView(world.reader, ttl_s=60)))
    asks = [(0, 0, 40 * KiB), (1, 0, 40 * KiB), (2, 0, 40 * KiB)]
    values, size = tier_fetch.fetch(ctx, _request(tps[0].topic, asks, 1 << 20), CLIENT)
    assert [p["partition_index"] for p in values["responses"][0]["partitions"]] == [0, 1, 2]
    assert all(p["records"] for p in values["responses"][0]["partitions"]) and size > 0


def test_reads_not_started_are_read_by_the_fetch_itself(tmp_path: Path) -> None:
    """Every thread of the pool busy (other Fetches): the Fetch does not wait for them, it reads its partitions."""
    world, tps = _tier(tmp_path)
    ctx = _context(world, tps)
    asks = [(p, 0, 20 * KiB) for p in range(4)]
    want = _one_after_the_other(TierView(world.reader, ttl_s=60), tps, asks, 1 << 20)
    release = threading.Event()
    busy = [tier_fetch._pool().submit(release.wait, 600) for _ in range(tier_fetch.PARALLEL_READS)]
    try:
        values, _size = tier_fetch.fetch(ctx, _request(tps[0].topic, asks, 1 << 20), CLIENT)
        assert [(p["partition_index"], bytes(p["records"])) for p in values["responses"][0]["partitions"]] == want
        assert not any(f.done() for f in busy)
    finally:
        release.set()


class _Threads:
    """A tier view that notes the thread of each partition read."""

    def __init__(self, view: TierView) -> None:
        self.view = view
        self.threads: list[int] = []

    def fetch(self, tp: TopicIdPartition, *args: Any, **kw: Any) -> Any:
        self.threads.append(threading.get_ident())
        return self.view.fetch(tp, *args, **kw)


@pytest.mark.parametrize("parallel_reads", [True, False])
def test_without_parallel_reads_the_fetch_reads_its_partitions_itself(tmp_path: Path, parallel_reads: bool) -> None:
    """A context without parallel reads (a store mapping local files: the filesystem's) reads every partition on
    the thread answering the Fetch, none on the pool; the answer is the same as with them."""
    world, tps = _tier(tmp_path)
    view = _Threads(TierView(world.reader, ttl_s=60))
    ctx = _context(world, tps, view)
    ctx.parallel_reads = parallel_reads
    asks = [(p, 0, 20 * KiB) for p in range(4)]
    want = _one_after_the_other(TierView(world.reader, ttl_s=60), tps, asks, 1 << 20)
    for _ in range(20):  # with them, a read of the pool's comes (the pool's threads may be slow to start)
        values, _size = tier_fetch.fetch(ctx, _request(tps[0].topic, asks, 1 << 20), CLIENT)
        assert [(p["partition_index"], bytes(p["records"])) for p in values["responses"][0]["partitions"]] == want
    here = threading.get_ident()
    assert (set(view.threads) == {here}) is not parallel_reads


def test_only_a_store_that_does_not_map_its_files_reads_partitions_at_once(tmp_path: Path) -> None:
    from rlm.listener.tier.context import reads_wait_on_network

    fs = RemoteStorageManager(RsmConfig(store="fs", root_path=tmp_path / "remote", fsync=False))
    assert not reads_wait_on_network(fs)  # the filesystem's blocks are mapped: nothing to wait for in parallel
    assert reads_wait_on_network(SimpleNamespace(store=SimpleNamespace(get=None)))  # e.g. S3's: no map_range
