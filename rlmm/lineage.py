"""Kafka's per-leader-epoch lineage (RemoteLogLeaderEpochState) over a state store, and its checkpoints.

Per user partition and leader epoch: the offset index of COPY_SEGMENT_FINISHED segments, the finished segments a
newer upload displaced (listed in the epoch), the finished segments whose entry a later upload from the same start
took (overwritten: left out of the epoch's listing, as Kafka's RemoteLogLeaderEpochState then references them
nowhere), and the highest log offset. These facts depend on the order of the segment records, so a
writer appends a checkpoint of each epoch an event changed, under that epoch's `epochs:<tp>:<epoch>` key; a
compacted log, which may have lost the records that produced a fact, replays to the same lineage through each
epoch's newest checkpoint. The store remembers which epochs changed since their newest checkpoint (they owe one),
so a checkpoint costs the epochs it changes, whatever the number of epochs the partition ever had.

A checkpoint is stamped with the metadata offset of the newest lineage-changing record its writer had applied
(`reflects_offset`). A store remembers the offset of the newest lineage-changing record it applied itself
(`lineage_position`). A checkpoint that reflects less than the store has seen was computed before some record
the store already applied: it may only add what never goes back (highest offsets), never undo a displacement or
restore a displaced segment. Only a checkpoint that saw everything the store has seen replaces its epochs.

Releases before per-epoch keys wrote whole-partition checkpoints (every epoch, under `epochs:<tp>`); they are
applied as they always were, so a topic holding both replays like one the current writer wrote.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Iterable, Iterator
from typing import Protocol

from rlmm import view_format
from rlmm.events import EpochCheckpoint, EpochLineage, RecordKey, epoch_key, key_of
from rlmm.types import RemoteLogSegmentId, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition


class LineageReader(Protocol):
    """What the lineage rules read from a store; one user partition per call."""

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None: ...
    def lineage(self, tp: TopicIdPartition, epoch: int) -> EpochLineage | None: ...
    def lineages_of(self, tp: TopicIdPartition) -> Iterator[EpochLineage]: ...
    def checkpointed_lineage(self, tp: TopicIdPartition) -> bytes | None:
        """Which epochs owe a checkpoint, as view_format encodes it (`PartitionMeta.checkpointed`)."""
        ...
    def lineage_position(self, tp: TopicIdPartition) -> int | None: ...
    def index_get(self, tp: TopicIdPartition, epoch: int, start_offset: int) -> uuid.UUID | None: ...
    def index_floor(self, tp: TopicIdPartition, epoch: int, offset: int) -> tuple[int, uuid.UUID] | None: ...


class LineageStore(LineageReader, Protocol):
    """A LineageReader the rules can also change."""

    def put_lineage(self, tp: TopicIdPartition, lineage: EpochLineage) -> None: ...
    def remove_lineage(self, tp: TopicIdPartition, epoch: int) -> None: ...
    def set_checkpointed_lineage(self, tp: TopicIdPartition, owed: bytes | None) -> None: ...
    def set_lineage_position(self, tp: TopicIdPartition, offset: int) -> None: ...
    def index_put(self, tp: TopicIdPartition, epoch: int, start_offset: int, segment: uuid.UUID) -> None: ...
    def index_remove(self, tp: TopicIdPartition, epoch: int, start_offset: int) -> None: ...


_LAST = 2**63 - 1


def reference_finished(store: LineageStore, md: RemoteLogSegmentMetadata, offset: int | None) -> None:
    """Kafka's rule for a COPY_SEGMENT_FINISHED segment, in each of its leader epochs."""
    tp = md.topic_id_partition
    segment = md.remote_log_segment_id.id
    _upgrade_bookkeeping(store, tp)
    changed = []
    for epoch, start in md.segment_leader_epochs.items():
        end = md.epoch_end_offset(epoch)
        current = store.lineage(tp, epoch)
        highest = current.highest_log_offset if current else None
        displaced = set(current.displaced_segment_ids) if current else set()
        overwritten = set(current.overwritten_segment_ids) if current else set()
        # A newer upload covering the same or a larger range (after a leader change) replaces older segments.
        while (last := store.index_floor(tp, epoch, _LAST)) is not None and last[0] >= start and (
            highest is None or highest <= end
        ):
            store.index_remove(tp, epoch, last[0])
            displaced.add(last[1])
        # An entry the loop left (the epoch goes on past this segment's end) is taken over, as Kafka's offsetToId.put
        # does: its segment is no longer referenced in this epoch, and not displaced either.
        previous = store.index_get(tp, epoch, start)
        store.index_put(tp, epoch, start, segment)
        if previous is not None and previous != segment:
            overwritten.add(previous)
        displaced.discard(segment)
        overwritten.discard(segment)
        highest = end if highest is None else max(highest, end)
        lineage = EpochLineage.derived(epoch, highest, frozenset(displaced), frozenset(overwritten))
        if lineage != current:
            store.put_lineage(tp, lineage)
            changed.append(epoch)
    _advance(store, tp, offset, changed)


