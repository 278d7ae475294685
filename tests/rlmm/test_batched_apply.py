"""A batched apply equals applying the same records one at a time (issue 26: the cache's apply is batched for speed).

Random streams over a few partitions, each sharing its metadata partitions, mix every kind of record the topic can
carry: new segments (retries of a STARTED id, ids already past STARTED), updates in and out of the state diagram's
order, updates of unknown ids, copies under rising and falling broker leader epochs (fenced), partition deletes in
and out of order, tombstones, and undecodable values. The same stream goes into one cache in batches of random
size and into another one record per call; the state, the refusals and the progress must be identical.
"""

from __future__ import annotations

import random
import uuid
from dataclasses import replace

import pytest

from rlmm import serde
from rlmm.api import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from rlmm.cache import MetadataCache
from rlmm.keys import KeyKind, encode_key

S = RemoteLogSegmentState
P = RemotePartitionDeleteState
NUM_PARTITIONS = 3


def _stream(rnd: random.Random, n: int) -> list[tuple[int, int, bytes | None, bytes | None]]:
    """(metadata partition, offset, key, value) records, offsets per metadata partition."""
    tps = [TopicIdPartition(uuid.UUID(int=rnd.getrandbits(128)), f"t{i}", i % 2) for i in range(8)]
    known: list[RemoteLogSegmentMetadata] = []
    next_offset: dict[int, int] = {}
    out = []
    probe = MetadataCache.__new__(MetadataCache)
    probe.num_partitions = NUM_PARTITIONS
    for _ in range(n):
        r = rnd.random()
        key: bytes | None = b"k"
        value: bytes | None
        if r < 0.30 or not known:
            tp = rnd.choice(tps)
            if known and rnd.random() < 0.1:      # the same id again (a retry, or an id already past STARTED)
                md = rnd.choice(known)
                tp = md.topic_id_partition
                d = rnd.randrange(3)
                md = replace(md, start_offset=md.start_offset + d, end_offset_inclusive=md.end_offset_inclusive + d,
                             segment_leader_epochs=tuple((e, o + d) for e, o in md.segment_leader_epochs))
            else:
                start = rnd.randrange(0, 10_000, 10)
                e0 = rnd.randrange(4)
                epochs = ((e0, start),) if rnd.random() < 0.7 else ((e0, start), (e0 + 1, start + 5))
                ble = rnd.choice([None, None, 0, 1, 2, 3])
                md = RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.UUID(int=rnd.getrandbits(128))), start,
                                              start + 9, 1, rnd.randrange(3), 2, 100, epochs,
                                              rnd.choice([None, b"rsm", b"\xffRLMx"]), S.COPY_SEGMENT_STARTED,
                                              rnd.random() < 0.5, ble)
                known.append(md)
            value = serde.encode(md)
        elif r < 0.80:
            md = rnd.choice(known)
            tp = md.topic_id_partition
            sid = md.remote_log_segment_id if rnd.random() < 0.95 else RemoteLogSegmentId(tp, uuid.uuid4())
            state = rnd.choice([S.COPY_SEGMENT_FINISHED] * 3 + [S.DELETE_SEGMENT_STARTED] * 2
                               + [S.DELETE_SEGMENT_FINISHED])
            value = serde.encode(RemoteLogSegmentMetadataUpdate(sid, rnd.randrange(10**6),
                                                                rnd.choice([None, b"c", b"longer custom"]), state,
                                                                rnd.randrange(3)))
        elif r < 0.815:
            tp = rnd.choice(tps)
            value = serde.encode(RemotePartitionDeleteMetadata(tp, rnd.choice(list(P)), 5, 1))
        elif r < 0.94:
            md = rnd.choice(known)
            tp = md.topic_id_partition
            key = encode_key(KeyKind.SEGMENT, tp.topic_id, tp.partition, md.remote_log_segment_id.id,
                             rnd.choice(list(S)))
            value = None
        else:
            tp = rnd.choice(tps)
            value = rnd.choice([b"\x01\x07\x00junk", b"", b"\x01\x00\x00" + bytes(rnd.randrange(40))])
        mp = probe.mp_of(tp)
        off = next_offset.get(mp, 0)
        next_offset[mp] = off + 1
        out.append((mp, off, key, value))
    return out


