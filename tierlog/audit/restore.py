"""Restoring tierlog's metadata topic after it was lost: the state the bucket still holds, as the records of a new
topic that replays to it.

The state comes from the newest snapshot plus the audit archive after it (the view the lost topic made, exactly), or,
without either, from the segment objects alone (what their keys and packed indexes say; the rest is reported). It is
written as one record per segment (its full state), one epoch checkpoint per leader epoch, and each partition's
delete state, which a scratch view replays to the same view digest before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message
from confluent_kafka.admin import AdminClient

from rlmm import codec, state
from rlmm.archive import ARCHIVE_ROOT, parse_archive_key
from rlmm.bootstrap import LOCATION_KEY, list_snapshots, snapshot_prefix
from rlmm.errors import ConfigError, RemoteStorageError
from rlmm.event_log import EventProducer, OffsetReader, check_topic
from rlmm.events import EpochCheckpoint, RecordKey, key_of, metadata_partition_for
from rlmm.manager import RemoteLogMetadataManager
from rlmm.snapshot import apply_archived
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from rlmm.view import ConsumedRecord, MetadataView, apply_records
from rsm import custom_metadata
from rsm.backend import ObjectInfo, StorageBackend, read_all
from rsm.custom_metadata import SegmentCustomMetadata
from rsm.keys import INDEXES_SUFFIX, LOG_SUFFIX, ObjectKey, parse_object_key, partition_prefix
from rsm.packed_index import PackedIndexLayout, extract, parse_header
from rsm.snapshot_source import BucketSnapshotSource
from rsm.types import IndexType
from tierlog.audit.archiver import list_archive_files
from tierlog.audit.snapshots import SnapshotSettings, archived_records, materialize_newest

_BATCH = 5000
# Segments whose objects are read at once: each costs two small requests, and a bucket holds up to millions.
READERS = 16
_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED

# What the segment objects cannot say, for every partition restored from them alone (`RestoredState.unknown`).
OBJECTS_UNKNOWN: Mapping[str, str] = {
    "broker_id": "not stored in the bucket; set to the broker.id of this run",
    "event_timestamp_ms": "not stored in the bucket; set to the time the store wrote each segment's .indexes object",
    "state": "a segment being deleted (DELETE_SEGMENT_STARTED) looks like a finished copy: every complete segment "
             "comes back COPY_SEGMENT_FINISHED, and retention deletes the expired ones again",
    "highest_offset_for_epoch": "known only from the segments still in the bucket: an epoch whose newest segments "
                                "retention deleted answers lower than before (the broker then resumes copying from "
                                "the segments it still has)",
    "partition_delete_state": "not stored in the bucket: a partition whose remote data was being deleted comes back "
                              "live, and its broker deletes it again",
}
NO_TIMESTAMPS = ("max_timestamp_ms", "segments {ids} hold no record timestamp: set to the time the store wrote the "
                 ".log object (Kafka used the segment file's modification time)")
OVERLAPS = ("segment_lineage", "segments {ids} overlap an earlier segment (an upload repeated by a new leader, or a "
            "copy whose metadata never finished): the later upload is taken as the newer, as Kafka's rule does")


class RestoreError(RemoteStorageError):
    """The metadata topic cannot be restored as asked: the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class SkippedObject:
    key: str
    reason: str


@dataclass
class RestoredState:
    """The state to write, in a scratch view, and what a report says about where it came from."""

    view: MetadataView
    source: str  # what it was built from, in words
    # Per user partition (as `topic-partition (topic id)`): the fields it could not know, and why.
    unknown: dict[str, dict[str, str]] = field(default_factory=dict)
    skipped: list[SkippedObject] = field(default_factory=list)  # objects that could not be read: not restored
    orphans: list[SkippedObject] = field(default_factory=list)  # unfinished copies, not part of any state
    notes: list[str] = field(default_factory=list)  # what the operator should know, nothing lost
    # The time of the newest metadata record the state holds (a snapshot's time, or the newest archived record's).
    newest_record_ms: int = 0

    def close(self) -> None:
        self.view.close()


def partition_name(tp: TopicIdPartition) -> str:
    return f"{tp.topic}-{tp.partition} ({tp.topic_id})"


# --- the state from the newest snapshot and the audit archive ----------------------------------------------------

