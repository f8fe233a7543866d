"""A `__remote_log_metadata` record (Kafka's format, rlmm.kafka_format) as tierlog sees it: decoded with where it sat,
and written into tierlog as the same API call TBRLMM's broker made, or found already there, or dropped as Kafka's
rules drop it (a migrating node's live import, tierlog.migration.node); and, for `tierlog migrate`'s bulk import, the
records that bring tierlog from what it holds of a user partition to the state Kafka's rules build from its history.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from rlmm import lineage, state
from rlmm.errors import DecodeError, InvalidArgumentError, RemoteResourceNotFoundError, RemoteStorageError
from rlmm.events import EpochCheckpoint, MetadataEvent, RecordKey, epochs_key, partition_delete_key, segment_key
from rlmm.kafka_format import KafkaMetadata, RemoteLogSegmentMetadataSnapshot, decode, metadata_partition
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

DEFAULT_SOURCE_TOPIC = "__remote_log_metadata"
# A record a tierlog node in migration mode wrote to the source topic carries its broker id under this header.
# TBRLMM reads only record values, so the header is invisible to it; the import takes such records in like any other,
# and `tierlog migrate finalize` tells TBRLMM's writes from them by it.
WRITER_HEADER = "tierlog.writer"
TopicMetadata = RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate | RemotePartitionDeleteMetadata
S = RemoteLogSegmentState


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


@lru_cache(maxsize=65536)
def _source_partition(tp: TopicIdPartition, num_partitions: int) -> int:
    """TBRLMM's partitioner (murmur2 in Python), once per user partition: an import checks it for every record."""
    return metadata_partition(tp, num_partitions)


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
    expected = _source_partition(tp, num_partitions)
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


# --- the bulk import: a user partition's final state under Kafka's rules, as the records that bring tierlog there --

Record = tuple[RecordKey, MetadataEvent | None]
# A segment's or a partition delete's record, or a tombstone.
StateRecord = tuple[RecordKey, RemoteLogSegmentMetadata | RemotePartitionDeleteMetadata | None]


def records_to_reach(final: state.StateReader, held: state.StateReader, tp: TopicIdPartition) -> list[StateRecord]:
    """The segment and partition-delete records (and the tombstones a writer appends after them) that take tierlog's
    `held` state of `tp` to `final`, the state Kafka's rules build from the source's records of `tp`.

    They are the newest records of each key that tierlog's own writer leaves on its topic for the same calls, each
    reached through valid transitions (a node that applies every record drops a COPY_SEGMENT_FINISHED of a segment it
    never saw added), so a node applying them, or a rebuild from the compacted topic, holds `final`: a segment
    missing from `held` gets its COPY_SEGMENT_STARTED record first, a segment `held` has that Kafka's rules deleted
    gets its delete records and tombstone, a partition delete goes through each state up to the final one. The
    epochs' lineage is stated afterwards by `lineage_checkpoint`. A `held` state from which `final` cannot be reached
    (tierlog's topic written by more than the import) raises InvalidArgumentError naming the segment or partition."""
    held_delete = held.partition_delete(tp)
    final_delete = final.partition_delete(tp)
    if state.delete_finished(held_delete):
        return []  # nothing changes a deleted partition, in tierlog as in Kafka's rules
    out: list[StateRecord] = []
    if not state.delete_finished(final_delete):
        held_segments = {md.remote_log_segment_id.id: md for md in held.segments_of(tp)}
        for md in sorted(final.segments_of(tp), key=state.listing_order):
            current = held_segments.pop(md.remote_log_segment_id.id, None)
            if current == md:
                continue
            if current is None:
                if md.state is not S.COPY_SEGMENT_STARTED:
                    out.append((segment_key(md.remote_log_segment_id), replace(md, state=S.COPY_SEGMENT_STARTED)))
            elif not state.is_valid_segment_transition(current.state, md.state):
                raise InvalidArgumentError(
                    f"tierlog holds segment {md.remote_log_segment_id} as {current.state.name}, which cannot become "
                    f"{md.state.name} as the source says: was tierlog's metadata topic written by more than this "
                    "import?")
            out.append((segment_key(md.remote_log_segment_id), md))
        for gone in sorted(held_segments.values(), key=state.listing_order):  # deleted under Kafka's rules since
            key = segment_key(gone.remote_log_segment_id)
            if gone.state is not S.DELETE_SEGMENT_STARTED:
                out.append((key, replace(gone, state=S.DELETE_SEGMENT_STARTED)))
            out.extend(((key, replace(gone, state=S.DELETE_SEGMENT_FINISHED)), (key, None)))
    if final_delete is not None and final_delete != held_delete:
        reached = -1 if held_delete is None else held_delete.state
        if reached > final_delete.state:
            raise InvalidArgumentError(
                f"tierlog holds partition {tp} as {held_delete.state.name if held_delete else None}, which cannot "
                f"become {final_delete.state.name} as the source says: was tierlog's metadata topic written by more "
                "than this import?")
        out.extend((partition_delete_key(tp), replace(final_delete, state=between))
                   for between in RemotePartitionDeleteState if reached < between < final_delete.state)
        out.append((partition_delete_key(tp), final_delete))
        if state.delete_finished(final_delete):
            out.extend((key, None) for key in [*state.doomed_keys(held, tp), epochs_key(tp)])
    return out


def lineage_checkpoint(final: state.StateReader, held: state.StateReader, tp: TopicIdPartition, wrote: bool,
                       reflects_offset: int | None, event_timestamp_ms: int, broker_id: int) -> list[Record]:
    """The checkpoint records of `tp`'s epochs that state `final`'s lineage to tierlog after `records_to_reach`:
    every epoch when records were written for `tp` (`wrote`: applied in another order than the source's, they may
    derive another lineage), else the epochs whose lineage `held` states otherwise or owes a checkpoint of.
    `reflects_offset`: the offset of the newest record of `tp` on tierlog's topic, so that nodes take the checkpoint
    as current (rlmm.lineage)."""
    if state.is_deleted(final, tp):
        return []
    owed = lineage.owed_epochs(held, tp)
    epochs = tuple(found for found in sorted(final.lineages_of(tp), key=lambda lin: lin.epoch)
                   if wrote or found.epoch in owed or held.lineage(tp, found.epoch) != found)
    if not epochs:
        return []
    return list(lineage.checkpoint_records(EpochCheckpoint(tp, epochs, event_timestamp_ms, broker_id, reflects_offset,
                                                           whole_partition=False)))


def written_kind(event: RemoteLogSegmentMetadata | RemotePartitionDeleteMetadata) -> str:
    """How the report counts a written record: an add (a segment's first record), an update, a partition delete."""
    if isinstance(event, RemoteLogSegmentMetadata):
        return "segment" if event.state is S.COPY_SEGMENT_STARTED else "segment update"
    return "partition delete"
