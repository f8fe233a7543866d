"""Hypothesis strategies for the rlmm property tests: random API call sequences made on the reference model
and on a writer over rlmm.state at once, over a few partitions, leader epochs and overlapping segments.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from rlmm_testkit import LogWriter, partition_delete, segment, update_of
from support.reference_model import ReferenceModel, listing_order

from rlmm.errors import RemoteStorageError
from rlmm.events import MetadataEvent, RecordKey, key_of
from rlmm.lineage import checkpoint_records
from rlmm.state import (
    InMemoryState,
    Outcome,
    StateStore,
    apply_record,
    corrections_after,
    highest_offset_for_epoch,
    list_segments,
    next_segment_with_txn_index,
    pending_checkpoint,
    prepare_add,
    prepare_update,
    records_after,
    remote_log_size,
    segment_for_offset,
)
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)

S = RemoteLogSegmentState
P = RemotePartitionDeleteState

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)
STEPS = st.integers(min_value=1, max_value=30)

# Two partitions of one topic and one of another: partitions of one topic id must never see each other's events.
_TOPIC_A = uuid.UUID(int=0xA)
_TOPIC_B = uuid.UUID(int=0xB)
PARTITIONS = (
    TopicIdPartition(_TOPIC_A, "orders", 0),
    TopicIdPartition(_TOPIC_A, "orders", 1),
    TopicIdPartition(_TOPIC_B, "payments", 0),
)
EPOCHS = range(0, 4)
QUERIED_EPOCHS = range(0, 5)  # one epoch no segment ever carries


@dataclass
class Scenario:
    """Both implementations under one random call sequence, and what was ever added per partition."""

    model: ReferenceModel = field(default_factory=ReferenceModel)
    writer: LogWriter = field(default_factory=LogWriter)
    added: dict[TopicIdPartition, list[RemoteLogSegmentMetadata]] = field(
        default_factory=lambda: {tp: [] for tp in PARTITIONS}
    )
    next_id: int = 1

    def call(self, tp: TopicIdPartition, name: str, *args: Any) -> None:
        """Make one API call on both sides; both must succeed, or both raise the same error type."""
        was_deleted = self.model.is_deleted(tp)
        model_error = _error_of(lambda: getattr(self.model, name)(*args))
        writer_error = _error_of(lambda: _WRITER_CALLS[name](self.writer, *args))
        if was_deleted:
            # Every call for a partition whose deletion finished is refused; which error wins over an
            # argument that is invalid anyway is not Kafka's contract.
            assert isinstance(model_error, RemoteStorageError)
            assert isinstance(writer_error, RemoteStorageError), f"{name}{args} accepted after the partition's deletion"
        else:
            assert type(writer_error) is type(model_error), (
                f"{name}{args}: reference raised {model_error!r}, state writer raised {writer_error!r}"
            )
        if self.model.is_deleted(tp):
            store = self.writer.store
            assert list(store.segments_of(tp)) == [] and list(store.lineages_of(tp)) == []

    def new_segment_id(self, salt: int) -> uuid.UUID:
        # Random high bits so ties in listing order are broken by id bytes in both directions.
        self.next_id += 1
        return uuid.UUID(int=(salt << 64) | self.next_id)


def _error_of(call: Callable[[], object]) -> Exception | None:
    try:
        call()
    except RemoteStorageError as exc:
        return exc
    return None


_WRITER_CALLS: dict[str, Callable[..., object]] = {
    "add_remote_log_segment_metadata": LogWriter.add,
    "update_remote_log_segment_metadata": LogWriter.update,
    "put_remote_partition_delete_metadata": LogWriter.delete_partition,
}


@st.composite
def segment_shapes(draw: st.DrawFn) -> tuple[int, int, dict[int, int]]:
    """Small offsets so segments overlap and repeat across leader epochs."""
    start = draw(st.integers(0, 30))
    end = start + draw(st.integers(0, 15))
    first_epoch = draw(st.sampled_from(EPOCHS))
    epochs = {first_epoch: start}
    # Later leader epochs of the segment: each a higher epoch starting at a higher offset inside it.
    for epoch_step, offset_step in draw(st.lists(st.tuples(st.integers(1, 2), st.integers(1, 8)), max_size=2)):
        epoch, offset = max(epochs) + epoch_step, max(epochs.values()) + offset_step
        if epoch in EPOCHS and offset <= end:
            epochs[epoch] = offset
    return start, end, epochs


def _next_valid_state(state: RemoteLogSegmentState) -> RemoteLogSegmentState:
    return {
        S.COPY_SEGMENT_STARTED: S.COPY_SEGMENT_FINISHED,
        S.COPY_SEGMENT_FINISHED: S.DELETE_SEGMENT_STARTED,
    }.get(state, S.DELETE_SEGMENT_FINISHED)


def step(draw: Callable[[st.SearchStrategy[Any]], Any], scenario: Scenario) -> None:
    """Draw one API call, biased towards valid ones and towards uploads that overlap earlier ones."""
    tp = draw(st.sampled_from(PARTITIONS))
    kind = draw(st.sampled_from(
        ["upload"] * 4 + ["reupload"] * 3 + ["add"] * 2 + ["update"] * 5
        + ["add_wrong_state", "re_add", "update_unknown", "partition_delete"]
    ))
    known = scenario.added[tp]
    if kind in ("re_add", "update", "reupload") and not known:
        kind = "upload"
    if kind in ("add", "upload", "reupload", "add_wrong_state", "re_add"):
        start, end, epochs = draw(segment_shapes())
        if kind == "reupload":
            # After a leader change the new leader uploads the same or a larger range again, in a later epoch.
            earlier = draw(st.sampled_from(known))
            start = max(0, earlier.start_offset - draw(st.integers(0, 3)))
            end = earlier.end_offset + draw(st.integers(0, 3))
            epochs = {e + draw(st.integers(0, 1)): o for e, o in earlier.segment_leader_epochs.items()}
            epochs = dict(zip(sorted(epochs), [start, *sorted(epochs.values())[1:]], strict=True))
        if kind == "re_add":
            segment_id = draw(st.sampled_from(known)).remote_log_segment_id.id
        else:
            segment_id = scenario.new_segment_id(draw(st.integers(0, 3)))
        state = draw(st.sampled_from([S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED])
                     ) if kind == "add_wrong_state" else S.COPY_SEGMENT_STARTED
        md = segment(tp, start, end, epochs, segment_id=segment_id, state=state, size=draw(st.integers(0, 5000)),
                     txn_idx_empty=draw(st.booleans()))
        if kind != "add_wrong_state":
            known.append(md)
        scenario.call(tp, "add_remote_log_segment_metadata", md)
        if kind in ("upload", "reupload"):
            scenario.call(tp, "update_remote_log_segment_metadata", update_of(md, S.COPY_SEGMENT_FINISHED))
    elif kind == "update":
        md = draw(st.sampled_from(known))
        current = scenario.model.segment(tp, md.remote_log_segment_id.id) if not scenario.model.is_deleted(tp) else None
        state = _next_valid_state(current.state) if current is not None and draw(st.integers(0, 9)) < 7 else draw(
            st.sampled_from(list(S)))
        custom = draw(st.one_of(st.none(), st.binary(max_size=4)))
        scenario.call(tp, "update_remote_log_segment_metadata", update_of(
            current or md, state, custom_metadata=custom, event_timestamp_ms=draw(st.integers(0, 10**6))))
    elif kind == "update_unknown":
        ghost = segment(tp, 0, 1, {0: 0}, segment_id=scenario.new_segment_id(0))
        scenario.call(tp, "update_remote_log_segment_metadata", update_of(ghost, draw(st.sampled_from(list(S)))))
    else:
        scenario.call(tp, "put_remote_partition_delete_metadata", partition_delete(tp, draw(st.sampled_from(list(P)))))


def interesting_offsets(segments: list[RemoteLogSegmentMetadata]) -> set[int]:
    offsets = {0}
    for md in segments:
        offsets |= {md.start_offset - 1, md.start_offset, md.end_offset, md.end_offset + 1}
        for start in md.segment_leader_epochs.values():
            offsets |= {start - 1, start}
    return {o for o in offsets if o >= 0}


def _ids(segments: list[RemoteLogSegmentMetadata]) -> list[uuid.UUID]:
    return [md.remote_log_segment_id.id for md in segments]


@st.composite
def histories(draw: st.DrawFn) -> Scenario:
    """A random call sequence made on both sides, with no queries in between."""
    scenario = Scenario()
    for _ in range(draw(STEPS)):
        step(draw, scenario)
    return scenario


def assert_same_answers(scenario: Scenario, store: StateStore) -> None:
    """Every query on `store` agrees with the reference model."""
    for tp in PARTITIONS:
        if not scenario.model.is_deleted(tp):
            assert_answers_like(scenario.model, store, tp, scenario.added[tp])


def assert_answers_like(
    model: ReferenceModel, store: StateStore, tp: TopicIdPartition, segments: list[RemoteLogSegmentMetadata]
) -> None:
    """Every query for `tp` on `store` agrees with `model`, at every offset around `segments`."""
    listed = list_segments(store, tp)
    assert listed == model.list_remote_log_segments(tp), f"listing of {tp}"
    assert listed == sorted(listed, key=listing_order)
    offsets = interesting_offsets(segments)
    for epoch in QUERIED_EPOCHS:
        assert list_segments(store, tp, epoch) == model.list_remote_log_segments(tp, epoch), (tp, epoch)
        assert highest_offset_for_epoch(store, tp, epoch) == model.highest_offset_for_epoch(tp, epoch), (
            tp, epoch)
        assert remote_log_size(store, tp, epoch) == model.remote_log_size(tp, epoch), (tp, epoch)
        for offset in offsets:
            assert segment_for_offset(store, tp, epoch, offset) == model.remote_log_segment_metadata(
                tp, epoch, offset), (tp, epoch, offset)
            assert next_segment_with_txn_index(store, tp, epoch, offset) == model.next_segment_with_txn_index(
                tp, epoch, offset), (tp, epoch, offset)


# --- several writers for one partition, their records interleaved in the topic ----------------------------

TopicRecord = tuple[int, RecordKey, MetadataEvent | None]  # (metadata offset, key, event or tombstone)
WRITER_TP = PARTITIONS[0]


def replay_at_offsets(records: Iterable[TopicRecord], store: InMemoryState | None = None, start: int = 0
                      ) -> InMemoryState:
    """A node reading the topic from `start` (the offset it applied up to, into `store`): every record applied with
    its offset, and, as rlmm.applier tells, whether older records of its key may be missing (past a gap in the
    offsets: records the log cleaner removed)."""
    store = store if store is not None else InMemoryState()
    expected, after_gap = start, False
    for offset, key, event in records:
        after_gap = after_gap or offset != expected
        apply_record(store, key, event, offset, after_gap)
        expected = offset + 1
    return store


def compacted_at_offsets(records: Sequence[TopicRecord], *, keep_tombstones: bool = False) -> list[TopicRecord]:
    """What Kafka's log cleaner leaves: the newest record of each key, at its own offset."""
    newest = {key.encode(): (offset, key, event) for offset, key, event in records}
    kept = sorted(newest.values(), key=lambda record: record[0])
    return [record for record in kept if keep_tombstones or record[2] is not None]


