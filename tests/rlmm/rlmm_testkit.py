"""Helpers for the rlmm tests: a writer over the pure state that keeps its log, segment builders, compaction.

`LogWriter` does what a manager's write path does, without Kafka: validate, append, apply, append follow-ups.
"""

from __future__ import annotations

import os
import random
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from support import wait_until

from rlmm import codec, fresh_load, state
from rlmm.applier import MetadataApplier
from rlmm.events import MetadataEvent, RecordKey, key_of, metadata_partition_for, segment_key
from rlmm.manager import RemoteLogMetadataManager
from rlmm.state import (
    InMemoryState,
    Outcome,
    apply_record,
    prepare_add,
    prepare_partition_delete,
    prepare_update,
    records_after,
)
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from rlmm.view import MetadataView

LogRecord = tuple[RecordKey, MetadataEvent | None]
Segment = RemoteLogSegmentMetadata | None

SEGMENT_SIZE = 1_048_576
BROKER_0 = 0
BROKER_1 = 1


def make_tp(topic: str = "foo", partition: int = 0, topic_id: uuid.UUID | None = None) -> TopicIdPartition:
    return TopicIdPartition(topic_id or uuid.uuid4(), topic, partition)


def segment(
    tp: TopicIdPartition,
    start: int,
    end: int,
    epochs: Mapping[int, int],
    *,
    size: int = SEGMENT_SIZE,
    txn_idx_empty: bool = False,
    segment_id: uuid.UUID | None = None,
    state: RemoteLogSegmentState = RemoteLogSegmentState.COPY_SEGMENT_STARTED,
    event_timestamp_ms: int = 1_700_000_000_000,
) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        remote_log_segment_id=RemoteLogSegmentId(tp, segment_id or uuid.uuid4()),
        start_offset=start,
        end_offset=end,
        max_timestamp_ms=-1,
        broker_id=BROKER_0,
        event_timestamp_ms=event_timestamp_ms,
        segment_size_in_bytes=size,
        segment_leader_epochs=dict(epochs),
        state=state,
        txn_idx_empty=txn_idx_empty,
    )


def update_of(
    md: RemoteLogSegmentMetadata,
    state: RemoteLogSegmentState,
    *,
    custom_metadata: bytes | None = None,
    event_timestamp_ms: int = 1_700_000_000_001,
    broker_id: int = BROKER_1,
) -> RemoteLogSegmentMetadataUpdate:
    return RemoteLogSegmentMetadataUpdate(
        remote_log_segment_id=md.remote_log_segment_id,
        event_timestamp_ms=event_timestamp_ms,
        custom_metadata=custom_metadata,
        state=state,
        broker_id=broker_id,
    )


def partition_delete(
    tp: TopicIdPartition, state: RemotePartitionDeleteState, event_timestamp_ms: int = 1_700_000_000_002
) -> RemotePartitionDeleteMetadata:
    return RemotePartitionDeleteMetadata(tp, state, event_timestamp_ms, BROKER_0)


@dataclass
class LogWriter:
    """The write path of a manager over an InMemoryState: every appended record also lands in `log`."""

    store: InMemoryState = field(default_factory=InMemoryState)
    log: list[LogRecord] = field(default_factory=list)
    broker_id: int = BROKER_0
    clock_ms: int = 1_700_000_000_000

    def add(self, md: RemoteLogSegmentMetadata) -> None:
        self._write(prepare_add(self.store, md))

    def update(self, update: RemoteLogSegmentMetadataUpdate) -> RemoteLogSegmentMetadata:
        record = prepare_update(self.store, update)
        self._write(record)
        return record

    def delete_partition(self, md: RemotePartitionDeleteMetadata) -> None:
        prepare_partition_delete(self.store, md)
        doomed = [segment_key(s.remote_log_segment_id) for s in self.store.segments_of(md.topic_id_partition)]
        self._write(md, doomed)

    def write(self, writes: Iterable[ApiWrite]) -> None:
        """Make each write as the API call it stands for (a `workload`'s, say)."""
        for write in writes:
            if isinstance(write, RemoteLogSegmentMetadata):
                self.add(write)
            elif isinstance(write, RemoteLogSegmentMetadataUpdate):
                self.update(write)
            else:
                self.delete_partition(write)

    def add_and_update(
        self, md: RemoteLogSegmentMetadata, *states: RemoteLogSegmentState
    ) -> RemoteLogSegmentMetadata:
        """Add a segment, then move it through `states`; return its newest metadata."""
        self.add(md)
        for target in states:
            md = self.update(update_of(md, target))
        return md

    def _write(self, event: MetadataEvent, doomed: Iterable[RecordKey] = ()) -> None:
        key = key_of(event)
        self._append(key, event)
        self.clock_ms += 1
        for follow_key, follow_event in records_after(
            self.store, key, event, doomed, self.clock_ms, self.broker_id
        ):
            self._append(follow_key, follow_event)

    def _append(self, key: RecordKey, event: MetadataEvent | None) -> None:
        outcome = apply_record(self.store, key, event)
        assert outcome.applied, f"the writer's own record was dropped: {outcome.reason}"
        self.log.append((key, event))


