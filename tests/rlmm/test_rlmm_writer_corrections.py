"""A writer whose record another writer overtook appends a correction, so the compacted topic stays complete.

Compaction keeps only the newest record of each key. When that record is a checkpoint computed before another
writer's lineage change (stale), or an event the state machine dropped because another writer moved the segment
on first, a rebuild from the compacted topic would differ from a node that applied every record. The writer of
such a record notices when its own view applies it (rlmm.writer, rlmm.state.corrections_after) and appends the
current checkpoint or restates the key's current state. Real managers on the shared broker; the overtaking is
forced by holding one manager's applier or its producer at the right moment.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from rlmm_strategies import compacted_at_offsets, replay_at_offsets
from rlmm_testkit import (
    READY_TIMEOUT_S,
    WRITE_TIMEOUT_S,
    make_tp,
    produce_to,
    read_topic,
    register,
    segment,
    update_of,
)
from support import wait_until

from rlmm import RemoteLogMetadataManager, codec
from rlmm.errors import RemoteStorageError
from rlmm.events import EpochCheckpoint, RecordKey, segment_key
from rlmm.state import segment_for_offset
from rlmm.types import RemoteLogSegmentMetadata, RemoteLogSegmentState, TopicIdPartition

S = RemoteLogSegmentState
Replayed = list[tuple[int, RecordKey, Any]]


def _topic_log(bootstrap: str, topic: str) -> Replayed:
    """The one-partition metadata topic as (offset, key, event), in offset order."""
    return [(r.offset, RecordKey.decode(r.key or b""), None if r.value is None else codec.decode(r.value))
            for r in read_topic(bootstrap, topic)]


def _compacted(log: Replayed) -> Replayed:
    newest = {key.encode(): (offset, key, event) for offset, key, event in log}
    return sorted(newest.values(), key=lambda record: record[0])


@contextmanager
def _applier_held(manager: RemoteLogMetadataManager) -> Iterator[None]:
    """The manager's applier consumes nothing until the block exits (a node that lags the topic)."""
    consumer: Any = manager._applier._consumer
    consume: Callable[..., Any] = consumer.consume
    held, idle = threading.Event(), threading.Event()
    held.set()

    def gated(*args: Any) -> Any:
        if held.is_set():
            idle.set()
            return []
        return consume(*args)

    consumer.consume = gated
    try:
        assert idle.wait(10), "the applier did not come back to its consume loop"
        yield
    finally:
        held.clear()
        del consumer.consume


@contextmanager
def _checkpoints_held(manager: RemoteLogMetadataManager) -> Iterator[threading.Event]:
    """The manager's `epochs:` appends wait until the block exits (a writer stalled between event and checkpoint);
    the event yielded is set once one is waiting."""
    producer: Any = manager._writer._producer
    append: Callable[..., Any] = producer.append
    release, waiting = threading.Event(), threading.Event()

    def gated(partition: int, key: bytes, *args: Any) -> Any:
        if key.startswith(b"epochs:") and not release.is_set():
            waiting.set()
            release.wait(WRITE_TIMEOUT_S)
        return append(partition, key, *args)

    producer.append = gated
    try:
        yield waiting
    finally:
        release.set()
        del producer.append


def _state_of(manager: RemoteLogMetadataManager, md: RemoteLogSegmentMetadata) -> S | None:
    current = manager.view.segment(md.remote_log_segment_id)
    return None if current is None else current.state


def _finish(manager: RemoteLogMetadataManager, md: RemoteLogSegmentMetadata) -> None:
    manager.add_remote_log_segment_metadata(md).result(WRITE_TIMEOUT_S)
    manager.update_remote_log_segment_metadata(
        update_of(md, S.COPY_SEGMENT_FINISHED, broker_id=manager.broker_id)).result(WRITE_TIMEOUT_S)


def test_a_write_dropped_because_another_writer_moved_the_segment_on_is_followed_by_its_current_state(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
) -> None:
    a = make_manager(broker_id=0)
    tp = make_tp()
    register(a, tp)
    x = segment(tp, 0, 99, {0: 0})
    _finish(a, x)
    finished = a.view.segment(x.remote_log_segment_id)
    assert finished is not None
    with _applier_held(a):
        # Another broker starts deleting X; A has not applied that yet and repeats its copy-finished update.
        deleting = dataclasses.replace(finished, state=S.DELETE_SEGMENT_STARTED, broker_id=1)
        produce_to(kafka_bootstrap, metadata_topic, 0,
                   [(segment_key(x.remote_log_segment_id).encode(), codec.encode(deleting))])
        repeated = a.update_remote_log_segment_metadata(update_of(x, S.COPY_SEGMENT_FINISHED, broker_id=0))
    with pytest.raises(RemoteStorageError, match="rejected when applied"):
        repeated.result(WRITE_TIMEOUT_S)

    def restated() -> bool:
        log = _topic_log(kafka_bootstrap, metadata_topic)
        newest = [event for _, key, event in log if key == segment_key(x.remote_log_segment_id)][-1]
        return newest is not None and newest.state is S.DELETE_SEGMENT_STARTED

    # Without the restatement the newest record of X is A's dropped FINISHED, and a rebuild would list X as live.
    wait_until(restated, timeout=WRITE_TIMEOUT_S, description="X's current state restated on the topic")
    a.wait_caught_up(READY_TIMEOUT_S)
    log = _topic_log(kafka_bootstrap, metadata_topic)
    full = replay_at_offsets(log)
    assert replay_at_offsets(_compacted(log)).digest() == full.digest()
    assert a.view_digest() == full.digest()
    assert _state_of(a, x) is S.DELETE_SEGMENT_STARTED