def kafka_model_of(records: Iterable[TopicRecord]) -> ReferenceModel:
    """Kafka's RemoteLogMetadataCache after consuming the topic's events in order."""
    model = ReferenceModel()
    for _, _, event in records:
        feed_kafka_model(model, event)
    return model


def feed_kafka_model(model: ReferenceModel, event: MetadataEvent | None) -> None:
    """One record as Kafka's consumer applies it: an invalid event is logged and dropped.

    Checkpoints and tombstones are tierlog's own records; Kafka has no counterpart to them.
    """
    try:
        if isinstance(event, RemoteLogSegmentMetadata):
            if event.state is S.COPY_SEGMENT_STARTED:
                model.add_remote_log_segment_metadata(event)
            else:
                model.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
                    event.remote_log_segment_id, event.event_timestamp_ms, event.custom_metadata,
                    event.state, event.broker_id))
        elif isinstance(event, RemotePartitionDeleteMetadata):
            model.put_remote_partition_delete_metadata(event)
    except RemoteStorageError:
        pass


@dataclass
class RacingWriter:
    """One broker's write path with a view that lags the topic: it checks a call against what it has applied,
    appends the event, and appends the follow-ups (checkpoint, tombstone) it computed once its view held the
    event; other writers' records may land in between at any point. Like rlmm.writer, when its view applies one
    of its own records that another writer's record overtook (a stale checkpoint, a dropped event), it appends
    the correction rlmm.state.corrections_after calls for."""

    broker_id: int
    topic: list[TopicRecord]
    view: InMemoryState = field(default_factory=InMemoryState)
    applied: int = 0  # records of `topic` applied to `view`
    in_flight: tuple[int, RecordKey, MetadataEvent] | None = None
    outbox: list[tuple[RecordKey, MetadataEvent | None, str]] = field(default_factory=list)
    owned: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    # This writer's own records by offset: "event" (an API call's), "follow" (checkpoints, tombstones) or
    # "restated" (a correction that is an event of its own, with follow-ups of its own); and their outcomes.
    mine: dict[int, str] = field(default_factory=dict)
    outcomes: dict[int, Outcome] = field(default_factory=dict)

    def catch_up(self, count: int) -> None:
        upto = min(len(self.topic), self.applied + count)
        owed: list[tuple[str, RecordKey, MetadataEvent, Outcome]] = []
        for offset, key, event in self.topic[self.applied:upto]:
            outcome = apply_record(self.view, key, event, offset, False)  # a live view: every record, in order
            role = self.mine.get(offset)
            if role is not None and event is not None:
                self.outcomes[offset] = outcome
                owed.append((role, key, event, outcome))
        self.applied = upto
        # What the writer appends once a batch is applied, in the order of its records.
        for role, key, event, outcome in owed:
            if role == "restated" and outcome.applied:
                self._queue(records_after(self.view, key, event, (), 0, self.broker_id), "follow")
            if role == "follow" and outcome.stale:
                self._queue(corrections_after(self.view, event, outcome, 0, self.broker_id), "follow")
            elif role != "follow" and not outcome.applied:
                self._queue(corrections_after(self.view, event, outcome, 0, self.broker_id), "restated")

    def _queue(self, records: Iterable[tuple[RecordKey, MetadataEvent | None]], role: str) -> None:
        self.outbox += [(key, event, role) for key, event in records]

    def append(self, key: RecordKey, event: MetadataEvent | None, role: str = "follow") -> None:
        self.mine[len(self.topic)] = role
        self.topic.append((len(self.topic), key, event))

    def idle(self) -> bool:
        return self.in_flight is None and not self.outbox

    def write(self, event: MetadataEvent) -> None:
        """Append `event` (already checked against this writer's view), after any checkpoint still owed."""
        assert self.idle()
        for key, recovery in checkpoint_records(pending_checkpoint(self.view, WRITER_TP, 0, self.broker_id)):
            self.append(key, recovery)
        self.append(key_of(event), event, "event")
        self.in_flight = (len(self.topic) - 1, key_of(event), event)

    def see_own_write(self, extra: int) -> None:
        """The view applies up to the event (and `extra` records after it); the follow-ups are computed now."""
        assert self.in_flight is not None
        offset, key, event = self.in_flight
        self.in_flight = None
        self.catch_up(max(0, offset + 1 - self.applied) + extra)
        if self.outcomes[offset].applied:  # a dropped event has no follow-ups, only its restatement
            self._queue(records_after(self.view, key, event, (), 0, self.broker_id), "follow")

    def flush(self) -> None:
        for key, event, role in self.outbox:
            self.append(key, event, role)
        self.outbox = []


