"""rsm.log.producer_snapshot against ``.snapshot`` files the real broker wrote while transactions were open,
committed and aborted (cross-checked with Kafka's own DumpLogSegments); the same bytes damaged; and a copy's
snapshot read back through the storage manager's read interface (``SegmentHandle.producer_snapshot``)."""

from __future__ import annotations

import dataclasses
import re
import shutil
import struct
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from rsm.api import EpochEntry, LogSegmentData, ProducerStateEntry, RemoteSegmentMetadata
from rsm.errors import CorruptRemoteObjectError
from rsm.log.batch import BatchHeader, scan_batches
from rsm.log.errors import CorruptIndexError, CorruptProducerSnapshotError, LogFormatError
from rsm.log.partition import LEADER_EPOCH_CHECKPOINT, PartitionDir, segment_file_name
from rsm.log.producer_snapshot import (
    ENTRY,
    PREFIX,
    format_producer_snapshot,
    ongoing_txn_first_offsets,
    parse_producer_snapshot,
    read_producer_snapshot,
)
from rsm.log.records import ControlType, control_type, decode_records
from rsm.manager import RemoteStorageManager, RsmConfig
from tests.support.kafka import partition_dir, produce, roll_and_wait


# ----------------------------------------------------------------------------------------- the broker's snapshots
@dataclass
class BrokerSnapshots:
    topic: str
    topic_id: uuid.UUID
    copies: Path  # the partition's files, copied aside while the broker still had them
    open_snapshot: Path  # taken at the first forced roll: transaction A open
    closed_snapshot: Path  # taken at the second: A committed, B aborted, C open
    txns: dict[str, list[int]]  # transaction -> offsets of its data records, as the broker acknowledged them
    batches: list[BatchHeader]  # every batch below the closed snapshot's offset, in order
    first_segment: tuple[int, int]  # (base offset, end offset inclusive) of the segment before the open snapshot
    dump: str  # Kafka's DumpLogSegments of the two snapshots


def _begin(kafka, name: str, topic: str, n: int) -> tuple[Producer, list[int]]:
    """A transactional producer with a transaction begun and ``n`` records in it, acknowledged."""
    p = Producer({"bootstrap.servers": kafka.bootstrap_servers, "transactional.id": f"{topic}-{name}",
                  "linger.ms": 5})
    p.init_transactions(30)
    p.begin_transaction()
    offsets: list[int] = []

    def cb(err, msg):
        if err is not None:
            raise RuntimeError(f"delivery failed: {err}")
        offsets.append(msg.offset())

    for i in range(n):
        p.produce(topic, key=b"%s-%d" % (name.encode(), i), value=b"v" * (10 + i), partition=0, on_delivery=cb)
    if p.flush(30) != 0 or len(offsets) != n:
        raise RuntimeError(f"transaction {name}: {len(offsets)} of {n} records acknowledged")
    return p, sorted(offsets)


def _roll(kafka, topic: str, pdir: Path) -> int:
    """Roll the active segment (a non-transactional filler record once it is older than segment.ms, which takes
    a producer snapshot named by the new segment's base); that base."""
    rolled = roll_and_wait(kafka, topic, 0, rolled=len(list(pdir.glob("*.log"))))
    return max(int(p.stem) for p in pdir.glob("*.log") if p not in rolled)


