"""Hypothesis strategies for the rlmm property tests: random API call sequences made on the reference model
and on a writer over rlmm.state at once, over a few partitions, leader epochs and overlapping segments.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from rlmm_testkit import LogWriter, partition_delete, segment, update_of
from support.reference_model import ReferenceModel, listing_order

from rlmm.errors import RemoteStorageError
from rlmm.state import (
    StateStore,
    highest_offset_for_epoch,
    list_segments,
    next_segment_with_txn_index,
    remote_log_size,
    segment_for_offset,
)
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
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
        if scenario.model.is_deleted(tp):
            continue
        model = scenario.model
        listed = list_segments(store, tp)
        assert listed == model.list_remote_log_segments(tp), f"listing of {tp}"
        assert listed == sorted(listed, key=listing_order)
        offsets = interesting_offsets(scenario.added[tp])
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
