"""Copies in place (:mod:`rlm.tasks.in_place`) on crafted partition dirs: when staging waits and when it does not,
what a copy opens and when it gives up to staging. The real broker's cases: ``tests/rlm/test_copy_in_place.py``."""

from __future__ import annotations

import builtins
import io
import os
import struct
import uuid
from pathlib import Path

import pytest

from rlm.tasks.in_place import InPlaceSegment, LocalRange, staging_deferral_s
from rlm.tier import to_rsm
from rlmm.api import TopicIdPartition
from rsm.api import IndexType
from rsm.log import held
from rsm.log.partition import segment_file_name
from tests.support.batches import BASE_TS, one_per_batch, write_partition
from tests.support.world import World


def rolled(world: World, n: int) -> TopicIdPartition:
    """A partition of ``n`` rolled segments of five records ([0,4], [5,9] ...) and an active one."""
    tp = TopicIdPartition(uuid.uuid4(), "inplace", 0)
    write_partition(world.pdir(1, tp), tp.topic_id, {b: one_per_batch(b, 5, b"v") for b in range(0, 5 * n + 1, 5)})
    return tp


def rename_deleted(pdir: Path, base: int) -> None:
    """Retention's rename of a segment's files to ``*.deleted``."""
    for p in pdir.glob(f"{base:020d}.*"):
        p.rename(p.with_name(p.name + ".deleted"))


def test_staging_waits_only_for_a_known_long_delete_delay() -> None:
    assert staging_deferral_s(None, 5000) is None  # unknown: staged at once
    assert staging_deferral_s(19_999, 5000) is None  # shorter than 4 stage intervals
    assert staging_deferral_s(60_000, 5000) == 30.0  # half the delay


def test_a_run_copies_in_place_what_staging_left_and_stages_nothing(world: World) -> None:
    tp = rolled(world, 3)
    copier = world.copier(1, tp)
    copier.defer_staging_s = 1000.0
    result = copier.run_once(15)
    assert [(m.start_offset, m.end_offset_inclusive) for m in result.copied] == [(0, 4), (5, 9), (10, 14)]
    assert world.values(tp) == [(i, b"v-%d" % i) for i in range(15)]
    assert copier.staging.staged(tp) == []
    assert not (world.tmp / "staging1" / str(tp.topic_id)).exists()  # not even its dir made
    assert not copier.deferring  # copied: nothing left waiting


def test_the_stage_job_stages_a_waiting_segment_once_renamed_or_waited_long_enough(world: World) -> None:
    tp = rolled(world, 3)
    copier = world.copier(1, tp)
    copier.defer_staging_s = 1000.0
    copier.run_once(0)  # nothing below the LSO: every rolled segment waits, unstaged
    assert copier.staging.staged(tp) == []
    assert copier.deferring and sorted(copier.deferred_bases()) == [0, 5, 10]
    assert copier.stage_rolled() == 0  # they wait
    rename_deleted(world.pdir(1, tp), 0)  # retention renamed the oldest
    assert copier.stage_rolled() == 1  # staged at once
    assert [s.base_offset for s in copier.staging.staged(tp)] == [0]
    copier.defer_staging_s = 0.0  # the others waited long enough
    assert copier.stage_rolled() == 2
    assert [s.base_offset for s in copier.staging.staged(tp)] == [0, 5, 10]
    assert not copier.deferring
    copier.defer_staging_s = 1000.0
    result = copier.run_once(15)  # copied from staging, the renamed one too, and released
    assert [m.end_offset_inclusive for m in result.copied] == [4, 9, 14]
    assert copier.staging.staged(tp) == []


def test_without_a_known_delay_the_stage_job_stages_at_once(world: World) -> None:
    tp = rolled(world, 2)
    copier = world.copier(1, tp)
    copier.defer_staging_s = 1000.0
    copier.run_once(0)
    assert copier.deferring
    copier.defer_staging_s = None  # the topic's delay became unknown or short
    assert copier.stage_rolled() == 2
    assert not copier.deferring