@pytest.fixture(scope="module")
def broker_snapshots(kafka, tmp_path_factory) -> BrokerSnapshots:
    topic = f"rsmlog-snapshot-{uuid.uuid4().hex[:8]}"
    topic_id = kafka.create_topic(topic, 1, config={"segment.ms": "200", "retention.ms": "-1"})
    produce(kafka, topic, [(b"plain-%d" % i, b"p") for i in range(5)])  # so transaction A does not start at 0
    pdir = partition_dir(kafka, topic)
    txns: dict[str, list[int]] = {}
    a, txns["A"] = _begin(kafka, "A", topic, 10)
    first_roll = _roll(kafka, topic, pdir)  # A still open
    a.commit_transaction(30)
    b, txns["B"] = _begin(kafka, "B", topic, 7)
    b.abort_transaction(30)
    c, txns["C"] = _begin(kafka, "C", topic, 3)
    second_roll = _roll(kafka, topic, pdir)  # A committed, B aborted, C open
    c.abort_transaction(30)  # nothing left open behind the test
    del a, b, c

    copies = tmp_path_factory.mktemp("broker-snapshots") / pdir.name
    copies.mkdir()
    for p in pdir.iterdir():
        if p.suffix in (".log", ".index", ".timeindex", ".txnindex", ".snapshot") or p.name == LEADER_EPOCH_CHECKPOINT:
            shutil.copyfile(p, copies / p.name)
    open_snapshot = copies / f"{first_roll:020d}.snapshot"
    closed_snapshot = copies / f"{second_roll:020d}.snapshot"
    assert open_snapshot.exists() and closed_snapshot.exists(), sorted(q.name for q in copies.iterdir())
    segments = [seg for seg in PartitionDir(copies).segments() if seg.base_offset < second_roll]
    batches = [h for seg in segments for h in scan_batches(seg.log_path) if h.base_offset < second_roll]
    # the segment that ends where the open snapshot starts (segment.ms is short: the broker may have rolled before)
    first_base = max(seg.base_offset for seg in segments if seg.base_offset < first_roll)
    dump = kafka.run_class("org.apache.kafka.tools.DumpLogSegments",
                           ["--files", f"{open_snapshot},{closed_snapshot}"], timeout=60)
    assert dump.returncode == 0, dump.stderr
    return BrokerSnapshots(topic, topic_id, copies, open_snapshot, closed_snapshot, txns, batches,
                           (first_base, first_roll - 1), dump.stdout)


def _producer_id(s: BrokerSnapshots, name: str) -> tuple[int, int]:
    """(producer id, epoch) of a transaction, from the headers of the batches holding its records."""
    offsets = set(s.txns[name])
    ids = {(h.producer_id, h.producer_epoch) for h in s.batches
           if not h.is_control and offsets & set(range(h.base_offset, h.last_offset + 1))}
    assert len(ids) == 1, ids
    return ids.pop()


def _expected_entry(s: BrokerSnapshots, name: str, below: int, txn_first: int, coordinator_epoch: int
                    ) -> ProducerStateEntry:
    """What Kafka's producer state holds for a transaction's producer at offset ``below``: sequence and offsets
    from its last data batch, the timestamp from its last batch (an end marker too)."""
    pid, epoch = _producer_id(s, name)
    mine = [h for h in s.batches if h.producer_id == pid and h.last_offset < below]
    last = [h for h in mine if not h.is_control][-1]
    assert last.last_offset == max(s.txns[name])
    delta = last.last_offset - last.base_offset
    return ProducerStateEntry(pid, epoch, last.base_sequence + delta, last.last_offset, delta,
                              mine[-1].max_timestamp, coordinator_epoch, txn_first)


def _marker_coordinator_epoch(s: BrokerSnapshots, name: str, kind: ControlType) -> int:
    """The coordinator epoch in a transaction's end marker (value: Int16 version, Int32 coordinator epoch)."""
    pid, _ = _producer_id(s, name)
    for seg in PartitionDir(s.copies).segments():
        for h in scan_batches(seg.log_path):
            if h.is_control and h.producer_id == pid:
                data = memoryview(seg.log_path.read_bytes()[h.position:h.end_position])
                assert control_type(h, data) == kind
                (record,) = decode_records(h, data, path=seg.log_path)
                return struct.unpack(">hi", record.value)[1]
    raise AssertionError(f"no end marker of transaction {name}")


