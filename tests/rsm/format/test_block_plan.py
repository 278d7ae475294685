"""The block plan of a copy (:meth:`rsm.format.reader.SegmentReader.block_plan`, issue 24): the runs of blocks a
read within a byte budget covers, found by bisection from the block holding the first offset and cut off after
``runs`` runs, are the runs a scan of every block finds."""

from __future__ import annotations

import itertools
import uuid
from pathlib import Path

from rlm.tier import RemoteReader, to_rsm
from rlmm.api import TopicIdPartition
from rsm.api import BlockRange
from rsm.format.index import BlockInfo
from rsm.manager import RemoteStorageManager, RsmConfig
from tests.support.batches import BASE_TS, batch, write_partition
from tests.support.world import World

KiB = 1024


def _every_block(blocks: list[BlockInfo], from_offset: int, end: int, max_bytes: int, min_ts: int | None,
                 from_block: int) -> list[BlockRange]:
    """The plan as a scan of every block finds it (what block_plan did before it bisected)."""
    groups: list[list[BlockInfo]] = []
    for b in blocks[from_block:]:
        if b.last_offset < from_offset or b.first_offset > end or (min_ts is not None and b.max_timestamp_ms < min_ts):
            continue
        if groups and groups[-1][-1].part_id + 1 == b.part_id and (
                sum(x.log_bytes for x in groups[-1]) + b.log_bytes <= max_bytes or b.fragment_number > 0):
            groups[-1].append(b)
        else:
            groups.append([b])
    return [BlockRange(g[0].part_id, g[-1].part_id, g[0].first_offset, g[-1].last_offset,
                       sum(b.log_bytes for b in g)) for g in groups]


def test_the_plan_is_that_of_a_scan_of_every_block(tmp_path: Path) -> None:
    world = World(tmp_path)
    world.rsm = RemoteStorageManager(RsmConfig(store="fs", root_path=tmp_path / "remote", fsync=False,
                                               block_size_bytes=16 * KiB))
    world.reader = RemoteReader(world.rlmm, world.rsm)
    tp = TopicIdPartition(uuid.uuid4(), "plan", 0)
    # 40 batches of 3 records, 1 to 6 KiB values (several batches a block), timestamps going up and down
    batches = [batch(3 * i, [bytes([i]) * (KiB * (1 + i % 6))] * 3, ts=BASE_TS + (i * 7919) % 40 * 1000)
               for i in range(40)]
    write_partition(world.pdir(1, tp), tp.topic_id, {0: batches, 120: [batch(120, [b"x"])]})
    world.copier(1, tp).run_once(120)
    (md,) = world.reader.segments(tp)
    seg = world.rsm.open_segment(to_rsm(md))
    blocks = seg.ledger.blocks  # type: ignore[attr-defined]
    assert len(blocks) > 10
    checked = 0
    for start, end, budget, min_ts, from_block in itertools.product(
            (0, 1, 40, 61, 119), (0, 50, 119, 10**6), (1, 20 * KiB, 50 * KiB, 1 << 30),
            (None, BASE_TS + 20_000), (0, 3)):
        want = _every_block(blocks, start, end, budget, min_ts, from_block)
        got = seg.block_plan(start, end, budget, min_timestamp_ms=min_ts, from_block=from_block)
        assert got == want, (start, end, budget, min_ts, from_block)
        for runs in (1, 2):
            assert seg.block_plan(start, end, budget, min_timestamp_ms=min_ts, from_block=from_block,
                                  runs=runs) == want[:runs]
        checked += bool(want)
    assert checked > 100
