"""Each partition directory's topic id, read from ``partition.metadata`` again only when the file changed (issue 26:
discovery's full rounds read all 2,000 files each time). No broker."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from rlm.topic_ids import TopicIdFiles
from rsm.log.errors import CorruptCheckpointError
from tests.support.batches import partition_metadata_reads
from tests.support.batches import write_partition_metadata as write_metadata


def test_a_file_is_read_once_until_it_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = partition_metadata_reads(monkeypatch)
    pdir = tmp_path / "t-0"
    pdir.mkdir()
    first, second = uuid.uuid4(), uuid.uuid4()
    write_metadata(pdir, first)
    files = TopicIdFiles()
    assert [files.topic_id(pdir) for _ in range(3)] == [first] * 3 and len(reads) == 1
    write_metadata(pdir, second)  # the topic re-created under its name (its file rewritten: another inode)
    assert files.topic_id(pdir) == second and len(reads) == 2
    (pdir / "partition.metadata").unlink()
    with pytest.raises(FileNotFoundError):
        files.topic_id(pdir)
    (pdir / "partition.metadata").write_text("version: 0\nnot a topic id\n")
    with pytest.raises(CorruptCheckpointError):
        files.topic_id(pdir)
