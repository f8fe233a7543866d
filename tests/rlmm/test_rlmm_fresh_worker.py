"""A new node's large first window is folded on two cores (rlmm.fresh_load): a worker process folds a share of
the metadata partitions and writes it as RocksDB tables, the applier folds the rest and ingests both. The view, its
bookkeeping and its read model are those one process makes; a worker that cannot start, dies, stalls, or is another
release leaves the applier to fold its share itself; bad records behave as in one process.

These are the windows the applier reads itself: a backlog's groups read by worker processes (MetadataApplier.
_load_in_workers, tests/rlmm/test_rlmm_group_workers.py) are turned off here; the applier reads a group itself when
its worker failed, or when a write of the node is pending.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from rlmm_strategies import PARTITIONS, PROPERTY_SETTINGS, RacingScenario, Scenario, histories, racing_histories
from rlmm_testkit import (
    WINDOWED,
    append_garbage,
    break_the_workers_rules,
    counting_commits,
    empty_view,
    fault_on_handing,
    make_tp,
    on_distinct_metadata_partitions,
    produce_to,
    read_topic,
    rebuilt_past_garbage,
    register,
    segment,
    written_history,
)
from support import wait_until

from rlmm import RemoteLogMetadataManager, applier, codec, fresh_load
from rlmm import view_format as vf
from rlmm.applier import MetadataApplier
from rlmm.events import MetadataEvent, RecordKey, key_of
from rlmm.read_model import read_partition
from rlmm.snapshot import snapshot_entries
from rlmm.view import FreshState

TOPIC = "tierlog-test-metadata"
# Each example opens two RocksDB views, about 1 s in CI: few examples (the split and fold are the same code for any).
SETTINGS = settings(PROPERTY_SETTINGS, max_examples=6)


def window(log: Sequence[tuple[RecordKey, MetadataEvent | None]]) -> list[fresh_load.Record]:
    """A log as a window hands it on, each user partition on a metadata partition of its own (PARTITIONS' order),
    in replay order."""
    def metadata_partition(key: RecordKey) -> int:
        return next(index for index, tp in enumerate(PARTITIONS) if key.same_user_partition(tp))

    return sorted((metadata_partition(key), offset, key.encode(), None if event is None else codec.encode(event),
                   None, False) for offset, (key, event) in enumerate(log))


def assert_shared_load_is_one_process_load(records: list[fresh_load.Record]) -> None:
    """The window folded in one process, and split with a worker's share folded apart (as the worker does, here
    in-process) and ingested beside it: the same outcomes, content, bookkeeping rows, offsets and read model."""
    ends = {partition: offset + 1 for partition, offset, *_ in records}
    with empty_view() as alone, empty_view() as shared, tempfile.TemporaryDirectory() as tables:
        whole = FreshState()
        folded = fresh_load.fold(whole, records, ())
        alone.load_fresh(TOPIC, whole, ends)

        mine, theirs = fresh_load.split(records)
        fresh = FreshState()
        own = fresh_load.fold(fresh, mine, ())
        share = fresh_load.fold_share(theirs, Path(tables))
        assert isinstance(share, fresh_load.WorkerShare)
        assert own.touched.isdisjoint(share.folded.touched)
        assert len(own.touched | share.folded.touched) == len({tuple(r[2].split(b":")[1:3]) for r in records})
        for partition in share.partitions:  # watched before the load: published from RocksDB after it
            shared.model.watch(partition)
        shared.load_fresh(TOPIC, fresh, ends, share.tables, share.partitions)

        def outcomes(of: Sequence[fresh_load.Record], done: fresh_load.Folded) -> list[tuple[int, int, Any]]:
            return [(*of[index][:2], outcome) for index, _, _, outcome in done.noted]

        assert sorted(outcomes(records, folded)) == sorted(outcomes(mine, own) + outcomes(theirs, share.folded))
        assert folded.applied == own.applied + share.folded.applied
        assert list(snapshot_entries(shared)) == list(snapshot_entries(alone))
        assert shared.applied_offsets(TOPIC) == alone.applied_offsets(TOPIC)
        for tp in PARTITIONS:
            key = vf.tp_key_of(tp)
            assert shared.model.get(key) == read_partition(shared._cf, key) == alone.model.get(key)
            if key in share.partitions:
                assert shared.model.snapshots[key] == alone.model.watch(key)


@SETTINGS
@given(histories())
def test_a_writers_log_folded_in_two_shares_loads_the_view_one_process_loads(scenario: Scenario) -> None:
    assert_shared_load_is_one_process_load(window(scenario.writer.log))


@SETTINGS
@given(racing_histories())
def test_a_racing_log_folded_in_two_shares_loads_the_view_one_process_loads(scenario: RacingScenario) -> None:
    # Racing writers leave dropped records and stale checkpoints: noted records on both sides.
    assert_shared_load_is_one_process_load(window([(key, event) for _, key, event in scenario.topic]))


def test_the_split_keeps_each_metadata_partition_whole_and_the_shares_about_even() -> None:
    records: list[fresh_load.Record] = sorted(
        (partition, offset, b"k", b"v", None, False) for partition, count in enumerate([50, 30, 20, 10, 5, 5])
        for offset in range(count))
    mine, theirs = fresh_load.split(records)
    assert sorted(mine + theirs) == records
    assert not {r[0] for r in mine} & {r[0] for r in theirs}
    assert abs(len(mine) - len(theirs)) <= 10
    assert mine == sorted(mine) and theirs == sorted(theirs)
    assert all(type(record) is tuple for record in theirs)  # plain tuples travel without a class to import


def test_the_worker_exits_when_its_applier_goes_away_before_handing_it_anything() -> None:
    worker = subprocess.run([sys.executable, "-m", "rlmm.fresh_load"], stdin=subprocess.DEVNULL,
                            capture_output=True, timeout=60)
    assert worker.returncode == 0, worker.stderr.decode()
    assert worker.stdout  # its hello, then nothing more


# --- a new node rebuilding from the topic ----------------------------------------------------------------------

@pytest.fixture(autouse=True)
def windows_read_by_the_applier(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(applier, "GROUP_WORKERS", 0)


@pytest.fixture
def worker_for_any_window(monkeypatch: pytest.MonkeyPatch) -> list[fresh_load.WorkerShare | None]:
    """Every new node's first window gets a worker, however small; the answers the workers gave."""
    monkeypatch.setattr(fresh_load, "WORKER_MIN_KEPT", 1)
    answers: list[fresh_load.WorkerShare | None] = []
    answer = fresh_load.FoldWorker.answer

    def recorded(self: fresh_load.FoldWorker, stop: Any) -> fresh_load.WorkerShare | None:
        answers.append(answer(self, stop))
        return answers[-1]

    monkeypatch.setattr(fresh_load.FoldWorker, "answer", recorded)
    return answers


