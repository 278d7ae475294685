"""Files this process holds open, read on their descriptors through ``/proc/self/fd`` names (:mod:`rsm.log.held`)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rsm.log.batch import scan_batches
from rsm.log.held import held_fd, open_read, read_bytes
from tests.support.batches import batch


def test_held_fd_names_only_proc_self_fd_names() -> None:
    assert held_fd("/proc/self/fd/7") == 7
    assert held_fd(Path("/proc/self/fd/12")) == 12
    assert held_fd("/proc/self/fd/x") is None
    assert held_fd("/tmp/proc/self/fd/7") is None
    assert held_fd(b"/proc/self/fd/7") is None  # type: ignore[arg-type]


def test_a_held_descriptor_is_read_and_left_open(tmp_path: Path) -> None:
    """``read_bytes`` and ``open_read`` of a held descriptor's name read the file whole and leave the descriptor
    open, its file offset where the holder can still read from (the holders read with pread)."""
    path = tmp_path / "f"
    data = os.urandom(200_000)  # (more than one read of read_bytes)
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        name = f"/proc/self/fd/{fd}"
        assert read_bytes(name) == data
        with open_read(name) as f:
            assert f.fileno() == fd
            assert f.read() == data
        assert os.pread(fd, 10, 5) == data[5:15]  # still open
        assert read_bytes(path) == data  # any other name: opened
        with open_read(path) as f:
            assert f.fileno() != fd and f.read() == data
    finally:
        os.close(fd)


def test_a_write_only_or_closed_descriptor_is_opened_by_its_name(tmp_path: Path) -> None:
    """A descriptor pread cannot read (write-only) is read by opening its name, as before; the name of one not open
    fails as opening it does."""
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"x" * 3000)
        assert read_bytes(f"/proc/self/fd/{fd}") == b"x" * 3000
    finally:
        os.close(fd)
    with pytest.raises(FileNotFoundError):
        read_bytes(f"/proc/self/fd/{fd}")
    with pytest.raises(FileNotFoundError):
        open_read(f"/proc/self/fd/{fd}")


def test_a_scan_of_a_held_log_reads_its_descriptor(tmp_path: Path) -> None:
    """``scan_batches`` of a ``/proc/self/fd`` name scans the held file (CRC-checked) without closing it."""
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(batch(0, [b"a", b"b"]) + batch(2, [b"c"]))
    fd = os.open(path, os.O_RDONLY)
    try:
        headers = list(scan_batches(f"/proc/self/fd/{fd}"))
        assert [(h.base_offset, h.last_offset) for h in headers] == [(0, 1), (2, 2)]
        assert os.fstat(fd).st_size == path.stat().st_size  # still open
    finally:
        os.close(fd)


def test_two_scans_of_one_held_descriptor_interleaved_each_read_the_whole_log(tmp_path: Path) -> None:
    """Two scans of the same held ``.log`` (one descriptor, so one file offset), advanced in turn over a file larger
    than the scan's read buffer, each yield every batch in order, CRC-checked: the scan reads at its own position,
    not the shared offset (before, the second scan's reads moved the first's offset and it failed mid-file)."""
    path = tmp_path / "00000000000000000000.log"
    value = os.urandom(60_000)
    path.write_bytes(b"".join(batch(i, [value]) for i in range(40)))  # ~2.3 MiB: several refills of 1 MiB
    fd = os.open(path, os.O_RDONLY)
    try:
        name = f"/proc/self/fd/{fd}"
        a, b = scan_batches(name), scan_batches(name)
        got_a, got_b = [], []
        for _ in range(40):
            got_a.append(next(a).base_offset)
            got_b.append(next(b).base_offset)
        assert got_a == got_b == list(range(40))
        assert next(a, None) is None and next(b, None) is None
    finally:
        os.close(fd)
