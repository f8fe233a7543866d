"""The metadata topic: creating and checking it, appending events, and consuming them from stored offsets.

Producing and consuming are separate from the state they feed (the manager wires them to the view).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from rlmm.errors import ConfigError, RemoteStorageError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicSettings:
    name: str
    partitions: int
    replication_factor: int
    min_insync_replicas: int
    min_compaction_lag_ms: int
    extra_configs: Mapping[str, str]

    def configs(self) -> dict[str, str]:
        return {
            "cleanup.policy": "compact",
            "min.insync.replicas": str(self.min_insync_replicas),
            # Keeps the raw history for the audit window: the archiver copies it before compaction may.
            "min.compaction.lag.ms": str(self.min_compaction_lag_ms),
            **self.extra_configs,
        }


def ensure_topic(admin: AdminClient, settings: TopicSettings, timeout_s: float) -> None:
    """Create the metadata topic if missing; refuse one whose cleanup policy or partition count is wrong."""
    metadata = admin.list_topics(timeout=timeout_s)
    existing = metadata.topics.get(settings.name)
    if existing is None or existing.error is not None:
        futures = admin.create_topics(
            [NewTopic(settings.name, settings.partitions, settings.replication_factor, config=settings.configs())],
            operation_timeout=timeout_s, request_timeout=timeout_s,
        )
        try:
            futures[settings.name].result(timeout=timeout_s)
            log.info("created metadata topic %s with %d partitions", settings.name, settings.partitions)
            return
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RemoteStorageError(f"cannot create metadata topic {settings.name}: {exc}") from exc
        existing = admin.list_topics(topic=settings.name, timeout=timeout_s).topics[settings.name]
    found = len(existing.partitions)
    if found != settings.partitions:
        raise ConfigError(
            f"metadata topic {settings.name} has {found} partitions but metadata.topic.num.partitions is "
            f"{settings.partitions}; the count can never change, so set metadata.topic.num.partitions={found}"
        )
    resource = ConfigResource(ConfigResource.Type.TOPIC, settings.name)
    described = admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout=timeout_s)
    policy = described["cleanup.policy"].value
    if "compact" not in policy.split(",") or "delete" in policy.split(","):
        raise ConfigError(
            f"metadata topic {settings.name} has cleanup.policy={policy}; tierlog needs cleanup.policy=compact "
            f"(a delete policy would drop the state a rebuild needs). Fix it with kafka-configs --alter "
            f"--entity-type topics --entity-name {settings.name} --add-config cleanup.policy=compact"
        )


class EventProducer:
    """Idempotent, acks=all appends; each record goes to the metadata partition chosen by the caller."""

    def __init__(self, topic: str, client_config: Mapping[str, Any]) -> None:
        self.topic = topic
        self._producer = Producer(_client_settings(
            client_config,
            defaults={"linger.ms": 2},
            # Ordered, durable appends are what the view's correctness rests on.
            required={"enable.idempotence": True, "acks": "all"},
        ))

    def append(
        self, partition: int, key: bytes, value: bytes | None, headers: list[tuple[str, str | bytes | None]],
        on_delivery: Callable[[KafkaError | None, Message], None],
    ) -> None:
        while True:
            try:
                self._producer.produce(self.topic, value=value, key=key, partition=partition,
                                       headers=headers, on_delivery=on_delivery)
                break
            except BufferError:
                self._producer.poll(0.05)
        self._producer.poll(0)

    def poll(self, timeout_s: float) -> None:
        self._producer.poll(timeout_s)

    def close(self, timeout_s: float) -> int:
        return int(self._producer.flush(timeout_s))


def _client_settings(
    given: Mapping[str, Any], defaults: Mapping[str, Any], required: Mapping[str, Any]
) -> dict[str, Any]:
    """Client settings: the caller's `kafka.*` values win over our defaults but may not change what we rely on."""
    conflicting = sorted(k for k, v in required.items() if k in given and str(given[k]).lower() != str(v).lower())
    if conflicting:
        raise ConfigError(
            "RemoteLogMetadataManager: " + ", ".join(f"kafka.{k}" for k in conflicting)
            + " cannot be changed: tierlog's metadata log needs "
            + ", ".join(f"{k}={required[k]}" for k in conflicting)
        )
    return {**defaults, **given, **required}


def end_offsets(admin: AdminClient, topic: str, partitions: list[int], timeout_s: float) -> dict[int, int]:
    """The current end offset of each metadata partition, in one ListOffsets round trip."""
    futures = admin.list_offsets(
        {TopicPartition(topic, p): OffsetSpec.latest() for p in partitions}, request_timeout=timeout_s
    )
    return {tp.partition: future.result().offset for tp, future in futures.items()}


class EventConsumer:
    """Reads every metadata partition from the offsets the view has stored (no consumer group)."""

    def __init__(self, topic: str, client_config: Mapping[str, Any], partitions: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self._consumer = Consumer(_client_settings(
            client_config,
            defaults={"fetch.wait.max.ms": 50},
            required={
                "group.id": "tierlog-unused",  # the client needs one; offsets live in the view, never in a group
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
            },
        ))

    def assign(self, start_offsets: Mapping[int, int]) -> None:
        self._consumer.assign([
            TopicPartition(self.topic, p, start_offsets.get(p, OFFSET_BEGINNING)) for p in range(self.partitions)
        ])

    def consume(self, max_records: int, timeout_s: float) -> list[Message]:
        return list(self._consumer.consume(max_records, timeout_s))

    def pause(self, partition: int) -> None:
        self._consumer.pause([TopicPartition(self.topic, partition)])

    def close(self) -> None:
        self._consumer.close()
