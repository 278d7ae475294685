"""Recovery benchmark (``rlm recover``, issue 13): segments recovered per second and index objects read per second,
with the metadata written one record at a time (two round trips per segment: produce, then read-your-writes) vs.
in batches (every record produced, one flush and one read-your-writes wait per metadata partition and batch).

What runs:

1. a local broker (``devtools.devkafka.KafkaCluster``) and a filesystem store (``fsync`` off: the store's own
   speed is ``bench_rsm``'s business); a small real ``.log`` written by the broker (records of ``--value-bytes``);
2. ``--segments`` copies of it through the storage manager (``copy_log_segment_data``), spread over
   ``--partitions`` partitions, each rebased to its own offsets (batch base offsets patched; the CRC does not
   cover them) with the broker's own offset and time indexes;
3. recovery of all of them (:class:`rlm.recovery.Recoverer`, as ``rlm recover`` runs it) into a fresh metadata
   topic, once per write mode: listing + index objects read (``--read-threads``), then the writes. Reported:
   seconds of each phase, segments/s overall, MB of index objects read per second, and the time 100k segments
   would take at that rate.

    .venv/bin/python bench/bench_recover.py                       # 10,000 segments
    .venv/bin/python bench/bench_recover.py --segments 2000 --partitions 4
"""

from __future__ import annotations

import argparse
import shutil
import struct
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # devtools/ lives in the checkout, not the package

from confluent_kafka import Producer  # noqa: E402

from devtools.devkafka import KafkaCluster  # noqa: E402
from rlm.recovery import Recoverer  # noqa: E402
from rlmm.api import TopicIdPartition  # noqa: E402
from rlmm.topic_manager import TopicBasedRemoteLogMetadataManager, TopicBasedRlmmConfig  # noqa: E402
from rsm.api import EpochEntry, LogSegmentData, RemoteSegmentMetadata  # noqa: E402
from rsm.manager import RemoteStorageManager, RsmConfig  # noqa: E402

__all__: list[str] = []

MB = 1_000_000


def real_segment(kafka: KafkaCluster, topic: str, records: int, value_bytes: int) -> tuple[bytes, bytes, bytes, int]:
    """(log, offset index, time index, records) of the first segment the broker rolled for ``topic``-0."""
    prod = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5, "batch.size": 16384})
    for i in range(records):
        prod.produce(topic, key=f"k{i}".encode(), value=(f"v{i}-".encode() * value_bytes)[:value_bytes], partition=0)
    prod.flush(60)
    time.sleep(1.2)  # past segment.ms: the next append rolls the segment
    prod.produce(topic, key=b"roll", value=b"r", partition=0)
    prod.flush(60)
    pdir = kafka.log_dir(1) / f"{topic}-0"
    deadline = time.monotonic() + 30
    while len(sorted(pdir.glob("*.log"))) < 2:
        if time.monotonic() > deadline:
            raise SystemExit("the broker did not roll the segment")
        time.sleep(0.2)
    log = sorted(pdir.glob("*.log"))[0]
    return (log.read_bytes(), log.with_suffix(".index").read_bytes(), log.with_suffix(".timeindex").read_bytes(),
            records)


def rebased(log: bytes, base: int) -> bytes:
    """``log`` (a segment starting at offset 0) with every batch's base offset moved up by ``base``."""
    out = bytearray(log)
    pos = 0
    while pos + 12 <= len(out):
        first, length = struct.unpack_from(">qi", out, pos)
        struct.pack_into(">q", out, pos, first + base)
        pos += 12 + length
    return bytes(out)


def make_copies(rsm: RemoteStorageManager, topic: str, topic_id: uuid.UUID, partitions: int, segments: int,
                seg: tuple[bytes, bytes, bytes, int], work: Path) -> int:
    log, index, timeindex, n = seg
    (work / "x.index").write_bytes(index)
    (work / "x.timeindex").write_bytes(timeindex)
    size = 0
    for k in range(segments):
        p, i = k % partitions, k // partitions
        base = i * n
        path = work / f"{base:020d}.log"
        path.write_bytes(rebased(log, base))
        md = RemoteSegmentMetadata(
            remote_segment_id=uuid.uuid4(), topic_id=topic_id, topic_name=topic, partition=p, start_offset=base,
            end_offset_inclusive=base + n - 1, max_timestamp_ms=1_700_000_000_000 + base,
            segment_size_bytes=len(log), broker_id=1, event_timestamp_ms=int(time.time() * 1000),
            segment_leader_epochs=(EpochEntry(0, base),))
        rsm.copy_log_segment_data(md, LogSegmentData(path, work / "x.index", work / "x.timeindex", None, None,
                                                     f"0\n1\n0 {base}\n".encode()))
        path.unlink()
        size += len(log)
    return size


