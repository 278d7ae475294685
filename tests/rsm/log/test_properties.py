"""Property tests: the parsers, fed random bytes and random mutations of batches the real broker wrote, raise
only LogFormatError subclasses (never another exception, never a wrong record, never a hang)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rsm.log import (
    Codec,
    CorruptCheckpointError,
    CorruptIndexError,
    LogFormatError,
    PartitionDir,
    decode_records,
    iter_batches_with_bytes,
    read_offset_index,
    read_time_index,
    read_txn_index,
    scan_batches,
)
from rsm.log.batch import ATTRIBUTES_OFFSET, header_from_bytes
from rsm.log.checkpoint import parse_leader_epoch_checkpoint, parse_partition_metadata

pytestmark = pytest.mark.kafka
PROPS = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
_counter = itertools.count()


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("rsmlog-props")


@pytest.fixture(scope="module")
def real_batches(broker_topics) -> list[bytes]:
    """A few small broker-written batches: each codec, and a control batch."""
    out: dict[str, bytes] = {}
    for t in broker_topics.values():
        for seg in PartitionDir(t.pdir).rolled_segments():
            for h, data in iter_batches_with_bytes(seg.log_path):
                kind = "control" if h.is_control else h.codec.name
                if (h.record_count > 1 or h.is_control) and (kind not in out or len(out[kind]) > h.size_bytes):
                    out[kind] = bytes(data)  # the smallest of its kind keeps the examples fast
    assert {"NONE", "GZIP", "SNAPPY", "LZ4", "ZSTD", "control"} <= set(out)
    return list(out.values())


def _write(scratch: Path, data: bytes) -> Path:
    p = scratch / f"{next(_counter):020d}.log"
    p.write_bytes(data)
    return p


mutation = st.tuples(st.sampled_from(["set", "insert", "delete", "truncate"]), st.integers(0, 1 << 30),
                     st.integers(0, 255))


def _mutate(buf: bytes, ops) -> bytes:
    b = bytearray(buf)
    for op, where, value in ops:
        if not b:
            break
        i = where % len(b)
        if op == "set":
            b[i] = value
        elif op == "insert":
            b.insert(i, value)
        elif op == "delete":
            del b[i]
        else:
            del b[i:]
    return bytes(b)


def test_header_from_bytes_matches_scan(broker_topics):
    for t in broker_topics.values():
        for seg in PartitionDir(t.pdir).rolled_segments():
            for h, data in iter_batches_with_bytes(seg.log_path):
                assert header_from_bytes(data, h.position, seg.log_path) == h


@PROPS
@given(which=st.integers(0, 100), ops=st.lists(mutation, min_size=1, max_size=4))
def test_header_from_bytes_mutated(real_batches, which, ops):
    try:
        h = header_from_bytes(_mutate(real_batches[which % len(real_batches)], ops), 0, "remote-entry")
    except LogFormatError as err:
        assert "remote-entry" in str(err)
    else:
        assert h.codec in set(Codec) and h.last_offset >= h.base_offset


def _scan_and_decode(path: Path, verify_crc: bool) -> list:
    out = []
    for h, data in iter_batches_with_bytes(path, verify_crc=verify_crc):
        out.append((h, decode_records(h, data, path=path)))
    return out


@PROPS
@given(data=st.binary(max_size=400))
def test_random_bytes_scan(scratch, data):
    p = _write(scratch, data)
    for verify in (True, False):
        try:
            _scan_and_decode(p, verify)
        except LogFormatError:
            pass






@PROPS
@given(which=st.integers(0, 100), ops=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_real_batch(scratch, real_batches, which, ops):
    original = real_batches[which % len(real_batches)]
    mutated = _mutate(original, ops)
    p = _write(scratch, original + mutated)  # a valid batch, then the mutated copy
    # CRC-checked: either an error, or the CRC-covered bytes are intact and the records are the original's
    try:
        got = _scan_and_decode(p, True)
    except LogFormatError:
        got = None
    if got is not None and not mutated:
        assert len(got) == 1
    elif got is not None:
        assert len(got) == 2
        assert mutated[ATTRIBUTES_OFFSET:] == original[ATTRIBUTES_OFFSET:]
        (h0, r0), (h1, r1) = got
        shift = h1.base_offset - h0.base_offset
        assert [(r.key, r.value, r.headers, r.offset + shift) for r in r0] == [
            (r.key, r.value, r.headers, r.offset) for r in r1]
    # Unchecked: decoding garbage still only raises LogFormatError
    try:
        _scan_and_decode(_write(scratch, mutated), False)
    except LogFormatError:
        pass


@PROPS
@given(data=st.binary(max_size=200), base=st.integers(0, 1 << 40))
def test_index_readers(scratch, data, base):
    p = _write(scratch, data)
    for reader in (lambda: read_offset_index(p, base), lambda: read_time_index(p, base), lambda: read_txn_index(p)):
        try:
            reader()
        except CorruptIndexError as err:
            assert str(p) in str(err)


@PROPS
@given(text=st.one_of(st.text(max_size=200), st.from_regex(r"0\n[0-9]{1,2}\n([0-9 -]{1,8}\n){0,4}", fullmatch=True),
                      st.from_regex(r"version: 0\ntopic_id: [A-Za-z0-9_=+/-]{0,30}\n", fullmatch=True)))
def test_checkpoint_parsers(text):
    for parse in (parse_leader_epoch_checkpoint, parse_partition_metadata):
        try:
            parse(text, "the-file")
        except CorruptCheckpointError as err:
            assert "the-file" in str(err)


def test_scan_start_position_inside_a_batch(broker_topics):
    """Starting at a byte that is not a batch boundary (a wrong index position) is an error, not garbage."""
    seg = PartitionDir(broker_topics["gzip"].pdir).rolled_segments()[0]
    headers = list(scan_batches(seg.log_path))
    for start in range(1, min(headers[0].size_bytes, 200)):
        try:
            got = list(scan_batches(seg.log_path, start_position=start))
        except LogFormatError:
            continue
        pytest.fail(f"a scan from byte {start} yielded {len(got)} batches")


def test_an_empty_leader_epoch_checkpoint_holds_no_entry(tmp_path: Path) -> None:
    """Kafka creates a new partition's leader-epoch-checkpoint empty before its first write (seen in the chaos run
    right after a topic was re-created: the copy and expiration tasks failed on 'found 0 lines'); it reads as no
    entry, as Kafka reads it. One line, or a count without its entries, is still corrupt."""
    from rsm.log.partition import PartitionDir

    assert parse_leader_epoch_checkpoint("", "the-file") == []
    pdir = tmp_path / "orders-0"
    pdir.mkdir()
    (pdir / "leader-epoch-checkpoint").write_text("")
    assert PartitionDir(pdir).leader_epochs() == []
    for bad in ("0\n", "0\n1\n", " "):
        with pytest.raises(CorruptCheckpointError, match="the-file"):
            parse_leader_epoch_checkpoint(bad, "the-file")
