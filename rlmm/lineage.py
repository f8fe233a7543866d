"""Kafka's per-leader-epoch lineage (RemoteLogLeaderEpochState) over a state store, and its checkpoints.

Per user partition and leader epoch: the offset index of COPY_SEGMENT_FINISHED segments, the finished segments a
newer upload displaced, and the highest log offset. These facts depend on the order of the segment records, so a
writer appends an `epochs:` checkpoint of them after each event that changed them; a compacted log, which may
have lost the records that produced a fact, replays to the same lineage through the newest checkpoint.

A checkpoint is stamped with the metadata offset of the newest lineage-changing record its writer had applied
(`reflects_offset`). A store remembers the offset of the newest lineage-changing record it applied itself
(`lineage_position`). A checkpoint that reflects less than the store has seen was computed before some record
the store already applied: it may only add what never goes back (highest offsets), never undo a displacement or
restore a displaced segment. Only a checkpoint that saw everything the store has seen replaces its lineage.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator
from typing import Protocol

from rlmm import view_format
from rlmm.events import EpochCheckpoint, EpochLineage
from rlmm.types import RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition


class LineageReader(Protocol):
    """What the lineage rules read from a store; one user partition per call."""

    def segments_of(self, tp: TopicIdPartition) -> Iterator[RemoteLogSegmentMetadata]: ...
    def lineage(self, tp: TopicIdPartition, epoch: int) -> EpochLineage | None: ...
    def lineages_of(self, tp: TopicIdPartition) -> Iterator[EpochLineage]: ...
    def checkpointed_lineage(self, tp: TopicIdPartition) -> bytes | None: ...
    def lineage_position(self, tp: TopicIdPartition) -> int | None: ...
    def index_get(self, tp: TopicIdPartition, epoch: int, start_offset: int) -> uuid.UUID | None: ...
    def index_floor(self, tp: TopicIdPartition, epoch: int, offset: int) -> tuple[int, uuid.UUID] | None: ...


class LineageStore(LineageReader, Protocol):
    """A LineageReader the rules can also change."""

    def put_lineage(self, tp: TopicIdPartition, lineage: EpochLineage) -> None: ...
    def remove_lineage(self, tp: TopicIdPartition, epoch: int) -> None: ...
    def set_checkpointed_lineage(self, tp: TopicIdPartition, lineage_digest: bytes | None) -> None: ...
    def set_lineage_position(self, tp: TopicIdPartition, offset: int) -> None: ...
    def index_put(self, tp: TopicIdPartition, epoch: int, start_offset: int, segment: uuid.UUID) -> None: ...
    def index_remove(self, tp: TopicIdPartition, epoch: int, start_offset: int) -> None: ...

_LAST = 2**63 - 1
_EMPTY_DIGEST = hashlib.sha256().digest()


def reference_finished(store: LineageStore, md: RemoteLogSegmentMetadata, offset: int | None) -> None:
    """Kafka's rule for a COPY_SEGMENT_FINISHED segment, in each of its leader epochs."""
    tp = md.topic_id_partition
    for epoch, start in md.segment_leader_epochs.items():
        end = md.epoch_end_offset(epoch)
        current = store.lineage(tp, epoch)
        highest = current.highest_log_offset if current else None
        displaced = set(current.displaced_segment_ids) if current else set()
        # A newer upload covering the same or a larger range (after a leader change) replaces older segments.
        while (last := store.index_floor(tp, epoch, _LAST)) is not None and last[0] >= start and (
            highest is None or highest <= end
        ):
            store.index_remove(tp, epoch, last[0])
            displaced.add(last[1])
        previous = store.index_get(tp, epoch, start)
        store.index_put(tp, epoch, start, md.remote_log_segment_id.id)
        if previous is not None and previous != md.remote_log_segment_id.id:
            displaced.add(previous)
        displaced.discard(md.remote_log_segment_id.id)
        highest = end if highest is None else max(highest, end)
        store.put_lineage(tp, EpochLineage(epoch, highest, frozenset(displaced)))
    _advance(store, tp, offset)


def unreference(store: LineageStore, md: RemoteLogSegmentMetadata, offset: int | None) -> None:
    """Remove a segment from every epoch's offset index and displaced set; highest offsets stay."""
    tp = md.topic_id_partition
    segment = md.remote_log_segment_id.id
    for epoch, start in md.segment_leader_epochs.items():
        if store.index_get(tp, epoch, start) == segment:
            store.index_remove(tp, epoch, start)
        lineage = store.lineage(tp, epoch)
        if lineage is not None and segment in lineage.displaced_segment_ids:
            _put_or_drop(store, tp, EpochLineage(
                epoch, lineage.highest_log_offset, lineage.displaced_segment_ids - {segment}))
    _advance(store, tp, offset)


