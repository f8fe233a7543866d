"""How a backlog window ends and how it is committed: a window lasts until every metadata partition was read to its
end (a consume that comes back short or empty while records still flow does not end it), and its records are
applied in several commits whose every prefix resumes to the same view; a record that cannot be read or applied
halts its partition at its offset, whichever commit it falls in.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message
from rlmm_testkit import (
    WINDOWED,
    append_garbage,
    counting_commits,
    make_tp,
    read_topic,
    rebuilt_past_garbage,
    written_history,
)
from support import wait_until

from rlmm import RemoteLogMetadataManager, applier
from rlmm.applier import ApplierSettings, CompactedWindow, MetadataApplier
from rlmm.types import TopicIdPartition
from rlmm.view import ConsumedRecord, MetadataView, ViewBatch


def written_topic(make_manager: Callable[..., RemoteLogMetadataManager], seed: int
                  ) -> tuple[RemoteLogMetadataManager, tuple[TopicIdPartition, ...]]:
    """A writer's history over three user partitions on two metadata partitions."""
    return written_history(make_manager, seed, [make_tp("orders", p) for p in range(3)], uploads=10)


@pytest.fixture
def windows_in_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows replayed in commits, as a node replays them over a view that holds something (one that was away): a
    new node's first window is loaded at once instead (test_rlmm_fresh_window.py)."""
    monkeypatch.setattr(MetadataApplier, "_load_fresh", lambda self, replay, ends: False)


@pytest.mark.usefixtures("windows_in_commits")
def test_a_window_committed_a_few_records_at_a_time_reaches_the_writers_view(
    make_manager: Callable[..., RemoteLogMetadataManager], monkeypatch: pytest.MonkeyPatch
) -> None:
    writer, _ = written_topic(make_manager, 50)
    monkeypatch.setattr(applier, "WINDOW_COMMIT_RECORDS", 3)
    commits = counting_commits(monkeypatch)
    rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
    rebuilt.wait_caught_up(60)
    assert len(commits) > 2 and max(commits) <= 3
    assert rebuilt.view_digest() == writer.view_digest()


