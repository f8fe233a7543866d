"""The metadata topic: creating and checking it, appending events, and consuming them from stored offsets.

Producing and consuming are separate from the state they feed (the manager wires them to the view).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from rlmm.errors import ConfigError, MetadataLogError, MetadataTimeoutError, RemoteStorageError

log = logging.getLogger(__name__)


# The metadata topic's min.insync.replicas when none is configured: 2, or the replication factor if it is lower
# (a topic with RF 1 and min ISR 2 refuses every write).
DEFAULT_MIN_INSYNC_REPLICAS = 2


@dataclass(frozen=True)
class TopicSettings:
    """The metadata topic as tierlog creates it. `min_insync_replicas` None: min(2, replication factor)."""

    name: str
    partitions: int
    replication_factor: int
    min_insync_replicas: int | None
    min_compaction_lag_ms: int
    extra_configs: Mapping[str, str]
    delete_retention_ms: int = 12 * 3600 * 1000
    segment_ms: int = 3600 * 1000

    def __post_init__(self) -> None:
        if self.min_insync_replicas is not None and self.min_insync_replicas > self.replication_factor:
            raise ConfigError(
                f"metadata.topic.min.insync.replicas ({self.min_insync_replicas}) is above "
                f"metadata.topic.replication.factor ({self.replication_factor}): Kafka would refuse every write "
                "to the metadata topic; lower the first or raise the second (unset, it follows the replication "
                f"factor up to {DEFAULT_MIN_INSYNC_REPLICAS})"
            )

    @property
    def effective_min_insync_replicas(self) -> int:
        if self.min_insync_replicas is None:
            return min(DEFAULT_MIN_INSYNC_REPLICAS, self.replication_factor)
        return self.min_insync_replicas

    def configs(self) -> dict[str, str]:
        return {
            "cleanup.policy": "compact",
            "min.insync.replicas": str(self.effective_min_insync_replicas),
            # Keeps the raw history for the audit window: the archiver copies it before compaction may.
            "min.compaction.lag.ms": str(self.min_compaction_lag_ms),
            # Explicit, because a node offline longer than this misses tombstones and must rebuild its view.
            "delete.retention.ms": str(self.delete_retention_ms),
            # Compaction never touches the active segment: roll it often so the size follows live state.
            "segment.ms": str(self.segment_ms),
            **self.extra_configs,
        }


@dataclass(frozen=True)
class TopicInfo:
    """What a node must know of the metadata topic to decide whether its view may resume."""

    topic_id: str
    delete_retention_ms: int


def ensure_topic(admin: AdminClient, settings: TopicSettings, timeout_s: float) -> TopicInfo:
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
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RemoteStorageError(f"cannot create metadata topic {settings.name}: {exc}") from exc
    return check_topic(admin, settings.name, settings.partitions, timeout_s)


def check_topic(admin: AdminClient, name: str, partitions: int, timeout_s: float) -> TopicInfo:
    """Refuse a metadata topic whose cleanup policy or partition count is wrong; return its id and settings."""
    deadline = time.monotonic() + timeout_s
    described_topic = _until_known(
        name, deadline,
        lambda: admin.describe_topics(TopicCollection([name]), request_timeout=timeout_s)[name].result(timeout_s))
    found = len(described_topic.partitions)
    if found != partitions:
        raise ConfigError(
            f"metadata topic {name} has {found} partitions but metadata.topic.num.partitions is "
            f"{partitions}; the count can never change, so set metadata.topic.num.partitions={found}"
        )
    resource = ConfigResource(ConfigResource.Type.TOPIC, name)
    described = _until_known(
        name, deadline,
        lambda: admin.describe_configs([resource], request_timeout=timeout_s)[resource].result(timeout_s))
    policy = described["cleanup.policy"].value
    if "compact" not in policy.split(",") or "delete" in policy.split(","):
        raise ConfigError(
            f"metadata topic {name} has cleanup.policy={policy}; tierlog needs cleanup.policy=compact "
            f"(a delete policy would drop the state a rebuild needs). Fix it with kafka-configs --alter "
            f"--entity-type topics --entity-name {name} --add-config cleanup.policy=compact"
        )
    return TopicInfo(str(described_topic.topic_id), int(described["delete.retention.ms"].value))


_T = TypeVar("_T")


def _until_known(name: str, deadline: float, describe: Callable[[], _T]) -> _T:
    """Run a describe call on the topic, retrying while the broker that answers does not know it yet (a topic
    created a moment ago reaches each broker's metadata, and each request type's path, at its own pace)."""
    while True:
        try:
            return describe()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART or time.monotonic() > deadline:
                raise RemoteStorageError(f"cannot describe metadata topic {name}: {exc}") from exc
            time.sleep(0.1)


class EventProducer:
    """Idempotent, acks=all appends; each record goes to the metadata partition chosen by the caller."""

    def __init__(self, topic: str, client_config: Mapping[str, Any]) -> None:
        self.topic = topic
        self._producer = Producer(_client_settings(
            client_config,
            defaults={"linger.ms": 2},
            # Ordered, durable appends are what the view's correctness rests on. A metadata topic that is gone
            # (deleted, lost) must make writes fail, not be re-created by a broker's auto.create.topics.enable
            # with none of its settings (uncompacted, one partition): only create_topic makes it.
            required={"enable.idempotence": True, "acks": "all", "allow.auto.create.topics": False},
        ))

    def append(
        self, partition: int, key: bytes, value: bytes | None, headers: list[tuple[str, str | bytes | None]],
        on_delivery: Callable[[KafkaError | None, Message], None], deadline: float,
    ) -> None:
        """Queue one record; a queue that stays full until `deadline` (monotonic) raises MetadataTimeoutError, a
        record the producer refuses (larger than its message.max.bytes) RemoteStorageError."""
        while True:
            try:
                self._producer.produce(self.topic, value=value, key=key, partition=partition,
                                       headers=headers, on_delivery=on_delivery)
                return
            except KafkaException as exc:
                raise RemoteStorageError(
                    f"the producer refused a record of {len(value or b'')} bytes for topic {self.topic} "
                    f"(key {key.decode(errors='replace')}): {exc.args[0].str() if exc.args else exc}; a larger "
                    f"record needs kafka.message.max.bytes and the topic's max.message.bytes raised"
                ) from None
            except BufferError:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MetadataTimeoutError(
                        f"the producer queue for topic {self.topic} stayed full until the write's deadline; "
                        f"the brokers are not taking records fast enough"
                    ) from None
                self._producer.poll(min(0.05, remaining))

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


class OffsetReader:
    """ListOffsets for the metadata partitions, on an admin client recreated after any failure.

    A long-lived admin client can keep a stale leader epoch after a broker restart and get
    FENCED_LEADER_EPOCH for minutes; a fresh client asks for fresh metadata. Calls are serialized.
    """

    def __init__(self, topic: str, client_config: Mapping[str, Any], admin: AdminClient | None = None) -> None:
        self.topic = topic
        self._config = dict(client_config)
        self._lock = threading.Lock()
        # The client to start with. Better one that already answered a request: librdkafka 2.16 replaces the
        # bootstrap broker with the one its metadata names just after connecting, and a new client's first
        # ListOffsets that races it waits about 3 s (1 new client in 5 here; after a describe, 0 in 60).
        self._admin: AdminClient | None = admin

    def end_offsets(self, partitions: list[int], timeout_s: float) -> dict[int, int]:
        """The current end offset of each metadata partition, in one ListOffsets round trip."""
        return self._list(partitions, OffsetSpec.latest(), timeout_s)

    def start_offsets(self, partitions: list[int], timeout_s: float) -> dict[int, int]:
        """The first offset still on the log of each metadata partition."""
        return self._list(partitions, OffsetSpec.earliest(), timeout_s)

    def _list(self, partitions: list[int], spec: OffsetSpec, timeout_s: float) -> dict[int, int]:
        if not partitions:
            return {}
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while True:
                if self._admin is None:
                    self._admin = AdminClient(self._config)
                try:
                    futures = self._admin.list_offsets({TopicPartition(self.topic, p): spec for p in partitions},
                                                       request_timeout=max(deadline - time.monotonic(), 0.1))
                    return {tp.partition: f.result(timeout=max(0.0, deadline - time.monotonic())).offset
                            for tp, f in futures.items()}
                except (KafkaException, TimeoutError) as exc:
                    self._admin = None  # the next attempt starts from fresh cluster metadata
                    if isinstance(exc, TimeoutError) or _is_timeout(exc):
                        raise MetadataTimeoutError(
                            f"listing offsets of metadata topic {self.topic} did not answer within {timeout_s}s"
                        ) from exc
                    # A leader that just moved (fenced or stale leader epoch, not the leader any more) answers
                    # again once the client has fresh metadata: retry until the deadline.
                    if _is_leader_change(exc) and time.monotonic() + _RETRY_PAUSE_S < deadline:
                        time.sleep(_RETRY_PAUSE_S)
                        continue
                    raise MetadataLogError(
                        f"listing offsets of metadata topic {self.topic} failed: {exc}") from exc


_RETRY_PAUSE_S = 0.2
_LEADER_CHANGE_CODES = frozenset({
    KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE, KafkaError.OFFSET_NOT_AVAILABLE, KafkaError.REPLICA_NOT_AVAILABLE,
})


def _is_leader_change(exc: KafkaException) -> bool:
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and (error.code() in _LEADER_CHANGE_CODES or error.retriable())


def _is_timeout(exc: KafkaException) -> bool:
    error = exc.args[0] if exc.args else None
    return isinstance(error, KafkaError) and error.code() in (KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT)


class EventConsumer:
    """Reads every metadata partition from the offsets the view has stored (no consumer group)."""

    def __init__(self, topic: str, client_config: Mapping[str, Any], partitions: int) -> None:
        self.topic = topic
        self.partitions = partitions
        self.client_config = dict(client_config)  # as given: a worker process reading a share opens its own
        self._consumer = Consumer(_client_settings(
            client_config,
            # librdkafka prefetches up to queued.max.messages.kbytes (default 64 MiB), which a rebuilt node kept
            # holding after its backlog. Over that mark it postpones the partition's next fetch by
            # fetch.queue.backoff.ms (default 1 s): a backlog read faster than one fetch returns stalled for a second
            # at a time (1.5M records took 3.0-4.3 s to consume at 32-64 MiB, 1.6 s with 10 ms at 16 MiB).
            defaults={"fetch.wait.max.ms": 50, "queued.max.messages.kbytes": 16384, "fetch.queue.backoff.ms": 10},
            required={
                "group.id": "tierlog-unused",  # the client needs one; offsets live in the view, never in a group
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                # A stored offset no longer on the log (topic recreated, unclean election) must not silently
                # jump to either end: the applier halts that partition and the node rebuilds.
                "auto.offset.reset": "error",
            },
        ))

    def assign(self, start_offsets: Mapping[int, int], partitions: Iterable[int] | None = None) -> None:
        """Read `partitions` (every one by default), and only those, each from its start offset (else from the
        beginning of its log)."""
        self._consumer.assign([
            TopicPartition(self.topic, p, start_offsets.get(p, OFFSET_BEGINNING))
            for p in (range(self.partitions) if partitions is None else partitions)
        ])

    def add(self, start_offsets: Mapping[int, int], partitions: Iterable[int]) -> None:
        """Read `partitions` too, each from its start offset (else from the beginning of its log)."""
        self._consumer.incremental_assign([
            TopicPartition(self.topic, p, start_offsets.get(p, OFFSET_BEGINNING)) for p in partitions
        ])

    def consume(self, max_records: int, timeout_s: float) -> list[Message]:
        return list(self._consumer.consume(max_records, timeout_s))

    def rewind_to_start(self, partition: int) -> None:
        """Read the partition again from the first offset still on its log."""
        self._consumer.seek(TopicPartition(self.topic, partition, OFFSET_BEGINNING))

    def pause(self, partition: int) -> None:
        self._consumer.pause([TopicPartition(self.topic, partition)])

    def close(self) -> None:
        self._consumer.close()