def forget(store: LineageStore, tp: TopicIdPartition) -> None:
    """Drop every epoch of the partition (its `epochs:` key was tombstoned)."""
    for lineage in list(store.lineages_of(tp)):
        store.remove_lineage(tp, lineage.epoch)
    store.set_checkpointed_lineage(tp, None)


def _advance(store: LineageStore, tp: TopicIdPartition, offset: int | None) -> None:
    # Without a record offset (a replay that does not know positions) staleness cannot be judged.
    if offset is not None:
        store.set_lineage_position(tp, offset)


def _put_or_drop(store: LineageStore, tp: TopicIdPartition, lineage: EpochLineage) -> None:
    if _kept(lineage):
        store.put_lineage(tp, lineage)
    else:
        store.remove_lineage(tp, lineage.epoch)


def _kept(lineage: EpochLineage) -> bool:
    """Whether an epoch's lineage says anything (an empty one is not stored)."""
    return lineage.highest_log_offset is not None or bool(lineage.displaced_segment_ids)


def is_stale(store: LineageReader, checkpoint: EpochCheckpoint) -> bool:
    """Whether the store applied a lineage-changing record its checkpoint's writer had not seen."""
    seen = store.lineage_position(checkpoint.topic_id_partition)
    return seen is not None and checkpoint.reflects_offset is not None and checkpoint.reflects_offset < seen


def apply_checkpoint(store: LineageStore, checkpoint: EpochCheckpoint) -> bool:
    """Fold a checkpoint: authoritative when it saw all the store saw, else only its highest offsets count.

    Returns whether it was stale. An epoch the checkpoint states as the store holds it costs a comparison only, and
    the lineage digest is taken from the epochs as folded, not read back from the store."""
    tp = checkpoint.topic_id_partition
    stale = is_stale(store, checkpoint)
    wanted = {lineage.epoch: lineage for lineage in checkpoint.epochs}
    current = {lineage.epoch: lineage for lineage in store.lineages_of(tp)}
    segments: dict[uuid.UUID, RemoteLogSegmentMetadata] | None = None
    folded: list[EpochLineage] = []
    for epoch in sorted(wanted.keys() | current.keys()):
        old, new = current.get(epoch), wanted.get(epoch)
        if old is not None and old == new:
            folded.append(old)
            continue
        old = old or EpochLineage(epoch, None)
        new = new or EpochLineage(epoch, None)
        # A highest offset never goes down, even under a checkpoint another writer computed before it.
        highest = max((h for h in (old.highest_log_offset, new.highest_log_offset) if h is not None), default=None)
        new = EpochLineage(epoch, highest, old.displaced_segment_ids if stale else new.displaced_segment_ids)
        if _kept(new):
            folded.append(new)
        if old == new:
            continue
        for segment_id in sorted(old.displaced_segment_ids ^ new.displaced_segment_ids):
            if segments is None:
                segments = {s.remote_log_segment_id.id: s for s in store.segments_of(tp)}
            md = segments.get(segment_id)
            if md is None or epoch not in md.segment_leader_epochs:
                continue
            start = md.segment_leader_epochs[epoch]
            if segment_id in new.displaced_segment_ids:
                if store.index_get(tp, epoch, start) == segment_id:
                    store.index_remove(tp, epoch, start)
            elif md.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED:
                store.index_put(tp, epoch, start, segment_id)
        _put_or_drop(store, tp, new)
    # After a stale checkpoint the newest one on the topic no longer describes the lineage: its writer appends a
    # current one as soon as it applies it (rlmm.writer), and failing that the partition's next write does (see
    # `pending_checkpoint`), so a compacted rebuild finds it.
    store.set_checkpointed_lineage(tp, None if stale else _digest_of(folded))
    return stale


def digest(store: LineageReader, tp: TopicIdPartition) -> bytes:
    return _digest_of(sorted(store.lineages_of(tp), key=lambda lin: lin.epoch))


def _digest_of(lineages: list[EpochLineage]) -> bytes:
    """sha256 over the epochs' view encodings, in epoch order."""
    return hashlib.sha256(b"".join(map(view_format.encode_lineage, lineages))).digest()


def pending_checkpoint(
    store: LineageReader, tp: TopicIdPartition, event_timestamp_ms: int, broker_id: int
) -> EpochCheckpoint | None:
    """The checkpoint a writer must append when tp's lineage changed since the last one applied."""
    current = digest(store, tp)
    last = store.checkpointed_lineage(tp)
    if last == current or (last is None and current == _EMPTY_DIGEST):
        return None
    epochs = tuple(sorted(store.lineages_of(tp), key=lambda lin: lin.epoch))
    return EpochCheckpoint(tp, epochs, event_timestamp_ms, broker_id, store.lineage_position(tp))
