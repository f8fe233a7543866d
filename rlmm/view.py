"""The materialized metadata view in RocksDB: one column family per kind of state (see view_format).

Readers see only committed state, served from an in-memory read model of it (rlmm.read_model); the applier
folds a consumed batch through a `ViewBatch` overlay and commits it, with the metadata-topic offsets it
reaches, as ONE WriteBatch, then folds the same changes into the read model.
"""

from __future__ import annotations

import enum
import gc
import logging
import os
import shutil
import threading
import uuid
from collections import deque
from collections.abc import Collection, Container, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Any

from rocksdict import (
    AccessType,
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    DBCompressionType,
    IngestExternalFileOptions,
    Options,
    Rdict,
    ReadOptions,
    SstFileWriter,
    WriteBatch,
    WriteOptions,
)

from rlmm import codec, state
from rlmm import view_format as vf
from rlmm.errors import SnapshotError, ViewFormatError
from rlmm.events import EpochLineage, MetadataEvent, RecordKey
from rlmm.read_model import EpochIndex, PartitionChanges, PartitionModel, ReadModel, prefixed, read_partition
from rlmm.state import Outcome
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
)

_FORMAT_KEY = b"tierlog.view.format"
_PAST_EVERY_KEY = b"\xff" * 64  # after every key of the view's families (each starts with a 16-byte topic id)
_PAST_PARTITION = b"\xff" * 44  # after a user partition's key, after every key that starts with it
# While a fresh load ingests, its user partitions' keys (concatenated) under this key of the applied offsets' family
# (no topic's offsets: those start with the topic's name): a load cut short leaves them part-written, and the next
# fresh load removes them first. The offsets the load reaches, written last, remove the key.
_LOADING_KEY = b"\0loading"
# User partitions a new node's load put in the view ahead of the other records of their metadata partitions (the
# partitions its broker hosts: MetadataApplier._load_in_workers), their keys concatenated under this key of the same
# family. Each is complete up to where the load's backlog ends, but the offsets that make a node resume from them come
# with the rest of its metadata partition, which removes it from here; a node that starts with partitions named here
# removes their entries (discard_preloaded), and its load reads them again.
_PRELOADED_KEY = b"\0preloaded"
_SOURCE_KEY = b"tierlog.view.source\0"  # + metadata topic name
_DELETED = None


class _Unread(enum.Enum):
    """A partition the read model does not hold: read from RocksDB key by key."""

    UNREAD = 0


_UNREAD = _Unread.UNREAD
_FINISHED = RemoteLogSegmentState.COPY_SEGMENT_FINISHED

log = logging.getLogger(__name__)


# Memtable size per column family. RocksDB's default (64 MiB each, six families) made a rebuilt node hold far more
# memory than a restarted one at the same state; the view's writes are small batches, so small memtables suffice.
_WRITE_BUFFER_BYTES = 4 << 20
# Entries hashed at once when the digest reads the view.
_DIGEST_RUN = 20_000
# A loaded table is sent to disk in stretches of this size while it is written (_SyncedTable).
_SYNC_BYTES = 16 << 20


# One block cache for every column family of every view in the process. RocksDB's default gives each family a
# cache of its own (32 MiB each, seven families): filled by the applier's reads of partitions the node does not host,
# it made a rebuilt node hold some 150 MiB more than a restarted one. Index and filter blocks are cached there too, so
# their memory does not grow with the view's size on disk.
_BLOCK_CACHE_BYTES = 16 << 20
_BLOCK_CACHE = Cache(_BLOCK_CACHE_BYTES)
# Level 0's compaction and write-stall triggers (files): RocksDB's own while serving, and while a backlog's groups
# load (MetadataView.defer_compactions) more than any backlog has groups (at most one per metadata partition).
_SERVING_LEVEL0 = {"level0_file_num_compaction_trigger": "4", "level0_slowdown_writes_trigger": "20",
                   "level0_stop_writes_trigger": "36"}
_LOADING_LEVEL0 = dict.fromkeys(_SERVING_LEVEL0, str(1 << 16))


# Index and filter blocks are partitioned into blocks of this size, under a small top-level index per table file.
# Whole, a table's index is one block of about 0.8% of its data (700 KiB for 1M segments): larger than a shard of
# the block cache (RocksDB splits a 16 MiB cache into 32 shards of 512 KiB), so it was read again and parsed for
# every lookup that went to disk, about 1 ms each at 1M live segments (a partition's first lookups after a restart,
# the applier's reads of partitions the node does not host). Partitioned, a lookup reads a few small blocks.
_METADATA_BLOCK_BYTES = 4 << 10
# A full Bloom filter per table (partitioned too) lets a point read of a key the table lacks skip it: most of the
# applier's reads of partitions the node does not host ask for keys still absent (a new segment, no deletion).
_BLOOM_BITS_PER_KEY = 10


def _family_options() -> Options:
    opts = Options(raw_mode=True)
    opts.set_write_buffer_size(_WRITE_BUFFER_BYTES)
    table = BlockBasedOptions()
    table.set_block_cache(_BLOCK_CACHE)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(_METADATA_BLOCK_BYTES)
    table.set_pin_top_level_index_and_filter(True)
    table.set_bloom_filter(_BLOOM_BITS_PER_KEY, False)
    opts.set_block_based_table_factory(table)
    return opts


# The tables of a snapshot (rlmm.snapshot) are compressed with zstd, the view's own with RocksDB's default, snappy.
# A new node downloads a snapshot's tables and ingests them as they are, so their size is most of a bootstrap's time:
# at 1M live segments zstd's are 16% smaller (108 MB against 129; the ids the values hold as text are what is left)
# and a bootstrap took a quarter less time. A node reads tables of either; its compactions write its own. Writing
# them takes twice as long, which the archiver can afford and a rebuild's tables (on its critical path) cannot.
_SNAPSHOT_ZSTD_LEVEL = 3


def _snapshot_table_options() -> Options:
    opts = _family_options()
    opts.set_compression_type(DBCompressionType.zstd())
    opts.set_compression_options(-14, _SNAPSHOT_ZSTD_LEVEL, 0, 0)  # zstd's default window; no dictionary
    return opts


def _options() -> Options:
    opts = _family_options()
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
    raw: bytes | None = None  # the record's value as consumed, when the reader kept it
    # Whether this record may stand for older records of its key the reader never applied (a backlog window replays
    # only the newest record of each key, and Kafka's log cleaner removes superseded ones from a log read after a
    # gap), or not (the reader applied every record before it); None: not known (rlmm.state.apply_record).
    skipped_before: bool | None = None


