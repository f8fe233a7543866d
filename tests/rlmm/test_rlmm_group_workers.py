"""A new node's large backlog is read by worker processes (MetadataApplier._load_in_workers): each reads a group of
metadata partitions from Kafka itself, keeps the newest record of each key, folds them and writes their tables; the
applier only ingests them. The view is the one a single process builds; a worker that dies, stalls, is another
release, or cannot write its tables leaves its group to the applier; bad records behave as in one process.
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from rlmm_testkit import (
    WINDOWED,
    append_garbage,
    break_the_workers_rules,
    counting_commits,
    fault_on_handing,
    produce_to,
    read_topic,
    rebuilt_past_garbage,
    register,
    segment,
    written_history,
)
from support import wait_until
from test_rlmm_disk_full import disk_filled, small_disk  # noqa: F401  (small_disk: a fixture, asked for by name)

from rlmm import RemoteLogMetadataManager, applier, codec, fresh_load
from rlmm.applier import MetadataApplier
from rlmm.events import key_of
from rlmm.snapshot import snapshot_entries
from rlmm.types import RemoteLogSegmentState

MakeManager = Callable[..., RemoteLogMetadataManager]


@pytest.fixture(autouse=True)
def every_backlog_large(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fresh_load, "WORKER_MIN_KEPT", 1)
    monkeypatch.setattr(applier, "GROUP_WORKERS", 2)


@pytest.fixture
def handed(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[subprocess.Popen[bytes], list[int]]]]:
    """Each worker process handed a group, and the group's metadata partitions."""
    groups: list[tuple[subprocess.Popen[bytes], list[int]]] = []
    submit = fresh_load.FoldWorker.submit_group

    def recorded(self: fresh_load.FoldWorker, request: fresh_load.GroupRequest, under: Path) -> bool:
        groups.append((self._process, sorted(request.starts)))
        return submit(self, request, under)

    monkeypatch.setattr(fresh_load.FoldWorker, "submit_group", recorded)
    yield groups


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def assert_rebuilt_like(rebuilt: RemoteLogMetadataManager, writer: RemoteLogMetadataManager, tps: Any) -> None:
    rebuilt.wait_caught_up(60)
    assert rebuilt.view_digest() == writer.view_digest()
    assert rebuilt.applied_offsets() == writer.applied_offsets()
    register(rebuilt, *tps)
    for tp in tps:
        wait_until(lambda tp=tp: rebuilt.is_ready(tp), timeout=30, description=f"{tp} ready")
        assert rebuilt.list_remote_log_segments(tp) == writer.list_remote_log_segments(tp)


# The workers read their groups as raw batches (rlmm.raw_fetch), or with the consumer where a client setting is one
# the raw reader does not carry over.
READERS = {"as raw batches": {}, "with the consumer": {"kafka.socket.keepalive.enable": "true"}}


@pytest.mark.parametrize("reader", list(READERS))
def test_a_new_nodes_backlog_read_by_workers_loads_what_one_process_loads(
    make_manager: MakeManager, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    handed: list[tuple[subprocess.Popen[bytes], list[int]]], tmp_path: Path, reader: str,
) -> None:
    writer, tps = written_history(make_manager, 410)
    commits = counting_commits(monkeypatch)
    window = applier.MetadataApplier._fill
    read_here: list[int] = []

    def filled(self: MetadataApplier, *args: Any) -> bool:
        read_here.append(1)
        return bool(window(self, *args))

    monkeypatch.setattr(MetadataApplier, "_fill", filled)
    state_dir = tmp_path / "rebuilt"
    with caplog.at_level(logging.INFO, logger="rlmm.applier"):
        rebuilt = make_manager(broker_id=1, state_dir=state_dir, partitions=2, **WINDOWED, **READERS[reader])
        assert_rebuilt_like(rebuilt, writer, tps)
    assert sorted(partition for _, group in handed for partition in group) == [0, 1]
    assert sum(f"read by a worker ({reader}" in message and "loaded fresh" in message
               for message in messages(caplog)) == 2
    assert commits == [] and read_here == []  # the applier read no record of the backlog, and committed none
    assert all(process.poll() is not None for process, _ in handed)  # the workers exited with the backlog
    assert sorted(path.name for path in state_dir.iterdir()) == ["view"]  # no worker's directory left
    alone = make_manager(broker_id=2, partitions=2, **WINDOWED, **{"apply.rebuild.worker": False})
    alone.wait_caught_up(60)
    assert list(snapshot_entries(rebuilt.view)) == list(snapshot_entries(alone.view))  # bookkeeping rows too


