"""rlmm: the RemoteLogMetadataManager (KIP-405) on a compacted, Kafka-compatible metadata topic + RocksDB cache."""

from rlmm.api import (
    CopyFencedError,
    CorruptMetadataRecordError,
    InvalidStateTransitionError,
    MetadataCacheFormatError,
    MetadataWriteError,
    PartitionNotServedError,
    ReadYourWritesTimeoutError,
    RemoteLogMetadataError,
    RemoteLogMetadataManager,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
    UnknownSegmentError,
)
from rlmm.partitioner import metadata_partition
from rlmm.topic_manager import TopicBasedRemoteLogMetadataManager, TopicBasedRlmmConfig

__all__ = [
    "CopyFencedError",
    "CorruptMetadataRecordError",
    "InvalidStateTransitionError",
    "MetadataCacheFormatError",
    "MetadataWriteError",
    "PartitionNotServedError",
    "ReadYourWritesTimeoutError",
    "RemoteLogMetadataError",
    "RemoteLogMetadataManager",
    "RemoteLogSegmentId",
    "RemoteLogSegmentMetadata",
    "RemoteLogSegmentMetadataUpdate",
    "RemoteLogSegmentState",
    "RemotePartitionDeleteMetadata",
    "RemotePartitionDeleteState",
    "TopicBasedRemoteLogMetadataManager",
    "TopicBasedRlmmConfig",
    "TopicIdPartition",
    "UnknownSegmentError",
    "metadata_partition",
]