def snapshot_topic_ids(store: StorageBackend, location: str, metadata_topic: str) -> list[str]:
    """The topic ids (incarnations) of `metadata_topic` that have snapshots under `location`, newest snapshot first.
    A restore looks at every one: the lost topic's id is gone with it."""
    if not location.strip("/"):
        return []
    root = snapshot_prefix(location, metadata_topic, "")[:-1]  # the directory of every incarnation's directory
    ids = {info.key[len(root):].split("/", 1)[0] for info in store.list(root) if "/" in info.key[len(root):]}
    source = BucketSnapshotSource(store)
    newest = {topic_id: refs[0].created_ms for topic_id in ids
              if (refs := list_snapshots(source, location, metadata_topic, topic_id))}
    return sorted(newest, key=lambda topic_id: newest[topic_id], reverse=True)


def recover_from_archive(store: StorageBackend, metadata_topic: str, snapshot_location: str, work: Path
                         ) -> RestoredState | None:
    """The view the lost topic made: the newest snapshot that loads (of any incarnation) plus every archived record
    after its end offsets; None when the bucket holds neither a snapshot nor an archive file of the topic."""
    view: MetadataView | None = None
    described = "no snapshot"
    snapshot_ms = 0
    for topic_id in snapshot_topic_ids(store, snapshot_location, metadata_topic):
        candidate, created_ms = materialize_newest(store, SnapshotSettings(snapshot_location, metadata_topic),
                                                   topic_id, work / f"snapshot-{topic_id.replace('/', '_')}")
        if created_ms:
            view, snapshot_ms = candidate, created_ms
            described = f"the snapshot of topic id {topic_id} taken at {created_ms} ms"
            break
        candidate.close()
    files = list_archive_files(store, metadata_topic)
    if view is None and not files:
        return None
    view = view or MetadataView(work / "archive")
    base = view.applied_offsets(metadata_topic)
    restored = RestoredState(view, "", newest_record_ms=snapshot_ms)
    datums = _checked(archived_records(store, metadata_topic, base), base, restored)
    ends = apply_archived(view, metadata_topic, datums)
    read = sum(ends.get(p, 0) - base.get(p, 0) for p in ends)
    restored.source = (f"{described} plus the audit archive after it ({len(files)} files under "
                       f"{ARCHIVE_ROOT}/{metadata_topic}/, up to offsets {dict(sorted(ends.items()))}, "
                       f"{read} offsets past the snapshot)")
    return restored


def _checked(datums: Iterable[dict[str, Any]], base: Mapping[int, int], restored: RestoredState
             ) -> Iterator[dict[str, Any]]:
    """The datums, noting each hole in a partition's offsets. Compaction removes only records a newer record of the
    same key supersedes, so a hole the archiver reported as an audit gap loses no state; a hole right after the
    snapshot can also be archive files deleted by hand, which the operator should know of."""
    expected = dict(base)
    for datum in datums:
        partition, offset = datum["metadata_partition"], datum["offset"]
        if offset > expected.get(partition, 0):
            restored.notes.append(
                f"the archive of metadata partition {partition} has no record at offsets "
                f"{expected.get(partition, 0)}..{offset - 1}: an audit gap (compaction removed superseded records "
                f"before they were archived; no state is lost), unless archive files were deleted")
        expected[partition] = max(expected.get(partition, 0), offset + 1)
        restored.newest_record_ms = max(restored.newest_record_ms, datum["timestamp_ms"])
        yield datum


# --- the state from the segment objects alone ----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class SegmentObjects:
    """One segment's objects in the bucket, as their keys name them."""

    key: ObjectKey
    log: ObjectInfo | None
    indexes: ObjectInfo | None

    @property
    def id(self) -> RemoteLogSegmentId:
        return RemoteLogSegmentId(self.key.topic_id_partition, self.key.segment_id)

    @property
    def first(self) -> ObjectInfo:
        """The .log object, else the .indexes one (one of them exists)."""
        found = self.log or self.indexes
        assert found is not None
        return found


