"""Which topics the Kafka cluster still has, by topic id: a topic deleted while its partition deletes never
reached the metadata (Kafka sends none for a partition it no longer hosts) shows as deleted, not live.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rlmm.types import kafka_uuid
from tierlog.errors import TierlogError


class ClusterUnavailableError(TierlogError):
    """Kafka did not answer the metadata request within the timeout."""


def topic_ids_by_name(client_config: Mapping[str, Any], timeout_s: float) -> dict[str, str]:
    """Every topic the cluster has now: name -> id (canonical UUID string)."""
    from confluent_kafka import KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(dict(client_config))
    try:
        names = list(admin.list_topics(timeout=timeout_s).topics)
        if not names:
            return {}
        described = admin.describe_topics(TopicCollection(names), request_timeout=timeout_s)
        ids = {}
        for name, future in described.items():
            try:
                # The metadata and the bucket name topics by the canonical UUID, not Kafka's base64 form.
                topic_id = future.result(timeout=timeout_s).topic_id
                ids[name] = str(kafka_uuid(topic_id.get_most_significant_bits(), topic_id.get_least_significant_bits()))
            except KafkaException as exc:
                if "UNKNOWN_TOPIC" not in str(exc):  # deleted between the two calls: simply not there
                    raise
        return ids
    except KafkaException as exc:
        raise ClusterUnavailableError(f"asking Kafka which topics exist failed within {timeout_s:g} s: {exc}") from exc


def deleted_topic_ids(client_config: Mapping[str, Any], topic_ids: Iterable[str], timeout_s: float) -> set[str]:
    """Those of `topic_ids` the cluster no longer has."""
    wanted = set(topic_ids)
    if not wanted:
        return set()
    return wanted - set(topic_ids_by_name(client_config, timeout_s).values())


TOPIC_LIVE = "live"
TOPIC_DELETED = "deleted"


@dataclass(frozen=True, slots=True)
class ClusterTopics:
    """The cluster's topics at one moment; a topic the metadata names but the cluster lacks is deleted."""

    ids_by_name: Mapping[str, str]

    def state_of(self, topic: str, topic_id: str | None = None) -> str:
        # By id when known: a topic deleted and re-created under its old name is a different topic.
        present = topic_id in self.ids_by_name.values() if topic_id is not None else topic in self.ids_by_name
        return TOPIC_LIVE if present else TOPIC_DELETED


def cluster_topics(client_config: Mapping[str, Any], timeout_s: float) -> ClusterTopics:
    return ClusterTopics(topic_ids_by_name(client_config, timeout_s))
