"""A synchronous metadata manager for copier unit tests without a broker: the in-memory reference
(:mod:`rlmm.memory`), which refuses what the topic-based manager refuses (fencing, state transitions), with the same
errors, as ``tests/rlmm/test_contract.py`` checks on both. The capabilities themselves are proven against the real
broker (tests/rlm/test_cluster_events.py)."""

from __future__ import annotations

from pathlib import Path

from rlmm.memory import InMemoryRemoteLogMetadataManager

__all__ = ["SyncRlmm"]


class SyncRlmm(InMemoryRemoteLogMetadataManager):
    """The in-memory reference manager, serving every partition (the copier tests never announce leadership).

    ``cache_dir`` is unused (nothing is on disk): it stays for the callers written against the former double, which
    applied writes to a RocksDB cache there."""

    def __init__(self, cache_dir: Path | None = None) -> None:
        super().__init__(serve_all=True)