def unreference(store: LineageStore, md: RemoteLogSegmentMetadata, offset: int | None) -> None:
    """Remove a segment from every epoch's offset index and displaced and overwritten sets; highest offsets stay."""
    tp = md.topic_id_partition
    segment = md.remote_log_segment_id.id
    _upgrade_bookkeeping(store, tp)
    changed = []
    for epoch, start in md.segment_leader_epochs.items():
        if store.index_get(tp, epoch, start) == segment:
            store.index_remove(tp, epoch, start)
        lineage = store.lineage(tp, epoch)
        if lineage is not None and (segment in lineage.displaced_segment_ids
                                    or segment in lineage.overwritten_segment_ids):
            _put_or_drop(store, tp, EpochLineage.derived(
                epoch, lineage.highest_log_offset, lineage.displaced_segment_ids - {segment},
                lineage.overwritten_segment_ids - {segment}))
            changed.append(epoch)
    _advance(store, tp, offset, changed)


def forget(store: LineageStore, tp: TopicIdPartition) -> None:
    """Drop every epoch of the partition (its whole-partition `epochs:` key was tombstoned)."""
    for lineage in list(store.lineages_of(tp)):
        store.remove_lineage(tp, lineage.epoch)
    store.set_checkpointed_lineage(tp, None)


def forget_epoch(store: LineageStore, tp: TopicIdPartition, epoch: int) -> None:
    """Drop one epoch of the partition (its `epochs:` key was tombstoned, after the partition was deleted)."""
    _upgrade_bookkeeping(store, tp)
    store.remove_lineage(tp, epoch)
    _settle(store, tp, (epoch,), owed=False)


def _advance(store: LineageStore, tp: TopicIdPartition, offset: int | None, changed: list[int]) -> None:
    # Without a record offset (a replay that does not know positions) staleness cannot be judged.
    if offset is not None:
        store.set_lineage_position(tp, offset)
    if changed:
        _settle(store, tp, changed, owed=True)


def _put_or_drop(store: LineageStore, tp: TopicIdPartition, lineage: EpochLineage) -> None:
    if _kept(lineage):
        store.put_lineage(tp, lineage)
    else:
        store.remove_lineage(tp, lineage.epoch)


def _kept(lineage: EpochLineage) -> bool:
    """Whether an epoch's lineage says anything (an empty one is not stored)."""
    return lineage.highest_log_offset is not None or bool(lineage.displaced_segment_ids) or bool(
        lineage.overwritten_segment_ids)


# --- which epochs owe a checkpoint (the store's `checkpointed_lineage` bookkeeping, see view_format) ---------

