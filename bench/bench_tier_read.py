"""Micro-benchmark of the proxy's tier read (issue 24): history Fetches answered from the filesystem store, without
a broker, a socket or an event loop, so what the tier read costs per GiB shows apart from the rest.

    .venv/bin/python bench/bench_tier_read.py [--mib 256] [--partitions 1] [--fetch-kib 1024] [--rounds 3]
                                              [--profile FILE]

Set-up: ``--partitions`` partitions of ``--mib`` MiB each, written as a broker leaves them (crafted v2 batches of
240 records with 1 KiB values and keys, ~250 KiB a batch as librdkafka's ``batch.size`` makes them in
``bench_proxy``, or ``--batch-records`` 16 for ~16 KiB batches as a Java producer's; 64 MiB segments), copied to a
filesystem store by the sidecar's own copier (4 MiB blocks, the
default), listed by the in-memory metadata manager (:class:`tests.support.rlmm.SyncRlmm`).

A read: a consumer's Fetches one after the other from offset 0 to the end of every partition, each naming every
partition at its position with ``max.partition.fetch.bytes`` ``--fetch-kib`` and librdkafka's ``fetch.max.bytes``
(50 MiB), answered as the proxy answers a Fetch held by the tier alone (:func:`rlm.listener.tier.fetch.fetch`, the
listener's one tier read: authorization, the tier view's fetch, the byte budget) and encoded as the proxy encodes it
(:func:`rlm.listener.protocol.codec.fetch_response_parts`, Fetch v12: the parts it hands to the socket, not joined;
the socket's copy is not counted); the next positions follow each partition's
last offset. The answers are checked: every offset once, in order. Printed: CPU seconds per GiB of record bytes
(this process, ``time.process_time``), MB/s, Fetches, best of ``--rounds`` reads (the page cache warm after the
first). ``--profile FILE``: one more read under cProfile, the hot functions printed, the stats in FILE.
``--breakdown``: one more read on this thread, its CPU per Fetch by part (block read, CRC, parse, the tier view's
fetch, the listener's, the answer's encoding).
"""

from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MiB = 1024 * 1024
GiB = 1024 * MiB
RECORDS_PER_BATCH = 240
VALUE_BYTES = 1024
FETCH_MAX_BYTES = 50 * MiB  # librdkafka's fetch.max.bytes default
FETCH_VERSION = 12


def segment_batches(records: int) -> list[bytes]:
    """One segment's batches from offset 0 (base offsets rewritten per segment: the CRC does not cover them)."""
    from tests.support.batches import batch, record

    value = os.urandom(VALUE_BYTES)
    out = []
    for base in range(0, records, RECORDS_PER_BATCH):
        n = min(RECORDS_PER_BATCH, records - base)
        recs = b"".join(record(i, b"key-%010d" % (base + i), value) for i in range(n))
        out.append(batch(base, [b""] * n, records=recs))
    return out


def rebased(batches: list[bytes], base: int) -> list[bytes]:
    return [struct.pack(">q", struct.unpack_from(">q", b)[0] + base) + b[8:] for b in batches]