def recover(kafka: KafkaCluster, rsm: RemoteStorageManager, work: Path, *, batch_size: int,
            read_threads: int) -> dict[str, float]:
    topic = f"__rlm_md_bench_{uuid.uuid4().hex[:8]}"
    cache = work / f"cache-{topic}"
    marks: dict[str, float] = {}

    def rlmm() -> TopicBasedRemoteLogMetadataManager:
        marks.setdefault("open metadata", time.perf_counter())
        return TopicBasedRemoteLogMetadataManager(TopicBasedRlmmConfig(
            bootstrap_servers=kafka.bootstrap_servers, cache_dir=cache, topic=topic, num_partitions=10,
            replication_factor=1, write_timeout_s=120.0))

    def progress(total: int, what: str):
        marks.setdefault(what, time.perf_counter())
        return lambda _n: None

    t0 = time.perf_counter()
    rec = Recoverer(rsm, rlmm, metadata_exists=False, read_threads=read_threads, batch_size=batch_size,
                    progress=progress)
    try:
        stored = rec.stored_partitions()
        mapped = {sp: TopicIdPartition(sp.topic_id, sp.topic_name, sp.partition) for sp in stored}
        report = rec.run(mapped)
    finally:
        rec.close()
        shutil.rmtree(cache, ignore_errors=True)
    t_end = time.perf_counter()
    assert not report.all_conflicts, report.all_conflicts[:5]
    t_list = marks.get("index objects", t0)
    t_open = marks.get("open metadata", t_end)
    t_write = marks.get("segments written", t_end)
    # reads: listing done -> metadata manager opened; open: topic created, assigned, caught up, chains chosen
    return {"segments": report.segments_written, "total_s": t_end - t0, "list_s": t_list - t0,
            "read_s": t_open - t_list, "open_s": t_write - t_open, "write_s": t_end - t_write}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--segments", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--records", type=int, default=200, help="records per segment")
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--read-threads", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=10_000, help="records per write batch (batched mode)")
    ap.add_argument("--sync-segments", type=int, default=None,
                    help="recover only this many segments' worth in one-at-a-time mode (default: all)")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-recover-"))
    try:
        with KafkaCluster(base_dir=work / "kafka") as kafka:
            src = f"bench-src-{uuid.uuid4().hex[:6]}"
            kafka.create_topic(src, 1, config={"segment.ms": "1000"})
            seg = real_segment(kafka, src, args.records, args.value_bytes)
            print(f"a real segment: {len(seg[0]):,} bytes, {seg[3]} records", flush=True)

            results: list[tuple[str, int, dict[str, float], int]] = []
            for mode, batch, n in (("one at a time", 1, args.sync_segments or args.segments),
                                   (f"batched ({args.batch_size:,})", args.batch_size, args.segments)):
                topic = f"bench-recover-{uuid.uuid4().hex[:6]}"
                topic_id = kafka.create_topic(topic, args.partitions)
                root = work / f"remote-{topic}"
                rsm = RemoteStorageManager(RsmConfig(store="fs", root_path=root, fsync=False))
                try:
                    t0 = time.perf_counter()
                    log_bytes = make_copies(rsm, topic, topic_id, args.partitions, n, seg, work)
                    print(f"{n:,} copies ({log_bytes / MB:,.0f} MB of log) in {time.perf_counter() - t0:.1f}s",
                          flush=True)
                    index_bytes = sum(p.stat().st_size for p in root.rglob("*-index"))
                    r = recover(kafka, rsm, work, batch_size=batch, read_threads=args.read_threads)
                    print(f"{mode}: {r}", flush=True)
                    assert r["segments"] == n, r
                    results.append((mode, n, r, index_bytes))
                finally:
                    rsm.close()
                    shutil.rmtree(root, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print()
    print(f"{'writes':<20} {'segments':>9} {'list s':>7} {'read s':>7} {'open s':>7} {'write s':>8} {'total s':>8} "
          f"{'segments/s':>11} {'index MB/s':>11} {'100k segments':>14}")
    for mode, n, r, index_bytes in results:
        rate = n / r["total_s"]
        print(f"{mode:<20} {n:>9,} {r['list_s']:>7.1f} {r['read_s']:>7.1f} {r['open_s']:>7.1f} "
              f"{r['write_s']:>8.1f} {r['total_s']:>8.1f} "
              f"{rate:>11,.0f} {index_bytes / MB / max(r['read_s'], 1e-9):>11.1f} {100_000 / rate:>13.0f}s")


if __name__ == "__main__":
    main()
