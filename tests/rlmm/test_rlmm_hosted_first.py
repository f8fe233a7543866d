"""A new node loads the partitions its broker hosts first (MetadataApplier._load_in_workers): each group of metadata
partitions goes to a worker with the hosted partitions among its user partitions, and where the others hold most of
its records, the worker loads the hosted partitions' records alone; they are ready then, answering as the writer
does, though no offset of their metadata partitions is written. Once every group had its first load, each goes out
again for the rest, whose load writes the offsets. The view is then the one a load of whole groups builds. A node
stopped in between removes what it loaded ahead when it starts again; a group whose rest no worker loads is taken
back (its partitions not ready meanwhile) and read by the applier.
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

    def after_registration(self: MetadataApplier, *args: Any) -> frozenset[bytes]:
        registered.wait(60)
        return hosted(self, *args)

    monkeypatch.setattr(MetadataApplier, "_hosted", after_registration)
    yield registered
    registered.set()


@pytest.fixture
def rest_held(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """The rest of each group loaded ahead waits until this is set."""
    release = threading.Event()
    load_group = MetadataApplier._load_group

    def held(self: MetadataApplier, *args: Any) -> bool:
        if args[-1] is not None:  # `completes`: the rest of a group whose hosted partitions were loaded ahead
            release.wait(60)
        return bool(load_group(self, *args))

    monkeypatch.setattr(MetadataApplier, "_load_group", held)
    yield release
    release.set()


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
    assert rebuilt.view_digest() == writer.view_digest()
    assert rebuilt.applied_offsets() == writer.applied_offsets()
    assert rebuilt.view.preloaded() == []
    register(rebuilt, *tps)
    assert_answers_like(rebuilt, writer, list(tps))
    loaded = messages(caplog)
    assert sum("those of the 1 partitions hosted loaded ahead" in message for message in loaded) == 2, loaded
    assert sum("the rest loaded" in message for message in loaded) == 2, loaded


def test_a_group_whose_hosted_partitions_hold_most_of_it_is_loaded_at_once(
    make_manager: MakeManager, caplog: pytest.LogCaptureFixture, registered_first: threading.Event,
) -> None:
    writer, tps = written_history(make_manager, 480, three_on_each(), uploads=6)
    with caplog.at_level(logging.INFO, logger="rlmm.applier"):
        rebuilt = make_manager(broker_id=1, partitions=2, **WINDOWED)
        rebuilt.on_partition_leadership_changes(set(tps[:2]) | set(tps[3:5]), set())  # two thirds of each group
        registered_first.set()
        rebuilt.wait_caught_up(60)
    assert rebuilt.view_digest() == writer.view_digest()
    loaded = messages(caplog)
    assert sum("loaded fresh" in message for message in loaded) == 2, loaded
    assert not any("ahead" in message for message in loaded), loaded


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
    hosted = [tps[0], tps[1], tps[3]]  # most of the first group (loaded at once), a third of the second (ahead)
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