@pytest.mark.parametrize("fault", ["killed", "stalled", "another release", "disk full", "too large"])
def test_a_group_no_worker_loaded_is_read_by_the_applier_and_the_view_is_the_same(
    make_manager: MakeManager, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    handed: list[tuple[subprocess.Popen[bytes], list[int]]], tmp_path: Path, request: pytest.FixtureRequest,
    fault: str,
) -> None:
    writer, tps = written_history(make_manager, 420)
    fault_on_handing(monkeypatch, "submit_group", fault)
    if fault == "stalled":
        monkeypatch.setattr(fresh_load, "GROUP_ANSWER_S", 1.0)
    elif fault == "another release":
        monkeypatch.setattr(fresh_load, "_PROTOCOL", 0)  # the worker, started anew, says its own
    elif fault == "too large":
        monkeypatch.setattr(applier, "GROUP_WORKER_MAX_KEPT", 3)  # each group's window keeps more
    state_dir = tmp_path / "rebuilt"
    if fault == "disk full":
        # The disk is full while the workers first read and write their tables, and has room again once they are done.
        state_dir = request.getfixturevalue("small_disk") / "state"
        load_in_workers = MetadataApplier._load_in_workers

        def on_a_full_disk(self: MetadataApplier) -> None:
            if filled:
                load_in_workers(self)
                return
            filled.append(True)
            with disk_filled(state_dir.parent):
                load_in_workers(self)

        filled: list[bool] = []

        monkeypatch.setattr(MetadataApplier, "_load_in_workers", on_a_full_disk)
    with caplog.at_level(logging.INFO, logger="rlmm.applier"):
        rebuilt = make_manager(broker_id=1, state_dir=state_dir, partitions=2, **WINDOWED)
        assert_rebuilt_like(rebuilt, writer, tps)
    why = {"killed": "it exited", "stalled": "did not load metadata partitions", "another release": "another tierlog",
           "disk full": "No space left on device", "too large": "keeps more than 3 records"}[fault]
    assert any(why in message for message in messages(caplog)), messages(caplog)
    assert rebuilt.metadata_errors() == {}
    for process, _ in handed:
        wait_until(lambda process=process: process.poll() is not None, timeout=10, description="the worker gone")


