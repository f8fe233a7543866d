"""The view's committed state in memory, segments packed (rlmm.packed): what every lookup and the apply path read.

RocksDB stays the durable truth. The model reads a user partition from it when the partition is first asked for
(a restart or a snapshot bootstrap does not decode every segment of the view before it serves), and then follows
it: the applier's batch folds its changes in right after their WriteBatch is written, one user partition at a
time under a short lock. A partition not read yet needs no fold: RocksDB already holds the batch.

Which partitions it keeps: a view opened alone (a tool, a test) keeps every partition it reads. A view a manager
serves keeps only the partitions its node hosts (`hold_hosted`): a node holds the whole cluster's view on disk, so
that it can take over any partition at once, but RAM only for what it leads or follows. The applier then reads any
other partition's state key by key from RocksDB (`view.ViewBatch`), and a partition the node stops hosting is let go.

One writer (the applier's thread) changes the model; any thread reads it through `ReadModel.lock`. For the user
partitions a manager serves, the model also publishes a `PartitionSnapshot` per partition: immutable, replaced
whole as each batch folds in, so the broker's lookups read it with no lock, through the manager's `SnapshotSlot`
for the partition (one attribute read), in a dict read and a bisect.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
import uuid
from array import array
from collections.abc import Callable, Container, Iterable, Iterator, Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from rlmm import codec, packed, state
from rlmm import view_format as vf
from rlmm.events import EpochLineage
from rlmm.types import RemoteLogSegmentMetadata, RemotePartitionDeleteMetadata, TopicIdPartition


class EpochIndex:
    """One leader epoch's offset index: the sorted start offsets, in an int64 array, and at the same positions the
    segment each maps to, as its UUID's int (the key its SegmentTable holds it under, one object for both). 16 bytes
    an entry, where a list of starts and a dict start -> UUID took about 80 (an int object per start, a dict slot per
    entry), and a node holds one entry per hosted segment."""

    __slots__ = ("segments", "starts")

    def __init__(self, starts: Iterable[int] = (), segments: Iterable[int] = ()) -> None:
        self.starts = array("q", starts)
        self.segments = list(segments)

    @classmethod
    def of(cls, starts: Iterable[int], ids: Mapping[int, uuid.UUID]) -> EpochIndex:
        """From sorted starts and a mapping start -> segment (rlmm.state's in-memory index)."""
        index = cls(starts)
        index.segments = [ids[start].int for start in index.starts]
        return index

    def __len__(self) -> int:
        return len(self.segments)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EpochIndex):
            return NotImplemented
        return self.starts == other.starts and self.segments == other.segments

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"EpochIndex({dict(self.items())!r})"

    def id_at(self, start: int) -> int | None:
        """The segment at exactly `start`, if any, as its UUID's int."""
        position = bisect.bisect_left(self.starts, start)
        if position < len(self.segments) and self.starts[position] == start:
            return self.segments[position]
        return None

    def get(self, start: int) -> uuid.UUID | None:
        """The segment at exactly `start`, if any."""
        found = self.id_at(start)
        return None if found is None else packed.uuid_of(found)

    def items(self) -> Iterator[tuple[int, uuid.UUID]]:
        return ((start, packed.uuid_of(segment)) for start, segment in zip(self.starts, self.segments, strict=True))

    def floor(self, offset: int, skip: Container[int] = ()) -> tuple[int, uuid.UUID] | None:
        """The entry with the greatest start <= offset, passing over the starts in `skip`."""
        position = bisect.bisect_right(self.starts, offset)
        while position > 0:
            position -= 1
            start = self.starts[position]
            if start not in skip:
                return start, packed.uuid_of(self.segments[position])
        return None

    def put(self, start: int, segment: int) -> None:
        position = bisect.bisect_left(self.starts, start)
        if position < len(self.segments) and self.starts[position] == start:
            self.segments[position] = segment
        else:
            self.starts.insert(position, start)
            self.segments.insert(position, segment)

    def remove(self, start: int) -> None:
        position = bisect.bisect_left(self.starts, start)
        if position < len(self.segments) and self.starts[position] == start:
            del self.starts[position], self.segments[position]


class SegmentTable(MutableMapping[uuid.UUID, RemoteLogSegmentMetadata]):
    """A partition's segments by id, each held packed (rlmm.packed: about 100 bytes where the decoded metadata takes
    about 480), keyed by its UUID's int (`stored`). As a mapping it packs what it is given and unpacks what it is
    asked for, relative to `tp`, the partition's topic-partition when the table was made."""

    __slots__ = ("stored", "tp")

    def __init__(self, tp: TopicIdPartition) -> None:
        self.tp = tp
        self.stored: dict[int, bytes] = {}

    @classmethod
    def of(cls, tp: TopicIdPartition, segments: Mapping[uuid.UUID, RemoteLogSegmentMetadata]) -> SegmentTable:
        table = cls(tp)
        table.stored = {segment_id.int: packed.pack(md, tp) for segment_id, md in segments.items()}
        return table

    def __getitem__(self, segment_id: uuid.UUID) -> RemoteLogSegmentMetadata:
        return packed.unpack(self.stored[segment_id.int], self.tp)

    def get(self, segment_id: uuid.UUID, default: Any = None) -> Any:
        found = self.stored.get(segment_id.int)
        return default if found is None else packed.unpack(found, self.tp)

    def __setitem__(self, segment_id: uuid.UUID, md: RemoteLogSegmentMetadata) -> None:
        self.stored[segment_id.int] = packed.pack(md, self.tp)

    def __delitem__(self, segment_id: uuid.UUID) -> None:
        del self.stored[segment_id.int]

    def __contains__(self, segment_id: object) -> bool:
        return isinstance(segment_id, uuid.UUID) and segment_id.int in self.stored

    def __iter__(self) -> Iterator[uuid.UUID]:
        return map(packed.uuid_of, self.stored)

    def __len__(self) -> int:
        return len(self.stored)

    def unpacked(self, found: bytes | None) -> RemoteLogSegmentMetadata | None:
        return None if found is None else packed.unpack(found, self.tp)


