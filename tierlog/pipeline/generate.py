"""A generator of realistic metadata-topic histories, encoded with rlmm.codec, for tests and benchmarks.

It plays the writer's side the way the manager does (prepare, apply, then the records that follow), so
every sequence is one a real cluster could have written: uploads, leader changes, retention, deletes.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, Message, Producer

from rlmm import codec, state
from rlmm.archive import archive_key, encode_archive_file, to_archived
from rlmm.events import MetadataEvent, RecordKey, key_of, metadata_partition_for
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from rsm.backend import StorageBackend

S = RemoteLogSegmentState
P = RemotePartitionDeleteState


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One metadata-topic record as Kafka stores it: position, timestamp, key and value (None = tombstone)."""

    metadata_partition: int
    offset: int
    timestamp_ms: int
    key: bytes
    value: bytes | None


ApiArgument = RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate | RemotePartitionDeleteMetadata
ApiCall = tuple[str, ApiArgument]


@dataclass(frozen=True, slots=True)
class HistorySpec:
    events: int = 100_000
    topics: int = 4
    partitions_per_topic: int = 8
    metadata_partitions: int = 4
    seed: int = 7
    start_ms: int = 1_760_000_000_000
    # Mean gap between two records of the whole cluster; 100k records then span about two days.
    mean_gap_ms: int = 1_700
    broker_ids: tuple[int, ...] = (1, 2, 3)
    segment_bytes: tuple[int, int] = (1 << 20, 64 << 20)


@dataclass
class _Leader:
    """The writer's memory of one user partition: its offsets, epoch and live segments."""

    tp: TopicIdPartition
    epoch: int = 0
    next_offset: int = 0
    broker_id: int = 1
    uploading: RemoteLogSegmentMetadata | None = None
    live: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    deleting: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    delete_state: RemotePartitionDeleteState | None = None
    topic_deleted: bool = False