def build(work: Path, partitions: int, mib: int, segment_mib: int = 64) -> tuple[object, list[object], int]:
    """A tier of ``partitions`` partitions of ``mib`` MiB each; returns (world, tps, records per partition)."""
    from rlmm.api import TopicIdPartition
    from tests.support.batches import write_partition
    from tests.support.world import World

    per_segment = segment_mib * MiB // (VALUE_BYTES + 30)
    per_segment -= per_segment % RECORDS_PER_BATCH
    template = segment_batches(per_segment)
    segments_n = max(1, mib // segment_mib)
    world = World(work)
    tid = uuid.uuid4()
    tps = []
    for p in range(partitions):
        tp = TopicIdPartition(tid, "bench-tier", p)
        segs = {i * per_segment: rebased(template, i * per_segment) for i in range(segments_n)}
        active = segments_n * per_segment
        segs[active] = rebased(template[:1], active)  # the active segment: never copied
        write_partition(world.pdir(1, tp), tp.topic_id, segs)
        world.copier(1, tp).run_once(active)
        tps.append(tp)
    return world, tps, segments_n * per_segment


def context(world: object, tps: list[object]) -> object:
    """The listener's tier context for the topic, every principal allowed."""
    from rlm.listener.tier.catalog import ServedTopic
    from rlm.listener.tier.context import TierContext
    from rlm.tier import TierView

    topic = ServedTopic(tps[0].topic, tps[0].topic_id, tuple(tp.partition for tp in tps))  # type: ignore[attr-defined]
    catalog = SimpleNamespace(by_name=lambda n: topic if n == topic.name else None,
                              by_id=lambda i: topic if i == topic.topic_id else None)
    from rlm.listener.authz import Unavailable

    # the proxy's host check (rlm.listener.upstream.hosts) reads the ACL view: a cluster without an authorizer
    acls = SimpleNamespace(generation=0, unchanged_since=lambda _g: True,
                           current=lambda: Unavailable("no_authorizer", "the bench's cluster has no authorizer"))
    authorizer = SimpleNamespace(allowed=lambda _p, _h, _op, names: set(names), cache=acls)
    return TierContext(catalog, TierView(world.reader, ttl_s=1.0), authorizer)  # type: ignore[arg-type,attr-defined]


def read(ctx: object, tps: list[object], records: int, fetch_bytes: int,
         pool: object = None) -> tuple[float, float, int, int]:
    """One read of every partition from 0 to ``records``: (wall s, CPU s, record bytes, Fetches). With ``pool``
    (a thread pool), each Fetch is read on one of its threads and written on this one, as the listener does."""
    from rlm.listener.net.principals import Client
    from rlm.listener.protocol.codec import fetch_response_parts, last_offset
    from rlm.listener.protocol.frame import RequestHeader
    from rlm.listener.tier.fetch import fetch

    client = Client("User:bench", "127.0.0.1")  # type: ignore[call-arg]
    header = RequestHeader(1, FETCH_VERSION, 7, "bench", True, 0)
    pos = {tp.partition: 0 for tp in tps}  # type: ignore[attr-defined]
    name = tps[0].topic  # type: ignore[attr-defined]
    size = fetches = 0
    wall, cpu = time.perf_counter(), time.process_time()
    while any(o < records for o in pos.values()):
        req = SimpleNamespace(max_bytes=FETCH_MAX_BYTES, isolation_level=0, topics=[SimpleNamespace(
            topic=name, partitions=[SimpleNamespace(partition=p, fetch_offset=o, partition_max_bytes=fetch_bytes)
                                    for p, o in pos.items() if o < records])])
        if pool is None:
            values, n = fetch(ctx, req, client)  # type: ignore[arg-type]
        else:
            values, n = pool.submit(fetch, ctx, req, client).result()  # type: ignore[attr-defined]
        frame = fetch_response_parts(header, values)  # the parts the listener hands to its socket, not joined
        fetches += 1
        size += n
        for p in values["responses"][0]["partitions"]:
            last = last_offset(p["records"])
            if last is None or p["error_code"]:
                raise RuntimeError(f"partition {p['partition_index']} at {pos[p['partition_index']]}: no records "
                                   f"(error {p['error_code']})")
            pos[p["partition_index"]] = last + 1
        del frame
    return time.perf_counter() - wall, time.process_time() - cpu, size, fetches


def breakdown(ctx: object, tps: list[object], records: int, fetch_bytes: int) -> None:
    """One read on this thread, partitions read one after the other, with this thread's CPU time
    (``time.thread_time_ns``) taken around the parts of a Fetch; printed per Fetch. The parts nest: each is given
    without the ones inside it (the block read and the CRC inside the block parse, the parse inside the tier
    view's fetch, that inside the listener's)."""
    import rlm.listener.protocol.codec as codec
    import rlm.listener.tier.fetch as tier_fetch
    import rsm.format.blockcache as blockcache
    import rsm.format.reader as reader
    from rlm.tier import TierView

    spent: dict[str, int] = {}
    clock = time.thread_time_ns

    def timed(name: str, fn):  # noqa: ANN001, ANN202
        def run(*a, **kw):  # noqa: ANN002, ANN003, ANN202
            t = clock()
            try:
                return fn(*a, **kw)
            finally:
                spent[name] = spent.get(name, 0) + clock() - t
        return run

    patches = [(blockcache, "fetch_into"), (reader, "crc32c_at"), (reader, "batch_crc"), (blockcache._Stream, "take"),
               (TierView, "fetch"), (tier_fetch, "fetch"), (codec, "fetch_response_parts")]
    saved = [(obj, name, getattr(obj, name)) for obj, name in patches]
    names = {"fetch_into": "block read (store GET, readinto)", "crc32c_at": "CRC-32C", "batch_crc": "CRC-32C",
             "take": "block parse", "fetch": "", "fetch_response_parts": "answer encode (parts)"}
    parallel = tier_fetch.PARALLEL_READS
    try:
        for obj, name, fn in saved:
            label = names[name] or ("tier view fetch" if obj is TierView else "listener tier fetch")
            setattr(obj, name, timed(label, fn))
        tier_fetch.PARALLEL_READS = 0
        t = clock()
        _wall, _cpu, size, fetches = read(ctx, tps, records, fetch_bytes)
        total = clock() - t
    finally:
        tier_fetch.PARALLEL_READS = parallel
        for obj, name, fn in saved:
            setattr(obj, name, fn)
    inner = {"block parse": ("block read (store GET, readinto)", "CRC-32C"), "tier view fetch": ("block parse",),
             "listener tier fetch": ("tier view fetch",), "all": ("listener tier fetch", "answer encode (parts)")}
    spent["all"] = total
    own = {k: v - sum(spent.get(i, 0) for i in inner.get(k, ())) for k, v in spent.items()}
    per = size / fetches / MiB
    print(f"breakdown: {fetches} Fetches of {per:.2f} MiB of records, this thread's CPU per Fetch (us):")
    for k in ("block read (store GET, readinto)", "CRC-32C", "block parse", "tier view fetch", "listener tier fetch",
              "answer encode (parts)", "all"):
        label = {"block parse": "block parse (framing, headers)", "tier view fetch": "tier view fetch (plan, batches)",
                 "listener tier fetch": "listener tier fetch (authz, budget)", "all": "bench loop, last offsets"}[k] \
            if k in ("block parse", "tier view fetch", "listener tier fetch", "all") else k
        print(f"  {label:40s} {own.get(k, 0) / fetches / 1e3:8.1f}")
    print(f"  {'total':40s} {total / fetches / 1e3:8.1f}  ({total / 1e9 / (size / GiB):.3f} s/GiB)")


def main() -> None:
    global RECORDS_PER_BATCH  # noqa: PLW0603 - the set-up's batches (--batch-records), read by segment_batches
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=256, help="data per partition (MiB)")
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--fetch-kib", type=int, default=1024, help="max.partition.fetch.bytes (KiB)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=8,
                    help="Fetches read on a pool of this many threads and written on the main one, as the listener "
                         "does (its history_listener.workers: 8); 0: all on the main thread")
    ap.add_argument("--parallel-reads", type=int, default=None, metavar="N",
                    help="threads reading a Fetch's partitions at once (rlm.listener.tier.fetch.PARALLEL_READS; "
                         "0: one after the other; default: its own)")
    ap.add_argument("--profile", type=Path, default=None, metavar="FILE")
    ap.add_argument("--breakdown", action="store_true",
                    help="one more read on this thread (partitions one after the other), its CPU per Fetch by part")
    ap.add_argument("--batch-records", type=int, default=RECORDS_PER_BATCH,
                    help="records (1 KiB values) a batch: 240, ~250 KiB batches as librdkafka's; 16, ~16 KiB as a "
                         "Java producer's batch.size")
    ap.add_argument("--block-cache-mib", type=int, default=None,
                    help="the storage manager's block_cache_bytes (MiB; default: its own default for the store)")
    args = ap.parse_args()
    import logging

    RECORDS_PER_BATCH = args.batch_records

    if args.parallel_reads is not None:
        from rlm.listener.tier import fetch as tier_fetch

        tier_fetch.PARALLEL_READS = args.parallel_reads

    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory(prefix="bench-tier-read-") as tmp:
        t0 = time.perf_counter()
        world, tps, records = build(Path(tmp), args.partitions, args.mib)
        print(f"built {args.partitions} x {records:,} records in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
        if args.block_cache_mib is not None:  # a storage manager of its own over the same store
            from rlm.tier import RemoteReader
            from rsm.manager import RemoteStorageManager, RsmConfig

            rsm = RemoteStorageManager(RsmConfig(store="fs", root_path=Path(tmp) / "remote", fsync=False,
                                                 block_cache_bytes=args.block_cache_mib * MiB))
            world.reader = RemoteReader(world.rlmm, rsm)  # type: ignore[attr-defined]
        ctx = context(world, tps)
        best = None
        import concurrent.futures

        pool = concurrent.futures.ThreadPoolExecutor(args.threads) if args.threads else None
        for _ in range(args.rounds):
            wall, cpu, size, fetches = read(ctx, tps, records, args.fetch_kib * 1024, pool)
            print(f"  {size / 1e6 / wall:.0f} MB/s, CPU {cpu / (size / GiB):.3f} s/GiB, {fetches} Fetches, "
                  f"{cpu / fetches * 1e3:.2f} ms CPU per Fetch", file=sys.stderr)
            if best is None or cpu < best[1]:
                best = (wall, cpu, size, fetches)
        assert best is not None
        wall, cpu, size, fetches = best
        print(f"best of {args.rounds}: {size / 1e6 / wall:.0f} MB/s, CPU {cpu / (size / GiB):.3f} s/GiB, "
              f"{fetches} Fetches of {args.partitions} partition(s), {args.fetch_kib} KiB each; "
              f"load {'/'.join(f'{x:.1f}' for x in os.getloadavg())}")
        if args.breakdown:
            breakdown(ctx, tps, records, args.fetch_kib * 1024)
        if args.profile:
            import cProfile
            import pstats

            prof = cProfile.Profile(time.process_time)
            prof.enable()
            read(ctx, tps, records, args.fetch_kib * 1024)  # on this thread: cProfile sees this thread only
            prof.disable()
            prof.dump_stats(str(args.profile))
            pstats.Stats(str(args.profile)).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
