"""The RemoteLogMetadataManager facade: Kafka's API over the event log and the RocksDB view.

Writes append an event and complete once Kafka acknowledged it and this node's view applied it; reads go to
the committed view, gated by per-partition registration and readiness as in Kafka's built-in manager.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import shutil
import threading
import time
from bisect import bisect_right
from collections.abc import Callable, Collection, Iterable, Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka.admin import AdminClient

from rlmm import bootstrap, packed, resume_file, state
from rlmm import view_format as vf
from rlmm.applier import ApplierSettings, MetadataApplier, cyclic_gc_paused
from rlmm.client_security import librdkafka_settings
from rlmm.config import ConfigKey, parse_bool, parse_config, parse_int, parse_str
from rlmm.errors import (
    InvalidArgumentError,
    MetadataLogError,
    MetadataTimeoutError,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageNotReadyError,
)
from rlmm.event_log import (
    EventConsumer,
    EventProducer,
    OffsetReader,
    TopicInfo,
    TopicSettings,
    check_topic,
    ensure_topic,
)
from rlmm.events import MetadataEvent, key_of, metadata_partition_for
from rlmm.read_model import DECODED_ANSWERS_MAX, PartitionSnapshot, SnapshotSlot
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from rlmm.view import MetadataView
from rlmm.writer import MetadataWriter

try:  # built by setup.py where a C compiler is (optional): see rlmm/_segment_lookup.c
    from rlmm._segment_lookup import ReadableTable, SegmentLookup
except ImportError:  # a build without the compiler
    ReadableTable = SegmentLookup = None  # type: ignore[assignment,misc]

log = logging.getLogger(__name__)

CLIENT_PREFIX = "kafka."
# How soon the loader tries a hosted partition that was not ready again: doubling from the first to the second.
LOADER_RETRY_MIN_S = 0.05
LOADER_RETRY_MAX_S = 2.0
# Each time the loader has read this many partitions, the objects alive then (mostly their decoded state) are left
# out of the cyclic collector's passes (_exempt_from_collection). Also during a long warm-up: else the collector's
# full passes walk the growing heap again and again (a restart hosting 1M segments took 17.5-18 s to have every
# hosted partition in memory, 15-16 s with this).
FREEZE_AFTER_LOADS = 64
# How long a registration may spend holding again the partitions the node kept at its last clean close
# (rlmm.resume_file: 0.45-0.7 s per 1M hosted segments on this 2-core VM, their answers decoded later by the loader):
# the broker's metadata thread waits for it, and a restart is ready once it returns, so that with the view's opening
# and the applier's first poll (0.05-0.15 s) a restart is ready within a second on a busy VM too (at 0.75 s it took
# 0.8-0.9 s, 1.3 s once). The rest are taken by the loader in the background, each as it comes to it, sooner when a
# lookup asks for it; their first lookups meanwhile are answered from disk (50-100 µs each).
RESUME_AT_ONCE_S = 0.6
# The loader's pause every few dozen segments it decodes (read_model.PAUSE_EVERY, about 0.5 ms of work): a lookup
# waits at most that long for the interpreter; the pauses add about a tenth to a partition's load.
LOADER_PAUSE_S = 0.00003


def _positive(value: int) -> bool:
    return value > 0


CONFIG_KEYS = (
    ConfigKey("bootstrap.servers", parse_str, required=True),
    ConfigKey("broker.id", parse_int, required=True),
    ConfigKey("state.dir", parse_str, required=True),
    ConfigKey("metadata.topic.name", parse_str, "__tierlog_metadata"),
    ConfigKey("metadata.topic.num.partitions", parse_int, 50, check=_positive, requirement="> 0"),
    ConfigKey("metadata.topic.replication.factor", parse_int, 3, check=_positive, requirement="> 0"),
    # Unset: min(2, replication factor); above the replication factor: refused (rlmm.event_log.TopicSettings).
    ConfigKey("metadata.topic.min.insync.replicas", parse_int, None, check=_positive, requirement="> 0"),
    # An hour of raw history stays on the topic before compaction may drop it: far longer than the archiver
    # needs to copy it (the archive is the long-term audit trail), short enough that the topic's size follows
    # the live state within a day.
    ConfigKey("metadata.topic.min.compaction.lag.ms", parse_int, 3600 * 1000,
              check=lambda v: v >= 0, requirement=">= 0"),
    # How long tombstones stay readable; a node whose view is older than this rebuilds instead of resuming.
    ConfigKey("metadata.topic.delete.retention.ms", parse_int, 12 * 3600 * 1000,
              check=lambda v: v >= 0, requirement=">= 0"),
    # During a rolling upgrade from a release before per-epoch checkpoints (which halts on them): append each
    # checkpoint as that release did, every epoch of the partition under its one key. Costs every epoch per
    # checkpoint; turn it off once every broker runs this release.
    ConfigKey("metadata.checkpoint.whole.partition", parse_bool, False),
    # Compaction never touches the active segment, so it must roll well within a day.
    ConfigKey("metadata.topic.segment.ms", parse_int, 3600 * 1000, check=_positive, requirement="> 0"),
    ConfigKey("metadata.topic.create", parse_bool, True),
    ConfigKey("write.timeout.ms", parse_int, 30_000, check=_positive, requirement="> 0"),
    ConfigKey("startup.timeout.ms", parse_int, 60_000, check=_positive, requirement="> 0"),
    ConfigKey("apply.batch.max.records", parse_int, 2000, check=_positive, requirement="> 0"),
    # A new node folds a large first window of its rebuild on two cores: a worker process takes half of the
    # metadata partitions (rlmm.fresh_load). Off: one process does it all.
    ConfigKey("apply.rebuild.worker", parse_bool, True),
    # The fetch path's lookup in C when the extension was built; off: the same answers from Python alone.
    ConfigKey("lookup.native", parse_bool, True),
    # Read every hosted partition into memory in the background once it is ready (a restart, a new leader or
    # follower), so that its first lookups find it there; off: each is read when first looked up.
    ConfigKey("lookup.warmup", parse_bool, True),
    # At a clean close, keep the hosted partitions' in-memory state beside the view (rlmm.resume_file), so that the
    # restarted node serves them from memory as soon as they are ready again; off: it reads them from the view.
    ConfigKey("lookup.resume", parse_bool, True),
    # How long after the broker's first registration a kept partition it has not hosted again is still held for a
    # later registration (a broker that registers its partitions over several calls); then it is let go.
    ConfigKey("lookup.resume.hold.ms", parse_int, 60_000, check=lambda value: value >= 0, requirement=">= 0"),
    # How many hosted segments' lookup answers are kept decoded (rlmm.read_model.DECODED_ANSWERS_MAX), partition by
    # partition as they are first served; the others are held packed only and unpacked by each lookup.
    ConfigKey("lookup.decoded.max.segments", parse_int, DECODED_ANSWERS_MAX, check=lambda value: value >= 0,
              requirement=">= 0"),
    *bootstrap.CONFIG_KEYS,  # snapshot.* (issue 11: snapshot bootstrap)
)


class RemoteLogMetadataManager:
    """Kafka's RemoteLogMetadataManager, event-sourced on a compacted topic and materialized in RocksDB."""

    def __init__(self, config: Mapping[str, Any], snapshot_source: bootstrap.SnapshotSource | None = None) -> None:
        self._cfg = parse_config(config, CONFIG_KEYS, "RemoteLogMetadataManager", ignore_prefixes=(CLIENT_PREFIX,))
        self.broker_id: int = self._cfg["broker.id"]
        self.metadata_topic: str = self._cfg["metadata.topic.name"]
        self.num_partitions: int = self._cfg["metadata.topic.num.partitions"]
        self._write_timeout_s = self._cfg["write.timeout.ms"] / 1000
        client = librdkafka_settings({
            "bootstrap.servers": self._cfg["bootstrap.servers"],
            **{k[len(CLIENT_PREFIX):]: v for k, v in config.items() if k.startswith(CLIENT_PREFIX)},
        })
        startup_s = self._cfg["startup.timeout.ms"] / 1000
        started = time.monotonic()
        self._lock = threading.Condition()
        self._registered: dict[TopicIdPartition, int | None] = {}  # tp -> metadata offset it must reach
        self._resume_hold: threading.Timer | None = None  # lets go of kept state not hosted again in time
        # Partitions found registered and caught up under the lock, until stopped (see _snapshot). Keyed by topic id
        # (as an int) and partition, not by TopicIdPartition, whose hash and equality run Python code (UUID's): the
        # costliest step of a lookup. The entry carries the topic name, which must match too. With the lookup in C,
        # a table of its own: the same mapping, laid out so that a lookup reaches fewer objects.
        native = ReadableTable is not None and self._cfg["lookup.native"]
        self._readable_now: dict[tuple[int, int], _Readable] | ReadableTable = ReadableTable() if native else {}
        self._closed = False
        # Reads each hosted partition whole and publishes its snapshot, off the fetch path, once it is ready: those a
        # lookup asked for first, then every registered one (_PartitionLoader). Until then its lookups are answered
        # from the view on disk (_cold_lookup): a restart or a newly hosted partition never waits on the fetch path.
        self._loader = _PartitionLoader(self._load, f"tierlog-rlmm-load-{self.broker_id}")
        admin = AdminClient(client)
        if self._cfg["metadata.topic.create"]:
            topic = ensure_topic(admin, TopicSettings(
                self.metadata_topic, self.num_partitions, self._cfg["metadata.topic.replication.factor"],
                self._cfg["metadata.topic.min.insync.replicas"], self._cfg["metadata.topic.min.compaction.lag.ms"],
                {}, self._cfg["metadata.topic.delete.retention.ms"], self._cfg["metadata.topic.segment.ms"],
            ), startup_s)
        else:
            topic = check_topic(admin, self.metadata_topic, self.num_partitions, startup_s)
        offsets = OffsetReader(self.metadata_topic, client, admin)  # a client that answered: see OffsetReader
        checked = time.monotonic()
        self._view = _open_view(self._cfg, topic, offsets, startup_s, snapshot_source)
        opened = time.monotonic()
        try:
            self._resume_state()
            producer = EventProducer(self.metadata_topic, client)
            consumer = EventConsumer(self.metadata_topic, client, self.num_partitions)
        except BaseException:
            self._view.close()
            raise
        self._writer = MetadataWriter(
            producer, self._lock, self.broker_id, self._cfg["write.timeout.ms"],
            f"check that the brokers at {self._cfg['bootstrap.servers']} serve topic {self.metadata_topic}",
            lambda: self._applier.storage_problem, self._cfg["metadata.checkpoint.whole.partition"],
        )
        self._consumer = consumer
        self._offsets = offsets
        self._applier = MetadataApplier(
            ApplierSettings(self.metadata_topic, topic.topic_id, self.broker_id, self._cfg["apply.batch.max.records"],
                            self._cfg["apply.rebuild.worker"]),
            self._view, consumer, offsets, self._writer, self._lock, self._registered, self._metadata_partition,
            self._targets_set_locked, self._taken_back_locked,
        )
        # The view keeps one read model for its life; lookups go to it, and to these dicts, directly. It holds in
        # memory only the partitions this node hosts (registered, until stopped); the rest of the view stays on disk.
        self._model = self._view.model
        self._model.hold_hosted()
        self._model.decoded_answers_max = self._cfg["lookup.decoded.max.segments"]
        self._halted = self._applier.halted
        if not isinstance(self._readable_now, dict):  # a ReadableTable: the lookup in C was built
            # The fetch path's lookup in C when it was built (rlmm/_segment_lookup.c): the lock-free path of the
            # method below without the interpreter's per-step cost; everything else it hands to that method.
            self.remote_log_segment_metadata = _unpacking(  # type: ignore[method-assign,assignment]
                SegmentLookup(self._readable_now, self._halted, TopicIdPartition,
                              RemoteLogMetadataManager.remote_log_segment_metadata.__get__(self)),
                self._readable_now)
            log.info("segment lookups of served partitions are answered in C (rlmm._segment_lookup)")
        elif self._cfg["lookup.native"]:
            log.info("segment lookups are answered in Python: rlmm._segment_lookup was not built at install "
                     "(no C compiler then); answers are the same, each takes a few tenths of a microsecond more")
        # Where a slow start went (a restart is ready in well under a second once the broker registers its partitions).
        log.info("started in %.3f s: metadata topic %s checked in %.3f s, the view at %s opened and checked against it "
                 "in %.3f s, the rest %.3f s", time.monotonic() - started, self.metadata_topic, checked - started,
                 self._view.path, opened - checked, time.monotonic() - opened)

    # --- context manager -----------------------------------------------------------------------------------

    def __enter__(self) -> RemoteLogMetadataManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- writes ---------------------------------------------------------------------------------------------

    def add_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> Future[None]:
        _require(metadata, RemoteLogSegmentMetadata, "remote_log_segment_metadata")
        return self._write(metadata.topic_id_partition, lambda: state.prepare_add(self._view, metadata))

    def update_remote_log_segment_metadata(self, update: RemoteLogSegmentMetadataUpdate) -> Future[None]:
        _require(update, RemoteLogSegmentMetadataUpdate, "remote_log_segment_metadata_update")
        return self._write(update.topic_id_partition, lambda: state.prepare_update(self._view, update))

    def put_remote_partition_delete_metadata(self, metadata: RemotePartitionDeleteMetadata) -> Future[None]:
        _require(metadata, RemotePartitionDeleteMetadata, "remote_partition_delete_metadata")

        def prepare() -> MetadataEvent:
            state.prepare_partition_delete(self._view, metadata)
            return metadata

        return self._write(metadata.topic_id_partition, prepare)

    def _write(self, tp: TopicIdPartition, prepare: Callable[[], MetadataEvent]) -> Future[None]:
        mp = self._metadata_partition(tp)
        deadline = time.monotonic() + self._write_timeout_s
        with self._lock:
            self._check_writable(mp)
            # A write is checked against this node's view, so it waits (within its deadline) for a registered
            # partition's history to load rather than validating against a partial view.
            while tp in self._registered and not self._ready_locked(tp):
                if not self._lock.wait(max(0.0, deadline - time.monotonic())):
                    raise RemoteStorageNotReadyError(
                        f"remote log metadata for {tp} is still loading on broker {self.broker_id} after "
                        f"{self._cfg['write.timeout.ms']} ms; retry the write"
                    )
                self._check_writable(mp)
            # One write per user partition at a time, so each write is validated against a view that already
            # holds the previous one and its lineage checkpoint.
            while self._writer.busy_locked(tp):
                if not self._lock.wait(max(0.0, deadline - time.monotonic())):
                    raise MetadataTimeoutError(f"a previous metadata write for {tp} did not complete in time")
                self._check_writable(mp)
            event: MetadataEvent = prepare()
            pending = self._writer.begin_locked(tp, mp, deadline)
            if isinstance(event, RemotePartitionDeleteMetadata) and \
                    event.state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                pending.doomed = state.doomed_keys(self._view, tp)
            recovery = state.pending_checkpoint(self._view, tp, _now_ms(), self.broker_id,
                                                self._writer.whole_partition_checkpoints)
            # A writer died between an event and its checkpoint; restore the checkpoint before going on.
            before = state.checkpoint_records(recovery)
            appends = self._writer.register_locked(pending, [*before, (key_of(event), event)], primary=True)
        # Appending may wait for room in the producer's queue: never while holding the lock.
        self._writer.produce(appends)
        return pending.future

    def _check_writable(self, mp: int) -> None:
        self._check_open()
        if mp in self._applier.halted:
            raise self._applier.halted[mp]

    # --- registration and readiness -----------------------------------------------------------------------

    def on_partition_leadership_changes(
        self, leader_partitions: Iterable[TopicIdPartition], follower_partitions: Iterable[TopicIdPartition]
    ) -> None:
        with self._lock:
            self._check_open()
            hosted = [*leader_partitions, *follower_partitions]
            for tp in hosted:
                _require(tp, TopicIdPartition, "topic_id_partition")
                self._registered.setdefault(tp, None)
            if self._model.resuming():
                # The state of those served before the restart is held again now, for up to RESUME_AT_ONCE_S (the
                # loader takes the rest; rlmm.resume_file): objects for the rest of the node's life, which the cyclic
                # collector's passes would walk again and again while they are made (three quarters of the time), and
                # once more after. They are left out of its passes as made (_exempt_from_collection), without a pass
                # first: they hold no cycles.
                with cyclic_gc_paused():
                    self._model.host((vf.tp_key_of(tp) for tp in hosted), RESUME_AT_ONCE_S)
                    gc.freeze()
            else:
                self._model.host(vf.tp_key_of(tp) for tp in hosted)
            if hosted and self._model.resuming() and self._resume_hold is None:
                # A broker registers the partitions it hosts as it starts, at once or over a few calls: the state of
                # those it served before and has not hosted again within the hold is let go.
                self._resume_hold = threading.Timer(self._cfg["lookup.resume.hold.ms"] / 1000, self._model.end_resume)
                self._resume_hold.name = f"tierlog-rlmm-resume-hold-{self.broker_id}"
                self._resume_hold.daemon = True
                self._resume_hold.start()
        self._applier.registered()
        if self._cfg["lookup.warmup"]:
            self._loader.warm(hosted)

    def on_stop_partitions(self, partitions: Iterable[TopicIdPartition]) -> None:
        with self._lock:
            stopped = list(partitions)
            for tp in stopped:
                self._registered.pop(tp, None)
                # Whatever name the entry has: a partition still registered is found readable again when next read.
                self._readable_now.pop((tp.topic_id.int, tp.partition), None)
            # Its decoded state and snapshot go; the view keeps it on disk for when the node hosts it again.
            self._model.unhost(vf.tp_key_of(tp) for tp in stopped if tp not in self._registered)
        self._loader.forget(stopped)

    def is_ready(self, tp: TopicIdPartition) -> bool:
        with self._lock:
            return tp in self._registered and self._ready_locked(tp)

    def _ready_locked(self, tp: TopicIdPartition) -> bool:
        target = self._registered.get(tp)
        mp = self._metadata_partition(tp)
        # Ready once its metadata partition is applied up to the target, or its records up to it were loaded ahead
        # of the rest (MetadataApplier._load_in_workers). While a backlog loads, the records after it wait: this
        # node's own writes to a ready partition are acknowledged once the backlog is loaded.
        return target is not None and mp not in self._applier.halted and (
            self._applier.applied.get(mp, 0) >= target or self._applier.ready_ahead(vf.tp_key_of(tp), mp, target))

    def _taken_back_locked(self, tp_keys: Collection[bytes]) -> None:
        """The applier took back partitions a rebuild had loaded ahead of the rest (MetadataApplier._take_back): not
        ready until their metadata partitions are read again, so no longer served without the lock."""
        for tp_key in tp_keys:
            topic_id, partition = vf.tp_of_key(tp_key)
            self._readable_now.pop((topic_id.int, partition), None)

    def _snapshot(self, tp: TopicIdPartition) -> PartitionSnapshot:
        """The partition's lookup snapshot, once registration, deletion, halt and readiness allow reads.

        On the broker's fetch path, so it takes no lock for a partition already found readable: readiness never
        goes back while tp stays registered, and tp leaves `_readable_now` when stopped; a halt or a deletion the
        snapshot shows sends the call through the full checks again (the applier unregisters a deleted partition).
        """
        readable = self._readable_now.get((tp.topic_id.int, tp.partition)) if type(tp) is TopicIdPartition else None
        if readable is not None and readable.topic == tp.topic and (
                not self._halted or readable.metadata_partition not in self._halted):
            snapshot = readable.snapshot
            if not snapshot.deleted:
                return snapshot
        _require(tp, TopicIdPartition, "topic_id_partition")
        with self._lock:
            return self._readable_locked(tp)

    def _readable_locked(self, tp: TopicIdPartition) -> PartitionSnapshot:
        """tp's snapshot, tp now found readable (served without the lock from now on); raises as a read would."""
        mp = self._check_readable_locked(tp)
        readable = _Readable(tp.topic, vf.tp_key_of(tp), mp)
        snapshot = self._model.watch(readable.key, readable)  # fills readable.snapshot before anyone reads it
        self._readable_now[(tp.topic_id.int, tp.partition)] = readable
        return snapshot

    def _targets_set_locked(self) -> None:
        """The applier gave registered partitions the offsets they must reach (under the lock). Those whose state
        the node kept from before its restart (rlmm.resume_file) and are ready now are served without the lock at
        once, before anyone finds them ready; the loader tries the others not ready before now."""
        watched = self._model.snapshots
        for tp in self._registered:
            if vf.tp_key_of(tp) in watched and (tp.topic_id.int, tp.partition) not in self._readable_now \
                    and self._ready_locked(tp):
                with contextlib.suppress(RemoteStorageError):  # deleted meanwhile: its reads raise as they should
                    self._readable_locked(tp)
        self._loader.retry_waiting()

    def _check_readable_locked(self, tp: TopicIdPartition) -> int:
        """Raise what Kafka's manager raises for a read of tp now; else tp's metadata partition."""
        self._check_open()
        # The partition's delete state from the read model if it holds the partition, else from disk (reading it
        # whole here would put that on the fetch path: _cold_lookup).
        if tp not in self._registered or state.is_deleted(self._view.batch(), tp):
            raise RemoteResourceNotFoundError(
                f"no remote log metadata for {tp} on broker {self.broker_id}: the partition is not assigned "
                f"here (on_partition_leadership_changes) or its remote data was deleted"
            )
        mp = self._metadata_partition(tp)
        halted = self._applier.halted.get(mp)
        if halted is not None:
            raise halted
        if not self._ready_locked(tp):
            raise RemoteStorageNotReadyError(
                f"remote log metadata for {tp} is still loading on broker {self.broker_id} "
                f"(metadata partition {mp} applied to offset {self._applier.applied.get(mp, 0)}); retry"
            )
        return mp

    # --- reads: the partition's snapshot (rlmm.read_model), after plain type checks --------------------------

    def remote_log_segment_metadata(
        self, tp: TopicIdPartition, leader_epoch: int, offset: int
    ) -> RemoteLogSegmentMetadata | None:
        # The broker's fetch path: a plain non-negative int passes without a call; anything else gets
        # _require_int's checks and messages.
        if type(leader_epoch) is not int or leader_epoch < 0:
            _require_int(leader_epoch, "leader_epoch")
        if type(offset) is not int or offset < 0:
            _require_int(offset, "offset")
        # _snapshot's lock-free path and PartitionSnapshot.segment_for_offset (and floors_of), inlined: those calls
        # are a tenth of a lookup's cost. Anything short of a readable partition goes through _snapshot's full checks.
        readable = self._readable_now.get((tp.topic_id.int, tp.partition)) if type(tp) is TopicIdPartition else None
        if readable is not None and readable.topic == tp.topic and (
                not self._halted or readable.metadata_partition not in self._halted):
            snapshot = readable.snapshot
            if not snapshot.deleted:
                if leader_epoch == snapshot.sole_epoch:
                    segments, bounds = snapshot.sole_segments, snapshot.sole_bounds
                else:
                    floors = snapshot.floors.get(leader_epoch)
                    if floors is None:
                        return None
                    segments, bounds = floors.segments, floors.bounds
                # EpochFloors.floor, inlined too.
                count = len(segments)
                position = bisect_right(bounds, offset, 0, count)
                found = segments[position - 1] if position and offset <= bounds[count + position - 1] else None
                return None if found is None else snapshot.unpack(found)
        return self._cold_lookup(tp, leader_epoch, offset)

    def _cold_lookup(self, tp: TopicIdPartition, leader_epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
        """A lookup of a partition not served from memory yet (the first after a restart, or after the node began
        hosting it): answered key by key from the view on disk, after the same checks, while the loader thread reads
        the partition whole and publishes its snapshot for the lookups after it."""
        _require(tp, TopicIdPartition, "topic_id_partition")
        with self._lock:
            self._check_readable_locked(tp)
            if vf.tp_key_of(tp) not in self._model.partitions:
                self._loader.urgent(tp)
                return state.segment_for_offset(self._view.batch(), tp, leader_epoch, offset)
        return self._snapshot(tp).segment_for_offset(leader_epoch, offset)

    def _load(self, tp: TopicIdPartition, urgent: bool) -> bool:
        """Read tp whole and publish its snapshot for lookups without the lock (the loader's thread); False when tp
        is registered but not ready yet, to be tried again later. The warm-up also waits while the applier reads a
        backlog: the partitions it holds would be spread among the backlog's short-lived objects, which then could
        not go back to the OS once freed (hundreds of MiB after a rebuild at 1M live segments)."""
        with self._lock:
            if self._closed or tp not in self._registered:
                return True
            if not self._ready_locked(tp) or (not urgent and self._applier.catching_up):
                return False
        # Under the read model's lock only: the applier and the other partitions' lookups go on meanwhile, and the
        # interpreter goes to them every few dozen segments (_let_others_run).
        self._model.prepare(vf.tp_key_of(tp), _let_others_run)
        try:
            self._snapshot(tp)  # finds the snapshot prepared, and serves it to lookups without the lock
        except RemoteStorageError as exc:  # stopped, deleted, halted or closed meanwhile: its next lookup checks again
            log.debug("reading %s for its lookups: %s", tp, exc)
        return True

    def highest_offset_for_epoch(self, tp: TopicIdPartition, leader_epoch: int) -> int | None:
        _require_int(leader_epoch, "leader_epoch")
        return self._snapshot(tp).highest_offset_for_epoch(leader_epoch)

    def list_remote_log_segments(
        self, tp: TopicIdPartition, leader_epoch: int | None = None
    ) -> list[RemoteLogSegmentMetadata]:
        if leader_epoch is not None:
            _require_int(leader_epoch, "leader_epoch")
        return self._snapshot(tp).list_segments(leader_epoch)

    def remote_log_size(self, tp: TopicIdPartition, leader_epoch: int) -> int:
        _require_int(leader_epoch, "leader_epoch")
        return self._snapshot(tp).remote_log_size(leader_epoch)

    def next_segment_with_txn_index(
        self, tp: TopicIdPartition, leader_epoch: int, offset: int
    ) -> RemoteLogSegmentMetadata | None:
        _require_int(leader_epoch, "leader_epoch")
        _require_int(offset, "offset")
        return self._snapshot(tp).next_segment_with_txn_index(leader_epoch, offset)

    def view_digest(self) -> str:
        return self._view.digest()

    def metadata_errors(self) -> dict[int, MetadataLogError]:
        """Metadata partitions this node stopped applying, with the error that stopped them."""
        with self._lock:
            return dict(self._applier.halted)

    def applied_offsets(self) -> dict[int, int]:
        with self._lock:
            return dict(self._applier.applied)

    def partitions_loading(self) -> int:
        """Hosted partitions not read into memory yet by the background loader (lookup.warmup), or asked for by a
        lookup and not read yet: their lookups are answered from the view on disk meanwhile."""
        return self._loader.pending()

    def record_counts(self) -> tuple[int, int]:
        """Records this manager applied to its view and records the state machine dropped (invalid), so far."""
        with self._lock:
            return self._applier.records_applied, self._applier.records_dropped

    def wait_caught_up(self, timeout_s: float) -> None:
        """Block until the view has applied every metadata partition up to its current end offset.

        Raises MetadataTimeoutError (or another RemoteStorageError when Kafka refuses) by the deadline.
        """
        deadline = time.monotonic() + timeout_s
        ends = self._offsets.end_offsets(list(range(self.num_partitions)), timeout_s)
        with self._lock:
            applied, halted = self._applier.applied, self._applier.halted
            while any(applied.get(p, 0) < end for p, end in ends.items() if p not in halted):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MetadataTimeoutError(
                        f"view did not catch up with {self.metadata_topic} within {timeout_s}s "
                        f"(applied {applied}, end offsets {ends})"
                    )
                self._lock.wait(min(remaining, 0.1))

    @property
    def view(self) -> MetadataView:
        return self._view

    # --- lifecycle ------------------------------------------------------------------------------------------

    def _metadata_partition(self, tp: TopicIdPartition) -> int:
        return metadata_partition_for(tp.topic_id, tp.partition, self.num_partitions)

    def _check_open(self) -> None:
        if self._closed:
            raise RemoteStorageError("RemoteLogMetadataManager is closed")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._readable_now.clear()
        if self._resume_hold is not None:
            self._resume_hold.cancel()
        self._model.end_resume()
        self._loader.close(timeout_s=10)  # a load in progress takes milliseconds
        stopped = self._applier.close(timeout_s=10)
        self._writer.close(timeout_s=5)
        self._consumer.close()
        if stopped and self._cfg["lookup.resume"]:
            self._keep_state()
        self._view.close()

    # --- the hosted partitions' state across a clean restart (rlmm.resume_file) ----------------------------

    def _resume_state(self) -> None:
        """Take what this node served when it last closed cleanly, if the view is still as it was then."""
        path = self._view.path / resume_file.FILE_NAME  # inside the view's directory: it goes with the view
        if not self._cfg["lookup.resume"]:
            resume_file.remove(path)  # never to be taken for a view that changes from now on
            return
        started = time.monotonic()
        try:
            resumed = resume_file.take(path, self._view.state_mark(self.metadata_topic))
        except OSError as exc:
            log.warning("could not read %s: %s; the hosted partitions are read from the view", path, exc)
            return
        if resumed is not None:
            self._view.model.resume(resumed)
            log.info("kept the state of %d user partitions this node served when it closed (%.3f s); each is served "
                     "from memory once hosted and ready again", len(resumed), time.monotonic() - started)

    def _keep_state(self) -> None:
        """Write the state of the partitions served now beside the view (the applier has stopped: nothing changes it
        any more). A failure costs only the next start's speed."""
        path = self._view.path / resume_file.FILE_NAME
        started = time.monotonic()
        try:
            with self._model.lock:
                served = [(tp_key, self._model.partitions[tp_key], snapshot)
                          for tp_key, snapshot in self._model.snapshots.items() if tp_key in self._model.partitions]
                if not served:
                    return
                count = resume_file.write(path, self._view.state_mark(self.metadata_topic), served)
        except Exception as exc:  # rocksdict raises bare Exception; a full disk, a failed sync: OSError
            log.warning("could not keep the served partitions' state for the next start in %s: %s (it reads them "
                        "from the view instead)", path, exc)
            resume_file.remove(path)
            return
        log.info("kept the state of %d served user partitions for the next start in %s (%.3f s)", count, path,
                 time.monotonic() - started)


def _let_others_run() -> None:
    """Hand the interpreter to any thread waiting for it. A thread that keeps it (decoding, not waiting on I/O) holds
    it for the whole switch interval (5 ms) once another asks for it; a lookup on the fetch path then waits that long.
    A sleep releases it for long enough that a waiting thread takes it; one of 0 s may be over before that happens."""
    time.sleep(LOADER_PAUSE_S)


class _PartitionLoader:
    """A thread that loads hosted partitions (`load`: the manager's _load) one at a time: first those a lookup found
    not in memory, then those registered (the warm-up), in order. A partition not ready yet is tried again after a
    pause that doubles while nothing is ready (up to LOADER_RETRY_MAX_S), so a node rebuilding its view checks its
    hosted partitions a few times a second at most."""

    def __init__(self, load: Callable[[TopicIdPartition, bool], bool], name: str) -> None:
        self._load = load
        self._cond = threading.Condition()
        # Insertion-ordered sets: asked for by a lookup, registered, and found not ready (tried again later).
        self._urgent: dict[TopicIdPartition, None] = {}
        self._warm: dict[TopicIdPartition, None] = {}
        self._waiting: dict[TopicIdPartition, None] = {}
        self._pause_s = LOADER_RETRY_MIN_S
        self._loading = 0  # partitions being loaded now (0 or 1)
        self._loaded_since_freeze = 0  # partitions loaded since the heap was last exempted from collection
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def urgent(self, tp: TopicIdPartition) -> None:
        with self._cond:
            if tp not in self._urgent:
                self._urgent[tp] = None
                self._warm.pop(tp, None)
                self._waiting.pop(tp, None)
                self._cond.notify()

    def warm(self, tps: Iterable[TopicIdPartition]) -> None:
        with self._cond:
            self._warm.update((tp, None) for tp in tps if tp not in self._urgent)
            self._cond.notify()

    def retry_waiting(self) -> None:
        """Registered partitions were just given the offsets they must reach: try those not ready before now, not
        after the pause (a restarted node is ready as soon as it knows them)."""
        with self._cond:
            if self._waiting:
                self._warm.update(self._waiting)
                self._waiting = {}
                self._pause_s = LOADER_RETRY_MIN_S
                self._cond.notify()

    def forget(self, tps: Iterable[TopicIdPartition]) -> None:
        with self._cond:
            for tp in tps:
                self._urgent.pop(tp, None)
                self._warm.pop(tp, None)
                self._waiting.pop(tp, None)

    def pending(self) -> int:
        """Partitions to load: queued, waiting to be ready, or being loaded now."""
        with self._cond:
            return len(self._urgent) + len(self._warm) + len(self._waiting) + self._loading

    def close(self, timeout_s: float) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join(timeout_s)

    def _next(self) -> tuple[TopicIdPartition, bool] | None:
        """The next partition to load and whether a lookup asked for it, waiting for one; None once closed."""
        with self._cond:
            while not self._closed:
                queue = self._urgent or self._warm
                if queue:
                    tp = next(iter(queue))
                    del queue[tp]
                    self._loading = 1
                    return tp, queue is self._urgent
                if not self._waiting:
                    self._cond.wait()
                elif not self._cond.wait(self._pause_s):  # nothing else came: try the waiting ones again
                    self._warm, self._waiting = self._waiting, {}
                    self._pause_s = min(self._pause_s * 2, LOADER_RETRY_MAX_S)
            return None

    def _run(self) -> None:
        while (asked := self._next()) is not None:
            tp, urgent = asked
            try:
                loaded = self._load(tp, urgent)
            except Exception:  # a bug or a storage error: the partition's next lookup reads it then
                log.exception("reading %s for its lookups failed", tp)
                loaded = True
            with self._cond:
                self._loading = 0
                if loaded:
                    self._pause_s = LOADER_RETRY_MIN_S
                    self._loaded_since_freeze += 1
                else:
                    self._waiting[tp] = None
            if self._loaded_since_freeze >= FREEZE_AFTER_LOADS:
                self._loaded_since_freeze = 0
                _exempt_from_collection()


def _exempt_from_collection() -> None:
    """Leave the objects alive now (the hosted partitions' decoded state, the bulk of the heap) out of the cyclic
    collector's future passes. Each full pass walks every tracked object, about 90 ms at 100k hosted segments,
    holding the GIL: a lookup or a newly hosted partition that met one waited that long. The young generations are
    collected first, so that little garbage is kept; frozen objects are still freed when no longer referenced."""
    gc.collect(1)
    gc.freeze()


def _unpacking(lookup: Callable[[TopicIdPartition, int, int], Any], readable_now: ReadableTable
               ) -> Callable[[TopicIdPartition, int, int], RemoteLogSegmentMetadata | None]:
    """The C lookup answers a readable partition's lookup with the segment as its snapshot holds it: decoded, returned
    as it is, or packed (rlmm.packed, past rlmm.read_model.DECODED_ANSWERS_MAX), unpacked here relative to the
    snapshot's tp (the argument's, should the partition have stopped meanwhile: the same topic id and partition).
    Its fallback's answers are returned as they are."""
    def remote_log_segment_metadata(tp: TopicIdPartition, leader_epoch: int, offset: int
                                    ) -> RemoteLogSegmentMetadata | None:
        found = lookup(tp, leader_epoch, offset)
        if type(found) is not bytes:
            return found
        readable = readable_now.get((tp.topic_id.int, tp.partition))
        return packed.unpack(found, tp if readable is None or readable.snapshot.tp is None else readable.snapshot.tp)

    remote_log_segment_metadata.__wrapped__ = lookup  # type: ignore[attr-defined]
    return remote_log_segment_metadata


class _Readable(SnapshotSlot):
    """A partition found readable: its topic name, read model key, metadata partition and (kept current by the read
    model) snapshot: everything a lookup without the lock reads, in one object."""

    __slots__ = ("key", "metadata_partition", "topic")

    def __init__(self, topic: str, key: bytes, metadata_partition: int) -> None:
        super().__init__()
        self.topic = topic
        self.key = key
        self.metadata_partition = metadata_partition


def _open_view(config: Mapping[str, Any], topic: TopicInfo, offsets: OffsetReader, timeout_s: float,
               snapshot_source: bootstrap.SnapshotSource | None) -> MetadataView:
    """Open the view, or rebuild it from scratch when resuming it could miss or misread records. A view that applied
    nothing first loads the newest verified snapshot, when one is configured (issue 11, rlmm.bootstrap), and is then
    checked like any other."""
    state_dir, metadata_topic = config["state.dir"], config["metadata.topic.name"]
    view = MetadataView.open(state_dir)
    try:
        view = _resumable(view, state_dir, metadata_topic, topic, offsets, timeout_s)
        if not view.applied_offsets(metadata_topic):
            bootstrap.maybe_bootstrap(view, config, snapshot_source, topic, offsets, _now_ms(), timeout_s)
            view = _resumable(view, state_dir, metadata_topic, topic, offsets, timeout_s)
        source = view.source(metadata_topic)
        if source is None or source[0] != topic.topic_id:  # not written again unchanged (rlmm.resume_file)
            view.set_source(metadata_topic, topic.topic_id, _now_ms() if source is None else source[1])
    except BaseException:
        view.close()
        raise
    return view


def _resumable(view: MetadataView, state_dir: str, metadata_topic: str, topic: TopicInfo, offsets: OffsetReader,
               timeout_s: float) -> MetadataView:
    """The view, or an empty one in its place when resuming it could miss or misread records."""
    reason = _why_not_resume(view, metadata_topic, topic, offsets, timeout_s)
    if reason is None:
        return view
    log.warning("rebuilding the metadata view at %s from topic %s: %s", view.path, metadata_topic, reason)
    view.close()
    shutil.rmtree(view.path)
    return MetadataView.open(state_dir)


def _why_not_resume(
    view: MetadataView, metadata_topic: str, topic: TopicInfo, offsets: OffsetReader, timeout_s: float
) -> str | None:
    stored = view.applied_offsets(metadata_topic)
    if not stored:
        # Every batch a node applies is committed with its offsets: entries without them are a snapshot load cut
        # short (rlmm.bootstrap), or another topic's view.
        return ("it holds entries but no applied offset of the topic (a snapshot load cut short, or a view of "
                "another topic)") if view.holds_entries() else None
    source = view.source(metadata_topic)
    if source is None:
        return "the view does not record which topic it was built from (a snapshot load records it last)"
    topic_id, applied_at_ms = source
    if topic_id != topic.topic_id:
        return f"the topic was recreated (id {topic_id} in the view, {topic.topic_id} now)"
    age_ms = _now_ms() - applied_at_ms
    if age_ms > topic.delete_retention_ms:
        return (f"the view was last applied {age_ms} ms ago, longer than the topic keeps tombstones "
                f"(delete.retention.ms={topic.delete_retention_ms}), so deletions may have been missed")
    partitions = sorted(stored)
    starts = offsets.start_offsets(partitions, timeout_s)
    ends = offsets.end_offsets(partitions, timeout_s)
    for partition in partitions:
        if not starts[partition] <= stored[partition] <= ends[partition]:
            return (f"stored offset {stored[partition]} of partition {partition} is outside the log "
                    f"[{starts[partition]}, {ends[partition]}]")
    return None


def _require(value: object, expected: type, name: str) -> None:
    if not isinstance(value, expected):
        raise InvalidArgumentError(f"{name} must be a {expected.__name__}, got {type(value).__name__}")


def _require_int(value: object, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if value < 0:
        raise InvalidArgumentError(f"{name} must be >= 0, got {value}")


def _now_ms() -> int:
    return int(time.time() * 1000)