def replay(records: Iterable[LogRecord], store: InMemoryState | None = None) -> InMemoryState:
    store = store if store is not None else InMemoryState()
    for key, event in records:
        apply_record(store, key, event)
    return store


def replay_outcomes(records: Iterable[LogRecord], store: InMemoryState) -> list[Outcome]:
    return [apply_record(store, key, event) for key, event in records]


def compacted(records: Sequence[LogRecord], *, keep_tombstones: bool = False) -> list[LogRecord]:
    """What Kafka's log cleaner leaves of `records`: the newest record of each key, in log order.

    Tombstones survive for `delete.retention.ms`; `keep_tombstones` chooses which side of it a reader is on.
    """
    newest: dict[bytes, int] = {}
    for position, (key, _) in enumerate(records):
        newest[key.encode()] = position
    kept = sorted(newest.values())
    return [records[p] for p in kept if keep_tombstones or records[p][1] is not None]


# --- the real manager on the shared broker --------------------------------------------------------------

WRITE_TIMEOUT_S = 30.0
READY_TIMEOUT_S = 60.0


def manager_config(
    bootstrap: str, state_dir: Path, topic: str, *, partitions: int = 1, broker_id: int = 0, **extra: Any
) -> dict[str, Any]:
    """A manager config for one test: its own metadata topic (RF 1) and state directory."""
    return {
        "bootstrap.servers": bootstrap,
        "broker.id": broker_id,
        "state.dir": str(state_dir),
        "metadata.topic.name": topic,
        "metadata.topic.num.partitions": partitions,
        "metadata.topic.replication.factor": 1,
        "metadata.topic.min.insync.replicas": 1,
        "metadata.topic.min.compaction.lag.ms": 0,
        "write.timeout.ms": int(WRITE_TIMEOUT_S * 1000),
        **extra,
    }


def register(manager: RemoteLogMetadataManager, *tps: TopicIdPartition, leader: bool = True) -> None:
    """Assign partitions to the manager (as leader or follower) and wait until it serves them."""
    if leader:
        manager.on_partition_leadership_changes(set(tps), set())
    else:
        manager.on_partition_leadership_changes(set(), set(tps))
    wait_ready(manager, *tps)


def wait_ready(manager: RemoteLogMetadataManager, *tps: TopicIdPartition) -> None:
    """Wait until the manager serves partitions it was assigned."""
    wait_until(lambda: all(manager.is_ready(tp) for tp in tps), timeout=READY_TIMEOUT_S,
               description=f"manager ready for {', '.join(map(str, tps))}")


def wait_digest(manager: RemoteLogMetadataManager, expected: str, timeout: float = READY_TIMEOUT_S) -> None:
    """Wait until the manager's view digest equals `expected` (it applies the topic in the background)."""
    wait_until(lambda: manager.view_digest() == expected, timeout=timeout,
                      description=f"view digest {expected[:12]} on broker {manager.broker_id}")


def call_error(call: Callable[[], object]) -> Exception | None:
    """The error of an API write, whether raised at once or through its future; None on success."""
    try:
        result = call()
        if isinstance(result, Future):
            result.result(timeout=WRITE_TIMEOUT_S)
    except Exception as exc:
        return exc
    return None


