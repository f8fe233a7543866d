"""Apache Kafka's own RLMM test scenarios, re-expressed for tierlog: lifecycle, lineage, listing, deletion.

Scenarios that only need the metadata state run against the pure state and the real manager on the broker
(`subject`); registration, readiness, partition deletion and restarts need the manager.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from rlmm_strategies import kafka_model_of
from rlmm_testkit import (
    SEGMENT_SIZE,
    ManagerSubject,
    StateSubject,
    Subject,
    call_error,
    decoded,
    make_tp,
    partition_delete,
    read_topic,
    register,
    segment,
    update_of,
)
from support.topics import produce

from rlmm import (
    InvalidArgumentError,
    RemoteLogMetadataManager,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    RemoteResourceNotFoundError,
    RemoteStorageNotReadyError,
    codec,
)
from rlmm.events import key_of

S = RemoteLogSegmentState
P = RemotePartitionDeleteState
TP = make_tp("foo", 0)

MakeManager = Callable[..., RemoteLogMetadataManager]


def upload(subject: Subject, md: RemoteLogSegmentMetadata, *states: RemoteLogSegmentState) -> RemoteLogSegmentMetadata:
    """Add a segment and move it through `states`; return the metadata the manager now holds for it."""
    subject.register(md.topic_id_partition)
    subject.add_remote_log_segment_metadata(md)
    for state in states:
        update = update_of(md, state)
        subject.update_remote_log_segment_metadata(update)
        md = md.create_with_update(update)
    return md


def finished(subject: Subject, start: int, end: int, epochs: dict[int, int], **kwargs: object
             ) -> RemoteLogSegmentMetadata:
    return upload(subject, segment(TP, start, end, epochs, **kwargs), S.COPY_SEGMENT_FINISHED)  # type: ignore[arg-type]


def ids(segments: list[RemoteLogSegmentMetadata]) -> list[uuid.UUID]:
    return [md.remote_log_segment_id.id for md in segments]


# --- one segment through its states (RemoteLogSegmentLifecycleTest) ----------------------------------------

def test_a_segment_being_copied_is_listed_but_not_served(subject: Subject) -> None:
    md = upload(subject, segment(TP, 0, 50, {0: 0}))
    assert subject.remote_log_segment_metadata(TP, 0, 0) is None
    assert subject.list_remote_log_segments(TP, 0) == [md]
    assert subject.list_remote_log_segments(TP) == [md]


def test_a_segment_being_copied_does_not_count_for_the_highest_offset_of_its_epochs(subject: Subject) -> None:
    upload(subject, segment(TP, 0, 100, {0: 0, 1: 20, 2: 80}))
    assert [subject.highest_offset_for_epoch(TP, e) for e in (0, 1, 2)] == [None, None, None]


def test_a_copied_segment_is_served_and_listed(subject: Subject) -> None:
    md = finished(subject, 101, 200, {0: 101})
    assert subject.remote_log_segment_metadata(TP, 0, 150) == md
    assert subject.list_remote_log_segments(TP, 0) == [md]
    assert subject.list_remote_log_segments(TP) == [md]


def test_a_served_segment_carries_the_state_broker_and_custom_metadata_of_its_last_update(subject: Subject) -> None:
    md = segment(TP, 0, 10, {0: 0})
    upload(subject, md)
    update = update_of(md, S.COPY_SEGMENT_FINISHED, custom_metadata=b"\x01\x02", broker_id=7,
                       event_timestamp_ms=1234)
    subject.update_remote_log_segment_metadata(update)
    served = subject.remote_log_segment_metadata(TP, 0, 5)
    assert served is not None
    assert (served.state, served.broker_id, served.custom_metadata, served.event_timestamp_ms) == (
        S.COPY_SEGMENT_FINISHED, 7, b"\x01\x02", 1234)
    assert (served.start_offset, served.end_offset, served.segment_size_in_bytes) == (0, 10, SEGMENT_SIZE)


def test_a_segment_being_deleted_is_listed_but_not_served(subject: Subject) -> None:
    md = upload(subject, segment(TP, 201, 300, {0: 201}), S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED)
    assert subject.remote_log_segment_metadata(TP, 0, 250) is None
    assert subject.list_remote_log_segments(TP, 0) == [md]
    assert subject.list_remote_log_segments(TP) == [md]


def test_a_deleted_segment_is_neither_served_nor_listed(subject: Subject) -> None:
    upload(subject, segment(TP, 301, 400, {0: 301}), S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED,
           S.DELETE_SEGMENT_FINISHED)
    assert subject.remote_log_segment_metadata(TP, 0, 350) is None
    assert subject.list_remote_log_segments(TP, 0) == []
    assert subject.list_remote_log_segments(TP) == []


def test_a_copy_can_be_abandoned_straight_from_copy_started(subject: Subject) -> None:
    md = upload(subject, segment(TP, 0, 9, {0: 0}), S.DELETE_SEGMENT_STARTED)
    assert subject.list_remote_log_segments(TP) == [md]
    assert subject.highest_offset_for_epoch(TP, 0) is None


def _four_segments(subject: Subject) -> list[RemoteLogSegmentMetadata]:
    """Kafka's lifecycle layout: offsets 0-400 over leader epochs 0-4, two segments overlapping in epoch 3."""
    return [
        finished(subject, 0, 100, {0: 0, 1: 20, 2: 80}),
        finished(subject, 101, 200, {2: 101}),
        finished(subject, 201, 300, {2: 201, 3: 240}),
        finished(subject, 250, 400, {3: 250, 4: 370}),
    ]


