"""Transactions against the real broker: nothing at or above the last stable offset is uploaded while a
transaction is open, and read_committed remote reads return exactly the committed records."""

from __future__ import annotations

import time
from pathlib import Path

from confluent_kafka import Producer

from devtools.devkafka import KafkaCluster
from rlm.sidecar import Sidecar
from rlmm.api import TopicIdPartition
from tests.support.sidecar import assert_contiguous, latest_remote, make_settings, only, remote_segments, wait_for
from tests.support.txn import TxnProducer, plain


def test_read_committed_and_nothing_above_the_lso(kafka: KafkaCluster, topic_name: str, tmp_path: Path) -> None:
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300"})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    tx = TxnProducer(kafka, topic_name)
    committed: dict[int, tuple[bytes, bytes]] = {}
    aborted: dict[int, tuple[bytes, bytes]] = {}
    for round_ in range(3):
        committed |= tx.txn(f"c{round_}", 60, commit=True)
        aborted |= tx.txn(f"a{round_}", 40, commit=False)
        committed |= plain(kafka, topic_name, f"p{round_}", 20)  # non-transactional records in between
        time.sleep(0.35)
    # A transaction left open across several rolls: the LSO stays at its first offset.
    tx.p.begin_transaction()
    pending = tx.send("open", 50)
    lso = min(pending)
    for round_ in range(3):
        time.sleep(0.35)
        committed |= plain(kafka, topic_name, f"q{round_}", 30)

    with Sidecar(make_settings(kafka, tmp_path, topics=only(topic_name))) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= max(aborted), 60, "the segments below the LSO to be remote")
        time.sleep(2.0)  # many copy runs while the transaction stays open
        below = remote_segments(sidecar, tp)
        assert below[-1].end_offset_inclusive < lso, (below[-1].end_offset_inclusive, lso)
        assert_contiguous(below)

        tx.p.commit_transaction(30)
        committed |= pending
        time.sleep(0.35)
        committed |= plain(kafka, topic_name, "roll", 1)
        wait_for(lambda: latest_remote(sidecar, tp) >= max(committed) - 1, 60, "the rest to be remote")
        segs = remote_segments(sidecar, tp)
        assert_contiguous(segs)
        last = segs[-1].end_offset_inclusive
        want = {o: kv for o, kv in committed.items() if o <= last}

        got = {r.offset: (r.key, r.value) for r in sidecar.reader.read(tp, 0, isolation="read_committed")}
        assert got == want
        assert not got.keys() & aborted.keys()
        everything = {r.offset: (r.key, r.value) for r in sidecar.reader.read(tp, 0)}
        assert everything == want | aborted  # read_uncommitted: aborted records too, control batches never


def test_abort_marker_found_past_a_record_with_a_future_timestamp(kafka: KafkaCluster, topic_name: str,
                                                                   tmp_path: Path) -> None:
    """An aborted transaction's marker lies two segments later, behind a record whose producer clock runs 30 min
    ahead: the abort-marker search follows offsets and last stable offsets, not record timestamps (issue 9 #6)."""
    topic_id = kafka.create_topic(topic_name, 1, config={"segment.ms": "300",
                                                          "message.timestamp.after.max.ms": str(24 * 3600_000)})
    tp = TopicIdPartition(topic_id, topic_name, 0)
    plain_p = Producer({"bootstrap.servers": kafka.bootstrap_servers})
    ahead = int(time.time() * 1000) + 30 * 60_000  # another producer's clock, 30 min ahead

    def future(value: bytes, skew_ms: int) -> None:
        plain_p.produce(topic_name, value=value, partition=0, timestamp=ahead + skew_ms)
        assert plain_p.flush(30) == 0

    tx = TxnProducer(kafka, topic_name)
    tx.p.begin_transaction()
    aborted = tx.send("doomed", 5)       # segment A: the transaction's records, timestamps now
    future(b"ahead-1", 0)                # rolls (30 min after A's first timestamp): segment M
    future(b"ahead-2", 1000)             # rolls again: segment N
    tx.p.abort_transaction(30)           # the ABORT marker, and its transaction index entry, land in N
    future(b"ahead-3", 2000)             # rolls N
    future(b"ahead-4", 3000)
    with Sidecar(make_settings(kafka, tmp_path, topics=only(topic_name))) as sidecar:
        wait_for(lambda: latest_remote(sidecar, tp) >= max(aborted) + 3, 60, "the marker's segment to be remote")
        segs = remote_segments(sidecar, tp)
        assert len(segs) >= 3, [(m.start_offset, m.end_offset_inclusive) for m in segs]
        got = [(r.offset, r.value) for r in sidecar.reader.read(tp, 0, isolation="read_committed")]
        assert not {o for o, _v in got} & aborted.keys(), got
        assert [v for _o, v in got][:2] == [b"ahead-1", b"ahead-2"], got
        everything = {r.offset for r in sidecar.reader.read(tp, 0)}
        assert aborted.keys() <= everything  # read_uncommitted still sees them
