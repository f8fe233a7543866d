"""A tierlog node in migration mode (tierlog.migration.node) against the real broker: it imports what TBRLMM brokers
append to `__remote_log_metadata`, writes its own events only there in Kafka's format until finalize (they reach
tierlog through the import, so both stores apply one order), gates a partition's readiness on the import, and writes
to tierlog directly once the migration is finalized."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from migrate_testkit import (
    SOURCE_PARTITIONS,
    assert_answers_as_kafka,
    kafka_model,
    produce_history,
    run_tierlog,
    tierlog_options,
    workload_history,
)
from rlmm_testkit import make_tp, manager_config, segment, update_of

from rlmm import RemoteLogMetadataManager
from rlmm.errors import InvalidArgumentError
from rlmm.types import RemoteLogSegmentState, TopicIdPartition
from tierlog.agent.rlmm_metrics import RlmmCollector
from tierlog.migration.control import FINALIZE_KEY, FINALIZED, Finalize, read_control
from tierlog.migration.node import MigratingManager, split_config, wrap
from tierlog.migration.records import SourceRecord, decode_source_record

DEADLINE_S = 30.0


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _source_records(bootstrap: str, topic: str) -> list[SourceRecord]:
    """Every record of a source topic now, decoded, with its writer (WRITER_HEADER)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tests-source", "enable.auto.commit": False})
    try:
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
                for p in range(SOURCE_PARTITIONS)}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p, end in ends.items() if end])
        found: list[Any] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(found) < sum(ends.values()) and time.monotonic() < deadline:
            found += [m for m in consumer.consume(100, timeout=0.2) if m.error() is None]
        return [record for m in found if isinstance(record := decode_source_record(topic, SOURCE_PARTITIONS, m),
                                                     SourceRecord)]
    finally:
        consumer.close()


@pytest.fixture
def migrating_node(kafka_bootstrap: str, create_topic: Callable[..., str], unique_topic: str, tmp_path: Path
                   ) -> Iterator[Callable[[], MigratingManager]]:
    """`start()` a node in migration mode over a source topic of its own (`node.source_topic`)."""
    source = create_topic(partitions=SOURCE_PARTITIONS)
    started: list[Any] = []

    def start() -> MigratingManager:
        config = manager_config(kafka_bootstrap, tmp_path / f"node-{len(started)}", unique_topic, partitions=3, **{
            "migration.mode": "dual-write", "migration.source.topic": source,
            "migration.control.topic": f"{unique_topic}-control", "migration.heartbeat.ms": 200})
        own, migration = split_config(config)
        node = wrap(RemoteLogMetadataManager(own), own, migration)
        started.append(node)
        assert isinstance(node, MigratingManager)
        return node

    yield start
    for node in started:
        node.close()