def test_a_lookup_finds_the_segment_holding_the_offset_in_that_leader_epoch(subject: Subject) -> None:
    s0, s1, s2, s3 = _four_segments(subject)
    expected = {
        (1, 40): s0, (2, 110): s1, (3, 240): s2, (3, 250): s3, (4, 375): s3,
        (1, 110): None,  # epoch 1 ends at offset 79
        (4, 401): None,  # past the end of the last segment
        (5, 301): None,  # no segment carries epoch 5
    }
    found = {(epoch, offset): subject.remote_log_segment_metadata(TP, epoch, offset) for epoch, offset in expected}
    assert found == expected


def test_the_highest_offset_of_an_epoch_survives_deleting_the_segments_that_raised_it(subject: Subject) -> None:
    first = _four_segments(subject)[0]
    for state in (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED):
        subject.update_remote_log_segment_metadata(update_of(first, state))
    assert subject.remote_log_segment_metadata(TP, 0, 10) is None
    assert [subject.highest_offset_for_epoch(TP, e) for e in range(6)] == [19, 79, 239, 369, 400, None]


def test_listing_orders_segments_by_start_offset_and_by_epoch_only_those_of_that_epoch(subject: Subject) -> None:
    s0 = finished(subject, 0, 100, {0: 0})
    s2 = finished(subject, 201, 400, {0: 201, 1: 301})
    s1 = finished(subject, 101, 200, {0: 101})
    assert subject.list_remote_log_segments(TP, 0) == [s0, s1, s2]
    assert subject.list_remote_log_segments(TP) == [s0, s1, s2]
    assert subject.list_remote_log_segments(TP, 1) == [s2]
    assert subject.list_remote_log_segments(TP, 2) == []


# --- invalid calls (RemoteLogMetadataCacheTest) ----------------------------------------------------------

@pytest.mark.parametrize("state", [S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED])
def test_adding_a_segment_in_any_state_but_copy_started_is_refused(subject: Subject, state: S) -> None:
    subject.register(TP)
    error = call_error(lambda: subject.add_remote_log_segment_metadata(segment(TP, 0, 100, {0: 0}, state=state)))
    assert isinstance(error, InvalidArgumentError)
    assert subject.list_remote_log_segments(TP) == []


@pytest.mark.parametrize("state", [S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED])
def test_updating_an_unknown_segment_is_a_resource_not_found_error(subject: Subject, state: S) -> None:
    subject.register(TP)
    error = call_error(lambda: subject.update_remote_log_segment_metadata(
        update_of(segment(TP, 0, 100, {0: 0}), state)))
    assert isinstance(error, RemoteResourceNotFoundError)


def test_an_update_back_to_copy_started_is_refused(subject: Subject) -> None:
    md = upload(subject, segment(TP, 0, 100, {0: 0}))
    error = call_error(lambda: subject.update_remote_log_segment_metadata(update_of(md, S.COPY_SEGMENT_STARTED)))
    assert isinstance(error, InvalidArgumentError)


