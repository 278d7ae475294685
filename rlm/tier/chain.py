"""Which remote segments make up a partition's remote tier: one non-overlapping chain of one leader-epoch lineage.

The metadata topic can hold more COPY_SEGMENT_FINISHED segments than the partition's history has offsets:

- two copies of one range (a leadership move while a copy was in flight; Kafka itself can leave these too);
- copies that overlap with other boundaries (replicas roll their segments at different offsets);
- segments of a *diverged* lineage: an unclean election elected a replica that never had the old leader's last
  offsets, and the old leader had tiered them under its (older) epoch.

Every reader (the CLI, :class:`rlm.tier.RemoteReader`, Spark planning, the history endpoint's
:class:`rlm.tier.TierView`), retention and the copier's resume point see the same answer, computed here once:

1. The **lineage**: the leader epochs in force, each with its first offset. From the metadata alone
   (:func:`lineage_of`), an epoch starts at the lowest offset any segment holds it at, and a lower epoch that
   starts at or after a higher one is not part of the lineage (it diverged: the higher epoch's leader never had
   those offsets). On the leader, the broker's own leader-epoch checkpoint is authoritative from its first entry
   on (:func:`Lineage.merged_with_local`); below it (local retention truncates the checkpoint from the start) the
   metadata's lineage is used.
2. A segment is **consistent** with a lineage when each of its epochs lies inside that epoch's range in the
   lineage (:meth:`Lineage.holds`); inconsistent segments are diverged and never served.
3. The **chain**: walking back from the consistent segment with the highest end offset, each step takes the
   segment with the highest end offset below the current start (the most recent data first; ties: the one
   reaching furthest back, then the newest leader's copy, then the earliest copied). Segments that overlap the
   chain are left out; a hole between two chain segments is a gap (:func:`chain_gaps`).

Segments left out of the chain are deleted by expiration on the leader once the chain serves every offset they
hold (:func:`unchained`): duplicates, and diverged segments once the current lineage's copies replaced them. Any
other left-out segment is kept and reported: a lineage judged on a stale view must never delete the only copy.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from rlmm.api import RemoteLogSegmentMetadata, RemoteLogSegmentState
from rsm.log.checkpoint import EpochEntry

__all__ = ["Lineage", "chain_gaps", "lineage_of", "remote_chain", "unchained"]

_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED
_UNBOUNDED = 2**63 - 1


@dataclass(frozen=True, slots=True)
class Lineage:
    """Leader epochs in force, ascending by epoch and by start offset: ``((epoch, start_offset), ...)``.

    ``known_from_epoch``: epochs below it are not checked (the leader's checkpoint no longer lists them, and the
    metadata had none to tell); ``None`` means every epoch is checked.
    """

    entries: tuple[tuple[int, int], ...]
    known_from_epoch: int | None = None
    # epoch -> (start offset, end offset inclusive): every segment of every read is checked against it
    _ranges: dict[int, tuple[int, int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        ents = self.entries
        object.__setattr__(self, "_ranges", {
            e: (s, ents[i + 1][1] - 1 if i + 1 < len(ents) else _UNBOUNDED) for i, (e, s) in enumerate(ents)})

    def end_of(self, epoch: int) -> int | None:
        """The last offset (inclusive) of ``epoch`` in this lineage; None when the epoch is not in it."""
        r = self._ranges.get(epoch)
        return None if r is None else r[1]

    def start_of(self, epoch: int) -> int | None:
        r = self._ranges.get(epoch)
        return None if r is None else r[0]

    def end_offset_for(self, epoch: int) -> tuple[int, int] | None:
        """Kafka's answer to OffsetForLeaderEpoch (``LeaderEpochFileCache.endOffsetFor``) from this lineage:
        ``(the largest epoch <= epoch, the start offset of the first epoch above it)``, the end offset exclusive.
        An epoch below every epoch here gets ``(epoch, the first epoch's start)``, as Kafka answers. None when no
        epoch here is above ``epoch`` (its end is past this lineage: whoever holds the log's end answers)."""
        higher = next(((e, s) for e, s in self.entries if e > epoch), None)
        if higher is None:
            return None
        floor = [e for e, _s in self.entries if e <= epoch]
        return (floor[-1] if floor else epoch), higher[1]

    def bound(self, offset: int, epoch: int | None) -> int:
        """``offset``, known to hold ``epoch`` in some lineage, bounded by where that epoch ends in this one (as
        Kafka bounds the highest remote offset). An epoch this lineage does not hold is bounded by the end of the
        highest lower epoch it holds (the offsets above diverged); an unchecked old epoch is taken as it is."""
        if epoch is None or (self.known_from_epoch is not None and epoch < self.known_from_epoch):
            return offset
        end = self.end_of(epoch)
        if end is None:
            lower = [(e, s) for e, s in self.entries if e < epoch]
            if not lower:
                return min(offset, self.entries[0][1] - 1) if self.entries else offset
            end = self._ranges[lower[-1][0]][1]  # an epoch of self.entries: in _ranges
        return min(offset, end)

    def holds(self, md: RemoteLogSegmentMetadata) -> bool:
        """Whether every epoch of ``md`` lies inside that epoch's range in this lineage."""
        if not self.entries:
            return True
        for e, start in md.segment_leader_epochs:
            if self.known_from_epoch is not None and e < self.known_from_epoch:
                continue
            lo = self.start_of(e)
            if lo is None or start < lo:
                return False
            end = md.epoch_end_offset(e)
            hi = self.end_of(e)
            if end is None or hi is None or end > hi:
                return False
        return True

    def merged_with_local(self, local: Sequence[EpochEntry]) -> Lineage:
        """This (metadata) lineage below the local checkpoint's first epoch, the checkpoint from there on.

        The checkpoint's first entry may have had its start raised to the log start offset (local retention
        truncates the checkpoint from the start): its start is the lower of the two sources'.
        """
        if not local:
            return self
        first = local[0].epoch
        own = [(e.epoch, e.start_offset) for e in local]
        meta_first = self.start_of(first)
        if meta_first is not None and meta_first < own[0][1]:
            own[0] = (first, meta_first)
        older = [(e, s) for e, s in self.entries if e < first and s < own[0][1]]
        known = None if older or meta_first is not None else first
        return Lineage(_normalise(older + own), known_from_epoch=known)


def _normalise(entries: Iterable[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Ascending by epoch; an epoch that starts at or after a higher epoch's start is dropped (diverged)."""
    out: list[tuple[int, int]] = []
    for e, s in sorted(entries, reverse=True):
        if out and s >= out[-1][1]:
            continue
        out.append((e, s))
    out.reverse()
    return tuple(out)


def lineage_of(segments: Iterable[RemoteLogSegmentMetadata]) -> Lineage:
    """The lineage the COPY_SEGMENT_FINISHED ``segments`` tell of: each epoch from its lowest offset."""
    starts: dict[int, int] = {}
    for md in segments:
        if md.state != _FINISHED:
            continue
        for e, s in md.segment_leader_epochs:
            if e not in starts or s < starts[e]:
                starts[e] = s
    return Lineage(_normalise(starts.items()))


def _preference(md: RemoteLogSegmentMetadata) -> tuple[int, int, bytes]:
    """Among equally placed copies, the smallest sorts first: the newest leader's, then the earliest copied."""
    epoch = md.broker_leader_epoch
    return (-(epoch if epoch is not None else -1), md.event_timestamp_ms, md.remote_log_segment_id.id.bytes)


def remote_chain(segments: Iterable[RemoteLogSegmentMetadata],
                 lineage: Lineage | None = None) -> list[RemoteLogSegmentMetadata]:
    """The COPY_SEGMENT_FINISHED segments that make up the remote tier, ascending and non-overlapping.

    ``lineage``: the leader's (see :meth:`Lineage.merged_with_local`); default: the metadata's own.
    """
    finished = [m for m in segments if m.state == _FINISHED]
    if not finished:
        return []
    lin = lineage if lineage is not None else lineage_of(finished)
    cands = sorted((m for m in finished if lin.holds(m)),
                   key=lambda m: (m.end_offset_inclusive, m.start_offset, _preference(m)))
    # For equal end offsets the wanted one (reaching furthest back, then preferred) sorts first within the run.
    ends = [m.end_offset_inclusive for m in cands]
    chain: list[RemoteLogSegmentMetadata] = []
    limit = _UNBOUNDED
    while True:
        i = bisect.bisect_right(ends, limit) - 1  # the last candidate ending at or below ``limit``
        if i < 0:
            break
        j = bisect.bisect_left(ends, ends[i])     # the first of the run with that end offset: the wanted one
        md = cands[j]
        chain.append(md)
        limit = md.start_offset - 1
    chain.reverse()
    return chain


def chain_gaps(chain: Sequence[RemoteLogSegmentMetadata]) -> list[tuple[int, int]]:
    """Offset ranges ``(first, last)`` missing between consecutive chain segments."""
    return [(a.end_offset_inclusive + 1, b.start_offset - 1) for a, b in zip(chain, chain[1:], strict=False)
            if b.start_offset > a.end_offset_inclusive + 1]


def unchained(segments: Iterable[RemoteLogSegmentMetadata], chain: Sequence[RemoteLogSegmentMetadata],
              lineage: Lineage) -> tuple[list[tuple[RemoteLogSegmentMetadata, str]], list[RemoteLogSegmentMetadata]]:
    """COPY_SEGMENT_FINISHED segments outside ``chain``: ``(to delete with reason, to keep)``.

    Deleted: those whose every offset the chain serves, as ``diverged-lineage`` when ``lineage`` (the leader's)
    says they diverged, else as ``duplicate``. Kept: any other, diverged or not (it may hold offsets the chain
    lacks; a diverged one is deleted once the current lineage's copies cover its offsets).
    """
    in_chain = {m.remote_log_segment_id.id for m in chain}
    starts = [m.start_offset for m in chain]
    delete: list[tuple[RemoteLogSegmentMetadata, str]] = []
    keep: list[RemoteLogSegmentMetadata] = []
    for md in segments:
        if md.state != _FINISHED or md.remote_log_segment_id.id in in_chain:
            continue
        if _covered(md, chain, starts):
            delete.append((md, "duplicate" if lineage.holds(md) else "diverged-lineage"))
        else:
            keep.append(md)
    return delete, keep


def _covered(md: RemoteLogSegmentMetadata, chain: Sequence[RemoteLogSegmentMetadata], starts: list[int]) -> bool:
    pos = md.start_offset
    i = bisect.bisect_right(starts, pos) - 1
    while pos <= md.end_offset_inclusive:
        if i < 0 or i >= len(chain) or not chain[i].start_offset <= pos <= chain[i].end_offset_inclusive:
            return False
        pos = chain[i].end_offset_inclusive + 1
        i += 1
    return True