@dataclass(slots=True)
class PartitionModel:
    """Everything the view holds for one user partition; `meta` is None once the partition is forgotten. The read
    model's partitions hold their segments in a SegmentTable; a FreshState's, handed over, a dict until adopted."""

    tp: TopicIdPartition
    meta: vf.PartitionMeta | None = None
    segments: MutableMapping[uuid.UUID, RemoteLogSegmentMetadata] = None  # type: ignore[assignment]
    delete: RemotePartitionDeleteMetadata | None = None
    lineages: dict[int, EpochLineage] = field(default_factory=dict)
    index: dict[int, EpochIndex] = field(default_factory=dict)
    # Whether its snapshots' floors hold their answers decoded (ReadModel grants it, within DECODED_ANSWERS_MAX).
    decoded_answers: bool = field(default=False, compare=False)

    def __post_init__(self) -> None:
        if self.segments is None:
            self.segments = SegmentTable(self.tp)

    def table(self) -> SegmentTable:
        """The segments as a SegmentTable (packed now if they were handed over as a dict)."""
        if not isinstance(self.segments, SegmentTable):
            self.segments = SegmentTable.of(self.tp, self.segments)
        return self.segments

    def empty(self) -> bool:
        return self.meta is None and not (self.segments or self.delete or self.lineages or self.index)


@dataclass
class PartitionChanges:
    """One partition's share of a committed batch, decoded; None values are deletions."""

    meta: tuple[vf.PartitionMeta | None] | None = None
    delete: tuple[RemotePartitionDeleteMetadata | None] | None = None
    segments: dict[uuid.UUID, RemoteLogSegmentMetadata | None] = field(default_factory=dict)
    lineages: dict[int, EpochLineage | None] = field(default_factory=dict)
    index: dict[tuple[int, int], uuid.UUID | None] = field(default_factory=dict)


# --- lookup snapshots: what the manager's reads see of a partition, one committed batch at a time ---------------
# Published objects are never changed: a fold builds a partition's next snapshot beside the current one, copying
# only the epochs and listings the batch touched, and swaps one reference (atomic under the GIL).

# What a lookup answers, as a snapshot's floors hold it: the segment packed (rlmm.packed), which the lookup unpacks
# (about 1-2 us on a random lookup: a few new objects, a cache miss or two), or, for partitions the read model
# grants it (DECODED_ANSWERS_MAX), the segment decoded, returned as it is (about 480 bytes more per segment).
Answer = bytes | RemoteLogSegmentMetadata

# How many hosted segments' answers the read model keeps decoded, partition by partition as they are first served.
DECODED_ANSWERS_MAX = 200_000

@dataclass(frozen=True, slots=True)
class EpochFloors:
    """One leader epoch's offset index for lookups: the sorted starts and, per start, what a lookup from it answers:
    the segment (an Answer), up to the last offset of the epoch in it (state.lookup_end), or None for nothing.

    A lookup from a random partition finds little of this in the CPU's caches, so the layout touches few objects:
    `bounds` is one int64 array holding the n starts, then the n ends, `segments` a tuple (its items inline). An int
    array boxes the few elements a bisect compares, which costs less than the cache misses of a list's int objects
    (measured on the bench's lookups over 40k segments)."""

    bounds: array[int]
    segments: tuple[Answer | None, ...]

    def floor(self, offset: int) -> Answer | None:
        """What a lookup of `offset` answers: the entry with the greatest start <= offset, if offset <= its end."""
        count = len(self.segments)
        bounds = self.bounds
        position = bisect.bisect_right(bounds, offset, 0, count)
        if position and offset <= bounds[count + position - 1]:
            return self.segments[position - 1]
        return None

    @classmethod
    def of(cls, starts: list[int], segments: list[Answer | None], ends: list[int]) -> EpochFloors:
        return cls(array("q", starts + ends), tuple(segments))

    def parts(self) -> tuple[list[int], list[Answer | None], list[int]]:
        """The starts, answers and ends, as new lists (`of` builds them back)."""
        count = len(self.segments)
        return self.bounds[:count].tolist(), list(self.segments), self.bounds[count:].tolist()


@dataclass(frozen=True, slots=True)
class Listing:
    """Segments a listing shows (all epochs': state.is_listed; an epoch's: state.is_listed_in), packed, in listing
    order (state.listing_order, which is their bytes' order), and their total size."""

    segments: list[bytes] = field(default_factory=list)
    size: int = 0


_NO_LISTING = Listing()