@pytest.mark.parametrize(("path", "invalid"), [
    ((), S.DELETE_SEGMENT_FINISHED),
    ((S.COPY_SEGMENT_FINISHED,), S.DELETE_SEGMENT_FINISHED),
    ((S.DELETE_SEGMENT_STARTED,), S.COPY_SEGMENT_FINISHED),
    ((S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED), S.COPY_SEGMENT_FINISHED),
])
def test_an_invalid_segment_transition_is_refused_and_changes_nothing(
    subject: Subject, path: tuple[S, ...], invalid: S
) -> None:
    md = upload(subject, segment(TP, 10, 100, {5: 10}), *path)
    before = subject.digest()
    error = call_error(lambda: subject.update_remote_log_segment_metadata(update_of(md, invalid)))
    assert isinstance(error, InvalidArgumentError)
    assert subject.list_remote_log_segments(TP, 5) == [md]
    assert subject.digest() == before


def test_every_self_transition_is_accepted(subject: Subject) -> None:
    md = segment(TP, 0, 10, {0: 0})
    subject.register(TP)
    subject.add_remote_log_segment_metadata(md)
    subject.add_remote_log_segment_metadata(md)
    for state in (S.COPY_SEGMENT_FINISHED, S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED,
                  S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED):
        subject.update_remote_log_segment_metadata(update_of(md, state))
    assert subject.list_remote_log_segments(TP) == []


def test_a_finished_segment_cannot_be_added_again_under_the_same_id(subject: Subject) -> None:
    md = upload(subject, segment(TP, 0, 10, {0: 0}), S.COPY_SEGMENT_FINISHED)
    error = call_error(lambda: subject.add_remote_log_segment_metadata(segment(
        TP, 0, 10, {0: 0}, segment_id=md.remote_log_segment_id.id)))
    assert isinstance(error, InvalidArgumentError)
    assert subject.remote_log_segment_metadata(TP, 0, 5) == md


# --- overlapping and duplicate uploads across leader epochs (RemoteLogLeaderEpochStateTest) ------------

def test_a_larger_overlapping_upload_replaces_the_earlier_segment(subject: Subject) -> None:
    older = finished(subject, 10, 100, {0: 10})
    newer = finished(subject, 5, 150, {0: 5})
    assert subject.remote_log_segment_metadata(TP, 0, 11) == newer
    assert subject.remote_log_segment_metadata(TP, 0, 95) == newer
    assert subject.highest_offset_for_epoch(TP, 0) == 150
    assert ids(subject.list_remote_log_segments(TP, 0)) == ids([newer, older])


def test_an_upload_covering_several_earlier_ones_replaces_them_all(subject: Subject) -> None:
    finished(subject, 10, 100, {0: 10})
    finished(subject, 5, 150, {0: 5})
    finished(subject, 148, 155, {0: 148})
    widest = finished(subject, 4, 200, {0: 4})
    for offset in (4, 11, 149, 200):
        assert subject.remote_log_segment_metadata(TP, 0, offset) == widest
    assert subject.highest_offset_for_epoch(TP, 0) == 200
    assert len(subject.list_remote_log_segments(TP, 0)) == 4


def test_a_duplicate_upload_of_the_same_range_replaces_the_first(subject: Subject) -> None:
    first = finished(subject, 10, 100, {0: 10})
    second = finished(subject, 10, 100, {0: 10})
    assert subject.remote_log_segment_metadata(TP, 0, 11) == second
    assert subject.highest_offset_for_epoch(TP, 0) == 100
    assert set(ids(subject.list_remote_log_segments(TP, 0))) == set(ids([first, second]))


def test_an_upload_with_the_same_start_and_a_later_end_serves_the_whole_range(subject: Subject) -> None:
    finished(subject, 10, 100, {0: 10})
    longer = finished(subject, 10, 150, {0: 10})
    assert subject.remote_log_segment_metadata(TP, 0, 11) == longer
    assert subject.remote_log_segment_metadata(TP, 0, 111) == longer
    assert subject.highest_offset_for_epoch(TP, 0) == 150


