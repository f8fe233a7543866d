"""The applier's robustness: a record that fails to apply halts only its metadata partition, and a node whose
view could miss or misread records (too old for the tombstone window, topic recreated, offset off the log)
rebuilds from scratch instead of resuming."""

from __future__ import annotations

import logging
import struct
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic
from rlmm_testkit import WRITE_TIMEOUT_S, make_tp, register, segment
from support import wait_until

from rlmm import MetadataLogError, RemoteLogMetadataManager, TopicIdPartition
from rlmm.event_log import OffsetReader
from rlmm.events import metadata_partition_for
from rlmm.state import Outcome
from rlmm.view import ConsumedRecord, MetadataView, ViewBatch

MakeManager = Callable[..., RemoteLogMetadataManager]
EIGHT_DAYS_MS = 8 * 24 * 3600 * 1000


def tp_in(metadata_partition: int, partitions: int, topic: str) -> TopicIdPartition:
    while True:
        tp = make_tp(topic)
        if metadata_partition_for(tp.topic_id, tp.partition, partitions) == metadata_partition:
            return tp


def test_a_record_that_fails_to_apply_halts_only_its_metadata_partition_naming_it(
    make_manager: MakeManager, metadata_topic: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    poisoned = uuid.uuid4()
    apply = ViewBatch.apply

    # A fault no valid record produces on demand: the view's key packing failing for one segment.
    def failing_apply(self: ViewBatch, record: ConsumedRecord) -> Outcome:
        segment_id = getattr(record.event, "remote_log_segment_id", None)
        if segment_id is not None and segment_id.id == poisoned:
            raise struct.error("'>i' format requires -2147483648 <= number <= 2147483647")
        return apply(self, record)

    monkeypatch.setattr(ViewBatch, "apply", failing_apply)
    manager = make_manager(partitions=2)
    bad_tp, good_tp = tp_in(0, 2, "bad"), tp_in(1, 2, "good")
    register(manager, bad_tp, good_tp)
    manager.add_remote_log_segment_metadata(segment(bad_tp, 0, 9, {0: 0})).result(timeout=WRITE_TIMEOUT_S)

    future = manager.add_remote_log_segment_metadata(segment(bad_tp, 10, 19, {0: 10}, segment_id=poisoned))
    with pytest.raises(MetadataLogError, match=rf"{metadata_topic} partition 0 offset \d+: cannot apply record"):
        future.result(timeout=WRITE_TIMEOUT_S)
    assert set(manager.metadata_errors()) == {0}
    with pytest.raises(MetadataLogError):
        manager.list_remote_log_segments(bad_tp)

    manager.add_remote_log_segment_metadata(segment(good_tp, 0, 9, {0: 0})).result(timeout=WRITE_TIMEOUT_S)
    assert len(manager.list_remote_log_segments(good_tp)) == 1
    assert not [r for r in caplog.records if "applier" in r.getMessage() and "retrying" in r.getMessage()]


def write_one(manager: RemoteLogMetadataManager) -> TopicIdPartition:
    tp = make_tp("resume")
    register(manager, tp)
    manager.add_remote_log_segment_metadata(segment(tp, 0, 9, {0: 0})).result(timeout=WRITE_TIMEOUT_S)
    return tp


def restart_logs(make_manager: MakeManager, state_dir: Path, caplog: pytest.LogCaptureFixture
                 ) -> tuple[RemoteLogMetadataManager, list[str]]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="rlmm.manager"):
        manager = make_manager(state_dir=state_dir)
    return manager, [r.getMessage() for r in caplog.records if "rebuilding the metadata view" in r.getMessage()]


