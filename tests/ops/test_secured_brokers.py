"""The metadata manager on clusters with no PLAINTEXT listener (issue 10): a broker with SASL_PLAINTEXT +
SCRAM-SHA-512 (the user created at format time) and one with TLS and client certificates the test creates.
The manager gets the Java client settings as a broker passes them and writes and reads its metadata."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from dev.kafka import KafkaCluster, scram_listener, tls_listener
from dev.tls import create_tls_files
from rlmm import RemoteLogMetadataManager, raw_fetch
from rlmm.client_security import librdkafka_settings
from rlmm.manager import CLIENT_PREFIX
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from tierlog.agent.broker_config import rlmm_config

WAIT_S = 60.0
CLIENT = "remote.log.metadata.common.client."


def _writes_and_reads(config: dict[str, Any]) -> tuple[str, int]:
    """The manager writes and reads a segment; its metadata topic and partitions."""
    tp = TopicIdPartition(uuid.uuid4(), "secured", 0)
    segment = RemoteLogSegmentMetadata(
        remote_log_segment_id=RemoteLogSegmentId(tp, uuid.uuid4()), start_offset=0, end_offset=99,
        max_timestamp_ms=1, broker_id=0, event_timestamp_ms=1, segment_size_in_bytes=1024,
        segment_leader_epochs={0: 0},
    )
    with RemoteLogMetadataManager(config) as manager:
        manager.on_partition_leadership_changes({tp}, set())
        deadline = time.monotonic() + WAIT_S
        while not manager.is_ready(tp):
            assert time.monotonic() < deadline, "the manager never became ready"
            time.sleep(0.05)
        manager.add_remote_log_segment_metadata(segment).result(WAIT_S)
        manager.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
            segment.remote_log_segment_id, 2, None, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 0,
        )).result(WAIT_S)
        found = manager.remote_log_segment_metadata(tp, 0, 50)
    assert found is not None and found.remote_log_segment_id == segment.remote_log_segment_id
    return manager.metadata_topic, manager.num_partitions


def _raw_batches_read_as_the_consumer_reads(config: dict[str, Any], topic: str, partitions: int) -> None:
    """A new node's workers read the metadata topic as raw batches (rlmm.raw_fetch) over the same secured connection
    as the manager's consumer, and get what it gets."""
    client = librdkafka_settings({"bootstrap.servers": config["bootstrap.servers"], **{
        k[len(CLIENT_PREFIX):]: v for k, v in config.items() if k.startswith(CLIENT_PREFIX)}})
    assert raw_fetch.unusable_for(client) is None
    consumer = Consumer({**client, "group.id": "tierlog-test-unused", "enable.auto.commit": False,
                         "enable.partition.eof": True})
    consumed: list[tuple[int, int, bytes | None, bytes | None]] = []
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        at_end: set[int] = set()
        deadline = time.monotonic() + WAIT_S
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, "the consumer did not reach the topic's end"
            for message in consumer.consume(100, 0.2):
                if message.error() is not None:
                    at_end.add(message.partition())  # type: ignore[arg-type]
                else:
                    consumed.append((message.partition(), message.offset(), message.key(),  # type: ignore[arg-type]
                                     message.value()))
    finally:
        consumer.close()
    ends = {p: 1 + max((offset for q, offset, _, _ in consumed if q == p), default=-1) for p in range(partitions)}
    assert sum(ends.values()) >= 2  # the manager's writes
    reader = raw_fetch.RawReader(topic, client, WAIT_S)
    try:
        read = [(p, *record) for p, records in reader.read(dict.fromkeys(ends, 0), ends, WAIT_S) for record in records]
    finally:
        reader.close()
    assert sorted(read) == sorted(consumed)


def _broker_map(cluster: KafkaCluster, state_dir: Path, security: dict[str, str]) -> dict[str, Any]:
    """What a broker's RLMM configure() receives: its listener's settings under Kafka's client prefix."""
    return rlmm_config({
        "broker.id": "0", "state.dir": str(state_dir), "metadata.topic.replication.factor": "1",
        "metadata.topic.min.insync.replicas": "1", "metadata.topic.num.partitions": "2",
        CLIENT + "bootstrap.servers": cluster.bootstrap, **{CLIENT + k: v for k, v in security.items()},
    })


def test_the_manager_works_on_a_sasl_scram_sha_512_cluster(
    make_kafka_cluster: Callable[..., KafkaCluster], tmp_path: Path
) -> None:
    cluster = make_kafka_cluster(listener=scram_listener("tierlog", "tier-secret"))
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required username="tierlog" '
            'password="tier-secret";')
    config = _broker_map(cluster, tmp_path / "node", {
        "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": jaas,
    })
    _raw_batches_read_as_the_consumer_reads(config, *_writes_and_reads(config))


def test_the_manager_works_on_a_tls_cluster_that_requires_client_certificates(
    make_kafka_cluster: Callable[..., KafkaCluster], tmp_path: Path
) -> None:
    tls = create_tls_files(tmp_path / "tls")
    cluster = make_kafka_cluster(listener=tls_listener(tls, client_auth=True))
    config = _broker_map(cluster, tmp_path / "node", {
        "security.protocol": "SSL",
        "ssl.truststore.type": "PEM", "ssl.truststore.location": str(tls.ca_pem),
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(tls.client_pem),
    })
    _raw_batches_read_as_the_consumer_reads(config, *_writes_and_reads(config))
