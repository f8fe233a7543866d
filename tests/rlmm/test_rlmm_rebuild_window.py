"""A backlog replayed in compacted windows (rlmm.applier.CompactedWindow) reaches the view of a compacted replay of
the log, and of a full replay whenever the log is compaction-consistent; a crash between windows resumes from the
last window committed; records of this node's pending writes are applied with the outcome a full replay gives.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from rlmm_strategies import (
    RacingScenario,
    Scenario,
    TopicRecord,
    compacted_at_offsets,
    histories,
    racing_histories,
    replay_at_offsets,
    settle,
)
from rlmm_testkit import (
    WINDOWED,
    LogWriter,
    decoded,
    drive,
    make_tp,
    read_topic,
    register,
    replay,
    segment,
    update_of,
    workload,
    written_history,
)
from support import wait_until
from support.topics import produce

from rlmm import RemoteLogMetadataManager, applier, codec
from rlmm.applier import CompactedWindow, holds_segment
from rlmm.events import key_of, segment_key
from rlmm.state import Outcome
from rlmm.types import RemoteLogSegmentState, RemotePartitionDeleteMetadata, RemotePartitionDeleteState
from rlmm.view import ConsumedRecord, MetadataView, apply_records

S = RemoteLogSegmentState
TOPIC = "tierlog-test-metadata"
# Each example opens a RocksDB view of its own.
WINDOW_SETTINGS = settings(max_examples=15, deadline=None,
                           suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
window_cuts = st.lists(st.integers(0, 200), max_size=5)


def window_of(view: MetadataView, records: Sequence[TopicRecord], requests: Mapping[int, str] | None = None,
              pending: frozenset[str] = frozenset()) -> CompactedWindow:
    """The window an applier reads from `records` (offsets of metadata partition 0) over `view`."""
    window = CompactedWindow(pending.__contains__, partial(holds_segment, view))
    for offset, key, event in records:
        window.add(0, offset, key.encode(), None if event is None else codec.encode(event),
                   (requests or {}).get(offset))
    return window


def apply_window(view: MetadataView, window: CompactedWindow) -> list[tuple[ConsumedRecord, Outcome]]:
    """Decode the window's records, apply them and commit them with the window's end offsets, as the applier does."""
    records = [raw.decoded() for raw in window.replay_order()]
    return list(zip(records, apply_records(view, TOPIC, records, window.ends), strict=True))


def rebuild_in_windows(view: MetadataView, records: Sequence[TopicRecord], cuts: Sequence[int], start: int = 0
                       ) -> None:
    for end in [*sorted(set(cuts)), len(records)]:
        if end > start:
            apply_window(view, window_of(view, records[start:end]))
            start = end


def with_view(body: Callable[[MetadataView], None]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(Path(directory))
        try:
            body(view)
        finally:
            view.close()


def topic_of(scenario: Scenario) -> list[TopicRecord]:
    return [(offset, key, event) for offset, (key, event) in enumerate(scenario.writer.log)]


@WINDOW_SETTINGS
@given(histories(), window_cuts)
def test_windows_of_any_size_over_a_writers_log_reach_the_digest_of_the_full_replay(
    scenario: Scenario, cuts: list[int]
) -> None:
    def body(view: MetadataView) -> None:
        rebuild_in_windows(view, topic_of(scenario), cuts)
        assert view.digest() == scenario.writer.store.digest()
    with_view(body)


@WINDOW_SETTINGS
@given(racing_histories())
def test_one_window_over_a_racing_log_reaches_the_digest_of_its_compacted_replay(scenario: RacingScenario) -> None:
    # Unsettled racing writers: the log holds dropped records and stale checkpoints.
    compacted = replay_at_offsets(compacted_at_offsets(scenario.topic, keep_tombstones=True))

    def body(view: MetadataView) -> None:
        rebuild_in_windows(view, scenario.topic, [])
        assert view.digest() == compacted.digest()
    with_view(body)


@WINDOW_SETTINGS
@given(racing_histories(), window_cuts)
def test_windows_of_any_size_over_a_compaction_consistent_racing_log_reach_the_full_replay(
    scenario: RacingScenario, cuts: list[int]
) -> None:
    settle(scenario)
    full = replay_at_offsets(scenario.topic).digest()
    assume(replay_at_offsets(compacted_at_offsets(scenario.topic)).digest() == full)

    def body(view: MetadataView) -> None:
        rebuild_in_windows(view, scenario.topic, cuts)
        assert view.digest() == full
    with_view(body)


@settings(WINDOW_SETTINGS, max_examples=10)  # two views opened per example
@given(histories(), st.integers(0, 200), window_cuts)
def test_a_crash_between_windows_resumes_from_the_last_committed_window_to_the_full_replays_digest(
    scenario: Scenario, cut: int, cuts: list[int]
) -> None:
    records = topic_of(scenario)
    cut = min(cut, len(records))
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(Path(directory))
        rebuild_in_windows(view, records[:cut], [])
        window_of(view, records[cut:])  # read, never committed: the node crashed before the window's end
        view.close()
        view = MetadataView.open(Path(directory))
        try:
            resume = view.applied_offsets(TOPIC).get(0, 0)
            assert resume == cut
            rebuild_in_windows(view, records, [c for c in cuts if c > resume], start=resume)
            assert view.digest() == scenario.writer.store.digest()
        finally:
            view.close()


def test_a_tombstoned_segment_the_view_never_held_leaves_nothing_to_replay() -> None:
    tp = make_tp()
    added = segment(tp, 0, 9, {0: 0})
    finished = added.create_with_update(update_of(added, S.COPY_SEGMENT_FINISHED))
    key = segment_key(added.remote_log_segment_id)
    records: list[TopicRecord] = [(0, key, added), (1, key, finished), (2, key, None)]

    def body(view: MetadataView) -> None:
        assert window_of(view, records).replay_order() == []
        apply_window(view, window_of(view, records[:2]))
        kept = window_of(view, records[2:]).replay_order()
        assert [(raw.offset, raw.value) for raw in kept] == [(2, None)]
        apply_window(view, window_of(view, records[2:]))
        assert view.segment(added.remote_log_segment_id) is None
        assert view.applied_offsets(TOPIC) == {0: 3}
    with_view(body)


def test_a_window_cut_between_a_copy_and_its_delete_reaches_the_full_replays_view() -> None:
    """The window after the cut keeps only the newest record of each key: the segment's DELETE_SEGMENT_FINISHED
    without its DELETE_SEGMENT_STARTED, and the partition's DELETE_PARTITION_FINISHED without its STARTED (as a log
    Kafka's cleaner compacted under a node that was away would). Here no tombstone follows them (their writer
    stopped first): a node that dropped them as invalid jumps would hold the segment and the partition forever."""
    tp, other = make_tp(), make_tp("bar")
    added = segment(tp, 0, 9, {0: 0})
    finished = added.create_with_update(update_of(added, S.COPY_SEGMENT_FINISHED))
    deleting = finished.create_with_update(update_of(finished, S.DELETE_SEGMENT_STARTED))
    deleted = deleting.create_with_update(update_of(deleting, S.DELETE_SEGMENT_FINISHED))
    marked, started, gone = (RemotePartitionDeleteMetadata(other, state, 1_700_000_000_000, 1)
                             for state in RemotePartitionDeleteState)
    key = key_of(added)
    records: list[TopicRecord] = [
        (0, key, added), (1, key, finished), (2, key_of(marked), marked),
        (3, key, deleting), (4, key, deleted), (5, key_of(marked), started), (6, key_of(marked), gone),
    ]
    full = replay_at_offsets(records)
    assert full.segment(added.remote_log_segment_id) is None and full.partition_delete(other) == gone

    def body(view: MetadataView) -> None:
        rebuild_in_windows(view, records, [3])
        assert view.segment(added.remote_log_segment_id) is None
        assert view.partition_delete(other) == gone
        assert view.digest() == full.digest()
    with_view(body)


def test_a_segment_id_added_again_after_its_tombstone_in_one_window_is_added_anew() -> None:
    """The view holds the segment from an earlier window; this window deletes it, tombstones it and adds the same id
    again. Replaying only the newest record (the add) over the held state would drop it as an invalid transition."""
    tp = make_tp()
    added = segment(tp, 0, 9, {0: 0})
    finished = added.create_with_update(update_of(added, S.COPY_SEGMENT_FINISHED))
    deleting = finished.create_with_update(update_of(finished, S.DELETE_SEGMENT_STARTED))
    deleted = deleting.create_with_update(update_of(deleting, S.DELETE_SEGMENT_FINISHED))
    key = key_of(added)
    records: list[TopicRecord] = [(0, key, added), (1, key, finished), (2, key, deleting), (3, key, deleted),
                                  (4, key, None), (5, key, added)]
    full = replay_at_offsets(records)

    def body(view: MetadataView) -> None:
        assert [raw.offset for raw in window_of(view, records).replay_order()] == [5]
        apply_window(view, window_of(view, records[:2]))
        assert [raw.offset for raw in window_of(view, records[2:]).replay_order()] == [4, 5]
        apply_window(view, window_of(view, records[2:]))
        assert view.segment(added.remote_log_segment_id) == added
        assert view.digest() == full.digest()
    with_view(body)


def test_a_late_update_after_a_segments_tombstone_is_dropped_wherever_a_window_cuts() -> None:
    """Another broker's lagging view let it update the segment after it was deleted and tombstoned: Kafka's cache
    ignores the update (the segment is unknown to it), and so does every window, whether the tombstone it follows is
    in the same window (replayed before it, so that the update skips nothing) or in an earlier one."""
    writer = LogWriter()
    added = segment(make_tp(), 0, 9, {0: 0})
    finished = writer.add_and_update(added, S.COPY_SEGMENT_FINISHED)
    for state in (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED):
        writer.update(update_of(finished, state))
    records = [*topic_of(Scenario(writer=writer)), (len(writer.log), key_of(finished), finished)]
    assert records[-2][2] is None, "the late update follows the segment's tombstone"
    full = replay_at_offsets(records)
    assert full.segment(added.remote_log_segment_id) is None

    def body(cut: int, view: MetadataView) -> None:
        rebuild_in_windows(view, records, [cut])
        assert view.segment(added.remote_log_segment_id) is None
        assert view.digest() == full.digest()
    for cut in range(len(records)):
        with_view(partial(body, cut))


def test_a_node_reading_a_segments_delete_tombstone_and_re_add_in_its_backlog_holds_the_re_add(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str, tmp_path: Path
) -> None:
    """The same case through the applier's own reading of a backlog (MetadataApplier._add, which inlines
    CompactedWindow.keep's plain path), on a real broker: the node held the segment, was away while it was deleted,
    tombstoned and added again, and reads all of that as one backlog window."""
    tp = make_tp()
    added = segment(tp, 0, 9, {0: 0})
    finished = added.create_with_update(update_of(added, S.COPY_SEGMENT_FINISHED))
    deleting = finished.create_with_update(update_of(finished, S.DELETE_SEGMENT_STARTED))
    deleted = deleting.create_with_update(update_of(deleting, S.DELETE_SEGMENT_FINISHED))
    key = key_of(added).encode()
    node = make_manager(state_dir=tmp_path / "node", **WINDOWED)  # creates the (one-partition) topic
    produce(kafka_bootstrap, metadata_topic, [(key, codec.encode(added)), (key, codec.encode(finished))])
    node.wait_caught_up(60)
    node.close()
    produce(kafka_bootstrap, metadata_topic, [(key, codec.encode(deleting)), (key, codec.encode(deleted)),
                                              (key, None), (key, codec.encode(added))])
    node = make_manager(state_dir=tmp_path / "node", **WINDOWED)  # four records: a backlog
    node.wait_caught_up(60)
    full = replay(decoded(read_topic(kafka_bootstrap, metadata_topic)))
    assert full.segment(added.remote_log_segment_id) == added
    assert node.view_digest() == full.digest()


def test_an_update_after_a_skipped_re_add_with_other_offsets_follows_the_re_add() -> None:
    """An earlier window applied the segment's add; this window re-adds it with other offsets and epochs (allowed
    while COPY_SEGMENT_STARTED) and finishes it. Its newest record alone, over the first add, changes the offsets."""
    tp = make_tp()
    added = segment(tp, 18, 31, {3: 18})
    again = segment(tp, 8, 9, {0: 8}, segment_id=added.remote_log_segment_id.id)
    finished = again.create_with_update(update_of(again, S.COPY_SEGMENT_FINISHED))
    key = key_of(added)
    records: list[TopicRecord] = [(0, key, added), (1, key, again), (2, key, finished)]
    full = replay_at_offsets(records)

    def body(view: MetadataView) -> None:
        rebuild_in_windows(view, records, [1])
        assert view.segment(added.remote_log_segment_id) == finished
        assert view.digest() == full.digest()
    with_view(body)


def test_a_pending_write_of_this_node_is_applied_with_the_outcome_a_full_replay_gives_it() -> None:
    tp = make_tp()
    added = segment(tp, 0, 9, {0: 0})
    finished = added.create_with_update(update_of(added, S.COPY_SEGMENT_FINISHED))
    deleting = finished.create_with_update(update_of(finished, S.DELETE_SEGMENT_STARTED))
    key = key_of(added)
    # This node's late COPY_SEGMENT_FINISHED lands after another node started deleting the segment.
    records: list[TopicRecord] = [(0, key, added), (1, key, finished), (2, key, deleting), (3, key, finished)]
    full = replay((k, e) for _, k, e in records)

    def body(view: MetadataView) -> None:
        window = window_of(view, records, requests={3: "mine"}, pending=frozenset({"mine"}))
        assert [raw.offset for raw in window.replay_order()] == [2, 3]
        outcomes = {record.offset: outcome for record, outcome in apply_window(view, window)}
        assert not outcomes[3].applied and "invalid transition" in (outcomes[3].reason or "")
        assert view.segment(added.remote_log_segment_id) == full.segment(added.remote_log_segment_id)
    with_view(body)


def test_the_same_records_without_a_pending_write_replay_only_the_newest() -> None:
    tp = make_tp()
    added = segment(tp, 0, 9, {0: 0})
    finished = added.create_with_update(update_of(added, S.COPY_SEGMENT_FINISHED))
    key = key_of(added)
    records: list[TopicRecord] = [(0, key, added), (1, key, finished)]

    def body(view: MetadataView) -> None:
        window = window_of(view, records, requests={1: "someone-else"}, pending=frozenset({"mine"}))
        assert [raw.offset for raw in window.replay_order()] == [1]
    with_view(body)


# --- the real manager on the shared broker: every batch full, so every read goes through windows -------------


def test_a_node_reading_only_windows_completes_its_own_writes_and_matches_a_replay_of_its_topic(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str
) -> None:
    writer = make_manager(broker_id=0, partitions=2, **WINDOWED)
    tps = [make_tp("orders", p) for p in range(3)]
    register(writer, *tps)
    drive(writer, {tp: workload(random.Random(30 + tp.partition), tp, uploads=8) for tp in tps})
    writer.wait_caught_up(60)
    assert writer.view_digest() == replay(decoded(read_topic(kafka_bootstrap, metadata_topic))).digest()
    rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
    rebuilt.wait_caught_up(60)
    assert rebuilt.view_digest() == writer.view_digest()


def test_a_node_stopped_between_windows_of_a_rebuild_resumes_from_the_last_committed_one(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer, _ = written_history(make_manager, 40, [make_tp("orders", p) for p in range(3)])
    monkeypatch.setattr(applier, "WINDOW_MAX_RECORDS", 4)
    apply_window = applier.MetadataApplier._apply_window
    windows: list[int] = []

    # The fault: the rebuilding node stops for good right after committing its third window.
    def stop_after_three(self: applier.MetadataApplier, window: CompactedWindow, fresh: bool, last: bool = False
                         ) -> tuple[int, str]:
        replayed = apply_window(self, window, fresh, last)
        windows.append(window.records)
        if len(windows) == 3:
            self._stop.set()
        return replayed

    monkeypatch.setattr(applier.MetadataApplier, "_apply_window", stop_after_three)
    stopped = make_manager(broker_id=1, partitions=2, state_dir=tmp_path / "rebuilt", **WINDOWED)
    wait_until(lambda: len(windows) == 3, timeout=60)
    stopped.close()
    view = MetadataView.open(tmp_path / "rebuilt")
    resumed_from = view.applied_offsets(metadata_topic)
    view.close()
    assert 0 < sum(resumed_from.values()) < len(read_topic(kafka_bootstrap, metadata_topic))
    monkeypatch.setattr(applier.MetadataApplier, "_apply_window", apply_window)

    resumed = make_manager(broker_id=1, partitions=2, state_dir=tmp_path / "rebuilt", **WINDOWED)
    resumed.wait_caught_up(60)
    assert resumed.view_digest() == writer.view_digest()