@dataclass(frozen=True, slots=True)
class PartitionSnapshot:
    """One user partition as lookups see it after a committed batch. `deleted` stays set once seen until a checked
    read replaces the snapshot (ReadModel.watch): the partition may be forgotten after its delete finished while the
    manager still has to refuse it. Its segments are packed relative to `tp` (its SegmentTable's)."""

    deleted: bool = False
    # Derived from `floors`: the partition's only epoch with floors and those floors (most partitions have one
    # epoch), which a lookup then reads with no dict lookup; -1 and None with none or several. Beside `deleted`,
    # so a lookup reads them from the same cache line, and the sole floors' bounds and segments too (one object
    # fewer for a lookup to reach; empty with no sole epoch).
    sole_epoch: int = field(init=False, compare=False, repr=False)
    sole_floors: EpochFloors | None = field(init=False, compare=False, repr=False)
    sole_bounds: array[int] = field(init=False, compare=False, repr=False)
    sole_segments: tuple[Answer | None, ...] = field(init=False, compare=False, repr=False)
    floors: dict[int, EpochFloors] = field(default_factory=dict)
    listings: dict[int, Listing] = field(default_factory=dict)  # per leader epoch the segments contain
    everything: Listing = _NO_LISTING
    lineages: dict[int, EpochLineage] = field(default_factory=dict)
    tp: TopicIdPartition | None = None  # None only with no segments

    def __post_init__(self) -> None:
        sole_epoch, sole_floors = next(iter(self.floors.items())) if len(self.floors) == 1 else (-1, None)
        object.__setattr__(self, "sole_epoch", sole_epoch)
        object.__setattr__(self, "sole_floors", sole_floors)
        sole = sole_floors or _NO_FLOORS
        object.__setattr__(self, "sole_bounds", sole.bounds)
        object.__setattr__(self, "sole_segments", sole.segments)

    def unpack(self, found: Answer) -> RemoteLogSegmentMetadata:
        """An answer of this snapshot as the segment's metadata (unpacked if packed)."""
        if type(found) is not bytes:
            return found  # type: ignore[return-value]
        assert self.tp is not None, "a snapshot with segments has a tp"
        return packed.unpack(found, self.tp)

    def floors_of(self, epoch: int) -> EpochFloors | None:
        return self.sole_floors if epoch == self.sole_epoch else self.floors.get(epoch)

    def answer_for_offset(self, epoch: int, offset: int) -> Answer | None:
        """What a lookup answers, as the floors hold it (as the manager's lookup in C answers it)."""
        floors = self.floors_of(epoch)
        return None if floors is None else floors.floor(offset)

    def segment_for_offset(self, epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
        found = self.answer_for_offset(epoch, offset)
        return None if found is None else self.unpack(found)

    def next_segment_with_txn_index(self, epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
        return state.next_with_txn_index(lambda at: self.segment_for_offset(epoch, at), offset)

    def list_segments(self, epoch: int | None = None) -> list[RemoteLogSegmentMetadata]:
        listing = self.everything if epoch is None else self.listings.get(epoch, _NO_LISTING)
        return [self.unpack(found) for found in listing.segments]

    def remote_log_size(self, epoch: int) -> int:
        return self.listings.get(epoch, _NO_LISTING).size

    def highest_offset_for_epoch(self, epoch: int) -> int | None:
        lineage = self.lineages.get(epoch)
        return None if lineage is None else lineage.highest_log_offset


_NO_FLOORS = EpochFloors.of([], [], [])
_NOTHING = PartitionSnapshot()
_GONE = PartitionSnapshot(deleted=True)


def _answer(found: bytes | None, md: RemoteLogSegmentMetadata | None, epoch: int, decoded: bool
            ) -> tuple[Answer | None, int]:
    """What a lookup from md's start in `epoch` answers (md packed: `found`; md itself with `decoded`), and up to
    which offset (-1: no offset, it answers None)."""
    end = None if md is None else state.lookup_end(md, epoch)
    return (None, -1) if end is None else (md if decoded else found, end)


def _floors(epoch: int, index: EpochIndex, stored: dict[int, bytes], decoded: dict[int, RemoteLogSegmentMetadata],
            decoded_answers: bool) -> EpochFloors:
    answers = [_answer(stored.get(segment), decoded.get(segment), epoch, decoded_answers) for segment in index.segments]
    return EpochFloors.of(index.starts.tolist(), [answer for answer, _ in answers], [end for _, end in answers])


def snapshot_of(partition: PartitionModel | None) -> PartitionSnapshot:
    """A partition's snapshot built from scratch (when a partition is first watched; the reference for folds)."""
    if partition is None:
        return _NOTHING
    table = partition.table()
    stored = table.stored
    decoded = {segment: packed.unpack(raw, table.tp) for segment, raw in stored.items()}
    floors = {epoch: _floors(epoch, index, stored, decoded, partition.decoded_answers)
              for epoch, index in partition.index.items() if index}
    listed = sorted((stored[segment], md) for segment, md in decoded.items() if state.is_listed(md))
    by_epoch: dict[int, list[tuple[bytes, RemoteLogSegmentMetadata]]] = {}
    for entry in listed:
        for epoch in entry[1].segment_leader_epochs:
            by_epoch.setdefault(epoch, []).append(entry)
    # Only the few epochs with overwritten segments list fewer: checked after, as a check per segment and epoch costs
    # about 1 us per segment (measured: +100 ms on the first snapshot of a partition of 100k segments).
    for epoch, lineage in partition.lineages.items():
        if lineage.overwritten_segment_ids and epoch in by_epoch:
            by_epoch[epoch] = [entry for entry in by_epoch[epoch] if state.is_listed_in(entry[1], lineage)]
            if not by_epoch[epoch]:
                del by_epoch[epoch]
    return PartitionSnapshot(
        state.delete_finished(partition.delete), floors,
        {epoch: _listing([raw for raw, _ in entries]) for epoch, entries in by_epoch.items()},
        _listing([raw for raw, _ in listed]), dict(partition.lineages), table.tp,
    )


def _epochs_listing(md: RemoteLogSegmentMetadata, lineages: dict[int, EpochLineage]) -> list[int]:
    """The epochs whose listings show md (state.is_listed_in) under the partition's `lineages`."""
    return [epoch for epoch in md.segment_leader_epochs if state.is_listed_in(md, lineages.get(epoch))]


def _listing(segments: list[bytes]) -> Listing:
    return Listing(segments, sum(map(packed.size_of, segments))) if segments else _NO_LISTING


def _decoding_answers(snapshot: PartitionSnapshot, tp: TopicIdPartition, pause: Callable[[], None] | None
                      ) -> PartitionSnapshot:
    """`snapshot` with its floors' packed answers decoded relative to `tp` (its table's), as snapshot_of builds them for
    a partition granted that; `pause`, if given, is called at each epoch's first answer and every UNPACK_PAUSE_EVERY
    after."""
    unpack = packed.unpack
    floors = {}
    for epoch, epoch_floors in snapshot.floors.items():
        answers = list(epoch_floors.segments)
        for at, found in enumerate(answers):
            if pause is not None and at % UNPACK_PAUSE_EVERY == 0:
                pause()
            if type(found) is bytes:
                answers[at] = unpack(found, tp)
        floors[epoch] = EpochFloors(epoch_floors.bounds, tuple(answers))
    return replace(snapshot, floors=floors)


def _folded(
    snapshot: PartitionSnapshot, partition: PartitionModel, change: PartitionChanges,
    before: dict[uuid.UUID, bytes | None],
) -> PartitionSnapshot:
    """`snapshot` after `change` folded into `partition` (`before`: the changed segments as they were, packed)."""
    table = partition.table()
    relisting = _Relisting(snapshot)
    lineages = partition.lineages if change.lineages else snapshot.lineages  # before the change: snapshot.lineages
    touched: dict[int, set[int]] = {}  # epoch -> starts whose answer may have changed
    for epoch, start in change.index:
        touched.setdefault(epoch, set()).add(start)
    relisted: set[uuid.UUID] = set()
    for segment_id in change.segments:
        was, now = before.get(segment_id), table.stored.get(segment_id.int)
        if was is now:
            continue
        relisted.add(segment_id)
        old, new = table.unpacked(was), table.unpacked(now)
        # The index maps a segment only at its own epochs' starts, so these are the answers that name it.
        for md in (old, new):
            if md is not None:
                for epoch, start in md.segment_leader_epochs.items():
                    touched.setdefault(epoch, set()).add(start)
        if was is not None and old is not None and state.is_listed(old):
            relisting.remove(was, _epochs_listing(old, snapshot.lineages))
        if now is not None and new is not None and state.is_listed(new):
            relisting.add(now, _epochs_listing(new, lineages))
    # A segment an epoch's lineage stops (or starts) calling overwritten comes back to (or leaves) that epoch's
    # listing, though the segment itself did not change.
    for epoch in change.lineages:
        was_lineage, now_lineage = snapshot.lineages.get(epoch), lineages.get(epoch)
        for segment_id in _overwritten(was_lineage) ^ _overwritten(now_lineage):
            found = table.stored.get(segment_id.int)
            md = table.unpacked(found)
            if segment_id in relisted or found is None or md is None or epoch not in md.segment_leader_epochs:
                continue
            listed_before, listed_now = state.is_listed_in(md, was_lineage), state.is_listed_in(md, now_lineage)
            if listed_before and not listed_now:
                relisting.remove(found, [epoch], everything=False)
            elif listed_now and not listed_before:
                relisting.add(found, [epoch], everything=False)
    floors = snapshot.floors
    if touched:
        floors = dict(floors)
        for epoch, starts in touched.items():
            _refloor(floors, epoch, starts, partition.index.get(epoch), table, partition.decoded_answers)
    listings, everything = relisting.done()
    return PartitionSnapshot(
        snapshot.deleted or state.delete_finished(partition.delete), floors, listings, everything,
        dict(lineages) if change.lineages else snapshot.lineages, table.tp,
    )


def _overwritten(epoch_lineage: EpochLineage | None) -> frozenset[uuid.UUID]:
    return frozenset() if epoch_lineage is None else epoch_lineage.overwritten_segment_ids


def _refloor(floors: dict[int, EpochFloors], epoch: int, starts: set[int], index: EpochIndex | None,
             table: SegmentTable, decoded: bool) -> None:
    """Replace `floors[epoch]` by a copy whose answers at `starts` follow the partition's index and segments."""
    sorted_starts, segments, ends = floors.get(epoch, _NO_FLOORS).parts()
    for start in starts:
        segment = None if index is None else index.id_at(start)
        position = bisect.bisect_left(sorted_starts, start)
        present = position < len(sorted_starts) and sorted_starts[position] == start
        if segment is None:
            if present:
                del sorted_starts[position], segments[position], ends[position]
            continue
        found = table.stored.get(segment)
        answer, end = _answer(found, table.unpacked(found), epoch, decoded)
        if present:
            segments[position], ends[position] = answer, end
        else:
            sorted_starts.insert(position, start)
            segments.insert(position, answer)
            ends.insert(position, end)
    if sorted_starts:
        floors[epoch] = EpochFloors.of(sorted_starts, segments, ends)
    else:
        floors.pop(epoch, None)


class _Relisting:
    """Copy-on-write edits of a snapshot's listings: each listing a fold touches is copied once. Listings hold packed
    segments, whose bytes sort in listing order: an edit finds a segment by its first ORDER_LEN bytes."""

    def __init__(self, snapshot: PartitionSnapshot) -> None:
        self._snapshot = snapshot
        self._edits: dict[int | None, tuple[list[bytes], list[int]]] = {}  # None: everything

    def _edit(self, epoch: int | None) -> tuple[list[bytes], list[int]]:
        edit = self._edits.get(epoch)
        if edit is None:
            base = self._snapshot.everything if epoch is None else self._snapshot.listings.get(epoch, _NO_LISTING)
            edit = self._edits[epoch] = (list(base.segments), [base.size])
        return edit

    def remove(self, found: bytes, epochs: list[int], everything: bool = True) -> None:
        """Take the packed segment out of the listings of `epochs` (and of all epochs' listing, with `everything`)."""
        order = found[:packed.ORDER_LEN]
        for epoch in (None, *epochs) if everything else epochs:
            segments, size = self._edit(epoch)
            position = bisect.bisect_left(segments, order)
            if position < len(segments) and segments[position][:packed.ORDER_LEN] == order:
                size[0] -= packed.size_of(segments.pop(position))

    def add(self, found: bytes, epochs: list[int], everything: bool = True) -> None:
        """Put the packed segment into the listings of `epochs` (and of all epochs' listing, with `everything`)."""
        for epoch in (None, *epochs) if everything else epochs:
            segments, size = self._edit(epoch)
            segments.insert(bisect.bisect_left(segments, found), found)
            size[0] += packed.size_of(found)

    def done(self) -> tuple[dict[int, Listing], Listing]:
        listings = self._snapshot.listings
        everything = self._snapshot.everything
        if self._edits:
            listings = dict(listings)
        for epoch, (segments, size) in self._edits.items():
            listing = Listing(segments, size[0]) if segments else _NO_LISTING
            if epoch is None:
                everything = listing
            elif segments:
                listings[epoch] = listing
            else:
                listings.pop(epoch, None)
        return listings, everything


# Segments of the partitions the applier may borrow while it reads a backlog (ReadModel.borrow): about 250 bytes
# each (packed, with their index entries), so a rebuild holds at most about 250 MiB of them at once, whatever the
# cluster's size (a cluster of more applies the rest key by key from RocksDB, or reads a partition again once it was
# given back).
BORROW_MAX_SEGMENTS = 1_000_000


class Resumable(Protocol):
    """The partitions' state as a node served them when it closed (rlmm.resume_file.ResumedState)."""

    def take(self, tp_key: bytes) -> tuple[PartitionModel | None, PartitionSnapshot] | None: ...

    def discard(self, tp_key: bytes) -> None: ...

    def close(self) -> None: ...

    def __len__(self) -> int: ...

    def __contains__(self, tp_key: object) -> bool: ...


class SnapshotSlot:
    """Where a reader keeps one watched partition's snapshot: the model replaces `snapshot` whole as each batch folds
    in (one reference, an atomic store under the GIL), so the reader gets the newest in one attribute read, with no
    dict lookup and no lock. A reader adds what else it needs per partition in a subclass."""

    __slots__ = ("snapshot",)

    def __init__(self) -> None:
        self.snapshot = _NOTHING


class ReadModel:
    """Per user partition (keyed by its view key): segments, delete state, lineages, offset index, bookkeeping.

    `read` reads one partition from the view's RocksDB (None when the view holds nothing of it). A partition enters
    `partitions` read under the lock, so that the read never interleaves with a fold: read before a batch's fold, the
    fold follows; read after its WriteBatch was written, the fold applies what the partition already holds, which
    changes nothing. `prepare` reads without the lock, and keeps what it read only if no fold touched the partition
    meanwhile.
    """

    def __init__(self, read: Callable[[bytes, Callable[[], None] | None], PartitionModel | None]) -> None:
        self.lock = threading.RLock()  # reentrant: a read under the lock may load the partition
        self._read_view = read
        # The partitions read so far; None: the view holds nothing of it.
        self.partitions: dict[bytes, PartitionModel | None] = {}
        # The watched partitions' lookup snapshots, each replaced whole under the lock; read without it.
        self.snapshots: dict[bytes, PartitionSnapshot] = {}
        self._slots: dict[bytes, SnapshotSlot] = {}  # where a watched partition's snapshot is published too
        # The partitions kept once read: None keeps every one (a view opened alone); a manager's view keeps those
        # its node hosts (hold_hosted, host, unhost).
        self.hosted: set[bytes] | None = None
        # Partitions the applier borrowed while it reads a backlog (`borrow`), with their segment counts, oldest first.
        self._borrowed: dict[bytes, int] = {}
        self._borrowed_segments = 0
        # Watched partitions granted decoded answers, with their segment counts then (`_grant`).
        self.decoded_answers_max = DECODED_ANSWERS_MAX
        self._decoded: dict[bytes, int] = {}
        self._decoded_segments = 0
        # Partitions `prepare` reads without the lock now: True once something changed one meanwhile.
        self._reading: dict[bytes, bool] = {}
        # What a restarted node served when it closed (rlmm.resume_file), given to each partition as it is hosted
        # again, unless something changed the partition first.
        self._resumed: Resumable | None = None
        # Partitions taken from it that were granted decoded answers, published with their answers packed until
        # `host` (in the time it has) or `prepare` decodes them (`_decode_taken`): unpacking the answers took a third
        # of a restart's registration at 1M hosted segments, which now takes every partition first.
        self._undecoded: set[bytes] = set()

    def _read(self, tp_key: bytes, pause: Callable[[], None] | None) -> PartitionModel | None:
        """The partition as the view holds it now. What follows folds into what this read (a borrowed partition's
        backlog, say), so the partition's state as the node served it when it closed is stale from here on."""
        if self._resumed is not None:
            with self.lock:  # `prepare` reads without it
                if self._resumed is not None:
                    self._resumed.discard(tp_key)
        return self._read_view(tp_key, pause)

    def get(self, tp_key: bytes) -> PartitionModel | None:
        """The partition, read from RocksDB if not held; kept only if it is to be held (see `holds`)."""
        try:
            return self.partitions[tp_key]
        except KeyError:
            with self.lock:
                if tp_key in self.partitions:
                    return self.partitions[tp_key]
                partition = self._read(tp_key, None)
                if self.holds(tp_key):
                    self.partitions[tp_key] = partition
                return partition

    def holds(self, tp_key: bytes) -> bool:
        """Whether the model keeps this partition once read (a watched one always: its snapshot follows it)."""
        hosted = self.hosted
        return hosted is None or tp_key in hosted or tp_key in self.snapshots

    def hold_hosted(self) -> None:
        """From now on keep only the partitions `host` names (and let go of any other read so far)."""
        with self.lock:
            if self.hosted is None:
                self.hosted = set()
                self._let_go([key for key in self.partitions if key not in self.snapshots])

    def host(self, tp_keys: Iterable[bytes], resume_for_s: float = math.inf) -> None:
        """Partitions this node now hosts: kept once read (each is read when first asked for, not now). One the node
        served when it closed is held and watched at once as it was then, if nothing changed it since (`resume`), for
        `resume_for_s` seconds in all, its answers packed, then decoded where granted while time is left; each of
        the rest is taken (and decoded) from what the node kept when it is prepared."""
        with self.lock:
            if self.hosted is not None:
                keys = list(tp_keys)
                self.hosted.update(keys)
                if self._resumed is not None:
                    deadline = time.monotonic() + resume_for_s
                    for tp_key in keys:
                        if time.monotonic() >= deadline:
                            break
                        self._resume(tp_key)
                    self._end_resume_once_taken()
                    # Then their answers, in what time is left (the loader's `prepare` decodes the rest).
                    for tp_key in list(self._undecoded):
                        if time.monotonic() >= deadline:
                            break
                        self._decode_taken(tp_key, None)

    def resume(self, resumed: Resumable | None) -> None:
        """The partitions this node served when it closed, as they were then (rlmm.resume_file: the view has not
        changed since). Each is held and its snapshot published when it is hosted again (`host`) unless a batch,
        a load or a reset touched it first; `end_resume` lets go of those not hosted again (once all are taken, it
        runs by itself)."""
        with self.lock:
            self._resumed = resumed

    def resuming(self) -> bool:
        return self._resumed is not None

    def end_resume(self) -> None:
        with self.lock:
            resumed, self._resumed = self._resumed, None
            if resumed is not None:
                resumed.close()

    def _resume(self, tp_key: bytes) -> bool:
        """Hold and publish the partition's kept state; False when there is none (or it is not valid)."""
        assert self._resumed is not None
        if tp_key in self.partitions or tp_key in self.snapshots or tp_key in self._reading:
            self._resumed.discard(tp_key)  # read from the view already: it holds the same
            return False
        found = self._resumed.take(tp_key)
        if found is None:
            return False
        partition, snapshot = found
        self._grant(tp_key, partition)
        if partition is not None and partition.decoded_answers:
            self._undecoded.add(tp_key)  # published packed: lookups unpack each answer until it is decoded
        self.partitions[tp_key] = partition
        self._publish(tp_key, snapshot)
        return True

    def _take_kept(self, tp_key: bytes) -> bool:
        """Hold the partition as the node kept it at its last clean close, if `host` has not taken that yet."""
        if self._resumed is None or tp_key not in self._resumed:
            return False
        taken = self._resume(tp_key)
        self._end_resume_once_taken()
        return taken

    def _end_resume_once_taken(self) -> None:
        if self._resumed is not None and not len(self._resumed):
            self.end_resume()  # every kept partition is held or was found changed

    def unhost(self, tp_keys: Iterable[bytes]) -> None:
        """Partitions this node no longer hosts: their decoded state and snapshots are let go (RocksDB keeps them)."""
        with self.lock:
            if self.hosted is None:
                return
            keys = list(tp_keys)
            self.hosted.difference_update(keys)
            for tp_key in keys:
                self.snapshots.pop(tp_key, None)
                self._slots.pop(tp_key, None)
                self._ungrant(tp_key)
            self._let_go(keys)

    def borrow(self, tp_key: bytes) -> PartitionModel | None:
        """For the applier while it reads a backlog: the partition, read whole and kept until `return_borrowed`, so
        that the backlog's records of it apply in memory rather than key by key from RocksDB (a rebuild two to three
        times as fast). At most BORROW_MAX_SEGMENTS segments of borrowed partitions are kept: past that, the first
        borrowed go first."""
        with self.lock:
            if tp_key in self.partitions:
                return self.partitions[tp_key]
            partition = self.partitions[tp_key] = self._read(tp_key, None)
            size = 1 if partition is None else 1 + len(partition.segments)
            self._borrowed[tp_key] = size
            self._borrowed_segments += size
            while self._borrowed_segments > BORROW_MAX_SEGMENTS and len(self._borrowed) > 1:
                self._give_back(next(iter(self._borrowed)))
            return partition

    def return_borrowed(self) -> None:
        """The backlog is applied: let go of every borrowed partition not served now (a hosted one is read again when
        first asked for), so that nothing the backlog built outlives it."""
        with self.lock:
            for tp_key in list(self._borrowed):
                self._give_back(tp_key)

    def _give_back(self, tp_key: bytes) -> None:
        self._borrowed_segments -= self._borrowed.pop(tp_key)
        if tp_key not in self.snapshots:
            self.partitions.pop(tp_key, None)

    def _let_go(self, tp_keys: Iterable[bytes]) -> None:
        for tp_key in tp_keys:
            self.partitions.pop(tp_key, None)

    def watch(self, tp_key: bytes, slot: SnapshotSlot | None = None) -> PartitionSnapshot:
        """Publish the partition's snapshot from now on (in `slot` too, instead of any slot given before), and return
        it: the one published, unless that one shows a deletion, which is then checked again against the model (its
        caller has just found tp not deleted)."""
        with self.lock:
            snapshot = self.snapshots.get(tp_key)
            if snapshot is None and self._take_kept(tp_key):
                snapshot = self.snapshots[tp_key]
            elif snapshot is None or snapshot.deleted:
                if tp_key not in self.partitions:  # held while watched, hosted or not: folds keep its snapshot current
                    self.partitions[tp_key] = self._read(tp_key, None)
                snapshot = self._snapshot_of(tp_key, self.partitions[tp_key])
            if slot is not None:
                self._slots[tp_key] = slot
            self._publish(tp_key, snapshot)
            return snapshot

    def prepare(self, tp_key: bytes, pause: Callable[[], None] | None = None) -> None:
        """Read a hosted partition whole and publish its snapshot ahead of its first `watch`, which then only finds
        it; `pause` is called now and then (read_partition). Nothing for a partition no longer hosted (stopped
        meanwhile) or watched already.

        The read and the snapshot's building hold no lock: the applier's folds, `host` (under the manager's lock)
        and every other partition go on meanwhile, where a partition of 100k segments would otherwise stop them
        for seconds. The partition enters `partitions` with its snapshot at the end, under the lock, unless a fold,
        a load or a reset touched it meanwhile (`_reading`): it is then read again under the lock, as `watch` reads.
        Until it enters, the manager answers its lookups from disk. A partition taken from what the node kept, here
        or before, has its answers decoded here if `host` had no time to (`_decode_taken`)."""
        with self.lock:
            done = not self._wanted(tp_key) or self._take_kept(tp_key)
            if not done and (tp_key in self.partitions or tp_key in self._reading):  # held, or read by another thread
                self._prepare_locked(tp_key, pause)
                return
            if not done:
                self._reading[tp_key] = False
        if done:
            self._decode_taken(tp_key, pause)
            return
        try:
            partition = self._read(tp_key, pause)
            with self.lock:
                if self._changed_meanwhile(tp_key):
                    self._prepare_locked(tp_key, pause)
                    return
                self._grant(tp_key, partition)
            snapshot = snapshot_of(partition)  # `partition` is this thread's alone until it enters `partitions`
            with self.lock:
                if self._changed_meanwhile(tp_key):
                    self._prepare_locked(tp_key, pause)
                    return
                self.partitions[tp_key] = partition
                self._publish(tp_key, snapshot)
        finally:
            with self.lock:
                self._reading.pop(tp_key, None)

    def _decode_taken(self, tp_key: bytes, pause: Callable[[], None] | None) -> None:
        """Decode the answers of a partition taken from what the node kept (`_resume`) with them packed, without the
        lock unless the caller holds it (`host`). Published unless a fold replaced the snapshot meanwhile: then
        decoded again from the new one, at most DECODE_TRIES times in all (past that its packed answers stay: the
        same answers, each unpacked by its lookup)."""
        for _try in range(DECODE_TRIES):
            with self.lock:
                if tp_key not in self._undecoded:
                    return
                snapshot, partition = self.snapshots.get(tp_key), self.partitions.get(tp_key)
                if snapshot is None or partition is None or not partition.decoded_answers:
                    self._undecoded.discard(tp_key)
                    return
                tp = partition.table().tp
            decoded = _decoding_answers(snapshot, tp, pause)
            with self.lock:
                if self.snapshots.get(tp_key) is snapshot and tp_key in self._undecoded:
                    self._undecoded.discard(tp_key)
                    self._publish(tp_key, decoded)
                    return
        with self.lock:
            self._undecoded.discard(tp_key)

    def _wanted(self, tp_key: bytes) -> bool:
        return tp_key not in self.snapshots and (self.hosted is None or tp_key in self.hosted)

    def _changed_meanwhile(self, tp_key: bytes) -> bool:
        """Whether what `prepare` read of tp_key without the lock may be stale or unwanted now (under the lock)."""
        return self._reading[tp_key] or tp_key in self.partitions or not self._wanted(tp_key)

    def _prepare_locked(self, tp_key: bytes, pause: Callable[[], None] | None) -> None:
        if not self._wanted(tp_key):
            if tp_key not in self.snapshots:  # unhosted after `prepare` granted it decoded answers: not its own now
                self._ungrant(tp_key)
            return
        partition = self.partitions[tp_key] if tp_key in self.partitions else self._read(tp_key, pause)
        snapshot = self._snapshot_of(tp_key, partition)
        self.partitions[tp_key] = partition
        self._publish(tp_key, snapshot)

    def _touched(self, tp_key: bytes) -> None:
        """A partition's state changed: a read of it without the lock under way is stale (`prepare`), and so is its
        state as the node served it when it closed (`resume`)."""
        if tp_key in self._reading:
            self._reading[tp_key] = True
        if self._resumed is not None:
            self._resumed.discard(tp_key)

    def unwatch(self, tp_key: bytes) -> None:
        with self.lock:
            self.snapshots.pop(tp_key, None)
            self._slots.pop(tp_key, None)
            self._ungrant(tp_key)
            if not self.holds(tp_key):
                self._let_go((tp_key,))

    def _snapshot_of(self, tp_key: bytes, partition: PartitionModel | None) -> PartitionSnapshot:
        """snapshot_of(partition), for a partition watched from now on (`_grant`)."""
        self._grant(tp_key, partition)
        return snapshot_of(partition)

    def _grant(self, tp_key: bytes, partition: PartitionModel | None) -> None:
        """Let a partition watched from now on answer decoded if it was granted that, or DECODED_ANSWERS_MAX leaves
        room for its segments; else packed."""
        if partition is not None:
            if tp_key not in self._decoded and self._decoded_segments + len(partition.segments) <= \
                    self.decoded_answers_max:
                self._decoded[tp_key] = len(partition.segments)
                self._decoded_segments += len(partition.segments)
            partition.decoded_answers = tp_key in self._decoded

    def _ungrant(self, tp_key: bytes) -> None:
        self._decoded_segments -= self._decoded.pop(tp_key, 0)
        self._undecoded.discard(tp_key)

    def _publish(self, tp_key: bytes, snapshot: PartitionSnapshot) -> None:
        self.snapshots[tp_key] = snapshot
        slot = self._slots.get(tp_key)
        if slot is not None:
            slot.snapshot = snapshot

    def reset(self) -> None:
        """Forget every partition read (the view's entries were removed): each is read again when next asked for."""
        with self.lock:
            self.end_resume()
            self.partitions.clear()
            for tp_key in self._reading:
                self._reading[tp_key] = True
            for tp_key in self.snapshots:
                self._publish(tp_key, _NOTHING)

    def adopt(self, partitions: dict[bytes, PartitionModel]) -> None:
        """Take partitions the view was just loaded with (it held nothing before), instead of reading them back. A
        manager's model takes only those it serves already: its other partitions are read from RocksDB when first
        asked for, so that nothing the load built outlives it (objects kept from a rebuild's transient millions pin
        the allocator's arenas: 100 MiB more after a 600k-record rebuild hosting a tenth of the partitions)."""
        for tp_key, partition in partitions.items():
            with self.lock:
                self._touched(tp_key)
                if self.hosted is not None and tp_key not in self.snapshots:
                    self.partitions.pop(tp_key, None)
                    continue
                self.partitions[tp_key] = partition
                if tp_key in self.snapshots:
                    self._publish(tp_key, self._snapshot_of(tp_key, partition))

    def forget(self, tp_keys: Iterable[bytes]) -> None:
        """Partitions the view was just loaded with, not by this process: each is read again from RocksDB when next
        asked for (a watched one now, for its snapshot)."""
        for tp_key in tp_keys:
            with self.lock:
                self._touched(tp_key)
                self.partitions.pop(tp_key, None)
                if tp_key in self.snapshots:
                    self._publish(tp_key, self._snapshot_of(tp_key, self.get(tp_key)))

    def fold(self, changes: dict[bytes, tuple[TopicIdPartition | None, PartitionChanges]]) -> None:
        """Apply a committed batch; each partition changes whole under the lock, so a lookup sees it before or
        after, never half-way (and the lock is held for one partition at a time, so lookups wait little)."""
        for tp_key, (tp, change) in changes.items():
            with self.lock:
                self._fold_partition(tp_key, tp, change)

    def _fold_partition(self, tp_key: bytes, tp: TopicIdPartition | None, change: PartitionChanges) -> None:
        if tp_key not in self.partitions:  # read from RocksDB, batch included, when first asked for
            self._touched(tp_key)
            return
        partition = self.partitions[tp_key]
        snapshot = self.snapshots.get(tp_key)
        if partition is None:
            if tp is None:  # only deletions for a partition the model never held
                return
            partition = self.partitions[tp_key] = PartitionModel(tp, decoded_answers=tp_key in self._decoded)
        table = partition.table()
        before = {} if snapshot is None else {segment_id: table.stored.get(segment_id.int)
                                               for segment_id in change.segments}
        if change.meta is not None:
            partition.meta = change.meta[0]
            if partition.meta is not None and partition.meta.topic != partition.tp.topic:
                partition.tp = TopicIdPartition(partition.tp.topic_id, partition.meta.topic, partition.tp.partition)
        if change.delete is not None:
            partition.delete = change.delete[0]
        # A new segment's id is both a key of its table and an entry of its epochs' index: one int object for both.
        ids: dict[int, int] = {}
        for segment_id, md in change.segments.items():
            key: int = segment_id.int
            ids[key] = key
            if md is None:
                table.stored.pop(key, None)
            else:
                table.stored[key] = packed.pack(md, table.tp)
        for epoch, lineage in change.lineages.items():
            if lineage is None:
                partition.lineages.pop(epoch, None)
            else:
                partition.lineages[epoch] = lineage
        for (epoch, start), segment in change.index.items():
            index = partition.index.get(epoch)
            if segment is not None:
                if index is None:
                    index = partition.index[epoch] = EpochIndex()
                index.put(start, ids.get(segment.int, segment.int))
            elif index is not None:
                index.remove(start)
                if not index:
                    del partition.index[epoch]
        if partition.empty():
            self.partitions[tp_key] = None
            if snapshot is not None:
                self._publish(tp_key, _GONE if snapshot.deleted else _NOTHING)
        elif snapshot is not None:
            self._publish(tp_key, _folded(snapshot, partition, change, before))


# How many entries `read_partition` decodes between two calls of its `pause`.
PAUSE_EVERY = 32
# How many packed answers `_decoding_answers` unpacks between two (about 0.4 ms of work: a pause costs about 80 us).
UNPACK_PAUSE_EVERY = 256
# How many times `ReadModel.prepare` decodes a resumed partition's answers while folds keep replacing its snapshot.
DECODE_TRIES = 3


def read_partition(families: dict[str, object], tp_key: bytes, pause: Callable[[], None] | None = None
                   ) -> PartitionModel | None:
    """One user partition as the view's column families (rocksdict, raw mode) hold it; None if they hold nothing.
    `pause`, if given, is called every PAUSE_EVERY entries (a background read lets the fetch path's threads run)."""
    topic_id, number = vf.tp_of_key(tp_key)
    raw_meta = families[vf.PARTITION_META].get(tp_key)  # type: ignore[attr-defined]
    meta = None if raw_meta is None else vf.decode_partition_meta(bytes(raw_meta))
    # A partition with content but no bookkeeping never happens in a view the batch wrote; the name is then
    # unknown and only the key identifies it.
    partition = PartitionModel(TopicIdPartition(topic_id, "?" if meta is None else meta.topic, number), meta)
    table = partition.table()
    stored, tp = table.stored, table.tp
    for count, (_key, value) in enumerate(prefixed(families[vf.SEGMENTS], tp_key), 1):
        segment, found = codec.decode_packed_segment(value, tp)
        stored[segment] = found
        if pause is not None and count % PAUSE_EVERY == 0:
            pause()
    raw_delete = families[vf.PARTITIONS].get(tp_key)  # type: ignore[attr-defined]
    if raw_delete is not None:
        partition.delete = vf.decode_partition_delete(bytes(raw_delete))
    for _key, value in prefixed(families[vf.EPOCH_STATE], tp_key):
        lineage = vf.decode_lineage(value)
        partition.lineages[lineage.epoch] = lineage
    # An entry's id as the table's key object where the table has the segment (most entries): one int for both.
    keys = {key: key for key in stored}
    for key, value in prefixed(families[vf.EPOCH_INDEX], tp_key):
        index = partition.index.get(vf.lineage_epoch(key))
        if index is None:
            index = partition.index[vf.lineage_epoch(key)] = EpochIndex()
        # RocksDB iterates in key order, so starts arrive sorted.
        index.starts.append(vf.index_start_offset(key))
        segment = int.from_bytes(value, "big")
        index.segments.append(keys.get(segment, segment))
    return None if partition.empty() else partition


def prefixed(family: object, prefix: bytes, read_opt: object = None) -> Iterator[tuple[bytes, bytes]]:
    """The entries of a column family (rocksdict, raw mode) whose keys start with `prefix`, in key order (`read_opt`:
    rocksdict ReadOptions, else the defaults)."""
    for key, value in family.items(from_key=prefix, read_opt=read_opt):  # type: ignore[attr-defined]
        if not key.startswith(prefix):
            return
        yield bytes(key), bytes(value)
