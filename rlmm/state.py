"""The metadata state machine of KAFKA_SEMANTICS.md as pure rules over a small store interface (no I/O).

`apply_record` folds one metadata record into a store; the in-memory store here and the RocksDB view implement
the same `StateStore` protocol, so both replay a log to the same state and the same digest.

Compaction invariance: every segment record carries the segment's full state, and the epoch lineage that
Kafka derives order-dependently (rlmm.lineage) is kept in per-epoch `epochs:` checkpoints, so a replay of only the
newest record per key reaches the same view as a replay of every record.
"""

from __future__ import annotations

import bisect
import dataclasses
import hashlib
import itertools
import logging
import operator
import struct
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

from rlmm import lineage, view_format
from rlmm.errors import InvalidArgumentError, RemoteResourceNotFoundError
from rlmm.events import (
    EpochCheckpoint,
    EpochLineage,
    MetadataEvent,
    RecordKey,
    epoch_key,
    epochs_key,
    key_of,
    segment_key,
)
from rlmm.lineage import LineageReader, LineageStore, checkpoint_records, pending_checkpoint
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

log = logging.getLogger(__name__)

S = RemoteLogSegmentState
P = RemotePartitionDeleteState

_SEGMENT_TRANSITIONS: dict[RemoteLogSegmentState, frozenset[RemoteLogSegmentState]] = {
    S.COPY_SEGMENT_STARTED: frozenset({S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED}),
    S.COPY_SEGMENT_FINISHED: frozenset({S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED}),
    S.DELETE_SEGMENT_STARTED: frozenset({S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED}),
    S.DELETE_SEGMENT_FINISHED: frozenset({S.DELETE_SEGMENT_FINISHED}),
}

_PARTITION_TRANSITIONS: dict[RemotePartitionDeleteState | None, frozenset[RemotePartitionDeleteState]] = {
    None: frozenset({P.DELETE_PARTITION_MARKED}),
    P.DELETE_PARTITION_MARKED: frozenset({P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED}),
    P.DELETE_PARTITION_STARTED: frozenset({P.DELETE_PARTITION_STARTED, P.DELETE_PARTITION_FINISHED}),
    P.DELETE_PARTITION_FINISHED: frozenset({P.DELETE_PARTITION_FINISHED}),
}


def _reachable(transitions: dict[Any, frozenset[Any]]) -> dict[Any, frozenset[Any]]:
    """Every state reachable from each state through any number of valid transitions."""
    reach = dict(transitions)
    while True:
        wider = {state: frozenset().union(targets, *(reach[t] for t in targets)) for state, targets in reach.items()}
        if wider == reach:
            return reach
        reach = wider


# Where a record may move a state when the reader skipped older records of its key. A backlog window replays only
# the newest record of each key, and Kafka's log cleaner keeps only the newest in what it cleaned (a node away longer
# than min.compaction.lag.ms reads that): a segment's DELETE_SEGMENT_FINISHED without the DELETE_SEGMENT_STARTED
# before it, or a partition's DELETE_PARTITION_FINISHED without its STARTED, over a state applied before. A full
# replay applied the skipped STARTED first, then the FINISHED (a writer writes FINISHED only against a view in
# STARTED, and from STARTED no record moves the state back), so the window applies the jump. A jump with nothing
# skipped before it (a foreign producer's record) is dropped, as Kafka's cache drops it.
_SEGMENT_REPLAY = _reachable(_SEGMENT_TRANSITIONS)
_PARTITION_REPLAY = _reachable({state: targets for state, targets in _PARTITION_TRANSITIONS.items()
                                if state is not None})


def is_valid_segment_transition(current: RemoteLogSegmentState, target: RemoteLogSegmentState) -> bool:
    return target in _SEGMENT_TRANSITIONS[current]


def is_valid_partition_transition(
    current: RemotePartitionDeleteState | None, target: RemotePartitionDeleteState
) -> bool:
    return target in _PARTITION_TRANSITIONS[current]


@dataclass(frozen=True, slots=True)
class Outcome:
    """Whether a record changed the state; `reason` says why one was dropped.

    `stale` marks a checkpoint computed before a record already applied (rlmm.lineage.is_stale): applied for its
    highest offsets only, so the newest `epochs:` record no longer describes the lineage until its writer
    appends a current one.
    """

    applied: bool
    reason: str | None = None
    stale: bool = False

    @classmethod
    def dropped(cls, reason: str) -> Outcome:
        return cls(False, reason)


