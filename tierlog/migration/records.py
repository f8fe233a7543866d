"""A `__remote_log_metadata` record (Kafka's format, rlmm.kafka_format) as tierlog sees it: decoded with where it sat,
and written into tierlog as the same API call TBRLMM's broker made, or found already there, or dropped as Kafka's
rules drop it. One translation for `tierlog migrate` (bulk) and a migrating node's live import (tierlog.migration.node).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from rlmm import state
from rlmm.errors import DecodeError, InvalidArgumentError, RemoteResourceNotFoundError, RemoteStorageError
from rlmm.kafka_format import KafkaMetadata, RemoteLogSegmentMetadataSnapshot, decode, metadata_partition
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
)

DEFAULT_SOURCE_TOPIC = "__remote_log_metadata"
# A record a tierlog node in migration mode wrote to the source topic carries its broker id under this header.
# TBRLMM reads only record values, so the header is invisible to it; the import takes such records in like any other,
# and `tierlog migrate finalize` tells TBRLMM's writes from them by it.
WRITER_HEADER = "tierlog.writer"
TopicMetadata = RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate | RemotePartitionDeleteMetadata


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """One decoded record of the source topic, with where it was, when, and (if a tierlog node wrote it) by whom."""

    partition: int
    offset: int
    metadata: TopicMetadata
    timestamp_ms: int = 0
    tierlog_writer: int | None = None


@dataclass(frozen=True, slots=True)
class SourceProblem:
    """A record the source topic holds but that cannot be migrated: why, and where it is."""

    topic: str
    partition: int
    offset: int
    reason: str

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition} offset {self.offset}: {self.reason}"

    def as_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "offset": self.offset, "reason": self.reason}


def tierlog_writer(headers: Sequence[tuple[str, bytes | None]] | None) -> int | None:
    """The broker id of the tierlog node that wrote a source record (its WRITER_HEADER), or None for TBRLMM's."""
    for name, value in headers or ():
        if name == WRITER_HEADER and value is not None:
            return int(value)
    return None


def decode_source_record(topic: str, num_partitions: int, message: Any) -> SourceRecord | SourceProblem:
    """A consumed message of the source topic (partition `num_partitions` wide), decoded, or why it cannot be."""
    partition, offset = message.partition() or 0, message.offset() or 0
    try:
        metadata: KafkaMetadata = decode(message.value())
    except DecodeError as exc:
        return SourceProblem(topic, partition, offset, f"undecodable record: {exc}")
    if isinstance(metadata, RemoteLogSegmentMetadataSnapshot):
        return SourceProblem(topic, partition, offset, "a RemoteLogSegmentMetadataSnapshotRecord names no topic "
                             f"partition (segment {metadata.segment_id}); TBRLMM never writes one to its topic")
    tp = metadata.topic_id_partition
    expected = metadata_partition(tp, num_partitions)
    if expected != partition:
        return SourceProblem(topic, partition, offset,
                             f"a record of {tp} that TBRLMM's partitioner puts in partition {expected}: not written "
                             "by TBRLMM over this topic's partition count, so its order is unknown")
    _kind, timestamp_ms = message.timestamp()
    return SourceRecord(partition, offset, metadata, max(timestamp_ms, 0), tierlog_writer(message.headers()))


def refusal(store: state.StateReader, metadata: TopicMetadata, exc: RemoteStorageError) -> str:
    """Why Kafka's rules drop a record, in a few words (what the counts are grouped by)."""
    if state.is_deleted(store, metadata.topic_id_partition):
        return "partition already deleted"
    if isinstance(exc, RemoteResourceNotFoundError):
        return "update of an unknown segment"
    if isinstance(exc, InvalidArgumentError):
        return "invalid state transition"
    return type(exc).__name__


def reflected(view: state.StateReader, metadata: TopicMetadata) -> bool:
    """Whether tierlog's view already holds what `metadata` writes (a write already made, by this run or another)."""
    if isinstance(metadata, RemoteLogSegmentMetadata):
        return view.segment(metadata.remote_log_segment_id) == metadata
    if isinstance(metadata, RemoteLogSegmentMetadataUpdate):
        current = view.segment(metadata.remote_log_segment_id)
        return current is not None and (current.state, current.broker_id, current.event_timestamp_ms,
                                        current.custom_metadata) == (metadata.state, metadata.broker_id,
                                                                     metadata.event_timestamp_ms,
                                                                     metadata.custom_metadata)
    return view.partition_delete(metadata.topic_id_partition) == metadata


def check_call(view: state.StateReader, metadata: TopicMetadata) -> None:
    """Raise as the manager's API call writing `metadata` would on `view` (InvalidArgumentError,
    RemoteResourceNotFoundError, ...), before anything is written."""
    if isinstance(metadata, RemoteLogSegmentMetadata):
        state.prepare_add(view, metadata)
    elif isinstance(metadata, RemoteLogSegmentMetadataUpdate):
        state.prepare_update(view, metadata)
    else:
        state.prepare_partition_delete(view, metadata)


@dataclass(frozen=True, slots=True)
class Skipped:
    """A record not written: tierlog holds it already (`reason` None), or Kafka's rules drop it (`reason` says why)."""

    reason: str | None = None


def start_write(manager: Any, metadata: TopicMetadata) -> Future[None] | Skipped:
    """Write `metadata` through a RemoteLogMetadataManager as the API call TBRLMM's broker made: the write's future,
    or Skipped when the manager's view holds it already or refuses it as Kafka's rules do. Other RemoteStorageErrors
    (the metadata topic unavailable, ...) are raised."""
    view: state.StateReader = manager.view
    if reflected(view, metadata):
        return Skipped()
    try:
        if isinstance(metadata, RemoteLogSegmentMetadata):
            return manager.add_remote_log_segment_metadata(metadata)
        if isinstance(metadata, RemoteLogSegmentMetadataUpdate):
            return manager.update_remote_log_segment_metadata(metadata)
        return manager.put_remote_partition_delete_metadata(metadata)
    except (InvalidArgumentError, RemoteResourceNotFoundError) as exc:
        return Skipped(refusal(view, metadata, exc))