def _state(cache: MetadataCache) -> tuple:
    return cache.dump(), [cache.progress(mp) for mp in range(NUM_PARTITIONS)]


@pytest.mark.parametrize("seed", range(12))
def test_batched_apply_equals_one_by_one(tmp_path, seed: int) -> None:
    rnd = random.Random(seed)
    records = _stream(rnd, 600)
    batched = MetadataCache(tmp_path / "batched", topic="m", num_partitions=NUM_PARTITIONS)
    single = MetadataCache(tmp_path / "single", topic="m", num_partitions=NUM_PARTITIONS)
    try:
        skipped_b, skipped_s = [], []
        applied_b = applied_s = 0
        i = 0
        while i < len(records):
            n = rnd.choice([1, 2, 7, 50, 300])
            out = batched.apply(records[i:i + n], {})
            skipped_b += out.skipped
            applied_b += out.applied + out.tombstones
            i += n
        for rec in records:
            out = single.apply([rec], {})
            skipped_s += out.skipped
            applied_s += out.applied + out.tombstones
        assert skipped_b == skipped_s
        assert applied_b == applied_s
        assert len(skipped_s) + applied_s == len(records)
        assert {s.reason for s in skipped_s} == {"corrupt", "refused"}   # the stream exercises both
        assert any(s.fenced for s in skipped_s) and any(s.deleted_already for s in skipped_s)   # fencing, races
        assert _state(batched) == _state(single)
    finally:
        batched.close()
        single.close()


@pytest.mark.parametrize("seed", range(12))
def test_what_the_cache_keeps_between_calls_answers_as_the_state_read_again(tmp_path, seed: int) -> None:
    """The segment values and fences a cache keeps from one apply call to the next (issue 26) decide as reading them
    from RocksDB at each call does: the same stream, one record a call, into a cache that keeps them and one that
    forgets them before each call (range deletes of finished partition deletes and wipes included)."""
    rnd = random.Random(seed)
    records = _stream(rnd, 600)
    kept = MetadataCache(tmp_path / "kept", topic="m", num_partitions=NUM_PARTITIONS)
    read = MetadataCache(tmp_path / "read", topic="m", num_partitions=NUM_PARTITIONS)
    try:
        skipped_k, skipped_r = [], []
        wiped = records[len(records) // 2][0]
        for i, rec in enumerate(records):
            if i == len(records) // 2:   # a rebuild of one metadata partition: wiped, its records applied again
                for cache in (kept, read):
                    cache.wipe([wiped])
                replay = [r for r in records[:i] if r[0] == wiped]
                skipped_k += kept.apply(replay, {}).skipped
                read._views.clear()
                read._fences.clear()
                skipped_r += read.apply(replay, {}).skipped
            skipped_k += kept.apply([rec], {}).skipped
            read._views.clear()
            read._fences.clear()
            skipped_r += read.apply([rec], {}).skipped
        assert skipped_k == skipped_r
        assert any(s.fenced for s in skipped_k)
        assert _state(kept) == _state(read)
    finally:
        kept.close()
        read.close()


def test_a_call_that_failed_leaves_nothing_kept_of_what_it_did_not_write(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """A call whose write fails raises, and what it scanned of its own records (not written) is not kept: the next
    call finds that segment unknown, as RocksDB does."""
    import rlmm.cache

    cache = MetadataCache(tmp_path / "c", topic="m", num_partitions=NUM_PARTITIONS)
    try:
        tp = TopicIdPartition(uuid.uuid4(), "t", 0)
        md = RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.uuid4()), 0, 9, 1, 0, 2, 100, ((0, 0),), None,
                                      S.COPY_SEGMENT_STARTED, False, 1)
        mp = cache.mp_of(tp)

        def failing(self, extra) -> None:  # noqa: ANN001
            raise OSError("no space left on device")

        with monkeypatch.context() as m:
            m.setattr(rlmm.cache._Batch, "write", failing)
            with pytest.raises(OSError):
                cache.apply([(mp, 0, b"k", serde.encode(md))], {})
        finished = RemoteLogSegmentMetadataUpdate(md.remote_log_segment_id, 5, None, S.COPY_SEGMENT_FINISHED, 0)
        out = cache.apply([(mp, 0, b"k", serde.encode(finished))], {})
        assert [s.reason for s in out.skipped] == ["refused"] and cache.segments(tp) == []
    finally:
        cache.close()
