"""The audit archiver as the audit loop runs it: a leadership move hands a metadata partition from one loop to
another, which resumes where the first stopped; two loops archiving one partition at once lose nothing and make the
same snapshot; a new snapshot reads only the previous one and the archive files after it; and the archiver reports a
gap when compaction removed records it had not archived yet."""

from __future__ import annotations

import io
import itertools
import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rlmm_testkit import make_tp, manager_config, register, segment, update_of
from support import wait_until
from support.topics import unique_topic_name

from dev.kafka import KafkaCluster
from rlmm import RemoteLogMetadataManager, RemoteLogSegmentState
from rlmm.archive import read_archive_file, read_snapshot
from rsm.backend import RangeStream, StorageBackend, read_all
from rsm.backends.filesystem import FilesystemBackend
from rsm.metrics import Metrics
from tierlog.audit.archiver import Archiver, ArchiverSettings, AuditGap, list_archive_files
from tierlog.audit.assignment import MetadataTopicDescriber
from tierlog.audit.loop import Assignment, AuditLoop, AuditSettings
from tierlog.audit.snapshots import SnapshotSettings, write_snapshot_now
from tierlog.pipeline.generate import HistoryGenerator, HistorySpec, produce_history

PARTITIONS = 2


def archived(store: StorageBackend, topic: str) -> Counter[tuple[int, int]]:
    """(metadata partition, offset) -> how often the archive holds it."""
    held: Counter[tuple[int, int]] = Counter()
    for archive_file in list_archive_files(store, topic):
        held.update((d["metadata_partition"], d["offset"])
                    for d in read_archive_file(read_all(store.get_range(archive_file.key, 0))))
    return held


def produce(bootstrap: str, topic: str, seed: int, events: int = 300) -> None:
    spec = HistorySpec(events=events, metadata_partitions=PARTITIONS, topics=2, partitions_per_topic=3, seed=seed)
    produce_history(bootstrap, topic, list(HistoryGenerator(spec).records()))


def every_offset(bootstrap: str, topic: str) -> Counter[tuple[int, int]]:
    ends = MetadataTopicDescriber({"bootstrap.servers": bootstrap}, topic, None).end_offsets()
    return Counter((p, offset) for p, end in ends.items() for offset in range(end))


def loop_owning(store: StorageBackend, bootstrap: str, topic: str, owned: Callable[[], set[int]]) -> AuditLoop:
    """A loop whose assignment is `owned()` at each check (every 0.1 s): the leadership a test decides."""
    describer = MetadataTopicDescriber({"bootstrap.servers": bootstrap}, topic, None)
    topic_id = describer.assignment().topic_id
    settings = AuditSettings(ArchiverSettings(bootstrap, topic, max_file_interval_s=0.1), None,
                             assignment_interval_s=0.1)
    return AuditLoop(store, settings, lambda: Assignment(frozenset(owned()), tuple(range(PARTITIONS)), topic_id),
                     describer.end_offsets)


def test_a_leadership_move_hands_a_partition_to_another_loop_which_resumes_where_the_first_stopped(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    tmp_path: Path,
) -> None:
    make_manager(partitions=PARTITIONS)  # creates the topic
    store = FilesystemBackend(tmp_path / "bucket", Metrics())
    leads = {"a": {0, 1}, "b": set[int]()}
    first = loop_owning(store, kafka_bootstrap, metadata_topic, lambda: set(leads["a"])).start()
    second = loop_owning(store, kafka_bootstrap, metadata_topic, lambda: set(leads["b"])).start()
    try:
        produce(kafka_bootstrap, metadata_topic, seed=1)
        wait_until(lambda: archived(store, metadata_topic) == every_offset(kafka_bootstrap, metadata_topic),
                   timeout=60, description="the first loop archiving both partitions")
        leads["a"] = {0}
        wait_until(lambda: first.progress().assignment.owned == {0},  # type: ignore[union-attr]
                   timeout=30, description="the first loop giving partition 1 up")
        leads["b"] = {1}
        produce(kafka_bootstrap, metadata_topic, seed=2)
        wait_until(lambda: archived(store, metadata_topic) == every_offset(kafka_bootstrap, metadata_topic),
                   timeout=60, description="the second loop archiving partition 1 from where the first stopped")
        assert second.progress().lag == {1: 0}
    finally:
        assert first.close(10) and second.close(10)