def segment_objects(objects: Iterable[ObjectInfo]) -> list[SegmentObjects]:
    """The segments a bucket listing holds (every other object left out), by partition and start offset."""
    found: dict[tuple[uuid.UUID, int, uuid.UUID], dict[str, Any]] = {}
    for info in objects:
        parsed = parse_object_key(info.key)
        if parsed is None:
            continue
        entry = found.setdefault((parsed.topic_id, parsed.partition, parsed.segment_id), {"key": parsed})
        entry[parsed.suffix] = info
    segments = [SegmentObjects(e["key"], e.get(LOG_SUFFIX), e.get(INDEXES_SUFFIX)) for e in found.values()]
    return sorted(segments, key=lambda s: (s.key.topic, str(s.key.topic_id), s.key.partition, s.key.start_offset,
                                           (s.indexes or s.first).last_modified_ms or 0))


class UnreadableSegment(Exception):
    """A segment's objects do not say what its metadata needs; the message says what is missing."""


_OFFSET_ENTRY = struct.Struct(">iI")  # relative offset, position in the .log
_TIME_ENTRY = struct.Struct(">qi")  # timestamp, relative offset
_BATCH_HEAD = struct.Struct(">qi")  # base offset, length of the rest
_CHECKPOINT_LINE = re.compile(rb"^\s*(\d+)\s+(\d+)\s*$")


def read_segment(store: StorageBackend, objects: SegmentObjects, broker_id: int
                 ) -> tuple[RemoteLogSegmentMetadata, bool]:
    """A complete segment's metadata from its objects, as Kafka's RemoteLogManager made it when it copied it, and
    whether its max timestamp is known.

    Exact: start offset and id (the key), size (the .log object), leader epochs (the leader-epoch checkpoint in the
    packed index, cut at the start offset as Kafka cuts it), end offset (the last offset of the .log's last record
    batch: Kafka's next segment base offset - 1, the same for every log that tiers), max timestamp (the time index's
    last entry, which Kafka appends when it rolls the segment, and the tail batches' max timestamps), custom
    metadata (the packed index's section table), txn_idx_empty (the transaction section). Not stored: broker id
    (`broker_id`) and event time (when the store wrote the .indexes object)."""
    assert objects.log is not None and objects.indexes is not None
    key = objects.key
    where = objects.indexes.key
    packed = read_all(store.get_range(where, 0))
    try:
        layout = parse_header(packed, where)
        sections = extract(packed, 0, layout.sections, where)
    except RemoteStorageError as exc:
        raise UnreadableSegment(str(exc)) from exc
    epochs = leader_epochs(sections.get(IndexType.LEADER_EPOCH, b""), key.start_offset)
    if not epochs:
        raise UnreadableSegment(f"its packed index {where} holds no leader epoch at or before offset "
                                f"{key.start_offset}, and a segment's leader epochs are never empty")
    position = last_offset_index_position(sections.get(IndexType.OFFSET, b""))
    tail = read_all(store.get_range(objects.log.key, position)) if position < objects.log.size else b""
    last_offset, tail_max_ts = scan_batches(tail, objects.log.key, position)
    end = key.start_offset if last_offset is None else last_offset
    if last_offset is None or end < key.start_offset:
        raise UnreadableSegment(f"{objects.log.key} holds no record batch after byte {position}")
    max_ts = max(last_time_index_timestamp(sections.get(IndexType.TIMESTAMP, b"")), tail_max_ts)
    timestamped = max_ts >= 0
    if not timestamped:
        max_ts = objects.log.last_modified_ms or 0
    txn = layout.get(IndexType.TRANSACTION)
    hashed = not objects.log.key.startswith(partition_prefix(key.topic_id_partition, False))
    event_ms = objects.indexes.last_modified_ms or int(time.time() * 1000)
    return RemoteLogSegmentMetadata(
        objects.id, key.start_offset, end, max_ts, broker_id, event_ms, objects.log.size,
        {epoch: start for epoch, start in epochs.items() if start <= end},
        custom_metadata.encode(SegmentCustomMetadata(PackedIndexLayout(layout.sections), hashed)),
        _FINISHED, txn is None or txn.length == 0), timestamped


def leader_epochs(checkpoint: bytes, start_offset: int) -> dict[int, int]:
    """A segment's leader epochs from the checkpoint Kafka hands the RSM (`0\\n<n>\\n<epoch> <start>\\n...`, every
    epoch from the log start up to the next segment): Kafka's epochEntriesInRange, whose entries at or before the
    segment's start collapse into the last of them, starting at the segment's start."""
    entries = []
    for line in checkpoint.splitlines()[2:]:
        match = _CHECKPOINT_LINE.match(line)
        if match is not None:
            entries.append((int(match[1]), int(match[2])))
    before = [epoch for epoch, start in entries if start <= start_offset]
    epochs = {before[-1]: start_offset} if before else {}
    epochs.update((epoch, start) for epoch, start in entries if start > start_offset)
    return epochs