def test_open_holds_the_files_and_gives_up_on_anything_less_plain(world: World) -> None:
    tp = rolled(world, 3)
    pdir = world.pdir(1, tp)
    names = set(os.listdir(pdir))
    seg = InPlaceSegment.open(LocalRange(tp, 0, 4, pdir), names)
    assert seg is not None
    want = (pdir / segment_file_name(0, ".log")).read_bytes()
    rename_deleted(pdir, 0)
    for p in pdir.glob(f"{0:020d}.*"):
        p.unlink()  # the broker's unlink, file.delete.delay.ms after the rename
    assert seg.log_path.read_bytes() == want  # still readable through the open file
    assert seg.file(".txnindex") is None
    seg.close()

    # renamed after the listing: found under the .deleted names
    rename_deleted(pdir, 5)
    seg = InPlaceSegment.open(LocalRange(tp, 5, 9, pdir), names)
    assert seg is not None and seg.log_path.read_bytes() == (pdir / f"{5:020d}.log.deleted").read_bytes()
    seg.close()

    # an index the broker did not write: staging rebuilds it
    (pdir / segment_file_name(10, ".index")).unlink()
    assert InPlaceSegment.open(LocalRange(tp, 10, 14, pdir), set(os.listdir(pdir))) is None
    # a .deleted .log beside the live one (a generation truncated away): staging tells them apart
    assert InPlaceSegment.open(LocalRange(tp, 10, 14, pdir), {*names, f"{10:020d}.log.deleted"}) is None
    # gone under both names since the listing
    assert InPlaceSegment.open(LocalRange(tp, 0, 4, pdir), names) is None


def test_a_copy_in_place_reads_its_files_through_the_held_descriptors_not_opened_again(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment copied in place is read through the descriptors the copy holds (``/proc/self/fd`` names): the storage
    manager's sections (its indexes) with pread, the ledger writer's blocks and the CRC scan of its ``.log`` on the
    ``.log``'s descriptor, the time index for its max timestamp with pread (:mod:`rsm.log.held`). No open of a
    ``/proc/self/fd`` name, by ``os.open`` or by ``open`` (each walks procfs and makes a new open file; the ``.log``
    was opened twice and the time index read through ``Path.read_bytes``: about 20 system calls of a one-segment copy
    run, issue 26). The sections stored are the broker's files, byte for byte, and the records read back."""
    tp = rolled(world, 2)
    pdir = world.pdir(1, tp)
    (pdir / f"{5:020d}.index").write_bytes(struct.pack(">ii", 0, 0) + struct.pack(">ii", 3, 200))
    (pdir / f"{5:020d}.timeindex").write_bytes(struct.pack(">qi", BASE_TS, 0))
    copier = world.copier(1, tp)
    copier.defer_staging_s = 1000.0
    opened: list[str] = []

    def recording(inner):  # type: ignore[no-untyped-def]
        def record(path, *args, **kw):  # type: ignore[no-untyped-def]
            if not isinstance(path, int):
                opened.append(os.fspath(path))
            return inner(path, *args, **kw)
        return record

    monkeypatch.setattr(os, "open", recording(os.open))
    monkeypatch.setattr(builtins, "open", recording(builtins.open))
    monkeypatch.setattr(io, "open", recording(io.open))  # (pathlib's)
    monkeypatch.setattr(held, "FileIO", recording(held.FileIO))
    result = copier.run_once(10)
    assert [(m.start_offset, m.end_offset_inclusive) for m in result.copied] == [(0, 4), (5, 9)]
    assert [p for p in opened if p.startswith("/proc/self/fd/")] == []
    assert result.copied[1].max_timestamp_ms == BASE_TS  # (from the time index, read through its descriptor)
    second = to_rsm(result.copied[1])
    assert world.rsm.fetch_index(second, IndexType.OFFSET).read() == (pdir / f"{5:020d}.index").read_bytes()
    assert world.rsm.fetch_index(second, IndexType.TIMESTAMP).read() == (pdir / f"{5:020d}.timeindex").read_bytes()
    assert world.values(tp) == [(i, b"v-%d" % i) for i in range(10)]


def test_a_proc_self_fd_name_of_a_write_only_descriptor_is_read_by_opening_it(tmp_path: Path) -> None:
    """A section named through a descriptor pread cannot read (write-only, as a file a caller is still writing) is
    opened by its name, as before, and read whole."""
    from rsm.manager import _file_chunks

    path = tmp_path / "section"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * 3000)
        assert b"".join(_file_chunks(Path(f"/proc/self/fd/{fd}"))) == b"x" * 3000
    finally:
        os.close(fd)