class HistoryGenerator:
    """Produces records in topic order; `writer_state` is the state the writer derived them from."""

    def __init__(self, spec: HistorySpec) -> None:
        self.spec = spec
        self._rng = random.Random(spec.seed)
        self.writer_state = state.InMemoryState()
        self._offsets = [0] * spec.metadata_partitions
        self._now = spec.start_ms
        self._leaders: list[_Leader] = []
        self._topic_serial = 0
        # The RLMM API calls this history stands for, for models that work at the API level.
        self.api_calls: list[ApiCall] = []
        for _ in range(spec.topics):
            self._add_topic()

    def _uuid(self) -> uuid.UUID:
        return uuid.UUID(int=self._rng.getrandbits(128), version=4)

    def _add_topic(self) -> None:
        topic_id = self._uuid()
        name = f"orders-{self._topic_serial}"
        self._topic_serial += 1
        for p in range(self.spec.partitions_per_topic):
            self._leaders.append(
                _Leader(TopicIdPartition(topic_id, name, p), broker_id=self._rng.choice(self.spec.broker_ids))
            )

    def records(self) -> Iterator[RawRecord]:
        """At least `spec.events` records: the last action is completed, as by a writer that stops cleanly."""
        produced = 0
        while produced < self.spec.events:
            step = self._step()
            produced += len(step)
            yield from step

    # --- one action of one leader -------------------------------------------------------------------

    def _step(self) -> list[RawRecord]:
        leader = self._rng.choice(self._leaders)
        if leader.topic_deleted:
            return self._continue_partition_delete(leader)
        roll = self._rng.random()
        if leader.uploading is not None:
            if roll < 0.93:
                return self._finish_upload(leader)
            return self._abandon_upload(leader)  # the upload failed; Kafka deletes what it started
        if leader.deleting:
            return self._finish_delete(leader, leader.deleting.pop(0))
        if roll < 0.0005:
            # The topic is deleted: Kafka marks, then deletes, every one of its partitions.
            for lead in self._leaders:
                if lead.tp.topic_id == leader.tp.topic_id:
                    lead.topic_deleted = True
            return self._continue_partition_delete(leader)
        if roll < 0.05:
            # Leadership moves: a new epoch, sometimes on another broker that re-uploads the tail.
            leader.epoch += 1
            leader.broker_id = self._rng.choice(self.spec.broker_ids)
            if leader.live and self._rng.random() < 0.3:
                return self._start_upload(leader, reupload=True)
            return []
        if roll < 0.25 and len(leader.live) > 3:
            victim = leader.live.pop(0)
            leader.deleting.append(victim)
            return self._update(leader, victim, S.DELETE_SEGMENT_STARTED)
        return self._start_upload(leader, reupload=False)

    def _start_upload(self, leader: _Leader, reupload: bool) -> list[RawRecord]:
        if reupload:
            # The new leader uploads again from the start of the last finished segment, covering more.
            base = leader.live[-1]
            start = base.start_offset
            epochs = dict(base.segment_leader_epochs)
        else:
            start = leader.next_offset
            epochs = {}
        length = self._rng.randint(500, 20_000)
        end = max(start + length, leader.next_offset + self._rng.randint(1, 2_000))
        epochs[leader.epoch] = max(leader.next_offset if epochs else start, start)
        epochs = {e: o for e, o in epochs.items() if o <= end}
        md = RemoteLogSegmentMetadata(
            remote_log_segment_id=RemoteLogSegmentId(leader.tp, self._uuid()),
            start_offset=start,
            end_offset=end,
            max_timestamp_ms=self._now,
            broker_id=leader.broker_id,
            event_timestamp_ms=self._now,
            segment_size_in_bytes=self._rng.randint(*self.spec.segment_bytes),
            segment_leader_epochs=epochs,
            custom_metadata=self._rng.randbytes(16) if self._rng.random() < 0.5 else None,
            txn_idx_empty=self._rng.random() < 0.8,
        )
        leader.next_offset = end + 1
        leader.uploading = md
        self.api_calls.append(("add", md))
        return self._write(leader, state.prepare_add(self.writer_state, md))

    def _finish_upload(self, leader: _Leader) -> list[RawRecord]:
        md = leader.uploading
        assert md is not None
        leader.uploading = None
        records = self._update(leader, md, S.COPY_SEGMENT_FINISHED)
        finished = self.writer_state.segment(md.remote_log_segment_id)
        if finished is not None:
            covered = [s for s in leader.live if s.start_offset >= md.start_offset]
            for older in covered:
                # Displaced by the re-upload: retention deletes the older copy later.
                leader.live.remove(older)
                leader.deleting.append(older)
            leader.live.append(finished)
        return records

    def _abandon_upload(self, leader: _Leader) -> list[RawRecord]:
        md = leader.uploading
        assert md is not None
        leader.uploading = None
        leader.deleting.append(md)
        return self._update(leader, md, S.DELETE_SEGMENT_STARTED)

    def _finish_delete(self, leader: _Leader, md: RemoteLogSegmentMetadata) -> list[RawRecord]:
        current = self.writer_state.segment(md.remote_log_segment_id)
        if current is None:
            return []
        records = []
        if current.state is not S.DELETE_SEGMENT_STARTED:
            records += self._update(leader, current, S.DELETE_SEGMENT_STARTED)
        return records + self._update(leader, current, S.DELETE_SEGMENT_FINISHED)

    def _update(
        self, leader: _Leader, md: RemoteLogSegmentMetadata, target: RemoteLogSegmentState
    ) -> list[RawRecord]:
        self._tick()
        update = RemoteLogSegmentMetadataUpdate(
            md.remote_log_segment_id, self._now, md.custom_metadata, target, leader.broker_id
        )
        self.api_calls.append(("update", update))
        return self._write(leader, state.prepare_update(self.writer_state, update))

    def _continue_partition_delete(self, leader: _Leader) -> list[RawRecord]:
        if leader.delete_state is None:
            leader.delete_state = P.DELETE_PARTITION_MARKED
            return self._emit_partition_delete(leader)
        if leader.delete_state is P.DELETE_PARTITION_MARKED:
            leader.delete_state = P.DELETE_PARTITION_STARTED
            return self._emit_partition_delete(leader)
        pending = [*([leader.uploading] if leader.uploading else []), *leader.live, *leader.deleting]
        if pending:
            leader.uploading = None
            leader.live, leader.deleting = [], []
            records: list[RawRecord] = []
            for md in pending:
                records += self._finish_delete(leader, md)
            return records
        leader.delete_state = P.DELETE_PARTITION_FINISHED
        records = self._emit_partition_delete(leader)
        self._leaders.remove(leader)
        if not any(lead.tp.topic_id == leader.tp.topic_id for lead in self._leaders):
            self._add_topic()  # a new topic takes the deleted one's place so the cluster keeps its size
        return records

    def _emit_partition_delete(self, leader: _Leader) -> list[RawRecord]:
        self._tick()
        assert leader.delete_state is not None
        md = RemotePartitionDeleteMetadata(leader.tp, leader.delete_state, self._now, leader.broker_id)
        state.prepare_partition_delete(self.writer_state, md)
        self.api_calls.append(("delete_partition", md))
        return self._write(leader, md)

    # --- appending, as the manager does -------------------------------------------------------------

    def _write(self, leader: _Leader, event: MetadataEvent) -> list[RawRecord]:
        self._tick()
        key = key_of(event)
        doomed: list[RecordKey] = []
        if isinstance(event, RemotePartitionDeleteMetadata) and event.state is P.DELETE_PARTITION_FINISHED:
            doomed = state.doomed_keys(self.writer_state, event.topic_id_partition)
        pending: list[tuple[RecordKey, MetadataEvent | None]] = [(key, event)]
        out: list[RawRecord] = []
        first = True
        while pending:
            record_key, record_event = pending.pop(0)
            out.append(self._append(leader.tp, record_key, record_event))
            outcome = state.apply_record(self.writer_state, record_key, record_event, out[-1].offset)
            if not outcome.applied:
                raise AssertionError(f"generator wrote an invalid record: {outcome.reason}")
            if first and record_event is not None:
                pending += state.records_after(
                    self.writer_state, record_key, record_event, doomed, self._now, leader.broker_id
                )
                first = False
        return out

    def _append(self, tp: TopicIdPartition, key: RecordKey, event: MetadataEvent | None) -> RawRecord:
        mp = metadata_partition_for(tp.topic_id, tp.partition, self.spec.metadata_partitions)
        offset = self._offsets[mp]
        self._offsets[mp] += 1
        return RawRecord(mp, offset, self._now, key.encode(), None if event is None else codec.encode(event))

    def _tick(self) -> None:
        self._now += int(self._rng.expovariate(1 / self.spec.mean_gap_ms)) + 1

    def end_offsets(self) -> dict[int, int]:
        return dict(enumerate(self._offsets))


