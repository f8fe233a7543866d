"""Two or more writers for one partition around a leadership change: a late checkpoint never undoes lineage.

Each writer checks its calls against its own lagging view and appends checkpoints computed from it, so their
records interleave in any order in the topic. Every node (full replay, compacted replay, the RocksDB view) must
answer as Kafka's RemoteLogMetadataCache would for the order of the events in the topic.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rlmm_strategies import (
    WRITER_TP,
    RacingScenario,
    RacingWriter,
    TopicRecord,
    assert_answers_like,
    compacted_at_offsets,
    drain,
    feed_kafka_model,
    kafka_model_of,
    racing_histories,
    replay_at_offsets,
    settle,
)
from rlmm_testkit import segment, update_of
from support.reference_model import ReferenceModel

from rlmm.state import InMemoryState, StateReader, apply_record, segment_for_offset
from rlmm.types import RemoteLogSegmentMetadata, RemoteLogSegmentState
from rlmm.view import ConsumedRecord, MetadataView, apply_records

S = RemoteLogSegmentState
METADATA_TOPIC = "__tierlog_metadata"
RACING_SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Each example of the view test opens a RocksDB view of its own: fewer of them keep the file under a minute.
VIEW_SETTINGS = settings(RACING_SETTINGS, max_examples=50)


def _view_digest(records: list[TopicRecord], state_dir: Path) -> str:
    return _view_answers(records, state_dir)[0]


def _view_answers(records: list[TopicRecord], state_dir: Path) -> tuple[str, RemoteLogSegmentMetadata | None]:
    """The RocksDB view's digest after consuming `records`, and its answer for (epoch 0, offset 50)."""
    view = MetadataView.open(state_dir)
    try:
        consumed = [ConsumedRecord(0, offset, key, event) for offset, key, event in records]
        apply_records(view, METADATA_TOPIC, consumed, {0: len(records)})
        return view.digest(), _answer_at(view, 0, 50)
    finally:
        view.close()


def _answer_at(store: StateReader, epoch: int, offset: int) -> RemoteLogSegmentMetadata | None:
    return segment_for_offset(store, WRITER_TP, epoch, offset)


def _finish(writer: RacingWriter, md: RemoteLogSegmentMetadata) -> RemoteLogSegmentMetadata:
    finished = md.create_with_update(update_of(md, S.COPY_SEGMENT_FINISHED, broker_id=writer.broker_id))
    writer.write(finished)
    return finished


@pytest.mark.parametrize("b_checkpoint_first", [False, True], ids=["A-late-then-B", "B-then-A-late"])
def test_an_old_leaders_late_checkpoint_does_not_put_its_displaced_segment_back(
    b_checkpoint_first: bool, tmp_path: Path
) -> None:
    # Old leader A finishes X (epoch 0, offsets 0-99); new leader B finishes Y (0-149, epochs 0 and 1), which
    # displaces X. A's checkpoint, computed before A saw Y, lands after Y.
    scenario = RacingScenario()
    a, b = RacingWriter(0, scenario.topic), RacingWriter(1, scenario.topic)
    x = segment(WRITER_TP, 0, 99, {0: 0})
    a.write(x)
    a.see_own_write(0)
    a.flush()
    _finish(a, x)
    a.see_own_write(0)  # A's checkpoint is computed now, before Y exists
    b.catch_up(len(scenario.topic))
    y = segment(WRITER_TP, 0, 149, {0: 0, 1: 100})
    b.write(y)
    b.see_own_write(0)
    b.flush()
    y_finished = _finish(b, y)
    b.see_own_write(0)
    for writer in ([b, a] if b_checkpoint_first else [a, b]):
        writer.flush()

    log = scenario.topic
    assert kafka_model_of(log).remote_log_segment_metadata(WRITER_TP, 0, 50) == y_finished
    assert _answer_at(replay_at_offsets(log), 0, 50) == y_finished, "a live node"
    assert _answer_at(replay_at_offsets(compacted_at_offsets(log)), 0, 50) == y_finished, "a rebuilt node"
    digest, answer = _view_answers(log, tmp_path / "view")
    assert answer == y_finished, "the RocksDB view"
    assert digest == replay_at_offsets(log).digest()


@RACING_SETTINGS
@given(racing_histories())
def test_every_node_answers_like_kafka_for_the_order_of_the_topic_whatever_the_interleaving(
    scenario: RacingScenario,
) -> None:
    # A live node, checked after every checkpoint it applies: a late one must not change any answer.
    log = scenario.topic
    full, model = InMemoryState(), ReferenceModel()
    for offset, key, event in log:
        apply_record(full, key, event, offset)
        feed_kafka_model(model, event)
        if key.kind == "epochs":
            assert_answers_like(model, full, WRITER_TP, scenario.segments)
    assert_answers_like(model, full, WRITER_TP, scenario.segments)
    for writer in scenario.writers:
        writer.catch_up(len(log))
        assert writer.view.digest() == full.digest(), f"writer {writer.broker_id}'s own view"


@VIEW_SETTINGS
@given(racing_histories())
def test_the_rocksdb_view_of_a_racing_log_equals_the_full_replay(scenario: RacingScenario) -> None:
    with tempfile.TemporaryDirectory() as state_dir:
        digest = _view_digest(scenario.topic, Path(state_dir))
    assert digest == replay_at_offsets(scenario.topic).digest()


# Divergences without the corrections are rare (a few in a thousand histories): more examples than the others.
@settings(RACING_SETTINGS, max_examples=1000)
@given(racing_histories())
def test_once_each_writer_applied_its_own_records_a_compacted_rebuild_answers_like_a_full_replay(
    scenario: RacingScenario,
) -> None:
    # No further write: the writers' own corrections (a current checkpoint after a stale one of theirs, the state
    # restated after a dropped event of theirs) are what makes the newest record of every key describe the state.
    drain(scenario)
    _assert_a_compacted_rebuild_answers_like_a_full_replay(scenario)


@RACING_SETTINGS
@given(racing_histories())
def test_once_the_writers_settle_a_compacted_rebuild_answers_like_a_full_replay(scenario: RacingScenario) -> None:
    settle(scenario)
    _assert_a_compacted_rebuild_answers_like_a_full_replay(scenario)


def _assert_a_compacted_rebuild_answers_like_a_full_replay(scenario: RacingScenario) -> None:
    log = scenario.topic
    full = replay_at_offsets(log)
    model = kafka_model_of(log)
    for keep_tombstones in (False, True):
        rebuilt = replay_at_offsets(compacted_at_offsets(log, keep_tombstones=keep_tombstones))
        assert rebuilt.digest() == full.digest()
        assert_answers_like(model, rebuilt, WRITER_TP, scenario.segments)


@RACING_SETTINGS
@given(racing_histories(), st.data())
def test_a_node_restarted_from_a_compacted_prefix_catches_up_to_the_full_replay_once_the_writers_settle(
    scenario: RacingScenario, data: st.DataObject
) -> None:
    settle(scenario)
    log = scenario.topic
    cut = data.draw(st.integers(0, len(log)))
    node = replay_at_offsets(compacted_at_offsets(log[:cut], keep_tombstones=data.draw(st.booleans())))
    replay_at_offsets(log[cut:], node, start=cut)
    assert node.digest() == replay_at_offsets(log).digest()