def owed_epochs(store: LineageReader, tp: TopicIdPartition) -> frozenset[int]:
    """The epochs whose lineage may differ from what their newest checkpoint on the topic says."""
    raw = store.checkpointed_lineage(tp)
    if raw is None:
        return frozenset()
    owed = view_format.decode_owed(raw)
    if owed is not None:
        return owed
    # Bookkeeping from before per-epoch keys (or after a stale whole-partition checkpoint): it vouches for all
    # epochs or none, so this once costs every epoch; the next lineage change stores the per-epoch form.
    lineages = list(store.lineages_of(tp))
    if view_format.is_legacy_digest(raw) and raw == _legacy_digest(lineages):
        return frozenset()
    return frozenset(lineage.epoch for lineage in lineages)


def _upgrade_bookkeeping(store: LineageStore, tp: TopicIdPartition) -> None:
    """Bookkeeping of the all-or-none form vouches for the lineage as it is: read it as owed epochs before a change."""
    raw = store.checkpointed_lineage(tp)
    if raw is not None and view_format.decode_owed(raw) is None:
        store.set_checkpointed_lineage(tp, view_format.encode_owed(owed_epochs(store, tp)))


def _settle(store: LineageStore, tp: TopicIdPartition, epochs: Iterable[int], owed: bool) -> None:
    """Note that `epochs` owe a checkpoint (or no longer do); the bookkeeping is of the per-epoch form already."""
    current = owed_epochs(store, tp)
    updated = current | set(epochs) if owed else current - set(epochs)
    if updated != current:
        store.set_checkpointed_lineage(tp, view_format.encode_owed(updated))


def _legacy_digest(lineages: list[EpochLineage]) -> bytes:
    """What views before per-epoch keys stored for a checkpointed lineage: sha256 over its epochs in epoch order."""
    ordered = sorted(lineages, key=lambda lin: lin.epoch)
    return hashlib.sha256(b"".join(map(view_format.encode_lineage, ordered))).digest()


# --- checkpoints --------------------------------------------------------------------------------------

def is_stale(store: LineageReader, checkpoint: EpochCheckpoint) -> bool:
    """Whether the store applied a lineage-changing record its checkpoint's writer had not seen."""
    seen = store.lineage_position(checkpoint.topic_id_partition)
    return seen is not None and checkpoint.reflects_offset is not None and checkpoint.reflects_offset < seen


def apply_checkpoint(store: LineageStore, checkpoint: EpochCheckpoint) -> bool:
    """Fold a checkpoint: authoritative when it saw all the store saw, else only its highest offsets count.

    Returns whether it was stale. Costs the epochs it names (a whole-partition one: every epoch of the partition);
    an epoch it states as the store holds it costs a comparison only."""
    tp = checkpoint.topic_id_partition
    stale = is_stale(store, checkpoint)
    wanted = {lineage.epoch: lineage for lineage in checkpoint.epochs}
    if not checkpoint.whole_partition:
        _upgrade_bookkeeping(store, tp)
        for epoch, lineage in wanted.items():
            _fold(store, tp, store.lineage(tp, epoch), lineage, stale)
        # After a stale one the epoch's newest checkpoint no longer describes it: its writer appends a current one
        # as soon as it applies it (rlmm.writer), and failing that the partition's next write does (see
        # `pending_checkpoint`), so a compacted rebuild finds it.
        _settle(store, tp, wanted, owed=stale)
        return stale
    current = {lineage.epoch: lineage for lineage in store.lineages_of(tp)}
    for epoch in sorted(wanted.keys() | current.keys()):
        _fold(store, tp, current.get(epoch), wanted.get(epoch), stale)
    # A whole-partition checkpoint described every epoch: all are described now, or (stale) all may owe one.
    store.set_checkpointed_lineage(tp, view_format.ALL_OWED if stale else None)
    return stale


