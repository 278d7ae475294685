"""A local segment that straddles the highest remote offset (a new leader whose replica rolled at other offsets):
the storage manager copies exactly ``[start_offset, end_offset_inclusive]`` of a segment the real broker wrote."""

from __future__ import annotations

import dataclasses
import re

import pytest

from rsm.api import IndexType
from rsm.errors import RemoteResourceNotFoundError, RemoteStorageError
from rsm.format.ledger import SegmentRangeError, kept_range
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.verify import verify_segment

pytestmark = [pytest.mark.kafka, pytest.mark.s3]


def _straddling(broker_segments):
    """A broker segment with enough batches, and the index of the batch the copy starts at (H + 1)."""
    seg = max(broker_segments, key=lambda s: len(s.batches))
    assert len(seg.batches) >= 6
    return seg, len(seg.batches) // 2


def test_straddling_segment_copies_exactly_its_range(store, broker_segments):
    seg, k = _straddling(broker_segments)
    kept = seg.batches[k:]
    start = kept[0].base_offset  # the highest remote offset H is seg.batches[k - 1].last_offset
    assert start > seg.base_offset
    local = seg.data.log_path.read_bytes()
    first_pos = kept[0].position

    kr = kept_range(seg.data.log_path, start, seg.end_offset_inclusive)
    assert (kr.position, kr.size_bytes, kr.first_offset, kr.skipped_batches) == (
        first_pos, len(local) - first_pos, start, k)

    md = dataclasses.replace(seg.metadata(), start_offset=start, segment_size_bytes=kr.size_bytes)
    rsm = RemoteStorageManager(RsmConfig(block_size_bytes=8 * 1024), store)
    rsm.copy_log_segment_data(md, seg.data)
    rsm._cache.drop(rsm.keys(md).index)  # read back what the store holds, not what the copy cached

    reader = rsm.reader(md)
    ledger = reader.ledger
    assert ledger.metadata.start_offset == start
    assert ledger.metadata.segment_size_bytes == kr.size_bytes
    assert ledger.metadata.entry_count == len(kept)
    assert ledger.blocks[0].first_offset == start and ledger.log_start_position == first_pos
    # every read sees only the kept batches
    entries = list(reader.iter_entries())
    assert [(e.base_offset, e.last_offset, e.log_position) for e in entries] == [
        (b.base_offset, b.last_offset, b.position) for b in kept]
    assert all(bytes(e.data) == local[b.position:b.end_position] for e, b in zip(entries, kept, strict=True))
    assert ledger.block_for_offset(start - 1) is None
    with pytest.raises(RemoteResourceNotFoundError):
        reader.locate(seg.batches[0].base_offset)
    assert reader.locate(start).entry_id == 0
    assert reader.locate(kept[-1].last_offset).entry_id == len(kept) - 1
    earliest = min(b.max_timestamp for b in seg.batches[:k])
    hit = reader.find_timestamp(earliest)
    assert hit is not None and hit.base_offset >= start
    assert hit.base_offset == next(b.base_offset for b in kept if b.max_timestamp >= earliest)
    # original positions: the kept bytes from the first kept batch on; a start below it begins there
    with rsm.fetch_log_segment(md, first_pos) as f:
        assert f.read() == local[first_pos:]
    with rsm.fetch_log_segment(md, 0) as f:
        assert f.read() == local[first_pos:]
    with rsm.fetch_log_segment(md, 0, first_pos - 1) as f:
        assert f.read() == b""
    mid = kept[1].position + 5
    with rsm.fetch_log_segment(md, mid, mid + 100) as f:
        assert f.read() == local[mid:mid + 101]
    with pytest.raises(ValueError):
        rsm.fetch_log_segment(md, len(local))
    # Kafka's index sections as the broker wrote them
    with rsm.fetch_index(md, IndexType.OFFSET) as f:
        assert f.read() == seg.data.offset_index_path.read_bytes()
    assert verify_segment(rsm.store, rsm.keys(md)).ok


def test_range_not_at_a_batch_boundary_fails_with_nothing_uploaded(store, broker_segments):
    seg, k = _straddling(broker_segments)
    multi = next(i for i in range(1, len(seg.batches)) if seg.batches[i].last_offset > seg.batches[i].base_offset)
    b = seg.batches[multi]
    rsm = RemoteStorageManager(RsmConfig(block_size_bytes=8 * 1024), store)
    # (start, end, error, found before the first block: nothing is written at all)
    bad = [
        (b.base_offset + 1, seg.end_offset_inclusive, rf"{b.base_offset}\.\.{b.last_offset}", True),  # in a batch
        (seg.end_offset_inclusive + 5, seg.end_offset_inclusive + 10, "no batch at or after", True),  # past all
        # the end inside the last batch: found when the scan gets there, after the blocks before it were written
        # (a segment of one 8 KiB block or of several, as the broker batched it): nothing is left in the store
        (seg.base_offset, seg.batches[-1].last_offset - 1, "past the segment's end offset", False),
    ]
    for start, end, what, before_any_write in bad:
        md = dataclasses.replace(seg.metadata(), start_offset=start, end_offset_inclusive=end)
        with pytest.raises(RemoteStorageError, match=re.escape(str(seg.data.log_path))) as err:
            rsm.copy_log_segment_data(md, seg.data)
        assert re.search(what, str(err.value)), str(err.value)
        assert str(start) in str(err.value)
        assert list(store.list(rsm.keys(md).prefix)) == []
        if before_any_write:
            writes = {k: v for k, v in store.requests.snapshot().items() if re.search("put|upload", k, re.I)}
            assert writes == {}, writes
        with pytest.raises(SegmentRangeError):
            kept_range(seg.data.log_path, start, end)
