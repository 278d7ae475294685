"""The CPU a copy spends on its leader epochs (:func:`rlm.tasks.segment_epochs.segment_epochs`), per 64 MiB segment,
beside the store copy of the same segment, in one run.

    .venv/bin/python bench/bench_segment_epochs.py [--size-mb 64] [--batch-kib 1 16 1024] [--repeat 5] [--no-copy]
    .venv/bin/python bench/bench_segment_epochs.py --baseline DIR [--rounds 3] [--size-mb 64] [--batch-kib ...]

For each batch size, a ``.log`` of ``--size-mb`` of valid v2 batches (one template batch, its base offset and leader
epoch rewritten: the CRC covers neither), the epoch changing three times, warm in the page cache. Rows, each the
best of ``--repeat`` (thread CPU, ``time.thread_time``; the machine is shared):

- ``checkpoint slice``: the map taken from the checkpoint (the code before: ``epochs_for_range``);
- ``segment_epochs, scan no CRC``: the map from every batch header, as the copier and the offloader make it
  (:func:`rsm.log.batch.scan_batches`, ``verify_crc=False``: one 1 MiB read buffer, the file read once);
- ``segment_epochs, header preads``: the same from a 61-byte ``pread`` per batch (the records skipped, not read):
  the alternative for segments of large batches;
- ``scan with CRC``: the scan the store copy makes of the segment anyway (its CRC check), for scale;
- ``store copy``: ``RemoteStorageManager.copy_log_segment_data`` to the filesystem store (fsync off), what the
  epochs' scan adds to (``--no-copy``: skipped).

Measured 2026-11-27 (2 cores, shared; load average 1.3-3.0), 64 MiB, best of 5, ms of thread CPU:

    batches of            checkpoint slice   scan no CRC (now)   header preads   scan with CRC   store copy
    1,070 B (62,718)                  0.00              119.2           159.0           166.9        400.3
    16,205 B (4,141)                  0.00               16.7            10.4            23.4         97.4
    1,050,397 B (63)                  0.00                9.2             0.2            12.3         63.1

So the map costs 15-30% of the store copy's own CPU (filesystem store; an S3 copy adds the upload's). Per batch the
scan costs ~1.9 us, the pread ~2.5 us (a system call each), so preads pay only for batches of 16 KiB and more.

``--baseline DIR`` (``DIR`` holding ``rlm/``, ``rsm/``, ``rlmm/`` of another commit, e.g. ``git archive BASE rlm rsm
rlmm | tar -x -C DIR``): a whole copy as the copier makes it, map and store copy (filesystem, no fsync), the base's
code beside this tree's, each in a child process of its own (``--child``), base and new alternating, ``--rounds``
times; the best of each (process CPU). Rows: the base (the map from a walk of the headers, then the store copy's
walk); the new code where the checkpoint covers the segment (the checkpoint's slice, checked on the store copy's
walk: ``check_epochs``) and where it is cut past it (a walk of the headers first, as before, and the check).

``--pairs N``: the same in one process, this tree's code both ways, alternating N times (less noise than children):
the walk for the map and the copy unchecked (the base's way) vs the checkpoint's slice and the checked copy.

Measured 2026-11-27 (session 23; 64 MiB; ms of process CPU), ``--pairs 10 --baseline 358c716 --rounds 5 --repeat 3``:

    batches of          pairs: walk + copy   slice + checked   children: base   new, covered   new, cut
    1,070 B (62,718)          516.7                398.7  -23%          512.4     396.6  -23%     533.2
    16,205 B (4,141)           88.1                 69.9  -21%           94.2      75.4  -20%      93.2
    1,050,397 B (63)           56.2                 46.0  -18%           57.8      48.5  -16%      58.0

(load 1.4-1.5 for the pairs, 1.2-1.4 for the children; minima, the pairs' medians 542 / 90 / 58 vs 417 / 72 / 48).
The map's walk is gone where the checkpoint covers the segment; where it is cut past it the copy costs what it did.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
if "--child" in sys.argv:  # the code measured first (a base's, --baseline): the tree for tests.support only
    sys.path.insert(0, str(Path(sys.argv[sys.argv.index("--child") + 1]).resolve()))

from rlm.tasks.segment_epochs import segment_epochs  # noqa: E402
from rlm.tier import epochs_for_range  # noqa: E402
from rsm.api import EpochEntry, LogSegmentData, RemoteSegmentMetadata  # noqa: E402
from rsm.log.batch import BATCH_HEADER_SIZE, BATCH_LENGTH_OFFSET, BatchHeader, header_from_bytes, scan_batches  # noqa: E402,E501
from rsm.manager import RemoteStorageManager, RsmConfig  # noqa: E402
from tests.support.batches import batch  # noqa: E402

MB = 1024 * 1024
RECORD_BYTES = 1000


def make_segment(path: Path, size_bytes: int, batch_bytes: int) -> tuple[int, list[EpochEntry]]:
    """Batches of about ``batch_bytes`` (records of 1,000 bytes) up to ``size_bytes``, under epochs 3, 4, 5, 6 (each
    from a quarter of the batches on); the last offset and the epochs' starts."""
    records = max(1, batch_bytes // (RECORD_BYTES + 8))
    template = bytearray(batch(0, [b"x" * RECORD_BYTES] * records))
    n = size_bytes // len(template)
    quarter = max(1, n // 4)
    epochs = [EpochEntry(3 + q, q * quarter * records) for q in range(min(4, n))]
    with open(path, "wb", buffering=8 * MB) as f:
        for i in range(n):
            base = i * records
            struct.pack_into(">q", template, 0, base)
            struct.pack_into(">i", template, 12, 3 + min(3, i // quarter))
            f.write(template)
    return n * records - 1, epochs


def header_preads(path: Path) -> Iterator[BatchHeader]:
    """Each batch's header by a pread of its 61 bytes (the records not read; the header's checks, no CRC)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size, pos = os.fstat(fd).st_size, 0
        while pos < size:
            head = os.pread(fd, BATCH_HEADER_SIZE, pos)
            length = int.from_bytes(head[BATCH_LENGTH_OFFSET:BATCH_LENGTH_OFFSET + 4], "big", signed=True)
            h = header_from_bytes(head, pos, path, size=BATCH_LENGTH_OFFSET + 4 + length)
            yield h
            pos = h.end_position
    finally:
        os.close(fd)


def best(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(thread CPU s, wall s) of the best of ``repeat`` runs."""
    runs = []
    for _ in range(repeat):
        c0, w0 = time.thread_time(), time.perf_counter()
        fn()
        runs.append((time.thread_time() - c0, time.perf_counter() - w0))
    return min(runs)


def measure(root: Path, rsm: RemoteStorageManager, size_mb: int, kib: int, repeat: int, copy: bool) -> None:
    """The rows for one segment of ``size_mb`` in batches of ``kib``."""
    path = root / "00000000000000000000.log"
    end, epochs = make_segment(path, size_mb * MB, kib * 1024)
    cut = [EpochEntry(epochs[-1].epoch, end - 10)]  # the checkpoint cut back past the segment's epochs
    (root / "0.index").write_bytes(b"")
    (root / "0.timeindex").write_bytes(b"")
    nbatches = sum(1 for _ in scan_batches(path, verify_crc=False))
    assert segment_epochs(scan_batches(path, verify_crc=False), 0, end, cut) == epochs
    assert segment_epochs(header_preads(path), 0, end, cut) == epochs
    data = LogSegmentData(path, root / "0.index", root / "0.timeindex", None, None, b"0\n0\n")

    def store_copy() -> object:
        md = RemoteSegmentMetadata(
            remote_segment_id=uuid.uuid4(), topic_id=uuid.uuid4(), topic_name="t", partition=0, start_offset=0,
            end_offset_inclusive=end, max_timestamp_ms=0, segment_size_bytes=path.stat().st_size, broker_id=1,
            event_timestamp_ms=0, segment_leader_epochs=tuple(epochs), custom_metadata=None)
        return rsm.copy_log_segment_data(md, data)

    rows: list[tuple[str, Callable[[], object]]] = [
        ("checkpoint slice (before)", lambda: epochs_for_range(epochs, 0, end)),
        ("segment_epochs, scan no CRC (now)", lambda: segment_epochs(scan_batches(path, verify_crc=False), 0, end,
                                                                     cut)),
        ("segment_epochs, header preads", lambda: segment_epochs(header_preads(path), 0, end, cut)),
        ("scan with CRC (the store copy's)", lambda: sum(1 for _ in scan_batches(path))),
        *([("store copy (fs, no fsync)", store_copy)] if copy else [])]
    path.read_bytes()  # warm
    print(f"\n{size_mb} MiB, {nbatches:,} batches of {path.stat().st_size // nbatches:,} bytes")
    for name, fn in rows:
        cpu, wall = best(fn, repeat)
        print(f"  {name:38} {cpu * 1000:9.2f} ms CPU ({wall * 1000:9.2f} ms)")


def whole_copy(code: Path, segment: Path, end: int, epochs: list[tuple[int, int]], repeat: int) -> dict[str, float]:
    """In a child process: the best of ``repeat`` whole copies (map and store copy) of ``segment`` with the code of
    ``code``, process CPU seconds, for a checkpoint that covers the segment and one cut past it (the base code's
    map is the same walk either way)."""
    import rlm.tasks.segment_epochs as se
    from rsm.api import EpochEntry as Entry
    from rsm.api import LogSegmentData as Data
    from rsm.api import RemoteSegmentMetadata as Metadata
    from rsm.log.batch import scan_batches as scan
    from rsm.manager import RemoteStorageManager as Rsm
    from rsm.manager import RsmConfig as Config

    assert Path(se.__file__).is_relative_to(code), se.__file__
    exact = [Entry(e, o) for e, o in epochs]
    checkpoints = {"covered": exact, "cut": [Entry(exact[-1].epoch, end - 10)]}
    root = segment.parent
    data = Data(segment, root / "0.index", root / "0.timeindex", None, None, b"0\n0\n")
    new = hasattr(se, "copy_epochs")
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-epochs-store-") as tmp:
        rsm = Rsm(Config(store="fs", root_path=Path(tmp), fsync=False))

        def copy(checkpoint: list) -> None:
            if new:
                found = se.copy_epochs(checkpoint, 0, end, lambda: scan(segment, verify_crc=False), str(segment),
                                       copy_checks=True)
            else:
                found = se.segment_epochs(scan(segment, verify_crc=False), 0, end, checkpoint, str(segment))
            assert found == exact, found
            md = Metadata(remote_segment_id=uuid.uuid4(), topic_id=uuid.uuid4(), topic_name="t", partition=0,
                          start_offset=0, end_offset_inclusive=end, max_timestamp_ms=0,
                          segment_size_bytes=segment.stat().st_size, broker_id=1, event_timestamp_ms=0,
                          segment_leader_epochs=tuple(found), custom_metadata=None)
            rsm.copy_log_segment_data(md, data, **({"check_epochs": True} if new else {}))
            return md

        for _ in range(repeat):
            for name, checkpoint in checkpoints.items():  # (the two kinds alternate)
                c0 = time.process_time()
                md = copy(checkpoint)
                spent = time.process_time() - c0
                out[name] = min(spent, out.get(name, spent))
                rsm.delete_log_segment_data(md)  # (the store's files do not pile up in the page cache)
    return out


def side_by_side(args: argparse.Namespace) -> None:
    """``--baseline``: the base's whole copy beside this tree's, in alternating child processes."""
    here = Path(__file__).resolve().parents[1]
    base = Path(args.baseline).resolve()
    print("whole copy (map + filesystem store copy, no fsync), ms of process CPU, best of "
          f"{args.rounds} rounds x {args.repeat} in alternating children")
    print(f"  {'batches of':22} {'base, covered':>14} {'base, cut':>10} {'new, covered':>13} {'new, cut':>9} "
          f"{'covered vs base':>16}")
    with tempfile.TemporaryDirectory(prefix="bench-epochs-") as tmp:
        root = Path(tmp)
        for kib in args.batch_kib:
            path = root / "00000000000000000000.log"
            end, epochs = make_segment(path, args.size_mb * MB, kib * 1024)
            (root / "0.index").write_bytes(b"")
            (root / "0.timeindex").write_bytes(b"")
            nbatches = sum(1 for _ in scan_batches(path, verify_crc=False))
            path.read_bytes()  # warm
            best_of: dict[str, dict[str, float]] = {"base": {}, "new": {}}
            loads = []
            for _ in range(args.rounds):
                for name, code in (("base", base), ("new", here)):
                    loads.append(os.getloadavg()[0])
                    got = subprocess.run(
                        [sys.executable, __file__, "--child", str(code), "--segment", str(path), "--end", str(end),
                         "--epochs", ",".join(f"{e.epoch}:{e.start_offset}" for e in epochs),
                         "--repeat", str(args.repeat)], check=True, capture_output=True, text=True).stdout
                    for k, v in json.loads(got.splitlines()[-1]).items():
                        best_of[name][k] = min(v, best_of[name].get(k, v))
            b, n = best_of["base"], best_of["new"]
            label = f"{path.stat().st_size // nbatches:,} B ({nbatches:,})"
            print(f"  {label:22} {b['covered'] * 1000:14.1f} {b['cut'] * 1000:10.1f} {n['covered'] * 1000:13.1f} "
                  f"{n['cut'] * 1000:9.1f} {(n['covered'] / b['covered'] - 1) * 100:+15.0f}%   "
                  f"(load {min(loads):.1f}-{max(loads):.1f})")


def pairs(args: argparse.Namespace) -> None:
    """``--pairs``: the base's way and the new way of a whole copy, alternating in this process."""
    from rlm.tasks.segment_epochs import copy_epochs

    print(f"whole copy (map + filesystem store copy, no fsync), ms of process CPU, {args.pairs} alternating pairs")
    print(f"  {'batches of':22} {'walk + copy (min / median)':>28} {'slice + checked copy':>22} {'min vs min':>11}")
    with tempfile.TemporaryDirectory(prefix="bench-epochs-") as tmp:
        root = Path(tmp)
        rsm = RemoteStorageManager(RsmConfig(store="fs", root_path=root / "remote", fsync=False))
        for kib in args.batch_kib:
            path = root / "00000000000000000000.log"
            end, epochs = make_segment(path, args.size_mb * MB, kib * 1024)
            (root / "0.index").write_bytes(b"")
            (root / "0.timeindex").write_bytes(b"")
            nbatches = sum(1 for _ in scan_batches(path, verify_crc=False))
            data = LogSegmentData(path, root / "0.index", root / "0.timeindex", None, None, b"0\n0\n")
            path.read_bytes()  # warm

            def copy(new: bool, path: Path = path, end: int = end, epochs: list[EpochEntry] = epochs,
                     data: LogSegmentData = data) -> float:
                c0 = time.process_time()
                if new:
                    found = copy_epochs(epochs, 0, end, lambda: scan_batches(path, verify_crc=False), str(path),
                                        copy_checks=True)
                else:
                    found = segment_epochs(scan_batches(path, verify_crc=False), 0, end, epochs, str(path))
                md = RemoteSegmentMetadata(
                    remote_segment_id=uuid.uuid4(), topic_id=uuid.uuid4(), topic_name="t", partition=0,
                    start_offset=0, end_offset_inclusive=end, max_timestamp_ms=0,
                    segment_size_bytes=path.stat().st_size, broker_id=1, event_timestamp_ms=0,
                    segment_leader_epochs=tuple(found), custom_metadata=None)
                rsm.copy_log_segment_data(md, data, check_epochs=new)
                spent = time.process_time() - c0
                rsm.delete_log_segment_data(md)
                return spent

            runs: dict[bool, list[float]] = {False: [], True: []}
            loads = []
            for _ in range(args.pairs):
                loads.append(os.getloadavg()[0])
                for new in (False, True):
                    runs[new].append(copy(new))
            old, new_ = (sorted(runs[k]) for k in (False, True))
            label = f"{path.stat().st_size // nbatches:,} B ({nbatches:,})"
            print(f"  {label:22} {old[0] * 1000:18.1f} / {old[len(old) // 2] * 1000:7.1f} "
                  f"{new_[0] * 1000:12.1f} / {new_[len(new_) // 2] * 1000:7.1f} {(new_[0] / old[0] - 1) * 100:+10.0f}%"
                  f"   (load {min(loads):.1f}-{max(loads):.1f})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-mb", type=int, default=64)
    ap.add_argument("--batch-kib", type=int, nargs="+", default=[1, 16, 1024])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--no-copy", action="store_true", help="skip the store copy row")
    ap.add_argument("--baseline", help="the base code's root (rlm/, rsm/, rlmm/): whole copies side by side")
    ap.add_argument("--rounds", type=int, default=3, help="--baseline: alternations of base and new")
    ap.add_argument("--pairs", type=int, help="whole copies, the base's way and the new way alternating, in-process")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--segment", help=argparse.SUPPRESS)
    ap.add_argument("--end", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--epochs", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        epochs = [(int(e), int(o)) for e, o in (pair.split(":") for pair in args.epochs.split(","))]
        print(json.dumps(whole_copy(Path(args.child), Path(args.segment), args.end, epochs, args.repeat)))
        return 0
    if args.baseline or args.pairs:
        print(f"load average {os.getloadavg()}, python {sys.version.split()[0]}, {os.cpu_count()} cpus")
        if args.pairs:
            pairs(args)
        if args.baseline:
            side_by_side(args)
        return 0
    print(f"load average {os.getloadavg()}, python {sys.version.split()[0]}, {os.cpu_count()} cpus, "
          f"best of {args.repeat}, thread CPU (wall)")
    with tempfile.TemporaryDirectory(prefix="bench-epochs-") as tmp:
        root = Path(tmp)
        rsm = RemoteStorageManager(RsmConfig(store="fs", root_path=root / "remote", fsync=False))
        for kib in args.batch_kib:
            measure(root, rsm, args.size_mb, kib, args.repeat, not args.no_copy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
