"""Which metadata partitions an audit loop archives: those whose leader is a given broker (the agent's), or every
one (`tierlog archive`), as the admin client describes the metadata topic now; and the topic's end offsets."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from rlmm.errors import MetadataLogError
from tierlog.audit.loop import Assignment


class MetadataTopicDescriber:
    """Describes the metadata topic on one admin client, made anew after any failure (a stale client can keep
    stale metadata). `broker_id` None: every partition is owned."""

    def __init__(self, client_config: Mapping[str, Any], metadata_topic: str, broker_id: int | None,
                 timeout_s: float = 30.0) -> None:
        self._config = dict(client_config)
        self._topic = metadata_topic
        self._broker_id = broker_id
        self._timeout_s = timeout_s
        self._lock = threading.Lock()
        self._admin: AdminClient | None = None

    def assignment(self) -> Assignment:
        """The partitions owned now: led by the broker (or all), of all the topic's, and the topic's id."""
        described = self._call(lambda admin: admin.describe_topics(
            TopicCollection([self._topic]), request_timeout=self._timeout_s)[self._topic].result(self._timeout_s))
        partitions = tuple(sorted(p.id for p in described.partitions))
        owned = frozenset(p.id for p in described.partitions
                          if self._broker_id is None or (p.leader is not None and p.leader.id == self._broker_id))
        return Assignment(owned, partitions, str(described.topic_id))

    def end_offsets(self) -> dict[int, int]:
        """The end offset of each partition of the topic now."""
        partitions = self.assignment().partitions

        def ask(admin: AdminClient) -> dict[int, int]:
            listed = admin.list_offsets({TopicPartition(self._topic, p): OffsetSpec.latest() for p in partitions},
                                        request_timeout=self._timeout_s)
            return {tp.partition: answer.result(self._timeout_s).offset for tp, answer in listed.items()}

        return self._call(ask)

    def _call(self, ask: Any) -> Any:
        with self._lock:
            if self._admin is None:
                self._admin = AdminClient(self._config)
            try:
                return ask(self._admin)
            except (KafkaException, TimeoutError) as exc:
                self._admin = None
                raise MetadataLogError(f"cannot describe metadata topic {self._topic} on "
                                       f"{self._config.get('bootstrap.servers')}: {exc}") from exc
