"""Property tests of the pure state machine: it answers like Kafka's semantics, and compaction cannot change it.

Random API call sequences (valid and invalid) over a few partitions, leader epochs and overlapping segments
drive both the reference model and a writer over rlmm.state; no Kafka is involved.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from rlmm_strategies import PROPERTY_SETTINGS, STEPS, Scenario, assert_same_answers, histories, step
from rlmm_testkit import LogRecord, compacted, replay

from rlmm.state import InMemoryState


@PROPERTY_SETTINGS
@given(st.data())
def test_state_answers_every_query_like_kafka_after_every_call(data: st.DataObject) -> None:
    scenario = Scenario()
    for _ in range(data.draw(STEPS)):
        step(data.draw, scenario)
        assert_same_answers(scenario, scenario.writer.store)


@PROPERTY_SETTINGS
@given(histories())
def test_replaying_the_log_into_an_empty_state_reaches_the_writers_state(scenario: Scenario) -> None:
    assert replay(scenario.writer.log).digest() == scenario.writer.store.digest()


@PROPERTY_SETTINGS
@given(histories())
def test_replaying_only_the_newest_record_of_each_key_gives_the_same_digest(scenario: Scenario) -> None:
    log = scenario.writer.log
    assert replay(compacted(log)).digest() == replay(log).digest()


@PROPERTY_SETTINGS
@given(histories())
def test_a_compacted_log_that_still_holds_its_tombstones_gives_the_same_digest(scenario: Scenario) -> None:
    log = scenario.writer.log
    assert replay(compacted(log, keep_tombstones=True)).digest() == replay(log).digest()


@PROPERTY_SETTINGS
@given(histories(), st.data())
def test_compacting_any_prefix_of_the_log_gives_the_same_digest(scenario: Scenario, data: st.DataObject) -> None:
    # Kafka's cleaner never touches the active segment: a reader sees a compacted head, then raw records.
    log = scenario.writer.log
    cut = data.draw(st.integers(0, len(log)))
    keep_tombstones = data.draw(st.booleans())
    head: list[LogRecord] = compacted(log[:cut], keep_tombstones=keep_tombstones)
    assert replay([*head, *log[cut:]]).digest() == replay(log).digest()


@PROPERTY_SETTINGS
@given(histories(), st.data())
def test_a_node_that_applied_a_compacted_prefix_then_the_rest_matches_a_full_replay(
    scenario: Scenario, data: st.DataObject
) -> None:
    # A node restarts from its stored offsets: its view came from one prefix, it then reads the rest.
    log = scenario.writer.log
    cut = data.draw(st.integers(0, len(log)))
    node = replay(compacted(log[:cut]))
    replay(log[cut:], node)
    assert node.digest() == replay(log).digest()


def test_an_empty_log_gives_the_digest_of_an_empty_state() -> None:
    assert replay([]).digest() == InMemoryState().digest()


@PROPERTY_SETTINGS
@given(histories(), st.data())
def test_a_writer_crash_between_an_event_and_its_lineage_checkpoint_does_not_change_a_compacted_rebuild(
    scenario: Scenario, data: st.DataObject
) -> None:
    # The writer appended an event, then died before appending the `epochs:` checkpoint that follows it.
    log = scenario.writer.log
    checkpoints = [i for i, (key, event) in enumerate(log) if key.kind == "epochs" and event is not None]
    if not checkpoints:
        return
    crash = data.draw(st.sampled_from(checkpoints))
    crashed = log[:crash]
    assert replay(compacted(crashed)).digest() == replay(crashed).digest()