def test_a_shorter_upload_below_the_epochs_highest_offset_does_not_displace_later_segments(
    subject: Subject
) -> None:
    # Kafka's rule: only a re-upload that reaches the epoch's highest offset displaces the segments after it.
    first = finished(subject, 0, 10, {0: 0})
    second = finished(subject, 11, 100, {0: 11})
    short = finished(subject, 0, 5, {0: 0})
    assert subject.remote_log_segment_metadata(TP, 0, 3) == short
    assert subject.remote_log_segment_metadata(TP, 0, 50) == second
    assert subject.remote_log_segment_metadata(TP, 0, 8) is None  # `short` ends at 5 and replaced `first`
    # Kafka 4.x's offsetToId.put overwrote `first`'s entry and references it nowhere in the epoch (not unreferenced
    # either): the epoch's listing leaves it out until its delete starts; the listing of all epochs keeps it.
    assert first not in subject.list_remote_log_segments(TP, 0)
    assert first in subject.list_remote_log_segments(TP)


def test_a_re_upload_by_a_new_leader_replaces_the_old_leaders_segment_in_the_shared_epoch(
    subject: Subject
) -> None:
    old_leader = finished(subject, 0, 100, {0: 0, 1: 50})
    new_leader = finished(subject, 0, 150, {0: 0, 1: 50, 2: 120})
    assert subject.remote_log_segment_metadata(TP, 1, 60) == new_leader
    assert subject.remote_log_segment_metadata(TP, 2, 130) == new_leader
    assert subject.highest_offset_for_epoch(TP, 1) == 119
    assert ids(subject.list_remote_log_segments(TP, 2)) == ids([new_leader])
    assert old_leader in subject.list_remote_log_segments(TP, 0)


def test_listing_an_epoch_includes_copying_finished_replaced_and_deleting_segments_by_start_offset(
    subject: Subject
) -> None:
    copying = upload(subject, segment(TP, 0, 4, {0: 0}))
    kept = finished(subject, 5, 10, {0: 5})
    replaced = finished(subject, 11, 100, {0: 11})
    replacing = finished(subject, 9, 150, {0: 9})
    assert subject.list_remote_log_segments(TP, 0) == [copying, kept, replacing, replaced]


# --- remote log size and transaction indexes (TopicBasedRemoteLogMetadataManagerTest) -------------------

def test_remote_log_size_sums_the_segments_of_one_epoch(subject: Subject) -> None:
    for start, size in ((0, SEGMENT_SIZE), (100, 2 * SEGMENT_SIZE), (200, 3 * SEGMENT_SIZE)):
        upload(subject, segment(TP, start, start + 99, {0: start}, size=size))
    assert subject.remote_log_size(TP, 0) == 6 * SEGMENT_SIZE


def test_remote_log_size_counts_only_segments_of_the_asked_epoch(subject: Subject) -> None:
    for epoch, size in ((0, SEGMENT_SIZE), (1, 2 * SEGMENT_SIZE), (2, 3 * SEGMENT_SIZE)):
        upload(subject, segment(TP, epoch * 100, epoch * 100 + 99, {epoch: epoch * 100}, size=size))
    assert [subject.remote_log_size(TP, e) for e in (0, 1, 2)] == [SEGMENT_SIZE, 2 * SEGMENT_SIZE, 3 * SEGMENT_SIZE]


def test_remote_log_size_of_an_epoch_without_segments_is_zero(subject: Subject) -> None:
    upload(subject, segment(TP, 0, 99, {0: 0}))
    assert subject.remote_log_size(TP, 9001) == 0


def test_remote_log_size_leaves_out_deleted_segments(subject: Subject) -> None:
    upload(subject, segment(TP, 0, 99, {0: 0}, size=10))
    upload(subject, segment(TP, 100, 199, {0: 100}, size=20), S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED)
    upload(subject, segment(TP, 200, 299, {0: 200}, size=40), S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED)
    assert subject.remote_log_size(TP, 0) == 30


