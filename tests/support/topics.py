"""Kafka helpers for tests: an admin client, topic creation that waits for leaders, produce and consume.

All of them are bounded in time and fail with a message naming the topic.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from dev.process import wait_until


@dataclass(frozen=True)
class ConsumedRecord:
    """One record read back from Kafka."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def unique_topic_name(base: str) -> str:
    """`base` reduced to Kafka's topic characters and shortened, plus a random suffix."""
    cleaned = re.sub(r"[^a-zA-Z0-9._-]+", "-", base).strip("-.")[:60] or "topic"
    return f"{cleaned}-{uuid.uuid4().hex[:8]}"


def admin_client(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def create_topic(
    bootstrap: str,
    name: str,
    *,
    partitions: int = 1,
    replication_factor: int = 1,
    config: Mapping[str, object] | None = None,
    timeout: float = 30.0,
) -> str:
    """Create a topic and wait until every partition has a leader; returns the name."""
    admin = admin_client(bootstrap)
    topic = NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config={
            key: str(value).lower() if isinstance(value, bool) else str(value)
            for key, value in (config or {}).items()
        },
    )
    futures = admin.create_topics([topic], operation_timeout=timeout, request_timeout=timeout)
    futures[name].result(timeout=timeout)

    def leaders_elected() -> bool:
        metadata = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if metadata is None or metadata.error is not None or len(metadata.partitions) != partitions:
            return False
        return all(p.leader >= 0 and len(p.isrs) == replication_factor for p in metadata.partitions.values())

    wait_until(leaders_elected, timeout=timeout, description=f"leaders and in-sync replicas of topic {name}")
    return name


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[bytes | None, bytes | None]],
    *,
    config: Mapping[str, Any] | None = None,
    timeout: float = 60.0,
) -> list[tuple[int, int]]:
    """Produce (key, value) records with acks=all; returns (partition, offset) of each, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, **(config or {})})
    results: list[tuple[int, int] | None] = []
    errors: list[str] = []

    def delivered(index: int) -> Any:
        def callback(error: KafkaError | None, message: Any) -> None:
            if error is not None:
                errors.append(f"record {index}: {error}")
            else:
                results[index] = (message.partition(), message.offset())

        return callback

    for index, (key, value) in enumerate(records):
        results.append(None)
        while True:
            try:
                producer.produce(topic, value=value, key=key, on_delivery=delivered(index))
                break
            except BufferError:  # local queue full: let deliveries drain, then retry this record
                producer.poll(0.1)
        producer.poll(0)
    remaining = producer.flush(timeout)
    if remaining or errors:
        raise RuntimeError(
            f"producing to {topic}: {remaining} undelivered after {timeout}s; errors {errors[:5]}"
        )
    return [result for result in results if result is not None]


def consume(
    bootstrap: str,
    topic: str,
    count: int,
    *,
    partition: int = 0,
    from_offset: int = 0,
    config: Mapping[str, Any] | None = None,
    timeout: float = 60.0,
) -> list[ConsumedRecord]:
    """Read `count` records of one partition from `from_offset` (no consumer group commits)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"tests-{topic}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **(config or {}),
        }
    )
    try:
        consumer.assign([TopicPartition(topic, partition, from_offset)])
        records: list[ConsumedRecord] = []
        deadline = time.monotonic() + timeout
        while len(records) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(
                    f"read {len(records)} of {count} records from {topic}[{partition}] in {timeout}s"
                )
            message = consumer.poll(min(1.0, left))
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    continue
                raise RuntimeError(f"consuming {topic}[{partition}]: {error}")
            partition_read, offset_read = message.partition(), message.offset()
            assert partition_read is not None and offset_read is not None  # set on every fetched record
            records.append(ConsumedRecord(partition_read, offset_read, message.key(), message.value()))
        return records
    finally:
        consumer.close()