class ManagerSubject:
    """The manager behind the API the scenarios use: writes block until their future completes."""

    def __init__(self, manager: RemoteLogMetadataManager) -> None:
        self.manager = manager

    def register(self, *tps: TopicIdPartition) -> None:
        register(self.manager, *tps)

    def add_remote_log_segment_metadata(self, md: RemoteLogSegmentMetadata) -> None:
        self.manager.add_remote_log_segment_metadata(md).result(timeout=WRITE_TIMEOUT_S)

    def update_remote_log_segment_metadata(self, update: RemoteLogSegmentMetadataUpdate) -> None:
        self.manager.update_remote_log_segment_metadata(update).result(timeout=WRITE_TIMEOUT_S)

    def put_remote_partition_delete_metadata(self, md: RemotePartitionDeleteMetadata) -> None:
        self.manager.put_remote_partition_delete_metadata(md).result(timeout=WRITE_TIMEOUT_S)

    def remote_log_segment_metadata(self, tp: TopicIdPartition, epoch: int, offset: int) -> Segment:
        return self.manager.remote_log_segment_metadata(tp, epoch, offset)

    def highest_offset_for_epoch(self, tp: TopicIdPartition, epoch: int) -> int | None:
        return self.manager.highest_offset_for_epoch(tp, epoch)

    def list_remote_log_segments(
        self, tp: TopicIdPartition, epoch: int | None = None
    ) -> list[RemoteLogSegmentMetadata]:
        return list(self.manager.list_remote_log_segments(tp, epoch))

    def remote_log_size(self, tp: TopicIdPartition, epoch: int) -> int:
        return self.manager.remote_log_size(tp, epoch)

    def next_segment_with_txn_index(self, tp: TopicIdPartition, epoch: int, offset: int) -> Segment:
        return self.manager.next_segment_with_txn_index(tp, epoch, offset)

    def digest(self) -> str:
        return self.manager.view_digest()


class StateSubject:
    """The pure state behind the same API: a LogWriter and the state's query functions."""

    def __init__(self) -> None:
        self.writer = LogWriter()

    def register(self, *tps: TopicIdPartition) -> None:
        """The pure state has no registration: every partition is served."""

    def add_remote_log_segment_metadata(self, md: RemoteLogSegmentMetadata) -> None:
        self.writer.add(md)

    def update_remote_log_segment_metadata(self, update: RemoteLogSegmentMetadataUpdate) -> None:
        self.writer.update(update)

    def put_remote_partition_delete_metadata(self, md: RemotePartitionDeleteMetadata) -> None:
        self.writer.delete_partition(md)

    def remote_log_segment_metadata(self, tp: TopicIdPartition, epoch: int, offset: int) -> Segment:
        return state.segment_for_offset(self.writer.store, tp, epoch, offset)

    def highest_offset_for_epoch(self, tp: TopicIdPartition, epoch: int) -> int | None:
        return state.highest_offset_for_epoch(self.writer.store, tp, epoch)

    def list_remote_log_segments(
        self, tp: TopicIdPartition, epoch: int | None = None
    ) -> list[RemoteLogSegmentMetadata]:
        return state.list_segments(self.writer.store, tp, epoch)

    def remote_log_size(self, tp: TopicIdPartition, epoch: int) -> int:
        return state.remote_log_size(self.writer.store, tp, epoch)

    def next_segment_with_txn_index(self, tp: TopicIdPartition, epoch: int, offset: int) -> Segment:
        return state.next_segment_with_txn_index(self.writer.store, tp, epoch, offset)

    def digest(self) -> str:
        return self.writer.store.digest()


Subject = ManagerSubject | StateSubject


# --- workloads and the topic as written ----------------------------------------------------------------

ApiWrite = RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate | RemotePartitionDeleteMetadata


def workload(rng: random.Random, tp: TopicIdPartition, uploads: int, delete_partition: bool = False
             ) -> list[ApiWrite]:
    """A valid call sequence for one partition as a broker makes it: uploads across leader epochs, some
    re-uploads of a range by a new leader, retention deleting the oldest segments, maybe a partition delete."""
    writes: list[ApiWrite] = []
    live: list[RemoteLogSegmentMetadata] = []
    next_offset, epoch = 0, 0
    for _ in range(uploads):
        if live and rng.random() < 0.2:
            epoch += 1  # a new leader uploads again from an earlier offset
            start = rng.choice(live).start_offset
        else:
            start = next_offset
        end = start + rng.randint(0, 40)
        epochs = {epoch: start}
        if end > start and rng.random() < 0.3:
            epoch += 1
            epochs[epoch] = rng.randint(start + 1, end)
        md = segment(tp, start, end, epochs, size=rng.randint(1, 10_000), txn_idx_empty=rng.random() < 0.5)
        writes.append(md)
        if rng.random() < 0.9:
            update = update_of(md, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, custom_metadata=rng.randbytes(4))
            writes.append(update)
            live.append(md.create_with_update(update))
        next_offset = max(next_offset, end + 1)
        if len(live) > 3 and rng.random() < 0.4:
            oldest = live.pop(0)
            writes.append(update_of(oldest, RemoteLogSegmentState.DELETE_SEGMENT_STARTED))
            if rng.random() < 0.8:
                writes.append(update_of(oldest, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED))
    if delete_partition:
        writes.extend(partition_delete(tp, state) for state in RemotePartitionDeleteState)
    return writes