def assert_rebuilt_like(rebuilt: RemoteLogMetadataManager, writer: RemoteLogMetadataManager,
                        tps: Sequence[Any]) -> None:
    rebuilt.wait_caught_up(60)
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


def test_a_new_node_folds_its_first_window_with_a_worker_and_loads_what_one_process_loads(
    make_manager: Callable[..., RemoteLogMetadataManager], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
    worker_for_any_window: list[fresh_load.WorkerShare | None],
) -> None:
    # Partitions on both metadata partitions, so that both shares hold some.
    writer, tps = written_history(make_manager, 120, [*on_distinct_metadata_partitions(),
                                                      *(make_tp("orders", p) for p in range(4))], uploads=10)
    commits = counting_commits(monkeypatch)
    # What a node that stopped mid-load left: its worker's table files, which must not enter this view.
    state_dir = tmp_path / "rebuilt"
    stale = state_dir / "view.fold" / "1"
    stale.mkdir(parents=True)
    (stale / f"{vf.SEGMENTS}.sst").write_bytes(b"a table of a load cut short")
    large: list[bool] = []
    start_reading = MetadataApplier._start_reading

    def recorded(self: MetadataApplier, starts: dict[int, int]) -> bool:
        large.append(start_reading(self, starts))
        return large[-1]

    monkeypatch.setattr(MetadataApplier, "_start_reading", recorded)
    rebuilt = make_manager(broker_id=1, state_dir=state_dir, partitions=2, **WINDOWED)
    register(rebuilt, *tps)  # watched from the start: their lookups must see the worker's partitions too
    assert large == [True]  # the worker started before the backlog was read, from the topic's offsets
    assert_rebuilt_like(rebuilt, writer, tps)
    assert commits == []  # one load, no commit
    [share] = worker_for_any_window
    assert share is not None and share.partitions and share.tables
    alone = make_manager(broker_id=2, partitions=2, **WINDOWED, **{"apply.rebuild.worker": False})
    alone.wait_caught_up(60)
    assert list(snapshot_entries(rebuilt.view)) == list(snapshot_entries(alone.view))  # bookkeeping rows too
    assert sorted(path.name for path in state_dir.iterdir()) == ["view"]  # no worker's directory left


