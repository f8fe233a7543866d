"""The metadata events tierlog appends to its topic, and the record keys compaction works on.

One key per segment, one per partition's delete state, one per leader epoch of a partition's lineage; see DESIGN.md.
"""

from __future__ import annotations

import uuid
import zlib
from dataclasses import dataclass, fields
from functools import lru_cache
from typing import Literal, cast

from rlmm.errors import InvalidArgumentError
from rlmm.types import (
    INT32_MAX,
    INT64_MAX,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
    require_range,
    slot_maker,
    uuid_from_text,
)

_INT32 = (0, INT32_MAX, "a non-negative int32")
_INT64 = (0, INT64_MAX, "a non-negative int64")


@dataclass(frozen=True, slots=True)
class EpochLineage:
    """What compaction could otherwise lose about one leader epoch of a user partition.

    `displaced_segment_ids`: finished segments a newer upload moved out of the epoch's offset index (Kafka's
    unreferenced ids; listed in the epoch). `overwritten_segment_ids`: finished segments whose entry a later
    COPY_SEGMENT_FINISHED from the same start took without displacing them (it ended the epoch below its highest
    offset): Kafka's offsetToId.put drops them from the epoch's index and does not add them to the unreferenced
    ids, so the epoch's listing leaves them out until their delete starts."""

    epoch: int
    highest_log_offset: int | None
    displaced_segment_ids: frozenset[uuid.UUID] = frozenset()
    overwritten_segment_ids: frozenset[uuid.UUID] = frozenset()

    def __post_init__(self) -> None:
        require_range("EpochLineage", "epoch", self.epoch, *_INT32)
        if self.highest_log_offset is not None:
            require_range("EpochLineage", "highest_log_offset", self.highest_log_offset, *_INT64)
        for name in ("displaced_segment_ids", "overwritten_segment_ids"):
            ids = getattr(self, name)
            if not isinstance(ids, frozenset) or not all(isinstance(s, uuid.UUID) for s in ids):
                raise InvalidArgumentError(f"EpochLineage.{name} must be a frozenset of UUIDs, got {ids!r}")
        both = self.displaced_segment_ids & self.overwritten_segment_ids
        if both:
            raise InvalidArgumentError(
                f"EpochLineage of epoch {self.epoch} holds segments both displaced and overwritten: "
                f"{sorted(map(str, both))}")

    @classmethod
    def from_record(cls, epoch: int, highest_log_offset: int | None, displaced_segment_ids: frozenset[uuid.UUID],
                    overwritten_segment_ids: frozenset[uuid.UUID] = frozenset()) -> EpochLineage:
        """Build one from values a schema-typed decoder produced (ints, frozensets of UUIDs): when they are plainly
        within range the checks are skipped, else the full constructor judges and names what is wrong."""
        if 0 <= epoch <= INT32_MAX and (highest_log_offset is None or 0 <= highest_log_offset <= INT64_MAX) and (
                not overwritten_segment_ids or overwritten_segment_ids.isdisjoint(displaced_segment_ids)):
            return cls.derived(epoch, highest_log_offset, displaced_segment_ids, overwritten_segment_ids)
        return cls(epoch, highest_log_offset, displaced_segment_ids, overwritten_segment_ids)

    @classmethod
    def derived(cls, epoch: int, highest_log_offset: int | None,
                displaced_segment_ids: frozenset[uuid.UUID] = frozenset(),
                overwritten_segment_ids: frozenset[uuid.UUID] = frozenset()) -> EpochLineage:
        """A lineage the rules derive from values already checked (a stored lineage, an accepted segment), built
        without checking them again: a rebuild derives one per finished segment."""
        return cast(EpochLineage, _make_lineage(epoch, highest_log_offset, displaced_segment_ids,
                                                overwritten_segment_ids))


