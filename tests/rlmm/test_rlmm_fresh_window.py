"""A new node's first window is folded in memory (rlmm.view.FreshState) and loaded into its empty view at once
(MetadataView.load_fresh): the view, its bookkeeping rows and its read model are those the same records applied in
commits make, and a record that cannot be read or applied halts only its partition, at its offset.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rlmm_strategies import (
    PARTITIONS,
    PROPERTY_SETTINGS,
    RacingScenario,
    Scenario,
    TopicRecord,
    assert_same_answers,
    histories,
    racing_histories,
)
from rlmm_testkit import (
    WINDOWED,
    append_garbage,
    counting_commits,
    empty_view,
    make_tp,
    read_topic,
    rebuilt_past_garbage,
    register,
    segment,
    written_history,
)
from support import wait_until

from rlmm import RemoteLogMetadataManager, codec, state
from rlmm import view_format as vf
from rlmm.errors import ViewFormatError
from rlmm.events import EpochCheckpoint, epochs_key, key_of
from rlmm.read_model import read_partition
from rlmm.snapshot import snapshot_entries
from rlmm.state import Outcome
from rlmm.view import ConsumedRecord, FreshState, MetadataView, apply_records

TOPIC = "tierlog-test-metadata"
# Each example opens two RocksDB views (about 0.5 s): few examples, beside the many of the pure properties.
FRESH_SETTINGS = settings(PROPERTY_SETTINGS, max_examples=10)


def consumed(records: Sequence[TopicRecord], skipped: Sequence[bool]) -> list[ConsumedRecord]:
    """The records as a window hands them on: with their bytes as consumed, and whether older records of their key
    may be missing before them."""
    return [ConsumedRecord(0, offset, key, event, None if event is None else codec.encode(event),
                           skipped[i % len(skipped)] if skipped else False)
            for i, (offset, key, event) in enumerate(records)]


def loaded_fresh(view: MetadataView, records: list[ConsumedRecord]) -> list[Outcome]:
    fresh = FreshState()
    outcomes = [fresh.apply(record) for record in records]
    view.load_fresh(TOPIC, fresh, {0: records[-1].offset + 1 if records else 0})
    return outcomes


def assert_loaded_like_commits(records: list[ConsumedRecord], cuts: Sequence[int]) -> None:
    """Load `records` fresh into one empty view and commit them in batches ending at `cuts` into another: the same
    outcomes, content, bookkeeping rows, applied offsets and read model (which a view reopened from disk reads back
    the same)."""
    with empty_view() as fresh, empty_view() as committed:
        outcomes = loaded_fresh(fresh, records)
        start, committed_outcomes = 0, []
        for end in [*sorted({c for c in cuts if 0 < c < len(records)}), len(records)]:
            batch = records[start:end]
            committed_outcomes += apply_records(committed, TOPIC, batch, {0: records[end - 1].offset + 1} if batch
                                                else {0: 0})
            start = end
        assert outcomes == committed_outcomes
        assert list(snapshot_entries(fresh)) == list(snapshot_entries(committed))
        assert fresh.applied_offsets(TOPIC) == committed.applied_offsets(TOPIC)
        keys = {vf.tp_key_of(tp) for tp in fresh.user_partitions()} | {vf.tp_key_of(tp) for tp in PARTITIONS}
        for key in keys:
            from_disk = read_partition(fresh._cf, key)
            assert fresh.model.get(key) == from_disk == committed.model.get(key), key


@FRESH_SETTINGS
@given(histories(), st.lists(st.booleans(), max_size=4), st.lists(st.integers(0, 200), max_size=4))
def test_a_writers_log_loaded_fresh_is_the_view_its_commits_make(
    scenario: Scenario, skipped: list[bool], cuts: list[int]
) -> None:
    records = consumed([(offset, key, event) for offset, (key, event) in enumerate(scenario.writer.log)], skipped)
    assert_loaded_like_commits(records, cuts)


@FRESH_SETTINGS
@given(racing_histories(), st.lists(st.booleans(), max_size=4))
def test_a_racing_log_loaded_fresh_is_the_view_its_commits_make(scenario: RacingScenario, skipped: list[bool]) -> None:
    # Racing writers leave dropped records, stale checkpoints and the bookkeeping of epochs that owe one.
    assert_loaded_like_commits(consumed(scenario.topic, skipped), [])


class _RulesOnly(FreshState):
    """A FreshState that applies every record through the rules (rlmm.state), without its shortcut."""

    def _append_finished(self, *args: Any) -> bool:
        return False


def assert_shortcut_folds_like_the_rules(records: list[ConsumedRecord]) -> None:
    shortcut, rules = FreshState(), _RulesOnly()
    assert [shortcut.apply(r) for r in records] == [rules.apply(r) for r in records]
    assert shortcut.partitions() == rules.partitions()
    assert list(shortcut.runs(shortcut.partitions())) == list(rules.runs(rules.partitions()))


@PROPERTY_SETTINGS
@given(histories(), st.lists(st.booleans(), max_size=4), st.booleans())
def test_the_shortcut_for_an_appended_finished_segment_folds_a_writers_log_as_the_rules_do(
    scenario: Scenario, skipped: list[bool], compact: bool
) -> None:
    # Pure folds, so many examples: the shortcut takes most records of a compacted topic.
    log = list(enumerate(scenario.writer.log))
    if compact:  # the newest record of each key, at its own offset, as the log cleaner leaves them
        log = sorted({key.encode(): (offset, (key, event)) for offset, (key, event) in log}.values(),
                     key=lambda item: item[0])
    assert_shortcut_folds_like_the_rules(consumed([(offset, key, event) for offset, (key, event) in log], skipped))


@PROPERTY_SETTINGS
@given(racing_histories(), st.lists(st.booleans(), max_size=4))
def test_the_shortcut_for_an_appended_finished_segment_folds_a_racing_log_as_the_rules_do(
    scenario: RacingScenario, skipped: list[bool]
) -> None:
    assert_shortcut_folds_like_the_rules(consumed(scenario.topic, skipped))


def test_the_shortcut_takes_a_partitions_finished_uploads_and_leaves_the_rest_to_the_rules(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tp = make_tp()
    first = segment(tp, 0, 99, {0: 0}, state=state.S.COPY_SEGMENT_FINISHED)
    second = segment(tp, 100, 199, {0: 100, 1: 150}, state=state.S.COPY_SEGMENT_FINISHED)
    again = segment(tp, 50, 149, {0: 50}, state=state.S.COPY_SEGMENT_FINISHED)  # starts inside: displaces, by the rules
    taken: list[bool] = []
    original = FreshState._append_finished

    def counted(self: FreshState, *args: Any) -> bool:
        taken.append(original(self, *args))
        return taken[-1]

    monkeypatch.setattr(FreshState, "_append_finished", counted)
    # As a compacted topic holds them: each stands for its segment's add, which the log cleaner removed.
    records = consumed([(offset, key_of(md), md) for offset, md in enumerate((first, second, again))], [True])
    assert_shortcut_folds_like_the_rules(records)
    assert taken == [True, True, False]


@FRESH_SETTINGS
@given(histories())
def test_a_view_loaded_fresh_answers_every_query_like_kafka(scenario: Scenario) -> None:
    with empty_view() as view:
        loaded_fresh(view, consumed([(offset, key, event) for offset, (key, event) in
                                     enumerate(scenario.writer.log)], []))
        assert_same_answers(scenario, view.batch())


def test_a_partition_known_only_by_its_bookkeeping_keeps_its_row_as_commits_keep_it() -> None:
    # A whole-partition checkpoint of no epoch for a partition the view never held: it holds no content, but the view
    # knows the partition from then on (a later tombstone of its keys finds it), which a fold in memory alone forgets.
    tp = make_tp("bookkeeping", 0)
    checkpoint = EpochCheckpoint(tp, (), 1, 0, None, whole_partition=True)
    records = consumed([(0, epochs_key(tp), checkpoint)], [])
    assert_loaded_like_commits(records, [])
    with empty_view() as view:
        loaded_fresh(view, records)
        assert view.user_partitions() == [tp]


def test_a_view_that_applied_records_refuses_a_fresh_load() -> None:
    tp = make_tp("orders", 0)
    md = segment(tp, 0, 9, {0: 0})
    with empty_view() as view:
        apply_records(view, TOPIC, [ConsumedRecord(0, 0, key_of(md), md)], {0: 1})
        with pytest.raises(ViewFormatError, match="applied records"):
            view.load_fresh(TOPIC, FreshState(), {0: 1})
        assert view.applied_offsets(TOPIC) == {0: 1}
        assert list(view.segments(tp)) == [md]


@settings(FRESH_SETTINGS, max_examples=5)
@given(histories(), histories())
def test_what_a_fresh_load_cut_short_left_is_removed_before_the_next_one(left: Scenario, scenario: Scenario) -> None:
    # A load cut short (the disk filled between two of its tables) leaves entries without offsets in the view,
    # perhaps read into the read model meanwhile; the next load starts from nothing.
    with empty_view() as cut_short, empty_view() as clean:
        leftover = FreshState()
        for record in consumed([(o, k, e) for o, (k, e) in enumerate(left.writer.log)], [True]):
            leftover.apply(record)
        cut_short.load_entries(TOPIC, leftover.runs(leftover.partitions()), {})
        for tp in PARTITIONS:
            cut_short.model.watch(vf.tp_key_of(tp))
        records = consumed([(o, k, e) for o, (k, e) in enumerate(scenario.writer.log)], [])
        loaded_fresh(cut_short, records)
        loaded_fresh(clean, records)
        assert list(snapshot_entries(cut_short)) == list(snapshot_entries(clean))
        for tp in PARTITIONS:
            key = vf.tp_key_of(tp)
            assert cut_short.model.get(key) == clean.model.get(key)
            assert cut_short.model.snapshots[key] == clean.model.watch(key)
        assert_same_answers(scenario, cut_short.batch())


# --- a new node rebuilding from the topic ----------------------------------------------------------------------

def test_a_new_node_loads_its_first_window_at_once_and_serves_the_partitions_it_watched_meanwhile(
    make_manager: Callable[..., RemoteLogMetadataManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, tps = written_history(make_manager, 90, [make_tp("orders", p) for p in range(4)], uploads=10)
    commits = counting_commits(monkeypatch)
    rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
    register(rebuilt, *tps)  # watched from the start: their lookups must see the load
    rebuilt.wait_caught_up(60)
    assert commits == []  # one load, no commit
    assert rebuilt.view_digest() == writer.view_digest()
    assert rebuilt.applied_offsets() == writer.applied_offsets()
    for tp in tps:
        wait_until(lambda tp=tp: rebuilt.is_ready(tp), timeout=30, description=f"{tp} ready")
        listed = writer.list_remote_log_segments(tp)
        assert rebuilt.list_remote_log_segments(tp) == listed
        for md in listed:
            epoch = min(md.segment_leader_epochs)
            assert rebuilt.remote_log_segment_metadata(tp, epoch, md.start_offset) == \
                writer.remote_log_segment_metadata(tp, epoch, md.start_offset)


def test_an_unreadable_record_in_a_new_nodes_first_window_halts_only_its_partition_and_the_rest_loads(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer, (broken, healthy) = written_history(make_manager, 100)
    bad_offset = append_garbage(kafka_bootstrap, metadata_topic, broken)
    commits = counting_commits(monkeypatch)
    rebuilt = rebuilt_past_garbage(make_manager, writer, healthy, bad_offset)
    assert commits == []
    # What the broken partition held before the garbage is loaded too.
    assert set(rebuilt.view.segments(broken)) == set(writer.view.segments(broken))


def test_a_record_that_fails_to_apply_in_a_new_nodes_first_window_loads_nothing_and_halts_its_partition(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer, tps = written_history(make_manager, 110)
    newest = {r.key: r.offset for r in read_topic(kafka_bootstrap, metadata_topic) if r.partition == 0}
    failing = sorted(newest.values())[1]
    rule = state.apply_record
    loads: list[int] = []

    # The fault: a bug in the state machine for one record (no record on a real topic makes apply raise).
    def failing_rule(store: Any, key: Any, event: Any, offset: int | None = None, skipped_before: bool = False
                     ) -> Outcome:
        if offset == failing and key.same_user_partition(tps[0]):
            raise RuntimeError("a bug in the state machine")
        return rule(store, key, event, offset, skipped_before)

    shortcut = FreshState._append_finished

    def failing_shortcut(self: FreshState, md: Any, offset: int, raw: bytes | None) -> bool:
        if offset == failing and md.topic_id_partition == tps[0]:  # the same bug, in the rules' shortcut
            raise RuntimeError("a bug in the state machine")
        return shortcut(self, md, offset, raw)

    load = MetadataView.load_fresh

    def counted_load(self: MetadataView, *args: Any) -> None:
        loads.append(1)
        load(self, *args)

    monkeypatch.setattr(state, "apply_record", failing_rule)
    monkeypatch.setattr(FreshState, "_append_finished", failing_shortcut)
    monkeypatch.setattr(MetadataView, "load_fresh", counted_load)
    rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
    errors = wait_until(rebuilt.metadata_errors, timeout=60, description="the rebuilt node halting partition 0")
    wait_until(lambda: rebuilt.applied_offsets().get(1) == writer.applied_offsets()[1], timeout=60,
               description="metadata partition 1 read to its end")
    assert loads == []  # the window was replayed in commits instead, which halt the record's partition
    assert list(errors) == [0] and f"offset {failing}" in str(errors[0])
    assert rebuilt.applied_offsets()[0] == failing