@pytest.mark.kafka
def test_snapshot_with_an_open_transaction(broker_snapshots):
    s = broker_snapshots
    entries = read_producer_snapshot(s.open_snapshot)
    a = s.txns["A"]
    assert min(a) == 5  # after the five plain records
    # the non-transactional (non-idempotent) records leave no producer state; A's first offset is recorded
    assert entries == [_expected_entry(s, "A", int(s.open_snapshot.stem), min(a), -1)]
    assert entries[0].has_ongoing_txn
    assert ongoing_txn_first_offsets(entries) == {entries[0].producer_id: min(a)}
    assert format_producer_snapshot(entries) == s.open_snapshot.read_bytes()  # Kafka's bytes exactly


@pytest.mark.kafka
def test_snapshot_after_commit_and_abort(broker_snapshots):
    s = broker_snapshots
    entries = read_producer_snapshot(s.closed_snapshot)
    below = int(s.closed_snapshot.stem)
    expected = [
        _expected_entry(s, "A", below, -1, _marker_coordinator_epoch(s, "A", ControlType.COMMIT)),
        _expected_entry(s, "B", below, -1, _marker_coordinator_epoch(s, "B", ControlType.ABORT)),
        _expected_entry(s, "C", below, min(s.txns["C"]), -1),
    ]
    assert sorted(entries, key=lambda e: e.producer_id) == sorted(expected, key=lambda e: e.producer_id)
    assert [e.has_ongoing_txn for e in expected] == [False, False, True]
    assert ongoing_txn_first_offsets(entries) == {expected[2].producer_id: min(s.txns["C"])}
    assert format_producer_snapshot(entries) == s.closed_snapshot.read_bytes()


_DUMPED = re.compile(
    r"producerId: (-?\d+) producerEpoch: (-?\d+) coordinatorEpoch: (-?\d+) "
    r"currentTxnFirstOffset: OptionalLong(?:\[(\d+)\]|\.empty) lastTimestamp: (-?\d+) firstSequence: -?\d+ "
    r"lastSequence: (-?\d+) lastOffset: (-?\d+) offsetDelta: (-?\d+) timestamp: (-?\d+)")


@pytest.mark.kafka
def test_kafka_dump_log_segments_agrees(broker_snapshots):
    """Kafka's own reader of the same two files (DumpLogSegments) sees the same entries, in the same order."""
    s = broker_snapshots
    theirs = [ProducerStateEntry(int(m[1]), int(m[2]), int(m[6]), int(m[7]), int(m[8]), int(m[9]), int(m[3]),
                                 -1 if m[4] is None else int(m[4])) for m in _DUMPED.finditer(s.dump)]
    assert all(m[5] == m[9] for m in _DUMPED.finditer(s.dump))  # one Timestamp field: both are it
    ours = [e for p in (s.open_snapshot, s.closed_snapshot) for e in read_producer_snapshot(p)]
    assert len(theirs) == 4 and theirs == ours, s.dump


# ----------------------------------------------------------------------------------------- damaged and synthetic
def _sample() -> bytes:
    return format_producer_snapshot([
        ProducerStateEntry(4001, 0, 9, 42, 9, 1_700_000_000_000, -1, 33),
        ProducerStateEntry(4002, 3, 120, 80, 4, 1_700_000_000_500, 7, -1),
    ])


def test_empty_snapshot_golden_bytes():
    data = format_producer_snapshot([])
    # Version 1, CRC-32C of the four-byte zero count (0x48674BC7), count 0: what Kafka writes for no producers
    assert data == bytes.fromhex("0001" "48674bc7" "00000000")
    assert parse_producer_snapshot(data, path="empty.snapshot") == []
    assert ongoing_txn_first_offsets([]) == {}


def test_round_trip():
    data = _sample()
    assert len(data) == PREFIX.size + 2 * ENTRY.size == 102
    entries = parse_producer_snapshot(memoryview(data), path="x.snapshot")
    assert [e.producer_id for e in entries] == [4001, 4002]
    assert ongoing_txn_first_offsets(entries) == {4001: 33}
    assert format_producer_snapshot(entries) == data


