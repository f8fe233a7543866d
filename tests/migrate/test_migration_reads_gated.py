"""A node in migration mode refuses reads of a partition it took over until its import has brought in what the
partition's predecessor wrote to `__remote_log_metadata`, with the retriable error TBRLMM raises for a partition it has
not loaded yet (RemoteStorageNotReadyError, the broker's ReplicaNotAvailable), and without waiting for the import.

The import is held back on demand (the one stand-in here: a lagging import cannot be made on demand otherwise); Kafka,
the source topic and tierlog's topic are the real ones."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from migrate_testkit import SOURCE_PARTITIONS, kafka_model, produce_history, workload_history
from rlmm_testkit import call_error, make_tp, manager_config

from dev.process import wait_until
from rlmm import RemoteLogMetadataManager
from rlmm.errors import RemoteResourceNotFoundError, RemoteStorageNotReadyError
from rlmm.types import TopicIdPartition
from tierlog.migration.node import MigratingManager, split_config, wrap

DEADLINE_S = 30.0
READ_BOUND_S = 5.0  # far below the time the import is held: a refused read did not wait for the import


def reads(node: MigratingManager, tp: TopicIdPartition) -> dict[str, Callable[[], Any]]:
    """Every read a broker makes of `tp`."""
    return {
        "remote_log_segment_metadata": lambda: node.remote_log_segment_metadata(tp, 0, 0),
        "list_remote_log_segments": lambda: node.list_remote_log_segments(tp),
        "list_remote_log_segments of an epoch": lambda: node.list_remote_log_segments(tp, 0),
        "highest_offset_for_epoch": lambda: node.highest_offset_for_epoch(tp, 0),
        "remote_log_size": lambda: node.remote_log_size(tp, 0),
        "next_segment_with_txn_index": lambda: node.next_segment_with_txn_index(tp, 0, 0),
    }


@pytest.fixture
def held_import(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Nodes started in the test import nothing until the returned event is set (at most DEADLINE_S)."""
    release = threading.Event()
    import_batch = MigratingManager._import_batch

    def held(self: MigratingManager, messages: list[Any]) -> bool:
        release.wait(DEADLINE_S)
        return import_batch(self, messages)

    monkeypatch.setattr(MigratingManager, "_import_batch", held)
    return release


@pytest.fixture
def node(kafka_bootstrap: str, create_topic: Callable[..., str], unique_topic: str, tmp_path: Path,
         held_import: threading.Event) -> Iterator[MigratingManager]:
    """A node in migration mode over a source topic of its own (`node.source_topic`), its import held."""
    config = manager_config(kafka_bootstrap, tmp_path, unique_topic, partitions=3, **{
        "migration.mode": "dual-write", "migration.source.topic": create_topic(partitions=SOURCE_PARTITIONS),
        "migration.control.topic": f"{unique_topic}-control", "migration.heartbeat.ms": 200})
    own, migration = split_config(config)
    started = wrap(RemoteLogMetadataManager(own), own, migration)
    assert isinstance(started, MigratingManager)
    yield started
    held_import.set()
    started.close()


def test_reads_of_a_partition_taken_over_are_refused_as_not_ready_until_its_predecessors_writes_are_imported(
        kafka_bootstrap: str, node: MigratingManager, held_import: threading.Event) -> None:
    history = workload_history(seed=11, partitions=2, uploads=6)
    tp = history[0].topic_id_partition
    produce_history(kafka_bootstrap, node.source_topic, history)  # the predecessor, on TBRLMM, wrote these
    node.on_partition_leadership_changes([tp], [])
    # tierlog's manager loads the partition first (refusing reads its own way meanwhile); then migration mode's gate.
    wait_until(lambda: "migration mode" in str(call_error(reads(node, tp)["list_remote_log_segments"])),
               timeout=DEADLINE_S, description=f"the manager's own registration of {tp}")
    for name, read in reads(node, tp).items():
        started = time.monotonic()
        with pytest.raises(RemoteStorageNotReadyError, match=rf"{re.escape(str(tp))}.* migration mode has not"):
            read()
        assert time.monotonic() - started < READ_BOUND_S, f"{name} waited for the import"
    assert not node.is_ready(tp)
    with pytest.raises(RemoteResourceNotFoundError):  # not registered here: the manager's own answer
        node.list_remote_log_segments(make_tp("elsewhere", 0))

    held_import.set()
    wait_until(lambda: node.is_ready(tp), timeout=DEADLINE_S, description=f"{tp} ready")
    model = kafka_model([call for call in history if call.topic_id_partition == tp])
    assert node.list_remote_log_segments(tp) == model.list_remote_log_segments(tp) != []
    assert node.highest_offset_for_epoch(tp, 0) == model.highest_offset_for_epoch(tp, 0)


def test_a_read_passes_the_gate_itself_when_nothing_is_left_to_import(node: MigratingManager) -> None:
    """The broker's fetch path reads without asking is_ready first: the read checks the gate, within its bound."""
    tp = make_tp("nothing-to-import", 0)
    node.on_partition_leadership_changes([tp], [])
    wait_until(lambda: node.list_remote_log_segments(tp) == [], timeout=DEADLINE_S,
               description=f"{tp} readable")  # the manager's own registration first (retriable meanwhile)
    assert all(read() in ([], None, 0) for read in reads(node, tp).values())