def test_the_next_segment_with_a_transaction_index_skips_segments_whose_index_is_empty(subject: Subject) -> None:
    finished(subject, 0, 99, {0: 0}, txn_idx_empty=True)
    finished(subject, 100, 199, {0: 100}, txn_idx_empty=True)
    with_txn = finished(subject, 200, 299, {0: 200}, txn_idx_empty=False)
    assert subject.next_segment_with_txn_index(TP, 0, 50) == with_txn
    assert subject.next_segment_with_txn_index(TP, 0, 250) == with_txn


def test_no_next_segment_with_a_transaction_index_when_every_later_index_is_empty(subject: Subject) -> None:
    finished(subject, 0, 99, {0: 0}, txn_idx_empty=False)
    finished(subject, 100, 199, {0: 100}, txn_idx_empty=True)
    assert subject.next_segment_with_txn_index(TP, 0, 150) is None
    assert subject.next_segment_with_txn_index(TP, 0, 200) is None


def test_the_next_segment_with_a_transaction_index_stays_in_the_asked_epoch(subject: Subject) -> None:
    finished(subject, 0, 99, {0: 0}, txn_idx_empty=True)
    finished(subject, 100, 199, {1: 100}, txn_idx_empty=False)
    assert subject.next_segment_with_txn_index(TP, 0, 10) is None


# --- partitions of one topic stay apart ---------------------------------------------------------------

def test_segments_of_one_partition_are_invisible_to_another_partition_of_the_same_topic(subject: Subject) -> None:
    other = make_tp("foo", 1, topic_id=TP.topic_id)
    subject.register(TP, other)
    md = finished(subject, 0, 99, {0: 0})
    assert subject.list_remote_log_segments(other) == []
    assert subject.remote_log_segment_metadata(other, 0, 10) is None
    assert subject.remote_log_segment_metadata(TP, 0, 10) == md


# --- partition deletion (RemoteLogMetadataManagerTest) ---------------------------------------------------

def test_a_partition_marked_or_started_for_deletion_still_serves_its_segments(subject: Subject) -> None:
    md = finished(subject, 0, 100, {0: 0, 1: 20, 2: 50, 3: 80})
    for state in (P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED):
        subject.put_remote_partition_delete_metadata(partition_delete(TP, state))
        assert subject.remote_log_segment_metadata(TP, 1, 30) == md


@pytest.mark.parametrize(("path", "invalid"), [
    ((), P.DELETE_PARTITION_STARTED),
    ((), P.DELETE_PARTITION_FINISHED),
    ((P.DELETE_PARTITION_MARKED,), P.DELETE_PARTITION_FINISHED),
    ((P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED), P.DELETE_PARTITION_MARKED),
])
def test_an_invalid_partition_delete_transition_is_refused(
    subject: Subject, path: tuple[P, ...], invalid: P
) -> None:
    subject.register(TP)
    for state in path:
        subject.put_remote_partition_delete_metadata(partition_delete(TP, state))
    error = call_error(lambda: subject.put_remote_partition_delete_metadata(partition_delete(TP, invalid)))
    assert isinstance(error, InvalidArgumentError)


def test_a_partition_delete_repeating_its_current_state_is_accepted(subject: Subject) -> None:
    subject.register(TP)
    for state in (P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED,
                  P.DELETE_PARTITION_STARTED):
        subject.put_remote_partition_delete_metadata(partition_delete(TP, state))


def _delete_partition(subject: Subject) -> None:
    for state in (P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED, P.DELETE_PARTITION_FINISHED):
        subject.put_remote_partition_delete_metadata(partition_delete(TP, state))


def test_a_finished_partition_deletion_leaves_only_its_finished_delete_state() -> None:
    subject = StateSubject()
    finished(subject, 0, 100, {0: 0})
    _delete_partition(subject)
    store = subject.writer.store
    assert list(store.segments_of(TP)) == []
    assert list(store.lineages_of(TP)) == []
    delete = store.partition_delete(TP)
    assert delete is not None and delete.state is P.DELETE_PARTITION_FINISHED


def test_after_a_finished_partition_deletion_every_read_is_a_resource_not_found_error(
    make_manager: MakeManager
) -> None:
    subject = ManagerSubject(make_manager())
    finished(subject, 0, 100, {0: 0, 1: 20})
    _delete_partition(subject)
    reads: list[Callable[[], object]] = [
        lambda: subject.remote_log_segment_metadata(TP, 1, 30),
        lambda: subject.highest_offset_for_epoch(TP, 0),
        lambda: subject.list_remote_log_segments(TP),
        lambda: subject.list_remote_log_segments(TP, 0),
        lambda: subject.remote_log_size(TP, 0),
        lambda: subject.next_segment_with_txn_index(TP, 0, 0),
    ]
    assert [type(call_error(read)) for read in reads] == [RemoteResourceNotFoundError] * len(reads)


