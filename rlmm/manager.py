"""The RemoteLogMetadataManager facade: Kafka's API over the event log and the RocksDB view.

Writes append an event and complete once Kafka acknowledged it and this node's view applied it; reads go to
the committed view, gated by per-partition registration and readiness as in Kafka's built-in manager.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Message
from confluent_kafka.admin import AdminClient

from rlmm import codec, state
from rlmm.config import ConfigKey, parse_bool, parse_config, parse_int, parse_str
from rlmm.errors import (
    InvalidArgumentError,
    MetadataLogError,
    MetadataTimeoutError,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    RemoteStorageNotReadyError,
)
from rlmm.event_log import EventConsumer, EventProducer, TopicSettings, end_offsets, ensure_topic
from rlmm.events import MetadataEvent, RecordKey, key_of, metadata_partition_for, segment_key
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from rlmm.view import ConsumedRecord, MetadataView, apply_records

log = logging.getLogger(__name__)

CLIENT_PREFIX = "kafka."
_REQUEST_HEADER = "tierlog.request"


def _positive(value: int) -> bool:
    return value > 0


CONFIG_KEYS = (
    ConfigKey("bootstrap.servers", parse_str, required=True),
    ConfigKey("broker.id", parse_int, required=True),
    ConfigKey("state.dir", parse_str, required=True),
    ConfigKey("metadata.topic.name", parse_str, "__tierlog_metadata"),
    ConfigKey("metadata.topic.num.partitions", parse_int, 50, check=_positive, requirement="> 0"),
    ConfigKey("metadata.topic.replication.factor", parse_int, 3, check=_positive, requirement="> 0"),
    ConfigKey("metadata.topic.min.insync.replicas", parse_int, 2, check=_positive, requirement="> 0"),
    # Seven days of raw history stay on the topic for the audit trail before compaction may drop them.
    ConfigKey("metadata.topic.min.compaction.lag.ms", parse_int, 7 * 24 * 3600 * 1000,
              check=lambda v: v >= 0, requirement=">= 0"),
    ConfigKey("metadata.topic.create", parse_bool, True),
    ConfigKey("write.timeout.ms", parse_int, 30_000, check=_positive, requirement="> 0"),
    ConfigKey("startup.timeout.ms", parse_int, 60_000, check=_positive, requirement="> 0"),
    ConfigKey("apply.batch.max.records", parse_int, 2000, check=_positive, requirement="> 0"),
)


@dataclass
class _PendingWrite:
    """One API write: its primary record and the follow-ups (checkpoint, tombstones) it must see applied."""

    future: Future[None]
    tp: TopicIdPartition
    deadline: float
    doomed: list[RecordKey] = field(default_factory=list)
    outstanding: set[str] = field(default_factory=set)  # request ids produced, not yet applied
    acked: set[str] = field(default_factory=set)
    applied: set[str] = field(default_factory=set)
    primary: str = ""


class RemoteLogMetadataManager:
    """Kafka's RemoteLogMetadataManager, event-sourced on a compacted topic and materialized in RocksDB."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._cfg = parse_config(config, CONFIG_KEYS, "RemoteLogMetadataManager", ignore_prefixes=(CLIENT_PREFIX,))
        self.broker_id: int = self._cfg["broker.id"]
        self.metadata_topic: str = self._cfg["metadata.topic.name"]
        self.num_partitions: int = self._cfg["metadata.topic.num.partitions"]
        self._write_timeout_s = self._cfg["write.timeout.ms"] / 1000
        client = {"bootstrap.servers": self._cfg["bootstrap.servers"],
                  **{k[len(CLIENT_PREFIX):]: v for k, v in config.items() if k.startswith(CLIENT_PREFIX)}}
        startup_s = self._cfg["startup.timeout.ms"] / 1000
        self._view = MetadataView.open(self._cfg["state.dir"])
        self._admin = AdminClient(client)
        try:
            if self._cfg["metadata.topic.create"]:
                ensure_topic(self._admin, TopicSettings(
                    self.metadata_topic, self.num_partitions, self._cfg["metadata.topic.replication.factor"],
                    self._cfg["metadata.topic.min.insync.replicas"],
                    self._cfg["metadata.topic.min.compaction.lag.ms"], {},
                ), startup_s)
            self._producer = EventProducer(self.metadata_topic, client)
            self._consumer = EventConsumer(self.metadata_topic, client, self.num_partitions)
        except BaseException:
            self._view.close()
            raise
        self._lock = threading.Condition()
        self._applied: dict[int, int] = dict(self._view.applied_offsets(self.metadata_topic))
        self._consumer.assign(self._applied)
        self._registered: dict[TopicIdPartition, int | None] = {}  # tp -> metadata offset it must reach
        self._halted: dict[int, MetadataLogError] = {}
        self._pending: dict[str, _PendingWrite] = {}
        self._writing: set[TopicIdPartition] = set()
        self._closed = False
        self._stop = threading.Event()
        self._applier = threading.Thread(target=self._run, name=f"tierlog-rlmm-{self.broker_id}", daemon=True)
        self._applier.start()

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
            self._check_open()
            if mp in self._halted:
                raise self._halted[mp]
            # A write is checked against this node's view, so it waits (within its deadline) for a registered
            # partition's history to load rather than validating against a partial view.
            while tp in self._registered and not self._ready_locked(tp):
                if not self._lock.wait(max(0.0, deadline - time.monotonic())):
                    raise RemoteStorageNotReadyError(
                        f"remote log metadata for {tp} is still loading on broker {self.broker_id} after "
                        f"{self._cfg['write.timeout.ms']} ms; retry the write"
                    )
                self._check_open()
                if mp in self._halted:
                    raise self._halted[mp]
            # One write per user partition at a time, so each write is validated against a view that already
            # holds the previous one and its lineage checkpoint.
            while tp in self._writing:
                if not self._lock.wait(max(0.0, deadline - time.monotonic())):
                    raise MetadataTimeoutError(f"a previous metadata write for {tp} did not complete in time")
                self._check_open()
            event: MetadataEvent = prepare()
            key = key_of(event)
            pending = _PendingWrite(Future(), tp, deadline)
            if isinstance(event, RemotePartitionDeleteMetadata) and \
                    event.state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                pending.doomed = [segment_key(md.remote_log_segment_id) for md in self._view.segments_of(tp)]
            self._writing.add(tp)
            recovery = state.pending_checkpoint(self._view, tp, _now_ms(), self.broker_id)
            if recovery is not None:
                # A writer died between an event and its checkpoint; restore the checkpoint before going on.
                self._append_locked(pending, key_of(recovery), recovery)
            pending.primary = self._append_locked(pending, key, event)
        return pending.future

    def _append_locked(self, pending: _PendingWrite, key: RecordKey, event: MetadataEvent | None) -> str:
        request = uuid.uuid4().hex
        pending.outstanding.add(request)
        self._pending[request] = pending
        value = None if event is None else codec.encode(event)

        def delivered(error: KafkaError | None, message: Message) -> None:
            self._on_delivery(request, error)

        self._producer.append(self._metadata_partition(pending.tp), key.encode(), value,
                              [(_REQUEST_HEADER, request.encode())], delivered)
        return request

    def _on_delivery(self, request: str, error: KafkaError | None) -> None:
        with self._lock:
            pending = self._pending.get(request)
            if pending is None:
                return
            if error is not None:
                self._finish_locked(pending, RemoteStorageError(
                    f"metadata write for {pending.tp} to topic {self.metadata_topic} failed: {error.str()}"))
                return
            pending.acked.add(request)
            self._maybe_complete_locked(pending)

    def _maybe_complete_locked(self, pending: _PendingWrite) -> None:
        if pending.outstanding <= pending.acked and pending.outstanding <= pending.applied:
            self._finish_locked(pending, None)

    def _finish_locked(self, pending: _PendingWrite, error: BaseException | None) -> None:
        for request in pending.outstanding:
            self._pending.pop(request, None)
        self._writing.discard(pending.tp)
        self._lock.notify_all()
        if pending.future.done():
            return
        if error is None:
            pending.future.set_result(None)
        else:
            pending.future.set_exception(error)

    # --- registration and readiness -----------------------------------------------------------------------

    def on_partition_leadership_changes(
        self, leader_partitions: Iterable[TopicIdPartition], follower_partitions: Iterable[TopicIdPartition]
    ) -> None:
        with self._lock:
            self._check_open()
            for tp in [*leader_partitions, *follower_partitions]:
                _require(tp, TopicIdPartition, "topic_id_partition")
                self._registered.setdefault(tp, None)

    def on_stop_partitions(self, partitions: Iterable[TopicIdPartition]) -> None:
        with self._lock:
            for tp in partitions:
                self._registered.pop(tp, None)

    def is_ready(self, tp: TopicIdPartition) -> bool:
        with self._lock:
            return tp in self._registered and self._ready_locked(tp)

    def _ready_locked(self, tp: TopicIdPartition) -> bool:
        target = self._registered.get(tp)
        mp = self._metadata_partition(tp)
        return target is not None and mp not in self._halted and self._applied.get(mp, 0) >= target

    def _readable(self, tp: TopicIdPartition) -> None:
        _require(tp, TopicIdPartition, "topic_id_partition")
        with self._lock:
            self._check_open()
            if tp not in self._registered or state.is_deleted(self._view, tp):
                raise RemoteResourceNotFoundError(
                    f"no remote log metadata for {tp} on broker {self.broker_id}: the partition is not assigned "
                    f"here (on_partition_leadership_changes) or its remote data was deleted"
                )
            mp = self._metadata_partition(tp)
            if mp in self._halted:
                raise self._halted[mp]
            if not self._ready_locked(tp):
                raise RemoteStorageNotReadyError(
                    f"remote log metadata for {tp} is still loading on broker {self.broker_id} "
                    f"(metadata partition {mp} applied to offset {self._applied.get(mp, 0)}); retry"
                )

    # --- reads ----------------------------------------------------------------------------------------------

    def remote_log_segment_metadata(
        self, tp: TopicIdPartition, leader_epoch: int, offset: int
    ) -> RemoteLogSegmentMetadata | None:
        _require_int(leader_epoch, "leader_epoch")
        _require_int(offset, "offset")
        self._readable(tp)
        return state.segment_for_offset(self._view, tp, leader_epoch, offset)

    def highest_offset_for_epoch(self, tp: TopicIdPartition, leader_epoch: int) -> int | None:
        _require_int(leader_epoch, "leader_epoch")
        self._readable(tp)
        return state.highest_offset_for_epoch(self._view, tp, leader_epoch)

    def list_remote_log_segments(
        self, tp: TopicIdPartition, leader_epoch: int | None = None
    ) -> list[RemoteLogSegmentMetadata]:
        if leader_epoch is not None:
            _require_int(leader_epoch, "leader_epoch")
        self._readable(tp)
        return state.list_segments(self._view, tp, leader_epoch)

    def remote_log_size(self, tp: TopicIdPartition, leader_epoch: int) -> int:
        _require_int(leader_epoch, "leader_epoch")
        self._readable(tp)
        return state.remote_log_size(self._view, tp, leader_epoch)

    def next_segment_with_txn_index(
        self, tp: TopicIdPartition, leader_epoch: int, offset: int
    ) -> RemoteLogSegmentMetadata | None:
        _require_int(leader_epoch, "leader_epoch")
        _require_int(offset, "offset")
        self._readable(tp)
        return state.next_segment_with_txn_index(self._view, tp, leader_epoch, offset)

    def view_digest(self) -> str:
        return self._view.digest()

    def metadata_errors(self) -> dict[int, MetadataLogError]:
        """Metadata partitions this node stopped applying, with the error that stopped them."""
        with self._lock:
            return dict(self._halted)

    def applied_offsets(self) -> dict[int, int]:
        with self._lock:
            return dict(self._applied)

    def wait_caught_up(self, timeout_s: float) -> None:
        """Block until the view has applied every metadata partition up to its current end offset."""
        deadline = time.monotonic() + timeout_s
        ends = self._consumer_end_offsets(timeout_s)
        with self._lock:
            while any(self._applied.get(p, 0) < end for p, end in ends.items() if p not in self._halted):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MetadataTimeoutError(
                        f"view did not catch up with {self.metadata_topic} within {timeout_s}s "
                        f"(applied {self._applied}, end offsets {ends})"
                    )
                self._lock.wait(min(remaining, 0.1))

    @property
    def view(self) -> MetadataView:
        return self._view

    # --- the applier thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        max_records = self._cfg["apply.batch.max.records"]
        while not self._stop.is_set():
            try:
                # Wait briefly for one record, then take whatever else has arrived without waiting: a batch
                # consume would sit out its whole timeout on a quiet topic and delay every write.
                messages = self._consumer.consume(1, 0.02)
                if messages:
                    messages += self._consumer.consume(max_records - 1, 0)
                    self._apply(messages)
                self._resolve_targets()
                self._expire()
                self._producer.poll(0)
            except Exception:  # keep the applier alive; the log says what failed
                log.exception("tierlog metadata applier on broker %s failed; retrying", self.broker_id)
                self._rewind()
                self._stop.wait(0.5)

    def _rewind(self) -> None:
        # The failed batch was consumed but not committed: read it again from the view's stored offsets.
        with self._lock:
            applied = dict(self._applied)
            halted = list(self._halted)
        self._consumer.assign(applied)
        for partition in halted:
            self._consumer.pause(partition)

    def _apply(self, messages: list[Message]) -> None:
        records: list[ConsumedRecord] = []
        requests: list[str | None] = []
        next_offsets: dict[int, int] = {}
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    log.warning("metadata topic %s: %s", self.metadata_topic, error.str())
                continue
            partition, offset = _position(message)
            if partition in self._halted:
                continue
            try:
                key = RecordKey.decode(message.key() or b"")
                value = message.value()
                event = None if value is None else codec.decode(value)
            except (codec.DecodeError, InvalidArgumentError) as exc:
                self._halt(partition, offset, exc)
                continue
            records.append(ConsumedRecord(partition, offset, key, event))
            requests.append(_request_of(message))
            next_offsets[partition] = offset + 1
        if not records:
            return
        outcomes = apply_records(self._view, self.metadata_topic, records, next_offsets)
        with self._lock:
            self._applied.update(next_offsets)
            for record, request, outcome in zip(records, requests, outcomes, strict=True):
                if not outcome.applied:
                    log.warning("metadata topic %s partition %d offset %d: record dropped: %s",
                                self.metadata_topic, record.metadata_partition, record.offset, outcome.reason)
                if isinstance(record.event, RemotePartitionDeleteMetadata) and outcome.applied and \
                        record.event.state is RemotePartitionDeleteState.DELETE_PARTITION_FINISHED:
                    self._registered.pop(record.event.topic_id_partition, None)
                pending = self._pending.get(request) if request else None
                if pending is not None:
                    self._on_applied_locked(pending, request, record, outcome)  # type: ignore[arg-type]
            self._lock.notify_all()

    def _on_applied_locked(
        self, pending: _PendingWrite, request: str, record: ConsumedRecord, outcome: state.Outcome
    ) -> None:
        pending.applied.add(request)
        if request == pending.primary:
            if not outcome.applied:
                self._finish_locked(pending, RemoteStorageError(
                    f"metadata write for {pending.tp} was rejected when applied: {outcome.reason}"))
                return
            assert record.event is not None
            for key, event in state.records_after(
                self._view, record.key, record.event, pending.doomed, _now_ms(), self.broker_id
            ):
                self._append_locked(pending, key, event)
        self._maybe_complete_locked(pending)

    def _halt(self, partition: int, offset: int, cause: Exception) -> None:
        error = MetadataLogError(
            f"metadata topic {self.metadata_topic} partition {partition} offset {offset}: cannot read record "
            f"({cause}); this node applies nothing after it for that partition. Inspect the record "
            f"(kafka-console-consumer --partition {partition} --offset {offset}) and upgrade tierlog or "
            f"remove the producer that wrote it"
        )
        log.error("%s", error)
        self._consumer.pause(partition)
        with self._lock:
            self._halted[partition] = error
            for pending in list(self._pending.values()):
                if self._metadata_partition(pending.tp) == partition:
                    self._finish_locked(pending, error)

    def _resolve_targets(self) -> None:
        with self._lock:
            waiting = sorted({self._metadata_partition(tp) for tp, t in self._registered.items() if t is None})
        if not waiting:
            return
        ends = end_offsets(self._admin, self.metadata_topic, waiting, timeout_s=5.0)
        with self._lock:
            for tp, target in self._registered.items():
                if target is None:
                    self._registered[tp] = ends[self._metadata_partition(tp)]
            self._lock.notify_all()

    def _consumer_end_offsets(self, timeout_s: float) -> dict[int, int]:
        return end_offsets(self._admin, self.metadata_topic, list(range(self.num_partitions)), timeout_s)

    def _expire(self) -> None:
        now = time.monotonic()
        with self._lock:
            for pending in {id(p): p for p in self._pending.values()}.values():
                if now > pending.deadline:
                    self._finish_locked(pending, MetadataTimeoutError(
                        f"metadata write for {pending.tp} was not acknowledged and applied within "
                        f"{self._cfg['write.timeout.ms']} ms (write.timeout.ms); check that the brokers at "
                        f"{self._cfg['bootstrap.servers']} serve topic {self.metadata_topic}"
                    ))

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
        self._stop.set()
        self._applier.join(timeout=10)
        with self._lock:
            for pending in {id(p): p for p in self._pending.values()}.values():
                self._finish_locked(pending, RemoteStorageError("RemoteLogMetadataManager closed before the write "
                                                                "completed"))
        self._producer.close(5.0)
        self._consumer.close()
        self._view.close()


def _position(message: Message) -> tuple[int, int]:
    partition, offset = message.partition(), message.offset()
    assert partition is not None and offset is not None, "consumed records always have a position"
    return partition, offset


def _request_of(message: Message) -> str | None:
    headers: Any = message.headers() or ()
    for name, value in headers:
        if name == _REQUEST_HEADER and value is not None:
            return value.decode() if isinstance(value, bytes) else str(value)
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