@dataclass(frozen=True, slots=True)
class EpochCheckpoint:
    """The derived lineage of leader epochs of a user partition, written after events that changed it.

    `reflects_offset`: the metadata offset of the newest lineage-changing record its writer had applied (None in
    checkpoints written before tierlog stamped them); see rlmm.lineage.
    `whole_partition`: the epochs are every epoch of the partition, under the partition's one `epochs:` key (what
    tierlog wrote before it keyed checkpoints per epoch; still read). Otherwise they are the epochs that owed a
    checkpoint, and on the topic each epoch is a record of its own under its own key (`checkpoint_records`), so a
    checkpoint costs the epochs it changes, not every epoch the partition ever had.
    """

    topic_id_partition: TopicIdPartition
    epochs: tuple[EpochLineage, ...]
    event_timestamp_ms: int
    broker_id: int
    reflects_offset: int | None = None
    whole_partition: bool = True

    def __post_init__(self) -> None:
        owner = "EpochCheckpoint"
        if not isinstance(self.topic_id_partition, TopicIdPartition):
            raise InvalidArgumentError(f"{owner}.topic_id_partition must be a TopicIdPartition, "
                                       f"got {type(self.topic_id_partition).__name__}")
        if not all(isinstance(lineage, EpochLineage) for lineage in self.epochs):
            raise InvalidArgumentError(f"{owner}.epochs must hold EpochLineage values, got {self.epochs!r}")
        epochs = [lineage.epoch for lineage in self.epochs]
        if len(set(epochs)) != len(epochs):
            raise InvalidArgumentError(f"{owner}.epochs names a leader epoch twice: {sorted(epochs)}")
        require_range(owner, "event_timestamp_ms", self.event_timestamp_ms, *_INT64)
        require_range(owner, "broker_id", self.broker_id, *_INT32)
        if self.reflects_offset is not None:
            require_range(owner, "reflects_offset", self.reflects_offset, *_INT64)
        if not self.whole_partition and not self.epochs:
            raise InvalidArgumentError(f"{owner} of some epochs of {self.topic_id_partition} names no epoch")


_make_lineage = slot_maker(EpochLineage, [f.name for f in fields(EpochLineage)])

MetadataEvent = RemoteLogSegmentMetadata | RemotePartitionDeleteMetadata | EpochCheckpoint

KeyKind = Literal["segment", "partition-delete", "epochs"]
# An encoded key's fields, in order, joined by KEY_SEPARATOR; readers that cannot call RecordKey.decode (Spark
# columns) split by these. The fourth field is a segment id (segment keys) or a leader epoch (`epochs:` keys).
KEY_SEPARATOR = ":"
KEY_FIELDS = ("kind", "topic_id", "partition", "segment_id")


@dataclass(frozen=True, slots=True)
class RecordKey:
    """The compaction key of a metadata record: `<kind>:<topic id>:<partition>[:<segment id> | :<leader epoch>]`.

    An `epochs:` key names one leader epoch of the partition; without an epoch it is the whole-partition key of
    the checkpoints tierlog wrote before (still read, and tombstoned with the partition)."""

    kind: KeyKind
    topic_id: uuid.UUID
    partition: int
    segment_id: uuid.UUID | None = None
    epoch: int | None = None

    def encode(self) -> bytes:
        fields = [self.kind, str(self.topic_id), str(self.partition)]
        if self.segment_id is not None:
            fields.append(str(self.segment_id))
        if self.epoch is not None:
            fields.append(str(self.epoch))
        return KEY_SEPARATOR.join(fields).encode()

    @classmethod
    def decode(cls, raw: bytes) -> RecordKey:
        try:
            if raw.startswith(SEGMENT_KEY_PREFIX):
                return cls("segment", *segment_key_ids(raw))
            return _user_partition_key(raw)
        except (UnicodeDecodeError, ValueError):
            pass
        raise InvalidArgumentError(f"not a tierlog metadata record key: {raw!r}")

    def same_user_partition(self, tp: TopicIdPartition) -> bool:
        return self.topic_id == tp.topic_id and self.partition == tp.partition