def test_after_a_finished_partition_deletion_adding_a_segment_is_a_resource_not_found_error(
    make_manager: MakeManager
) -> None:
    subject = ManagerSubject(make_manager())
    finished(subject, 0, 100, {0: 0})
    _delete_partition(subject)
    error = call_error(lambda: subject.add_remote_log_segment_metadata(segment(TP, 101, 200, {0: 101})))
    assert isinstance(error, RemoteResourceNotFoundError)
    assert list(subject.manager.view.segments(TP)) == []


def test_after_a_finished_partition_deletion_marking_it_again_is_a_resource_not_found_error(
    make_manager: MakeManager
) -> None:
    subject = ManagerSubject(make_manager())
    finished(subject, 0, 100, {0: 0})
    _delete_partition(subject)
    error = call_error(lambda: subject.put_remote_partition_delete_metadata(
        partition_delete(TP, P.DELETE_PARTITION_MARKED)))
    assert isinstance(error, RemoteResourceNotFoundError)


def test_a_finished_partition_deletion_leaves_the_other_partitions_alone(make_manager: MakeManager) -> None:
    subject = ManagerSubject(make_manager())
    other = make_tp("foo", 1, topic_id=TP.topic_id)
    kept = upload(subject, segment(other, 0, 9, {0: 0}), S.COPY_SEGMENT_FINISHED)
    finished(subject, 0, 100, {0: 0})
    _delete_partition(subject)
    assert subject.list_remote_log_segments(other) == [kept]


# --- registration and readiness (TopicBasedRemoteLogMetadataManagerTest) --------------------------------

def test_reads_of_an_unregistered_partition_are_resource_not_found_errors(make_manager: MakeManager) -> None:
    manager = make_manager()
    assert not manager.is_ready(TP)
    reads: list[Callable[[], object]] = [
        lambda: manager.list_remote_log_segments(TP),
        lambda: manager.remote_log_segment_metadata(TP, 0, 0),
        lambda: manager.highest_offset_for_epoch(TP, 0),
        lambda: manager.remote_log_size(TP, 0),
        lambda: manager.next_segment_with_txn_index(TP, 0, 0),
    ]
    assert [type(call_error(read)) for read in reads] == [RemoteResourceNotFoundError] * len(reads)


def test_segments_written_before_registration_are_served_once_the_partition_is_ready(
    make_manager: MakeManager
) -> None:
    writer, reader = make_manager(broker_id=0), make_manager(broker_id=1)
    leader_tp, follower_tp = make_tp("new-leader", 0), make_tp("new-follower", 0)
    segments = [segment(tp, 0, 100, {0: 0}) for tp in (leader_tp, follower_tp)]
    register(writer, leader_tp, follower_tp)
    for md in segments:
        writer.add_remote_log_segment_metadata(md).result(timeout=30)
    assert isinstance(call_error(lambda: reader.list_remote_log_segments(leader_tp)), RemoteResourceNotFoundError)
    reader.on_partition_leadership_changes({leader_tp}, {follower_tp})
    register(reader, leader_tp, follower_tp)
    assert [reader.list_remote_log_segments(tp) for tp in (leader_tp, follower_tp)] == [[md] for md in segments]


def test_a_registered_partition_whose_history_is_still_loading_is_not_ready_and_reads_are_retriable(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str
) -> None:
    backlog_writer = make_manager(broker_id=0)
    backlog = [segment(make_tp("backlog", p % 8), p, p, {0: p}) for p in range(30_000)]
    produce(kafka_bootstrap, metadata_topic, ((key_of(md).encode(), codec.encode(md)) for md in backlog),
            config={"linger.ms": 50, "batch.size": 1_000_000})
    backlog_writer.close()
    manager = make_manager(broker_id=1)
    manager.on_partition_leadership_changes({TP}, set())
    error = call_error(lambda: manager.list_remote_log_segments(TP))
    assert isinstance(error, RemoteStorageNotReadyError)
    assert getattr(error, "retriable", False)
    register(manager, TP)
    assert manager.list_remote_log_segments(TP) == []


