"""The error hierarchy shared by rlmm and rsm, mirroring Kafka's remote-storage exceptions.

Callers catch RemoteStorageError for everything; the subclasses say what went wrong and what to do.
"""

from __future__ import annotations


class RemoteStorageError(Exception):
    """Base of every error tierlog raises (Kafka's RemoteStorageException)."""


class RemoteResourceNotFoundError(RemoteStorageError):
    """The partition, segment or index asked for does not exist (Kafka's RemoteResourceNotFoundException)."""


class RemoteStorageNotReadyError(RemoteStorageError):
    """Retriable: the partition is registered but this node's view has not caught up yet.

    Kafka maps this to ReplicaNotAvailable, which clients retry.
    """

    retriable = True


class InvalidArgumentError(RemoteStorageError, ValueError):
    """A caller passed a value Kafka's contract forbids; the message names the field."""


class ConfigError(RemoteStorageError, ValueError):
    """A configuration key is unknown or its value invalid; the message names the key."""


class MetadataLogError(RemoteStorageError):
    """The metadata topic holds a record this node cannot apply (corrupt bytes, unknown schema).

    The message names topic, partition and offset; nothing after it is applied for that metadata partition.
    """


class MetadataTimeoutError(RemoteStorageError):
    """A write was not acknowledged and applied within its deadline."""


class DecodeError(RemoteStorageError, ValueError):
    """A record value is not a tierlog event this reader understands."""


class ViewFormatError(RemoteStorageError):
    """A node's RocksDB view was written in a format this version does not read; the message says what to do."""


class SnapshotError(RemoteStorageError):
    """A snapshot file is not usable; the message says which and why."""