def submit(manager: RemoteLogMetadataManager, write: ApiWrite) -> Future[None]:
    if isinstance(write, RemoteLogSegmentMetadata):
        return manager.add_remote_log_segment_metadata(write)
    if isinstance(write, RemoteLogSegmentMetadataUpdate):
        return manager.update_remote_log_segment_metadata(write)
    return manager.put_remote_partition_delete_metadata(write)


def drive(manager: RemoteLogMetadataManager, writes_by_tp: Mapping[TopicIdPartition, Sequence[ApiWrite]]) -> None:
    """Make each partition's writes in order, partitions in parallel (as a broker's copy tasks do)."""

    def run(writes: Sequence[ApiWrite]) -> None:
        for write in writes:
            submit(manager, write).result(timeout=WRITE_TIMEOUT_S)

    with ThreadPoolExecutor(max_workers=max(1, len(writes_by_tp))) as pool:
        for done in [pool.submit(run, writes) for writes in writes_by_tp.values()]:
            done.result()


@dataclass(frozen=True)
class TopicRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def read_topic(bootstrap: str, topic: str, timeout: float = 60.0) -> list[TopicRecord]:
    """Every record the metadata topic holds now, partition by partition in offset order."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"tests-read-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        ends = {p: consumer.get_watermark_offsets(KafkaTopicPartition(topic, p), timeout=10)[1] for p in partitions}
        consumer.assign([KafkaTopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records: list[TopicRecord] = []
        reached = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + timeout
        while len(reached) < len(ends):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic}: reached the end of {sorted(reached)} of {sorted(ends)}")
            message = consumer.poll(0.5)
            if message is None:
                continue
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF and offset >= ends[partition]:
                    reached.add(partition)
                continue
            if offset < ends[partition]:
                records.append(TopicRecord(partition, offset, message.key(), message.value()))
            if offset + 1 >= ends[partition]:
                reached.add(partition)
        return sorted(records, key=lambda r: (r.partition, r.offset))
    finally:
        consumer.close()


def decoded(records: Iterable[TopicRecord]) -> list[LogRecord]:
    return [(RecordKey.decode(r.key or b""), None if r.value is None else codec.decode(r.value)) for r in records]


def produce_to(bootstrap: str, topic: str, partition: int, records: Iterable[tuple[bytes, bytes | None]]) -> None:
    """Append raw records to one metadata partition, as a foreign or broken writer would."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=partition)
    assert producer.flush(30) == 0, f"records to {topic}[{partition}] not delivered in 30 s"


# --- backlogs: a new node reading a writer's history in windows ----------------------------------------------

# Every consume of at least two records is a backlog, replayed in windows.
WINDOWED = {"apply.batch.max.records": 2}


def on_distinct_metadata_partitions() -> tuple[TopicIdPartition, TopicIdPartition]:
    """Two user partitions whose records go to metadata partitions 0 and 1 of a two-partition topic."""
    found: dict[int, TopicIdPartition] = {}
    while len(found) < 2:
        tp = make_tp("spread", 0)
        found.setdefault(metadata_partition_for(tp.topic_id, tp.partition, 2), tp)
    return found[0], found[1]


def written_history(make_manager: Callable[..., RemoteLogMetadataManager], seed: int,
                    tps: Sequence[TopicIdPartition] | None = None, uploads: int = 8
                    ) -> tuple[RemoteLogMetadataManager, tuple[TopicIdPartition, ...]]:
    """A writer's history of `uploads` uploads on each of `tps` (by default two user partitions, on metadata
    partitions 0 and 1), over a two-partition metadata topic."""
    writer = make_manager(broker_id=0, partitions=2)
    tps = tuple(tps or on_distinct_metadata_partitions())
    register(writer, *tps)
    drive(writer, {tp: workload(random.Random(seed + i), tp, uploads=uploads) for i, tp in enumerate(tps)})
    writer.wait_caught_up(60)
    return writer, tps


