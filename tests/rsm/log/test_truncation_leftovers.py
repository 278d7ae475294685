"""``rolled_ranges`` with the ``.deleted`` leftovers of a follower truncation, and checkpoint integers that only
look like integers (names only: no broker needed)."""

from __future__ import annotations

import pytest

from rsm.log import CorruptCheckpointError, PartitionDir
from rsm.log.checkpoint import parse_leader_epoch_checkpoint


def _touch(d, *names):
    d.mkdir(exist_ok=True)
    for n in names:
        (d / n).write_bytes(b"")


def test_truncation_leftover_between_live_segments_is_not_a_segment(tmp_path):
    # Segment 200 was renamed .deleted by a truncation to an offset inside segment 100, which then regrew and
    # rolled at 350: segment 100 holds 100..349, and 200.deleted is the diverged lineage.
    d = tmp_path / "t-0"
    _touch(d, f"{0:020d}.log", f"{100:020d}.log", f"{200:020d}.log.deleted", f"{350:020d}.log")
    assert PartitionDir(d).rolled_ranges() == [(0, 99), (100, 349)]


def test_retention_leftovers_below_and_truncation_leftovers_above(tmp_path):
    d = tmp_path / "t-0"
    # 0 and 50 deleted by retention (below the first live segment 90); 120 and 300 by a truncation into 90,
    # which regrew and rolled at 250; 400 is the active segment.
    _touch(d, f"{0:020d}.log.deleted", f"{50:020d}.log.deleted", f"{90:020d}.log", f"{120:020d}.log.deleted",
           f"{250:020d}.log", f"{300:020d}.log.deleted", f"{400:020d}.log")
    assert PartitionDir(d).rolled_ranges() == [(0, 49), (50, 89), (90, 249), (250, 399)]


def test_truncated_and_regrown_from_the_same_base(tmp_path):
    # A truncation to exactly 100 deleted segment 100 and a new segment 100 was created: the live one counts,
    # and ends at the next live base.
    d = tmp_path / "t-0"
    _touch(d, f"{0:020d}.log", f"{100:020d}.log.deleted", f"{100:020d}.log", f"{180:020d}.log.deleted",
           f"{230:020d}.log")
    assert PartitionDir(d).rolled_ranges() == [(0, 99), (100, 229)]


@pytest.mark.parametrize("token", ["--5", "-", "+5", "1_000", "\u0663", " 5x"])
def test_checkpoint_non_integers_are_corrupt_checkpoints(token):
    text = f"0\n1\n{token} 0\n"
    with pytest.raises(CorruptCheckpointError, match=r"ckpt: line 3: expected the epoch"):
        parse_leader_epoch_checkpoint(text, "ckpt")
    with pytest.raises(CorruptCheckpointError, match=r"ckpt: line 3: expected the start offset"):
        parse_leader_epoch_checkpoint(f"0\n1\n0 {token}\n", "ckpt")
