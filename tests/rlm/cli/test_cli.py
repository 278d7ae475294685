"""The operator command line end to end: ``rlm ls / cat / offsets / verify / gc`` run as their own processes
(``python -m rlm.cli ... --config FILE``) against what a real broker wrote and an in-process sidecar tiered.

One module-scoped set-up produces three topics and tiers them:

- ``main``: partition 0 gets four segments of records with explicit timestamps (binary values, null keys and
  values, headers; several batches per segment), partition 1 two segments from ``produce_segments``;
- ``txn``: committed and aborted transactions with plain records in between;
- ``scratch``: three segments that the verify and gc tests corrupt and litter.

Expectations come from what was produced and from the broker's own ``.log`` files (read with
``rlm dump-segment``), never from the remote read path under test.
"""

from __future__ import annotations

import base64
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.support.kafka import partition_dir, produce
from tests.support.processes import b64, json_lines, ok, rlm
from tests.support.sidecar import (
    latest_remote,
    make_settings,
    produce_segments,
    remote_segments,
    settings_yaml,
    store_keys,
    wait_for,
)
from tests.support.txn import TxnProducer, plain

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]

# offset -> (key, value, headers, timestamp)
Produced = dict[int, tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int]]


def local_batches(kafka: KafkaCluster, topic: str, partition: int) -> list[dict[str, Any]]:
    """Every batch of the broker's local log of ``topic-partition`` (``rlm dump-segment`` over each ``.log``)."""
    out: list[dict[str, Any]] = []
    for log in sorted(partition_dir(kafka, topic, partition).glob("*.log")):
        out += [b for b in json_lines(ok(rlm("dump-segment", str(log)))) if b["type"] == "batch"]
    return sorted(out, key=lambda b: b["base_offset"])


def local_segment_sizes(kafka: KafkaCluster, topic: str, partition: int) -> dict[int, int]:
    """Base offset -> bytes of each of the broker's local ``.log`` files of the partition."""
    return {int(p.stem): p.stat().st_size for p in partition_dir(kafka, topic, partition).glob("*.log")}


@dataclass
class Tiered:
    config: Path
    root: Path
    main: str
    main_id: uuid.UUID
    p0: Produced  # main-0
    p0_rounds: list[list[int]]  # offsets of each round (one segment each)
    p0_ts: list[list[int]]  # timestamps of each round
    p1: dict[int, tuple[bytes, bytes]]  # main-1
    txn: str
    committed: dict[int, tuple[bytes, bytes]]
    aborted: dict[int, tuple[bytes, bytes]]
    aborted_txns: list[list[int]]
    scratch: str
    scratch_id: uuid.UUID
    scratch_sent: dict[int, tuple[bytes, bytes]]
    last_remote: dict[tuple[str, int], int] = field(default_factory=dict)
    batches: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)


def produce_timed_round(kafka: KafkaCluster, topic: str, r: int, n: int, base_ts: int) -> Produced:
    """Round ``r``: ``n`` records at ``base_ts + r * 60 s + i`` ms, in batches of at most 25 records. Values are
    binary (not UTF-8); some keys and values are null, some values empty, some records carry headers."""
    recs = []
    for i in range(n):
        key = None if i % 50 == 7 else f"k{r}-{i}".encode()
        value: bytes | None = bytes((r * 31 + i * 7 + j * 13) % 256 for j in range(40 + i % 60))
        if i % 50 == 11:
            value = b""
        elif i % 50 == 13:
            value = None
        headers = [("h", bytes([i % 256, 0xFF])), ("n", f"{r}.{i}".encode())] if i % 10 == 3 else []
        recs.append((key, value, headers or None, base_ts + r * 60_000 + i))
    acks = produce(kafka, topic, recs, partition=0, **{"batch.num.messages": 25})
    return {off: (k, v, h or [], ts) for (_p, off), (k, v, h, ts) in zip(acks, recs, strict=True)}