def last_offset_index_position(index: bytes) -> int:
    """The .log position of the offset index's last entry (0 for an empty index): the last record batches follow."""
    position = 0
    previous = -1
    for relative, at in _OFFSET_ENTRY.iter_unpack(index[: len(index) - len(index) % _OFFSET_ENTRY.size]):
        if relative <= previous:  # past the entries written (a preallocated index Kafka did not trim)
            break
        previous, position = relative, at
    return position


def last_time_index_timestamp(index: bytes) -> int:
    """The time index's greatest timestamp (-1 for none): Kafka appends the segment's max timestamp when it rolls."""
    newest = -1
    for timestamp, _relative in _TIME_ENTRY.iter_unpack(index[: len(index) - len(index) % _TIME_ENTRY.size]):
        if timestamp <= newest:
            break
        newest = timestamp
    return newest


def scan_batches(data: bytes, where: str, position: int) -> tuple[int | None, int]:
    """The last offset and the max timestamp of the record batches in `data` (a .log from a batch boundary on).

    Magic 2 batches carry lastOffsetDelta and maxTimestamp in their header; in magic 0 and 1 message sets the
    offset of a (wrapper) message is its last offset, and magic 1 carries its timestamp."""
    last: int | None = None
    max_ts = -1
    at = 0
    while at + _BATCH_HEAD.size <= len(data):
        base, length = _BATCH_HEAD.unpack_from(data, at)
        end = at + _BATCH_HEAD.size + length
        if length <= 0 or end > len(data) or at + 17 > len(data):
            raise UnreadableSegment(f"{where} has a truncated record batch at byte {position + at}")
        magic = data[at + 16]
        if magic >= 2:
            (delta,) = struct.unpack_from(">i", data, at + 23)
            (batch_ts,) = struct.unpack_from(">q", data, at + 35)
            last, max_ts = base + delta, max(max_ts, batch_ts)
        else:
            last = base
            if magic == 1:
                max_ts = max(max_ts, struct.unpack_from(">q", data, at + 18)[0])
        at = end
    return last, max_ts


def recover_from_objects(store: StorageBackend, work: Path, broker_id: int,
                         progress: Callable[[int, int], None] | None = None) -> RestoredState:
    """The state the segment objects alone say: every segment whose .log and .indexes both exist, as a finished
    copy, in start offset order (a later upload of the same range after an earlier one); the rest reported."""
    segments = segment_objects(store.list(""))
    restored = RestoredState(MetadataView(work / "objects"), f"the segment objects in the bucket ({len(segments)} "
                                                             "segments listed)")
    add_from_objects(restored, store, segments, broker_id, progress=progress)
    return restored


def _read_complete(store: StorageBackend, objects: SegmentObjects, broker_id: int
                   ) -> tuple[RemoteLogSegmentMetadata, bool] | SkippedObject:
    """`read_segment` of a complete segment; for any other, or one unreadable, what the report says of it."""
    if objects.log is None:
        return SkippedObject(objects.first.key, "a .indexes object without its .log: the segment's data is gone")
    if objects.indexes is None:
        return SkippedObject(objects.log.key, "a .log without its .indexes: an unfinished copy (the .indexes object "
                                              "is written last)")
    try:
        return read_segment(store, objects, broker_id)
    except UnreadableSegment as exc:
        return SkippedObject(objects.log.key, str(exc))


