"""The view's committed state, decoded, in memory: what every lookup and the apply path read.

RocksDB stays the durable truth. The model is loaded from it once and then follows it: the applier's batch folds
its changes in right after their WriteBatch is written, one user partition at a time under a short lock, so a
lookup costs a few dict and bisect operations instead of a RocksDB read and an Avro decode.

One writer (the applier's thread) changes the model; any thread reads it through `ReadModel.lock`.
"""

from __future__ import annotations

import bisect
import threading
import uuid
from collections.abc import Container, Iterator
from dataclasses import dataclass, field

from rlmm import view_format as vf
from rlmm.events import EpochLineage
from rlmm.types import RemoteLogSegmentMetadata, RemotePartitionDeleteMetadata, TopicIdPartition


@dataclass(slots=True)
class EpochIndex:
    """One leader epoch's offset index: sorted start offsets and the segment each maps to."""

    starts: list[int] = field(default_factory=list)
    ids: dict[int, uuid.UUID] = field(default_factory=dict)

    def floor(self, offset: int, skip: Container[int] = ()) -> tuple[int, uuid.UUID] | None:
        """The entry with the greatest start <= offset, passing over the starts in `skip`."""
        position = bisect.bisect_right(self.starts, offset)
        while position > 0:
            position -= 1
            start = self.starts[position]
            if start not in skip:
                return start, self.ids[start]
        return None

    def put(self, start: int, segment: uuid.UUID) -> None:
        if start not in self.ids:
            bisect.insort(self.starts, start)
        self.ids[start] = segment

    def remove(self, start: int) -> None:
        if self.ids.pop(start, None) is not None:
            del self.starts[bisect.bisect_left(self.starts, start)]


@dataclass(slots=True)
class PartitionModel:
    """Everything the view holds for one user partition; `meta` is None once the partition is forgotten."""

    tp: TopicIdPartition
    meta: vf.PartitionMeta | None = None
    segments: dict[uuid.UUID, RemoteLogSegmentMetadata] = field(default_factory=dict)
    delete: RemotePartitionDeleteMetadata | None = None
    lineages: dict[int, EpochLineage] = field(default_factory=dict)
    index: dict[int, EpochIndex] = field(default_factory=dict)

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


class ReadModel:
    """Per user partition (keyed by its view key): segments, delete state, lineages, offset index, bookkeeping."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.partitions: dict[bytes, PartitionModel] = {}

    def get(self, tp_key: bytes) -> PartitionModel | None:
        return self.partitions.get(tp_key)

    def fold(self, changes: dict[bytes, tuple[TopicIdPartition | None, PartitionChanges]]) -> None:
        """Apply a committed batch; each partition changes whole under the lock, so a lookup sees it before or
        after, never half-way (and the lock is held for one partition at a time, so lookups wait little)."""
        for tp_key, (tp, change) in changes.items():
            with self.lock:
                self._fold_partition(tp_key, tp, change)

    def _fold_partition(self, tp_key: bytes, tp: TopicIdPartition | None, change: PartitionChanges) -> None:
        partition = self.partitions.get(tp_key)
        if partition is None:
            if tp is None:  # only deletions for a partition the model never held
                return
            partition = self.partitions[tp_key] = PartitionModel(tp)
        if change.meta is not None:
            partition.meta = change.meta[0]
            if partition.meta is not None and partition.meta.topic != partition.tp.topic:
                partition.tp = TopicIdPartition(partition.tp.topic_id, partition.meta.topic, partition.tp.partition)
        if change.delete is not None:
            partition.delete = change.delete[0]
        for segment_id, md in change.segments.items():
            if md is None:
                partition.segments.pop(segment_id, None)
            else:
                partition.segments[segment_id] = md
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
                index.put(start, segment)
            elif index is not None:
                index.remove(start)
                if not index.ids:
                    del partition.index[epoch]
        if partition.empty():
            del self.partitions[tp_key]

    @classmethod
    def load(cls, families: dict[str, object]) -> ReadModel:
        """Build the model from the view's column families (rocksdict column families in raw mode)."""
        model = cls()
        parts = model.partitions

        def partition(key: bytes) -> PartitionModel:
            tp_key = key[:vf.TP_KEY_LEN]
            found = parts.get(tp_key)
            if found is None:
                topic_id, number = vf.tp_of_key(tp_key)
                # A partition with content but no bookkeeping never happens in a view the batch wrote; the
                # name is then unknown and only the key identifies it.
                found = parts[tp_key] = PartitionModel(TopicIdPartition(topic_id, "?", number))
            return found

        for key, value in _items(families[vf.PARTITION_META]):
            meta = vf.decode_partition_meta(value)
            topic_id, number = vf.tp_of_key(key)
            parts[key] = PartitionModel(TopicIdPartition(topic_id, meta.topic, number), meta)
        for key, value in _items(families[vf.SEGMENTS]):
            md = vf.decode_segment(value)
            partition(key).segments[md.remote_log_segment_id.id] = md
        for key, value in _items(families[vf.PARTITIONS]):
            partition(key).delete = vf.decode_partition_delete(value)
        for key, value in _items(families[vf.EPOCH_STATE]):
            lineage = vf.decode_lineage(value)
            partition(key).lineages[lineage.epoch] = lineage
        for key, value in _items(families[vf.EPOCH_INDEX]):
            index = partition(key).index.setdefault(vf.lineage_epoch(key), EpochIndex())
            start = vf.index_start_offset(key)
            # RocksDB iterates in key order, so starts arrive sorted.
            index.starts.append(start)
            index.ids[start] = uuid.UUID(bytes=value)
        return model


def _items(family: object) -> Iterator[tuple[bytes, bytes]]:
    for key, value in family.items():  # type: ignore[attr-defined]
        yield bytes(key), bytes(value)
