"""HeldBlocks: the block buffers answers read ahead hold stay within the budget, each counted once (issue 24).

Answers here are response values as :func:`rlm.listener.tier.boundary.fetch_from_tier` gives them, their records
views of block buffers (:class:`rsm.log.batch.RecordParts`); the proxy's use of it, against a real broker, is
``test_proxy.py::test_answers_read_ahead_hold_no_more_block_memory_than_the_budget``.
"""

from __future__ import annotations

import gc
import mmap
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest

from rlm.listener.tier.held import HeldBlocks, NotHeld
from rsm.log.batch import RecordParts
from rsm.store.fs import FileSystemStore

BLOCK = 4 * 1024 * 1024


def answer(*blocks: bytearray, each: int = 1000) -> dict[str, Any]:
    """Response values of one partition per block, its records two views of ``each`` bytes of it."""
    parts = []
    for i, b in enumerate(blocks):
        b[:2 * each] = bytes([i + 1]) * (2 * each)
        view = memoryview(b)
        parts.append({"partition_index": i, "records": RecordParts([view[:each], view[each:2 * each]], 2 * each, i)})
    return {"responses": [{"topic": "t", "topic_id": None, "partitions": parts}]}


def held_bytes(*answers: dict[str, Any]) -> int:
    """What the answers keep alive, measured from their records: each distinct buffer their parts view, once."""
    bases = {}
    for a in answers:
        for t in a["responses"]:
            for p in t["partitions"]:
                for part in p["records"].parts:
                    bases[id(part.obj)] = memoryview(part.obj).nbytes
    return sum(bases.values())


def test_answers_held_past_the_budget_are_copied_out_then_dropped_and_the_total_never_passes_it() -> None:
    """Eight answers of eight partitions, each partition's records views of a 4 MiB block of its own, held with a
    budget of 20 MiB: the first answer's first five partitions keep their views (20 MiB), every later partition is
    copied out (2,000 bytes each, the bytes unchanged), until not even a copy fits: that answer is not held (and
    what it held let go). Without the budget the answers held 256 MiB of blocks."""
    budget = 5 * BLOCK + 40 * 2000 + 500
    held = HeldBlocks(budget)
    answers, claims = [], []
    for _ in range(8):
        a = answer(*(bytearray(BLOCK) for _ in range(8)))
        assert held_bytes(a) == 8 * BLOCK
        claim = held.claim()
        try:
            held.hold(claim, a)
        except NotHeld:
            continue
        answers.append(a)
        claims.append(claim)
        assert held.total <= budget
        assert held_bytes(*answers) == held.total  # the count is what the records keep alive
    assert len(answers) == 5  # 40 partitions: 5 as views, 35 copied; the sixth answer's copies no longer fit
    assert held.total == 5 * BLOCK + 35 * 2000
    for i, a in enumerate(answers):
        for p in a["responses"][0]["partitions"]:
            assert bytes(p["records"]) == bytes([p["partition_index"] + 1]) * 2000
            copied = len(p["records"].parts) == 1
            assert copied == (i > 0 or p["partition_index"] >= 5)
    del answers, a, claim
    claims.clear()
    gc.collect()
    assert held.total == 0


def test_a_buffer_viewed_by_several_answers_is_counted_once_and_let_go_with_the_last() -> None:
    block = bytearray(BLOCK)
    held = HeldBlocks(BLOCK)
    first, second = held.claim(), held.claim()
    held.hold(first, answer(block))
    held.hold(second, answer(block))  # the same block: nothing more held, no copy
    assert held.total == BLOCK
    del first
    assert held.total == BLOCK
    del second
    assert held.total == 0


def test_an_answer_not_held_holds_nothing_and_its_read_raises() -> None:
    held = HeldBlocks(100)
    claim = held.claim()
    with pytest.raises(NotHeld):
        held.read(claim, answer, bytearray(BLOCK))
    assert held.total == 0 and held.has_room()


def test_a_claim_the_cyclic_gc_lets_go_while_its_thread_holds_the_lock_does_not_deadlock() -> None:
    """A claim in a reference cycle (a connection's objects often are) is let go by the cyclic GC, in whatever
    thread it runs: here one inside hold()'s locked section. With a plain lock that thread waited for itself."""
    held = HeldBlocks(2 * BLOCK)
    claim = held.claim()
    held.hold(claim, answer(bytearray(BLOCK)))
    cycle: list[Any] = [claim]
    cycle.append(cycle)
    del claim, cycle

    def collect() -> None:
        with held._lock:  # as hold() holds it when a collection runs in its thread
            gc.collect()

    t = threading.Thread(target=collect, daemon=True)
    t.start()
    t.join(30)
    assert not t.is_alive(), "deadlocked"
    assert held.total == 0


def test_blocks_mapped_from_the_store_count_their_mapped_size(tmp_path: Path) -> None:
    """A block of the filesystem store is a mapping of its file (rsm.store.fs.FileSystemStore.map_range), not heap:
    its pages still count, by the block's mapped size, once however many views of it answers hold; past the budget
    a partition's records are copied out as from a buffer; the mapping goes with the last view."""
    store = FileSystemStore(tmp_path, fsync=False)
    store.put("obj", [bytes(range(256)) * (3 * BLOCK // 256)])
    blocks = [store.map_range("obj", 100 + i * BLOCK, BLOCK - 200) for i in range(2)]  # as blocks: not page-aligned
    sizes = [memoryview(b.obj).nbytes for b in blocks]
    assert all(BLOCK - 200 <= s < BLOCK - 200 + mmap.ALLOCATIONGRANULARITY for s in sizes)
    held = HeldBlocks(sizes[0] + 10_000)

    def mapped_answer(i: int, view: memoryview) -> dict[str, Any]:
        return {"responses": [{"topic": "t", "topic_id": None, "partitions": [
            {"partition_index": i, "records": RecordParts([view[:1000], view[1000:3000]], 3000, i)}]}]}

    first, again, second = held.claim(), held.claim(), held.claim()
    held.hold(first, mapped_answer(0, blocks[0]))
    held.hold(again, mapped_answer(0, blocks[0]))  # the same mapping: counted once
    assert held.total == sizes[0]
    kept = mapped_answer(1, blocks[1])
    held.hold(second, kept)  # a second mapping does not fit: copied out
    assert held.total == sizes[0] + 3000
    assert bytes(kept["responses"][0]["partitions"][0]["records"]) == bytes(blocks[1][:3000])
    mapping = weakref.ref(blocks[0].obj)
    del first, again, blocks
    assert held.total == 3000
    gc.collect()
    assert mapping() is None  # no view left: unmapped
