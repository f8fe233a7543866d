"""The migration's control topic (default `__tierlog_migration`, one compacted partition): each node in migration
mode announces itself and its heartbeat under `node/<broker id>`, and `tierlog migrate finalize` appends `finalize`.

Why a record rather than a config change and a second roll: every node follows this topic, so finalize takes effect
on the whole cluster within a heartbeat, with no restart, and a node restarted later with the migration config still
set reads the record and stays finalized (the config is removed at the next routine roll).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from rlmm.errors import MetadataLogError

DEFAULT_CONTROL_TOPIC = "__tierlog_migration"
FINALIZE_KEY = b"finalize"
NODE_KEY_PREFIX = b"node/"
DUAL_WRITE = "dual-write"
FINALIZED = "finalized"


@dataclass(frozen=True, slots=True)
class Announcement:
    """What a node in migration mode says of itself: its state, when it started and when it last said so."""

    broker_id: int
    state: str
    started_ms: int
    heartbeat_ms: int

    def key(self) -> bytes:
        return NODE_KEY_PREFIX + str(self.broker_id).encode("ascii")

    def value(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode("utf-8")


@dataclass(frozen=True, slots=True)
class Finalize:
    """The operator's finalize: from here no node writes to the source topic or imports from it."""

    finalized_ms: int
    checked: Mapping[str, Any] = field(default_factory=dict)

    def value(self) -> bytes:
        return json.dumps({"finalized_ms": self.finalized_ms, "checked": dict(self.checked)},
                          sort_keys=True).encode("utf-8")


@dataclass
class ControlState:
    """The control topic folded: each node's newest announcement, and the finalize record if there is one."""

    nodes: dict[int, Announcement] = field(default_factory=dict)
    finalize: Finalize | None = None

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """Fold one record; a record of another key is ignored (a newer release's)."""
        if key == FINALIZE_KEY:
            found = None if value is None else json.loads(value)
            self.finalize = None if found is None else Finalize(int(found["finalized_ms"]), found.get("checked", {}))
        elif key is not None and key.startswith(NODE_KEY_PREFIX):
            broker_id = int(key[len(NODE_KEY_PREFIX):])
            if value is None:
                self.nodes.pop(broker_id, None)
            else:
                found = json.loads(value)
                self.nodes[broker_id] = Announcement(int(found["broker_id"]), str(found["state"]),
                                                     int(found["started_ms"]), int(found["heartbeat_ms"]))


def ensure_control_topic(admin: AdminClient, topic: str, replication_factor: int, timeout_s: float) -> None:
    """Create the control topic (one partition, compacted) unless it exists."""
    config = {"cleanup.policy": "compact", "min.insync.replicas": str(min(2, replication_factor))}
    future = admin.create_topics([NewTopic(topic, 1, replication_factor, config=config)],
                                 request_timeout=timeout_s)[topic]
    try:
        future.result(timeout_s)
    except KafkaException as exc:
        if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return
        raise MetadataLogError(f"cannot create the migration control topic {topic} (replication factor "
                               f"{replication_factor}): {exc}") from exc


def now_ms() -> int:
    return int(time.time() * 1000)


def read_control(client: Mapping[str, Any], topic: str, timeout_s: float) -> tuple[ControlState, int]:
    """The control topic folded up to its end now, and the offset after it (where a follower goes on)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({**client, "group.id": f"{topic}-reader", "enable.auto.commit": False})
    folded = ControlState()
    deadline = time.monotonic() + timeout_s
    try:
        end = _end_offset(consumer, TopicPartition(topic, 0), deadline)
        consumer.assign([TopicPartition(topic, 0, 0)])
        position = 0
        while position < end:
            if time.monotonic() > deadline:
                raise MetadataLogError(f"reading the migration control topic {topic} to offset {end} took longer "
                                       f"than {timeout_s:g} s (at offset {position}); is the broker healthy?")
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            folded.apply(message.key(), message.value())
            position = (message.offset() or 0) + 1
    finally:
        consumer.close()
    return folded, end


# Errors of a partition just created (or whose leader moves) that go away once its leader is known.
_NOT_YET_LED = frozenset({KafkaError._UNKNOWN_PARTITION, KafkaError.UNKNOWN_TOPIC_OR_PART,
                          KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE})


def _end_offset(consumer: Any, partition: Any, deadline: float) -> int:
    """The partition's end offset, asked again while its leader is not known yet, until `deadline`."""
    while True:
        try:
            _low, end = consumer.get_watermark_offsets(partition, timeout=max(deadline - time.monotonic(), 0.1))
            return int(end)
        except KafkaException as exc:
            if not (exc.args and exc.args[0].code() in _NOT_YET_LED) or time.monotonic() > deadline:
                raise MetadataLogError(f"cannot read the end offset of the migration control topic "
                                       f"{partition.topic}: {exc}") from exc
            time.sleep(0.2)