def append_garbage(bootstrap: str, topic: str, tp: TopicIdPartition) -> int:
    """Append bytes no tierlog wrote, then a valid record, to tp's metadata partition (0 of two); the garbage's
    offset."""
    garbage = (key_of(segment(tp, 900, 901, {0: 900})).encode(), b"\x00garbage")
    later = segment(tp, 1000, 1001, {0: 1000})
    produce_to(bootstrap, topic, 0, [garbage, (key_of(later).encode(), codec.encode(later))])
    return max(r.offset for r in read_topic(bootstrap, topic) if r.partition == 0) - 1


def rebuilt_past_garbage(make_manager: Callable[..., RemoteLogMetadataManager], writer: RemoteLogMetadataManager,
                         healthy: TopicIdPartition, bad_offset: int) -> RemoteLogMetadataManager:
    """A new node rebuilding, in windows, a topic with garbage at `bad_offset` of metadata partition 0
    (`append_garbage`): it halts that partition only, at that offset, and reads partition 1 (`healthy`'s) to its
    end, as the writer has it."""
    rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
    register(rebuilt, healthy)
    errors = wait_until(rebuilt.metadata_errors, timeout=60, description="the rebuilt node reporting the record")
    wait_until(lambda: rebuilt.applied_offsets().get(1) == writer.applied_offsets()[1], timeout=60,
               description="the healthy metadata partition read to its end")
    assert list(errors) == [0] and f"offset {bad_offset}" in str(errors[0])
    assert rebuilt.applied_offsets()[0] == bad_offset
    assert rebuilt.list_remote_log_segments(healthy) == writer.list_remote_log_segments(healthy)
    return rebuilt


def break_the_workers_rules(directory: Path, monkeypatch: Any) -> None:
    """A bug in the state machine of the worker processes started from now on, not in this one's (no record on a real
    topic makes a rule raise): planted through a sitecustomize module in `directory`, put on their path."""
    (directory / "sitecustomize.py").write_text(
        "from rlmm import state\n"
        "def broken(*args, **kwargs):\n"
        "    raise RuntimeError('a bug in the worker state machine')\n"
        "state.apply_record = broken\n"
        "from rlmm.view import FreshState\n"
        "FreshState._append_finished = broken  # the rules' shortcut for finished segments\n"
        "from rlmm.lean_fold import LeanFold\n"
        "LeanFold.fold_record = broken  # the worker's fold of plain records\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")])))


def fault_on_handing(monkeypatch: Any, method: str, fault: str, started: list[Any] | None = None) -> None:
    """Worker processes that fail around `FoldWorker.<method>` (submit or submit_group): "stalled", stopped (SIGSTOP)
    before they are handed anything, or "killed" once handed their work; their processes noted in `started`."""
    hand = getattr(fresh_load.FoldWorker, method)

    def faulty(self: Any, *args: Any) -> bool:
        if started is not None:
            started.append(self._process)
        if fault == "stalled":
            os.kill(self._process.pid, signal.SIGSTOP)  # it cannot answer
        handed = bool(hand(self, *args))
        if fault == "killed":
            self._process.kill()
        return handed

    monkeypatch.setattr(fresh_load.FoldWorker, method, faulty)


def counting_commits(monkeypatch: Any) -> list[int]:
    """The size of each commit the appliers make from now on (`monkeypatch`: pytest's fixture)."""
    sizes: list[int] = []
    commit = MetadataApplier._commit

    def counted(self: MetadataApplier, records: list[Any], next_offsets: dict[int, int]) -> Any:
        outcomes = commit(self, records, next_offsets)
        sizes.append(len(records))
        return outcomes

    monkeypatch.setattr(MetadataApplier, "_commit", counted)
    return sizes


@contextmanager
def empty_view() -> Iterator[MetadataView]:
    """A new view in a directory of its own (the tables of a load are written beside it), closed and removed after."""
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(Path(directory) / "view")
        try:
            yield view
        finally:
            view.close()
