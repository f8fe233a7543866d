"""A tierlog node in migration mode (`migration.mode=dual-write`): during a roll from Kafka's
TopicBasedRemoteLogMetadataManager (TBRLMM), it keeps both metadata stores whole so each side sees the other's writes,
and both apply one sequence of events in one order.

- One order: until finalize, `__remote_log_metadata` is the only topic written first. A node's own add, update and
  partition delete goes there only, in Kafka's format (the partition TBRLMM's partitioner picks, with its broker id
  in records.WRITER_HEADER, which TBRLMM ignores), after the manager's own checks against its view; the import below
  brings it into tierlog like a TBRLMM broker's record, and the call completes once this node's view holds it. So
  every user partition's events reach tierlog's topic in their order on `__remote_log_metadata`: TBRLMM's replay and
  tierlog's view apply the same sequence (two leaders copying the same offsets during a roll end alike in both).
- Import: the nodes share a consumer group on `__remote_log_metadata`; the owner of each of its partitions writes
  every record there into tierlog (tierlog.migration.records, as `tierlog migrate` does), each user partition's
  records in order, committing the group's offsets after each batch. A record tierlog holds already is a no-op.
  The import goes on after finalize, idle, to take in the writes that were in flight then.
- Readiness: a partition registered here is ready once tierlog's manager says so and, in addition, the import has
  taken in what `__remote_log_metadata` held for it when first asked, and this view has applied that import. Until
  then its reads raise RemoteStorageNotReadyError, as TBRLMM's do for a partition it has not loaded: a new leader
  never answers from a view that lacks its predecessor's writes.
- Control: the node announces itself and a heartbeat on the control topic (tierlog.migration.control); once
  `tierlog migrate finalize` appends its record there, its writes go to tierlog's topic directly.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from rlmm.client_security import librdkafka_settings
from rlmm.config import ConfigKey, parse_config, parse_int, parse_str
from rlmm.errors import (
    ConfigError,
    InvalidArgumentError,
    MetadataLogError,
    MetadataTimeoutError,
    RemoteStorageError,
    RemoteStorageNotReadyError,
)
from rlmm.event_log import OffsetReader
from rlmm.events import metadata_partition_for
from rlmm.kafka_format import encode, metadata_partition
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
)
from tierlog.migration.control import (
    DEFAULT_CONTROL_TOPIC,
    DUAL_WRITE,
    FINALIZE_KEY,
    FINALIZED,
    Announcement,
    ensure_control_topic,
    now_ms,
    read_control,
)
from tierlog.migration.records import (
    DEFAULT_SOURCE_TOPIC,
    WRITER_HEADER,
    Skipped,
    SourceProblem,
    SourceRecord,
    TopicMetadata,
    check_call,
    decode_source_record,
    reflected,
    start_write,
)

log = logging.getLogger(__name__)

PREFIX = "migration."
MODES = ("off", DUAL_WRITE)
CONFIG_KEYS = (
    ConfigKey("migration.mode", parse_str, "off", check=lambda v: v in MODES, requirement=" or ".join(MODES)),
    ConfigKey("migration.source.topic", parse_str, DEFAULT_SOURCE_TOPIC),
    ConfigKey("migration.control.topic", parse_str, DEFAULT_CONTROL_TOPIC),
    ConfigKey("migration.heartbeat.ms", parse_int, 5000, check=lambda v: v > 0, requirement="> 0"),
)
# The manager's own keys this component reads too (rlmm.manager's defaults).
_WRITE_TIMEOUT_MS, _STARTUP_TIMEOUT_MS, _REPLICATION_FACTOR = 30_000, 60_000, 3
CLIENT_PREFIX = "kafka."
POLL_S = 0.2
# How often an own write is checked for having reached this view through the import (a write waits this long at most
# beyond that), and how long the import waits for the source's next records.
SETTLE_POLL_S = IMPORT_POLL_S = 0.02
# is_ready answers the broker's call: its offset queries wait at most this long (the broker asks again).
READY_QUERY_S = 5.0
# A read of a partition whose gate is closed checks it again on the broker's fetch path, for at most this long (within
# the broker's remote.fetch.max.wait.ms default, 500 ms).
READ_QUERY_S = 0.5
IMPORT_SESSION_TIMEOUT_MS = 10_000
RETRY_PAUSE_S = 1.0
CLOSE_TIMEOUT_S = 10.0


def import_group(metadata_topic: str) -> str:
    """The consumer group whose committed offsets say how far `__remote_log_metadata` is imported into tierlog's
    `metadata_topic` (also committed by `tierlog migrate` once a bulk import is done)."""
    return f"tierlog-migration-{metadata_topic}"


def split_config(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rlmm config without the migration keys, and the migration keys."""
    rest = {k: v for k, v in config.items() if not k.startswith(PREFIX)}
    return rest, {k: v for k, v in config.items() if k.startswith(PREFIX)}