def add_from_objects(restored: RestoredState, store: StorageBackend, segments: list[SegmentObjects], broker_id: int,
                     unknown: Mapping[str, str] = OBJECTS_UNKNOWN, progress: Callable[[int, int], None] | None = None
                     ) -> list[RemoteLogSegmentMetadata]:
    """Add the complete ones of `segments` to the state as finished copies, reporting the rest, and `unknown` (what
    the objects could not say) for each partition they add to; the segments added."""
    found: list[RemoteLogSegmentMetadata] = []
    untimed: list[RemoteLogSegmentMetadata] = []
    with ThreadPoolExecutor(max_workers=READERS, thread_name_prefix="tierlog-restore") as pool:
        # Two requests per segment (its packed index, its .log's tail), READERS at a time; answers in listing order.
        read = pool.map(lambda objects: _read_complete(store, objects, broker_id), segments)
        for count, (objects, result) in enumerate(zip(segments, read, strict=True), 1):
            if progress:
                progress(count, len(segments))
            if isinstance(result, SkippedObject):
                (restored.orphans if objects.indexes is None else restored.skipped).append(result)
                continue
            md, timestamped = result
            found.append(md)
            if not timestamped:
                untimed.append(md)
    _apply_segments(restored.view, found)
    for md in found:
        restored.unknown.setdefault(partition_name(md.topic_id_partition), {}).update(unknown)
    _note_by_partition(restored, untimed, NO_TIMESTAMPS)
    _note_by_partition(restored, _overlapping(found), OVERLAPS)
    return found


def _note_by_partition(restored: RestoredState, segments: list[RemoteLogSegmentMetadata],
                       note: tuple[str, str]) -> None:
    by_partition: dict[TopicIdPartition, list[str]] = defaultdict(list)
    for md in segments:
        by_partition[md.topic_id_partition].append(str(md.remote_log_segment_id.id))
    for tp, ids in by_partition.items():
        restored.unknown.setdefault(partition_name(tp), {})[note[0]] = note[1].format(ids=", ".join(ids))


def _overlapping(segments: list[RemoteLogSegmentMetadata]) -> list[RemoteLogSegmentMetadata]:
    """Segments that start at or before the end of an earlier segment of their partition."""
    found = []
    reached: dict[TopicIdPartition, int] = {}
    for md in segments:  # by partition and start offset
        tp = md.topic_id_partition
        if tp in reached and md.start_offset <= reached[tp]:
            found.append(md)
        reached[tp] = max(reached.get(tp, -1), md.end_offset)
    return found


def _apply_segments(view: MetadataView, segments: list[RemoteLogSegmentMetadata]) -> None:
    """Apply each segment's history (`segment_history`) to the view, in the order given, as a node reading them."""
    offset = 0
    batch: list[ConsumedRecord] = []
    for md in segments:
        for event in segment_history(md, view.segment(md.remote_log_segment_id)):
            batch.append(ConsumedRecord(0, offset, key_of(event), event))
            offset += 1
        if len(batch) >= _BATCH:
            apply_records(view, "restore", batch, {0: offset})
            batch = []
    apply_records(view, "restore", batch, {0: offset})


def segment_history(md: RemoteLogSegmentMetadata, held: RemoteLogSegmentMetadata | None = None
                    ) -> list[RemoteLogSegmentMetadata]:
    """The records that bring a segment to its state `md` under Kafka's rules, where a reader applying every record
    ignores an update of a segment it does not hold: its add (COPY_SEGMENT_STARTED, without the custom metadata
    the copy returns), unless `held` already, then its state. Compaction later keeps only the second."""
    if md.state is RemoteLogSegmentState.COPY_SEGMENT_STARTED or held is not None:
        return [md]
    return [dataclasses.replace(md, state=RemoteLogSegmentState.COPY_SEGMENT_STARTED, custom_metadata=None), md]


def partition_delete_history(delete: RemotePartitionDeleteMetadata) -> list[RemotePartitionDeleteMetadata]:
    """The delete states a partition went through to reach `delete`, each a valid transition from the one before."""
    return [dataclasses.replace(delete, state=step) for step in RemotePartitionDeleteState
            if step.value <= delete.state.value]
