"""An in-memory reference of Kafka's RemoteLogMetadataManager semantics, written from KAFKA_SEMANTICS.md.

Tests compare tierlog's state machine and manager against it; it shares only the value types with `rlmm`.
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass, field

from rlmm.errors import InvalidArgumentError, RemoteResourceNotFoundError
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

S = RemoteLogSegmentState
P = RemotePartitionDeleteState

# Kafka's segment state machine; every self-transition is valid, DELETE_SEGMENT_FINISHED is terminal.
SEGMENT_NEXT: dict[RemoteLogSegmentState, set[RemoteLogSegmentState]] = {
    S.COPY_SEGMENT_STARTED: {S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED},
    S.COPY_SEGMENT_FINISHED: {S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED},
    S.DELETE_SEGMENT_STARTED: {S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED},
    S.DELETE_SEGMENT_FINISHED: {S.DELETE_SEGMENT_FINISHED},
}

PARTITION_NEXT: dict[RemotePartitionDeleteState | None, set[RemotePartitionDeleteState]] = {
    None: {P.DELETE_PARTITION_MARKED},
    P.DELETE_PARTITION_MARKED: {P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED},
    P.DELETE_PARTITION_STARTED: {P.DELETE_PARTITION_STARTED, P.DELETE_PARTITION_FINISHED},
    P.DELETE_PARTITION_FINISHED: {P.DELETE_PARTITION_FINISHED},
}

def epoch_end(md: RemoteLogSegmentMetadata, epoch: int) -> int:
    """Last offset of `epoch` in the segment: one before the next epoch's start, or the segment's end."""
    later_starts = [start for e, start in md.segment_leader_epochs.items() if e > epoch]
    return min(later_starts) - 1 if later_starts else md.end_offset


def listing_order(md: RemoteLogSegmentMetadata) -> tuple[int, int, bytes]:
    """Kafka orders listings by start offset; ties are broken by end offset, then segment id bytes."""
    return md.start_offset, md.end_offset, md.remote_log_segment_id.id.bytes


@dataclass
class EpochState:
    """Kafka's per-leader-epoch lineage: offsetToId, the unreferenced ids, highestLogOffset."""

    offset_to_id: dict[int, uuid.UUID] = field(default_factory=dict)
    unreferenced: set[uuid.UUID] = field(default_factory=set)
    highest_log_offset: int | None = None

    def floor(self, offset: int) -> tuple[int, uuid.UUID] | None:
        keys = [k for k in self.offset_to_id if k <= offset]
        if not keys:
            return None
        key = max(keys)
        return key, self.offset_to_id[key]

    def copy_finished(self, start: int, end: int, segment: uuid.UUID) -> None:
        # A re-upload after a leader change covering the same or a larger range displaces the older entries; an
        # entry it leaves at its own start is overwritten, its segment added to no set (offsetToId.put).
        while self.offset_to_id:
            last = max(self.offset_to_id)
            if last < start or (self.highest_log_offset is not None and self.highest_log_offset > end):
                break
            self.unreferenced.add(self.offset_to_id.pop(last))
        self.offset_to_id[start] = segment
        self.unreferenced.discard(segment)
        if self.highest_log_offset is None or end > self.highest_log_offset:
            self.highest_log_offset = end

    def delete_started(self, start: int, segment: uuid.UUID) -> None:
        if self.offset_to_id.get(start) == segment:
            del self.offset_to_id[start]
        self.unreferenced.add(segment)

    def forget(self, segment: uuid.UUID) -> None:
        self.unreferenced.discard(segment)
        for start in [k for k, v in self.offset_to_id.items() if v == segment]:
            del self.offset_to_id[start]


@dataclass
class PartitionState:
    segments: dict[uuid.UUID, RemoteLogSegmentMetadata] = field(default_factory=dict)
    epochs: dict[int, EpochState] = field(default_factory=dict)
    delete_state: RemotePartitionDeleteState | None = None

    def epoch(self, epoch: int) -> EpochState:
        return self.epochs.setdefault(epoch, EpochState())


def _tp_key(tp: TopicIdPartition) -> tuple[uuid.UUID, int]:
    return tp.topic_id, tp.partition


