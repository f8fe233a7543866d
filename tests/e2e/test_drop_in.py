"""Each tierlog plugin works alone beside one of Kafka's own: tierlog's RSM with Kafka's topic-based metadata
manager, and tierlog's metadata manager with Kafka's LocalTieredStorage (kafka-storage test fixtures)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from e2e_testkit import describe, finished, remote_segments, topic_log_objects

from dev.demo import (
    KAFKA_LOCAL_RSM,
    KAFKA_RLMM,
    S3Location,
    consume,
    create_topic,
    produce,
    wait_until_tiered,
)
from dev.kafka import KafkaCluster

RECORDS = 20_000


def test_tierlog_storage_manager_works_with_kafkas_topic_based_metadata_manager(
    tiered_cluster: Callable[..., KafkaCluster], s3_location: S3Location
) -> None:
    cluster = tiered_cluster(rlmm=KAFKA_RLMM)
    create_topic(cluster.bootstrap, "rsm-alone")
    produce(cluster.bootstrap, "rsm-alone", 0, RECORDS)
    local_start = wait_until_tiered(cluster.log_dir(0), "rsm-alone", min_local_start=RECORDS // 2)

    read = consume(cluster.bootstrap, "rsm-alone", RECORDS)

    assert read.indexes == list(range(RECORDS))
    assert not read.mismatched
    assert len(topic_log_objects(s3_location, "rsm-alone")) >= 2
    assert local_start > 0


def test_tierlog_metadata_manager_works_with_kafkas_local_tiered_storage(
    tiered_cluster: Callable[..., KafkaCluster], socket_dir: Path, tmp_path: Path
) -> None:
    cluster = tiered_cluster(rsm=KAFKA_LOCAL_RSM, local_tiered_storage_dir=tmp_path / "local-tiered")
    create_topic(cluster.bootstrap, "rlmm-alone")
    produce(cluster.bootstrap, "rlmm-alone", 0, RECORDS)
    local_start = wait_until_tiered(cluster.log_dir(0), "rlmm-alone", min_local_start=RECORDS // 2)
    tp, _ = describe(cluster.bootstrap, "rlmm-alone")

    read = consume(cluster.bootstrap, "rlmm-alone", RECORDS)

    assert read.indexes == list(range(RECORDS))
    assert not read.mismatched
    segments = finished(remote_segments(socket_dir, 0, tp))
    assert segments and segments[0].start_offset == 0
    assert max(s.end_offset for s in segments) >= local_start - 1