def test_a_view_resumes_when_nothing_makes_it_unsafe(
    make_manager: MakeManager, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = make_manager(state_dir=tmp_path / "node")
    write_one(first)
    first.close()
    _, rebuilt = restart_logs(make_manager, tmp_path / "node", caplog)
    assert rebuilt == []


def test_a_view_older_than_the_tombstone_window_is_rebuilt(
    make_manager: MakeManager, metadata_topic: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = make_manager(state_dir=tmp_path / "node")
    tp = write_one(first)
    first.close()
    # The node was offline for eight days: more than the topic keeps tombstones.
    view = MetadataView.open(tmp_path / "node")
    source = view.source(metadata_topic)
    assert source is not None
    view.set_source(metadata_topic, source[0], source[1] - EIGHT_DAYS_MS)
    view.close()

    restarted, rebuilt = restart_logs(make_manager, tmp_path / "node", caplog)
    assert len(rebuilt) == 1 and "delete.retention.ms" in rebuilt[0]
    register(restarted, tp)
    restarted.wait_caught_up(30)
    fresh = make_manager(broker_id=7)
    fresh.wait_caught_up(30)
    assert restarted.view_digest() == fresh.view_digest()


def test_a_view_whose_stored_offset_is_off_the_log_is_rebuilt(
    make_manager: MakeManager, metadata_topic: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = make_manager(state_dir=tmp_path / "node")
    write_one(first)
    first.close()
    view = MetadataView.open(tmp_path / "node")
    view.batch().commit(metadata_topic, {0: 1_000_000})
    view.close()

    restarted, rebuilt = restart_logs(make_manager, tmp_path / "node", caplog)
    assert len(rebuilt) == 1 and "outside the log" in rebuilt[0]
    restarted.wait_caught_up(30)
    assert restarted.applied_offsets()[0] < 1_000_000


def test_a_view_of_a_recreated_topic_is_rebuilt_and_forgets_the_old_topic(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first = make_manager(state_dir=tmp_path / "node")
    tp = write_one(first)
    first.close()
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.delete_topics([metadata_topic], operation_timeout=30)[metadata_topic].result(timeout=30)
    wait_until(lambda: metadata_topic not in admin.list_topics(timeout=10).topics, timeout=30,
               description="the metadata topic deleted")

    restarted = wait_until(lambda: restart_logs(make_manager, tmp_path / "node", caplog), timeout=60,
                           description="a manager on the recreated topic")
    manager, rebuilt = restarted
    assert len(rebuilt) == 1 and "recreated" in rebuilt[0]
    register(manager, tp)
    assert manager.list_remote_log_segments(tp) == []


def test_the_metadata_topic_is_created_with_explicit_compaction_and_tombstone_settings(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str
) -> None:
    make_manager(**{"metadata.topic.delete.retention.ms": 5000, "metadata.topic.segment.ms": 60_000})
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, metadata_topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    assert configs["delete.retention.ms"].value == "5000"
    assert configs["segment.ms"].value == "60000"
    assert configs["cleanup.policy"].value == "compact"


def test_a_new_node_whose_listed_log_start_is_not_on_the_log_reads_from_the_beginning_instead_of_halting(
    make_manager: MakeManager, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node with nothing applied starts each metadata partition at the log start it lists (instead of letting the
    client look it up, half a second later). Should that offset not be on the log when the client fetches it (a
    fault forced here: a compacted topic's start does not move), the node has stored nothing there to lose and
    reads from the beginning, rather than halting as a node whose stored position fell off does."""
    writer = make_manager()
    written = [write_one(writer) for _ in range(3)]
    writer.wait_caught_up(30)
    monkeypatch.setattr(OffsetReader, "start_offsets",
                        lambda self, partitions, timeout_s: dict.fromkeys(partitions, 10**9))
    reader = make_manager(broker_id=1)
    for tp in written:
        register(reader, tp)
    assert reader.metadata_errors() == {}
    assert [len(reader.list_remote_log_segments(tp)) for tp in written] == [1, 1, 1]


def test_a_running_node_whose_position_falls_off_the_log_halts_that_partition_instead_of_jumping(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str
) -> None:
    manager = make_manager()
    write_one(manager)
    write_one(manager)
    manager.wait_caught_up(30)
    # The topic is recreated under the running node: its position lies past the new, empty log's end.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.delete_topics([metadata_topic], operation_timeout=30)[metadata_topic].result(timeout=30)
    wait_until(lambda: metadata_topic not in admin.list_topics(timeout=10).topics, timeout=30,
               description="the metadata topic deleted")
    configs = {"cleanup.policy": "compact"}
    wait_until(lambda: admin.create_topics([NewTopic(metadata_topic, 1, 1, config=configs)])[metadata_topic]
               .result(timeout=30) or True, timeout=30, description="the metadata topic recreated")

    errors = wait_until(manager.metadata_errors, timeout=60, description="the metadata partition halted")
    assert set(errors) == {0}
    assert "no longer on the log" in str(errors[0]) and f"{metadata_topic} partition 0" in str(errors[0])