@dataclass
class RacingScenario:
    topic: list[TopicRecord] = field(default_factory=list)
    writers: list[RacingWriter] = field(default_factory=list)
    segments: list[RemoteLogSegmentMetadata] = field(default_factory=list)
    next_id: int = 1


def _racing_call(draw: Callable[[st.SearchStrategy[Any]], Any], scenario: RacingScenario, writer: RacingWriter) -> None:
    """An upload (add), a state change of one of the writer's own segments, or a re-upload over another's."""
    kind = draw(st.sampled_from(["add"] * 2 + ["reupload"] * 3 + ["advance"] * 5))
    if kind == "advance" and writer.owned:
        md = draw(st.sampled_from(writer.owned))
        current = writer.view.segment(md.remote_log_segment_id)
        if current is None or current.state is S.DELETE_SEGMENT_FINISHED:
            return
        # Mostly forward (an upload finishes, a finished segment gets deleted), sometimes a repeated FINISHED.
        target = draw(st.sampled_from([_next_valid_state(current.state)] * 3 + [S.COPY_SEGMENT_FINISHED]))
        try:
            record = prepare_update(writer.view, update_of(current, target, broker_id=writer.broker_id))
        except RemoteStorageError:
            return
        writer.write(record)
        return
    start, end, epochs = draw(segment_shapes())
    if kind == "reupload" and scenario.segments:
        earlier = draw(st.sampled_from(scenario.segments))
        start = max(0, earlier.start_offset - draw(st.integers(0, 3)))
        end = earlier.end_offset + draw(st.integers(0, 3))
        shifted = {e + draw(st.integers(0, 1)): o for e, o in earlier.segment_leader_epochs.items()}
        epochs = dict(zip(sorted(shifted), [start, *sorted(shifted.values())[1:]], strict=True))
    scenario.next_id += 1
    md = segment(WRITER_TP, start, end, epochs, segment_id=uuid.UUID(int=(draw(st.integers(0, 3)) << 64)
                                                                      | scenario.next_id),
                 size=draw(st.integers(0, 5000)), txn_idx_empty=draw(st.booleans()))
    writer.write(prepare_add(writer.view, md))
    writer.owned.append(md)
    scenario.segments.append(md)


