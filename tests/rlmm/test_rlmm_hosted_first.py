"""A new node loads the partitions its broker hosts first (MetadataApplier._load_in_workers): each group of metadata
partitions goes to a worker with the hosted partitions among its user partitions, and the worker keeps and loads
their records alone; they are ready then, answering as the writer does, though no offset of their metadata
partitions is written. Once every group had its first load, each goes out
again for the rest, whose load writes the offsets. Where the hosted partitions are half of a group's partitions or more
(as the groups loaded before tell), the group is loaded at once. The view is then the one a load of whole groups
builds. A node stopped in between removes what it loaded ahead when it starts again; a group whose rest no worker
loads is taken back (its partitions not ready meanwhile) and read by the applier.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rlmm_testkit import WINDOWED, make_tp, manager_config, register, written_history
from support import wait_until

from rlmm import RemoteLogMetadataManager, TopicIdPartition, applier, fresh_load
from rlmm import view_format as vf
from rlmm.applier import MetadataApplier
from rlmm.events import metadata_partition_for

MakeManager = Callable[..., RemoteLogMetadataManager]
HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def every_backlog_large(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fresh_load, "WORKER_MIN_KEPT", 1)
    monkeypatch.setattr(applier, "GROUP_WORKERS", 2)


def three_on_each() -> list[TopicIdPartition]:
    """Six user partitions, three on each metadata partition of a two-partition topic (0, 0, 0, 1, 1, 1)."""
    found: dict[int, list[TopicIdPartition]] = {0: [], 1: []}
    while min(map(len, found.values())) < 3:
        tp = make_tp("hosted-first", len(found[0]) + len(found[1]))
        on = found[metadata_partition_for(tp.topic_id, tp.partition, 2)]
        if len(on) < 3:
            on.append(tp)
    return [*found[0], *found[1]]


@pytest.fixture
def registered_first(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Set once the test registered its partitions: the load hands its first group out after that, as a broker that
    registers its partitions before the workers start would see it."""
    registered = threading.Event()
    hosted = MetadataApplier._hosted

    def after_registration(self: MetadataApplier, *args: Any) -> dict[int, set[bytes]]:
        registered.wait(60)
        return hosted(self, *args)

    monkeypatch.setattr(MetadataApplier, "_hosted", after_registration)
    yield registered
    registered.set()