class MetadataView:
    """Committed view state: per-partition reads go to the in-memory read model under its lock, whole-view reads to
    RocksDB, so any thread may query it (the manager's lookups read the model's partition snapshots, lock-free)."""

    def __init__(self, path: Path, read_only: bool = False) -> None:
        self.path = Path(path)
        self._read_only = read_only
        # Held by every write of content or offsets (a commit, a load's ingest and its offsets) and while a point in
        # time is taken: what `point_in_time` sees lies between two commits, in every column family alike.
        self._write_lock = threading.RLock()
        self._open()
        # Reads go to self._cf as it is then: reopen() replaces the column families.
        self.model = ReadModel(lambda tp_key, pause: read_partition(self._cf, tp_key, pause))

    def _open(self) -> None:
        read_only = self._read_only
        families = {name: _family_options() for name in vf.ALL_FAMILIES}
        if read_only:
            self._db = Rdict(str(self.path), Options(raw_mode=True), column_families=families,
                             access_type=AccessType.read_only())
        else:
            self.path.mkdir(parents=True, exist_ok=True)
            self._db = Rdict(str(self.path), _options(), column_families=families)
            stored = self._db.get(_FORMAT_KEY)
            if stored is not None and int.from_bytes(stored, "big") not in vf.READABLE_FORMATS:
                raise ViewFormatError(
                    f"view at {self.path} has format {int.from_bytes(stored, 'big')}, this tierlog reads "
                    f"{vf.FORMAT_VERSION}: move the state dir away and let the node rebuild from the topic"
                )
            if stored is None or int.from_bytes(stored, "big") != vf.FORMAT_VERSION:
                # A new view, or one of an older format this one reads (upgraded in place).
                self._db.put(_FORMAT_KEY, vf.FORMAT_VERSION.to_bytes(4, "big"))
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

    # --- committed reads: the in-memory read model (rlmm.read_model), each partition read on first use ------

    def _scan(self, family: str, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        return prefixed(self._cf[family], prefix)

    # --- StateStore reads --------------------------------------------------------------------------------

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        model = self.model
        with model.lock:
            partition = model.get(vf.tp_key_of(segment_id.topic_id_partition))
            return None if partition is None else partition.segments.get(segment_id.id)

    def segments_of(self, tp: TopicIdPartition) -> Iterator[RemoteLogSegmentMetadata]:
        model = self.model
        with model.lock:
            partition = model.get(vf.tp_key_of(tp))
            return iter(() if partition is None else list(partition.segments.values()))

    def partition_delete(self, tp: TopicIdPartition) -> RemotePartitionDeleteMetadata | None:
        model = self.model
        with model.lock:
            partition = model.get(vf.tp_key_of(tp))
            return None if partition is None else partition.delete

    def lineage(self, tp: TopicIdPartition, epoch: int) -> EpochLineage | None:
        model = self.model
        with model.lock:
            partition = model.get(vf.tp_key_of(tp))
            return None if partition is None else partition.lineages.get(epoch)

    def lineages_of(self, tp: TopicIdPartition) -> Iterator[EpochLineage]:
        model = self.model
        with model.lock:
            partition = model.get(vf.tp_key_of(tp))
            found = [] if partition is None else list(partition.lineages.values())
        return iter(sorted(found, key=_epoch_of))

    def _partition_meta(self, tp: TopicIdPartition) -> vf.PartitionMeta | None:
        model = self.model
        with model.lock:
            partition = model.get(vf.tp_key_of(tp))
            return None if partition is None else partition.meta

    def checkpointed_lineage(self, tp: TopicIdPartition) -> bytes | None:
        meta = self._partition_meta(tp)
        return None if meta is None else meta.checkpointed

    def lineage_position(self, tp: TopicIdPartition) -> int | None:
        meta = self._partition_meta(tp)
        return None if meta is None else meta.lineage_position

    def index_get(self, tp: TopicIdPartition, epoch: int, start_offset: int) -> uuid.UUID | None:
        model = self.model
        with model.lock:
            partition = model.get(vf.tp_key_of(tp))
            index = None if partition is None else partition.index.get(epoch)
            return None if index is None else index.get(start_offset)

    def index_floor(self, tp: TopicIdPartition, epoch: int, offset: int) -> tuple[int, uuid.UUID] | None:
        model = self.model
        with model.lock:
            partition = model.get(vf.tp_key_of(tp))
            index = None if partition is None else partition.index.get(epoch)
            return None if index is None else index.floor(offset)

    def floor_segment(self, tp: TopicIdPartition, epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
        model = self.model
        with model.lock:
            partition = model.get(vf.tp_key_of(tp))
            index = None if partition is None else partition.index.get(epoch)
            entry = None if index is None else index.floor(offset)
            return None if entry is None or partition is None else partition.segments.get(entry[1])

    def known_partition(self, topic_id: uuid.UUID, partition: int) -> TopicIdPartition | None:
        model = self.model
        with model.lock:
            found = model.get(vf.tp_key(topic_id, partition))
            return None if found is None or found.meta is None else found.tp

    # --- committed reads straight from RocksDB, key by key (partitions the read model does not hold) ---------

    def stored_segment(self, tp_key: bytes, segment_id: uuid.UUID) -> RemoteLogSegmentMetadata | None:
        raw = self._cf[vf.SEGMENTS].get(tp_key + segment_id.bytes)
        return None if raw is None else vf.decode_segment(bytes(raw))

    def stored_segments(self, tp_key: bytes) -> Iterator[RemoteLogSegmentMetadata]:
        return (vf.decode_segment(value) for _key, value in self._scan(vf.SEGMENTS, tp_key))

    def stored_partition_delete(self, tp_key: bytes) -> RemotePartitionDeleteMetadata | None:
        raw = self._cf[vf.PARTITIONS].get(tp_key)
        return None if raw is None else vf.decode_partition_delete(bytes(raw))

    def stored_lineage(self, tp_key: bytes, epoch: int) -> EpochLineage | None:
        raw = self._cf[vf.EPOCH_STATE].get(tp_key + vf.EPOCH.pack(epoch))
        return None if raw is None else vf.decode_lineage(bytes(raw))

    def stored_lineages(self, tp_key: bytes) -> Iterator[EpochLineage]:
        return (vf.decode_lineage(value) for _key, value in self._scan(vf.EPOCH_STATE, tp_key))

    def stored_meta(self, tp_key: bytes) -> vf.PartitionMeta | None:
        raw = self._cf[vf.PARTITION_META].get(tp_key)
        return None if raw is None else vf.decode_partition_meta(bytes(raw))

    def stored_index_keys(self, tp_key: bytes) -> Iterator[tuple[int, int]]:
        """(epoch, start offset) of every entry of the partition's offset index."""
        return ((vf.lineage_epoch(key), vf.index_start_offset(key)) for key, _ in self._scan(vf.EPOCH_INDEX, tp_key))

    def stored_index_floor(self, tp_key: bytes, epoch: int, offset: int, skip: Container[int] = (),
                           exact: bool = False) -> Any:
        """The offset index entry (start, segment id) of `epoch` with the greatest start <= offset that is not in
        `skip` (one seek back from the offset), or None; with `exact`, the segment id at start == offset, or None."""
        prefix = tp_key + vf.EPOCH.pack(epoch)
        if exact:
            raw = self._cf[vf.EPOCH_INDEX].get(prefix + vf.OFFSET.pack(offset))
            return None if raw is None else uuid.UUID(bytes=bytes(raw))
        entries = self._cf[vf.EPOCH_INDEX].iter()
        entries.seek_for_prev(prefix + vf.OFFSET.pack(offset))
        while entries.valid():
            key = bytes(entries.key())
            if not key.startswith(prefix):
                return None
            start = vf.index_start_offset(key)
            if start not in skip:
                return start, uuid.UUID(bytes=bytes(entries.value()))
            entries.prev()
        return None

    def holds_segment(self, topic_id: uuid.UUID, partition: int, segment_id: uuid.UUID) -> bool:
        """Whether the committed view holds this segment (from the read model if it holds the partition)."""
        tp_key = vf.tp_key(topic_id, partition)
        held = self.model.partitions.get(tp_key, _UNREAD)
        if held is _UNREAD:
            return self._cf[vf.SEGMENTS].get(tp_key + segment_id.bytes) is not None
        return held is not None and segment_id in held.segments

    # --- whole-view reads ----------------------------------------------------------------------------------

    def user_partitions(self) -> list[TopicIdPartition]:
        found = []
        for key, value in self._cf[vf.PARTITION_META].items():
            topic_id, partition = vf.tp_of_key(bytes(key))
            found.append(TopicIdPartition(topic_id, vf.decode_partition_meta(bytes(value)).topic, partition))
        return found

    def segments(self, tp: TopicIdPartition | None = None) -> Iterator[RemoteLogSegmentMetadata]:
        if tp is not None:
            return self.segments_of(tp)
        return (vf.decode_segment(bytes(v)) for v in self._cf[vf.SEGMENTS].values())

    def applied_offsets(self, metadata_topic: str) -> dict[int, int]:
        return _applied_offsets(self._cf, metadata_topic)

    def state_mark(self, metadata_topic: str) -> tuple[str, int, dict[int, int]]:
        """What tells this view's state from any other (rlmm.resume_file): its RocksDB identity (made when the database
        was created), the sequence number of its latest write and the offsets of `metadata_topic` it applied."""
        identity = (self.path / "IDENTITY").read_text().strip()
        return identity, int(self._db.latest_sequence_number()), self.applied_offsets(metadata_topic)

    def entries(self) -> Iterator[tuple[str, bytes, bytes]]:
        """The content as (column family, key, value), families by name and keys in RocksDB's byte order."""
        return _entries(self._cf)

    def snapshot_entries(self) -> Iterator[tuple[str, bytes, bytes]]:
        """What a bootstrap snapshot holds (rlmm.snapshot): the content, then each user partition's bookkeeping."""
        return _snapshot_entries(self._cf)

    def digest(self) -> str:
        """sha256 of the view's content, equal on every node that applied the same metadata log."""
        return _digest(self._cf)

    @contextmanager
    def point_in_time(self) -> Iterator[ViewPointInTime]:
        """The committed view as it is now, read while commits go on (a RocksDB snapshot of every family, taken
        between two commits): what a bootstrap snapshot of a live node's view is written from."""
        # A secondary instance of the database: it reads the files as they are when it opens (taken between two
        # commits, under the lock) and never follows the primary afterwards. RocksDB opens every table file at
        # once, so a compaction that deletes one meanwhile does not take it away. (rocksdict's snapshots do not
        # isolate reads from later writes.)
        secondary = self.path.parent / f"{self.path.name}.moment-{uuid.uuid4().hex[:12]}"
        families = {name: _family_options() for name in vf.ALL_FAMILIES}
        with self._write_lock:
            db = Rdict(str(self.path), Options(raw_mode=True), column_families=families,
                       access_type=AccessType.secondary(str(secondary)))
        moment: dict[str, Any] = {}
        try:
            moment.update((name, db.get_column_family(name)) for name in vf.ALL_FAMILIES)
            yield ViewPointInTime(moment)
        finally:
            moment.clear()
            db.close()
            shutil.rmtree(secondary, ignore_errors=True)

    def batch(self, borrow: bool = False) -> ViewBatch:
        """A batch over the committed view; with `borrow` (a backlog), it reads partitions the model does not hold
        whole, and the model keeps them until the backlog is applied (ReadModel.borrow)."""
        return ViewBatch(self, borrow)

    def fresh_tables(self, fresh: FreshState) -> FreshTables:
        """Write a state folded in memory as RocksDB tables beside the view, for `load_fresh` to ingest (so that a
        caller can write them while it waits for another process's tables); nothing enters the view."""
        partitions = fresh.partitions()
        files = write_tables(fresh.runs(partitions), self._tables_directory(), self.path)
        return FreshTables(partitions, files)

    def load_fresh(self, metadata_topic: str, fresh: FreshState | FreshTables, next_offsets: Mapping[int, int],
                   tables: Mapping[str, Path] | None = None, their_partitions: Iterable[bytes] = (),
                   completes: Collection[bytes] = (), known_new: bool = False) -> None:
        """Load a state folded in memory into a view that applied none of its metadata partitions and holds none of
        its user partitions yet (a new node's first window, or a group of partitions never applied), with the
        offsets it reaches, and let the read model take its partitions. Like a snapshot's entries, the state is
        written as RocksDB tables (`fresh_tables`, unless given so) and ingested (no memtable holds it, no log
        records it), the offsets last; what a load cut short left (entries without offsets, which no node resumes
        from) is removed first.

        `tables` (table files by column family) hold `their_partitions`, folded by another process
        (rlmm.fresh_load): ingested with the state's, and read from RocksDB when first asked for. `completes`: the
        user partitions loaded ahead (`preload`) that these offsets now cover; `known_new`: the caller knows the view
        holds none of the partitions loaded (asking RocksDB costs a seek per partition and table ingested: at 1M live
        segments, a quarter of a new node's time while two workers load its backlog)."""
        applied = self.applied_offsets(metadata_topic)
        if not applied.keys().isdisjoint(next_offsets):
            raise ViewFormatError(f"view at {self.path} applied records of {metadata_topic} partitions "
                                  f"{sorted(applied.keys() & next_offsets.keys())} already; a fresh state loads only "
                                  "metadata partitions never applied")
        preloaded = self.preloaded()
        if not applied and not preloaded and self.holds_entries():
            self._discard_entries()
        written = fresh if isinstance(fresh, FreshTables) else self.fresh_tables(fresh)
        loading = [*written.partitions, *their_partitions]
        if (applied or preloaded) and not known_new and self.holds_any(loading):
            raise ViewFormatError(f"view at {self.path} holds user partitions of this fresh state already")
        self._ingest(metadata_topic, [*written.files.items(), *(tables or {}).items()], next_offsets, loading,
                     completes)
        self.model.adopt(written.partitions)
        self.model.forget(their_partitions)

    def preload(self, metadata_topic: str, tables: Mapping[str, Path], tp_keys: Sequence[bytes]) -> None:
        """Ingest tables (by column family) holding only these user partitions, of metadata partitions this view
        never applied, ahead of those partitions' other records: each complete up to where the load's backlog ends.
        No offsets: a later `load_fresh` of the rest of their metadata partitions `completes` them; until then they are
        named under _PRELOADED_KEY, and a node that starts so removes them (`discard_preloaded`). The caller knows
        the view holds none of them yet (asking RocksDB for each costs a seek per table ingested)."""
        with self._write_lock:
            noted = WriteBatch(raw_mode=True)
            noted.put(_PRELOADED_KEY, b"".join([*self.preloaded(), *tp_keys]), self._handles[vf.APPLIED])
            self._write(noted)
            self._ingest(metadata_topic, tables.items(), {}, tp_keys)
        self.model.forget(tp_keys)

    def preloaded(self) -> list[bytes]:
        """The user partitions loaded ahead and not yet completed (`preload`)."""
        return _tp_keys(self._cf[vf.APPLIED].get(_PRELOADED_KEY))

    def discard_preloaded(self, tp_keys: Collection[bytes] | None = None) -> None:
        """Remove the entries of these user partitions loaded ahead and not completed (all such without
        `tp_keys`): a node starting with some (its load was cut short), or a load that reads their metadata
        partitions again another way."""
        preloaded = self.preloaded()
        gone = [tp_key for tp_key in preloaded if tp_keys is None or tp_key in tp_keys]
        if not gone:
            return
        log.warning("view at %s: removing %d user partitions loaded ahead of the rest of their metadata partitions",
                    self.path, len(gone))
        batch = WriteBatch(raw_mode=True)
        self._delete_partitions(batch, gone)
        self._note_preloaded(batch, [] if tp_keys is None else [key for key in preloaded if key not in tp_keys])
        self._write(batch)
        self.model.forget(gone)

    def _note_preloaded(self, batch: WriteBatch, tp_keys: Sequence[bytes]) -> None:
        if tp_keys:
            batch.put(_PRELOADED_KEY, b"".join(tp_keys), self._handles[vf.APPLIED])
        else:
            batch.delete(_PRELOADED_KEY, self._handles[vf.APPLIED])

    def _delete_partitions(self, batch: WriteBatch, tp_keys: Iterable[bytes]) -> None:
        for tp_key in tp_keys:
            for family in (*vf.CONTENT_FAMILIES, vf.PARTITION_META):
                batch.delete_range(tp_key, tp_key + _PAST_PARTITION, self._handles[family])

    def _discard_entries(self) -> None:
        batch = WriteBatch(raw_mode=True)
        for family in (*vf.CONTENT_FAMILIES, vf.PARTITION_META):
            batch.delete_range(b"", _PAST_EVERY_KEY, self._handles[family])
        batch.delete(_LOADING_KEY, self._handles[vf.APPLIED])
        self._write(batch)
        self.model.reset()

    def defer_compactions(self) -> None:
        """While a new node loads its backlog a group of metadata partitions at a time: each group's tables cover
        user partitions spread over the whole key space, so each lands in level 0 over the others, and RocksDB would
        merge the growing bottom level again every few groups (at 1M live segments, 3 s of CPU during the rebuild,
        rewriting its entries four times over). Level 0 may hold every group's tables meanwhile (reads still see
        them all), until `resume_compactions`; one compaction then merges them, in the background. Where RocksDB
        cannot record the change (a full disk), the load goes on without it."""
        try:
            self._set_level0(_LOADING_LEVEL0)
        except Exception as exc:  # rocksdict raises bare Exception; RocksDB may hold the new triggers all the same
            log.info("view at %s: compactions not deferred while a backlog loads (%s)", self.path, exc)

    def resume_compactions(self) -> None:
        """Level 0's triggers back to RocksDB's own. Raises what RocksDB raised if it could not record them (a full
        disk): reopening the view sets them back (it opens with its own)."""
        self._set_level0(_SERVING_LEVEL0)

    def _set_level0(self, options: dict[str, str]) -> None:
        for family in (*vf.CONTENT_FAMILIES, vf.PARTITION_META):
            self._cf[family].set_options(options)

    def holds_any(self, tp_keys: Iterable[bytes]) -> bool:
        """Whether the view holds an entry of any of these user partitions (what a fresh load cut short left of its
        partitions is removed first: none is held then)."""
        self.discard_unfinished_load()
        families = [self._cf[family] for family in (*vf.CONTENT_FAMILIES, vf.PARTITION_META)]
        # A rebuild asks this of every group's user partitions: the blocks it reads would fill the block cache with
        # what nothing reads again.
        uncached = ReadOptions()
        uncached.fill_cache(False)  # type: ignore[call-arg]  # the stub lacks its argument
        return any(next(prefixed(family, tp_key, uncached), None) is not None
                   for tp_key in tp_keys for family in families)

    def holds_user_entries(self) -> bool:
        """Whether the view holds an entry of any user partition (what a fresh load cut short left is removed
        first)."""
        self.discard_unfinished_load()
        return any(map(self._holds, (*vf.CONTENT_FAMILIES, vf.PARTITION_META)))

    def discard_unfinished_load(self) -> None:
        """Remove what a fresh load cut short left (its user partitions' entries, part-written, without the offsets
        that would make a node resume from them)."""
        tp_keys = _tp_keys(self._cf[vf.APPLIED].get(_LOADING_KEY))
        if not tp_keys:
            return
        log.warning("view at %s: removing what a fresh load cut short left of %d user partitions", self.path,
                    len(tp_keys))
        batch = WriteBatch(raw_mode=True)
        self._delete_partitions(batch, tp_keys)
        batch.delete(_LOADING_KEY, self._handles[vf.APPLIED])
        self._write(batch)
        self.model.forget(tp_keys)

    def _write(self, batch: WriteBatch) -> None:
        options = WriteOptions()
        with self._write_lock:
            self._db.write(batch, options)

    def _holds(self, family: str) -> bool:
        return next(iter(self._cf[family].keys()), None) is not None

    def holds_segments(self) -> bool:
        return self._holds(vf.SEGMENTS)

    def holds_entries(self) -> bool:
        """Whether any column family holds an entry (applied offsets included)."""
        return any(map(self._holds, vf.ALL_FAMILIES))

    def load_entries(self, metadata_topic: str, runs: Iterable[tuple[str, Sequence[bytes], Sequence[bytes]]],
                     next_offsets: Mapping[int, int], view_digest: str | None = None) -> None:
        """Bulk-load an EMPTY view with entries as this view stores them (a snapshot's), then the metadata-topic
        offsets they reflect: a view that resumes from those offsets.

        `runs` are (column family, keys, values): each family's entries in one stretch of runs, keys strictly
        ascending, the content families in name order. They are written as RocksDB tables beside the view; with
        `view_digest`, they are hashed on the way and content that does not hash to it is refused (SnapshotError)
        before anything enters the view. Then the tables are ingested, and the offsets written last, so an
        interrupted load never looks like a view that applied them."""
        if self.holds_entries():
            raise ViewFormatError(f"view at {self.path} is not empty; entries load only into an empty view")
        tables = self._tables_directory()
        digest = state.ViewDigest()
        try:
            files = write_tables(runs if view_digest is None else hashed_runs(runs, digest), tables, self.path)
            if view_digest is not None and digest.hexdigest() != view_digest:
                raise SnapshotError(f"its entries make a view with digest {digest.hexdigest()}, the snapshot states "
                                    f"{view_digest}")
        except BaseException:
            shutil.rmtree(tables, ignore_errors=True)
            raise
        self._ingest(metadata_topic, files.items(), next_offsets)

    def load_tables(self, metadata_topic: str, parts: Iterable[tuple[str, bytes]],
                    next_offsets: Mapping[int, int]) -> None:
        """Bulk-load an EMPTY view with RocksDB tables written as the view writes them (rlmm.view.write_tables; a
        format 3 snapshot's), then the metadata-topic offsets they reflect. `parts` are (column family, bytes):
        each family's table in one stretch of consecutive parts. A table RocksDB refuses is a SnapshotError with
        RocksDB's reason; the offsets are written last, so an interrupted load never looks like a view that applied
        them."""
        if self.holds_entries():
            raise ViewFormatError(f"view at {self.path} is not empty; tables load only into an empty view")
        tables = self._tables_directory()
        files: dict[str, Path] = {}
        try:
            table: _SyncedTable | None = None
            current = ""
            try:
                for family, part in parts:
                    if family != current:
                        if family not in vf.ALL_FAMILIES or family == vf.APPLIED:
                            raise ViewFormatError(f"cannot load a table of column family {family!r} into the view "
                                                  f"at {self.path}")
                        if family in files:
                            raise ViewFormatError(f"the table of column family {family} comes in two stretches; "
                                                  f"cannot load it into {self.path}")
                        if table is not None:
                            table.close()
                        current, files[family] = family, tables / f"{family}.sst"
                        table = _SyncedTable(files[family])
                    assert table is not None  # opened for the first part
                    table.write(part)
            finally:
                if table is not None:
                    table.close()
        except BaseException:
            shutil.rmtree(tables, ignore_errors=True)
            raise
        try:
            self._ingest(metadata_topic, files.items(), next_offsets)
        except Exception as exc:  # rocksdict raises bare Exception for a table it cannot read
            raise SnapshotError(f"its tables do not load into the view at {self.path}: {exc}") from exc

    def _tables_directory(self) -> Path:
        """An empty directory beside the view for the tables of a load."""
        tables = self.path.parent / f"{self.path.name}.tables"
        shutil.rmtree(tables, ignore_errors=True)
        tables.mkdir(parents=True)
        return tables

    def _ingest(self, metadata_topic: str, files: Iterable[tuple[str, Path]], next_offsets: Mapping[int, int],
                loading: Sequence[bytes] = (), completes: Collection[bytes] = ()) -> None:
        """Move table files (column family, file) into the view, then write the offsets they reach. `loading`: the
        user partitions the files hold, noted first (_LOADING_KEY); `completes`: the partitions loaded ahead that
        the offsets cover (no longer named under _PRELOADED_KEY)."""
        with self._write_lock:
            if loading:
                noted = WriteBatch(raw_mode=True)
                noted.put(_LOADING_KEY, b"".join(loading), self._handles[vf.APPLIED])
                self._write(noted)
            try:
                ingest = IngestExternalFileOptions()
                ingest.set_move_files(True)
                # One file per call: files of one family may overlap (distinct keys, interleaved ranges).
                for family, file in files:
                    self._cf[family].ingest_external_file([str(file)], ingest)
            finally:
                shutil.rmtree(self.path.parent / f"{self.path.name}.tables", ignore_errors=True)
            batch = WriteBatch(raw_mode=True)
            for partition, offset in next_offsets.items():
                batch.put(vf.applied_key(metadata_topic, partition), vf.encode_offset(offset),
                          self._handles[vf.APPLIED])
            if loading:
                batch.delete(_LOADING_KEY, self._handles[vf.APPLIED])
            if completes:
                self._note_preloaded(batch, [tp_key for tp_key in self.preloaded() if tp_key not in completes])
            self._write(batch)


class _SyncedTable:
    """A table file of a load, written as its parts arrive and sent to disk as it grows: a thread flushes what was
    written every _SYNC_BYTES while the next parts are written, and closing it waits until all of it is on disk.
    RocksDB syncs a table it ingests; synced here, beside the download, that no longer waits on a snapshot's whole
    size (0.1-0.2 s for 128 MB at 1M live segments, now the last stretch only)."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("xb")
        self._unsynced = 0
        self._syncing: threading.Thread | None = None
        # What a sync in the thread raised: the kernel reports a failed write-back once per open file, so it is
        # raised by close(), not lost with the thread.
        self._failed: OSError | None = None

    def write(self, part: bytes) -> None:
        self._file.write(part)
        self._unsynced += len(part)
        if self._unsynced >= _SYNC_BYTES and (self._syncing is None or not self._syncing.is_alive()):
            self._file.flush()
            self._unsynced = 0
            self._syncing = threading.Thread(target=self._sync, name="tierlog-view-table-sync", daemon=True)
            self._syncing.start()

    def _sync(self) -> None:
        try:
            os.fdatasync(self._file.fileno())
        except OSError as exc:
            self._failed = exc

    def close(self) -> None:
        if self._file.closed:  # closed already (its failure is being raised)
            return
        try:
            if self._syncing is not None:
                self._syncing.join()
            self._file.flush()
            self._sync()
            if self._failed is not None:
                raise self._failed
        finally:
            self._file.close()


class ViewPointInTime:
    """A view's column families as they were at one moment (MetadataView.point_in_time)."""

    def __init__(self, families: Mapping[str, Any]) -> None:
        self._families = families

    def applied_offsets(self, metadata_topic: str) -> dict[int, int]:
        return _applied_offsets(self._families, metadata_topic)

    def digest(self) -> str:
        return _digest(self._families)

    def snapshot_entries(self) -> Iterator[tuple[str, bytes, bytes]]:
        """What a bootstrap snapshot holds (rlmm.snapshot): the content, then each user partition's bookkeeping."""
        return _snapshot_entries(self._families)


def _tp_keys(joined: bytes | None) -> list[bytes]:
    """User partitions' keys stored concatenated (_LOADING_KEY, _PRELOADED_KEY)."""
    joined = joined or b""
    return [joined[i:i + vf.TP_KEY_LEN] for i in range(0, len(joined), vf.TP_KEY_LEN)]


def _applied_offsets(families: Mapping[str, Any], metadata_topic: str) -> dict[int, int]:
    prefix = metadata_topic.encode() + b"\0"
    return {int.from_bytes(k[len(prefix):], "big"): vf.decode_offset(v)
            for k, v in prefixed(families[vf.APPLIED], prefix)}


def _entries(families: Mapping[str, Any]) -> Iterator[tuple[str, bytes, bytes]]:
    for family in sorted(vf.CONTENT_FAMILIES):
        for key, value in families[family].items():
            yield family, bytes(key), bytes(value)


def _snapshot_entries(families: Mapping[str, Any]) -> Iterator[tuple[str, bytes, bytes]]:
    # The bookkeeping as stored, read from its own family: not through the read model, which would decode every
    # partition's segments to reach it.
    yield from _entries(families)
    for key, value in families[vf.PARTITION_META].items():
        yield vf.PARTITION_META, bytes(key), bytes(value)


def _digest(families: Mapping[str, Any]) -> str:
    digest = state.ViewDigest()
    for family in sorted(vf.CONTENT_FAMILIES):
        items = families[family].items()
        while run := list(islice(items, _DIGEST_RUN)):
            digest.add(family, list(map(itemgetter(0), run)), list(map(itemgetter(1), run)))
    return digest.hexdigest()


def write_tables(runs: Iterable[tuple[str, Sequence[bytes], Sequence[bytes]]], tables: Path,
                 view: Path, for_snapshot: bool = False) -> dict[str, Path]:
    """Write each column family's runs of entries into a RocksDB table file under `tables`; the files by family.
    Families out of place and keys out of RocksDB's order are refused with errors naming them. Tables `for_snapshot`
    are compressed as a snapshot's (_snapshot_table_options), the others as the view's."""
    options = _snapshot_table_options if for_snapshot else _family_options
    files: dict[str, Path] = {}
    writer: SstFileWriter | None = None
    family = ""
    for run_family, keys, values in runs:
        if run_family != family:
            if run_family not in vf.ALL_FAMILIES or run_family == vf.APPLIED:
                raise ViewFormatError(f"cannot load an entry of column family {run_family!r} into the view at {view}")
            if run_family in files or (run_family in vf.CONTENT_FAMILIES and
                                        any(f > run_family for f in files if f in vf.CONTENT_FAMILIES)):
                raise ViewFormatError(f"the entries of column family {run_family} come out of order (each family in "
                                      f"one stretch, content families by name); cannot load them into {view}")
            if writer is not None:
                writer.finish()
                writer = None
            family = run_family
        if len(keys) != len(values):
            raise ViewFormatError(f"a run of column family {family} has {len(keys)} keys but {len(values)} values")
        if not keys:
            continue
        if writer is None:
            files[family] = tables / f"{family}.sst"
            writer = SstFileWriter(options())  # tables laid out as the view's own (partitioned index)
            writer.open(str(files[family]))
        try:
            deque(map(writer.__setitem__, keys, values), maxlen=0)  # one C-level pass, no Python loop per entry
        except Exception as exc:  # rocksdict raises bare Exception; the table writer checks the keys' order itself
            if "ascending order" not in str(exc):
                raise
            raise ViewFormatError(f"the keys of column family {family} are not in strictly ascending order; cannot "
                                  f"load them into {view}") from exc
    if writer is not None:
        writer.finish()
    return files


def hashed_runs(runs: Iterable[tuple[str, Sequence[bytes], Sequence[bytes]]],
                digest: state.ViewDigest) -> Iterator[tuple[str, Sequence[bytes], Sequence[bytes]]]:
    """`runs`, their content entries added to `digest` as they pass."""
    for family, keys, values in runs:
        if family in vf.CONTENT_FAMILIES:
            digest.add(family, keys, values)
        yield family, keys, values


def _epoch_of(lineage: EpochLineage) -> int:
    return lineage.epoch


class ViewBatch(MetadataView):
    """A StateStore over the committed view plus this batch's uncommitted changes; `commit` writes them once.

    Run by the one thread that applies the topic: it reads the read model without its lock, since only this
    thread changes it. A partition the model does not hold (a manager's node holds only those it hosts) is read
    key by key from RocksDB instead, and not kept: its records cost disk reads, not memory. Changes stay decoded
    until commit, which encodes each changed value once.
    """

    def __init__(self, view: MetadataView, borrow: bool = False) -> None:
        self._view = view
        self._base = view.model
        self._borrow = borrow
        self._cf = view._cf
        self._handles = view._handles
        # Per user partition key: the overlay of each kind of state (None = deleted in this batch).
        self._tps: dict[bytes, TopicIdPartition] = {}
        self._segments: dict[bytes, dict[uuid.UUID, RemoteLogSegmentMetadata | None]] = {}
        self._deletes: dict[bytes, RemotePartitionDeleteMetadata | None] = {}
        self._metas: dict[bytes, vf.PartitionMeta | None] = {}
        self._lineages: dict[bytes, dict[int, EpochLineage | None]] = {}
        self._index: dict[bytes, dict[int, dict[int, uuid.UUID | None]]] = {}
        # Segment key -> the consumed record's bytes, stored as they are when they encode the segment stored.
        self._raw: dict[bytes, bytes] = {}
        self._record: ConsumedRecord | None = None
        # The last user partition asked for and its key: a record's rules ask a dozen times for the same one.
        self._last_tp: TopicIdPartition | None = None
        self._last_key = b""

    def _tp_key(self, tp: TopicIdPartition) -> bytes:
        if tp is not self._last_tp:
            self._last_tp, self._last_key = tp, vf.tp_key_of(tp)
        return self._last_key

    def _held(self, key: bytes) -> PartitionModel | _Unread | None:
        """The committed partition as the read model holds it (None: nothing of it), or _UNREAD when the model does
        not hold it: then read from RocksDB key by key (`stored_*`)."""
        base = self._base
        partition = base.partitions.get(key, _UNREAD)
        if partition is _UNREAD:
            if base.hosted is None:  # a view opened alone keeps what it reads
                return base.get(key)
            if self._borrow:
                return base.borrow(key)
        return partition

    # --- overlay reads -------------------------------------------------------------------------------

    def segment(self, segment_id: RemoteLogSegmentId) -> RemoteLogSegmentMetadata | None:
        key = self._tp_key(segment_id.topic_id_partition)
        overlay = self._segments.get(key)
        if overlay is not None and segment_id.id in overlay:
            return overlay[segment_id.id]
        partition = self._held(key)
        if partition is _UNREAD:
            return self.stored_segment(key, segment_id.id)
        return None if partition is None else partition.segments.get(segment_id.id)

    def segments_of(self, tp: TopicIdPartition) -> Iterator[RemoteLogSegmentMetadata]:
        key = self._tp_key(tp)
        partition = self._held(key)
        found: dict[uuid.UUID, RemoteLogSegmentMetadata | None]
        if partition is _UNREAD:
            found = {md.remote_log_segment_id.id: md for md in self.stored_segments(key)}
        else:
            found = {} if partition is None else dict(partition.segments)
        found.update(self._segments.get(key, {}))
        return iter([md for md in found.values() if md is not None])

    def partition_delete(self, tp: TopicIdPartition) -> RemotePartitionDeleteMetadata | None:
        key = self._tp_key(tp)
        if key in self._deletes:
            return self._deletes[key]
        partition = self._held(key)
        if partition is _UNREAD:
            return self.stored_partition_delete(key)
        return None if partition is None else partition.delete

    def lineage(self, tp: TopicIdPartition, epoch: int) -> EpochLineage | None:
        key = self._tp_key(tp)
        overlay = self._lineages.get(key)
        if overlay is not None and epoch in overlay:
            return overlay[epoch]
        partition = self._held(key)
        if partition is _UNREAD:
            return self.stored_lineage(key, epoch)
        return None if partition is None else partition.lineages.get(epoch)

    def lineages_of(self, tp: TopicIdPartition) -> Iterator[EpochLineage]:
        key = self._tp_key(tp)
        partition = self._held(key)
        found: dict[int, EpochLineage | None]
        if partition is _UNREAD:
            found = {lineage.epoch: lineage for lineage in self.stored_lineages(key)}
        else:
            found = {} if partition is None else dict(partition.lineages)
        found.update(self._lineages.get(key, {}))
        return iter(sorted((lin for lin in found.values() if lin is not None), key=_epoch_of))

    def _partition_meta(self, tp: TopicIdPartition) -> vf.PartitionMeta | None:
        key = self._tp_key(tp)
        if key in self._metas:
            return self._metas[key]
        return self._committed_meta(key)

    def _committed_meta(self, key: bytes) -> vf.PartitionMeta | None:
        partition = self._held(key)
        if partition is _UNREAD:
            return self.stored_meta(key)
        return None if partition is None else partition.meta

    def index_get(self, tp: TopicIdPartition, epoch: int, start_offset: int) -> uuid.UUID | None:
        key = self._tp_key(tp)
        overlay = self._index.get(key, {}).get(epoch)
        if overlay is not None and start_offset in overlay:
            return overlay[start_offset]
        partition = self._held(key)
        if partition is _UNREAD:
            return self.stored_index_floor(key, epoch, start_offset, exact=True)
        index = None if partition is None else partition.index.get(epoch)
        return None if index is None else index.get(start_offset)

    def index_floor(self, tp: TopicIdPartition, epoch: int, offset: int) -> tuple[int, uuid.UUID] | None:
        key = self._tp_key(tp)
        overlay = self._index.get(key, {}).get(epoch, {})
        partition = self._held(key)
        best: tuple[int, uuid.UUID] | None
        if partition is _UNREAD:
            best = self.stored_index_floor(key, epoch, offset, skip=overlay)
        else:
            index = None if partition is None else partition.index.get(epoch)
            best = None if index is None else index.floor(offset, overlay)
        for start, segment in overlay.items():
            if segment is not None and start <= offset and (best is None or start > best[0]):
                best = (start, segment)
        return best

    def floor_segment(self, tp: TopicIdPartition, epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
        return state.floor_segment_of(self, tp, epoch, offset)

    def known_partition(self, topic_id: uuid.UUID, partition: int) -> TopicIdPartition | None:
        key = vf.tp_key(topic_id, partition)
        meta = self._metas[key] if key in self._metas else self._committed_meta(key)
        return None if meta is None else TopicIdPartition(topic_id, meta.topic, partition)

    # --- overlay writes (the rest of StateStore) ------------------------------------------------------

    def _key(self, tp: TopicIdPartition) -> bytes:
        key = self._tp_key(tp)
        self._tps[key] = tp
        return key

    def _touch(self, tp: TopicIdPartition) -> None:
        if self._partition_meta(tp) is None:
            self._metas[self._key(tp)] = vf.PartitionMeta(tp.topic)

    def put_segment(self, metadata: RemoteLogSegmentMetadata) -> None:
        tp = metadata.topic_id_partition
        self._touch(tp)
        key = self._key(tp)
        segment_id = metadata.remote_log_segment_id.id
        self._segments.setdefault(key, {})[segment_id] = metadata
        record = self._record
        if record is not None and record.event is metadata and record.raw is not None and \
                codec.is_current(record.raw):
            self._raw[key + segment_id.bytes] = record.raw
        else:
            self._raw.pop(key + segment_id.bytes, None)

    def remove_segment(self, segment_id: RemoteLogSegmentId) -> None:
        key = self._key(segment_id.topic_id_partition)
        self._segments.setdefault(key, {})[segment_id.id] = _DELETED
        self._raw.pop(key + segment_id.id.bytes, None)

    def put_partition_delete(self, metadata: RemotePartitionDeleteMetadata) -> None:
        self._touch(metadata.topic_id_partition)
        self._deletes[self._key(metadata.topic_id_partition)] = metadata

    def put_lineage(self, tp: TopicIdPartition, lineage: EpochLineage) -> None:
        self._touch(tp)
        self._lineages.setdefault(self._key(tp), {})[lineage.epoch] = lineage

    def remove_lineage(self, tp: TopicIdPartition, epoch: int) -> None:
        self._lineages.setdefault(self._key(tp), {})[epoch] = _DELETED

    def set_checkpointed_lineage(self, tp: TopicIdPartition, lineage_digest: bytes | None) -> None:
        meta = self._partition_meta(tp) or vf.PartitionMeta(tp.topic)
        self._metas[self._key(tp)] = vf.PartitionMeta(meta.topic, lineage_digest, meta.lineage_position)

    def set_lineage_position(self, tp: TopicIdPartition, offset: int) -> None:
        meta = self._partition_meta(tp) or vf.PartitionMeta(tp.topic)
        # Built directly: dataclasses.replace costs more than the rest of the rule (once per lineage change).
        self._metas[self._key(tp)] = vf.PartitionMeta(meta.topic, meta.checkpointed, offset)

    def index_put(self, tp: TopicIdPartition, epoch: int, start_offset: int, segment: uuid.UUID) -> None:
        self._touch(tp)
        self._index.setdefault(self._key(tp), {}).setdefault(epoch, {})[start_offset] = segment

    def index_remove(self, tp: TopicIdPartition, epoch: int, start_offset: int) -> None:
        self._index.setdefault(self._key(tp), {}).setdefault(epoch, {})[start_offset] = _DELETED

    def forget_partition(self, tp: TopicIdPartition) -> None:
        key = self._key(tp)
        for md in list(self.segments_of(tp)):
            self.remove_segment(md.remote_log_segment_id)
        for lineage in list(self.lineages_of(tp)):
            self.remove_lineage(tp, lineage.epoch)
        partition = self._held(key)
        index = self._index.setdefault(key, {})
        if partition is _UNREAD:
            for epoch, start in self.stored_index_keys(key):
                index.setdefault(epoch, {})[start] = _DELETED
        else:
            for epoch, committed in ({} if partition is None else partition.index).items():
                index.setdefault(epoch, {}).update(dict.fromkeys(committed.starts, _DELETED))
        for overlay in index.values():
            for start in overlay:
                overlay[start] = _DELETED
        self._deletes[key] = _DELETED
        self._metas[key] = _DELETED

    # --- applying and committing -------------------------------------------------------------------------

    def apply(self, record: ConsumedRecord) -> Outcome:
        self._record = record
        try:
            return state.apply_record(self, record.key, record.event, record.offset, record.skipped_before)
        finally:
            self._record = None

    def commit(self, metadata_topic: str, next_offsets: dict[int, int]) -> None:
        batch = WriteBatch(raw_mode=True)
        handles = self._handles
        changes: dict[bytes, tuple[TopicIdPartition | None, PartitionChanges]] = {}

        def change(key: bytes) -> PartitionChanges:
            if key not in changes:
                changes[key] = (self._tps.get(key), PartitionChanges())
            return changes[key][1]

        def write(family: str, key: bytes, value: bytes | None) -> None:
            if value is None:
                batch.delete(key, handles[family])
            else:
                batch.put(key, value, handles[family])

        for key, metas in self._metas.items():
            write(vf.PARTITION_META, key, None if metas is None else vf.encode_partition_meta(metas))
            change(key).meta = (metas,)
        for key, delete in self._deletes.items():
            write(vf.PARTITIONS, key, None if delete is None else vf.encode_partition_delete(delete))
            change(key).delete = (delete,)
        for key, segments in self._segments.items():
            for segment_id, md in segments.items():
                segment_key = key + segment_id.bytes
                raw = None if md is None else self._raw.get(segment_key) or vf.encode_segment(md)
                write(vf.SEGMENTS, segment_key, raw)
            change(key).segments = segments
        for key, lineages in self._lineages.items():
            for epoch, lineage in lineages.items():
                write(vf.EPOCH_STATE, key + vf.EPOCH.pack(epoch),
                      None if lineage is None else vf.encode_lineage(lineage))
            change(key).lineages = lineages
        for key, epochs in self._index.items():
            flat = change(key).index
            for epoch, starts in epochs.items():
                prefix = key + vf.EPOCH.pack(epoch)
                for start, segment in starts.items():
                    write(vf.EPOCH_INDEX, prefix + vf.OFFSET.pack(start), None if segment is None else segment.bytes)
                    flat[(epoch, start)] = segment
        for partition, offset in next_offsets.items():
            batch.put(vf.applied_key(metadata_topic, partition), vf.encode_offset(offset), handles[vf.APPLIED])
        self._view._write(batch)
        self._base.fold(changes)
        for overlay in (self._tps, self._segments, self._deletes, self._metas, self._lineages, self._index,
                        self._raw):
            overlay.clear()


def apply_records(
    view: MetadataView, metadata_topic: str, records: Sequence[ConsumedRecord], next_offsets: dict[int, int]
) -> list[Outcome]:
    """Apply a consumed batch and commit it with the offsets it reaches, atomically."""
    batch = view.batch()
    outcomes = [batch.apply(record) for record in records]
    batch.commit(metadata_topic, next_offsets)
    return outcomes


@dataclass
class FreshTables:
    """A FreshState written as RocksDB tables beside a view (`MetadataView.fresh_tables`): its partitions, as the
    read model takes them, and the table files by column family."""

    partitions: dict[bytes, PartitionModel]
    files: dict[str, Path]


class FreshState(state.InMemoryState):
    """A window of the topic folded in memory for a view that applied nothing yet (a new node's first window), then
    written to it at once (`MetadataView.load_fresh`): the reference store of rlmm.state, which the property tests
    hold equal to the view, costs about half of a `ViewBatch`, whose every read goes through its overlay to the read
    model (0.28 s against 0.54 s for the 47k records a compacted topic of 40k live segments holds).

    Beside the state it keeps what the view keeps: a partition's bookkeeping from its first change until it is
    forgotten, as `ViewBatch` writes it (the reference store drops a partition once it holds nothing), and the bytes
    of the record each segment was stored from, when they are what the view would encode."""

    def __init__(self) -> None:
        super().__init__()
        self._event: MetadataEvent | None = None  # the event being applied, and its record's bytes
        self._event_bytes: bytes | None = None
        self._raw: dict[uuid.UUID, bytes] = {}

    def apply(self, record: ConsumedRecord) -> Outcome:
        return self.fold(record.key, record.event, record.offset, record.skipped_before, record.raw)

    def fold(self, key: RecordKey, event: MetadataEvent | None, offset: int, skipped_before: bool | None,
             raw: bytes | None) -> Outcome:
        """`apply` of a record's parts (`raw`: its value as consumed), without building a ConsumedRecord."""
        # The shortcut takes a segment it does not hold as the full state the record carries, which a record that
        # skipped nothing (skipped_before False) is not: the rules drop that one.
        if type(event) is RemoteLogSegmentMetadata and event.state is _FINISHED and skipped_before is not False and \
                state.is_segment_key_of(key, event) and self._append_finished(event, offset, raw):
            return state.APPLIED
        self._event, self._event_bytes = event, raw
        try:
            return state.apply_record(self, key, event, offset, skipped_before)
        finally:
            self._event = self._event_bytes = None

    def _append_finished(self, md: RemoteLogSegmentMetadata, offset: int, raw: bytes | None) -> bool:
        """The rules' outcome for the record most of a compacted topic holds, without their store calls: a segment
        COPY_SEGMENT_FINISHED that the partition does not hold, that starts after every segment indexed in each of
        its epochs (so it takes no segment's entry), and that no epoch holds as displaced or overwritten. Kafka's
        rule (rlmm.lineage.reference_finished) then displaces and overwrites nothing: the segment is indexed last,
        each epoch's highest offset rises to its end, and the epochs whose lineage changed owe a checkpoint. False,
        having changed nothing, for any other case (a partition with a delete state, bookkeeping of the older forms),
        which the rules apply."""
        tp = md.remote_log_segment_id.topic_id_partition
        segment = md.remote_log_segment_id.id
        held = self._peek(tp)
        owed: frozenset[int] = frozenset()
        if held is not None:
            if held.delete is not None or segment in held.segments:
                return False
            if held.checkpointed is not None:
                decoded = vf.decode_owed(held.checkpointed)
                if decoded is None:
                    return False
                owed = decoded
            lineages, index = held.lineages, held.index
        else:
            lineages, index = {}, {}
        epochs = md.segment_leader_epochs
        changes: list[tuple[int, int, EpochLineage | None]] = []
        for epoch, start in epochs.items():
            entry = index.get(epoch)
            if entry is not None and entry[0] and entry[0][-1] >= start:
                return False
            current = lineages.get(epoch)
            end = md.epoch_end_offset(epoch) if len(epochs) > 1 else md.end_offset
            if current is None:
                changes.append((epoch, start, EpochLineage.derived(epoch, end)))
            elif segment in current.displaced_segment_ids or segment in current.overwritten_segment_ids:
                return False
            elif current.highest_log_offset is None or current.highest_log_offset < end:
                changes.append((epoch, start, EpochLineage.derived(
                    epoch, end, current.displaced_segment_ids, current.overwritten_segment_ids)))
            else:
                changes.append((epoch, start, None))
        held = self._get(tp)
        held.segments[segment] = md
        self._keep_raw(segment, raw)
        changed = []
        for epoch, start, lineage in changes:
            starts, ids = held.index.setdefault(epoch, ([], {}))
            starts.append(start)
            ids[start] = segment
            if lineage is not None:
                held.lineages[epoch] = lineage
                changed.append(epoch)
        held.lineage_position = offset
        if not owed.issuperset(changed):
            held.checkpointed = vf.encode_owed(owed.union(changed))
        return True

    def put_segment(self, metadata: RemoteLogSegmentMetadata) -> None:
        super().put_segment(metadata)
        self._keep_raw(metadata.remote_log_segment_id.id, self._event_bytes if self._event is metadata else None)

    def _keep_raw(self, segment: uuid.UUID, raw: bytes | None) -> None:
        """Keep the bytes of the record a segment was stored from (None: it was stored from something else) when
        they are what the view would encode."""
        if raw is not None and codec.is_current(raw):
            self._raw[segment] = raw
        else:
            self._raw.pop(segment, None)

    def set_checkpointed_lineage(self, tp: TopicIdPartition, owed: bytes | None) -> None:
        self._get(tp).checkpointed = owed

    def take_over(self, tp: TopicIdPartition, segments: Iterable[tuple[RemoteLogSegmentMetadata, bytes]],
                  index: dict[int, tuple[list[int], dict[int, uuid.UUID]]], lineages: dict[int, EpochLineage],
                  checkpointed: bytes | None, lineage_position: int | None) -> None:
        """Hold a partition another fold built (rlmm.lean_fold) as the rules would have left it: its segments with
        the bytes of the records they were stored from, its epochs' index entries (ascending starts, and the segment
        of each) and lineages, and its bookkeeping."""
        held = self._get(tp)
        for md, raw in segments:
            held.segments[md.remote_log_segment_id.id] = md
            self._keep_raw(md.remote_log_segment_id.id, raw)
        held.index.update(index)
        held.lineages.update(lineages)
        held.checkpointed, held.lineage_position = checkpointed, lineage_position

    def _tidy(self, tp: TopicIdPartition) -> None:
        """Partitions stay until forgotten, as the view's bookkeeping does."""

    def partitions(self) -> dict[bytes, PartitionModel]:
        """The state as the read model holds it, by the view's partition key (sharing this state's containers)."""
        return {
            vf.tp_key(topic_id, number): PartitionModel(
                held.tp, vf.PartitionMeta(held.tp.topic, held.checkpointed, held.lineage_position), held.segments,
                held.delete, held.lineages, {epoch: EpochIndex.of(*entry) for epoch, entry in held.index.items()})
            for (topic_id, number), held in self._partitions.items()
        }

    def runs(self, partitions: dict[bytes, PartitionModel]) -> Iterator[tuple[str, list[bytes], list[bytes]]]:
        """The view's entries of `partitions` (this state's), as `MetadataView.load_entries` takes them: each
        family's in key order, the content families by name, then the partitions' bookkeeping."""
        entries: dict[str, list[tuple[bytes, bytes]]] = {family: [] for family in (*vf.CONTENT_FAMILIES,
                                                                                    vf.PARTITION_META)}
        segments, deletes, lineages = entries[vf.SEGMENTS], entries[vf.PARTITIONS], entries[vf.EPOCH_STATE]
        index, metas = entries[vf.EPOCH_INDEX], entries[vf.PARTITION_META]
        raw = self._raw
        for key, partition in partitions.items():
            assert partition.meta is not None
            metas.append((key, vf.encode_partition_meta(partition.meta)))
            if partition.delete is not None:
                deletes.append((key, vf.encode_partition_delete(partition.delete)))
            segments += [(key + segment_id.bytes, raw.get(segment_id) or vf.encode_segment(md))
                         for segment_id, md in partition.segments.items()]
            lineages += [(key + vf.EPOCH.pack(epoch), vf.encode_lineage(lineage))
                         for epoch, lineage in partition.lineages.items()]
            for epoch, epoch_index in partition.index.items():
                prefix = key + vf.EPOCH.pack(epoch)
                index += [(prefix + vf.OFFSET.pack(start), segment.bytes) for start, segment in epoch_index.items()]
        for family in (*sorted(vf.CONTENT_FAMILIES), vf.PARTITION_META):
            run = sorted(entries.pop(family))
            yield family, [key for key, _ in run], [value for _, value in run]
