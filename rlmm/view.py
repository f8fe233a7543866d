"""The materialized metadata view in RocksDB: one column family per kind of state (see view_format).

Readers see only committed state; the applier folds a consumed batch through a `ViewBatch` overlay and
commits it, with the metadata-topic offsets it reaches, as ONE WriteBatch.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rocksdict import AccessType, Options, Rdict, WriteBatch, WriteOptions

from rlmm import state
from rlmm import view_format as vf
from rlmm.errors import ViewFormatError
from rlmm.events import EpochLineage, MetadataEvent, RecordKey
from rlmm.state import Outcome
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
)

_FORMAT_KEY = b"tierlog.view.format"
_SOURCE_KEY = b"tierlog.view.source\0"  # + metadata topic name
_DELETED = None

log = logging.getLogger(__name__)


def _options() -> Options:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.create_missing_column_families(True)
    return opts


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    """One metadata-topic record, decoded, as the applier hands it to the view."""

    metadata_partition: int
    offset: int
    key: RecordKey
    event: MetadataEvent | None


class MetadataView:
    """Committed view state; every read goes to RocksDB, so any thread may query it."""

    def __init__(self, path: Path, read_only: bool = False) -> None:
        self.path = Path(path)
        self._read_only = read_only
        self._open()

    def _open(self) -> None:
        read_only = self._read_only
        families = {name: Options(raw_mode=True) for name in vf.ALL_FAMILIES}
        if read_only:
            self._db = Rdict(str(self.path), Options(raw_mode=True), column_families=families,
                             access_type=AccessType.read_only())
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            self._db = Rdict(str(self.path), _options(), column_families=families)
            stored = self._db.get(_FORMAT_KEY)
            if stored is None:
                self._db.put(_FORMAT_KEY, vf.FORMAT_VERSION.to_bytes(4, "big"))
            elif int.from_bytes(stored, "big") != vf.FORMAT_VERSION:
                raise ViewFormatError(
                    f"view at {self.path} has format {int.from_bytes(stored, 'big')}, this tierlog reads "
                    f"{vf.FORMAT_VERSION}: move the state dir away and let the node rebuild from the topic"
                )
        # Typed as Any: rocksdict's stubs widen raw-mode keys and values to every picklable type.
        self._cf: dict[str, Any] = {name: self._db.get_column_family(name) for name in vf.ALL_FAMILIES}
        self._handles = {name: self._db.get_column_family_handle(name) for name in vf.ALL_FAMILIES}

    @classmethod
    def open(cls, state_dir: str | Path, read_only: bool = False) -> MetadataView:
        return cls(Path(state_dir) / "view", read_only=read_only)

    def close(self) -> None:
        if not hasattr(self, "_db"):  # closed already, or a reopen failed to open it again
            return
        # RocksDB's lock is released only once no column-family object refers to the database any more.
        self._cf.clear()
        self._handles.clear()
        try:
            self._db.close()
        except Exception as exc:  # rocksdict raises bare Exception; a failed write (disk full) resurfaces here
            log.warning("closing the view at %s: %s (what was committed before is kept)", self.path, str(exc))
        del self._db
        gc.collect()

    def reopen(self) -> None:
        """Close and open the database again: after a failed write (disk full) RocksDB refuses every later
        write until reopened, and reopening recovers the last committed batch."""
        self.close()
        self._open()

    # --- the metadata topic this view follows --------------------------------------------------------

    def source(self, metadata_topic: str) -> tuple[str, int] | None:
        """(topic id, wall-clock ms of the last applied batch) of the metadata topic, or None if never set."""
        raw = self._db.get(_SOURCE_KEY + metadata_topic.encode())
        if raw is None:
            return None
        topic_id, _, applied_at = bytes(raw).decode().partition(" ")
        return topic_id, int(applied_at)

    def set_source(self, metadata_topic: str, topic_id: str, applied_at_ms: int) -> None:
        self._db.put(_SOURCE_KEY + metadata_topic.encode(), f"{topic_id} {applied_at_ms}".encode())

    # --- raw access, overridden by the batch overlay --------------------------------------------------

    def _get(self, family: str, key: bytes) -> bytes | None:
        value = self._cf[family].get(key)
        return None if value is None else bytes(value)

    def _scan(self, family: str, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        for key, value in self._cf[family].items(from_key=prefix):
            if not key.startswith(prefix):
                return
            yield bytes(key), bytes(value)

    def _index_floor_key(self, prefix: bytes, target: bytes) -> tuple[bytes, bytes] | None:
        it = self._cf[vf.EPOCH_INDEX].iter()
        it.seek_for_prev(target)
        if it.valid() and bytes(it.key()).startswith(prefix):
            return bytes(it.key()), bytes(it.value())
        return None

    # --- StateStore reads --------------------------------------------------------------------------------

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        raw = self._get(vf.SEGMENTS, vf.segment_key(segment_id))
        return None if raw is None else vf.decode_segment(raw)

    def segments_of(self, tp: TopicIdPartition) -> Iterator[RemoteLogSegmentMetadata]:
        return (vf.decode_segment(v) for _, v in self._scan(vf.SEGMENTS, vf.tp_key_of(tp)))

    def partition_delete(self, tp: TopicIdPartition) -> RemotePartitionDeleteMetadata | None:
        raw = self._get(vf.PARTITIONS, vf.partition_key(tp))
        return None if raw is None else vf.decode_partition_delete(raw)

    def lineage(self, tp: TopicIdPartition, epoch: int) -> EpochLineage | None:
        raw = self._get(vf.EPOCH_STATE, vf.lineage_key(tp, epoch))
        return None if raw is None else vf.decode_lineage(raw)

    def lineages_of(self, tp: TopicIdPartition) -> Iterator[EpochLineage]:
        return (vf.decode_lineage(v) for _, v in self._scan(vf.EPOCH_STATE, vf.tp_key_of(tp)))

    def _partition_meta(self, tp: TopicIdPartition) -> vf.PartitionMeta | None:
        raw = self._get(vf.PARTITION_META, vf.tp_key_of(tp))
        return None if raw is None else vf.decode_partition_meta(raw)

    def checkpointed_lineage(self, tp: TopicIdPartition) -> bytes | None:
        meta = self._partition_meta(tp)
        return None if meta is None else meta.checkpointed

    def lineage_position(self, tp: TopicIdPartition) -> int | None:
        meta = self._partition_meta(tp)
        return None if meta is None else meta.lineage_position

    def index_get(self, tp: TopicIdPartition, epoch: int, start_offset: int) -> uuid.UUID | None:
        raw = self._get(vf.EPOCH_INDEX, vf.index_key(tp, epoch, start_offset))
        return None if raw is None else uuid.UUID(bytes=raw)

    def index_floor(self, tp: TopicIdPartition, epoch: int, offset: int) -> tuple[int, uuid.UUID] | None:
        found = self._index_floor_key(vf.epoch_prefix(tp, epoch), vf.index_key(tp, epoch, offset))
        return None if found is None else (vf.index_start_offset(found[0]), uuid.UUID(bytes=found[1]))

    def known_partition(self, topic_id: uuid.UUID, partition: int) -> TopicIdPartition | None:
        raw = self._get(vf.PARTITION_META, vf.tp_key(topic_id, partition))
        return None if raw is None else TopicIdPartition(topic_id, vf.decode_partition_meta(raw).topic, partition)

    # --- whole-view reads ----------------------------------------------------------------------------------

    def user_partitions(self) -> list[TopicIdPartition]:
        found = []
        for key, value in self._cf[vf.PARTITION_META].items():
            topic_id = uuid.UUID(bytes=bytes(key[:16]))
            partition = int.from_bytes(key[16:20], "big")
            found.append(TopicIdPartition(topic_id, vf.decode_partition_meta(bytes(value)).topic, partition))
        return found

    def segments(self, tp: TopicIdPartition | None = None) -> Iterator[RemoteLogSegmentMetadata]:
        if tp is not None:
            return self.segments_of(tp)
        return (vf.decode_segment(bytes(v)) for v in self._cf[vf.SEGMENTS].values())

    def partition_delete_states(self) -> Iterator[RemotePartitionDeleteMetadata]:
        return (vf.decode_partition_delete(bytes(v)) for v in self._cf[vf.PARTITIONS].values())

    def applied_offsets(self, metadata_topic: str) -> dict[int, int]:
        prefix = metadata_topic.encode() + b"\0"
        return {
            int.from_bytes(k[len(prefix):], "big"): vf.decode_offset(v)
            for k, v in self._scan(vf.APPLIED, prefix)
        }

    def entries(self) -> Iterator[tuple[str, bytes, bytes]]:
        """The content as (column family, key, value), families by name and keys in RocksDB's byte order."""
        for family in sorted(vf.CONTENT_FAMILIES):
            for key, value in self._cf[family].items():
                yield family, bytes(key), bytes(value)

    def digest(self) -> str:
        """sha256 of the view's content, equal on every node that applied the same metadata log."""
        return state.view_digest_of(self.entries(), presorted=True)

    def batch(self) -> ViewBatch:
        return ViewBatch(self)

    def _write(self, batch: WriteBatch) -> None:
        options = WriteOptions()
        self._db.write(batch, options)