def test_off_is_the_manager_itself(kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> None:
    own, migration = split_config(manager_config(kafka_bootstrap, tmp_path, unique_topic, **{"migration.mode": "off"}))
    manager = RemoteLogMetadataManager(own)
    with manager:
        assert wrap(manager, own, migration) is manager


def test_records_tbrlmm_brokers_append_are_imported_as_kafka_rules_apply_them(
        kafka_bootstrap: str, migrating_node: Callable[[], MigratingManager]) -> None:
    node = migrating_node()
    history = workload_history(seed=5, partitions=3, uploads=4)
    produce_history(kafka_bootstrap, node.source_topic, history)
    _wait(lambda: node.imported + node.skipped + node.dropped == len(history), "the import of the history")
    assert_answers_as_kafka(kafka_model(history), node.view, history)


def _ready(node: MigratingManager, name: str) -> TopicIdPartition:
    tp = make_tp(name, 0)
    node.on_partition_leadership_changes([tp], [])
    _wait(lambda: node.is_ready(tp), "the partition to be ready")
    return tp


def test_own_writes_go_to_the_source_topic_only_and_reach_tierlog_through_the_import(
        kafka_bootstrap: str, migrating_node: Callable[[], MigratingManager]) -> None:
    node = migrating_node()
    tp = _ready(node, "own")
    added = segment(tp, 0, 99, {0: 0})
    finished = update_of(added, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
    node.add_remote_log_segment_metadata(added).result(DEADLINE_S)
    assert node.view.segment(added.remote_log_segment_id) == added  # the call completes once this view holds it
    node.update_remote_log_segment_metadata(finished).result(DEADLINE_S)

    mirrored = _source_records(kafka_bootstrap, node.source_topic)
    assert [r.metadata for r in mirrored] == [added, finished]
    assert [r.tierlog_writer for r in mirrored] == [0, 0]
    assert (node.imported, node.skipped, node.dropped) == (2, 0, 0)
    assert node.list_remote_log_segments(tp)[0].state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED


def test_a_tbrlmm_leader_and_its_successor_copying_the_same_offsets_end_alike_in_both_stores(
        kafka_bootstrap: str, migrating_node: Callable[[], MigratingManager]) -> None:
    """The roll's race: the old leader (TBRLMM) finishes its copy after its successor (migration mode) started copying
    the same offsets. Both stores apply the source topic's order, so lookups find the same segment in both."""
    node = migrating_node()
    tp = _ready(node, "race")
    old, new = segment(tp, 0, 99, {0: 0}), segment(tp, 0, 99, {0: 0})
    produce_history(kafka_bootstrap, node.source_topic, [old])
    _wait(lambda: node.view.segment(old.remote_log_segment_id) is not None, "the old leader's copy to be imported")
    node.add_remote_log_segment_metadata(new).result(DEADLINE_S)
    produce_history(kafka_bootstrap, node.source_topic, [update_of(old, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)])
    node.update_remote_log_segment_metadata(update_of(new, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
                                            ).result(DEADLINE_S)
    # The successor's finish came after the old leader's on the source topic, so this view holds both already.
    assert {s.state for s in node.list_remote_log_segments(tp)} == {RemoteLogSegmentState.COPY_SEGMENT_FINISHED}
    history = [r.metadata for r in _source_records(kafka_bootstrap, node.source_topic)]
    assert len(history) == 4
    assert_answers_as_kafka(kafka_model(history), node.view, history)
    found = node.remote_log_segment_metadata(tp, 0, 50)
    assert found is not None and found.remote_log_segment_id == new.remote_log_segment_id


def test_an_own_write_the_import_drops_fails_as_the_manager_refuses_it(
        kafka_bootstrap: str, migrating_node: Callable[[], MigratingManager]) -> None:
    node = migrating_node()
    tp = _ready(node, "refused")
    copied = segment(tp, 0, 99, {0: 0})
    node.add_remote_log_segment_metadata(copied).result(DEADLINE_S)
    # Another broker (on TBRLMM) starts deleting it; this node's finish of the copy comes after on the source topic.
    produce_history(kafka_bootstrap, node.source_topic,
                    [update_of(copied, RemoteLogSegmentState.DELETE_SEGMENT_STARTED)])
    with pytest.raises(InvalidArgumentError, match=r"COPY_SEGMENT_FINISHED|dropped on import"):
        node.update_remote_log_segment_metadata(update_of(copied, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
                                                ).result(DEADLINE_S)
    assert node.list_remote_log_segments(tp)[0].state is RemoteLogSegmentState.DELETE_SEGMENT_STARTED


def test_a_partition_is_ready_only_once_its_tbrlmm_records_are_imported(
        kafka_bootstrap: str, migrating_node: Callable[[], MigratingManager]) -> None:
    history = workload_history(seed=7, partitions=2, uploads=30)  # the second partition is deleted in the end
    tp = history[0].topic_id_partition
    ours = [call for call in history if call.topic_id_partition == tp]
    node = migrating_node()
    node.on_partition_leadership_changes([], [tp])
    produce_history(kafka_bootstrap, node.source_topic, history)
    _wait(lambda: node.is_ready(tp), "the partition to be ready")
    assert_answers_as_kafka(kafka_model(ours), node.view, ours)


def test_after_finalize_own_writes_go_to_tierlog_directly_and_the_import_takes_in_writes_in_flight(
        kafka_bootstrap: str, migrating_node: Callable[[], MigratingManager]) -> None:
    node = migrating_node()
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(node.control_topic, key=FINALIZE_KEY, value=Finalize(1).value())
    assert producer.flush(10) == 0
    _wait(lambda: node.finalized, "the node to see the finalize record")
    _wait(lambda: getattr(read_control({"bootstrap.servers": kafka_bootstrap}, node.control_topic, 10)[0].nodes.get(0),
                          "state", None) == FINALIZED, "the node to announce it is finalized")

    tp = make_tp("after", 0)
    node.on_partition_leadership_changes([tp], [])
    node.add_remote_log_segment_metadata(segment(tp, 0, 9, {0: 0})).result(DEADLINE_S)
    assert _source_records(kafka_bootstrap, node.source_topic) == []
    in_flight = segment(make_tp("in-flight", 0), 0, 9, {0: 0})  # written by a node that had not seen finalize yet
    produce_history(kafka_bootstrap, node.source_topic, [in_flight])
    _wait(lambda: node.view.segment(in_flight.remote_log_segment_id) == in_flight, "the import of a write in flight")
    # A node started later finds the migration finalized.
    assert migrating_node().finalized


def test_a_node_goes_on_where_tierlog_migrate_stopped(kafka_bootstrap: str, unique_topic: str, tmp_path: Path,
                                                      migrating_node: Callable[[], MigratingManager]) -> None:
    node = migrating_node()
    source = node.source_topic
    node.close()  # only its source topic is wanted: the bulk import runs while no node is in migration mode
    history = workload_history(seed=9, partitions=2, uploads=6)
    produce_history(kafka_bootstrap, source, history)
    code, done = run_tierlog("migrate", "--source-topic", source,
                             *tierlog_options(kafka_bootstrap, unique_topic, tmp_path / "import"))
    assert code == 0, done

    node = migrating_node()
    # One more upload per user partition, after the import: the node imports those and nothing before them.
    model = kafka_model(history)
    later = [segment(tp, 10_000, 10_099, {99: 10_000}) for tp in {call.topic_id_partition for call in history}
             if not model.is_deleted(tp)]
    produce_history(kafka_bootstrap, source, later)
    _wait(lambda: node.imported == len(later), "the node to import the later uploads")
    assert (node.skipped, node.dropped) == (0, 0)
    assert_answers_as_kafka(kafka_model([*history, *later]), node.view, [*history, *later])


def test_the_agents_metrics_show_the_import_its_lag_and_the_finalized_state(
        kafka_bootstrap: str, migrating_node: Callable[[], MigratingManager]) -> None:
    node = migrating_node()
    history = workload_history(seed=13, partitions=2, uploads=3)
    produce_history(kafka_bootstrap, node.source_topic, history)

    def samples() -> dict[tuple[str, str], float]:
        collector = RlmmCollector(lambda: node, lambda _topic, partitions: dict.fromkeys(partitions, 0))
        return {(s.name, s.labels.get("outcome") or s.labels.get("partition", "")): s.value
                for family in collector.collect() if family.name.startswith("tierlog_migration_")
                for s in family.samples}

    _wait(lambda: sum(v for (name, _), v in samples().items() if name == "tierlog_migration_import_lag_records") == 0
          and node.imported + node.skipped + node.dropped == len(history), "the import to be committed")
    found = samples()
    assert found[("tierlog_migration_records_total", "imported")] == node.imported > 0
    assert found[("tierlog_migration_records_total", "dropped")] == node.dropped
    assert [k for k in found if k[0] == "tierlog_migration_import_lag_records"] == [
        ("tierlog_migration_import_lag_records", str(p)) for p in range(SOURCE_PARTITIONS)]
    assert found[("tierlog_migration_source_write_failures_total", "")] == 0
    assert found[("tierlog_migration_finalized", "")] == 0
