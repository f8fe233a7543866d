"""The audit archiver as it runs inside the agent: it survives being kicked from its group after a long store
outage and resumes, and it reports a gap when compaction removed records it had not archived yet."""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from rlmm_testkit import make_tp, manager_config, register, segment, update_of
from support import wait_until
from support.topics import unique_topic_name

from dev.kafka import KafkaCluster
from rlmm import RemoteLogMetadataManager, RemoteLogSegmentState
from rlmm.errors import RemoteStorageError
from rsm.backend import ObjectInfo, RangeStream, Source, StorageBackend
from rsm.backends.filesystem import FilesystemBackend
from rsm.metrics import Metrics
from tierlog.audit.archiver import Archiver, ArchiverSettings, ArchiverThread, AuditGap, list_archive_files

# Longer than the consumer's max.poll.interval.ms below, so the group drops the archiver meanwhile.
OUTAGE_S = 9.0
GROUP_TIMEOUTS = (("session.timeout.ms", "6000"), ("heartbeat.interval.ms", "1000"),
                  ("max.poll.interval.ms", "6000"))


class StallingStore(StorageBackend):
    """A real filesystem store whose puts hang and then fail while `outage` is set, as a stalled S3 does."""

    def __init__(self, inner: StorageBackend) -> None:
        self.inner = inner
        self.outage = threading.Event()

    def put(self, key: str, source: Source) -> None:
        if self.outage.is_set():
            threading.Event().wait(OUTAGE_S)
            raise RemoteStorageError(f"put of {key} timed out: the store is unreachable")
        self.inner.put(key, source)

    def get_range(self, key: str, start: int, end: int | None = None) -> RangeStream:
        return self.inner.get_range(key, start, end)

    def delete(self, keys: Sequence[str]) -> None:
        self.inner.delete(keys)

    def list(self, prefix: str) -> Iterator[ObjectInfo]:
        return self.inner.list(prefix)

    def describe(self, key: str) -> str:
        return self.inner.describe(key)


def archived_offsets(store: StorageBackend, topic: str) -> int:
    return sum(f.last_offset - f.first_offset + 1 for f in list_archive_files(store, topic))


def write_segments(manager: RemoteLogMetadataManager, count: int, first: int = 0) -> None:
    tp = make_tp("audited")
    register(manager, tp)
    for i in range(first, first + count):
        manager.add_remote_log_segment_metadata(segment(tp, i * 10, i * 10 + 9, {0: i * 10})).result(timeout=30)


def test_the_archiver_thread_survives_being_kicked_from_its_group_and_resumes(
    make_manager: Callable[..., RemoteLogMetadataManager], kafka_bootstrap: str, metadata_topic: str,
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    manager = make_manager()
    write_segments(manager, 3)
    store = StallingStore(FilesystemBackend(tmp_path / "bucket", Metrics()))
    settings = ArchiverSettings(kafka_bootstrap, metadata_topic, max_file_interval_s=0.2,
                                group_id=unique_topic_name("archivers"), consumer_overrides=GROUP_TIMEOUTS)
    thread = ArchiverThread(lambda: Archiver(store, settings))
    thread.start()
    try:
        wait_until(lambda: archived_offsets(store, metadata_topic) > 0, timeout=60, description="first files")
        store.outage.set()
        write_segments(manager, 3, first=3)
        wait_until(lambda: thread.restarts > 0, timeout=60, description="the archiver failing and restarting")
        store.outage.clear()
        manager.wait_caught_up(30)
        end = sum(manager.applied_offsets().values())
        wait_until(lambda: archived_offsets(store, metadata_topic) >= end, timeout=90,
                   description="every record archived after the outage")
        assert thread.is_alive()
        assert any("restarting" in r.getMessage() for r in caplog.records if r.name == "tierlog.audit.archiver")
    finally:
        thread.stop()


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