def test_a_group_too_large_for_a_worker_goes_out_again_in_smaller_groups(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, handed: list[tuple[subprocess.Popen[bytes], list[int]]],
) -> None:
    """A group is sized on the share of records the groups before it kept. Where that understated it (at 10M live
    segments, a node hosting one small partition: the group loaded ahead for it kept 401 records of a metadata
    partition that keeps 205k, and the next group, four such partitions, kept more than a worker's 300k), the worker
    answers that the group keeps too many records: its partitions go out again in smaller groups, to the same worker,
    and the applier reads none of them itself (it used to read the whole group itself and close the worker)."""
    writer, tps = written_history(make_manager, 430)
    records = read_topic(kafka_bootstrap, metadata_topic)
    keys = max(len({record.key for record in records if record.partition == partition}) for partition in (0, 1))
    monkeypatch.setattr(applier, "GROUP_WORKERS", 1)
    # Each partition alone fits in a worker's group (a window keeps a record per key at most), the two together do
    # not (here); and as in production, that is more than a group's room (GROUP_FILL * WINDOW_MAX_KEPT).
    monkeypatch.setattr(applier, "GROUP_WORKER_MAX_KEPT", keys)
    monkeypatch.setattr(applier, "WINDOW_MAX_KEPT", keys // 3)
    take_into = MetadataApplier._take_into

    def both_at_first(self: MetadataApplier, group: set[int], kept: int, kept_share: float | None) -> list[int]:
        if kept_share is None:  # an understated share, as from a group loaded ahead for one small partition
            kept_share = 0.0
        return take_into(self, group, kept, kept_share)

    monkeypatch.setattr(MetadataApplier, "_take_into", both_at_first)
    commits = counting_commits(monkeypatch)
    with caplog.at_level(logging.INFO, logger="rlmm.applier"):
        rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
        assert_rebuilt_like(rebuilt, writer, tps)
    assert [group for _, group in handed] == [[0, 1], [0], [1]]
    assert len({process.pid for process, _ in handed}) == 1, "the same worker throughout"
    assert any("keep more than" in message and "handed out again in smaller groups" in message
               for message in messages(caplog)), messages(caplog)
    assert not any("reading them in this process" in message for message in messages(caplog))
    assert commits == []  # the applier read no record of the backlog itself


def test_an_unreadable_record_in_a_workers_group_halts_only_its_partition(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer, (broken, healthy) = written_history(make_manager, 430)
    bad_offset = append_garbage(kafka_bootstrap, metadata_topic, broken)
    commits = counting_commits(monkeypatch)
    with caplog.at_level(logging.INFO, logger="rlmm.applier"):
        rebuilt = rebuilt_past_garbage(make_manager, writer, healthy, bad_offset)
    assert commits == []  # halted by the worker's group, not read again here
    # Each group read by a worker (the healthy partition's, registered, loaded ahead of the rest of its group).
    assert sum("read by a worker" in message and "the rest loaded" not in message
               for message in messages(caplog)) == 2
    assert set(rebuilt.view.segments(broken)) == set(writer.view.segments(broken))


def test_a_record_that_fails_to_apply_in_a_worker_sends_its_group_through_the_applier(
    make_manager: MakeManager, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path,
) -> None:
    # The fault, in the workers' processes only: a bug in their state machine (no record on a real topic makes a
    # rule raise), planted through a sitecustomize module on their path.
    writer, tps = written_history(make_manager, 440)
    break_the_workers_rules(tmp_path, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="rlmm.applier"):
        rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
        assert_rebuilt_like(rebuilt, writer, tps)
    assert any("a bug in the worker state machine" in message and "in this process" in message
               for message in messages(caplog)), messages(caplog)
    assert rebuilt.metadata_errors() == {}


def test_a_group_with_records_of_a_user_partition_loaded_before_is_read_by_the_applier(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture, handed: list[tuple[subprocess.Popen[bytes], list[int]]],
) -> None:
    # One worker: the groups load one after the other, metadata partition 0's first.
    monkeypatch.setattr(applier, "GROUP_WORKERS", 1)
    writer, (first, second) = written_history(make_manager, 450)
    # A segment of `first` (whose records go to metadata partition 0) on metadata partition 1, as a foreign or broken
    # writer would put it: the worker folding partition 1 would fold it without the segments before it.
    started = segment(first, 10**6, 10**6 + 9, {0: 10**6})
    strayed = replace(started, state=RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
    produce_to(kafka_bootstrap, metadata_topic, 1,
               [(key_of(md).encode(), codec.encode(md)) for md in (started, strayed)])
    writer.wait_caught_up(60)
    assert strayed in writer.list_remote_log_segments(first)
    commits = counting_commits(monkeypatch)
    with caplog.at_level(logging.INFO, logger="rlmm.applier"):
        rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
        assert_rebuilt_like(rebuilt, writer, (first, second))
    assert [group for _, group in handed] == [[0], [1]]
    assert sum("read by a worker" in message for message in messages(caplog)) == 1
    assert any("metadata partitions [1] have records on metadata partitions loaded before" in message
               for message in messages(caplog)), messages(caplog)
    assert commits  # partition 1 was read and applied here