def test_a_stopped_partition_is_no_longer_served(make_manager: MakeManager) -> None:
    subject = ManagerSubject(make_manager())
    finished(subject, 0, 10, {0: 0})
    subject.manager.on_stop_partitions({TP})
    assert isinstance(call_error(lambda: subject.list_remote_log_segments(TP)), RemoteResourceNotFoundError)


# --- a late update (RemoteLogMetadataCache.updateRemoteLogSegmentMetadata, RemotePartitionMetadataStore) ---------

@pytest.mark.parametrize("late_state", [S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED])
def test_a_late_update_of_a_segment_deleted_and_tombstoned_is_ignored_as_kafkas_cache_ignores_it(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str, late_state: S
) -> None:
    """Kafka's cache throws RemoteResourceNotFound for an update of a segment it does not hold, which its consumer
    logs and skips. Here another broker, whose view still held the segment, wrote the update after this node had
    deleted the segment and tombstoned its key: it must not bring the segment back, here nor on a rebuilt node."""
    node = make_manager(broker_id=0)
    md = upload(ManagerSubject(node), segment(TP, 0, 99, {0: 0}), S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED,
                S.DELETE_SEGMENT_FINISHED)
    late = dataclasses.replace(md, state=late_state, broker_id=1)
    produce(kafka_bootstrap, metadata_topic, [(key_of(late).encode(), codec.encode(late))])
    node.wait_caught_up(60)
    log = decoded(read_topic(kafka_bootstrap, metadata_topic))
    assert [event for _, event in log][-2:] == [None, late], "the late update follows the segment's tombstone"
    kafka = kafka_model_of((offset, key, event) for offset, (key, event) in enumerate(log))
    assert kafka.list_remote_log_segments(TP) == [] and kafka.remote_log_segment_metadata(TP, 0, 50) is None
    assert node.list_remote_log_segments(TP) == [] and node.list_remote_log_segments(TP, 0) == []
    assert node.remote_log_segment_metadata(TP, 0, 50) is None
    assert node.record_counts()[1] == 1, "the late update is counted as dropped"
    rebuilt = make_manager(broker_id=1)
    register(rebuilt, TP)
    assert rebuilt.list_remote_log_segments(TP) == []
    assert rebuilt.view_digest() == node.view_digest()


# --- restarts (TopicBasedRemoteLogMetadataManagerRestartTest) ----------------------------------------------

def test_a_restarted_manager_serves_what_it_stored_before_and_takes_new_writes(
    make_manager: MakeManager, tmp_path: Path
) -> None:
    leader_tp, follower_tp = make_tp("new-leader", 0), make_tp("new-follower", 0)
    leader_md, follower_md = segment(leader_tp, 0, 100, {0: 0}), segment(follower_tp, 0, 100, {0: 0})
    with make_manager(state_dir=tmp_path / "node") as first:
        register(first, leader_tp, follower_tp)
        first.add_remote_log_segment_metadata(leader_md).result(timeout=30)
        first.add_remote_log_segment_metadata(follower_md).result(timeout=30)
    second = make_manager(state_dir=tmp_path / "node")
    second.on_partition_leadership_changes({leader_tp}, {follower_tp})
    register(second, leader_tp, follower_tp)
    assert second.list_remote_log_segments(leader_tp) == [leader_md]
    assert second.list_remote_log_segments(follower_tp) == [follower_md]
    another = segment(leader_tp, 101, 200, {0: 101})
    second.add_remote_log_segment_metadata(another).result(timeout=30)
    assert second.list_remote_log_segments(leader_tp) == [leader_md, another]


def test_a_restarted_manager_has_the_digest_it_had_before(make_manager: MakeManager, tmp_path: Path) -> None:
    with make_manager(state_dir=tmp_path / "node") as first:
        subject = ManagerSubject(first)
        _four_segments(subject)
        before = first.view_digest()
    second = make_manager(state_dir=tmp_path / "node")
    register(second, TP)
    assert second.view_digest() == before