def test_a_late_update_of_a_segment_another_writer_deleted_is_dropped_and_followed_by_the_segments_tombstone(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
) -> None:
    a = make_manager(broker_id=0)
    tp = make_tp()
    register(a, tp)
    x = segment(tp, 0, 99, {0: 0})
    _finish(a, x)
    finished = a.view.segment(x.remote_log_segment_id)
    assert finished is not None
    key = segment_key(x.remote_log_segment_id)
    with _applier_held(a):
        # Another broker deletes X and tombstones it; A has applied none of that and repeats its copy-finished update.
        deleting = dataclasses.replace(finished, state=S.DELETE_SEGMENT_STARTED, broker_id=1)
        deleted = dataclasses.replace(finished, state=S.DELETE_SEGMENT_FINISHED, broker_id=1)
        produce_to(kafka_bootstrap, metadata_topic, 0, [(key.encode(), value) for value in
                                                        (codec.encode(deleting), codec.encode(deleted), None)])
        late = a.update_remote_log_segment_metadata(update_of(x, S.COPY_SEGMENT_FINISHED, broker_id=0))
    with pytest.raises(RemoteStorageError, match="no such segment"):
        late.result(WRITE_TIMEOUT_S)

    def tombstoned_again() -> bool:
        newest = [(offset, event) for offset, k, event in _topic_log(kafka_bootstrap, metadata_topic) if k == key]
        return len(newest) >= 6 and newest[-1][1] is None

    # Without the tombstone the newest record of X is A's late FINISHED: a node rebuilt once the log cleaner removed
    # the older ones would take it for X's state and serve a deleted segment.
    wait_until(tombstoned_again, timeout=WRITE_TIMEOUT_S, description="X's tombstone appended after A's late update")
    a.wait_caught_up(READY_TIMEOUT_S)
    log = _topic_log(kafka_bootstrap, metadata_topic)
    full = replay_at_offsets(log)
    assert full.segment(x.remote_log_segment_id) is None
    for keep_tombstones in (True, False):  # False: after delete.retention.ms
        assert replay_at_offsets(compacted_at_offsets(log, keep_tombstones=keep_tombstones)).digest() == full.digest()
    assert a.view_digest() == full.digest()
    assert a.list_remote_log_segments(tp) == []


def test_a_checkpoint_that_lands_after_another_writers_lineage_change_is_followed_by_a_current_one(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
) -> None:
    # Old leader A finishes X (epoch 0, offsets 0-99) but stalls before its checkpoint; new leader B finishes Y
    # (0-149, epochs 0 and 1), which displaces X; then A's checkpoint, computed before Y existed, lands.
    a, b = make_manager(broker_id=0), make_manager(broker_id=1)
    tp = make_tp()
    register(a, tp)
    register(b, tp, leader=False)
    x = segment(tp, 0, 99, {0: 0})
    y = segment(tp, 0, 149, {0: 0, 1: 100})
    a.add_remote_log_segment_metadata(x).result(WRITE_TIMEOUT_S)
    with _checkpoints_held(a) as a_stalled:
        a_finish = a.update_remote_log_segment_metadata(update_of(x, S.COPY_SEGMENT_FINISHED, broker_id=0))
        assert a_stalled.wait(WRITE_TIMEOUT_S), "A never came to append its checkpoint"
        wait_until(lambda: _state_of(b, x) is S.COPY_SEGMENT_FINISHED, timeout=READY_TIMEOUT_S,
                   description="B applied X's copy-finished record")
        _finish(b, y)
    a_finish.result(WRITE_TIMEOUT_S)  # A's write completes once its correction is applied too

    log = _topic_log(kafka_bootstrap, metadata_topic)
    y_finished_at = max(offset for offset, key, event in log
                        if key == segment_key(y.remote_log_segment_id) and event is not None
                        and event.state is S.COPY_SEGMENT_FINISHED)
    late = [event for at, _, event in log if isinstance(event, EpochCheckpoint) and at > y_finished_at]
    assert any(c.reflects_offset is not None and c.reflects_offset < y_finished_at for c in late), (
        "the scenario did not happen: no checkpoint computed before Y finished landed after it")
    newest = late[-1]
    assert newest.reflects_offset is not None and newest.reflects_offset >= y_finished_at, (
        f"the newest checkpoint reflects offset {newest.reflects_offset}, before Y finished at {y_finished_at}")
    full = replay_at_offsets(log)
    assert replay_at_offsets(_compacted(log)).digest() == full.digest()
    for manager in (a, b):
        manager.wait_caught_up(READY_TIMEOUT_S)
        assert manager.view_digest() == full.digest()
        answer = manager.remote_log_segment_metadata(tp, 0, 50)
        assert answer is not None and answer.remote_log_segment_id == y.remote_log_segment_id
    assert _answer(full, tp) == y.remote_log_segment_id


def _answer(store: Any, tp: TopicIdPartition) -> Any:
    found = segment_for_offset(store, tp, 0, 50)
    return None if found is None else found.remote_log_segment_id
