"""tierlog's RemoteLogMetadataManager: an event-sourced store on a compacted Kafka topic.

Every node materializes the metadata events into a local RocksDB view; see DESIGN.md.
"""

from typing import TYPE_CHECKING

from rlmm.errors import (
    ConfigError,
    InvalidArgumentError,
    MetadataLogError,
    MetadataTimeoutError,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageNotReadyError,
)
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

if TYPE_CHECKING:
    from rlmm.manager import RemoteLogMetadataManager

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


def __getattr__(name: str) -> object:
    # The manager (and the Kafka client it brings) is imported when first asked for, so that a process using only
    # the view's modules (the rebuild's fold worker, rlmm.fold_worker) starts in a third of the time.
    if name == "RemoteLogMetadataManager":
        from rlmm.manager import RemoteLogMetadataManager

        return RemoteLogMetadataManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
