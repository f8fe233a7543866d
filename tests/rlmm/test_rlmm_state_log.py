"""Replaying a metadata log: records with invalid transitions are dropped with a reason and change nothing.

Kafka logs and drops such events while consuming; a replay must never raise on them.
"""

from __future__ import annotations

import itertools

import pytest
from rlmm_testkit import LogWriter, compacted, make_tp, partition_delete, replay, segment, update_of
from support.reference_model import PARTITION_NEXT, SEGMENT_NEXT

from rlmm.errors import RemoteResourceNotFoundError
from rlmm.events import key_of, partition_delete_key, segment_key
from rlmm.lineage import checkpoint_records
from rlmm.state import (
    InMemoryState,
    apply_record,
    highest_offset_for_epoch,
    list_segments,
    pending_checkpoint,
    prepare_add,
)
from rlmm.types import RemoteLogSegmentState, RemotePartitionDeleteState

S = RemoteLogSegmentState
P = RemotePartitionDeleteState
TP = make_tp("foo", 0)

# The path of writes that brings a segment into each state.
_PATH_TO = {
    S.COPY_SEGMENT_STARTED: (),
    S.COPY_SEGMENT_FINISHED: (S.COPY_SEGMENT_FINISHED,),
    S.DELETE_SEGMENT_STARTED: (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED),
}
INVALID_SEGMENT_TRANSITIONS = [
    (current, target) for current, target in itertools.product(_PATH_TO, S) if target not in SEGMENT_NEXT[current]
]
INVALID_PARTITION_TRANSITIONS = [
    (current, target) for current, target in itertools.product([P.DELETE_PARTITION_MARKED,
                                                               P.DELETE_PARTITION_STARTED], P)
    if target not in PARTITION_NEXT[current]
]


@pytest.mark.parametrize(("current", "target"), INVALID_SEGMENT_TRANSITIONS,
                         ids=[f"{c.name}->{t.name}" for c, t in INVALID_SEGMENT_TRANSITIONS])
def test_a_segment_record_with_an_invalid_transition_is_dropped_with_a_reason(current: S, target: S) -> None:
    writer = LogWriter()
    md = writer.add_and_update(segment(TP, 10, 100, {5: 10}), *_PATH_TO[current])
    before = writer.store.digest()
    invalid = md.create_with_update(update_of(md, target))
    outcome = apply_record(writer.store, key_of(invalid), invalid)
    assert not outcome.applied
    assert outcome.reason is not None and current.name in outcome.reason and target.name in outcome.reason
    assert writer.store.digest() == before


@pytest.mark.parametrize(("current", "target"), INVALID_PARTITION_TRANSITIONS,
                         ids=[f"{c.name}->{t.name}" for c, t in INVALID_PARTITION_TRANSITIONS])
def test_a_partition_delete_record_with_an_invalid_transition_is_dropped_with_a_reason(current: P, target: P) -> None:
    writer = LogWriter()
    writer.add_and_update(segment(TP, 0, 9, {0: 0}), S.COPY_SEGMENT_FINISHED)
    for state in P:
        writer.delete_partition(partition_delete(TP, state))
        if state is current:
            break
    before = writer.store.digest()
    outcome = apply_record(writer.store, partition_delete_key(TP), partition_delete(TP, target))
    assert not outcome.applied
    assert outcome.reason is not None and target.name in outcome.reason
    assert writer.store.digest() == before


def test_a_log_with_invalid_records_interleaved_replays_to_the_state_of_the_log_without_them() -> None:
    writer = LogWriter()
    md = writer.add_and_update(segment(TP, 0, 50, {0: 0, 1: 20}), S.COPY_SEGMENT_FINISHED)
    regress = md.create_with_update(update_of(md, S.COPY_SEGMENT_STARTED))
    jump = segment(TP, 60, 70, {1: 60})
    writer.add(jump)
    skip = jump.create_with_update(update_of(jump, S.DELETE_SEGMENT_FINISHED))
    noisy = [*writer.log[:3], (key_of(regress), regress), *writer.log[3:], (key_of(skip), skip)]
    store = InMemoryState()
    outcomes = [apply_record(store, key, event) for key, event in noisy]
    assert [o.applied for o in outcomes].count(False) == 2
    assert store.digest() == writer.store.digest()