APPLIED = Outcome(True)
STALE = Outcome(True, stale=True)


class StateReader(LineageReader, Protocol):
    """What queries and writers read from materialized metadata; one user partition per call."""

    def segments_of(self, tp: TopicIdPartition) -> Iterator[RemoteLogSegmentMetadata]: ...
    def partition_delete(self, tp: TopicIdPartition) -> RemotePartitionDeleteMetadata | None: ...
    def known_partition(self, topic_id: uuid.UUID, partition: int) -> TopicIdPartition | None: ...
    def floor_segment(self, tp: TopicIdPartition, epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
        """The segment the epoch's offset index maps its greatest start <= offset to (one read, for lookups)."""
        ...


class StateStore(StateReader, LineageStore, Protocol):
    """A StateReader the rules can also change."""

    def put_segment(self, metadata: RemoteLogSegmentMetadata) -> None: ...
    def remove_segment(self, segment_id: RemoteLogSegmentId) -> None: ...
    def put_partition_delete(self, metadata: RemotePartitionDeleteMetadata) -> None: ...
    def forget_partition(self, tp: TopicIdPartition) -> None: ...


# --- applying records ---------------------------------------------------------------------------------

def apply_record(
    store: StateStore, key: RecordKey, event: MetadataEvent | None, offset: int | None = None,
    skipped_before: bool | None = None,
) -> Outcome:
    """Fold one metadata record (None = tombstone) into `store`; invalid records are dropped, not raised.

    `offset` is the record's offset in its metadata partition; without it a checkpoint cannot be recognised as
    older than a record already applied (rlmm.lineage), so every reader of the topic passes it. `skipped_before`
    says whether older records of the same key may be missing before it: True when they may (a backlog window
    replays only the newest of each; Kafka's log cleaner removed superseded ones from a log read past a gap in its
    offsets), False when the store applied every record before it (Kafka's rules hold as they are), None when the
    reader cannot tell (a topic read without following its offsets, perhaps compacted): then a segment's update
    for a segment the store does not hold stands for its add, which compaction may have removed.
    """
    if event is None:
        return _apply_tombstone(store, key)
    if type(event) is RemoteLogSegmentMetadata and is_segment_key_of(key, event):
        return _apply_segment(store, event, offset, skipped_before)
    try:
        expected = key_of(event)
    except InvalidArgumentError as exc:
        return Outcome.dropped(f"record key {key.encode()!r}: {exc}")
    if expected != key:
        return Outcome.dropped(f"record key {key.encode()!r} does not match its event {expected.encode()!r}")
    if isinstance(event, RemoteLogSegmentMetadata):
        return _apply_segment(store, event, offset, skipped_before)
    if isinstance(event, RemotePartitionDeleteMetadata):
        return _apply_partition_delete(store, event, skipped_before)
    return _apply_checkpoint(store, event)


def is_segment_key_of(key: RecordKey, md: RemoteLogSegmentMetadata) -> bool:
    """Whether `key` is the segment's own record key: key_of's check field by field, without building the expected
    key (a rebuild checks a record per segment)."""
    segment_id = md.remote_log_segment_id
    tp = segment_id.topic_id_partition
    return key.kind == "segment" and key.segment_id == segment_id.id and key.topic_id == tp.topic_id and \
        key.partition == tp.partition and key.epoch is None


def _apply_tombstone(store: StateStore, key: RecordKey) -> Outcome:
    if key.kind == "segment":
        assert key.segment_id is not None
        for candidate in _partitions_with(store, key):
            existing = store.segment(RemoteLogSegmentId(candidate, key.segment_id))
            if existing is not None:
                # Only a reader that skipped the segment's DELETE_SEGMENT_FINISHED still holds it (its writer appends
                # the tombstone once its view applied that record), so this does what that record did where a full
                # replay applied it, earlier: the lineage position stays where the records this reader applied
                # left it, as in a full replay, where a segment tombstone never moves it.
                lineage.unreference(store, existing, None)
                store.remove_segment(existing.remote_log_segment_id)
        return APPLIED
    for tp in _partitions_with(store, key):
        if key.kind == "partition-delete":
            store.forget_partition(tp)
        elif key.epoch is not None:
            lineage.forget_epoch(store, tp, key.epoch)
        else:
            lineage.forget(store, tp)
    return APPLIED


def _partitions_with(store: StateStore, key: RecordKey) -> Iterable[TopicIdPartition]:
    # A tombstone carries no topic name; the store knows the partition under the name it was created with.
    tp = store.known_partition(key.topic_id, key.partition)
    return () if tp is None else (tp,)


def _apply_segment(
    store: StateStore, incoming: RemoteLogSegmentMetadata, offset: int | None, skipped_before: bool | None
) -> Outcome:
    if is_deleted(store, incoming.topic_id_partition):
        return Outcome.dropped(f"segment {incoming.remote_log_segment_id}: its partition's remote data was deleted")
    existing = store.segment(incoming.remote_log_segment_id)
    target = incoming.state
    if existing is None and skipped_before is False and target in _UPDATES_THAT_HOLD:
        # Kafka's cache ignores an update for a segment it does not hold (RemoteResourceNotFound, logged and
        # skipped): one never added, or one deleted already, whose late update another broker's lagging view
        # allowed. Applied, it would bring a deleted segment back.
        return Outcome.dropped(
            f"segment {incoming.remote_log_segment_id}: no such segment (never added, or deleted already), so its "
            f"{target.name} update is ignored"
        )
    if existing is not None and skipped_before and existing.state is S.COPY_SEGMENT_STARTED and \
            target is not S.COPY_SEGMENT_STARTED and _immutable(existing) != _immutable(incoming):
        # Only a re-add (COPY_SEGMENT_STARTED again, with other offsets or epochs) among the skipped records makes
        # this update follow the segment held: replay that re-add first.
        lineage.unreference(store, existing, offset)
        existing = dataclasses.replace(incoming, state=S.COPY_SEGMENT_STARTED)
        store.put_segment(existing)
    if existing is not None:
        if target not in (_SEGMENT_REPLAY if skipped_before else _SEGMENT_TRANSITIONS)[existing.state]:
            return Outcome.dropped(
                f"segment {incoming.remote_log_segment_id}: invalid transition {existing.state.name} -> {target.name}"
            )
        if target is not S.COPY_SEGMENT_STARTED and _immutable(existing) != _immutable(incoming):
            return Outcome.dropped(
                f"segment {incoming.remote_log_segment_id}: an update may not change offsets, size or epochs"
            )
    # Otherwise a record for a segment this store does not hold is applied as the full state it carries: compaction
    # may have removed the records that created it.
    if existing is not None and target is S.COPY_SEGMENT_STARTED:
        lineage.unreference(store, existing, offset)  # a re-add may carry other epochs
    if target is S.COPY_SEGMENT_FINISHED:
        store.put_segment(incoming)
        lineage.reference_finished(store, incoming, offset)
    elif target is S.DELETE_SEGMENT_FINISHED:
        if existing is not None:
            lineage.unreference(store, existing, offset)
            store.remove_segment(incoming.remote_log_segment_id)
    else:
        if target is S.DELETE_SEGMENT_STARTED:
            lineage.unreference(store, existing or incoming, offset)
        store.put_segment(incoming)
    return APPLIED


# The updates that leave a segment held (listed, or served): over nothing, only an add may do that in Kafka's cache.
# A DELETE_SEGMENT_FINISHED for a segment not held changes nothing either way.
_UPDATES_THAT_HOLD = frozenset({S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED})


def _immutable(md: RemoteLogSegmentMetadata) -> tuple[object, ...]:
    return (md.start_offset, md.end_offset, md.max_timestamp_ms, md.segment_size_in_bytes,
            tuple(md.segment_leader_epochs.items()), md.txn_idx_empty)


def _apply_partition_delete(
    store: StateStore, incoming: RemotePartitionDeleteMetadata, skipped_before: bool | None
) -> Outcome:
    tp = incoming.topic_id_partition
    existing = store.partition_delete(tp)
    # As for segments, a state this store never saw the start of is applied as the full state it carries.
    if existing is not None and \
            incoming.state not in (_PARTITION_REPLAY if skipped_before else _PARTITION_TRANSITIONS)[existing.state]:
        return Outcome.dropped(
            f"partition {tp}: invalid delete transition {existing.state.name} -> {incoming.state.name}"
        )
    if incoming.state is P.DELETE_PARTITION_FINISHED:
        # Everything of the partition goes; its FINISHED record stays, so later writes are refused everywhere.
        store.forget_partition(tp)
    store.put_partition_delete(incoming)
    return APPLIED


def is_deleted(store: StateReader, tp: TopicIdPartition) -> bool:
    """Whether the partition's remote data was deleted (DELETE_PARTITION_FINISHED applied)."""
    return delete_finished(store.partition_delete(tp))


def delete_finished(delete: RemotePartitionDeleteMetadata | None) -> bool:
    return delete is not None and delete.state is P.DELETE_PARTITION_FINISHED


def _apply_checkpoint(store: StateStore, checkpoint: EpochCheckpoint) -> Outcome:
    tp = checkpoint.topic_id_partition
    if is_deleted(store, tp):
        return Outcome.dropped(f"epoch checkpoint for {tp}: the partition's remote data was deleted")
    return STALE if lineage.apply_checkpoint(store, checkpoint) else APPLIED


# --- queries (Kafka's RemoteLogMetadataCache read paths) -----------------------------------------------
# One place per rule: the stores answer through these functions, and the read model's lookup snapshots
# (rlmm.read_model) precompute their answers with the same helpers.

def segment_for_offset(
    store: StateReader, tp: TopicIdPartition, epoch: int, offset: int
) -> RemoteLogSegmentMetadata | None:
    md = store.floor_segment(tp, epoch, offset)
    end = None if md is None else lookup_end(md, epoch)
    return md if end is not None and offset <= end else None


def lookup_end(md: RemoteLogSegmentMetadata, epoch: int) -> int | None:
    """The last offset a lookup in `epoch` answers with `md` (the floor entry of its index), or None when it
    answers nothing: Kafka returns only COPY_SEGMENT_FINISHED segments, and only within the epoch's range."""
    return md.epoch_end_offset(epoch) if md.state is S.COPY_SEGMENT_FINISHED else None


def floor_segment_of(
    store: StateReader, tp: TopicIdPartition, epoch: int, offset: int
) -> RemoteLogSegmentMetadata | None:
    """`floor_segment` from a store's offset index and segments, for stores with no faster way."""
    entry = store.index_floor(tp, epoch, offset)
    return None if entry is None else store.segment(RemoteLogSegmentId(tp, entry[1]))


def next_segment_with_txn_index(
    store: StateReader, tp: TopicIdPartition, epoch: int, offset: int
) -> RemoteLogSegmentMetadata | None:
    return next_with_txn_index(lambda at: segment_for_offset(store, tp, epoch, at), offset)


def next_with_txn_index(
    segment_at: Callable[[int], RemoteLogSegmentMetadata | None], offset: int
) -> RemoteLogSegmentMetadata | None:
    """Kafka's walk: the segment for `offset`, then forward in the epoch past segments with no transactions."""
    md = segment_at(offset)
    while md is not None and md.txn_idx_empty:
        md = segment_at(md.end_offset + 1)
    return md


def highest_offset_for_epoch(store: StateReader, tp: TopicIdPartition, epoch: int) -> int | None:
    lineage = store.lineage(tp, epoch)
    return lineage.highest_log_offset if lineage else None


_LISTED = (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED)


def is_listed(md: RemoteLogSegmentMetadata) -> bool:
    """Whether listings show the segment: every state but DELETE_SEGMENT_FINISHED."""
    return md.state in _LISTED


def listing_order(md: RemoteLogSegmentMetadata) -> tuple[int, int, bytes]:
    """Listings go by start offset, as Kafka's; ties by end offset, then segment id bytes."""
    return md.start_offset, md.end_offset, md.remote_log_segment_id.id.bytes


def is_listed_in(md: RemoteLogSegmentMetadata, epoch_lineage: EpochLineage | None) -> bool:
    """Whether the listing of the epoch whose lineage is `epoch_lineage` shows md, a segment with that epoch: a listed
    segment, unless a later upload overwrote its entry in the epoch while it is COPY_SEGMENT_FINISHED (Kafka's
    RemoteLogLeaderEpochState then holds it neither in offsetToId nor in the unreferenced ids)."""
    return md.state in _LISTED and not (
        epoch_lineage is not None and md.state is S.COPY_SEGMENT_FINISHED
        and md.remote_log_segment_id.id in epoch_lineage.overwritten_segment_ids)


def list_segments(
    store: StateReader, tp: TopicIdPartition, epoch: int | None = None
) -> list[RemoteLogSegmentMetadata]:
    """Segments not finished deleting, by start offset then id; with `epoch`, those with the epoch its listing
    shows (is_listed_in)."""
    if epoch is None:
        found = [md for md in store.segments_of(tp) if is_listed(md)]
    else:
        lineage_of_epoch = store.lineage(tp, epoch)
        found = [md for md in store.segments_of(tp)
                 if epoch in md.segment_leader_epochs and is_listed_in(md, lineage_of_epoch)]
    found.sort(key=listing_order)
    return found


def remote_log_size(store: StateReader, tp: TopicIdPartition, epoch: int) -> int:
    return sum(md.segment_size_in_bytes for md in list_segments(store, tp, epoch))


# --- the in-memory store ---------------------------------------------------------------------------------

@dataclass
class _PartitionState:
    tp: TopicIdPartition
    segments: dict[uuid.UUID, RemoteLogSegmentMetadata] = field(default_factory=dict)
    delete: RemotePartitionDeleteMetadata | None = None
    lineages: dict[int, EpochLineage] = field(default_factory=dict)
    checkpointed: bytes | None = None
    lineage_position: int | None = None
    index: dict[int, tuple[list[int], dict[int, uuid.UUID]]] = field(default_factory=dict)

    def empty(self) -> bool:
        return not (self.segments or self.delete or self.lineages or self.index or self.checkpointed
                    or self.lineage_position is not None)


class InMemoryState:
    """A StateStore in plain dicts: the reference for the RocksDB view and the fold the pipeline uses."""

    def __init__(self) -> None:
        self._partitions: dict[tuple[uuid.UUID, int], _PartitionState] = {}
        # The partition last asked for, by the identity of the object naming it: a record's rules ask a dozen times
        # for the same one, and hashing its key (a UUID's hash is Python code) costs more than the rules' own work.
        self._last_tp: TopicIdPartition | None = None
        self._last: _PartitionState | None = None

    def _get(self, tp: TopicIdPartition) -> _PartitionState:
        if tp is self._last_tp and self._last is not None:
            return self._last
        key = (tp.topic_id, tp.partition)
        state = self._partitions.get(key)
        if state is None:
            state = self._partitions[key] = _PartitionState(tp)
        self._last_tp, self._last = tp, state
        return state

    def _peek(self, tp: TopicIdPartition) -> _PartitionState | None:
        if tp is not self._last_tp:
            self._last_tp, self._last = tp, self._partitions.get((tp.topic_id, tp.partition))
        return self._last

    def _drop(self, tp: TopicIdPartition) -> None:
        self._partitions.pop((tp.topic_id, tp.partition), None)
        self._last_tp = self._last = None

    def _tidy(self, tp: TopicIdPartition) -> None:
        state = self._peek(tp)
        if state is not None and state.empty():
            self._drop(tp)

    def known_partition(self, topic_id: uuid.UUID, partition: int) -> TopicIdPartition | None:
        state = self._partitions.get((topic_id, partition))
        return state.tp if state else None

    def user_partitions(self) -> list[TopicIdPartition]:
        return [state.tp for state in self._partitions.values()]

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        state = self._peek(segment_id.topic_id_partition)
        return state.segments.get(segment_id.id) if state else None

    def put_segment(self, metadata: RemoteLogSegmentMetadata) -> None:
        self._get(metadata.topic_id_partition).segments[metadata.remote_log_segment_id.id] = metadata

    def remove_segment(self, segment_id: RemoteLogSegmentId) -> None:
        state = self._peek(segment_id.topic_id_partition)
        if state is not None:
            state.segments.pop(segment_id.id, None)
            self._tidy(segment_id.topic_id_partition)

    def segments_of(self, tp: TopicIdPartition) -> Iterator[RemoteLogSegmentMetadata]:
        state = self._peek(tp)
        return iter(list(state.segments.values()) if state else [])

    def partition_delete(self, tp: TopicIdPartition) -> RemotePartitionDeleteMetadata | None:
        state = self._peek(tp)
        return state.delete if state else None

    def put_partition_delete(self, metadata: RemotePartitionDeleteMetadata) -> None:
        self._get(metadata.topic_id_partition).delete = metadata

    def lineage(self, tp: TopicIdPartition, epoch: int) -> EpochLineage | None:
        state = self._peek(tp)
        return state.lineages.get(epoch) if state else None

    def lineages_of(self, tp: TopicIdPartition) -> Iterator[EpochLineage]:
        state = self._peek(tp)
        return iter(sorted(state.lineages.values(), key=lambda lin: lin.epoch) if state else [])

    def put_lineage(self, tp: TopicIdPartition, lineage: EpochLineage) -> None:
        self._get(tp).lineages[lineage.epoch] = lineage

    def remove_lineage(self, tp: TopicIdPartition, epoch: int) -> None:
        state = self._peek(tp)
        if state is not None:
            state.lineages.pop(epoch, None)
            self._tidy(tp)

    def checkpointed_lineage(self, tp: TopicIdPartition) -> bytes | None:
        state = self._peek(tp)
        return state.checkpointed if state else None

    def set_checkpointed_lineage(self, tp: TopicIdPartition, owed: bytes | None) -> None:
        if owed is None:
            state = self._peek(tp)
            if state is not None:
                state.checkpointed = None
                self._tidy(tp)
        else:
            self._get(tp).checkpointed = owed

    def lineage_position(self, tp: TopicIdPartition) -> int | None:
        state = self._peek(tp)
        return state.lineage_position if state else None

    def set_lineage_position(self, tp: TopicIdPartition, offset: int) -> None:
        self._get(tp).lineage_position = offset

    def index_get(self, tp: TopicIdPartition, epoch: int, start_offset: int) -> uuid.UUID | None:
        state = self._peek(tp)
        entry = state.index.get(epoch) if state else None
        return entry[1].get(start_offset) if entry else None

    def index_floor(self, tp: TopicIdPartition, epoch: int, offset: int) -> tuple[int, uuid.UUID] | None:
        state = self._peek(tp)
        entry = state.index.get(epoch) if state else None
        if not entry:
            return None
        starts, ids = entry
        position = bisect.bisect_right(starts, offset)
        if position == 0:
            return None
        start = starts[position - 1]
        return start, ids[start]

    def floor_segment(self, tp: TopicIdPartition, epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
        return floor_segment_of(self, tp, epoch, offset)

    def index_put(self, tp: TopicIdPartition, epoch: int, start_offset: int, segment: uuid.UUID) -> None:
        starts, ids = self._get(tp).index.setdefault(epoch, ([], {}))
        if start_offset not in ids:
            bisect.insort(starts, start_offset)
        ids[start_offset] = segment

    def index_remove(self, tp: TopicIdPartition, epoch: int, start_offset: int) -> None:
        state = self._peek(tp)
        entry = state.index.get(epoch) if state else None
        if state is None or not entry or start_offset not in entry[1]:
            return
        starts, ids = entry
        del ids[start_offset]
        starts.pop(bisect.bisect_left(starts, start_offset))
        if not ids:
            del state.index[epoch]
        self._tidy(tp)

    def forget_partition(self, tp: TopicIdPartition) -> None:
        self._drop(tp)

    def digest(self) -> str:
        return view_digest_of(self.entries())

    def entries(self) -> Iterator[tuple[str, bytes, bytes]]:
        """The content as (column family, key, value), exactly as the RocksDB view would store it."""
        vf = view_format
        for state in self._partitions.values():
            tp = state.tp
            for md in state.segments.values():
                yield vf.SEGMENTS, vf.segment_key(md.remote_log_segment_id), vf.encode_segment(md)
            if state.delete is not None:
                yield vf.PARTITIONS, vf.partition_key(tp), vf.encode_partition_delete(state.delete)
            for epoch_lineage in state.lineages.values():
                yield vf.EPOCH_STATE, vf.lineage_key(tp, epoch_lineage.epoch), vf.encode_lineage(epoch_lineage)
            for epoch, (_, ids) in state.index.items():
                for start, segment in ids.items():
                    yield vf.EPOCH_INDEX, vf.index_key(tp, epoch, start), segment.bytes


def view_digest_of(entries: Iterable[tuple[str, bytes, bytes]], presorted: bool = False) -> str:
    """The digest of a view: sha256 over its content entries, ordered by column family and key."""
    digest = ViewDigest()
    for family, group in itertools.groupby(entries if presorted else sorted(entries), key=operator.itemgetter(0)):
        run = list(group)
        digest.add(family, list(map(operator.itemgetter(1), run)), list(map(operator.itemgetter(2), run)))
    return digest.hexdigest()


_LENGTH = struct.Struct(">I").pack

_digest: ModuleType | None
try:  # built by setup.py where a C compiler is (optional): see rlmm/_digest.c
    from rlmm import _digest
except ImportError:  # a build without the compiler: ViewDigest frames entries in Python
    _digest = None


class ViewDigest:
    """The view digest's rule, fed a run of one column family's entries at a time (in (family, key) order): sha256
    over each entry's family, key and value, each prefixed with its length as 4 bytes big-endian."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def add(self, family: str, keys: Sequence[bytes], values: Sequence[bytes]) -> None:
        name = family.encode()
        if _digest is not None and type(keys) is list and type(values) is list:
            self._hash.update(_digest.frame(name, keys, values))  # the same bytes, framed in C
            return
        # Built by C-level maps and slice assignments, not a Python loop per entry: a snapshot bootstrap hashes
        # every entry of the view it loads.
        parts = [_LENGTH(len(name)) + name] * (5 * len(keys))
        parts[1::5] = map(_LENGTH, map(len, keys))
        parts[2::5] = keys
        parts[3::5] = map(_LENGTH, map(len, values))
        parts[4::5] = values
        self._hash.update(b"".join(parts))

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


# --- the writer's side: validating calls and the records that follow an applied event --------------------

def prepare_add(store: StateReader, metadata: RemoteLogSegmentMetadata) -> RemoteLogSegmentMetadata:
    """Check an `add_remote_log_segment_metadata` call against the state; return the record to append."""
    _require_not_deleted(store, metadata.topic_id_partition, "add_remote_log_segment_metadata")
    if metadata.state is not S.COPY_SEGMENT_STARTED:
        raise InvalidArgumentError(
            f"add_remote_log_segment_metadata: state must be COPY_SEGMENT_STARTED, got {metadata.state.name} "
            f"for segment {metadata.remote_log_segment_id}"
        )
    existing = store.segment(metadata.remote_log_segment_id)
    if existing is not None and not is_valid_segment_transition(existing.state, metadata.state):
        raise InvalidArgumentError(
            f"add_remote_log_segment_metadata: segment {metadata.remote_log_segment_id} is already "
            f"{existing.state.name}; use a new segment id for a new upload"
        )
    return metadata


def prepare_update(store: StateReader, update: RemoteLogSegmentMetadataUpdate) -> RemoteLogSegmentMetadata:
    """Check an `update_remote_log_segment_metadata` call; return the segment's full new state to append."""
    if update.state is S.COPY_SEGMENT_STARTED:
        raise InvalidArgumentError(
            "update_remote_log_segment_metadata: state may not be COPY_SEGMENT_STARTED "
            "(use add_remote_log_segment_metadata)"
        )
    _require_not_deleted(store, update.topic_id_partition, "update_remote_log_segment_metadata")
    existing = store.segment(update.remote_log_segment_id)
    if existing is None:
        raise RemoteResourceNotFoundError(f"no remote log segment {update.remote_log_segment_id}")
    if not is_valid_segment_transition(existing.state, update.state):
        raise InvalidArgumentError(
            f"update_remote_log_segment_metadata: segment {update.remote_log_segment_id} cannot go from "
            f"{existing.state.name} to {update.state.name}"
        )
    return existing.create_with_update(update)


def _require_not_deleted(store: StateReader, tp: TopicIdPartition, call: str) -> None:
    if is_deleted(store, tp):
        raise RemoteResourceNotFoundError(
            f"{call}: the remote data of partition {tp} was deleted (DELETE_PARTITION_FINISHED); "
            f"a recreated topic has a new topic id"
        )


def prepare_partition_delete(store: StateReader, metadata: RemotePartitionDeleteMetadata) -> None:
    _require_not_deleted(store, metadata.topic_id_partition, "put_remote_partition_delete_metadata")
    current = store.partition_delete(metadata.topic_id_partition)
    if not is_valid_partition_transition(current.state if current else None, metadata.state):
        raise InvalidArgumentError(
            f"put_remote_partition_delete_metadata: partition {metadata.topic_id_partition} cannot go from "
            f"{current.state.name if current else 'no delete state'} to {metadata.state.name}"
        )


def corrections_after(
    store: StateReader, event: MetadataEvent, outcome: Outcome, event_timestamp_ms: int, broker_id: int,
    whole_partition_checkpoints: bool = False,
) -> list[tuple[RecordKey, MetadataEvent | None]]:
    """What the writer of `event` appends once it applied it, when the record left the newest record of its key
    describing something other than the state (racing writers): compaction keeps only that newest record, so a
    rebuild from the compacted topic would otherwise differ from a node that applied every record.

    - A stale checkpoint (computed before a lineage change another writer's record made): a current checkpoint.
    - A dropped segment or partition-delete record (another writer moved the state on first): the key's current
      state, restated; it is a valid same-state transition, so every node applies it and nothing changes.
    - A dropped update of a segment the store does not hold (deleted already): the segment's tombstone again, so
      that no rebuild takes the update for the newest state of a segment whose older records compaction removed.
    """
    if outcome.stale and isinstance(event, EpochCheckpoint):
        return list(checkpoint_records(pending_checkpoint(
            store, event.topic_id_partition, event_timestamp_ms, broker_id, whole_partition_checkpoints)))
    if outcome.applied:
        return []
    if isinstance(event, RemoteLogSegmentMetadata):
        current = store.segment(event.remote_log_segment_id)
        if current is not None:
            return [(key_of(current), current)]
        # Nothing to restate for a record dropped because its partition was deleted: the partition's kept
        # DELETE_PARTITION_FINISHED record refuses it in every replay alike.
        return [] if is_deleted(store, event.topic_id_partition) else [(key_of(event), None)]
    if isinstance(event, RemotePartitionDeleteMetadata):
        delete = store.partition_delete(event.topic_id_partition)
        return [] if delete is None else [(key_of(delete), delete)]
    return []


def doomed_keys(store: StateReader, tp: TopicIdPartition) -> list[RecordKey]:
    """The keys of the records a partition holds, to tombstone once its DELETE_PARTITION_FINISHED is applied (which
    forgets what would name them): its segments' and its epochs' checkpoints'."""
    return [*(segment_key(md.remote_log_segment_id) for md in store.segments_of(tp)),
            *(epoch_key(tp, lin.epoch) for lin in store.lineages_of(tp))]


def records_after(
    store: StateReader, key: RecordKey, event: MetadataEvent, doomed_segments: Iterable[RecordKey],
    event_timestamp_ms: int, broker_id: int, whole_partition_checkpoints: bool = False,
) -> list[tuple[RecordKey, MetadataEvent | None]]:
    """What a writer appends once `event` is applied: tombstones for what is gone and the checkpoints of the epochs
    it changed (`whole_partition_checkpoints`: of all epochs of the partition, as releases before per-epoch
    checkpoints wrote them).

    `doomed_segments` are the keys a partition held before its DELETE_PARTITION_FINISHED (`doomed_keys`). The
    whole-partition `epochs:` key of earlier releases is tombstoned too. A partition's FINISHED delete record is
    kept, one small record per deleted partition, so every node and every rebuild refuses writes for it.
    """
    if isinstance(event, RemotePartitionDeleteMetadata):
        if event.state is not P.DELETE_PARTITION_FINISHED:
            return []
        # The FINISHED record itself is kept (not tombstoned): it is what refuses later writes after a rebuild.
        tombstones: list[tuple[RecordKey, MetadataEvent | None]] = [(k, None) for k in doomed_segments]
        return [*tombstones, (epochs_key(event.topic_id_partition), None)]
    if not isinstance(event, RemoteLogSegmentMetadata):
        return []
    follow: list[tuple[RecordKey, MetadataEvent | None]] = list(checkpoint_records(pending_checkpoint(
        store, event.topic_id_partition, event_timestamp_ms, broker_id, whole_partition_checkpoints)))
    if event.state is S.DELETE_SEGMENT_FINISHED:
        follow.append((key, None))
    return follow