class ReferenceModel:
    """Kafka's API-level RLMM semantics over plain dicts; every partition counts as registered and ready.

    Invalid calls raise: InvalidArgumentError for a wrong state or transition, RemoteResourceNotFoundError for an
    unknown segment or a partition whose deletion finished.
    """

    def __init__(self) -> None:
        self._partitions: dict[tuple[uuid.UUID, int], PartitionState] = {}
        self._deleted: set[tuple[uuid.UUID, int]] = set()

    # -- helpers ------------------------------------------------------------------------------------

    def is_deleted(self, tp: TopicIdPartition) -> bool:
        return _tp_key(tp) in self._deleted

    def _live(self, tp: TopicIdPartition) -> PartitionState:
        key = _tp_key(tp)
        partition = self._partitions.get(key)
        if partition is None:
            if key in self._deleted:
                raise RemoteResourceNotFoundError(f"partition {tp} was deleted")
            partition = self._partitions[key] = PartitionState()
        return partition

    def segment(self, tp: TopicIdPartition, segment: uuid.UUID) -> RemoteLogSegmentMetadata | None:
        return self._live(tp).segments.get(segment)

    # -- writes -------------------------------------------------------------------------------------

    def add_remote_log_segment_metadata(self, md: RemoteLogSegmentMetadata) -> None:
        partition = self._live(md.topic_id_partition)
        if md.state is not S.COPY_SEGMENT_STARTED:
            raise InvalidArgumentError(f"add needs COPY_SEGMENT_STARTED, got {md.state.name}")
        segment = md.remote_log_segment_id.id
        existing = partition.segments.get(segment)
        if existing is not None:
            if S.COPY_SEGMENT_STARTED not in SEGMENT_NEXT[existing.state]:
                raise InvalidArgumentError(f"segment is {existing.state.name}, cannot be added again")
            for epoch_state in partition.epochs.values():
                epoch_state.forget(segment)
        for epoch in md.segment_leader_epochs:
            partition.epoch(epoch).unreferenced.add(segment)
        partition.segments[segment] = md

    def update_remote_log_segment_metadata(self, update: RemoteLogSegmentMetadataUpdate) -> None:
        partition = self._live(update.topic_id_partition)
        if update.state is S.COPY_SEGMENT_STARTED:
            raise InvalidArgumentError("update may not set COPY_SEGMENT_STARTED")
        segment = update.remote_log_segment_id.id
        existing = partition.segments.get(segment)
        if existing is None:
            raise RemoteResourceNotFoundError(f"no segment {update.remote_log_segment_id}")
        if update.state not in SEGMENT_NEXT[existing.state]:
            raise InvalidArgumentError(f"segment cannot go from {existing.state.name} to {update.state.name}")
        updated = dataclasses.replace(
            existing,
            broker_id=update.broker_id,
            event_timestamp_ms=update.event_timestamp_ms,
            custom_metadata=update.custom_metadata,
            state=update.state,
        )
        for epoch, start in updated.segment_leader_epochs.items():
            epoch_state = partition.epoch(epoch)
            if update.state is S.COPY_SEGMENT_FINISHED:
                epoch_state.copy_finished(start, epoch_end(updated, epoch), segment)
            elif update.state is S.DELETE_SEGMENT_STARTED:
                epoch_state.delete_started(start, segment)
            else:
                epoch_state.forget(segment)
        if update.state is S.DELETE_SEGMENT_FINISHED:
            del partition.segments[segment]
        else:
            partition.segments[segment] = updated

    def put_remote_partition_delete_metadata(self, md: RemotePartitionDeleteMetadata) -> None:
        tp = md.topic_id_partition
        partition = self._live(tp)
        if md.state not in PARTITION_NEXT[partition.delete_state]:
            current = partition.delete_state.name if partition.delete_state else "no delete state"
            raise InvalidArgumentError(f"partition delete cannot go from {current} to {md.state.name}")
        if md.state is P.DELETE_PARTITION_FINISHED:
            del self._partitions[_tp_key(tp)]
            self._deleted.add(_tp_key(tp))
        else:
            partition.delete_state = md.state

    # -- queries ------------------------------------------------------------------------------------

    def remote_log_segment_metadata(
        self, tp: TopicIdPartition, epoch: int, offset: int
    ) -> RemoteLogSegmentMetadata | None:
        partition = self._live(tp)
        epoch_state = partition.epochs.get(epoch)
        entry = epoch_state.floor(offset) if epoch_state else None
        if entry is None:
            return None
        md = partition.segments.get(entry[1])
        if md is None or md.state is not S.COPY_SEGMENT_FINISHED or offset > epoch_end(md, epoch):
            return None
        return md

    def highest_offset_for_epoch(self, tp: TopicIdPartition, epoch: int) -> int | None:
        epoch_state = self._live(tp).epochs.get(epoch)
        return epoch_state.highest_log_offset if epoch_state else None

    def list_remote_log_segments(
        self, tp: TopicIdPartition, epoch: int | None = None
    ) -> list[RemoteLogSegmentMetadata]:
        """Kafka's listings: all epochs', every segment held (not DELETE_SEGMENT_FINISHED); an epoch's, the segments
        its offsetToId maps and its unreferenced ids (a finished segment whose entry a later upload took is in
        neither)."""
        partition = self._live(tp)
        if epoch is None:
            found = list(partition.segments.values())
        else:
            epoch_state = partition.epochs.get(epoch)
            ids = set() if epoch_state is None else {*epoch_state.offset_to_id.values(), *epoch_state.unreferenced}
            found = [partition.segments[segment] for segment in ids]
        return sorted(found, key=listing_order)

    def remote_log_size(self, tp: TopicIdPartition, epoch: int) -> int:
        return sum(md.segment_size_in_bytes for md in self.list_remote_log_segments(tp, epoch))

    def next_segment_with_txn_index(
        self, tp: TopicIdPartition, epoch: int, offset: int
    ) -> RemoteLogSegmentMetadata | None:
        md = self.remote_log_segment_metadata(tp, epoch, offset)
        while md is not None and md.txn_idx_empty:
            md = self.remote_log_segment_metadata(tp, epoch, md.end_offset + 1)
        return md
