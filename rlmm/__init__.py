"""tierlog's RemoteLogMetadataManager: an event-sourced store on a compacted Kafka topic.

Every node materializes the metadata events into a local RocksDB view; see DESIGN.md.
"""

from rlmm.errors import (
    ConfigError,
    InvalidArgumentError,
    MetadataLogError,
    MetadataTimeoutError,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageNotReadyError,
)
from rlmm.manager import RemoteLogMetadataManager
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

__all__ = [
    "ConfigError",
    "InvalidArgumentError",
    "MetadataLogError",
    "MetadataTimeoutError",
    "RemoteLogMetadataManager",
    "RemoteLogSegmentId",
    "RemoteLogSegmentMetadata",
    "RemoteLogSegmentMetadataUpdate",
    "RemoteLogSegmentState",
    "RemotePartitionDeleteMetadata",
    "RemotePartitionDeleteState",
    "RemoteResourceNotFoundError",
    "RemoteStorageError",
    "RemoteStorageNotReadyError",
    "TopicIdPartition",
]