@pytest.mark.parametrize(("cut", "field"), [
    (0, "Version"), (1, "Version"), (4, "Crc"), (8, "ProducerEntries count"),
    (PREFIX.size, "entry 0 .* ProducerId"), (PREFIX.size + 13, "entry 0 .* LastSequence"),
    (PREFIX.size + 2 * ENTRY.size - 1, "entry 1 .* CurrentTxnFirstOffset"),
])
def test_truncated_names_path_and_field(cut, field):
    path = "dir/00000000000000000042.snapshot"
    with pytest.raises(CorruptProducerSnapshotError, match=rf"^dir/00000000000000000042\.snapshot at byte {cut}: "
                       rf"truncated .*{field}") as ei:
        parse_producer_snapshot(_sample()[:cut], path=path)
    assert isinstance(ei.value, LogFormatError) and (ei.value.path, ei.value.position) == (path, cut)


@pytest.mark.parametrize("position", [PREFIX.size, PREFIX.size + ENTRY.size - 1, PREFIX.size + ENTRY.size + 20])
def test_flipped_byte_is_a_crc_error(position):
    data = bytearray(_sample())
    data[position] ^= 0x01
    with pytest.raises(CorruptProducerSnapshotError, match=r"^p\.snapshot at byte 2: Crc: stored CRC-32C "
                       r"0x[0-9A-F]{8} does not match"):
        parse_producer_snapshot(data, path="p.snapshot")


def test_flipped_crc_version_count_and_trailing_bytes():
    data = _sample()
    bad = bytearray(data)
    bad[3] ^= 0x10  # in the stored CRC
    with pytest.raises(CorruptProducerSnapshotError, match="at byte 2: Crc"):
        parse_producer_snapshot(bad, path="p.snapshot")
    bad = bytearray(data)
    bad[1] = 2
    with pytest.raises(CorruptProducerSnapshotError, match="at byte 0: Version: expected .* version 1, found 2"):
        parse_producer_snapshot(bad, path="p.snapshot")
    bad = bytearray(data)
    bad[9] = 3  # count 3: the file holds two entries
    with pytest.raises(CorruptProducerSnapshotError, match=r"truncated .* count 3 .*entry 2 .*CRC-32C .* does not"):
        parse_producer_snapshot(bad, path="p.snapshot")
    bad = bytearray(data)
    bad[6:10] = b"\xff\xff\xff\xff"
    with pytest.raises(CorruptProducerSnapshotError, match=r"at byte 6: ProducerEntries count: -1 \(a null array\)"):
        parse_producer_snapshot(bad, path="p.snapshot")
    with pytest.raises(CorruptProducerSnapshotError, match=r"at byte 102: 3 bytes after the last of 2 entries"):
        parse_producer_snapshot(data + b"abc", path="p.snapshot")


# ----------------------------------------------------------------------------------------- through the storage manager
def _copy(rsm: RemoteStorageManager, s: BrokerSnapshots, snapshot: Path | None) -> RemoteSegmentMetadata:
    """Copy the segment before the open snapshot (with ``snapshot`` as its producer snapshot)."""
    base, end = s.first_segment
    seg = next(x for x in PartitionDir(s.copies).segments() if x.base_offset == base)
    batches = list(scan_batches(seg.log_path))
    assert batches[-1].last_offset == end
    md = RemoteSegmentMetadata(
        remote_segment_id=uuid.uuid4(), topic_id=s.topic_id, topic_name=s.topic, partition=0, start_offset=base,
        end_offset_inclusive=end, max_timestamp_ms=max(h.max_timestamp for h in batches),
        segment_size_bytes=seg.log_path.stat().st_size, broker_id=1, event_timestamp_ms=int(time.time() * 1000),
        segment_leader_epochs=(EpochEntry(batches[0].partition_leader_epoch, base),))
    data = LogSegmentData(seg.log_path, seg.offset_index_path, seg.time_index_path, seg.txn_index_path, snapshot,
                          (s.copies / LEADER_EPOCH_CHECKPOINT).read_bytes())
    return dataclasses.replace(md, custom_metadata=rsm.copy_log_segment_data(md, data))