@pytest.fixture
def rest_held(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The rest of each group loaded ahead goes to its worker only once this is set (until then the worker is busy
    with it as far as the node can tell)."""
    release = threading.Event()
    submit = fresh_load.FoldWorker.submit_group
    held: list[threading.Thread] = []

    def later(self: fresh_load.FoldWorker, request: fresh_load.GroupRequest, under: Path) -> bool:
        if request.rest_of is None:
            return submit(self, request, under)
        held.append(threading.Thread(target=lambda: release.wait(60) and submit(self, request, under), daemon=True))
        held[-1].start()
        return True

    monkeypatch.setattr(fresh_load.FoldWorker, "submit_group", later)
    yield release
    release.set()
    for thread in held:
        thread.join(60)


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


def assert_answers_like(node: RemoteLogMetadataManager, writer: RemoteLogMetadataManager,
                        tps: list[TopicIdPartition]) -> None:
    for tp in tps:
        listed = writer.list_remote_log_segments(tp)
        assert listed and node.list_remote_log_segments(tp) == listed
        for md in listed:
            for epoch in md.segment_leader_epochs:
                assert node.remote_log_segment_metadata(tp, epoch, md.start_offset) == \
                    writer.remote_log_segment_metadata(tp, epoch, md.start_offset)
            assert node.highest_offset_for_epoch(tp, max(md.segment_leader_epochs)) == \
                writer.highest_offset_for_epoch(tp, max(md.segment_leader_epochs))


def test_the_partitions_a_new_node_hosts_are_ready_before_the_rest_of_its_backlog_is_loaded(
    make_manager: MakeManager, caplog: pytest.LogCaptureFixture, registered_first: threading.Event,
    rest_held: threading.Event,
) -> None:
    writer, tps = written_history(make_manager, 470, three_on_each(), uploads=6)
    hosted = [tps[0], tps[3]]  # a third of each group's records
    with caplog.at_level(logging.INFO, logger="rlmm.applier"):
        rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
        rebuilt.on_partition_leadership_changes(set(hosted), set())
        registered_first.set()
        for tp in hosted:
            wait_until(lambda tp=tp: rebuilt.is_ready(tp), timeout=60, description=f"{tp} ready")
        # Ready while the rest of both groups waits: no offset is written, the other partitions are not loaded.
        assert rebuilt.applied_offsets() == {}
        assert sorted(rebuilt.view.preloaded()) == sorted(vf.tp_key_of(tp) for tp in hosted)
        assert set(rebuilt.view.user_partitions()) == set(hosted)
        assert_answers_like(rebuilt, writer, hosted)
        rest_held.set()
        rebuilt.wait_caught_up(60)
        wait_until(lambda: sum("the rest loaded" in message for message in messages(caplog)) == 2, timeout=10,
                   description="the groups' lines logged")  # each once its offsets are written
    assert rebuilt.view_digest() == writer.view_digest()
    assert rebuilt.applied_offsets() == writer.applied_offsets()
    assert rebuilt.view.preloaded() == []
    register(rebuilt, *tps)
    assert_answers_like(rebuilt, writer, list(tps))
    loaded = messages(caplog)
    assert sum("those of the 1 partitions hosted loaded ahead" in message for message in loaded) == 2, loaded
    assert sum("the rest loaded" in message for message in loaded) == 2, loaded


def test_the_metadata_partitions_of_the_hosted_partitions_are_handed_out_first(
    make_manager: MakeManager, monkeypatch: pytest.MonkeyPatch, registered_first: threading.Event,
) -> None:
    # A node hosting partitions of its last metadata partitions only is ready once those are loaded, not after every
    # group before them.
    writer, tps = written_history(make_manager, 470, three_on_each(), uploads=6)
    handed: list[tuple[list[int], bool]] = []
    submit = fresh_load.FoldWorker.submit_group

    def noted(self: fresh_load.FoldWorker, request: fresh_load.GroupRequest, under: Path) -> bool:
        handed.append((sorted(request.starts), bool(request.first)))
        return submit(self, request, under)

    monkeypatch.setattr(fresh_load.FoldWorker, "submit_group", noted)
    rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
    rebuilt.on_partition_leadership_changes({tps[3]}, set())  # on metadata partition 1
    registered_first.set()
    wait_until(lambda: rebuilt.is_ready(tps[3]), timeout=60, description=f"{tps[3]} ready")
    rebuilt.wait_caught_up(60)
    assert handed[0] == ([1], True), handed  # read first, for its hosted partition
    assert ([0], False) in handed, handed  # none hosted: loaded whole, after
    assert rebuilt.view_digest() == writer.view_digest()
    assert_answers_like(rebuilt, writer, [tps[3]])


def test_a_group_whose_hosted_partitions_are_most_of_its_partitions_is_loaded_at_once(
    make_manager: MakeManager, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    registered_first: threading.Event,
) -> None:
    monkeypatch.setattr(applier, "GROUP_WORKERS", 1)  # one group after the other: the first tells the second
    writer, tps = written_history(make_manager, 480, three_on_each(), uploads=6)
    with caplog.at_level(logging.INFO, logger="rlmm.applier"):
        rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
        rebuilt.on_partition_leadership_changes(set(tps[:2]) | set(tps[3:5]), set())  # two of each group's three
        registered_first.set()
        rebuilt.wait_caught_up(60)
        wait_until(lambda: any("the rest loaded" in message for message in messages(caplog)), timeout=10,
                   description="the last group's line logged")  # once its offsets are written
    assert rebuilt.view_digest() == writer.view_digest()
    loaded = messages(caplog)
    # Nothing is known of the first group's partitions: its hosted ones are loaded ahead; they are two of its three,
    # and the second group is loaded at once.
    assert [("those of the 2 partitions hosted loaded ahead" in message, "the rest loaded" in message,
             "loaded fresh" in message) for message in loaded if "read by a worker" in message] == \
        [(True, False, False), (False, False, True), (False, True, False)], loaded


def test_a_group_whose_rest_no_worker_loads_is_taken_back_and_read_by_the_applier(
    make_manager: MakeManager, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    registered_first: threading.Event,
) -> None:
    writer, tps = written_history(make_manager, 490, three_on_each(), uploads=6)
    hosted = [tps[0], tps[3]]
    submit = fresh_load.FoldWorker.submit_group

    def refused_for_the_rest(self: fresh_load.FoldWorker, request: fresh_load.GroupRequest, under: Path) -> bool:
        if request.rest_of is not None:  # as a worker that cannot be handed anything more (a full disk)
            self.close()
            return False
        return submit(self, request, under)

    monkeypatch.setattr(fresh_load.FoldWorker, "submit_group", refused_for_the_rest)
    with caplog.at_level(logging.INFO, logger="rlmm"):
        rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
        rebuilt.on_partition_leadership_changes(set(hosted), set())
        registered_first.set()
        rebuilt.wait_caught_up(60)
    assert rebuilt.view_digest() == writer.view_digest()
    assert rebuilt.view.preloaded() == []
    loaded = messages(caplog)
    assert sum("hosted loaded ahead" in message for message in loaded) == 2, loaded
    assert sum("removing 1 user partitions loaded ahead" in message for message in loaded) == 2, loaded
    assert all(rebuilt.is_ready(tp) for tp in hosted)
    assert_answers_like(rebuilt, writer, hosted)


def test_a_node_killed_after_loading_ahead_removes_what_it_loaded_and_rebuilds_the_same_view(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    writer, tps = written_history(make_manager, 500, three_on_each(), uploads=6)
    hosted = [tps[0], tps[3]]  # a third of each group: the first loaded whole, the second's rest never
    state_dir = tmp_path / "killed"
    config = manager_config(kafka_bootstrap, state_dir, metadata_topic, partitions=2, broker_id=1, **WINDOWED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1]), str(HERE.parent), str(HERE)])}
    child = subprocess.Popen(
        [sys.executable, str(HERE / "ahead_node.py"), json.dumps(config),
         json.dumps([[str(tp.topic_id), tp.topic, tp.partition] for tp in hosted])],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None and child.stderr is not None
        if child.stdout.readline().strip() != "READY":
            child.wait(timeout=30)
            pytest.fail(f"the node did not load its hosted partitions: {child.stderr.read()[-3000:]}")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    with caplog.at_level(logging.WARNING, logger="rlmm"):
        restarted = make_manager(broker_id=1, state_dir=state_dir, partitions=2, **WINDOWED)
        restarted.wait_caught_up(60)
    assert any("removing 1 user partitions loaded ahead" in message for message in messages(caplog)), messages(caplog)
    assert restarted.view_digest() == writer.view_digest()
    assert restarted.applied_offsets() == writer.applied_offsets()
    register(restarted, *tps)
    assert_answers_like(restarted, writer, list(tps))
