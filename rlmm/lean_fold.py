"""A worker's fold of a rebuild's records without building their events (rlmm.fresh_load's worker only).

A fold worker (rlmm.fresh_load) folds a share of a new node's backlog and writes it as RocksDB tables; the node reads
those partitions from RocksDB when first asked for, so nothing needs the events the share's records decode to. Most
of a backlog's records are of four plain forms, whose outcome under the rules (rlmm.state) needs only a few of the
record's values:

- a segment's COPY_SEGMENT_FINISHED that its partition does not hold, starting after every segment indexed in each
  of its epochs: FreshState._append_finished's case, which indexes it last and raises each epoch's highest offset;
- a segment's COPY_SEGMENT_STARTED or DELETE_SEGMENT_STARTED that its partition does not hold: the segment is held
  as the record carries it (DELETE_SEGMENT_STARTED also moves the lineage position);
- a segment's DELETE_SEGMENT_FINISHED that its partition does not hold: nothing changes;
- an epoch's checkpoint (per-epoch form) that names no displaced or overwritten segment: the epoch's highest offset
  rises to it, and the epoch no longer owes a checkpoint (or does, when the checkpoint is stale).

For these `LeanFold` reads the record's datum in C (rlmm._avro_reader) and keeps, per user partition, what the view
stores: each segment's record bytes (stored as they are, as the view stores a current record), its epochs' index
entries, highest offsets, owed epochs and lineage position. That costs about a third of decoding the record into its
event and folding that. The first record of a partition that is of any other form, or of these forms with values
that are not plainly within Kafka's ranges, turns the partition over to the FreshState: its segments are decoded
from their bytes and its bookkeeping set as the rules would have left it, and from then on the rules fold its
records. So the tables are those a FreshState writes for the same records (tests/rlmm/test_rlmm_lean_fold.py holds
them equal on the property tests' histories), and any doubt costs time, never a different view.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rlmm import codec
from rlmm import view_format as vf
from rlmm.errors import InvalidArgumentError
from rlmm.events import EpochLineage
from rlmm.types import INT32_MAX, INT64_MAX, RemoteLogSegmentState, TopicIdPartition, values_plainly_in_range
from rlmm.view import FreshState

try:
    from rlmm import _avro_reader
except ImportError:  # built without a C compiler: every record goes through the rules
    _avro_reader = None  # type: ignore[assignment]

_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED.name
_DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED.name
# The states whose record, for a segment not held, holds the segment as it carries it.
_HELD_AS_CARRIED = frozenset({RemoteLogSegmentState.COPY_SEGMENT_STARTED.name,
                              RemoteLogSegmentState.DELETE_SEGMENT_STARTED.name})
_DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED.name


@dataclass(slots=True)
class _Partition:
    """A user partition folded leanly: what the view stores of it."""

    tp: TopicIdPartition  # as the record that created it named it (its bookkeeping keeps that topic name)
    segments: dict[bytes, bytes] = field(default_factory=dict)  # segment id bytes -> its record's bytes
    index: dict[int, list[tuple[int, bytes]]] = field(default_factory=dict)  # epoch -> (start, segment), ascending
    highest: dict[int, int] = field(default_factory=dict)  # epoch -> its highest offset (no displaced segments)
    owed: set[int] = field(default_factory=set)  # the epochs that owe a checkpoint
    position: int | None = None  # lineage position


class LeanFold:
    """Folds the plain records of a share leanly, beside `fresh`, which folds the rest by the rules: hand each
    record to `fold_record`, and before folding any other record into `fresh`, call `before_rules` with its user
    partition. `partition_keys` and `runs` then give both states' partitions and table entries."""

    def __init__(self, fresh: FreshState) -> None:
        self.fresh = fresh
        self._lean: dict[tuple[int, int], _Partition] = {}
        self._ruled: set[tuple[int, int]] = set()  # partitions the FreshState folds
        registry = codec.registry()
        segment = registry.current["segment_record"]
        checkpoint = registry.version("epoch_checkpoint_record", codec.PLAIN_CHECKPOINT_VERSION)
        self._segment = (codec.MAGIC + segment.fingerprint[::-1], segment.program)
        self._checkpoint = (codec.MAGIC + checkpoint.fingerprint[::-1], checkpoint.program)

    def fold_record(self, offset: int, raw_key: bytes, value: bytes | None,
                    skipped_before: bool | None) -> tuple[int, int] | None:
        """Fold one record of a plain form (see the module) and return its user partition (topic id as an int,
        partition); None, having changed nothing, for any other record, which the rules must fold."""
        if value is None or _avro_reader is None:
            return None
        header = value[:codec._HEADER]
        try:
            if header == self._segment[0] and self._segment[1] is not None:
                return self._segment_record(offset, raw_key, _avro_reader.read(self._segment[1], value,
                                                                                 codec._HEADER), value, skipped_before)
            if header == self._checkpoint[0] and self._checkpoint[1] is not None:
                return self._checkpoint_record(raw_key, _avro_reader.read(self._checkpoint[1], value, codec._HEADER))
        except ValueError:  # bytes the C reader does not read exactly: the rules' decoder judges them
            return None
        return None

    def _segment_record(self, offset: int, raw_key: bytes, datum: dict[str, Any], value: bytes,
                        skipped_before: bool | None) -> tuple[int, int] | None:
        topic_text, number, segment_text = datum["topic_id"], datum["partition"], datum["segment_id"]
        if raw_key != f"segment:{topic_text}:{number}:{segment_text}".encode():
            return None
        located = self._locate(topic_text, datum["topic"], number)
        segment = _id_bytes(segment_text)
        if located is None or segment is None:
            return None
        tp, key, held = located
        if held is not None and segment in held.segments:
            return None
        start, end = datum["start_offset"], datum["end_offset"]
        if not values_plainly_in_range(start, end, datum["max_timestamp_ms"], datum["broker_id"],
                                       datum["event_timestamp_ms"], datum["segment_size_in_bytes"]):
            return None
        listed = datum["segment_leader_epochs"]
        if len(listed) == 1:  # most segments: one leader epoch, checked without a loop
            only = listed[0]
            epochs = [(only["epoch"], only["start_offset"])]
            if not (0 <= epochs[0][0] <= INT32_MAX and start <= epochs[0][1] <= end):
                return None
        else:
            epochs = sorted({e["epoch"]: e["start_offset"] for e in listed}.items())
            if not epochs or not all(0 <= epoch <= INT32_MAX and start <= epoch_start <= end
                                     for epoch, epoch_start in epochs):
                return None
        target = datum["state"]
        if target == _DELETE_FINISHED:  # of a segment not held: the rules change nothing
            return key
        if target in _HELD_AS_CARRIED:
            if skipped_before is False and target == _DELETE_STARTED:
                return None  # dropped by the rules (Kafka's cache knows no such segment): they word why
            held = held or self._new(key, tp)
            if target == _DELETE_STARTED:
                held.position = offset  # it unreferences nothing (the segment is in no epoch) but is a change
            held.segments[segment] = value
            return key
        if target != _FINISHED or skipped_before is False:
            return None
        changes = []
        for i, (epoch, epoch_start) in enumerate(epochs):
            entries = held.index.get(epoch) if held is not None else None
            if entries and entries[-1][0] >= epoch_start:
                return None  # it displaces or overwrites: the rules
            # The epoch ends where the next one starts (the lowest start of a later epoch), or with the segment.
            epoch_end = min(s for _, s in epochs[i + 1:]) - 1 if i + 1 < len(epochs) else end
            highest = held.highest.get(epoch) if held is not None else None
            changes.append((epoch, epoch_start, highest is None or highest < epoch_end, epoch_end))
        held = held or self._new(key, tp)
        held.segments[segment] = value
        for epoch, epoch_start, raised, epoch_end in changes:
            held.index.setdefault(epoch, []).append((epoch_start, segment))
            if raised:
                held.highest[epoch] = epoch_end
                held.owed.add(epoch)
        held.position = offset
        return key

    def _checkpoint_record(self, raw_key: bytes, datum: dict[str, Any]) -> tuple[int, int] | None:
        topic_text, number, lineages = datum["topic_id"], datum["partition"], datum["epochs"]
        if datum["whole_partition"] or len(lineages) != 1:
            return None
        (lineage,) = lineages
        epoch, highest = lineage["epoch"], lineage["highest_log_offset"]
        reflects = datum["reflects_offset"]
        if lineage["displaced_segment_ids"] or not 0 <= epoch <= INT32_MAX or \
                not (highest is None or 0 <= highest <= INT64_MAX) or \
                not (reflects is None or 0 <= reflects <= INT64_MAX) or \
                not (0 <= datum["event_timestamp_ms"] <= INT64_MAX and 0 <= datum["broker_id"] <= INT32_MAX) or \
                raw_key != f"epochs:{topic_text}:{number}:{epoch}".encode():
            return None
        located = self._locate(topic_text, datum["topic"], number)
        if located is None:
            return None
        tp, key, held = located
        # rlmm.lineage.apply_checkpoint over an epoch that displaces nothing: the highest offset never goes down;
        # a stale checkpoint (its writer had not seen what this fold applied) leaves the epoch owing one.
        old = held.highest.get(epoch) if held is not None else None
        if highest is not None and (old is None or old < highest):
            held = held or self._new(key, tp)
            held.highest[epoch] = highest
        if held is not None:
            stale = held.position is not None and reflects is not None and reflects < held.position
            if stale:
                held.owed.add(epoch)
            else:
                held.owed.discard(epoch)
        return key

    def _locate(self, topic_text: str, topic: str, number: int
                ) -> tuple[TopicIdPartition, tuple[int, int], _Partition | None] | None:
        """The record's user partition as the rules name it, its key, and its lean state (None: none yet); None
        when the rules fold it, or its values are not a user partition's."""
        try:
            tp = codec._topic_id_partition(topic_text, topic, number)
        except (InvalidArgumentError, ValueError, TypeError):  # the rules' decoder words what is wrong with it
            return None
        key = (tp.topic_id.int, number)
        if key in self._ruled:
            return None
        return tp, key, self._lean.get(key)

    def _new(self, key: tuple[int, int], tp: TopicIdPartition) -> _Partition:
        held = self._lean[key] = _Partition(tp)
        return held

    def before_rules(self, topic_id: uuid.UUID, partition: int) -> None:
        """Hand a partition held leanly to the FreshState, as the rules would have left it, before they fold a
        record of it; from then on they fold all of its records."""
        key = (topic_id.int, partition)
        self._ruled.add(key)
        held = self._lean.pop(key, None)
        if held is None:
            return
        stored = {segment: codec.decode(raw) for segment, raw in held.segments.items()}
        ids = {segment: md.remote_log_segment_id.id for segment, md in stored.items()}  # type: ignore[union-attr]
        self.fresh.take_over(
            held.tp, [(md, held.segments[segment]) for segment, md in stored.items()],  # type: ignore[misc]
            {epoch: ([start for start, _ in entries], {start: ids[segment] for start, segment in entries})
             for epoch, entries in held.index.items()},
            {epoch: EpochLineage.derived(epoch, highest) for epoch, highest in held.highest.items()},
            vf.encode_owed(held.owed), held.position)

    def partition_keys(self) -> list[bytes]:
        """The view's keys of every partition folded (leanly or by the rules)."""
        return [*(vf.tp_key(held.tp.topic_id, held.tp.partition) for held in self._lean.values()),
                *self.fresh.partitions()]

    def runs(self) -> Iterator[tuple[str, list[bytes], list[bytes]]]:
        """The table entries of every partition folded, as FreshState.runs gives them: each family's in key
        order, the content families by name, then the partitions' bookkeeping."""
        entries: dict[str, list[tuple[bytes, bytes]]] = {family: [] for family in (*vf.CONTENT_FAMILIES,
                                                                                    vf.PARTITION_META)}
        segments, lineages, index, metas = (entries[vf.SEGMENTS], entries[vf.EPOCH_STATE], entries[vf.EPOCH_INDEX],
                                            entries[vf.PARTITION_META])
        pack_epoch, pack_offset = vf.EPOCH.pack, vf.OFFSET.pack
        for held in self._lean.values():
            key = vf.tp_key(held.tp.topic_id, held.tp.partition)
            metas.append((key, vf.encode_partition_meta(vf.PartitionMeta(held.tp.topic, vf.encode_owed(held.owed),
                                                                          held.position))))
            segments += [(key + segment, raw) for segment, raw in held.segments.items()]
            lineages += [(key + pack_epoch(epoch), vf.encode_lineage(EpochLineage.derived(epoch, highest)))
                         for epoch, highest in held.highest.items()]
            for epoch, epoch_entries in held.index.items():
                prefix = key + pack_epoch(epoch)
                index += [(prefix + pack_offset(start), segment) for start, segment in epoch_entries]
        ruled = self.fresh.partitions()
        for family, keys, values in self.fresh.runs(ruled):
            entries[family] += zip(keys, values, strict=True)
        for family in (*sorted(vf.CONTENT_FAMILIES), vf.PARTITION_META):
            run = entries.pop(family)
            run.sort()
            yield family, [key for key, _ in run], [value for _, value in run]


def _id_bytes(text: str) -> bytes | None:
    """The 16 bytes of an id in its canonical 36-character text (what uuid.UUID reads it as), else None."""
    if len(text) != 36 or not text[8] == text[13] == text[18] == text[23] == "-":
        return None
    try:
        raw = bytes.fromhex(text.replace("-", ""))
    except ValueError:
        return None
    return raw if len(raw) == 16 else None
