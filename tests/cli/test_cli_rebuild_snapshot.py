"""`tierlog rebuild --snapshot FILE` against the real Kafka broker: a snapshot of the same topic is trusted and
tailed from its end offsets; a foreign, stale or unlabelled one is refused, saying why, and the node is rebuilt
from the topic instead."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cli_testkit import MetadataTopic, Run
from confluent_kafka.admin import AdminClient

from rlmm.event_log import TopicInfo, check_topic
from rlmm.snapshot import snapshot_entries, write_view_snapshot
from rlmm.view import MetadataView
from tierlog.pipeline.generate import fold

Tierlog = Callable[..., Run]
# The manager's log line when it discards a view instead of resuming it (rlmm.manager._resumable).
DISCARDED = "rebuilding the metadata view"


@pytest.fixture(scope="module")
def topic_info(metadata_topic: MetadataTopic) -> TopicInfo:
    return check_topic(AdminClient({"bootstrap.servers": metadata_topic.bootstrap}), metadata_topic.name, 3, 30)


@pytest.fixture(scope="module")
def source_view(metadata_topic: MetadataTopic, tierlog: Tierlog, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dir rebuilt from the topic: the view the snapshots below are taken of."""
    state_dir = tmp_path_factory.mktemp("source") / "state"
    run = tierlog("rebuild", "--state-dir", str(state_dir), "--json", *metadata_topic.options())
    assert run.returncode == 0, run.stderr
    return state_dir


def _snapshot(path: Path, state_dir: Path, topic: str, topic_id: str | None, created_ms: int | None) -> Path:
    view = MetadataView.open(state_dir, read_only=True)
    try:
        with path.open("wb") as out:
            write_view_snapshot(out, topic, snapshot_entries(view), view.applied_offsets(topic), view.digest(),
                                topic_id, created_ms)
    finally:
        view.close()
    return path


def _rebuild(tierlog: Tierlog, metadata_topic: MetadataTopic, snapshot: Path, tmp_path: Path) -> tuple[Run, Any]:
    run = tierlog("rebuild", "--snapshot", str(snapshot), "--state-dir", str(tmp_path / "node"), "--json",
                  *metadata_topic.options())
    assert run.returncode == 0, run.stderr
    return run, run.json()


def test_a_snapshot_of_the_same_topic_is_trusted_and_tailed_not_discarded(
    metadata_topic: MetadataTopic, topic_info: TopicInfo, source_view: Path, tierlog: Tierlog, tmp_path: Path,
) -> None:
    snapshot = _snapshot(tmp_path / "s.avro", source_view, metadata_topic.name, topic_info.topic_id,
                         int(time.time() * 1000))
    run, result = _rebuild(tierlog, metadata_topic, snapshot, tmp_path)
    assert result["source"] == "snapshot"
    assert "snapshot_refused" not in result
    assert DISCARDED not in run.stderr
    assert result["digest"] == fold(metadata_topic.records).digest()


@pytest.mark.parametrize("label, topic_id, age_ms, why", [
    ("foreign", "AAAAAAAAAAAAAAAAAAAAAA", 0, "foreign: it was taken of topic id AAAAAAAAAAAAAAAAAAAAAA"),
    ("stale", None, 60_000, "stale: taken"),
    ("unlabelled", None, None, "names no metadata topic id"),
])
def test_a_foreign_stale_or_unlabelled_snapshot_is_refused_naming_why_and_the_topic_rebuilds_the_node(
    metadata_topic: MetadataTopic, topic_info: TopicInfo, source_view: Path, tierlog: Tierlog, tmp_path: Path,
    label: str, topic_id: str | None, age_ms: int | None, why: str,
) -> None:
    created = None
    if age_ms is not None:
        topic_id = topic_id or topic_info.topic_id
        # "stale": older than the topic keeps tombstones.
        created = int(time.time() * 1000) - (topic_info.delete_retention_ms + age_ms if label == "stale" else 0)
    snapshot = _snapshot(tmp_path / "s.avro", source_view, metadata_topic.name, topic_id, created)
    run, result = _rebuild(tierlog, metadata_topic, snapshot, tmp_path)
    assert result["source"] == "topic"
    assert why in result["snapshot_refused"]
    assert f"snapshot {snapshot} is not used: it " in run.stderr and why in run.stderr
    assert result["digest"] == fold(metadata_topic.records).digest()


def test_a_snapshot_loads_without_kafka_when_told_not_to_catch_up(
    metadata_topic: MetadataTopic, topic_info: TopicInfo, source_view: Path, tierlog: Tierlog, tmp_path: Path,
) -> None:
    snapshot = _snapshot(tmp_path / "s.avro", source_view, metadata_topic.name, topic_info.topic_id,
                         int(time.time() * 1000))
    with socket.socket() as probe:  # a port nobody listens on: no Kafka at all
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    run = tierlog("rebuild", "--snapshot", str(snapshot), "--no-catch-up", "--state-dir", str(tmp_path / "node"),
                  "--json", "-o", f"bootstrap.servers=127.0.0.1:{closed}")
    assert run.returncode == 0, run.stderr
    assert run.json()["digest"] == fold(metadata_topic.records).digest()  # type: ignore[index]