def compare_with_objects(restored: RestoredState, store: StorageBackend, newest_archived_ms: int, broker_id: int
                         ) -> list[RemoteLogSegmentMetadata]:
    """Hold the state from the archive against the segment objects in the bucket; the segments added.

    Complete segments the state does not know whose .indexes object was written after the newest archived record are
    copies whose metadata went with the topic before the archiver read it: added from their objects. Older unknown
    ones are orphans (copies whose metadata never finished), reported. Finished segments without objects are noted:
    deleted after the archive's newest record (the broker's retention deletes their metadata again), or lost from
    the bucket."""
    view = restored.view
    tail: list[SegmentObjects] = []
    old: list[SegmentObjects] = []
    unfinished: list[SegmentObjects] = []
    listed = segment_objects(store.list(""))
    for objects in listed:
        tp = objects.key.topic_id_partition
        known = view.segment(objects.id)
        written = (objects.indexes or objects.first).last_modified_ms or 0
        # Object stores give write times in whole seconds: one written in the second of the newest archived record
        # may have come after it, and counts as after (a copy restored, rather than a finished copy taken for an
        # orphan).
        after = objects.indexes is not None and written // 1000 >= newest_archived_ms // 1000
        if known is not None and known.state is RemoteLogSegmentState.COPY_SEGMENT_STARTED and after:
            unfinished.append(objects)
        if known is not None or state.is_deleted(view, tp):
            continue
        (tail if after else old).append(objects)
    for objects in old:
        reason = ("a .log without its .indexes: an unfinished copy" if objects.indexes is None else
                  "a complete segment the metadata never knew, written before the archive's newest record: a copy "
                  "whose metadata never finished (`tierlog reconcile` deletes such orphans)")
        restored.orphans.append(SkippedObject(objects.first.key, reason))
    stored = {objects.key.segment_id for objects in listed if objects.log is not None}
    missing = [md for md in view.segments() if md.state is _FINISHED and md.remote_log_segment_id.id not in stored]
    if missing:
        restored.notes.append(
            f"{len(missing)} finished segments of the restored metadata have no .log object in the bucket (for "
            f"example {missing[0].remote_log_segment_id}): deleted after the archive's newest record, and then "
            "the brokers' retention deletes their metadata again; or lost from the bucket (`tierlog verify bucket` "
            "lists them)")
    finish_copies(restored, store, unfinished, broker_id)
    added = add_from_objects(restored, store, tail, broker_id,
                             {name: OBJECTS_UNKNOWN[name] for name in ("broker_id", "event_timestamp_ms")})
    if added:
        restored.notes.append(
            f"{len(added)} complete segments in the bucket were written after the archive's newest record and were "
            "unknown to it: restored from their objects as finished copies (see the partitions' unknown fields)")
    return added


def finish_copies(restored: RestoredState, store: StorageBackend, copies: list[SegmentObjects], broker_id: int) -> None:
    """Mark finished the segments the state holds as COPY_SEGMENT_STARTED whose copy completed (both objects) after
    the archive's newest record: their COPY_SEGMENT_FINISHED went with the topic, and the broker may have deleted
    the local segment since. The custom metadata comes from the packed index, as the copy returned it."""
    finished = []
    for objects in copies:
        known = restored.view.segment(objects.id)
        assert known is not None
        try:
            found, _timestamped = read_segment(store, objects, broker_id)
        except UnreadableSegment as exc:
            restored.skipped.append(SkippedObject(objects.first.key, str(exc)))
            continue
        finished.append(dataclasses.replace(known, state=_FINISHED, custom_metadata=found.custom_metadata,
                                            event_timestamp_ms=found.event_timestamp_ms))
    _apply_segments(restored.view, finished)
    if finished:
        restored.notes.append(
            f"{len(finished)} segments the archive holds as COPY_SEGMENT_STARTED were copied completely after its "
            "newest record: restored as COPY_SEGMENT_FINISHED, with the custom metadata of their packed index")


# --- the records that make the state -----------------------------------------------------------------------------

Record = tuple[bytes, bytes]


def _segment_order(md: RemoteLogSegmentMetadata, displaced: set[uuid.UUID]) -> tuple[int, int, int, bytes]:
    """Unfinished segments first, then the finished ones a newer upload displaced, then the rest, by start offset:
    Kafka's rule then indexes each referenced segment after every segment it displaced, and each epoch's checkpoint
    (appended after them) states the displacements and highest offsets the history made."""
    rank = 0 if md.state is not _FINISHED else 1 if md.remote_log_segment_id.id in displaced else 2
    return (rank, *state.listing_order(md))