def _fold(store: LineageStore, tp: TopicIdPartition, old: EpochLineage | None, new: EpochLineage | None,
          stale: bool) -> None:
    """One epoch of a checkpoint (`new` None: a whole-partition checkpoint without the epoch) over the store's."""
    if old is not None and old == new:
        return
    epoch = (old or new).epoch  # type: ignore[union-attr]
    old = old or EpochLineage(epoch, None)
    new = new or EpochLineage(epoch, None)
    # A highest offset never goes down, even under a checkpoint another writer computed before it.
    highest = max((h for h in (old.highest_log_offset, new.highest_log_offset) if h is not None), default=None)
    new = old if stale else new
    new = EpochLineage.derived(epoch, highest, new.displaced_segment_ids, new.overwritten_segment_ids)
    if old == new:
        return
    # Removals first: a segment the checkpoint no longer references frees its entry, which a segment it references
    # again may then take.
    unreferenced_before = old.displaced_segment_ids | old.overwritten_segment_ids
    unreferenced_now = new.displaced_segment_ids | new.overwritten_segment_ids
    for segment_id in sorted(unreferenced_now - unreferenced_before):
        start = _start_in(store, tp, segment_id, epoch)
        if start is not None and store.index_get(tp, epoch, start) == segment_id:
            store.index_remove(tp, epoch, start)
    for segment_id in sorted(unreferenced_before - unreferenced_now):
        start = _start_in(store, tp, segment_id, epoch, finished=True)
        # Only into a free entry: one the checkpoint leaves to a segment it does not call displaced or overwritten
        # means that this store holds one of the two in an older state than the writer saw (a compacted replay
        # applies a segment's newest record only, later), and that record unreferences it when it comes; a segment
        # put over the other would take the entry with it.
        if start is not None and store.index_get(tp, epoch, start) is None:
            store.index_put(tp, epoch, start, segment_id)
    _put_or_drop(store, tp, new)


def _start_in(store: LineageStore, tp: TopicIdPartition, segment_id: uuid.UUID, epoch: int,
              finished: bool = False) -> int | None:
    """The start offset in `epoch` of a segment the store holds (COPY_SEGMENT_FINISHED, when `finished`)."""
    md = store.segment(RemoteLogSegmentId(tp, segment_id))
    if md is None or epoch not in md.segment_leader_epochs or (
            finished and md.state is not RemoteLogSegmentState.COPY_SEGMENT_FINISHED):
        return None
    return md.segment_leader_epochs[epoch]


def pending_checkpoint(
    store: LineageReader, tp: TopicIdPartition, event_timestamp_ms: int, broker_id: int,
    whole_partition: bool = False,
) -> EpochCheckpoint | None:
    """The checkpoint of the epochs of tp that owe one (changed since their newest checkpoint), for a writer to
    append as `checkpoint_records`; None when none owes one. `whole_partition`: every epoch of the partition, as
    releases before per-epoch checkpoints wrote and read them (for a rolling upgrade from one)."""
    owed = owed_epochs(store, tp)
    if not owed:
        return None
    if whole_partition:
        return EpochCheckpoint(tp, tuple(store.lineages_of(tp)), event_timestamp_ms, broker_id,
                               store.lineage_position(tp), whole_partition=True)
    epochs = tuple(store.lineage(tp, epoch) or EpochLineage(epoch, None) for epoch in sorted(owed))
    return EpochCheckpoint(tp, epochs, event_timestamp_ms, broker_id, store.lineage_position(tp),
                           whole_partition=False)


def checkpoint_records(checkpoint: EpochCheckpoint | None) -> list[tuple[RecordKey, EpochCheckpoint]]:
    """The records that append `checkpoint`: one per epoch, each under its epoch's key."""
    if checkpoint is None:
        return []
    if checkpoint.whole_partition:
        return [(key_of(checkpoint), checkpoint)]
    return [(epoch_key(checkpoint.topic_id_partition, lineage.epoch),
             dataclasses.replace(checkpoint, epochs=(lineage,))) for lineage in checkpoint.epochs]