def wrap(manager: Any, manager_config: Mapping[str, Any], migration_config: Mapping[str, Any]) -> Any:
    """`manager` itself, or, with `migration.mode=dual-write`, the manager in migration mode. Closes the manager when
    migration mode cannot start."""
    parsed = parse_config(migration_config, CONFIG_KEYS, "migration")
    if parsed["migration.mode"] == "off":
        return manager
    try:
        return MigratingManager(manager, manager_config, parsed)
    except BaseException:
        manager.close()
        raise


@dataclass
class _Gate:
    """What a partition registered here waits for before it is ready (see the module docstring)."""

    source_partition: int
    source_end: int | None = None
    metadata_partition: int | None = None
    tierlog_end: int | None = None


@dataclass(frozen=True)
class _Pending:
    """An own write acknowledged on the source topic, waiting for the import to bring it into this node's view."""

    metadata: TopicMetadata
    future: Future[None]
    deadline: float


class MigratingManager:
    """tierlog's RemoteLogMetadataManager in migration mode: every call not defined here goes to the manager."""

    def __init__(self, manager: Any, manager_config: Mapping[str, Any], config: Mapping[str, Any]) -> None:
        self._manager = manager
        self.broker_id: int = manager.broker_id
        self.source_topic: str = config["migration.source.topic"]
        self.control_topic: str = config["migration.control.topic"]
        self._heartbeat_s = config["migration.heartbeat.ms"] / 1000
        self._write_timeout_s = parse_int(manager_config.get("write.timeout.ms", _WRITE_TIMEOUT_MS)) / 1000
        startup_s = parse_int(manager_config.get("startup.timeout.ms", _STARTUP_TIMEOUT_MS)) / 1000
        self._client = librdkafka_settings({
            "bootstrap.servers": manager_config["bootstrap.servers"],
            **{k[len(CLIENT_PREFIX):]: v for k, v in manager_config.items() if k.startswith(CLIENT_PREFIX)},
        })
        admin = AdminClient(self._client)
        self.source_partitions = _partition_count(admin, self.source_topic, startup_s)
        ensure_control_topic(admin, self.control_topic, parse_int(manager_config.get(
            "metadata.topic.replication.factor", _REPLICATION_FACTOR)), startup_s)
        control, self._control_offset = read_control(self._client, self.control_topic, startup_s)
        self._source_offsets = OffsetReader(self.source_topic, self._client, admin)
        self._tierlog_offsets = OffsetReader(manager.metadata_topic, self._client)
        self._group = import_group(manager.metadata_topic)
        self._lock = threading.Lock()
        self._gates: dict[TopicIdPartition, _Gate] = {}
        self._stop = threading.Event()
        self._finalized = threading.Event()
        if control.finalize is not None:
            self._finalized.set()
        self._started_ms = now_ms()
        self.imported = self.skipped = self.dropped = self.source_write_failures = 0
        self._route_lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending: dict[tuple[int, int], _Pending] = {}  # by (source partition, offset)
        self._refused: dict[tuple[int, int], str] = {}  # own records the import dropped, and why
        self._producer = Producer({**self._client, "acks": "all", "enable.idempotence": True,
                                   "message.timeout.ms": int(self._write_timeout_s * 1000)})
        self._committed = Consumer({**self._client, "group.id": self._group, "enable.auto.commit": False})
        self._committed_lock = threading.Lock()  # is_ready runs on the broker's call threads
        self._threads = [threading.Thread(target=target, name=f"migration-{name}", daemon=True)
                         for name, target in (("producer", self._deliver_and_settle), ("control", self._follow_control),
                                              ("import", self._import_loop))]
        for thread in self._threads:
            thread.start()
        log.info("migration mode %s: importing %s (%d partitions) into %s, control topic %s",
                 FINALIZED if self.finalized else DUAL_WRITE, self.source_topic, self.source_partitions,
                 manager.metadata_topic, self.control_topic)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)

    def __enter__(self) -> MigratingManager:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def finalized(self) -> bool:
        return self._finalized.is_set()

    # --- writes: through the source topic until finalize --------------------------------------------------

    def add_remote_log_segment_metadata(self, metadata: RemoteLogSegmentMetadata) -> Future[None]:
        return self._write(metadata, self._manager.add_remote_log_segment_metadata)

    def update_remote_log_segment_metadata(self, update: RemoteLogSegmentMetadataUpdate) -> Future[None]:
        return self._write(update, self._manager.update_remote_log_segment_metadata)

    def put_remote_partition_delete_metadata(self, metadata: RemotePartitionDeleteMetadata) -> Future[None]:
        return self._write(metadata, self._manager.put_remote_partition_delete_metadata)

    def _write(self, metadata: TopicMetadata, write: Any) -> Future[None]:
        with self._route_lock:  # finalize switches under it: a write before it is produced before the switch ends
            if not self.finalized:
                check_call(self._manager.view, metadata)  # the manager's checks: raises before anything is written
                return self._through_source(metadata)
        return write(metadata)

    def _through_source(self, metadata: TopicMetadata) -> Future[None]:
        done: Future[None] = Future()
        tp = metadata.topic_id_partition
        partition = metadata_partition(tp, self.source_partitions)
        deadline = time.monotonic() + self._write_timeout_s

        def delivered(error: KafkaError | None, message: Any) -> None:
            if error is None:
                with self._pending_lock:
                    self._pending[(partition, message.offset())] = _Pending(metadata, done, deadline)
                return
            self.source_write_failures += 1
            done.set_exception(MetadataLogError(
                f"writing {type(metadata).__name__} of {tp} to {self.source_topic}-{partition} (the one order both "
                f"managers apply during the migration) failed: {error.str()}"))

        try:
            self._producer.produce(self.source_topic, value=encode(metadata), partition=partition,
                                   headers=[(WRITER_HEADER, str(self.broker_id).encode("ascii"))],
                                   on_delivery=delivered)
        except (BufferError, KafkaException) as exc:
            self.source_write_failures += 1
            done.set_exception(MetadataLogError(f"cannot write to {self.source_topic}-{partition}: {exc}"))
        return done

    def _deliver_and_settle(self) -> None:
        """Serve the producer's delivery reports, and complete each own write once this view holds it (or fail it when
        the import dropped it, or by its deadline)."""
        while not self._stop.is_set():
            self._producer.poll(SETTLE_POLL_S)
            with self._pending_lock:
                pending = list(self._pending.items())
            for at, write in pending:
                outcome = self._settled(at, write)
                if outcome is None:
                    continue
                with self._pending_lock:
                    del self._pending[at]
                    self._refused.pop(at, None)
                if isinstance(outcome, RemoteStorageError):
                    write.future.set_exception(outcome)
                else:
                    write.future.set_result(None)

    def _settled(self, at: tuple[int, int], write: _Pending) -> bool | RemoteStorageError | None:
        """True once this view holds the write, an error once it cannot, None while it is on its way."""
        if reflected(self._manager.view, write.metadata) or _segment_forgotten(self._manager.view, write.metadata):
            return True
        tp = write.metadata.topic_id_partition
        with self._pending_lock:
            reason = self._refused.get(at)
        if reason is not None:
            return InvalidArgumentError(f"{type(write.metadata).__name__} of {tp}, written to {self.source_topic}-"
                                        f"{at[0]} offset {at[1]}, was dropped on import as Kafka's rules drop it: "
                                        f"{reason} (another write of the partition came first)")
        if time.monotonic() > write.deadline:
            return MetadataTimeoutError(
                f"{type(write.metadata).__name__} of {tp}, written to {self.source_topic}-{at[0]} offset {at[1]}, was "
                f"not imported into {self._manager.metadata_topic} and applied here within "
                f"{self._write_timeout_s:g} s: is a node in migration mode importing that partition (the "
                f"{self._group} group)?")
        return None

    # --- registration and readiness -----------------------------------------------------------------------

    def on_partition_leadership_changes(self, leader_partitions: Iterable[TopicIdPartition],
                                        follower_partitions: Iterable[TopicIdPartition]) -> None:
        leaders, followers = list(leader_partitions), list(follower_partitions)
        self._manager.on_partition_leadership_changes(leaders, followers)
        with self._lock:  # a new leader must see what its predecessor wrote: a gate asked afresh
            for tp in [*leaders, *followers]:
                self._gates[tp] = _Gate(metadata_partition(tp, self.source_partitions))

    def on_stop_partitions(self, partitions: Iterable[TopicIdPartition]) -> None:
        stopped = list(partitions)
        self._manager.on_stop_partitions(stopped)
        with self._lock:
            for tp in stopped:
                self._gates.pop(tp, None)

    def is_ready(self, tp: TopicIdPartition) -> bool:
        return bool(self._manager.is_ready(tp)) and self._gate_open(tp, READY_QUERY_S)

    def _gate_open(self, tp: TopicIdPartition, timeout_s: float) -> bool:
        """Whether tp has no gate left or its gate passes now (its offset queries take `timeout_s` at most)."""
        with self._lock:
            gate = self._gates.get(tp)
        if gate is None or self.finalized:
            return True
        try:
            passed = self._gate_passed(tp, gate, time.monotonic() + timeout_s)
        except (RemoteStorageError, KafkaException) as exc:
            log.warning("cannot tell yet whether %s's records on %s are imported: %s", tp, self.source_topic, exc)
            return False
        if passed:
            with self._lock:
                if self._gates.get(tp) is gate:
                    del self._gates[tp]
        return passed

    def _gate_passed(self, tp: TopicIdPartition, gate: _Gate, deadline: float) -> bool:
        def left() -> float:
            return max(deadline - time.monotonic(), 0.0)

        k = gate.source_partition
        if gate.source_end is None:
            gate.source_end = self._source_offsets.end_offsets([k], left())[k]
        if gate.tierlog_end is None:
            with self._committed_lock:
                found = self._committed.committed([TopicPartition(self.source_topic, k)], timeout=left())
            if max(found[0].offset, 0) < gate.source_end:
                return False
            mp = gate.metadata_partition = metadata_partition_for(tp.topic_id, tp.partition,
                                                                  self._manager.num_partitions)
            gate.tierlog_end = self._tierlog_offsets.end_offsets([mp], left())[mp]
        assert gate.metadata_partition is not None
        return bool(self._manager.applied_offsets().get(gate.metadata_partition, 0) >= gate.tierlog_end)

    # --- reads: refused while the gate is closed, as TBRLMM refuses a partition it has not loaded yet -------

    def remote_log_segment_metadata(self, tp: TopicIdPartition, leader_epoch: int, offset: int
                                    ) -> RemoteLogSegmentMetadata | None:
        self._check_readable(tp)
        return self._manager.remote_log_segment_metadata(tp, leader_epoch, offset)

    def highest_offset_for_epoch(self, tp: TopicIdPartition, leader_epoch: int) -> int | None:
        self._check_readable(tp)
        return self._manager.highest_offset_for_epoch(tp, leader_epoch)

    def list_remote_log_segments(self, tp: TopicIdPartition, leader_epoch: int | None = None
                                 ) -> list[RemoteLogSegmentMetadata]:
        self._check_readable(tp)
        return self._manager.list_remote_log_segments(tp, leader_epoch)

    def remote_log_size(self, tp: TopicIdPartition, leader_epoch: int) -> int:
        self._check_readable(tp)
        return self._manager.remote_log_size(tp, leader_epoch)

    def next_segment_with_txn_index(self, tp: TopicIdPartition, leader_epoch: int, offset: int
                                    ) -> RemoteLogSegmentMetadata | None:
        self._check_readable(tp)
        return self._manager.next_segment_with_txn_index(tp, leader_epoch, offset)

    def _check_readable(self, tp: TopicIdPartition) -> None:
        """Raise RemoteStorageNotReadyError (retriable: the broker's ReplicaNotAvailable) while tp's gate is closed:
        the view may not hold its predecessor's writes yet. On the fetch path: no lock once the gate has passed, and
        the gate's offset queries take READ_QUERY_S at most (the broker's fetch retries)."""
        if self._gates.get(tp) is None or self._gate_open(tp, READ_QUERY_S):  # a lone dict read needs no lock
            return
        raise RemoteStorageNotReadyError(
            f"remote log metadata for {tp} is not readable on broker {self.broker_id} yet: migration mode has not "
            f"imported and applied what {self.source_topic}-{metadata_partition(tp, self.source_partitions)} held "
            f"for it when this broker took it over; retry")

    # --- the import ---------------------------------------------------------------------------------------

    def import_lag(self, timeout_s: float) -> dict[int, int]:
        """Per source partition, the records the import group has not committed yet (every node's import)."""
        partitions = list(range(self.source_partitions))
        ends = self._source_offsets.end_offsets(partitions, timeout_s)
        with self._committed_lock:
            found = self._committed.committed([TopicPartition(self.source_topic, p) for p in partitions],
                                              timeout=timeout_s)
        return {tp.partition: max(ends[tp.partition] - max(tp.offset, 0), 0) for tp in found}

    def _import_loop(self) -> None:
        # A node that died without leaving the group holds its partitions (and the gates waiting on them) this long.
        consumer = Consumer({**self._client, "group.id": self._group, "enable.auto.commit": False,
                             "auto.offset.reset": "earliest", "session.timeout.ms": IMPORT_SESSION_TIMEOUT_MS})
        consumer.subscribe([self.source_topic], on_revoke=_commit_positions)
        try:
            while not self._stop.is_set():
                messages = [m for m in consumer.consume(500, timeout=IMPORT_POLL_S) if m.error() is None]
                if not messages:
                    continue
                if self._import_batch(messages):
                    _commit_positions(consumer, [])
                    continue
                firsts: dict[int, int] = {}
                for message in messages:  # read the batch again: what it wrote already is found in the view
                    firsts.setdefault(message.partition() or 0, message.offset() or 0)
                for partition, offset in firsts.items():
                    consumer.seek(TopicPartition(self.source_topic, partition, offset))
                self._stop.wait(RETRY_PAUSE_S)
        except Exception:
            log.exception("importing %s into %s stopped; restart the agent to resume (the group's committed offsets "
                          "say where)", self.source_topic, self._manager.metadata_topic)
            raise
        finally:
            consumer.close()  # leaves the group: another node's import takes its partitions

    def _import_batch(self, messages: list[Any]) -> bool:
        """Import a batch of source records: each user partition's in their order, one write in flight per user
        partition and all partitions' at once. False when a write failed (the caller reads the batch again)."""
        queues: dict[TopicIdPartition, deque[SourceRecord]] = {}
        for message in messages:
            record = decode_source_record(self.source_topic, self.source_partitions, message)
            if isinstance(record, SourceProblem):
                log.error("not imported into %s: %s", self._manager.metadata_topic, record)
            else:
                queues.setdefault(record.metadata.topic_id_partition, deque()).append(record)
        refused_once: set[TopicIdPartition] = set()
        try:
            while queues:
                in_flight: list[tuple[TopicIdPartition, Future[None]]] = []
                for tp, waiting in queues.items():
                    record = waiting[0]
                    outcome = start_write(self._manager, record.metadata)
                    if not isinstance(outcome, Skipped):
                        in_flight.append((tp, outcome))
                        continue
                    if outcome.reason is not None and tp not in refused_once:
                        refused_once.add(tp)  # asked again once this view caught up (below)
                        continue
                    if outcome.reason is None:
                        self.skipped += 1
                    else:
                        self.dropped += 1
                        if record.tierlog_writer == self.broker_id:  # its call fails with the reason
                            with self._pending_lock:
                                self._refused[(record.partition, record.offset)] = outcome.reason
                        log.info("not imported, as Kafka's rules drop it (%s): %s-%d offset %d: %s", outcome.reason,
                                 self.source_topic, record.partition, record.offset, record.metadata)
                    waiting.popleft()
                    refused_once.discard(tp)
                for tp, future in in_flight:
                    future.result(timeout=self._write_timeout_s + CLOSE_TIMEOUT_S)
                    self.imported += 1
                    queues[tp].popleft()
                    refused_once.discard(tp)
                if refused_once:
                    # The write a refused record follows may be another node's, acknowledged but not applied here yet.
                    self._manager.wait_caught_up(self._write_timeout_s)
                queues = {tp: waiting for tp, waiting in queues.items() if waiting}
        except (RemoteStorageError, TimeoutError) as exc:
            log.warning("importing from %s failed (%s); reading the batch again", self.source_topic, exc)
            return False
        return True

    # --- control ------------------------------------------------------------------------------------------

    def _follow_control(self) -> None:
        consumer = Consumer({**self._client, "group.id": f"{self.control_topic}-node-{self.broker_id}",
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(self.control_topic, 0, self._control_offset)])
        next_heartbeat = 0.0
        try:
            while not self._stop.is_set():
                if time.monotonic() >= next_heartbeat:
                    self._announce()
                    next_heartbeat = time.monotonic() + self._heartbeat_s
                message = consumer.poll(POLL_S)
                if message is None or message.error() is not None:
                    continue
                if message.key() == FINALIZE_KEY and message.value() is not None and not self.finalized:
                    with self._route_lock:
                        self._finalized.set()
                    log.info("the migration was finalized: writes go to %s directly, no more to %s (whose import "
                             "goes on for the writes in flight)", self._manager.metadata_topic, self.source_topic)
                    next_heartbeat = 0.0
        except Exception:
            log.exception("following the migration control topic %s stopped", self.control_topic)
        finally:
            consumer.close()

    def _announce(self) -> None:
        state = FINALIZED if self.finalized else DUAL_WRITE
        announcement = Announcement(self.broker_id, state, self._started_ms, now_ms())
        try:
            self._producer.produce(self.control_topic, key=announcement.key(), value=announcement.value())
        except (BufferError, KafkaException) as exc:
            log.warning("cannot announce migration state on %s: %s", self.control_topic, exc)

    # --- lifecycle ----------------------------------------------------------------------------------------

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._producer.flush(max(0.0, deadline - time.monotonic()))
        with self._pending_lock:
            pending, self._pending = list(self._pending.values()), {}
        for write in pending:  # on the source topic: another node's import brings it into tierlog
            write.future.set_exception(MetadataTimeoutError(
                f"{type(write.metadata).__name__} of {write.metadata.topic_id_partition} is on {self.source_topic} "
                f"but broker {self.broker_id}'s migration mode closed before the import brought it here"))
        with self._committed_lock:
            self._committed.close()
        self._manager.close()


