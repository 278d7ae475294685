"""Metadata record values: golden bytes, Kafka's own serde as oracle, unknown tags, fuzzing (no broker)."""

from __future__ import annotations

import random
import uuid
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlmm import envelope, scan, serde
from rlmm.api import (
    CorruptMetadataRecordError,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from tests.rlmm.strategies import metadata, segments, updates

S = RemoteLogSegmentState
TID = uuid.UUID("01020304-0506-0708-090a-0b0c0d0e0f10")
SID = uuid.UUID("11121314-1516-1718-191a-1b1c1d1e1f20")
TP = TopicIdPartition(TID, "foo", 3)
SEG = RemoteLogSegmentMetadata(RemoteLogSegmentId(TP, SID), 100, 199, 1_700_000_000_000, 1, 1_700_000_000_001,
                               4096, {0: 100, 2: 150}, b"cm", RemoteLogSegmentState.COPY_SEGMENT_STARTED, True)

# The layout of the module docstring, spelled out field by field.
TP_BYTES = "04" + b"foo".hex() + TID.hex + "00000003" + "00"              # Name, Id, Partition, tags
SEG_GOLDEN = "".join([
    "01", "00", "00",                                                   # frame version 1, api key 0, version 0
    TP_BYTES, SID.hex, "00",                                            # RemoteLogSegmentId {TopicIdPartition, Id}
    "0000000000000064", "00000000000000c7",                             # StartOffset 100, EndOffset 199
    "00000001",                                                         # BrokerId 1
    "0000018bcfe56800", "0000018bcfe56801",                             # MaxTimestampMs, EventTimestampMs
    "03",                                                               # SegmentLeaderEpochs: 2 entries
    "00000000" "0000000000000064" "00",                                 # {0, 100, tags}
    "00000002" "0000000000000096" "00",                                 # {2, 150, tags}
    "00001000",                                                         # SegmentSizeInBytes 4096
    "03" + b"cm".hex(),                                                 # CustomMetadata (2 bytes)
    "00",                                                               # RemoteLogSegmentState STARTED
    "01" "00" "01" "01",                                                # tags: 1 field, tag 0, size 1, true
])
UPDATE = RemoteLogSegmentMetadataUpdate(RemoteLogSegmentId(TP, SID), 5, None,
                                        RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 2)
UPDATE_GOLDEN = "".join(["01", "01", "00", TP_BYTES, SID.hex, "00", "00000002", "0000000000000005",
                         "00", "01", "00"])                             # null custom metadata, state 1, tags
PDEL = RemotePartitionDeleteMetadata(TP, RemotePartitionDeleteState.DELETE_PARTITION_STARTED, 7, 3)
PDEL_GOLDEN = "".join(["01", "02", "00", TP_BYTES, "00000003", "0000000000000007", "01", "00"])


@pytest.mark.parametrize(("md", "golden"), [(SEG, SEG_GOLDEN), (UPDATE, UPDATE_GOLDEN), (PDEL, PDEL_GOLDEN)])
def test_golden_bytes_round_trip(md, golden: str) -> None:
    assert serde.encode(md).hex() == golden
    assert serde.decode(bytes.fromhex(golden)) == md


def test_txn_index_empty_false_writes_no_tag() -> None:
    raw = serde.encode(replace(SEG, txn_index_empty=False))
    assert raw.hex() == SEG_GOLDEN[:-8] + "00"
    assert serde.decode(raw).txn_index_empty is False


def test_kafka_reserializes_our_bytes_identically(kafka_probe) -> None:
    """Kafka's RemoteLogMetadataSerde decodes our values and writes back exactly the same bytes."""
    samples = [SEG, UPDATE, PDEL, *_varied_samples(60)]
    lines = kafka_probe.run([f"D {serde.encode(md).hex()}" for md in samples])
    assert len(lines) == 2 * len(samples), lines[:4]
    for i, md in enumerate(samples):
        ours = serde.encode(md).hex()
        assert lines[2 * i] == f"R {ours}", (md, lines[2 * i:2 * i + 2])
    assert "segmentLeaderEpochs={0=100, 2=150}" in lines[1] and "txnIdxEmpty=true" in lines[1]
    assert "state=COPY_SEGMENT_FINISHED" in lines[3] and "brokerId=2" in lines[3]
    assert "state=DELETE_PARTITION_STARTED" in lines[5]


def _varied_samples(n: int) -> list:
    """Deterministic, varied values (names with non-ASCII, extreme ints, big custom metadata, many epochs)."""
    rnd = random.Random(405)
    out: list = []
    for i in range(n):
        tp = TopicIdPartition(uuid.UUID(int=rnd.getrandbits(128)), rnd.choice(["t", "tópic-ü", "x" * 249, "a.b_c"]),
                              rnd.randrange(2**31))
        sid = RemoteLogSegmentId(tp, uuid.UUID(int=rnd.getrandbits(128)))
        custom = rnd.choice([None, b"", rnd.randbytes(200)])
        i64 = rnd.randrange(-(2**63), 2**63)
        i32 = rnd.randrange(-(2**31), 2**31)
        if i % 3 == 0:
            start = rnd.randrange(2**62)
            n_epochs = rnd.randint(1, 70)
            epochs = tuple((e * 3, start + e) for e in range(n_epochs))
            out.append(RemoteLogSegmentMetadata(sid, start, start + n_epochs + rnd.randrange(1000), i64, i32, i64,
                                                i32, epochs, custom, RemoteLogSegmentState.COPY_SEGMENT_STARTED,
                                                rnd.random() < 0.5))
        elif i % 3 == 1:
            out.append(RemoteLogSegmentMetadataUpdate(sid, i64, custom, rnd.choice(list(RemoteLogSegmentState)[1:]),
                                                      i32))
        else:
            out.append(RemotePartitionDeleteMetadata(tp, rnd.choice(list(RemotePartitionDeleteState)), i64, i32))
    return out


def _with_unknown_tags(golden: str) -> bytes:
    # a tag 5 of 3 bytes in the nested TopicIdPartition, and tag 9 in the RemoteLogSegmentId
    tp_tagged = TP_BYTES[:-2] + "01" "05" "03" "aabbcc"
    raw = golden.replace(TP_BYTES + SID.hex + "00", tp_tagged + SID.hex + "01" "09" "00", 1)
    return bytes.fromhex(raw)


def test_unknown_tagged_fields_are_skipped() -> None:
    assert serde.decode(_with_unknown_tags(SEG_GOLDEN)) == SEG
    assert serde.decode(_with_unknown_tags(UPDATE_GOLDEN)) == UPDATE


def test_unknown_tags_in_array_elements_and_top_level() -> None:
    raw = SEG_GOLDEN.replace("00000002" "0000000000000096" "00", "00000002" "0000000000000096" "01" "07" "01" "ff")
    raw = raw[:-8] + "02" "00" "01" "01" "0c" "02" "abcd"
    assert serde.decode(bytes.fromhex(raw)) == SEG


@pytest.mark.parametrize(("raw", "needle"), [
    ("02", "FrameVersion at byte 0"),
    ("010900", "unknown api key 9"),
    ("010002", "unsupported schema version 2 of api key 0"),
    ("010101", "unsupported schema version 1 of api key 1"),
    (SEG_GOLDEN[:60], "RemoteLogSegmentMetadataRecord."),
    (SEG_GOLDEN + "00", "1 trailing bytes"),
    (UPDATE_GOLDEN[:-4] + "07" + "00", "RemoteLogSegmentState"),
    (PDEL_GOLDEN[:-4] + "09" + "00", "unknown partition delete state 9"),
    ("0100" + "00", "Name at byte 3"),
])
def test_corrupt_values_name_field_and_position(raw: str, needle: str) -> None:
    with pytest.raises(CorruptMetadataRecordError, match="byte") as err:
        serde.decode(bytes.fromhex(raw))
    assert needle in str(err.value)


def test_truncation_reports_expected_and_found() -> None:
    raw = bytes.fromhex(SEG_GOLDEN)
    for cut in range(len(raw)):
        with pytest.raises(CorruptMetadataRecordError):
            serde.decode(raw[:cut])
    fixed_at = 3 + (1 + 3 + 16 + 4 + 1) + 16 + 1      # header, TopicIdPartition, segment Id, tags
    with pytest.raises(CorruptMetadataRecordError,
                       match=rf"StartOffset..EventTimestampMs at byte {fixed_at} of {fixed_at + 10}: "
                             r"expected 36 bytes, found 10"):
        serde.decode(raw[:fixed_at + 10])


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(metadata)
def test_round_trip_any(md) -> None:
    assert serde.decode(serde.encode(md)) == md


@settings(max_examples=1500)
@given(st.binary(max_size=200))
def test_fuzz_random_bytes_raise_only_our_error(raw: bytes) -> None:
    try:
        serde.decode(raw)
    except CorruptMetadataRecordError:
        pass


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(metadata, st.data())
def test_fuzz_mutated_records_raise_only_our_error(md, data) -> None:
    raw = bytearray(serde.encode(md))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    try:
        serde.decode(bytes(raw[:cut]))
    except CorruptMetadataRecordError:
        pass


# ------------------------------------------------------------------ the cache's fast path agrees with decode()
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(segments(), updates)
def test_scan_and_patch_agree_with_decode(md, u) -> None:
    raw = serde.encode(md)
    view = scan.scan_segment(raw)
    sid = md.remote_log_segment_id
    assert view.value == raw
    assert (view.topic_id, view.partition, view.segment_id) == (sid.topic_id_partition.topic_id.bytes,
                                                               sid.topic_id_partition.partition, sid.id.bytes)
    assert (view.start_offset, view.end_offset_inclusive, view.epochs, view.state) == (
        md.start_offset, md.end_offset_inclusive, md.segment_leader_epochs, md.state)
    uv = scan.scan_update(serde.encode(u))
    assert (uv.broker_id, uv.event_timestamp_ms, uv.state) == (u.broker_id, u.event_timestamp_ms, u.state)
    patched = scan.patch_segment(view, uv)
    expected = replace(md, state=u.state, broker_id=u.broker_id, event_timestamp_ms=u.event_timestamp_ms,
                       custom_metadata=u.custom_metadata)
    assert serde.decode(patched.value) == expected
    assert scan.scan_segment(patched.value) == patched


@settings(max_examples=1000, suppress_health_check=[HealthCheck.too_slow])
@given(metadata, st.data())
def test_scan_decode_agrees_with_decode(md, data) -> None:
    """The cache's read path (the scanner, for canonical segment records) yields what the careful decoder does."""
    raw = bytearray(serde.encode(md))
    assert scan.decode(bytes(raw)) == md
    for _ in range(data.draw(st.integers(0, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        expected = serde.decode(bytes(raw))
    except CorruptMetadataRecordError:
        with pytest.raises(CorruptMetadataRecordError):
            scan.decode(bytes(raw))
    else:
        assert scan.decode(bytes(raw)) == expected


def test_scan_accepts_unknown_tags_canonically() -> None:
    view = scan.scan_segment(_with_unknown_tags(SEG_GOLDEN))
    assert view.value.hex() == SEG_GOLDEN
    assert scan.scan_update(_with_unknown_tags(UPDATE_GOLDEN)).state == S.COPY_SEGMENT_FINISHED


@settings(max_examples=1500, suppress_health_check=[HealthCheck.too_slow])
@given(metadata, st.data())
def test_fuzz_scanners_raise_only_our_error_and_agree(md, data) -> None:
    raw = bytearray(serde.encode(md))
    for _ in range(data.draw(st.integers(1, 3))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    raw = bytes(raw)
    for scanner, kind in ((scan.scan_segment, RemoteLogSegmentMetadata), (scan.scan_update,
                                                                          RemoteLogSegmentMetadataUpdate)):
        try:
            scanner(raw)
        except CorruptMetadataRecordError:
            try:
                assert not isinstance(serde.decode(raw), kind)   # decode refuses it too (or it is another kind)
            except CorruptMetadataRecordError:
                pass
        else:
            assert isinstance(serde.decode(raw), kind)


# ------------------------------------------------------------- broker leader epoch: CustomMetadata envelope, v1
# rlmm.envelope's layout spelled out: Magic, Version 0, 2 tags: tag 0 (4 bytes) epoch 7, tag 1 (2 bytes) b"cm".
ENVELOPE_7_CM = "ff524c4d" "00" "02" "00" "04" "00000007" "01" "02" + b"cm".hex()
SEG_EPOCH_GOLDEN = SEG_GOLDEN.replace("03" + b"cm".hex() + "00" "01000101",
                                      f"{len(ENVELOPE_7_CM) // 2 + 1:02x}" + ENVELOPE_7_CM + "00" "01000101")


def _v1(v0_golden: str, tags: str) -> bytes:
    """A RemoteLogSegmentMetadataRecord of SchemaVersion 1 (KIP-1266), built from a v0 golden value by hand: the
    same body, SchemaVersion 1, and the given top-level tagged-field section in place of v0's."""
    assert v0_golden.startswith("010000") and v0_golden.endswith("01000101")
    return bytes.fromhex("010001" + v0_golden[6:-8] + tags)


def test_envelope_golden_bytes_round_trip() -> None:
    md = replace(SEG, broker_leader_epoch=7)
    assert SEG_EPOCH_GOLDEN != SEG_GOLDEN
    assert serde.encode(md).hex() == SEG_EPOCH_GOLDEN
    got = serde.decode(bytes.fromhex(SEG_EPOCH_GOLDEN))
    assert got == md and got.custom_metadata == b"cm" and got.broker_leader_epoch == 7
    assert envelope.unwrap(bytes.fromhex(ENVELOPE_7_CM)) == (7, b"cm")
    # no RSM bytes: tag 1 absent (null), not empty
    only_epoch = serde.encode(replace(SEG, custom_metadata=None, broker_leader_epoch=0))
    assert "0d" "ff524c4d" "00" "01" "00" "04" "00000000" "00" in only_epoch.hex()    # 12 bytes, then state
    assert serde.decode(only_epoch).custom_metadata is None and serde.decode(only_epoch).broker_leader_epoch == 0
    assert serde.decode(serde.encode(replace(SEG, custom_metadata=b"", broker_leader_epoch=3))).custom_metadata == b""


def test_v1_broker_leader_epoch_tag_decoded() -> None:
    # tags: 2 fields, tag 0 TxnIndexEmpty (1 byte, true), tag 1 BrokerLeaderEpoch (4 bytes, 9)
    raw = _v1(SEG_GOLDEN, "02" "00" "01" "01" "01" "04" "00000009")
    md = serde.decode(raw)
    assert md == replace(SEG, broker_leader_epoch=9)
    assert md.custom_metadata == b"cm" and md.txn_index_empty
    view = scan.scan_segment(raw)      # the cache stores the canonical v0 value, epoch in the envelope
    assert view.broker_leader_epoch == 9 and view.value == serde.encode(md) and view.value[:3] == b"\x01\x00\x00"
    # the tag wins over an envelope's epoch; without the tag, the envelope's epoch is taken
    assert serde.decode(_v1(SEG_EPOCH_GOLDEN, "02" "00" "01" "01" "01" "04" "00000009")).broker_leader_epoch == 9
    assert serde.decode(_v1(SEG_EPOCH_GOLDEN, "01" "00" "01" "01")).broker_leader_epoch == 7
    assert serde.decode(_v1(SEG_GOLDEN, "01" "00" "01" "01")).broker_leader_epoch is None
    assert serde.decode(_v1(SEG_GOLDEN, "02" "00" "01" "01" "01" "04" "ffffffff")).broker_leader_epoch is None
    # tag 1 is not BrokerLeaderEpoch in version 0: an unknown tag there, skipped
    v0_tag1 = bytes.fromhex(SEG_GOLDEN[:-8] + "02" "00" "01" "01" "01" "04" "00000009")
    assert serde.decode(v0_tag1) == SEG
    with pytest.raises(CorruptMetadataRecordError, match="BrokerLeaderEpoch .*expected a 4-byte int32"):
        serde.decode(_v1(SEG_GOLDEN, "01" "01" "02" "0009"))


@pytest.mark.parametrize("foreign", [b"\x01\x02\x03", b"", b"\xffRL", b"\xffRLM", b"\xffRLM\x01\x00",
                                     b"\xffRLM\x00\x01\x00\x05\x00\x00\x00\x07", b"\xffRLM\x00\x02\x01\x00\x00\x00"])
def test_foreign_custom_metadata_is_the_rsms_bytes_without_epoch(foreign: bytes) -> None:
    """CustomMetadata not in our envelope (Kafka's or another RSM's; also magic-prefixed bytes that do not parse as
    a version-0 envelope) decodes as the RSM's bytes with no epoch, and survives a round trip."""
    raw = bytes.fromhex(SEG_GOLDEN.replace("03" + b"cm".hex(), f"{len(foreign) + 1:02x}" + foreign.hex()))
    md = serde.decode(raw)
    assert (md.custom_metadata, md.broker_leader_epoch) == (foreign, None)
    assert serde.decode(serde.encode(md)) == md
    assert scan.segment_from_view(scan.scan_segment(raw)) == md
    u = replace(UPDATE, custom_metadata=foreign)
    assert serde.decode(serde.encode(u)) == u and scan.scan_update(serde.encode(u)).custom_metadata == foreign


def test_updates_keep_the_segments_epoch() -> None:
    md = replace(SEG, broker_leader_epoch=7)
    u = replace(UPDATE, custom_metadata=b"rsm-after-copy")
    assert md.with_update(u).broker_leader_epoch == 7
    patched = scan.patch_segment(scan.scan_segment(serde.encode(md)), scan.scan_update(serde.encode(u)))
    got = serde.decode(patched.value)
    assert (got.broker_leader_epoch, got.custom_metadata, got.state) == (7, b"rsm-after-copy", u.state)
    assert got == md.with_update(u) and patched.broker_leader_epoch == 7
    assert scan.scan_segment(patched.value) == patched
    again = scan.patch_segment(patched, scan.scan_update(serde.encode(replace(u, custom_metadata=None))))
    assert (serde.decode(again.value).broker_leader_epoch, serde.decode(again.value).custom_metadata) == (7, None)


def test_kafka_decodes_v0_with_envelope_but_not_v1(kafka_probe) -> None:
    """Kafka 4.3's own RemoteLogMetadataSerde reads our v0 values carrying the envelope (and writes back the same
    bytes), but cannot read a v1 record: why the epoch travels in CustomMetadata."""
    with_epoch = [replace(SEG, broker_leader_epoch=7),
                  replace(SEG, custom_metadata=None, broker_leader_epoch=2**31 - 1),
                  replace(SEG, custom_metadata=envelope.MAGIC + b"x")]
    lines = kafka_probe.run([f"D {serde.encode(md).hex()}" for md in with_epoch]
                            + [f"D {_v1(SEG_GOLDEN, '02' '00' '01' '01' '01' '04' '00000009').hex()}"])
    for i, md in enumerate(with_epoch):
        assert lines[2 * i] == f"R {serde.encode(md).hex()}", lines
    n = len(envelope.wrap(7, b"cm"))
    assert f"customMetadata=Optional[CustomMetadata{{{n} bytes}}]" in lines[1]
    assert "state=COPY_SEGMENT_STARTED" in lines[1] and "segmentLeaderEpochs={0=100, 2=150}" in lines[1]
    assert lines[-1].startswith("E ") and len(lines) == 2 * len(with_epoch) + 1, lines[-1]


@settings(max_examples=500)
@given(st.none() | st.integers(0, 2**31 - 1),
       st.none() | st.binary(max_size=300) | st.binary(max_size=200).map(lambda b: envelope.MAGIC + b))
def test_envelope_wrap_unwrap_and_fast_path_agree(epoch, rsm) -> None:
    data = envelope.wrap(epoch, rsm)
    assert envelope.unwrap(data) == (epoch, rsm) and envelope.is_canonical(data)
    if data is not None and data.startswith(envelope.MAGIC):
        framed = b"xx" + data + b"yy"
        assert envelope.canonical_epoch(framed, 2, 2 + len(data)) == epoch
        assert envelope.parse(data) == (epoch, rsm, True)
    else:
        assert data == rsm and epoch is None
