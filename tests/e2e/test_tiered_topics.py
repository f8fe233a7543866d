"""Tiering on one broker with tierlog's RLMM and RSM: retention by time and by size, topic deletion, and
transactions read back with read_committed from remote segments, whose bytes the broker reads from the files of
its agent's chunk cache."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from e2e_testkit import (
    delete_topic,
    describe,
    earliest_offset,
    finished,
    remote_segments,
    set_topic_config,
    topic_log_objects,
    topic_objects,
)

from dev.demo import (
    SEGMENT_BYTES,
    S3Location,
    consume,
    create_topic,
    produce,
    prometheus_samples,
    record_key,
    record_value,
    sum_samples,
    wait_for,
    wait_until_tiered,
)
from dev.kafka import KafkaCluster

RECORDS = 25_000  # 200-byte values: about five 1 MiB segments


@pytest.fixture
def cluster(shared_tiered_cluster: tuple[KafkaCluster, S3Location, Path, int]) -> KafkaCluster:
    return shared_tiered_cluster[0]


@pytest.fixture
def s3(shared_tiered_cluster: tuple[KafkaCluster, S3Location, Path, int]) -> S3Location:
    return shared_tiered_cluster[1]


@pytest.fixture
def sockets(shared_tiered_cluster: tuple[KafkaCluster, S3Location, Path, int]) -> Path:
    return shared_tiered_cluster[2]


@pytest.fixture
def agent_metrics_port(shared_tiered_cluster: tuple[KafkaCluster, S3Location, Path, int]) -> int:
    return shared_tiered_cluster[3]


def _fetch_calls(metrics_port: int, method: str) -> float:
    """Successful calls of a RemoteStorage method the broker's agent served."""
    return sum_samples(
        prometheus_samples(metrics_port), "tierlog_agent_calls_total", (f'method="{method}"', 'code="OK"')
    )


def _tiered_topic(cluster: KafkaCluster, name: str) -> str:
    topic = f"{name}-{uuid.uuid4().hex[:6]}"
    create_topic(cluster.bootstrap, topic)
    produce(cluster.bootstrap, topic, 0, RECORDS)
    wait_until_tiered(cluster.log_dir(0), topic, min_local_start=RECORDS // 2)
    return topic


def test_retention_by_time_deletes_remote_segments_and_their_metadata(
    cluster: KafkaCluster, s3: S3Location, sockets: Path
) -> None:
    topic = _tiered_topic(cluster, "retention-time")
    tp, _ = describe(cluster.bootstrap, topic)
    assert finished(remote_segments(sockets, 0, tp))

    set_topic_config(cluster.bootstrap, topic, **{"retention.ms": "1000"})

    wait_for(
        lambda: not remote_segments(sockets, 0, tp) and not topic_log_objects(s3, topic),
        90,
        "remote segments past retention.ms to be deleted",
    )
    assert earliest_offset(cluster.bootstrap, topic) > RECORDS // 2


def test_retention_by_size_deletes_the_oldest_remote_segments_and_their_metadata(
    cluster: KafkaCluster, s3: S3Location, sockets: Path
) -> None:
    topic = _tiered_topic(cluster, "retention-size")
    tp, _ = describe(cluster.bootstrap, topic)
    retention_bytes = 2 * 1024 * 1024

    set_topic_config(cluster.bootstrap, topic, **{"retention.bytes": str(retention_bytes)})

    log_start = wait_for(
        lambda: earliest_offset(cluster.bootstrap, topic) or None,
        90,
        "retention.bytes to advance the log start offset",
    )
    kept = wait_for(
        lambda: (
            (segments := remote_segments(sockets, 0, tp))
            and all(s.end_offset >= log_start for s in segments)
            and len(topic_log_objects(s3, topic)) == len(segments)
            and segments
        ),
        60,
        "metadata and objects of the segments below the log start offset to be deleted",
    )
    assert min(s.start_offset for s in kept) > 0
    # Kafka deletes a segment only while the log stays at or above retention.bytes without it, so what
    # remains exceeds the limit by less than one segment.
    assert sum(s.segment_size_in_bytes for s in kept) < retention_bytes + SEGMENT_BYTES


def test_topic_deletion_removes_the_topics_remote_objects_and_metadata(
    cluster: KafkaCluster, s3: S3Location, sockets: Path
) -> None:
    topic = _tiered_topic(cluster, "deleted")
    tp, _ = describe(cluster.bootstrap, topic)
    assert topic_objects(s3, topic)

    delete_topic(cluster.bootstrap, topic)

    wait_for(lambda: not topic_objects(s3, topic), 90, f"the objects of deleted topic {topic} to go")
    wait_for(lambda: not remote_segments(sockets, 0, tp), 30, f"the metadata of deleted topic {topic} to go")


def test_read_committed_from_remote_segments_returns_exactly_the_committed_records(
    cluster: KafkaCluster, agent_metrics_port: int
) -> None:
    topic = f"transactions-{uuid.uuid4().hex[:6]}"
    create_topic(cluster.bootstrap, topic)
    producer = Producer(
        {"bootstrap.servers": cluster.bootstrap, "transactional.id": f"tx-{topic}", "linger.ms": 20}
    )
    producer.init_transactions(30)
    committed: list[int] = []
    batch = 1_000
    for n, start in enumerate(range(0, RECORDS, batch)):
        producer.begin_transaction()
        for i in range(start, start + batch):
            producer.produce(topic, key=record_key(i), value=record_value(i), partition=0)
            producer.poll(0)
        # Every record acknowledged before the transaction ends: librdkafka 2.16 against Kafka 4.x
        # (transactions v2) sometimes fails an abort that races in-flight produce requests.
        producer.flush(60)
        # Every third transaction is aborted, spread over every segment.
        if n % 3 == 1:
            producer.abort_transaction(60)
        else:
            producer.commit_transaction(60)
            committed.extend(range(start, start + batch))
    wait_until_tiered(cluster.log_dir(0), topic, min_local_start=RECORDS // 2)

    files_before = _fetch_calls(agent_metrics_port, "FetchLogSegmentFiles")
    streams_before = _fetch_calls(agent_metrics_port, "FetchLogSegment")

    read = consume(cluster.bootstrap, topic, len(committed), isolation="read_committed", timeout=90)

    assert read.indexes == committed
    assert not read.mismatched
    # The remote segments' bytes came from the chunk cache's files, none through the gRPC stream.
    assert _fetch_calls(agent_metrics_port, "FetchLogSegmentFiles") > files_before
    assert _fetch_calls(agent_metrics_port, "FetchLogSegment") == streams_before