@pytest.mark.kafka
def test_copy_read_back_through_the_storage_manager(broker_snapshots, tmp_path):
    s = broker_snapshots
    config = RsmConfig(store="fs", root_path=tmp_path / "remote", fsync=False)
    rsm = RemoteStorageManager(config)
    fresh = RemoteStorageManager(config)  # no cached index: reads the copy's index object
    try:
        # Kafka uploads <end offset + 1>.snapshot with a segment: here the one taken while A was open
        assert int(s.open_snapshot.stem) == s.first_segment[1] + 1
        with_snapshot = _copy(rsm, s, s.open_snapshot)
        got = rsm.open_segment(with_snapshot).producer_snapshot()
        assert got == read_producer_snapshot(s.open_snapshot)
        assert ongoing_txn_first_offsets(got) == {_producer_id(s, "A")[0]: min(s.txns["A"])}
        assert fresh.open_segment(with_snapshot).producer_snapshot() == got

        without = _copy(rsm, s, None)
        assert rsm.open_segment(without).producer_snapshot() is None
        assert fresh.open_segment(without).producer_snapshot() is None
    finally:
        rsm.close()
        fresh.close()


@pytest.mark.kafka
def test_corrupt_snapshot_in_a_copy_is_a_corrupt_remote_object(broker_snapshots, tmp_path):
    """A snapshot already bad when uploaded (so its section CRC matches): the handle raises
    CorruptRemoteObjectError naming the data object and the byte, never returns entries."""
    s = broker_snapshots
    bad = tmp_path / s.open_snapshot.name
    bad.write_bytes(s.open_snapshot.read_bytes()[:-5])
    rsm = RemoteStorageManager(RsmConfig(store="fs", root_path=tmp_path / "remote", fsync=False))
    try:
        md = _copy(rsm, s, bad)
        size = bad.stat().st_size
        with pytest.raises(CorruptRemoteObjectError, match=rf"^\S+ at byte \d+: producer snapshot section \({size} "
                           rf"bytes\), at its byte {size}: truncated .*CurrentTxnFirstOffset") as ei:
            rsm.open_segment(md).producer_snapshot()
        assert ei.value.key == rsm.keys(md).data(0)  # the data object holding the section
        assert isinstance(ei.value.__cause__, CorruptProducerSnapshotError)
    finally:
        rsm.close()


@pytest.mark.kafka
def test_corrupt_transaction_index_in_a_copy_is_a_corrupt_remote_object(broker_snapshots, tmp_path):
    """A transaction index already bad when uploaded: like the producer snapshot, CorruptRemoteObjectError naming
    the data object and the byte (it raised the local-file CorruptIndexError, naming no object)."""
    s = broker_snapshots
    base, _end = s.first_segment
    copies = tmp_path / s.copies.name  # a partition dir's name
    shutil.copytree(s.copies, copies)
    txn = copies / segment_file_name(base, ".txnindex")
    txn.write_bytes((txn.read_bytes() if txn.exists() else b"") + b"abc")  # not a multiple of the entry size
    rsm = RemoteStorageManager(RsmConfig(store="fs", root_path=tmp_path / "remote", fsync=False))
    try:
        md = _copy(rsm, dataclasses.replace(s, copies=copies), None)
        size = txn.stat().st_size
        with pytest.raises(CorruptRemoteObjectError, match=rf"^\S+ at byte \d+: transaction index section \({size} "
                           r"bytes\), at its byte \d+: ") as ei:
            rsm.open_segment(md).aborted_transactions()
        assert ei.value.key == rsm.keys(md).data(0)
        assert isinstance(ei.value.__cause__, CorruptIndexError)
    finally:
        rsm.close()