def restore_records(view: MetadataView, num_partitions: int, broker_id: int, now_ms: int,
                    base_offsets: Mapping[int, int] | None = None) -> list[list[Record]]:
    """Per metadata partition, in order, the records of a new topic that replays to `view`'s content, a history
    Kafka's rules accept record by record: each user partition's segments (`segment_history`: the last record of each
    carries its full state), one checkpoint per leader epoch of its lineage (stamped with the offset its partition's
    last segment record gets, after `base_offsets`, so every node takes it as describing the lineage), then the delete
    states it went through. A partition whose delete FINISHED has only those, as its writer leaves it."""
    base = base_offsets or {}
    out: list[list[Record]] = [[] for _ in range(num_partitions)]
    for tp in sorted(view.user_partitions(), key=lambda t: (t.topic, str(t.topic_id), t.partition)):
        metadata_partition = metadata_partition_for(tp.topic_id, tp.partition, num_partitions)
        records = out[metadata_partition]
        delete = view.partition_delete(tp)
        if delete is None or delete.state is not RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
            lineages = list(view.lineages_of(tp))
            displaced = {s for lineage in lineages for s in lineage.displaced_segment_ids}
            segments = sorted(view.segments_of(tp), key=lambda md: _segment_order(md, displaced))
            records += [(key_of(event).encode(), codec.encode(event)) for md in segments
                        for event in segment_history(md)]
            reflects = base.get(metadata_partition, 0) + len(records) - 1 if segments else None
            for lineage in lineages:
                checkpoint = EpochCheckpoint(tp, (lineage,), now_ms, broker_id, reflects, whole_partition=False)
                records.append((key_of(checkpoint).encode(), codec.encode(checkpoint)))
        for step in [] if delete is None else partition_delete_history(delete):
            records.append((key_of(step).encode(), codec.encode(step)))
    return out


def replayed_digest(records: list[list[Record]]) -> str:
    """The view digest a node reaches by applying `records` as a new topic holding them: the rules of rlmm.state,
    record by record at the offsets they get, over its in-memory store (whose digest is the view's)."""
    replayed = state.InMemoryState()
    for partition_records in records:
        for offset, (key, value) in enumerate(partition_records):
            # As a node that reads the new topic from its start: every record before this one applied.
            state.apply_record(replayed, RecordKey.decode(key), codec.decode(value), offset, skipped_before=False)
    return replayed.digest()


# --- the archive of the lost topic --------------------------------------------------------------------------------
# Archive files are named by metadata partition and offset, not by topic id: the new topic's records start again at
# offset 0, so the archiver would take the lost topic's files for its own and skip the new records. A restore moves
# them to `audit/<topic>.lost-<restore ms>/` (still readable, ignored by the archiver), and the lost incarnations'
# snapshots likewise to `<snapshot.location>/<topic>.lost-<restore ms>/`, recording where in a marker object first, so
# that a restore cut short while moving finishes the move when run again.

def marker_key(metadata_topic: str) -> str:
    return f"{ARCHIVE_ROOT}/{metadata_topic}.restore.json"


@dataclass(frozen=True, slots=True)
class RestoreMarker:
    """A restore under way: `stage` "writing" (the topic being written, the archive untouched) or "moving" (the topic
    verified, the archive being moved to `retired_topic`)."""

    stage: str
    retired_topic: str
    started_ms: int


def read_marker(store: StorageBackend, metadata_topic: str) -> RestoreMarker | None:
    key = marker_key(metadata_topic)
    if not any(info.key == key for info in store.list(key)):
        return None
    found = json.loads(read_all(store.get_range(key, 0)))
    return RestoreMarker(found["stage"], found["retired_topic"], int(found["started_ms"]))


def write_marker(store: StorageBackend, metadata_topic: str, marker: RestoreMarker) -> None:
    store.put(marker_key(metadata_topic), json.dumps(
        {"stage": marker.stage, "retired_topic": marker.retired_topic, "started_ms": marker.started_ms}).encode())


def clear_marker(store: StorageBackend, metadata_topic: str) -> None:
    store.delete([marker_key(metadata_topic)])


def retire_archive(store: StorageBackend, metadata_topic: str, retired_topic: str,
                   progress: Callable[[int, int], None] | None = None) -> int:
    """Move the archive files of `metadata_topic` under `retired_topic`; the number of files moved."""
    moves = []
    for archive_file in list_archive_files(store, metadata_topic):
        retired = archive_file.key.replace(f"{ARCHIVE_ROOT}/{metadata_topic}/", f"{ARCHIVE_ROOT}/{retired_topic}/", 1)
        if parse_archive_key(retired) is None:
            raise RestoreError(f"cannot move archive file {archive_file.key}: {retired} is not an archive key")
        moves.append((archive_file.key, retired))
    return _move_objects(store, moves, progress)


