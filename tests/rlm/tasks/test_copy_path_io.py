"""The copy path's file system work per segment (issue 26: 6,000 segments rolled at once, the system calls that
create inodes and the fsyncs were most of a copy's CPU), and that what it no longer does is not needed:

- the filesystem store makes a copy's object names durable with one directory fsync, the index object's (its data
  objects, in the same directory, are put first, in place: :meth:`FileSystemStore.put_uncommitted`);
- staging keeps a partition's dir across its segments and stages them side by side in it (no mkdir per segment);
- the copy watermark is overwritten in place (no temp file, no rename; no fsync unless it passed over offsets the
  metadata does not record), and read back; a torn record is ignored as unreadable, as the legacy formats are still
  read.

Crafted partition dirs, the in-memory metadata manager, the storage manager on the filesystem with fsync on."""

from __future__ import annotations

import os
import stat
import struct
import uuid
from pathlib import Path

import pytest

from rlm.tasks.copier import PartitionCopier
from rlmm.api import TopicIdPartition
from rsm.manager import RemoteStorageManager, RsmConfig
from rsm.store.fs import FileSystemStore
from tests.support.batches import BASE_TS, one_per_batch, write_partition
from tests.support.world import World


class Fsyncs:
    """Every fsync from now on: ``files`` and ``dirs`` (paths of directories, through /proc/self/fd)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.files = 0
        self.dirs: list[str] = []
        inner = os.fsync

        def counted(fd: int) -> None:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                self.dirs.append(os.readlink(f"/proc/self/fd/{fd}"))
            else:
                self.files += 1
            inner(fd)

        monkeypatch.setattr(os, "fsync", counted)


def synced_world(tmp_path: Path) -> World:
    world = World(tmp_path)
    world.rsm = RemoteStorageManager(RsmConfig(store="fs", root_path=tmp_path / "remote", fsync=True))
    return world


def rolled(world: World, n: int) -> TopicIdPartition:
    """A partition of ``n`` rolled segments of five records ([0,4], [5,9] ...) and an active one."""
    tp = TopicIdPartition(uuid.uuid4(), "io", 0)
    segments = {base: one_per_batch(base, 5, b"v") for base in range(0, 5 * n + 1, 5)}
    write_partition(world.pdir(1, tp), tp.topic_id, segments)
    return tp


def test_a_copy_makes_its_object_names_durable_with_one_directory_fsync(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    world = synced_world(tmp_path)
    tp = rolled(world, 2)
    copier = world.copier(1, tp)
    staged, _gaps = copier.stage_new(-1)
    copier.copy_segment(staged[0], 0, [])  # the first copy of the partition makes its directories
    fsyncs = Fsyncs(monkeypatch)
    copier.copy_segment(staged[1], 5, [])
    index = sorted((tmp_path / "remote").rglob("*-index"))
    assert len(index) == 2
    assert len(list(index[1].parent.iterdir())) == 4  # each copy's data object and index object, side by side
    assert fsyncs.dirs == [str(index[1].parent)]  # one, after the index object (the data object's before: 2)
    assert fsyncs.files == 2  # each object's bytes


def test_a_batch_makes_its_copies_durable_with_one_directory_fsync_before_finished(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy run's batch: each copy's objects put (their bytes fsynced, their names not yet), then one fsync of the
    partition's store directory for the whole batch (``make_durable``), then COPY_SEGMENT_FINISHED of the batch:
    a segment is durable before it is published, with one directory fsync per batch, not one per copy."""
    world = synced_world(tmp_path)
    tp = rolled(world, 4)
    copier = world.copier(1, tp)
    assert [m.end_offset_inclusive for m in copier.run_once(5).copied] == [4]  # the store's directories made
    events: list[str] = []
    fsyncs = Fsyncs(monkeypatch)
    inner_fsync = os.fsync

    def fsync(fd: int) -> None:
        inner_fsync(fd)
        events.append(f"fsync {os.readlink(f'/proc/self/fd/{fd}')}")

    monkeypatch.setattr(os, "fsync", fsync)
    inner_write = copier.rlmm.write_segment_metadata_many

    def write(records):  # type: ignore[no-untyped-def]
        events.append(" ".join(sorted({r.state.name for r in records})))
        return inner_write(records)

    copier.rlmm.write_segment_metadata_many = write  # type: ignore[method-assign]
    assert [m.end_offset_inclusive for m in copier.run_once(20).copied] == [9, 14, 19]
    store_dir = str(sorted((tmp_path / "remote").rglob("*-index"))[0].parent)
    store_dirs = [d for d in fsyncs.dirs if d.startswith(str(tmp_path / "remote"))]
    assert store_dirs == [store_dir]  # one for the batch of three (a put of each index object: three)
    assert events.index(f"fsync {store_dir}") < events.index("COPY_SEGMENT_FINISHED")
    assert fsyncs.files == 3 * 2  # each copy's data and index object (the copy watermark's overwrite: not fsynced)
    assert [o for o, _v in world.values(tp)] == list(range(20))