@pytest.fixture(scope="module")
def tiered(kafka: KafkaCluster, tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("cli")
    tag = uuid.uuid4().hex[:8]
    main, txn, scratch = f"cli-main-{tag}", f"cli-txn-{tag}", f"cli-scratch-{tag}"
    main_id = kafka.create_topic(main, 2, config={"segment.ms": "400"})
    txn_id = kafka.create_topic(txn, 1, config={"segment.ms": "300"})
    scratch_id = kafka.create_topic(scratch, 1, config={"segment.ms": "300"})

    # main-0: four segments; a segment rolls when a record is more than segment.ms younger than its first
    # record, so each round (timestamps 0..199 ms apart, rounds 60 s apart) is exactly one segment.
    base_ts = (int(time.time() * 1000) - 3_600_000) // 1000 * 1000
    p0: Produced = {}
    rounds: list[list[int]] = []
    for r in range(4):
        got = produce_timed_round(kafka, main, r, 200, base_ts)
        rounds.append(sorted(got))
        p0 |= got
    produce(kafka, main, [(b"__roll__", b"r")], partition=0)  # "now": rolls the fourth segment
    # main-1: two segments from produce_segments, rolled by wall-clock time.
    p1 = produce_segments(kafka, main, 2, 100, segment_ms=400, roll=False, partition=1)
    time.sleep(0.45)
    produce(kafka, main, [(b"__roll__", b"r")], partition=1)

    # txn: committed and aborted transactions, plain records in between, one segment per round.
    tx = TxnProducer(kafka, txn)
    committed: dict[int, tuple[bytes, bytes]] = {}
    aborted: dict[int, tuple[bytes, bytes]] = {}
    aborted_txns: list[list[int]] = []
    for r in range(3):
        committed |= tx.txn(f"c{r}", 60, commit=True)
        a = tx.txn(f"a{r}", 40, commit=False)
        aborted |= a
        aborted_txns.append(sorted(a))
        committed |= plain(kafka, txn, f"p{r}", 20)
        time.sleep(0.35)
    tx.p.flush(30)
    produce(kafka, txn, [(b"__roll__", b"r")])

    scratch_sent = produce_segments(kafka, scratch, 3, 100, segment_ms=300)

    t = Tiered(tmp / "sidecar.yaml", tmp / "remote", main, main_id, p0, rounds,
               [[p0[o][3] for o in rd] for rd in rounds], p1, txn, committed, aborted, aborted_txns, scratch,
               scratch_id, scratch_sent)
    settings = make_settings(kafka, tmp, topics={"include": [re.escape(n) for n in (main, txn, scratch)]})
    t.config.write_text(settings_yaml(settings))
    want = {(main, 0): max(p0), (main, 1): max(p1), (txn, 0): max(committed | aborted),
            (scratch, 0): max(scratch_sent)}
    ids = {main: main_id, txn: txn_id, scratch: scratch_id}
    with Sidecar(settings) as sidecar:
        for (topic, part), last in want.items():
            tp = TopicIdPartition(ids[topic], topic, part)
            wait_for(lambda tp=tp, last=last: latest_remote(sidecar, tp) >= last, 180, f"{tp} to be remote")
            t.last_remote[(topic, part)] = remote_segments(sidecar, tp)[-1].end_offset_inclusive
        for key in want:
            t.batches[key] = local_batches(kafka, *key)
        # The CLI runs next to this live sidecar (its own metadata cache; the sidecar keeps its RocksDB locked).
        yield t


# ------------------------------------------------------------------------------------------------------- ls
def test_ls_lists_every_remote_segment(kafka: KafkaCluster, tiered: Tiered) -> None:
    t = tiered
    rows = json_lines(ok(rlm("ls", t.main, "--json", config=t.config)))
    by_part = {p: [r for r in rows if r["partition"] == p] for p in (0, 1)}
    assert len(rows) == len(by_part[0]) + len(by_part[1])
    assert all(r["topic"] == t.main and r["state"] == "COPY_SEGMENT_FINISHED" for r in rows), rows

    # main-0: one remote segment per produced round, with its offsets, max timestamp, and the .log's size.
    p0 = by_part[0]
    assert [(r["start_offset"], r["end_offset"]) for r in p0] == [(rd[0], rd[-1]) for rd in t.p0_rounds]
    assert [r["max_timestamp_ms"] for r in p0] == [max(ts) for ts in t.p0_ts]
    sizes = local_segment_sizes(kafka, t.main, 0)
    assert [r["size_bytes"] for r in p0] == [sizes[r["start_offset"]] for r in p0]
    assert all(r["leader_epochs"] == [[0, r["start_offset"]]] for r in p0), p0
    assert len({r["segment_id"] for r in rows}) == len(rows)

    # main-1: contiguous from 0 up to the last produced record.
    p1 = by_part[1]
    assert len(p1) >= 2
    assert p1[0]["start_offset"] == 0 and p1[-1]["end_offset"] == max(t.p1)
    for a, b in zip(p1, p1[1:], strict=False):
        assert b["start_offset"] == a["end_offset"] + 1
    sizes1 = local_segment_sizes(kafka, t.main, 1)
    assert [r["size_bytes"] for r in p1] == [sizes1[r["start_offset"]] for r in p1]

    # With a partition: only that partition. The table shows the same segments.
    only1 = json_lines(ok(rlm("ls", t.main, "1", "--json", config=t.config)))
    assert only1 == p1
    table = ok(rlm("ls", t.main, config=t.config)).splitlines()
    assert table[0].split() == ["PARTITION", "START", "END", "BYTES", "MAX_TIMESTAMP_MS", "STATE"]
    assert [line.split() for line in table[1:]] == [
        [str(r["partition"]), str(r["start_offset"]), str(r["end_offset"]), str(r["size_bytes"]),
         str(r["max_timestamp_ms"]), r["state"]] for r in rows]


def test_ls_unknown_topic_or_partition(tiered: Tiered) -> None:
    t = tiered
    proc = rlm("ls", f"no-such-topic-{uuid.uuid4().hex[:6]}", config=t.config)
    assert proc.returncode == 2 and "no such topic partition" in proc.stderr, proc.stderr
    proc = rlm("ls", t.main, "7", config=t.config)
    assert proc.returncode == 2 and f"{t.main}-7: no such topic partition" in proc.stderr, proc.stderr


# ------------------------------------------------------------------------------------------------------ cat
def inside_last_batch_of_round_1(t: Tiered) -> tuple[int, int]:
    """(N, i): an offset inside (not at the start of) the last batch of main-0's second segment, which is
    ``t.batches[(main, 0)][i]``."""
    batches = t.batches[(t.main, 0)]
    i = next(i for i, b in enumerate(batches) if b["last_offset"] == t.p0_rounds[1][-1])
    b = batches[i]
    assert b["records"] >= 2, b
    return max(b["base_offset"] + 1, b["last_offset"] - 5), i


def expected_records(p: Produced, offsets: list[int]) -> list[dict[str, Any]]:
    return [{"offset": o, "timestamp": p[o][3], "key": b64(p[o][0]), "value": b64(p[o][1]),
             "headers": [[k, b64(v)] for k, v in p[o][2]], "leader_epoch": 0} for o in offsets]


def max_bytes_offsets(batches: list[dict[str, Any]], start: int, last: int, max_bytes: int) -> list[int]:
    """Offsets a fetch from ``start`` returns under ``max_bytes``: whole batches (at least one) while their
    bytes fit; control batches count but show no record; nothing past ``last`` (the remote end)."""
    read = 0
    out: list[int] = []
    for b in batches:
        if b["last_offset"] < start or b["base_offset"] > last:
            continue
        if read > 0 and read + b["size"] > max_bytes:
            break
        read += b["size"]
        if not b["control"]:
            out += range(max(start, b["base_offset"]), min(last, b["last_offset"]) + 1)
    return out


def test_cat_reads_every_record_byte_exact_across_segments(tiered: Tiered) -> None:
    t = tiered
    assert t.last_remote[(t.main, 0)] == max(t.p0)
    got = json_lines(ok(rlm("cat", t.main, "0", "--from-offset", "0", config=t.config)))
    assert got == expected_records(t.p0, sorted(t.p0))
    # Without --from-offset: from the earliest remote offset.
    assert json_lines(ok(rlm("cat", t.main, "0", "--max-records", "3", config=t.config))) == \
        expected_records(t.p0, sorted(t.p0)[:3])

    # From the middle of a batch near the end of the second segment: that offset onward, into the next segments.
    n, _i = inside_last_batch_of_round_1(t)
    got = json_lines(ok(rlm("cat", t.main, "0", "--from-offset", str(n), config=t.config)))
    assert got == expected_records(t.p0, [o for o in sorted(t.p0) if o >= n])

    # --max-records stops after that many records.
    got = json_lines(ok(rlm("cat", t.main, "0", "--from-offset", str(n), "--max-records", "10", config=t.config)))
    assert [r["offset"] for r in got] == list(range(n, n + 10))  # crosses into the third segment
    assert n + 9 > t.p0_rounds[1][-1]


def test_cat_max_bytes_limits_output(tiered: Tiered) -> None:
    t = tiered
    batches = t.batches[(t.main, 0)]
    last = t.last_remote[(t.main, 0)]
    n, i = inside_last_batch_of_round_1(t)
    assert len(batches) > i + 3 and batches[i + 1]["base_offset"] == t.p0_rounds[2][0]
    # Room for the batch holding N and the next two (the first two of the next segment), not for a fourth.
    room = batches[i]["size"] + batches[i + 1]["size"] + batches[i + 2]["size"] + batches[i + 3]["size"] - 1
    want = max_bytes_offsets(batches, n, last, room)
    assert want == list(range(n, batches[i + 2]["last_offset"] + 1))
    got = json_lines(ok(rlm("cat", t.main, "0", "--from-offset", str(n), "--max-bytes", str(room),
                            config=t.config)))
    assert got == expected_records(t.p0, want)

    # Fewer bytes than one batch: that one batch still (as a Kafka fetch), records from N to its end.
    got = json_lines(ok(rlm("cat", t.main, "0", "--from-offset", str(n), "--max-bytes", "1", config=t.config)))
    assert [r["offset"] for r in got] == list(range(n, batches[i]["last_offset"] + 1))


def test_cat_text_and_out_of_range(tiered: Tiered) -> None:
    t = tiered
    got = json_lines(ok(rlm("cat", t.main, "1", "--text", "--max-records", "5", config=t.config)))
    assert [(r["offset"], r["key"], r["value"]) for r in got] == [
        (o, t.p1[o][0].decode(), t.p1[o][1].decode()) for o in sorted(t.p1)[:5]]
    beyond = t.last_remote[(t.main, 0)] + 1  # the roll record: on the broker, not remote
    proc = rlm("cat", t.main, "0", "--from-offset", str(beyond), config=t.config)
    assert proc.returncode == 4 and proc.stdout == ""  # EXIT_OUT_OF_RANGE
    assert f"offset {beyond} is not remote (remote offsets: 0..{beyond - 1})" in proc.stderr, proc.stderr


def test_cat_exit_codes_tell_nothing_remote_from_out_of_range(kafka: KafkaCluster, tiered: Tiered) -> None:
    """A partition with nothing remote (a topic the sidecar does not tier) exits 3, not 4 nor 1."""
    name = f"untiered-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(name, 1)
    proc = rlm("cat", name, "0", config=tiered.config)
    assert proc.returncode == 3 and proc.stdout == "", (proc.returncode, proc.stderr)
    assert f"{name}-0: nothing remote yet" in proc.stderr
    proc = rlm("cat", name, "0", "--from-offset", "5", config=tiered.config)
    assert proc.returncode == 4 and "offset 5 is not remote (remote offsets: None..None)" in proc.stderr, \
        (proc.returncode, proc.stderr)


def test_cat_read_committed_leaves_out_aborted_records(tiered: Tiered) -> None:
    t = tiered
    last = t.last_remote[(t.txn, 0)]
    committed = {o: kv for o, kv in t.committed.items() if o <= last}
    aborted = {o: kv for o, kv in t.aborted.items() if o <= last}
    assert len(aborted) == 120 and len(committed) == 240, (len(aborted), len(committed))

    def read(*extra: str) -> dict[int, tuple[bytes | None, bytes | None]]:
        rows = json_lines(ok(rlm("cat", t.txn, "0", *extra, config=t.config)))
        offsets = [r["offset"] for r in rows]
        assert offsets == sorted(offsets) and len(set(offsets)) == len(offsets)
        return {r["offset"]: (base64.b64decode(r["key"]), base64.b64decode(r["value"])) for r in rows}

    assert read("--isolation", "read_committed") == committed
    assert read() == committed | aborted  # read_uncommitted: the aborted records too, control records never
    # From inside an aborted transaction: read_committed resumes at the next committed record.
    a = t.aborted_txns[1]
    got = read("--from-offset", str(a[5]), "--isolation", "read_committed", "--max-records", "5")
    assert list(got) == sorted(o for o in committed if o > a[5])[:5]
    assert min(got) > a[-1]


# -------------------------------------------------------------------------------------------------- offsets
def test_offsets_and_timestamp_lookup(tiered: Tiered) -> None:
    t = tiered

    def offsets(partition: int, *extra: str) -> dict[str, Any]:
        (out,) = json_lines(ok(rlm("offsets", t.main, str(partition), *extra, config=t.config)))
        return out

    out = offsets(0)
    assert out == {"topic": t.main, "partition": 0, "earliest_remote_offset": 0, "earliest_leader_epoch": 0,
                   "latest_tiered_offset": max(t.p0), "latest_leader_epoch": 0}
    out1 = offsets(1)
    assert (out1["earliest_remote_offset"], out1["latest_tiered_offset"]) == (0, max(t.p1))

    r1, ts1 = t.p0_rounds[1], t.p0_ts[1]
    batch_starts = {b["base_offset"] for b in t.batches[(t.main, 0)]}
    mid1 = next(j for j in range(30, 200) if r1[j] not in batch_starts)  # inside a batch, not at its start
    mid3 = next(j for j in range(117, 200) if t.p0_rounds[3][j] not in batch_starts)
    cases = {
        t.p0_ts[0][0] - 10_000: 0,  # before everything: the earliest offset
        t.p0_ts[0][0]: 0,
        ts1[mid1]: r1[mid1],  # inside a batch: that record, not its batch's first (as Kafka's ListOffsets)
        ts1[-1] + 1: t.p0_rounds[2][0],  # between two segments: the first record of the next one
        t.p0_ts[3][mid3]: t.p0_rounds[3][mid3],
        t.p0_ts[3][-1] + 1: None,  # after every remote record
    }
    for ts, want in cases.items():
        out = offsets(0, "--timestamp", str(ts))
        assert out["timestamp"] == ts
        assert out["offset_for_timestamp"] == want, (ts, out)
        assert out["leader_epoch_for_timestamp"] == (None if want is None else 0)
        if want is not None:  # the answer is the first record at or after T, as Kafka's ListOffsets
            assert t.p0[want][3] >= ts and all(p[3] < ts for o, p in t.p0.items() if o < want)


# --------------------------------------------------------------------------------------------------- verify
def test_verify_passes_then_names_a_flipped_byte(tiered: Tiered) -> None:
    t = tiered
    counts = {topic: len(json_lines(ok(rlm("ls", topic, "--json", config=t.config))))
              for topic in (t.main, t.txn, t.scratch)}
    assert counts[t.main] >= 6 and counts[t.txn] >= 3 and counts[t.scratch] >= 3, counts
    out = ok(rlm("verify", t.main, t.txn, t.scratch, config=t.config))
    n_segments = sum(counts.values())
    assert out.strip().splitlines()[-1] == f"verified {n_segments} segments: {n_segments} ok, 0 bad", out

    # Flip one byte inside a record value of the scratch topic's second segment.
    rows = json_lines(ok(rlm("ls", t.scratch, "--json", config=t.config)))
    seg = rows[1]
    target = seg["start_offset"] + 42
    value = t.scratch_sent[target][1]
    (data_path,) = [p for p in t.root.rglob(f"{seg['start_offset']:020d}-{seg['segment_id']}*")
                    if not p.name.endswith("-index")]
    raw = bytearray(data_path.read_bytes())
    pos = raw.find(value)
    assert pos > 0 and raw.find(value, pos + 1) == -1
    raw[pos + 10] ^= 0x01
    data_path.write_bytes(bytes(raw))
    key = str(data_path.relative_to(t.root))
    batch = next(b for b in t.batches[(t.scratch, 0)] if b["base_offset"] <= target <= b["last_offset"])

    proc = rlm("verify", t.scratch, config=t.config)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    bad = [line for line in proc.stdout.splitlines() if line.startswith("BAD ")]
    assert len(bad) == 1, proc.stdout
    assert f"{key} at byte " in bad[0] and f"(Kafka offset {batch['base_offset']})" in bad[0], bad[0]
    assert "CRC" in bad[0]
    n = counts[t.scratch]
    assert proc.stdout.strip().splitlines()[-1] == f"verified {n} segments: {n - 1} ok, 1 bad"
    # The other topics are untouched.
    n = counts[t.main] + counts[t.txn]
    assert ok(rlm("verify", t.main, t.txn, config=t.config)).strip().splitlines()[-1] == \
        f"verified {n} segments: {n} ok, 0 bad"


# ------------------------------------------------------------------------------------------------------- gc
def test_gc_dry_run_lists_the_orphan_then_gc_deletes_only_it(tiered: Tiered) -> None:
    t = tiered
    rows = json_lines(ok(rlm("ls", t.scratch, "--json", config=t.config)))
    assert len(rows) >= 3
    (first_index,) = list(t.root.rglob(f"{rows[0]['start_offset']:020d}-{rows[0]['segment_id']}-index"))
    pdir = first_index.parent  # <topic>-<topic id>/0/
    orphan_id = uuid.uuid4()
    orphans = [pdir / f"{rows[-1]['end_offset'] + 1:020d}-{orphan_id}", pdir / f"{rows[-1]['end_offset'] + 1:020d}-"
               f"{orphan_id}-index"]
    for p in orphans:
        p.write_bytes(b"left behind by a copy that crashed before its COPY_SEGMENT_STARTED")
    foreign = pdir / "notes.txt"  # not a segment key: gc leaves it alone
    foreign.write_text("an operator's file")
    orphan_keys = sorted(str(p.relative_to(t.root)) for p in orphans)
    before = store_keys(t.root)
    assert set(orphan_keys) < before

    out = ok(rlm("gc", t.scratch, "--dry-run", config=t.config)).splitlines()
    assert sorted(line.removeprefix("orphan ") for line in out[:-1]) == orphan_keys
    assert all(line.startswith("orphan ") for line in out[:-1])
    assert out[-1] == "2 objects orphaned"
    assert store_keys(t.root) == before

    # Within the grace period nothing goes.
    out = ok(rlm("gc", t.scratch, "--grace-ms", "3600000", config=t.config)).splitlines()
    assert out == ["0 objects deleted"]
    assert store_keys(t.root) == before

    out = ok(rlm("gc", t.scratch, config=t.config)).splitlines()  # tasks.gc_grace_ms is 0
    assert sorted(line.removeprefix("deleted ") for line in out[:-1]) == orphan_keys
    assert out[-1] == "2 objects deleted"
    assert store_keys(t.root) == before - set(orphan_keys)
    assert foreign.read_text() == "an operator's file"
    assert ok(rlm("gc", t.scratch, "--dry-run", config=t.config)).splitlines() == ["0 objects orphaned"]
    # The remote segments are all still readable.
    got = json_lines(ok(rlm("cat", t.scratch, "0", "--from-offset", str(rows[-1]["start_offset"]),
                            config=t.config)))
    assert [r["offset"] for r in got] == list(range(rows[-1]["start_offset"], rows[-1]["end_offset"] + 1))


def test_gc_all_partitions_lists_the_whole_store(tiered: Tiered) -> None:
    """For a lost GC state file: no topic named; every stored partition whose topic is on the cluster is visited
    (the scratch topic's orphan goes), a partition no metadata knows (another cluster's, sharing the store) stays."""
    t = tiered
    rows = json_lines(ok(rlm("ls", t.scratch, "--json", config=t.config)))
    (first_index,) = list(t.root.rglob(f"{rows[0]['start_offset']:020d}-{rows[0]['segment_id']}-index"))
    pdir = first_index.parent  # <topic>-<topic id>/0/
    orphan_id = uuid.uuid4()
    orphans = [pdir / f"{rows[-1]['end_offset'] + 1:020d}-{orphan_id}{suffix}" for suffix in ("", "-index")]
    foreign_id = uuid.uuid4()
    foreign_dir = pdir.parent.parent / f"elsewhere-{foreign_id}" / "0"
    foreign_dir.mkdir(parents=True)
    foreign = [foreign_dir / f"{0:020d}-{uuid.uuid4()}{suffix}" for suffix in ("", "-index")]
    for path in orphans + foreign:
        path.write_bytes(b"no metadata of this cluster owns it")
    orphan_keys = sorted(str(p.relative_to(t.root)) for p in orphans)

    out = ok(rlm("gc", "--all-partitions", "--dry-run", config=t.config)).splitlines()
    assert [line for line in out if line.startswith("left alone ")] == [
        f"left alone elsewhere-0({foreign_id}): unknown to the metadata (another cluster's data in a shared bucket, "
        "or the metadata was lost: rlm recover rebuilds it): left alone"]
    assert sorted(line.removeprefix("orphan ") for line in out if line.startswith("orphan ")) == orphan_keys
    assert out[-1] == "2 objects orphaned"

    out = ok(rlm("gc", "--all-partitions", config=t.config)).splitlines()  # tasks.gc_grace_ms is 0
    assert sorted(line.removeprefix("deleted ") for line in out if line.startswith("deleted ")) == orphan_keys
    assert not any(p.exists() for p in orphans) and all(p.exists() for p in foreign)

    both = rlm("gc", t.scratch, "--all-partitions", config=t.config)
    assert both.returncode == 2 and "name the topics, or --all-partitions" in both.stderr, both.stderr


# ---------------------------------------------------------------------------------------- config and help
OPERATOR_COMMANDS = [["ls", "t"], ["cat", "t", "0"], ["offsets", "t", "0"], ["verify", "t"], ["gc", "t"]]


@pytest.mark.parametrize("argv", OPERATOR_COMMANDS, ids=lambda a: a[0])
def test_bad_field_names_the_field(argv: list[str], tmp_path: Path) -> None:
    config = tmp_path / "sidecar.yaml"
    config.write_text(
        "broker_id: 1\nlog_dirs: [/tmp/x]\nkafka: {bootstrap_servers: '127.0.0.1:1'}\n"
        "tasks: {copy_interval_ms: 5}\nretention: [{pattern: '(', retention_ms: -1}]\n")
    proc = rlm(*argv, config=config, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert f"rlm: {config}: invalid configuration" in proc.stderr
    assert "tasks.copy_interval_ms: Input should be greater than or equal to 100" in proc.stderr, proc.stderr
    assert "retention.0.pattern" in proc.stderr and "not a regular expression" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("text,message", [
    (None, "cannot read"),
    ("broker_id: 1\nlog_dirs: [/tmp/x]\nkafka: {bootstrap_server: 'h:1'}\n", "kafka.bootstrap_server: Extra"),
    ("broker_id: 1\nlog_dirs: [/tmp/x]\nkafka: {bootstrap_server: 'h:1'}\n", "kafka.bootstrap_servers: Field "
                                                                              "required"),
    ("broker_id: -1\nlog_dirs: [/tmp/x]\nkafka: {bootstrap_servers: 'h:1'}\n", "broker_id: Input should be"),
    ("kafka: [unclosed\n", "not valid YAML"),
    ("- just\n- a list\n", "the top level must be a mapping, found list"),
], ids=["missing-file", "unknown-field", "missing-field", "negative-broker-id", "not-yaml", "not-a-mapping"])
def test_bad_config_file(text: str | None, message: str, tmp_path: Path) -> None:
    config = tmp_path / "sidecar.yaml"
    if text is not None:
        config.write_text(text)
    proc = rlm("ls", "t", config=config, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.startswith(f"rlm: {config}: ") and message in proc.stderr, proc.stderr


def test_missing_config_argument_is_a_usage_error() -> None:
    proc = rlm("ls", "t", timeout=120)
    assert proc.returncode == 2
    assert "the following arguments are required: --config/-c" in proc.stderr, proc.stderr


def subcommands() -> list[str]:
    from rlm.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if a.dest == "command"]
    return list(sub.choices)


def help_options(cmd: str) -> set[str]:
    """The long options ``rlm CMD --help`` lists (exit 0 checked)."""
    proc = rlm(cmd, "--help", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: rlm {cmd}"), proc.stdout
    return set(re.findall(r"(--[a-z][a-z-]*)", proc.stdout)) - {"--help"}


def readme_synopsis() -> dict[str, tuple[set[str], set[str]]]:
    """README's command-line block: subcommand -> (long options, positional words)."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Command line", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    out: dict[str, tuple[set[str], set[str]]] = {}
    cmd = ""
    for line in filter(str.strip, block.splitlines()):
        synopsis = re.split(r"\s{3,}", line.strip())[0]  # drop the description column
        if line.startswith("rlm "):
            cmd = synopsis.split()[1]
            out[cmd] = (set(), set())
        opts, words = out[cmd]
        opts |= set(re.findall(r"(--[a-z][a-z-]*)", synopsis))
        words |= set(re.findall(r"\b([A-Z]+)\b(?:\.\.\.)?", re.sub(r"--[a-z-]+ [A-Z]+", "", synopsis)))
    return out


def test_every_subcommand_has_help_and_the_readme_matches_it() -> None:
    cmds = subcommands()
    assert set(cmds) == {"demo", "dump-segment", "serve", "ls", "cat", "offsets", "verify", "gc",
                         "recover", "status"}
    top = rlm("--help", timeout=120)
    assert top.returncode == 0 and all(c in top.stdout for c in cmds), top.stdout
    readme = readme_synopsis()
    assert set(readme) == set(cmds), sorted(readme)
    for cmd in cmds:
        opts = help_options(cmd)
        assert readme[cmd][0] == opts, (cmd, sorted(readme[cmd][0]), sorted(opts))
    # Positional arguments as README names them.
    assert readme["ls"][1] == {"TOPIC", "PARTITION"}
    assert readme["cat"][1] == {"TOPIC", "PARTITION"}
    assert readme["verify"][1] == {"TOPIC"} and readme["gc"][1] == {"TOPIC"} and readme["status"][1] == {"TOPIC"}
    assert readme["dump-segment"][1] == {"PATH"}
