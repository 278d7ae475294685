"""History Fetches answered from the filesystem store's block cache (issue 24): a consumer's Fetches, each asking
for less than a block, are answered from the block its stream read whole and verified once, byte for byte as the
copy holds them; a block corrupt in the store still fails its partition with KAFKA_STORAGE_ERROR, at every Fetch
of it, while the blocks before it were served. Without a broker: the sidecar's copier writes the copies (crafted
partition dirs), the in-memory metadata manager lists them, the listener's one tier read answers."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rlm.listener.net.principals import Client
from rlm.listener.protocol.codec import ErrorCode, last_offset
from rlm.listener.tier.catalog import ServedTopic
from rlm.listener.tier.context import TierContext
from rlm.listener.tier.fetch import fetch
from rlm.tier import RemoteReader, TierView, to_rsm
from rlmm.api import TopicIdPartition
from rsm.log.batch import RecordParts
from rsm.manager import RemoteStorageManager, RsmConfig
from tests.support.batches import batch, write_partition
from tests.support.world import World

KiB = 1024
PER_BATCH = 20  # records of 1 KiB: ~21 KiB a batch, three a 64 KiB block
BATCHES = 30


def _tier(tmp_path: Path) -> tuple[World, TopicIdPartition, list[bytes]]:
    world = World(tmp_path)
    world.rsm = RemoteStorageManager(RsmConfig(store="fs", root_path=tmp_path / "remote", fsync=False,
                                               block_size_bytes=64 * KiB))
    world.reader = RemoteReader(world.rlmm, world.rsm)
    tp = TopicIdPartition(uuid.uuid4(), "blocks", 0)
    value = bytes(range(256)) * 4
    batches = [batch(i * PER_BATCH, [value] * PER_BATCH) for i in range(BATCHES)]
    active = BATCHES * PER_BATCH
    write_partition(world.pdir(1, tp), tp.topic_id, {0: batches, active: [batch(active, [b"x"])]})
    world.copier(1, tp).run_once(active)
    assert world.finished(tp) == [(0, active - 1)]
    return world, tp, batches


def _context(world: World, tp: TopicIdPartition) -> TierContext:
    topic = ServedTopic(tp.topic, tp.topic_id, (tp.partition,))
    catalog = SimpleNamespace(by_name=lambda n: topic if n == topic.name else None,
                              by_id=lambda i: topic if i == topic.topic_id else None)
    authorizer = SimpleNamespace(allowed=lambda _p, _h, _op, names: set(names))
    return TierContext(catalog, TierView(world.reader, ttl_s=60), authorizer)  # type: ignore[arg-type]


def _fetch(ctx: TierContext, tp: TopicIdPartition, offset: int) -> dict[str, Any]:
    """One Fetch of the partition at ``offset``, 30 KiB at most: about a batch (the first even if larger)."""
    req = SimpleNamespace(max_bytes=30 * KiB, isolation_level=0, topics=[SimpleNamespace(
        topic=tp.topic, partitions=[SimpleNamespace(partition=tp.partition, fetch_offset=offset,
                                                    partition_max_bytes=30 * KiB)])])
    values, _size = fetch(ctx, req, Client("User:c", "127.0.0.1"))
    (part,) = values["responses"][0]["partitions"]
    return part


def test_fetches_inside_blocks_get_the_copys_bytes(tmp_path: Path) -> None:
    world, tp, batches = _tier(tmp_path)
    ctx = _context(world, tp)
    got = []
    offset = 0
    while offset < BATCHES * PER_BATCH:
        part = _fetch(ctx, tp, offset)
        assert part["error_code"] == ErrorCode.none and part["records"]
        got.append(bytes(part["records"]))
        offset = last_offset(part["records"]) + 1  # type: ignore[operator]
    assert b"".join(got) == b"".join(batches)
    cache = world.rsm.block_cache
    assert cache is not None and cache.hits >= len(got) - 1  # every Fetch after the first from a stream


def test_a_corrupt_block_is_that_partitions_storage_error_at_every_fetch(tmp_path: Path) -> None:
    world, tp, batches = _tier(tmp_path)
    ctx = _context(world, tp)
    (md,) = world.rlmm.list_remote_log_segments(tp)
    reader = world.rsm.reader(to_rsm(md))
    bad = reader.ledger.blocks[4]
    path = reader.store._path(reader.keys.data(bad.object_number))  # type: ignore[attr-defined]
    data = bytearray(path.read_bytes())
    data[bad.object_position + bad.block_length - 10] ^= 0xFF  # in a record's value: only the CRC-32C tells
    # The first Fetch before the corruption: the tier's bounds (its open transactions walked over every batch
    # header: these crafted segments have no producer snapshot) are then known for the test's length.
    first = _fetch(ctx, tp, 0)
    served = [bytes(first["records"])]
    offset = last_offset(first["records"]) + 1  # type: ignore[operator]
    path.write_bytes(data)
    while offset < bad.first_offset:  # the blocks before it, through the stream
        part = _fetch(ctx, tp, offset)
        assert part["error_code"] == ErrorCode.none
        served.append(bytes(part["records"]))
        offset = last_offset(part["records"]) + 1  # type: ignore[operator]
    assert b"".join(served) == b"".join(batches[:len(served)])
    assert world.rsm.block_cache is not None and world.rsm.block_cache.streams == 1
    for at in (offset, offset, bad.last_offset):  # the stream reaches it, then it is streamed: never served
        part = _fetch(ctx, tp, at)
        assert part["error_code"] == ErrorCode.kafka_storage_error and not part["records"]


def test_a_segment_read_by_fetch_after_fetch_is_opened_once(tmp_path: Path) -> None:
    """The tier view keeps the handles of the segments it reads: a consumer's Fetches of one segment open it once
    (opening builds its keys and looks its index up: ~0.1 ms per partition per Fetch), and read the same bytes."""
    world, tp, batches = _tier(tmp_path)
    opened = []
    rsm = world.rsm

    class Opening:
        def __getattr__(self, name: str) -> Any:
            return getattr(rsm, name)

        def open_segment(self, md: Any) -> Any:
            opened.append(md.remote_segment_id)
            return rsm.open_segment(md)

    world.reader = RemoteReader(world.rlmm, Opening())  # type: ignore[arg-type]
    ctx = _context(world, tp)
    got, offset = [], 0
    while offset < BATCHES * PER_BATCH:
        part = _fetch(ctx, tp, offset)
        got.append(bytes(part["records"]))
        offset = last_offset(part["records"]) + 1  # type: ignore[operator]
        if len(got) == 1:
            assert opened  # the first Fetch opened it (and the tier's bounds, its producer snapshot)
            opened.clear()
    assert b"".join(got) == b"".join(batches) and len(got) > 5
    assert opened == []


def test_answers_held_while_later_fetches_read_on_keep_their_bytes(tmp_path: Path, monkeypatch: Any) -> None:
    """A Fetch's records are views of the block buffers they were read into (:class:`rsm.log.batch.RecordParts`), and
    a stream reads the next block into its buffer again once nothing refers to it: an answer still held (queued for
    a slow client, read ahead by the proxy) keeps its buffer out of reuse, so its bytes never change under it, while
    the buffers of answers already dropped are reused (not one new buffer per block)."""
    import rsm.format.blockcache as blockcache

    made: list[int] = []
    new_buffer = blockcache.new_block_buffer
    monkeypatch.setattr(blockcache, "new_block_buffer", lambda n: made.append(n) or new_buffer(n))
    world, tp, batches = _tier(tmp_path)
    ctx = _context(world, tp)
    held: list[tuple[Any, bytes]] = []  # (an answer's records as handed out, a copy of their bytes then)
    got: list[bytes] = []
    offset = 0
    while offset < BATCHES * PER_BATCH:
        records = _fetch(ctx, tp, offset)["records"]
        assert isinstance(records, RecordParts)
        got.append(bytes(records))
        if len(got) % 5 == 1:  # some answers held to the end, the others dropped at once
            held.append((records, got[-1]))
        offset = last_offset(records) + 1  # type: ignore[operator]
    assert b"".join(got) == b"".join(batches)
    assert [bytes(r) for r, _ in held] == [b for _, b in held] and len(held) >= 5
    (md,) = world.rlmm.list_remote_log_segments(tp)
    blocks = len(world.rsm.reader(to_rsm(md)).ledger.blocks)
    assert len(made) <= len(held) + 2 < blocks  # a new buffer only for a block whose buffer an answer still held
