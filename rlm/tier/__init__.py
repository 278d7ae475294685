"""The read model of the remote tier: the one package every reader of remote offsets goes through.

The CLI (``rlm cat``, ``ls``, ``offsets``, ``status``), the Spark source (batch and streaming), the Kafka-protocol
history endpoint, and the sidecar's own tasks (retention, the copier's resume point, recovery) all see the same
tier, computed here once:

- :mod:`~rlm.tier.chain`: which remote segments make up a partition's tier (one non-overlapping chain of one
  leader-epoch lineage), its gaps, and the copies left out of it;
- :mod:`~rlm.tier.segments`: the one adapter between the metadata manager's model (``rlmm``) and the storage
  manager's (``rsm``), and the slicing of the local leader-epoch checkpoint for a range;
- :mod:`~rlm.tier.isolation`: :class:`Isolation`, what a reader sees of transactions (Kafka's ``IsolationLevel``);
- :mod:`~rlm.tier.reader`: records of remote offsets (:class:`RemoteReader`), and the one decision of which
  batches a reader sees (:func:`iter_segment_batches`, :class:`TxnIndexes`);
- :mod:`~rlm.tier.view`: a partition's tier as a broker serves its log (:class:`TierView`: log start offset, high
  watermark, last stable offset, fetches of whole batches), for the history endpoint and the streaming source.

The leader epoch of an offset is :meth:`rlmm.api.RemoteLogSegmentMetadata.epoch_at` of the chain segment holding
it (:meth:`PartitionTier.epoch_of`). Import from ``rlm.tier`` itself: its modules are its own business
(``tests/test_layering.py``). The package sits below its readers: it uses ``rlmm``, ``rsm``'s API and ``rlm``'s
errors and metrics, nothing else of ``rlm``.
"""

from __future__ import annotations

from rlm.tier.chain import Lineage, chain_gaps, lineage_of, remote_chain, unchained
from rlm.tier.isolation import Isolation
from rlm.tier.reader import (
    LargeRemoteRecord,
    OffsetOutOfRangeError,
    RemoteReader,
    RemoteRecord,
    TxnIndexes,
    aborted_covering,
    is_aborted,
    iter_segment_batches,
    txn_search,
)
from rlm.tier.segments import checkpoint_epoch_at, epoch_pairs, epochs_for_range, from_rsm, to_rsm
from rlm.tier.view import (
    Decided,
    FetchResult,
    PartitionTier,
    StreamedBatch,
    TierView,
    TimestampHit,
    UnreadableCopyError,
)

__all__ = [
    "Decided",
    "FetchResult",
    "Isolation",
    "LargeRemoteRecord",
    "Lineage",
    "OffsetOutOfRangeError",
    "PartitionTier",
    "RemoteReader",
    "RemoteRecord",
    "StreamedBatch",
    "TierView",
    "TimestampHit",
    "TxnIndexes",
    "UnreadableCopyError",
    "aborted_covering",
    "chain_gaps",
    "checkpoint_epoch_at",
    "epoch_pairs",
    "epochs_for_range",
    "from_rsm",
    "is_aborted",
    "iter_segment_batches",
    "lineage_of",
    "remote_chain",
    "to_rsm",
    "txn_search",
    "unchained",
]