def _segment_forgotten(view: Any, metadata: TopicMetadata) -> bool:
    """Whether `metadata` finishes a segment's deletion and this view no longer holds the segment: tierlog forgets a
    segment once its DELETE_SEGMENT_FINISHED is applied, so its absence is all the view shows of that write (the call
    was checked against a view that held the segment)."""
    return (isinstance(metadata, RemoteLogSegmentMetadataUpdate)
            and metadata.state is RemoteLogSegmentState.DELETE_SEGMENT_FINISHED
            and view.segment(metadata.remote_log_segment_id) is None)


def _commit_positions(consumer: Consumer, _partitions: list[TopicPartition]) -> None:
    """Before a rebalance takes partitions away: what was imported stays imported (every write has completed)."""
    try:
        consumer.commit(asynchronous=False)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError._NO_OFFSET:
            log.warning("committing import positions before a rebalance failed: %s", exc)


def _partition_count(admin: AdminClient, topic: str, timeout_s: float) -> int:
    from confluent_kafka import TopicCollection

    try:
        found = admin.describe_topics(TopicCollection([topic]), request_timeout=timeout_s)[topic].result(timeout_s)
    except KafkaException as exc:
        raise ConfigError(f"migration.mode=dual-write needs migration.source.topic {topic} (the topic "
                          f"TopicBasedRemoteLogMetadataManager writes): {exc}") from exc
    return len(found.partitions)
