"""Reads of a partition the manager already served take no lock, yet refuse it exactly as Kafka's manager does once
it is stopped, deleted, forgotten, halted or the manager closed (each test reads first, so the fast path is warm).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from rlmm_testkit import call_error, make_tp, partition_delete, register, segment, update_of
from support import wait_until
from support.topics import produce

from rlmm import (
    MetadataLogError,
    RemoteLogMetadataManager,
    RemoteLogSegmentState,
    RemotePartitionDeleteState,
    RemoteResourceNotFoundError,
    RemoteStorageError,
    TopicIdPartition,
)
from rlmm.events import key_of

S = RemoteLogSegmentState
P = RemotePartitionDeleteState
MakeManager = Callable[..., RemoteLogMetadataManager]
TIMEOUT_S = 30.0


def _reads(manager: RemoteLogMetadataManager, tp: TopicIdPartition) -> list[Callable[[], object]]:
    """Every read of the API, for tp."""
    return [
        lambda: manager.remote_log_segment_metadata(tp, 0, 5),
        lambda: manager.highest_offset_for_epoch(tp, 0),
        lambda: manager.list_remote_log_segments(tp),
        lambda: manager.list_remote_log_segments(tp, 0),
        lambda: manager.remote_log_size(tp, 0),
        lambda: manager.next_segment_with_txn_index(tp, 0, 5),
    ]


def _served(manager: RemoteLogMetadataManager, tp: TopicIdPartition) -> None:
    """Register tp, upload one segment and read it through every read: tp is then on the lock-free path."""
    register(manager, tp)
    md = segment(tp, 0, 10, {0: 0})
    manager.add_remote_log_segment_metadata(md).result(TIMEOUT_S)
    manager.update_remote_log_segment_metadata(update_of(md, S.COPY_SEGMENT_FINISHED)).result(TIMEOUT_S)
    assert manager.remote_log_segment_metadata(tp, 0, 5) is not None
    for read in _reads(manager, tp):
        assert call_error(read) is None


def _assert_every_read_raises(manager: RemoteLogMetadataManager, tp: TopicIdPartition, error: type) -> None:
    for read in _reads(manager, tp):
        assert isinstance(call_error(read), error)


def _delete(manager: RemoteLogMetadataManager, tp: TopicIdPartition) -> None:
    for state in (P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_STARTED, P.DELETE_PARTITION_FINISHED):
        manager.put_remote_partition_delete_metadata(partition_delete(tp, state)).result(TIMEOUT_S)


def test_a_served_partition_is_refused_once_stopped(make_manager: MakeManager) -> None:
    manager = make_manager()
    tp = make_tp("stopped", 0)
    _served(manager, tp)
    manager.on_stop_partitions({tp})
    _assert_every_read_raises(manager, tp, RemoteResourceNotFoundError)
    register(manager, tp)  # assigned again: served again
    assert manager.remote_log_segment_metadata(tp, 0, 5) is not None


def test_a_served_partition_is_refused_once_its_delete_finished_even_when_assigned_again(
    make_manager: MakeManager,
) -> None:
    manager = make_manager()
    tp = make_tp("deleted", 0)
    _served(manager, tp)
    _delete(manager, tp)
    _assert_every_read_raises(manager, tp, RemoteResourceNotFoundError)
    manager.on_partition_leadership_changes({tp}, set())
    _assert_every_read_raises(manager, tp, RemoteResourceNotFoundError)


def test_a_deleted_partition_forgotten_by_a_tombstone_is_refused_until_assigned_again(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str
) -> None:
    manager = make_manager()
    tp = make_tp("forgotten", 0)
    _served(manager, tp)
    _delete(manager, tp)  # the manager unregisters the partition as it applies the finished delete
    produce(kafka_bootstrap, metadata_topic, [(key_of(partition_delete(tp, P.DELETE_PARTITION_FINISHED)).encode(),
                                               None)])
    wait_until(lambda: manager.view.known_partition(tp.topic_id, tp.partition) is None, timeout=TIMEOUT_S,
               description="the view forgetting the partition")
    _assert_every_read_raises(manager, tp, RemoteResourceNotFoundError)
    register(manager, tp)
    assert manager.list_remote_log_segments(tp) == []
    assert manager.remote_log_segment_metadata(tp, 0, 5) is None


def test_a_served_partition_is_refused_with_the_halt_error_once_its_metadata_partition_halts(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str
) -> None:
    manager = make_manager()
    tp = make_tp("halted", 0)
    _served(manager, tp)
    produce(kafka_bootstrap, metadata_topic, [(key_of(segment(tp, 20, 30, {0: 20})).encode(), b"\x00garbage")])
    wait_until(manager.metadata_errors, timeout=TIMEOUT_S, description="the manager reporting the bad record")
    _assert_every_read_raises(manager, tp, MetadataLogError)


def test_a_served_partition_is_refused_once_the_manager_closed(make_manager: MakeManager) -> None:
    manager = make_manager()
    tp = make_tp("closed", 0)
    _served(manager, tp)
    manager.close()
    for read in _reads(manager, tp):
        with pytest.raises(RemoteStorageError, match="closed"):
            read()


def test_a_served_partition_does_not_serve_the_same_topic_id_and_partition_under_another_name(
    make_manager: MakeManager,
) -> None:
    manager = make_manager()
    tp = make_tp("named", 0)
    renamed = TopicIdPartition(tp.topic_id, "renamed", tp.partition)
    _served(manager, tp)
    _assert_every_read_raises(manager, renamed, RemoteResourceNotFoundError)
    manager.on_stop_partitions({renamed})  # never registered: stopping it leaves tp served
    assert manager.remote_log_segment_metadata(tp, 0, 5) is not None