def test_an_update_that_changes_a_segments_offsets_is_dropped() -> None:
    writer = LogWriter()
    md = writer.add_and_update(segment(TP, 0, 50, {0: 0}), S.COPY_SEGMENT_FINISHED)
    before = writer.store.digest()
    moved = segment(TP, 0, 60, {0: 0}, segment_id=md.remote_log_segment_id.id, state=S.DELETE_SEGMENT_STARTED)
    outcome = apply_record(writer.store, key_of(moved), moved)
    assert not outcome.applied and outcome.reason
    assert writer.store.digest() == before


def test_a_record_whose_key_names_another_segment_is_dropped() -> None:
    writer = LogWriter()
    md = writer.add_and_update(segment(TP, 0, 50, {0: 0}))
    other = segment(TP, 0, 9, {0: 0})
    before = writer.store.digest()
    outcome = apply_record(writer.store, segment_key(md.remote_log_segment_id), other)
    assert not outcome.applied and outcome.reason and "key" in outcome.reason
    assert writer.store.digest() == before


def test_a_tombstone_for_a_key_never_seen_changes_nothing() -> None:
    writer = LogWriter()
    writer.add_and_update(segment(TP, 0, 50, {0: 0}), S.COPY_SEGMENT_FINISHED)
    before = writer.store.digest()
    apply_record(writer.store, segment_key(segment(TP, 0, 1, {0: 0}).remote_log_segment_id), None)
    apply_record(writer.store, partition_delete_key(make_tp("bar", 3)), None)
    assert writer.store.digest() == before


def test_a_finished_segment_whose_creating_record_was_compacted_away_is_served_from_its_own_record() -> None:
    writer = LogWriter()
    md = writer.add_and_update(segment(TP, 0, 50, {0: 0}), S.COPY_SEGMENT_FINISHED)
    store = InMemoryState()
    outcome = apply_record(store, key_of(md), md)
    assert outcome.applied
    assert list_segments(store, TP) == [md]


def test_a_lineage_checkpoint_written_late_by_another_writer_does_not_lower_an_epochs_highest_offset() -> None:
    # Two brokers write for one partition around a leadership change. B's checkpoint follows its event E2 but,
    # appended late, lands after A's event E1 and A's checkpoint: E2, E1, C1, C2. Kafka's highest offset of
    # the epoch is 200 (E1's end) and "never goes down".
    writer = LogWriter()
    low = writer.add_and_update(segment(TP, 0, 100, {0: 0}))
    high = writer.add_and_update(segment(TP, 101, 200, {0: 101}))
    e2 = low.create_with_update(update_of(low, S.COPY_SEGMENT_FINISHED))
    e1 = high.create_with_update(update_of(high, S.COPY_SEGMENT_FINISHED))
    node = replay(writer.log)
    apply_record(node, key_of(e2), e2)
    c2 = pending_checkpoint(node, TP, 1, 1)  # B, right after applying its own event
    apply_record(node, key_of(e1), e1)
    c1 = pending_checkpoint(node, TP, 2, 0)  # A, after applying both
    assert c1 is not None and c2 is not None
    log = [*writer.log, (key_of(e2), e2), (key_of(e1), e1), *checkpoint_records(c1), *checkpoint_records(c2)]
    assert highest_offset_for_epoch(replay(log), TP, 0) == 200


def test_a_rebuild_from_the_compacted_log_still_refuses_writes_for_a_partition_whose_deletion_finished() -> None:
    writer = LogWriter()
    writer.add_and_update(segment(TP, 0, 50, {0: 0}), S.COPY_SEGMENT_FINISHED)
    for state in P:
        writer.delete_partition(partition_delete(TP, state))
    rebuilt = replay(compacted(writer.log))
    with pytest.raises(RemoteResourceNotFoundError):
        prepare_add(rebuilt, segment(TP, 51, 60, {0: 51}))