@pytest.mark.parametrize("fault", ["killed", "stalled", "another release", "no interpreter"])
def test_a_worker_that_fails_leaves_its_share_to_the_applier_and_the_view_is_the_same(
    make_manager: Callable[..., RemoteLogMetadataManager], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, worker_for_any_window: list[fresh_load.WorkerShare | None], fault: str,
) -> None:
    writer, tps = written_history(make_manager, 130)  # on both metadata partitions: both shares hold some
    workers: list[subprocess.Popen[bytes]] = []
    fault_on_handing(monkeypatch, "submit", fault, workers)
    if fault == "stalled":
        monkeypatch.setattr(fresh_load, "WORKER_ANSWER_S", 1.0)
    elif fault == "another release":
        monkeypatch.setattr(fresh_load, "_PROTOCOL", 0)  # the worker, started anew, still says 1
    elif fault == "no interpreter":
        monkeypatch.setattr(sys, "executable", "")
    commits = counting_commits(monkeypatch)
    with caplog.at_level(logging.INFO, logger="rlmm.fresh_load"):
        rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
        register(rebuilt, *tps)
        assert_rebuilt_like(rebuilt, writer, tps)
    assert commits == []  # still one load
    if fault == "no interpreter":
        assert workers == [] and worker_for_any_window == []
        return
    assert worker_for_any_window == [None]
    why = {"killed": "it exited", "stalled": "did not answer in time", "another release": "another tierlog"}[fault]
    assert any(why in r.getMessage() and "folding its share in this process" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert len(workers) == 1 and workers[0].poll() is not None  # gone, not left running (or stopped)


def test_an_unreadable_record_in_the_workers_share_halts_only_its_partition_and_the_rest_loads(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    monkeypatch: pytest.MonkeyPatch, worker_for_any_window: list[fresh_load.WorkerShare | None],
) -> None:
    writer, (broken, healthy) = written_history(make_manager, 140)
    bad_offset = append_garbage(kafka_bootstrap, metadata_topic, broken)
    split = fresh_load.split

    def garbage_to_the_worker(records: Any) -> tuple[list[Any], list[Any]]:
        mine, theirs = split(records)
        return (mine, theirs) if any(r[0] == 0 for r in theirs) else (theirs, mine)

    monkeypatch.setattr(fresh_load, "split", garbage_to_the_worker)
    commits = counting_commits(monkeypatch)
    rebuilt = rebuilt_past_garbage(make_manager, writer, healthy, bad_offset)
    assert commits == []
    [share] = worker_for_any_window
    assert share is not None and list(share.folded.unreadable) == [0]
    assert set(rebuilt.view.segments(broken)) == set(writer.view.segments(broken))


def test_a_record_that_fails_to_apply_in_the_worker_sends_the_window_through_the_commits(
    make_manager: Callable[..., RemoteLogMetadataManager], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, tmp_path: Path, worker_for_any_window: list[fresh_load.WorkerShare | None],
) -> None:
    # The fault, in the worker's process only: a bug in its state machine (no record on a real topic makes a rule
    # raise), planted through a sitecustomize module on the worker's path.
    writer, tps = written_history(make_manager, 150)
    break_the_workers_rules(tmp_path, monkeypatch)
    commits = counting_commits(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="rlmm.applier"):
        rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
        register(rebuilt, *tps)
        assert_rebuilt_like(rebuilt, writer, tps)
    [share] = worker_for_any_window
    assert share is not None and share.folded.failed and "a bug in the worker state machine" in share.folded.failed
    assert commits  # the window went through the commits, where the applier's own rules applied every record
    assert any("replaying the window in commits" in r.getMessage() for r in caplog.records)
    assert rebuilt.metadata_errors() == {}


def test_a_user_partition_on_two_metadata_partitions_is_folded_in_one_process(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    caplog: pytest.LogCaptureFixture, worker_for_any_window: list[fresh_load.WorkerShare | None],
) -> None:
    # A foreign writer that hashes differently put a record of one user partition on the other metadata partition:
    # folded apart, both shares would hold that partition, and one would overwrite the other's.
    writer, (moved, _) = written_history(make_manager, 160)
    stray = segment(moved, 5000, 5001, {0: 5000})
    produce_to(kafka_bootstrap, metadata_topic, 1, [(key_of(stray).encode(), codec.encode(stray))])
    ends: dict[int, int] = {}
    for record in read_topic(kafka_bootstrap, metadata_topic):
        ends[record.partition] = max(ends.get(record.partition, 0), record.offset + 1)
    wait_until(lambda: writer.applied_offsets() == ends, timeout=60, description="the writer applying the stray record")
    with caplog.at_level(logging.WARNING, logger="rlmm.applier"):
        rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
        rebuilt.wait_caught_up(60)
    [share] = worker_for_any_window
    assert share is not None  # it answered, and its share was set aside
    assert any("more than one metadata partition" in r.getMessage() for r in caplog.records)
    assert rebuilt.view_digest() == writer.view_digest()
    assert rebuilt.applied_offsets() == writer.applied_offsets()
    assert stray in rebuilt.view.segments(moved)


def test_without_the_topics_ends_the_worker_starts_once_the_window_holds_enough_records(
    make_manager: Callable[..., RemoteLogMetadataManager], monkeypatch: pytest.MonkeyPatch,
    worker_for_any_window: list[fresh_load.WorkerShare | None],
) -> None:
    writer, tps = written_history(make_manager, 180)
    # As when the ends were not listed: every partition read at once, no worker yet.
    monkeypatch.setattr(MetadataApplier, "_start_reading",
                        lambda self, starts: self._consumer.assign(starts) or False)
    rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
    register(rebuilt, *tps)
    assert_rebuilt_like(rebuilt, writer, tps)
    [share] = worker_for_any_window
    assert share is not None and share.partitions