@st.composite
def racing_histories(draw: st.DrawFn, max_steps: int = 60) -> RacingScenario:
    """Two or three writers whose calls, catch-ups and follow-ups interleave in any order; all finish at the end."""
    scenario = RacingScenario()
    scenario.writers = [RacingWriter(broker, scenario.topic) for broker in range(draw(st.integers(2, 3)))]
    for _ in range(draw(st.integers(1, max_steps))):
        writer = draw(st.sampled_from(scenario.writers))
        action = draw(st.sampled_from(["call"] * 4 + ["catch_up", "see", "flush"]))
        if action == "catch_up":
            writer.catch_up(draw(st.integers(1, 6)))
        elif writer.in_flight is not None:
            writer.see_own_write(draw(st.integers(0, 3)))
        elif writer.outbox:
            writer.flush()
        elif action == "call":
            _racing_call(draw, scenario, writer)
    for writer in draw(st.permutations(scenario.writers)):
        if writer.in_flight is not None:
            writer.see_own_write(draw(st.integers(0, 3)))
    for writer in draw(st.permutations(scenario.writers)):
        writer.flush()
    return scenario


def settle(scenario: RacingScenario) -> None:
    """What the next write of any writer does first: append the checkpoint its fully caught-up view owes."""
    for writer in scenario.writers:
        writer.catch_up(len(scenario.topic))
        for key, recovery in checkpoint_records(pending_checkpoint(writer.view, WRITER_TP, 0, writer.broker_id)):
            writer.append(key, recovery)
    for writer in scenario.writers:
        writer.catch_up(len(scenario.topic))


def drain(scenario: RacingScenario, rounds: int = 20) -> None:
    """Every writer applies the whole topic and appends the corrections its own records call for, until none is
    owed: what the writers do by themselves once their calls stop (no further write needed)."""
    for _ in range(rounds):
        for writer in scenario.writers:
            writer.catch_up(len(scenario.topic))
            writer.flush()
        if all(writer.applied == len(scenario.topic) and writer.idle() for writer in scenario.writers):
            return
    raise AssertionError(f"the writers kept correcting each other for {rounds} rounds")
