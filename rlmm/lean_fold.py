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
event and folding that. The commonest, a COPY_SEGMENT_FINISHED of one leader epoch, is folded in C where
rlmm/_lean_fold.c is built, a run of such records per call (`_segment_record` is its reference; anything it does not
take, it leaves to that), and so are the table entries of each partition's segments and index (`_rows`).
The first record of a partition that is of any other form, or of these forms with values that are not plainly
within Kafka's ranges, turns the partition over to the FreshState: its segments are decoded from their bytes and
its bookkeeping set as the rules would have left it, and from then on the rules fold its records. So the tables
are those a FreshState writes for the same records (tests/rlmm/test_rlmm_lean_fold.py holds them equal on the
property tests' histories), and any doubt costs time, never a different view.
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
from rlmm.types import INT32_MAX, INT64_MAX, RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition
from rlmm.view import FreshState

try:
    from rlmm import _avro_reader
except ImportError:  # built without a C compiler: every record goes through the rules
    _avro_reader = None  # type: ignore[assignment]
try:  # rlmm/_lean_fold.c: the commonest record's fold (_segment_record's first case) in C
    from rlmm import _lean_fold
except ImportError:
    _lean_fold = None  # type: ignore[assignment]

_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED.name
_DELETE_FINISHED = RemoteLogSegmentState.DELETE_SEGMENT_FINISHED.name
# The states whose record, for a segment not held, holds the segment as it carries it.
_HELD_AS_CARRIED = frozenset({RemoteLogSegmentState.COPY_SEGMENT_STARTED.name,
                              RemoteLogSegmentState.DELETE_SEGMENT_STARTED.name})
_DELETE_STARTED = RemoteLogSegmentState.DELETE_SEGMENT_STARTED.name
_UNNAMED: Any = object()
# The fields of the records folded here, as their schemas order them (nested records' fields after their own).
_SEGMENT_FIELDS = ("topic_id", "topic", "partition", "segment_id", "start_offset", "end_offset", "max_timestamp_ms",
                   "broker_id", "event_timestamp_ms", "segment_size_in_bytes",
                   ("segment_leader_epochs", ("epoch", "start_offset")), "custom_metadata", "state", "txn_idx_empty")
_CHECKPOINT_FIELDS = ("topic_id", "topic", "partition",
                      ("epochs", ("epoch", "highest_log_offset", "displaced_segment_ids")), "event_timestamp_ms",
                      "broker_id", "reflects_offset", "whole_partition")


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
        # (topic id text, topic, partition) -> the partition as the rules name it and its key; None: not valid
        self._named: dict[tuple[str, str, int], tuple[TopicIdPartition, tuple[int, int]] | None] = {}
        registry = codec.registry()
        segment = registry.current["segment_record"]
        checkpoint = registry.version("epoch_checkpoint_record", codec.PLAIN_CHECKPOINT_VERSION)
        # The records' headers (marker and schema fingerprint), and the C reader's programs of their schemas, which
        # read their records as tuples: None (the rules fold them) without the reader, or for a schema whose
        # fields are not those this fold takes by position.
        self._segment_header = _header(segment, _SEGMENT_FIELDS)
        self._segment_program = segment.tuples
        self._checkpoint_header = _header(checkpoint, _CHECKPOINT_FIELDS)
        self._checkpoint_program = checkpoint.tuples

    def fold_record(self, offset: int, raw_key: bytes, value: bytes | None,
                    skipped_before: bool | None) -> tuple[int, int] | None:
        """Fold one record of a plain form (see the module) and return its user partition (topic id as an int,
        partition); None, having changed nothing, for any other record, which the rules must fold."""
        if value is None:
            return None
        try:
            if self._segment_header is not None and value.startswith(self._segment_header):
                datum = _avro_reader.read(self._segment_program, value, codec._HEADER)
                if _lean_fold is not None:
                    taken = _lean_fold.finished(self._lean, self._named, self._ruled, self._new, offset, raw_key,
                                                datum, value, skipped_before)
                    if taken is not None:
                        return taken
                return self._segment_record(offset, raw_key, datum, value, skipped_before)
            if self._checkpoint_header is not None and value.startswith(self._checkpoint_header):
                return self._checkpoint_record(raw_key, _avro_reader.read(self._checkpoint_program, value,
                                                                          codec._HEADER))
        except ValueError:  # bytes the C reader does not read exactly: the rules' decoder judges them
            return None
        return None

    def fold_run(self, records: list[Any], start: int, stop_at: dict[int, Any], touched: set[tuple[int, int]]
                 ) -> tuple[int, int]:
        """Fold records of `records` (rlmm.fresh_load's Records, replay order) from `start` on as `fold_record`
        would, as long as each is the commonest form, folded in C (rlmm/_lean_fold.c's `fold_run`), adding their
        partitions to `touched`: the index of the first record not folded so (`start` without the C fold), which the
        caller folds, and how many were. A record of a metadata partition in `stop_at` is not folded here."""
        if _lean_fold is None or self._segment_header is None:
            return start, 0
        return _lean_fold.fold_run(self._lean, self._named, self._ruled, self._new, records, start, stop_at, touched,
                                   self._segment_header, _avro_reader.read, self._segment_program, codec._HEADER)

    def _segment_record(self, offset: int, raw_key: bytes, datum: tuple[Any, ...], value: bytes,
                        skipped_before: bool | None) -> tuple[int, int] | None:
        (topic_text, topic, number, segment_text, start, end, max_timestamp, broker, event_timestamp, size, listed, _,
         target, _) = datum
        if raw_key != f"segment:{topic_text}:{number}:{segment_text}".encode():
            return None
        named = self._named.get((topic_text, topic, number), _UNNAMED)
        if named is _UNNAMED:
            named = self._name(topic_text, topic, number)
        # The canonical text of an id (what uuid.UUID reads as these 16 bytes), else the rules judge it.
        if named is None or len(segment_text) != 36 or \
                not segment_text[8] == segment_text[13] == segment_text[18] == segment_text[23] == "-":
            return None
        try:
            segment = bytes.fromhex(segment_text.replace("-", ""))
        except ValueError:
            return None
        if len(segment) != 16:  # fromhex passes over whitespace, which an id's text does not hold
            return None
        tp, key = named
        if key in self._ruled:
            return None
        held = self._lean.get(key)
        if held is not None and segment in held.segments:
            return None
        # values_plainly_in_range, inline: this runs for most records of a rebuild.
        if not (0 <= start <= end <= INT64_MAX and -1 <= max_timestamp <= INT64_MAX and 0 <= broker <= INT32_MAX
                and 0 <= event_timestamp <= INT64_MAX and 0 <= size <= INT32_MAX):
            return None
        if len(listed) == 1:  # most segments: one leader epoch, checked without a loop
            ((epoch, epoch_start),) = listed
            if not (0 <= epoch <= INT32_MAX and start <= epoch_start <= end):
                return None
            if target == _FINISHED and skipped_before is not False:
                if held is None:
                    held = self._new(key, tp)
                else:
                    entries = held.index.get(epoch)
                    if entries and entries[-1][0] >= epoch_start:
                        return None  # it displaces or overwrites: the rules
                held.segments[segment] = value
                held.index.setdefault(epoch, []).append((epoch_start, segment))
                highest = held.highest.get(epoch)
                if highest is None or highest < end:
                    held.highest[epoch] = end
                    held.owed.add(epoch)
                held.position = offset
                return key
            epochs = [(epoch, epoch_start)]
        else:
            epochs = sorted(dict(listed).items())  # a later entry of an epoch wins, as in the rules' decoder
            if not epochs or not all(0 <= epoch <= INT32_MAX and start <= epoch_start <= end
                                     for epoch, epoch_start in epochs):
                return None
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

    def _checkpoint_record(self, raw_key: bytes, datum: tuple[Any, ...]) -> tuple[int, int] | None:
        topic_text, topic, number, lineages, event_timestamp, broker, reflects, whole_partition = datum
        if whole_partition or len(lineages) != 1:
            return None
        ((epoch, highest, displaced),) = lineages
        if displaced or not 0 <= epoch <= INT32_MAX or not (highest is None or 0 <= highest <= INT64_MAX) or \
                not (reflects is None or 0 <= reflects <= INT64_MAX) or \
                not (0 <= event_timestamp <= INT64_MAX and 0 <= broker <= INT32_MAX) or \
                raw_key != f"epochs:{topic_text}:{number}:{epoch}".encode():
            return None
        named = self._name(topic_text, topic, number)
        if named is None or named[1] in self._ruled:
            return None
        tp, key = named
        held = self._lean.get(key)
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

    def _name(self, topic_text: str, topic: str, number: int) -> tuple[TopicIdPartition, tuple[int, int]] | None:
        """The user partition a record names, as the rules name it, and its key (topic id as an int, partition);
        None when its values are not a user partition's (the rules' decoder words what is wrong)."""
        named = self._named.get((topic_text, topic, number), _UNNAMED)
        if named is _UNNAMED:
            try:
                tp = codec._topic_id_partition(topic_text, topic, number)
                named = (tp, (tp.topic_id.int, number))
            except (InvalidArgumentError, ValueError, TypeError):
                named = None
            self._named[(topic_text, topic, number)] = named
        return named

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
        stored: dict[bytes, RemoteLogSegmentMetadata] = {}
        for segment, raw in held.segments.items():
            md = codec.decode(raw)
            assert isinstance(md, RemoteLogSegmentMetadata), "held from a segment record"
            stored[segment] = md
        ids = {segment: md.remote_log_segment_id.id for segment, md in stored.items()}
        self.fresh.take_over(
            held.tp, [(md, held.segments[segment]) for segment, md in stored.items()],
            {epoch: ([start for start, _ in entries], {start: ids[segment] for start, segment in entries})
             for epoch, entries in held.index.items()},
            {epoch: EpochLineage.derived(epoch, highest) for epoch, highest in held.highest.items()},
            vf.encode_owed(held.owed), held.position)

    def partition_keys(self) -> list[bytes]:
        """The view's keys of every partition folded (leanly or by the rules)."""
        return [vf.tp_key_of(held.tp) for held in self._lean.values()] + \
            [vf.tp_key_of(tp) for tp in self.fresh.user_partitions()]

    def runs(self) -> Iterator[tuple[str, list[bytes], list[bytes]]]:
        """The table entries of every partition folded, as FreshState.runs gives them: each family's in key
        order, the content families by name, then the partitions' bookkeeping."""
        families = (*sorted(vf.CONTENT_FAMILIES), vf.PARTITION_META)
        # Each family's entries by user partition (every key starts with its partition's), each in key order.
        by_partition: dict[str, dict[bytes, tuple[list[bytes], list[bytes]]]] = {family: {} for family in families}
        for family, keys, values in self.fresh.runs(self.fresh.partitions()):
            for key, value in zip(keys, values, strict=True):
                held_keys, held_values = by_partition[family].setdefault(key[:vf.TP_KEY_LEN], ([], []))
                held_keys.append(key)
                held_values.append(value)
        pack_epoch = vf.EPOCH.pack
        segments, lineages = by_partition[vf.SEGMENTS], by_partition[vf.EPOCH_STATE]
        index = by_partition[vf.EPOCH_INDEX]
        rows = _rows if _lean_fold is None else _lean_fold.rows
        for held in self._lean.values():
            key = vf.tp_key_of(held.tp)
            by_partition[vf.PARTITION_META][key] = ([key], [vf.encode_partition_meta(vf.PartitionMeta(
                held.tp.topic, vf.encode_owed(held.owed), held.position))])
            segment_keys, segment_values, index_keys, index_values = rows(key, held.segments, held.index)
            segments[key] = (segment_keys, segment_values)
            index[key] = (index_keys, index_values)
            epochs = sorted(held.highest)  # a non-negative epoch's and offset's packing sorts as the number does
            lineages[key] = ([key + pack_epoch(epoch) for epoch in epochs],
                             [vf.encode_lineage(EpochLineage.derived(epoch, held.highest[epoch])) for epoch in epochs])
        for family in families:
            chunks = by_partition.pop(family)
            keys, values = [], []
            for partition in sorted(chunks):
                keys += chunks[partition][0]
                values += chunks[partition][1]
            yield family, keys, values


def _rows(key: bytes, segments: dict[bytes, bytes], index: dict[int, list[tuple[int, bytes]]]
          ) -> tuple[list[bytes], list[bytes], list[bytes], list[bytes]]:
    """A partition held leanly as its entries of the segments and epoch_index families, each in key order (a
    non-negative epoch's and offset's packing sorts as the number does, and each epoch's entries ascend by start):
    rlmm/_lean_fold.c's `rows` where it is built."""
    ordered = sorted(segments)
    pack_epoch, pack_offset = vf.EPOCH.pack, vf.OFFSET.pack
    index_keys: list[bytes] = []
    index_values: list[bytes] = []
    for epoch in sorted(index):
        prefix, entries = key + pack_epoch(epoch), index[epoch]
        index_keys += [prefix + pack_offset(start) for start, _ in entries]
        index_values += [segment for _, segment in entries]
    return [key + segment for segment in ordered], [segments[segment] for segment in ordered], index_keys, index_values


def _header(version: codec.SchemaVersion, fields: tuple[Any, ...]) -> bytes | None:
    """The header of records of `version` (marker and fingerprint) when the C reader reads them as tuples of
    `fields` (a field of an array of records: (name, its records' fields)); else None."""
    def names(record: dict[str, Any]) -> tuple[Any, ...]:
        return tuple((field["name"], names(field["type"]["items"])) if isinstance(field["type"], dict)
                     and field["type"].get("type") == "array" and isinstance(field["type"]["items"], dict)
                     and field["type"]["items"].get("type") == "record" else field["name"]
                     for field in record["fields"])

    if _avro_reader is None or version.tuples is None or names(version.plain) != fields:
        return None
    return codec.MAGIC + version.fingerprint[::-1]
