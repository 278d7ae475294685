from __future__ import annotations

from pathlib import Path

import pytest

from rlm.staging import SegmentGoneError, Staging, StagingError, default_staging_root


def make_segment(pdir: Path, base: int, with_txn: bool = False) -> dict[str, bytes]:
    pdir.mkdir(parents=True, exist_ok=True)
    files = {".log": b"L" * 100 + base.to_bytes(8, "big"), ".index": b"I" * 16, ".timeindex": b"T" * 24}
    if with_txn:
        files[".txnindex"] = b"X" * 34
    for suffix, data in files.items():
        (pdir / f"{base:020d}{suffix}").write_bytes(data)
    return files


def test_stage_survives_broker_delete(tmp_path: Path) -> None:
    log_dir = tmp_path / "kafka" / "data"
    pdir = log_dir / "my.topic-x-3"
    files = make_segment(pdir, 42, with_txn=True)
    staging = Staging({log_dir: default_staging_root(log_dir)})
    staged = staging.stage("my.topic-x", 3, pdir, 42, 99)
    assert staging.stage("my.topic-x", 3, pdir, 42, 99) == staged  # idempotent
    for p in pdir.iterdir():  # the broker's retention removes the segment
        p.unlink()
    for suffix, data in files.items():
        assert staged.file(suffix).read_bytes() == data
    assert staged.file(".snapshot") is None
    assert staging.staged() == [staged] and staged.end_offset_inclusive == 99
    assert staging.size_bytes() == sum(len(d) for d in files.values())
    staging.release(staged)
    assert staging.staged() == [] and staging.size_bytes() == 0


def test_stage_links_renamed_deleted_files(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    pdir = log_dir / "t-0"
    files = make_segment(pdir, 7)
    for p in list(pdir.iterdir()):
        p.rename(p.with_name(p.name + ".deleted"))  # what the broker does before unlinking
    staged = Staging({log_dir: tmp_path / "stage"}).stage("t", 0, pdir, 7, 8)
    assert staged.log_path.read_bytes() == files[".log"]


def test_gone_segment_is_an_error_and_leaves_nothing(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    (log_dir / "t-0").mkdir(parents=True)
    staging = Staging({log_dir: tmp_path / "stage"})
    with pytest.raises(SegmentGoneError, match="00000000000000000009.log"):
        staging.stage("t", 0, log_dir / "t-0", 9, 10)
    assert staging.staged() == []


def test_staging_inside_log_dir_refused(tmp_path: Path) -> None:
    log_dir = tmp_path / "data"
    log_dir.mkdir()
    with pytest.raises(StagingError, match="inside log dir"):
        Staging({log_dir: log_dir / ".staging"})