def test_put_deferred_leaves_the_name_to_the_next_put_in_its_directory(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileSystemStore(tmp_path / "s")
    fsyncs = Fsyncs(monkeypatch)
    assert store.put_deferred("a/b/x", [b"data"]) == 4
    # a new directory is made durable in its parent (a and a/b: their parents fsynced), the object's name is not
    assert fsyncs.dirs == [str(tmp_path / "s"), str(tmp_path / "s" / "a")] and fsyncs.files == 1
    store.put("a/b/x-index", [b"index"])
    assert fsyncs.dirs[2:] == [str(tmp_path / "s" / "a" / "b")]  # the one fsync covering both names
    assert store.get_bytes("a/b/x") == b"data" and store.get_bytes("a/b/x-index") == b"index"


class Placed:
    """The names objects are placed at from now on: renames over them, hard links to them (``os.replace``,
    ``os.link``)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.renamed: list[str] = []
        self.linked: list[str] = []
        replace, link = os.replace, os.link
        monkeypatch.setattr(os, "replace", lambda a, b, **kw: (
            self.renamed.append(Path(b).name), replace(a, b, **kw))[1])
        monkeypatch.setattr(os, "link", lambda a, b, **kw: (self.linked.append(Path(b).name), link(a, b, **kw))[1])


def test_a_copys_data_object_is_written_in_place_and_its_index_object_linked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy's data objects are read by no one before its index object commits them, and are named by the copy's own
    segment id: written in place (FileSystemStore.put_uncommitted), no temp file, no rename (issue 26: two renames
    a copy, each a temp file's inode and directory entries); the index object, the commit point, is written to an
    anonymous file in its directory and linked at its key whole (O_TMPFILE), so whoever lists the store sees it whole
    or not at all, without a temp file's name in .tmp or a rename."""
    world = synced_world(tmp_path)
    tp = rolled(world, 3)
    copier = world.copier(1, tp)
    assert [m.end_offset_inclusive for m in copier.run_once(5).copied] == [4]  # the store's directories made
    placed = Placed(monkeypatch)
    fsyncs = Fsyncs(monkeypatch)
    assert [m.end_offset_inclusive for m in copier.run_once(15).copied] == [9, 14]
    assert placed.renamed == []
    assert len(placed.linked) == 2 and all(n.endswith("-index") for n in placed.linked)  # the index objects only
    assert list((tmp_path / "remote" / ".tmp").iterdir()) == []
    assert fsyncs.files == 2 * 2  # each object's bytes, still
    assert [o for o, _v in world.values(tp)] == list(range(15))


def test_a_copys_data_object_is_written_in_two_writes_its_block_then_its_sections(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of a one-block segment writes its data object with two writev calls: the block (a view of the ledger
    writer's buffer, written at once), then its sections together (read from their files: bytes, held until the
    end), where each section was a write of its own (five or six a copy, each a system call handing the GIL over,
    issue 26); the index object with one. What is read back is what was copied."""
    world = synced_world(tmp_path)
    tp = rolled(world, 2)
    pdir = world.pdir(1, tp)  # the second segment's indexes as the broker leaves them at its roll: an entry each
    (pdir / f"{5:020d}.index").write_bytes(struct.pack(">ii", 0, 0))
    (pdir / f"{5:020d}.timeindex").write_bytes(struct.pack(">qi", BASE_TS, 0))
    copier = world.copier(1, tp)
    assert [m.end_offset_inclusive for m in copier.run_once(5).copied] == [4]  # the store's directories made
    writes: list[int] = []
    writev = os.writev

    def counted(fd: int, buffers):  # type: ignore[no-untyped-def]
        writes.append(len(buffers))
        return writev(fd, buffers)

    monkeypatch.setattr(os, "writev", counted)
    assert [m.end_offset_inclusive for m in copier.run_once(10).copied] == [9]
    assert writes == [1, 3, 1], writes  # the block; the offset index, time index, leader-epoch checkpoint; the index
    # object (each section a write of its own before: [1, 1, 1, 1, 1])
    assert [o for o, _v in world.values(tp)] == list(range(10))


def test_a_put_writes_bytes_chunks_together_and_a_view_at_once_with_what_came_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of bytes are held (up to 1 MiB) and written with what follows; any other buffer is written at once (its
    producer may fill it again for the next chunk), with the bytes held before it."""
    store = FileSystemStore(tmp_path / "s")
    store.put("a/w", [b"the directories made"])
    writes: list[list[bytes]] = []
    writev = os.writev

    def counted(fd: int, buffers):  # type: ignore[no-untyped-def]
        writes.append([bytes(b) for b in buffers])
        return writev(fd, buffers)

    monkeypatch.setattr(os, "writev", counted)
    buf = bytearray(b"view")

    def chunks():  # type: ignore[no-untyped-def]
        yield b"a"
        yield [b"b", b"c"]
        yield memoryview(buf)
        buf[:] = b"VIEW"  # refilled once written: the put wrote the first contents
        yield b"d"
        yield b"x" * (1 << 20)  # over what is held: out with what came before it

    assert store.put_uncommitted("a/x", chunks()) == 8 + (1 << 20)
    assert writes == [[b"a", b"b", b"c", b"view"], [b"d", b"x" * (1 << 20)]]
    assert store.get_bytes("a/x") == b"abcviewd" + b"x" * (1 << 20)


@pytest.mark.parametrize("anonymous", [True, False])
def test_a_put_is_atomic_with_or_without_anonymous_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        anonymous: bool) -> None:
    """A put links an anonymous file at its key (or, where the filesystem has none, renames a temp file over it); an
    overwrite is a rename either way; a failed write leaves nothing, no temp file either."""
    store = FileSystemStore(tmp_path / "s")
    assert store._links_tmpfiles  # noqa: SLF001 - ext4, xfs, tmpfs have them: the tests' filesystems
    store._links_tmpfiles = anonymous  # noqa: SLF001
    store.put("a/b/w", [b"the directories made"])
    placed = Placed(monkeypatch)
    assert store.put("a/b/x", [b"one"]) == 3 and store.get_bytes("a/b/x") == b"one"
    assert (placed.renamed, placed.linked) == (([], ["x"]) if anonymous else (["x"], []))
    assert store.put("a/b/x", [b"two", [b"-", b"2"]]) == 5 and store.get_bytes("a/b/x") == b"two-2"

    def failing():  # type: ignore[no-untyped-def]
        yield b"part"
        raise OSError("the segment went away")

    with pytest.raises(OSError, match="went away"):
        store.put("a/b/y", failing())
    assert sorted(p.name for p in (tmp_path / "s").rglob("*") if p.is_file()) == ["w", "x"]  # nothing in .tmp


def test_put_uncommitted_leaves_nothing_when_its_write_fails(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path / "s")

    def chunks():  # type: ignore[no-untyped-def]
        yield b"part"
        raise OSError("the segment went away")

    with pytest.raises(OSError, match="went away"):
        store.put_uncommitted("a/b/x", chunks())
    assert [p for p in (tmp_path / "s").rglob("*") if p.is_file()] == []
    assert store.put_uncommitted("a/b/x", [b"data", [b"-", b"more"]]) == 9 and store.get_bytes("a/b/x") == b"data-more"


def test_staging_keeps_the_partition_dir_for_its_next_segment(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    world = synced_world(tmp_path)
    tp = rolled(world, 2)
    copier = world.copier(1, tp)
    assert [m.end_offset_inclusive for m in copier.run_once(5).copied] == [4]  # [5,9] waits for the LSO
    pdir = copier.staging.staged(tp)[0].directory
    before = os.stat(pdir).st_ino
    assert [m.end_offset_inclusive for m in copier.run_once(10).copied] == [9]
    assert copier.staging.staged(tp) == [] and os.stat(pdir).st_ino == before  # empty, kept
    # the next rolled segment is staged into it, beside where the others were: no mkdir at all
    (world.pdir(1, tp) / f"{15:020d}.log").write_bytes(b"".join(one_per_batch(15, 1, b"v")))
    made: list[str] = []
    inner = os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda p, *a, **k: (made.append(str(p)), inner(p, *a, **k))[1])
    copier.staging.stage(tp, world.pdir(1, tp), 10, 14)
    assert made == [] and sorted(p.name for p in pdir.iterdir())[0] == f"{10:020d}.complete-14.it"
    assert copier.staging.release_partition(tp) == 1 and not pdir.exists()


def test_the_watermark_is_overwritten_in_place_and_read_back(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    tp = rolled(world, 2)
    copier = world.copier(1, tp)
    copier.run_once(5, leader_epoch=0)
    path = copier.watermark_path
    assert path is not None
    first = os.stat(path).st_ino
    fsyncs = Fsyncs(monkeypatch)
    copier.tiered(9, 0)
    copier.write_watermark()
    assert os.stat(path).st_ino == first and not path.with_name(path.name + ".tmp").exists()
    # not fsynced: offsets the metadata records FINISHED (it is their durable record); no rename, no directory fsync
    assert (fsyncs.files, fsyncs.dirs) == (0, [])
    assert len(path.read_bytes()) == 64
    assert PartitionCopier(broker_id=1, tp=tp, partition_dir=copier.partition_dir, rlmm=copier.rlmm,
                           rsm=copier.rsm, staging=copier.staging, deleter=copier.deleter,
                           watermark_path=path).tiered_offset == 9


def test_the_first_watermark_is_made_in_place_without_an_fsync(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition's first watermark is made at its path (no temp file, no rename) and, naming offsets the metadata
    records FINISHED, not fsynced, nor its directory (issue 26: the cold burst's 2,000 first copies made as many temp
    files, renames and two fsyncs each). A power cut may leave it missing or empty: ignored (test_watermark_formats)."""
    tp = rolled(world, 1)
    copier = world.copier(1, tp)
    path = copier.watermark_path
    assert path is not None and not path.exists()
    fsyncs = Fsyncs(monkeypatch)
    made: list[str] = []
    inner = os.rename
    monkeypatch.setattr(os, "rename", lambda *a, **k: (made.append(str(a[0])), inner(*a, **k))[1])
    monkeypatch.setattr(os, "replace", lambda *a, **k: (made.append(str(a[0])), inner(*a, **k))[1])
    copier.tiered(4, 0)
    copier.write_watermark()
    assert (fsyncs.files, fsyncs.dirs, made) == (0, [], [])
    assert len(path.read_bytes()) == 64 and world.copier(1, tp).tiered_offset == 4


def test_the_first_unrecorded_watermark_write_makes_its_name_durable(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """A watermark that passed over offsets no metadata records is their only record: the write is fsynced, and the
    first such write of the process fsyncs the directory too, the file's name with it (made in place by an earlier
    write, or by an earlier process, whose name a power cut might still take); later ones the file alone."""
    tp = rolled(world, 1)
    copier = world.copier(1, tp)
    path = copier.watermark_path
    assert path is not None
    fsyncs = Fsyncs(monkeypatch)
    copier.tiered(4, 0)
    copier.write_watermark()  # recorded: made in place, no fsync
    copier.tiered(9, 0, recorded=False)
    copier.write_watermark()
    assert (fsyncs.files, fsyncs.dirs) == (1, [str(path.parent)])
    copier.tiered(14, 0, recorded=False)
    copier.write_watermark()
    assert (fsyncs.files, fsyncs.dirs) == (2, [str(path.parent)])
    assert world.copier(1, tp).tiered_offset == 14


def test_the_watermark_is_fsynced_when_it_passes_over_segments_it_did_not_copy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments older than remote retention are passed over, not copied: no metadata records their offsets, so the
    watermark is their only record, and its write is durable (fsynced); the next run's, of a copy, is not."""
    world = synced_world(tmp_path)
    tp = rolled(world, 3)
    copier = world.copier(1, tp)
    assert [m.end_offset_inclusive for m in copier.run_once(5, leader_epoch=0).copied] == [4]  # the file made
    copier.min_max_timestamp_ms = BASE_TS + 1  # every record is older than remote retention
    fsyncs = Fsyncs(monkeypatch)
    assert copier.run_once(10, leader_epoch=0).copied == []
    assert (copier.tiered_offset, fsyncs.files) == (9, 1)
    copier.min_max_timestamp_ms = None
    assert [m.end_offset_inclusive for m in copier.run_once(15, leader_epoch=0).copied] == [14]
    assert (copier.tiered_offset, fsyncs.files) == (14, 1 + 2)  # the copy's data and index objects only
    assert world.copier(1, tp).tiered_offset == 14


@pytest.mark.parametrize(("content", "expected"), [
    (b"41 3", 41), (b"41", 41),  # written by older sidecars (temp file and rename)
    (b"41 - " + b"%08x" % __import__("zlib").crc32(b"41 -") + b"\n", 41),  # no epoch known
    (b"42 3 00000000" + b" " * 50 + b"\n", -1),  # a torn overwrite: its CRC fails, ignored (the metadata decides)
    (b"", -1), (b"\0" * 64, -1),  # a first write's file made, its bytes not written back before a power cut: ignored
])
def test_watermark_formats(world: World, content: bytes, expected: int) -> None:
    tp = rolled(world, 1)
    copier = world.copier(1, tp)
    assert copier.watermark_path is not None
    copier.watermark_path.parent.mkdir(parents=True, exist_ok=True)
    copier.watermark_path.write_bytes(content)
    assert world.copier(1, tp).tiered_offset == expected


def test_a_run_lists_the_partitions_metadata_once(world: World) -> None:
    """The clean-up's listing is the resume point's too when the clean-up deleted nothing: each listing decodes every
    segment of the partition, and a partition holds thousands."""
    tp = rolled(world, 2)
    copier = world.copier(1, tp)
    listed = []
    inner = copier.rlmm.list_remote_log_segments

    def counted(*args, **kw):  # type: ignore[no-untyped-def]
        listed.append(1)
        return inner(*args, **kw)

    copier.rlmm.list_remote_log_segments = counted  # type: ignore[method-assign]
    assert [m.end_offset_inclusive for m in copier.run_once(5, leader_epoch=0).copied] == [4]
    assert len(listed) == 1
    assert [m.end_offset_inclusive for m in copier.run_once(10, leader_epoch=0).copied] == [9]  # resumes after 4
    assert len(listed) == 2


def test_a_copy_run_of_segments_the_stage_job_staged_lists_their_staging_dir_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Segments the stage job staged between runs (Staging.holds: the same files, one stat each) are not staged again
    by the copy run: its one look at the partition's staging dir is the listing of what is staged (issue 26: the
    round's own listing of the dir made it two per run)."""
    world = synced_world(tmp_path)
    tp = rolled(world, 3)
    copier = world.copier(1, tp)
    copier.run_once(5)  # the first run: [0,4] copied, the rest staged
    assert copier.stage_rolled() == 0  # held already: nothing to stage
    sdir = copier.staging.staged(tp)[0].directory
    looked: list[str] = []
    inner_listdir, inner_scandir = os.listdir, os.scandir

    def listdir(path=".") -> list[str]:  # type: ignore[no-untyped-def]
        looked.append(str(path))
        return inner_listdir(path)

    def scandir(path="."):  # type: ignore[no-untyped-def]
        looked.append(str(path))
        return inner_scandir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)
    assert [m.end_offset_inclusive for m in copier.run_once(15).copied] == [9, 14]
    assert looked.count(str(sdir)) == 1