def generate(spec: HistorySpec) -> list[RawRecord]:
    return list(HistoryGenerator(spec).records())


def fold(records: list[RawRecord]) -> state.InMemoryState:
    """The single-process replay: every record, in topic order, through the pure state machine."""
    folded = state.InMemoryState()
    for record in sorted(records, key=lambda r: (r.metadata_partition, r.offset)):
        event = None if record.value is None else codec.decode(record.value)
        state.apply_record(folded, RecordKey.decode(record.key), event, record.offset)
    return folded


def write_archive(
    records: list[RawRecord], store: StorageBackend, metadata_topic: str, records_per_file: int = 5_000
) -> int:
    """Write `records` as the archiver would have: per metadata partition, files of consecutive records."""
    by_partition: dict[int, list[RawRecord]] = {}
    for record in records:
        by_partition.setdefault(record.metadata_partition, []).append(record)
    files = 0
    for partition, held in by_partition.items():
        held.sort(key=lambda r: r.offset)
        for i in range(0, len(held), records_per_file):
            chunk = [
                to_archived(metadata_topic, partition, r.offset, r.timestamp_ms, r.key, r.value)
                for r in held[i:i + records_per_file]
            ]
            key = archive_key(metadata_topic, partition, chunk[0]["offset"], chunk[-1]["offset"])
            store.put(key, encode_archive_file(metadata_topic, partition, chunk))
            files += 1
    return files


def produce_history(bootstrap: str, topic: str, records: list[RawRecord], timeout_s: float = 120) -> None:
    """Append `records` to `topic`, each to its own metadata partition and in order, as the manager would."""
    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
        "linger.ms": 20, "batch.num.messages": 10_000, "queue.buffering.max.messages": 200_000,
    })
    failures: list[str] = []

    def delivered(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failures.append(str(error))

    for record in records:
        while True:
            try:
                producer.produce(
                    topic, value=record.value, key=record.key, partition=record.metadata_partition,
                    timestamp=record.timestamp_ms, on_delivery=delivered,
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(timeout_s)
    if remaining or failures:
        raise RuntimeError(f"producing to {topic}: {remaining} records undelivered, errors {failures[:3]}")
