"""tierlog's RemoteStorageManager: each segment as a `.log` object plus ONE packed `.indexes` object.

Backends: S3 (boto3) and the local filesystem; see DESIGN.md "The storage layout".
"""

from rlmm.errors import (
    ConfigError,
    InvalidArgumentError,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageNotReadyError,
)
from rsm.custom_metadata import CustomMetadataError
from rsm.manager import RemoteStorageManager
from rsm.packed_index import PackedIndexCorruptError
from rsm.types import IndexType, LogSegmentData

__all__ = [
    "ConfigError",
    "CustomMetadataError",
    "IndexType",
    "InvalidArgumentError",
    "LogSegmentData",
    "PackedIndexCorruptError",
    "RemoteResourceNotFoundError",
    "RemoteStorageError",
    "RemoteStorageManager",
    "RemoteStorageNotReadyError",
]