class ViewBatch(MetadataView):
    """A StateStore over the committed view plus this batch's uncommitted changes; `commit` writes them once."""

    def __init__(self, view: MetadataView) -> None:
        self._view = view
        self._cf = view._cf
        self._handles = view._handles
        self._pending: dict[str, dict[bytes, bytes | None]] = {name: {} for name in vf.ALL_FAMILIES}
        # The same pending entries grouped by user partition, so prefix scans need not walk the whole batch.
        self._by_tp: dict[str, dict[bytes, dict[bytes, bytes | None]]] = {name: {} for name in vf.ALL_FAMILIES}
        self._index: dict[bytes, dict[bytes, bytes | None]] = {}
        # Segments stay decoded while the batch runs: written ones are encoded once, at commit.
        self._segments: dict[bytes, RemoteLogSegmentMetadata | None] = {}
        self._segments_by_tp: dict[bytes, set[bytes]] = {}
        self._segments_read: dict[bytes, RemoteLogSegmentMetadata | None] = {}

    # --- overlay reads -------------------------------------------------------------------------------

    def _get(self, family: str, key: bytes) -> bytes | None:
        pending = self._pending[family]
        if key in pending:
            return pending[key]
        return self._view._get(family, key)

    def _scan(self, family: str, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        merged: dict[bytes, bytes | None] = dict(self._view._scan(family, prefix))
        if family == vf.APPLIED or len(prefix) < vf.TP_KEY_LEN:
            pending = self._pending[family]
        else:
            pending = self._by_tp[family].get(prefix[:vf.TP_KEY_LEN], {})
        merged.update((k, v) for k, v in pending.items() if k.startswith(prefix))
        return iter(sorted((k, v) for k, v in merged.items() if v is not None))

    def _index_floor_key(self, prefix: bytes, target: bytes) -> tuple[bytes, bytes] | None:
        overlay = self._index.get(prefix, {})
        it = self._cf[vf.EPOCH_INDEX].iter()
        it.seek_for_prev(target)
        committed: tuple[bytes, bytes] | None = None
        while it.valid():
            key = bytes(it.key())
            if not key.startswith(prefix):
                break
            if key not in overlay:
                committed = (key, bytes(it.value()))
                break
            it.prev()
        candidates = [(k, v) for k, v in overlay.items() if v is not None and k <= target]
        if committed is not None:
            candidates.append(committed)
        return max(candidates) if candidates else None

    # --- overlay writes (the rest of StateStore) ------------------------------------------------------

    def _put(self, family: str, key: bytes, value: bytes | None) -> None:
        self._pending[family][key] = value
        self._by_tp[family].setdefault(key[:vf.TP_KEY_LEN], {})[key] = value

    def _touch(self, tp: TopicIdPartition) -> None:
        key = vf.tp_key_of(tp)
        if self._get(vf.PARTITION_META, key) is None:
            self._put(vf.PARTITION_META, key, vf.encode_partition_meta(vf.PartitionMeta(tp.topic)))

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        key = vf.segment_key(segment_id)
        if key in self._segments:
            return self._segments[key]
        if key not in self._segments_read:
            self._segments_read[key] = self._view.segment(segment_id)
        return self._segments_read[key]

    def segments_of(self, tp: TopicIdPartition) -> Iterator[RemoteLogSegmentMetadata]:
        prefix = vf.tp_key_of(tp)
        found: dict[bytes, RemoteLogSegmentMetadata | None] = {
            key: vf.decode_segment(value) for key, value in self._view._scan(vf.SEGMENTS, prefix)
        }
        found.update((key, self._segments[key]) for key in self._segments_by_tp.get(prefix, ()))
        return iter([md for _, md in sorted(found.items()) if md is not None])

    def _set_segment(self, key: bytes, metadata: RemoteLogSegmentMetadata | None) -> None:
        self._segments[key] = metadata
        self._segments_by_tp.setdefault(key[:vf.TP_KEY_LEN], set()).add(key)

    def put_segment(self, metadata: RemoteLogSegmentMetadata) -> None:
        self._touch(metadata.topic_id_partition)
        self._set_segment(vf.segment_key(metadata.remote_log_segment_id), metadata)

    def remove_segment(self, segment_id: RemoteLogSegmentId) -> None:
        self._set_segment(vf.segment_key(segment_id), _DELETED)

    def put_partition_delete(self, metadata: RemotePartitionDeleteMetadata) -> None:
        self._touch(metadata.topic_id_partition)
        self._put(vf.PARTITIONS, vf.partition_key(metadata.topic_id_partition),
                  vf.encode_partition_delete(metadata))

    def put_lineage(self, tp: TopicIdPartition, lineage: EpochLineage) -> None:
        self._touch(tp)
        self._put(vf.EPOCH_STATE, vf.lineage_key(tp, lineage.epoch), vf.encode_lineage(lineage))

    def remove_lineage(self, tp: TopicIdPartition, epoch: int) -> None:
        self._put(vf.EPOCH_STATE, vf.lineage_key(tp, epoch), _DELETED)

    def set_checkpointed_lineage(self, tp: TopicIdPartition, lineage_digest: bytes | None) -> None:
        meta = self._partition_meta(tp) or vf.PartitionMeta(tp.topic)
        self._put_partition_meta(tp, dataclasses.replace(meta, checkpointed=lineage_digest))

    def set_lineage_position(self, tp: TopicIdPartition, offset: int) -> None:
        meta = self._partition_meta(tp) or vf.PartitionMeta(tp.topic)
        self._put_partition_meta(tp, dataclasses.replace(meta, lineage_position=offset))

    def _put_partition_meta(self, tp: TopicIdPartition, meta: vf.PartitionMeta) -> None:
        self._put(vf.PARTITION_META, vf.tp_key_of(tp), vf.encode_partition_meta(meta))

    def index_put(self, tp: TopicIdPartition, epoch: int, start_offset: int, segment: uuid.UUID) -> None:
        self._touch(tp)
        self._index_write(tp, epoch, start_offset, segment.bytes)

    def index_remove(self, tp: TopicIdPartition, epoch: int, start_offset: int) -> None:
        self._index_write(tp, epoch, start_offset, _DELETED)

    def _index_write(self, tp: TopicIdPartition, epoch: int, start_offset: int, value: bytes | None) -> None:
        key = vf.index_key(tp, epoch, start_offset)
        self._put(vf.EPOCH_INDEX, key, value)
        self._index.setdefault(vf.epoch_prefix(tp, epoch), {})[key] = value

    def forget_partition(self, tp: TopicIdPartition) -> None:
        prefix = vf.tp_key_of(tp)
        for md in list(self.segments_of(tp)):
            self.remove_segment(md.remote_log_segment_id)
        for family in (vf.PARTITIONS, vf.EPOCH_STATE, vf.EPOCH_INDEX, vf.PARTITION_META):
            for key, _ in list(self._scan(family, prefix)):
                if family == vf.EPOCH_INDEX:
                    self._index.setdefault(key[: len(prefix) + 4], {})[key] = _DELETED
                self._put(family, key, _DELETED)

    # --- applying and committing -------------------------------------------------------------------------

    def apply(self, record: ConsumedRecord) -> Outcome:
        return state.apply_record(self, record.key, record.event, record.offset)

    def commit(self, metadata_topic: str, next_offsets: dict[int, int]) -> None:
        batch = WriteBatch(raw_mode=True)
        segments = self._handles[vf.SEGMENTS]
        for key, md in self._segments.items():
            if md is None:
                batch.delete(key, segments)
            else:
                batch.put(key, vf.encode_segment(md), segments)
        for family, entries in self._pending.items():
            handle = self._handles[family]
            for key, value in entries.items():
                if value is None:
                    batch.delete(key, handle)
                else:
                    batch.put(key, value, handle)
        for partition, offset in next_offsets.items():
            batch.put(vf.applied_key(metadata_topic, partition), vf.encode_offset(offset), self._handles[vf.APPLIED])
        self._view._write(batch)
        for entries in self._pending.values():
            entries.clear()
        for groups in self._by_tp.values():
            groups.clear()
        self._index.clear()
        self._segments.clear()
        self._segments_by_tp.clear()
        self._segments_read.clear()


def apply_records(
    view: MetadataView, metadata_topic: str, records: Sequence[ConsumedRecord], next_offsets: dict[int, int]
) -> list[Outcome]:
    """Apply a consumed batch and commit it with the offsets it reaches, atomically."""
    batch = view.batch()
    outcomes = [batch.apply(record) for record in records]
    batch.commit(metadata_topic, next_offsets)
    return outcomes