_make_key = slot_maker(RecordKey, [f.name for f in fields(RecordKey)])
SEGMENT_KEY_PREFIX = b"segment" + KEY_SEPARATOR.encode()


def segment_key_ids(raw: bytes) -> tuple[uuid.UUID, int, uuid.UUID]:
    """(topic id, partition, segment id) of an encoded segment key, without building a RecordKey (a rebuild checks
    every segment tombstone against its view); ValueError or UnicodeDecodeError for anything else."""
    parts = raw.decode().split(KEY_SEPARATOR)
    if len(parts) != 4 or parts[0] != "segment":
        raise ValueError(f"not a segment key: {raw!r}")
    return _topic_id(parts[1]), int(parts[2]), uuid_from_text(parts[3])


# A rebuild decodes millions of keys naming a few thousand user partitions: each topic id, and each key of a user
# partition's own records, is parsed once.
@lru_cache(maxsize=65536)
def _topic_id(text: str) -> uuid.UUID:
    return uuid.UUID(text)


@lru_cache(maxsize=65536)
def _user_partition_key(raw: bytes) -> RecordKey:
    parts = raw.decode().split(KEY_SEPARATOR)
    kind = parts[0]
    if kind in ("partition-delete", "epochs") and len(parts) == 3:
        return RecordKey(kind, _topic_id(parts[1]), int(parts[2]))  # type: ignore[arg-type]
    if kind == "epochs" and len(parts) == 4:
        epoch = int(parts[3])
        require_range("RecordKey", "epoch", epoch, *_INT32)
        return RecordKey("epochs", _topic_id(parts[1]), int(parts[2]), epoch=epoch)
    raise ValueError(kind)


def segment_key(segment_id: RemoteLogSegmentId) -> RecordKey:
    # Without the frozen constructor's checks (the id's parts are checked): a rebuild builds one per segment record.
    tp = segment_id.topic_id_partition
    return cast(RecordKey, _make_key("segment", tp.topic_id, tp.partition, segment_id.id, None))


def partition_delete_key(tp: TopicIdPartition) -> RecordKey:
    return RecordKey("partition-delete", tp.topic_id, tp.partition)


def epochs_key(tp: TopicIdPartition) -> RecordKey:
    """The key of a whole-partition checkpoint (the format before per-epoch keys)."""
    return RecordKey("epochs", tp.topic_id, tp.partition)


def epoch_key(tp: TopicIdPartition, epoch: int) -> RecordKey:
    """The key of one leader epoch's checkpoints: compaction keeps the newest of each epoch."""
    return RecordKey("epochs", tp.topic_id, tp.partition, epoch=epoch)


def key_of(event: MetadataEvent) -> RecordKey:
    if isinstance(event, RemoteLogSegmentMetadata):
        return segment_key(event.remote_log_segment_id)
    if isinstance(event, RemotePartitionDeleteMetadata):
        return partition_delete_key(event.topic_id_partition)
    if event.whole_partition:
        return epochs_key(event.topic_id_partition)
    if len(event.epochs) != 1:
        raise InvalidArgumentError(
            f"a checkpoint of {len(event.epochs)} epochs of {event.topic_id_partition} has no record key: "
            f"append it as one record per epoch (rlmm.lineage.checkpoint_records)")
    return epoch_key(event.topic_id_partition, event.epochs[0].epoch)


def metadata_partition_for(topic_id: uuid.UUID, partition: int, num_partitions: int) -> int:
    """Every event of one user partition goes to one metadata partition, so its events are ordered."""
    return zlib.crc32(topic_id.bytes + partition.to_bytes(4, "big")) % num_partitions


def clear_caches() -> None:
    """Empty the decoding caches (a node clears them once a backlog is applied; they refill as needed)."""
    _topic_id.cache_clear()
    _user_partition_key.cache_clear()