@pytest.mark.usefixtures("windows_in_commits")
def test_a_node_stopped_between_the_commits_of_one_window_resumes_to_the_writers_view(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer, _ = written_topic(make_manager, 60)
    monkeypatch.setattr(applier, "WINDOW_COMMIT_RECORDS", 3)
    commit = MetadataApplier._commit
    commits: list[int] = []

    # The fault: the node stops for good right after the second commit of its first window.
    def stop_after_two(self: MetadataApplier, records: list[ConsumedRecord], next_offsets: dict[int, int]) -> Any:
        if len(commits) == 2:
            self._stop.set()
            raise RuntimeError("the node stops here")
        commits.append(len(records))
        return commit(self, records, next_offsets)

    monkeypatch.setattr(MetadataApplier, "_commit", stop_after_two)
    stopped = make_manager(broker_id=1, partitions=2, state_dir=tmp_path / "rebuilt", **WINDOWED)
    wait_until(lambda: len(commits) == 2, timeout=60)
    stopped.close()
    view = MetadataView.open(tmp_path / "rebuilt")
    resumed_from = view.applied_offsets(metadata_topic)
    view.close()
    assert 0 < sum(resumed_from.values()) < len(read_topic(kafka_bootstrap, metadata_topic))
    monkeypatch.setattr(MetadataApplier, "_commit", commit)

    resumed = make_manager(broker_id=1, partitions=2, state_dir=tmp_path / "rebuilt", **WINDOWED)
    resumed.wait_caught_up(60)
    assert resumed.view_digest() == writer.view_digest()


@pytest.mark.usefixtures("windows_in_commits")
def test_an_unreadable_record_in_a_later_commit_of_a_window_halts_only_its_partition_at_its_offset(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer, (broken, healthy) = written_history(make_manager, 70)
    bad_offset = append_garbage(kafka_bootstrap, metadata_topic, broken)

    monkeypatch.setattr(applier, "WINDOW_COMMIT_RECORDS", 2)
    commits = counting_commits(monkeypatch)
    rebuilt_past_garbage(make_manager, writer, healthy, bad_offset)
    assert len(commits) > 2


@pytest.mark.usefixtures("windows_in_commits")
def test_a_record_that_fails_to_apply_in_an_early_commit_keeps_its_partition_at_its_offset_after_the_window(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    writer, _ = written_history(make_manager, 80)
    newest = {r.key: r.offset for r in read_topic(kafka_bootstrap, metadata_topic) if r.partition == 0}
    replayed = sorted(newest.values())  # what a window over the whole log replays of partition 0
    failing = replayed[1]  # in the window's first commit, with more of partition 0 in later ones
    assert len(replayed) > 6
    apply = ViewBatch.apply

    # The fault: a bug in the state machine for one record (no record on a real topic makes apply raise).
    def failing_apply(self: ViewBatch, record: ConsumedRecord) -> Any:
        if record.metadata_partition == 0 and record.offset == failing:
            raise RuntimeError("a bug in the state machine")
        return apply(self, record)

    monkeypatch.setattr(ViewBatch, "apply", failing_apply)
    monkeypatch.setattr(applier, "WINDOW_COMMIT_RECORDS", 2)
    rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
    errors = wait_until(rebuilt.metadata_errors, timeout=60, description="the rebuilt node halting partition 0")
    assert list(errors) == [0] and f"offset {failing}" in str(errors[0])
    wait_until(lambda: rebuilt.applied_offsets().get(1) == writer.applied_offsets().get(1), timeout=60,
               description="metadata partition 1 read to its end")
    assert rebuilt.applied_offsets()[0] == failing


# --- where a window ends: a scripted consumer, for stalls the broker cannot be made to produce on demand ----------

class ScriptedConsumer:
    """Returns the scripted batches in turn, then nothing (each empty consume waits its timeout, as the client's)."""

    def __init__(self, partitions: int, batches: list[list[Message]]) -> None:
        self.partitions = partitions
        self._batches: Iterator[list[Message]] = iter(batches)
        self.consumes = 0

    def consume(self, max_records: int, timeout_s: float) -> list[Message]:
        self.consumes += 1
        batch = next(self._batches, None)
        if batch is None:
            time.sleep(timeout_s)
            return []
        assert len(batch) <= max_records
        return batch


class _NothingPending:
    def has_pending(self) -> bool:
        return False


def reading_applier(consumer: ScriptedConsumer, batch_max_records: int) -> MetadataApplier:
    """An applier's reading half over a scripted consumer (no view, no threads): enough to fill windows."""
    reader = object.__new__(MetadataApplier)
    reader._settings = ApplierSettings("meta", "id", 0, batch_max_records)
    reader._consumer = consumer  # type: ignore[assignment]
    reader._writer = _NothingPending()  # type: ignore[assignment]
    reader._stop = threading.Event()
    reader._at_end = set()
    reader._next_offsets = {p: 0 for p in range(consumer.partitions)}
    reader._after_cleaning = set()
    reader._group = None
    reader.halted = {}
    return reader


def records(partition: int, offsets: range | list[int]) -> list[Message]:
    return [Message(topic="meta", partition=partition, offset=o, key=f"k{partition}-{o}".encode(), value=b"v")
            for o in offsets]


def end_of(partition: int) -> Message:
    return Message(topic="meta", partition=partition, error=KafkaError(KafkaError._PARTITION_EOF))


def window() -> CompactedWindow:
    return CompactedWindow(lambda request: False, lambda key: False)


def test_a_consume_that_comes_back_empty_mid_backlog_does_not_end_the_window() -> None:
    consumer = ScriptedConsumer(2, [[], records(0, range(4, 6)), [*records(1, range(0, 3)), end_of(0), end_of(1)]])
    reader = reading_applier(consumer, batch_max_records=8)
    filling = window()
    assert reader._fill(filling, records(0, range(0, 4))) is True
    assert filling.records == 9 and consumer.consumes == 3


def test_a_backlog_ends_at_once_when_every_partition_was_read_to_its_end_or_is_halted() -> None:
    consumer = ScriptedConsumer(3, [[end_of(0), *records(1, range(0, 2)), end_of(1)]])
    reader = reading_applier(consumer, batch_max_records=8)
    reader.halted = {2: None}  # type: ignore[dict-item]
    started = time.monotonic()
    assert reader._fill(window(), records(0, range(0, 4))) is True
    assert consumer.consumes == 1 and time.monotonic() - started < applier.WINDOW_IDLE_S


def test_a_partition_that_never_reaches_its_end_ends_the_window_after_the_idle_time(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(applier, "WINDOW_IDLE_S", 0.3)
    consumer = ScriptedConsumer(2, [[end_of(0)]])  # partition 1's leader never answers
    reader = reading_applier(consumer, batch_max_records=4)
    started = time.monotonic()
    assert reader._fill(window(), records(0, range(0, 4))) is True
    assert 0.3 <= time.monotonic() - started < 2.0


def test_a_record_after_a_partitions_end_holds_the_window_open_until_it_ends_again() -> None:
    consumer = ScriptedConsumer(1, [[end_of(0), *records(0, range(4, 5))], [], [end_of(0)]])
    reader = reading_applier(consumer, batch_max_records=4)
    filling = window()
    assert reader._fill(filling, records(0, range(0, 4))) is True
    assert filling.records == 5 and consumer.consumes == 3


def test_records_read_past_offsets_the_cleaner_removed_stand_for_older_records_of_their_key_until_the_end() -> None:
    # Partition 0 lost offsets 4-6 to Kafka's log cleaner; partition 1 is contiguous; records after partition 0 was
    # read to its end are appended later (no cleaner touches the active segment).
    consumer = ScriptedConsumer(2, [[*records(0, [7, 8]), *records(1, range(0, 2)), end_of(0)],
                                    [*records(0, [9]), end_of(0), end_of(1)]])
    reader = reading_applier(consumer, batch_max_records=8)
    filling = window()
    assert reader._fill(filling, records(0, range(0, 4))) is True
    skipped = {(r.metadata_partition, r.offset): r.skipped_before for r in filling.replay_order()}
    assert skipped == {**{(0, o): False for o in range(0, 4)}, (0, 7): True, (0, 8): True,
                       (1, 0): False, (1, 1): False, (0, 9): False}