def test_two_loops_archiving_the_same_partitions_at_once_lose_nothing_and_make_the_same_snapshot(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    tmp_path: Path,
) -> None:
    manager = make_manager(partitions=PARTITIONS)
    store = FilesystemBackend(tmp_path / "bucket", Metrics())
    loops = [loop_owning(store, kafka_bootstrap, metadata_topic, lambda: {0, 1}).start() for _ in range(2)]
    try:
        produce(kafka_bootstrap, metadata_topic, seed=3, events=600)
        expected = every_offset(kafka_bootstrap, metadata_topic)
        wait_until(lambda: set(archived(store, metadata_topic)) == set(expected), timeout=60,
                   description="every record archived")
    finally:
        assert all(loop.close(10) for loop in loops)
    manager.wait_caught_up(30)
    topic_id = MetadataTopicDescriber(
        {"bootstrap.servers": kafka_bootstrap}, metadata_topic, None).assignment().topic_id

    key = write_snapshot_now(store, SnapshotSettings("snapshots", metadata_topic), topic_id)

    assert key is not None
    header, _ = read_snapshot(io.BytesIO(read_all(store.get_range(key, 0))))
    assert header.view_digest == manager.view_digest()


class ReadRecordingStore(FilesystemBackend):
    """A real filesystem store that notes the key of every object read."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, Metrics())
        self.read: list[str] = []

    def get_range(self, key: str, start: int, end: int | None = None) -> RangeStream:
        self.read.append(key)
        return super().get_range(key, start, end)


def test_a_new_snapshot_is_the_previous_one_plus_only_the_archive_files_after_it(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    tmp_path: Path,
) -> None:
    manager = make_manager(partitions=PARTITIONS)
    store = ReadRecordingStore(tmp_path / "bucket")
    settings = SnapshotSettings("snapshots", metadata_topic)
    topic = MetadataTopicDescriber({"bootstrap.servers": kafka_bootstrap}, metadata_topic, None)
    topic_id = topic.assignment().topic_id
    produce(kafka_bootstrap, metadata_topic, seed=4)
    Archiver(store, ArchiverSettings(kafka_bootstrap, metadata_topic)).run_until_caught_up(60)
    first = write_snapshot_now(store, settings, topic_id)
    archived_before = {f.key for f in list_archive_files(store, metadata_topic)}
    produce(kafka_bootstrap, metadata_topic, seed=5)
    Archiver(store, ArchiverSettings(kafka_bootstrap, metadata_topic)).run_until_caught_up(60)
    store.read.clear()

    second = write_snapshot_now(store, settings, topic_id)

    archived_after = {f.key for f in list_archive_files(store, metadata_topic)} - archived_before
    assert first is not None and second is not None and archived_after
    assert sorted(store.read) == sorted([first, *archived_after])
    manager.wait_caught_up(30)
    header, _ = read_snapshot(io.BytesIO(read_all(store.get_range(second, 0))))
    assert header.view_digest == manager.view_digest()


FAST_CLEANER = {"log.cleaner.backoff.ms": 300}
AGGRESSIVE_COMPACTION = {"cleanup.policy": "compact", "segment.ms": 100, "min.cleanable.dirty.ratio": 0.01,
                         "min.compaction.lag.ms": 0, "max.compaction.lag.ms": 100, "delete.retention.ms": 100}


def first_offset(bootstrap: str, topic: str) -> int | None:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        messages = consumer.consume(1, timeout=5)
        return messages[0].offset() if messages and messages[0].error() is None else None
    finally:
        consumer.close()


def test_the_archiver_reports_a_gap_when_compaction_removed_records_it_had_not_archived(
    make_kafka_cluster: Callable[..., KafkaCluster], tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    cluster = make_kafka_cluster(nodes=1, properties=FAST_CLEANER)
    topic = unique_topic_name("audit-gap")
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    configs = {k: str(v) for k, v in AGGRESSIVE_COMPACTION.items()}
    admin.create_topics([NewTopic(topic, 1, 1, config=configs)])[topic].result(timeout=30)
    manager = RemoteLogMetadataManager(manager_config(cluster.bootstrap, tmp_path / "state", topic))
    try:
        tp = make_tp("compacted")
        register(manager, tp)
        md = segment(tp, 0, 9, {0: 0})
        manager.add_remote_log_segment_metadata(md).result(timeout=30)
        # The same segment key again: compaction keeps only the newest record of it, so offset 0 goes.
        manager.update_remote_log_segment_metadata(
            update_of(md, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)).result(timeout=30)
        starts = itertools.count(10, 10)

        def compacted() -> int | None:
            start = next(starts)  # each append lets the active segment roll, so older ones become cleanable
            manager.add_remote_log_segment_metadata(segment(tp, start, start + 9, {0: start})).result(timeout=30)
            return first_offset(cluster.bootstrap, topic) or None

        first = wait_until(compacted, timeout=90, interval=1.0, description=f"the cleaner compacting {topic}")
        store = FilesystemBackend(tmp_path / "bucket", Metrics())
        with caplog.at_level(logging.WARNING, logger="tierlog.audit.archiver"):
            stats = Archiver(store, ArchiverSettings(cluster.bootstrap, topic)).run_until_caught_up(60)
        assert stats.gaps[:1] == [AuditGap(0, 0, stats.gaps[0].last_offset)]
        assert stats.gaps[0].last_offset >= first - 1
        assert any("audit gap" in r.getMessage() for r in caplog.records)
    finally:
        manager.close()