def retire_snapshots(store: StorageBackend, location: str, metadata_topic: str, retired_topic: str,
                     topic_id: str) -> int:
    """Move the snapshots of every incarnation of `metadata_topic` but `topic_id` (the restored topic's) under
    `retired_topic`, so that no later restore takes a lost incarnation's snapshot for the base of another's archive;
    the number moved."""
    if not location.strip("/"):
        return 0
    root = snapshot_prefix(location, metadata_topic, "")[:-1]
    keep = snapshot_prefix(location, metadata_topic, topic_id)
    retired_root = snapshot_prefix(location, retired_topic, "")[:-1]
    moves = [(info.key, retired_root + info.key[len(root):]) for info in store.list(root)
             if not info.key.startswith(keep)]
    return _move_objects(store, moves)


def _move_objects(store: StorageBackend, moves: list[tuple[str, str]],
                  progress: Callable[[int, int], None] | None = None) -> int:
    """Move objects (key, new key), each copied before it is deleted, so that a move cut short and run again loses
    nothing; the number moved."""
    for count, (key, target) in enumerate(moves, 1):
        store.put(target, read_all(store.get_range(key, 0)))
        store.delete([key])
        if progress:
            progress(count, len(moves))
    return len(moves)


def retired_topic_name(metadata_topic: str, started_ms: int) -> str:
    return f"{metadata_topic}.lost-{started_ms}"



# --- the new topic -----------------------------------------------------------------------------------------------

def topic_end_offsets(client: Mapping[str, Any], metadata_topic: str, partitions: int, timeout_s: float
                      ) -> dict[int, int] | None:
    """The end offset of each partition of the metadata topic, or None when it does not exist. RestoreError for a
    topic that is not one tierlog would create (a broker's auto.create.topics.enable makes one of the broker's
    defaults when a write comes after the loss). Lists every topic rather than asking for this one, which such a
    broker would create."""
    admin = AdminClient(dict(client))
    try:
        found = admin.list_topics(timeout=timeout_s).topics.get(metadata_topic)
    except KafkaException as exc:
        raise RestoreError(f"cannot list the topics at {client.get('bootstrap.servers')}: {exc}") from exc
    if found is None or found.error is not None:
        return None
    try:
        check_topic(admin, metadata_topic, partitions, timeout_s)
    except ConfigError as exc:
        raise RestoreError(f"{exc}. If this is not the topic tierlog created (a broker with auto.create.topics.enable "
                           "made it when a write came after the loss), delete it and run the restore again") from exc
    return OffsetReader(metadata_topic, client, admin).end_offsets(sorted(found.partitions), timeout_s)


def write_records(client: Mapping[str, Any], metadata_topic: str, records: list[list[Record]], timeout_s: float,
                  progress: Callable[[int, int], None] | None = None) -> int:
    """Append `records` to their metadata partitions with tierlog's producer (idempotent, acks=all, in order); the
    number written. RestoreError when one is refused or not acknowledged within `timeout_s`."""
    producer = EventProducer(metadata_topic, client)
    failures: list[str] = []
    total = sum(map(len, records))
    done = 0
    deadline = time.monotonic() + timeout_s

    def delivered(error: KafkaError | None, _message: Message) -> None:
        nonlocal done
        if error is not None:
            failures.append(str(error))
        done += 1

    for partition, partition_records in enumerate(records):
        for key, value in partition_records:
            producer.append(partition, key, value, [], delivered, deadline)
            producer.poll(0)
            if progress and done % 1000 == 0:
                progress(done, total)
    left = producer.close(max(0.0, deadline - time.monotonic()))
    if progress:
        progress(done, total)
    if left or failures:
        raise RestoreError(f"{left} records to {metadata_topic} were not acknowledged within {timeout_s:.0f} s and "
                           f"{len(failures)} were refused{': ' + failures[0] if failures else ''}")
    return total


def open_node(node_config: Mapping[str, Any], state_dir: Path) -> RemoteLogMetadataManager:
    """A new node of the metadata topic on an empty `state_dir` (no snapshot): it creates the topic with the
    manager's own settings when it is missing, refuses one of the wrong kind (cleanup policy, partition count), and
    replays what the restore writes, as every broker's node will."""
    config = {**node_config, "state.dir": str(state_dir), "metadata.topic.create": True}
    config.pop(LOCATION_KEY, None)
    return RemoteLogMetadataManager(config)
