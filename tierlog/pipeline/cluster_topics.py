"""Which topics the Kafka cluster lists, by topic id, and the checks before a topic is taken as deleted.

A listing is never proof of deletion (a principal sees only the topics it may describe; a client pointed at
another cluster sees none of ours), so a topic missing from it is only *not listed*. A topic is taken as deleted
when the operator names its id and `check_confirmed_deletions` finds the cluster is the one the metadata belongs
to (its metadata topic has the id the metadata source recorded), the metadata names the topic, and the cluster
does not list it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rlmm.types import kafka_uuid, parse_uuid
from tierlog.errors import TierlogError

# How long each wait on the admin client lasts while watching for a refused connection.
_POLL_S = 0.25


class ClusterUnavailableError(TierlogError):
    """Kafka did not answer the metadata request within the timeout."""


class DeletionNotConfirmedError(TierlogError):
    """A topic named as deleted cannot be confirmed deleted in the cluster the metadata belongs to."""


def topic_ids_by_name(client_config: Mapping[str, Any], timeout_s: float) -> dict[str, str]:
    """Every topic the cluster lists now: name -> id (canonical UUID string).

    Fails within `timeout_s`, and within about a second when no broker accepts a connection (a dead bootstrap
    address refuses at once: there is nothing to wait for)."""
    from confluent_kafka import KafkaError, KafkaException, TopicCollection
    from confluent_kafka.admin import AdminClient

    down: list[str] = []

    def on_error(error: KafkaError) -> None:
        if error.code() == KafkaError._ALL_BROKERS_DOWN:
            down.append(error.str())

    config: dict[str, Any] = {**client_config, "error_cb": on_error}
    admin = AdminClient(config)
    deadline = time.monotonic() + timeout_s
    bootstrap = client_config.get("bootstrap.servers")
    try:
        while True:
            try:
                names = list(admin.list_topics(timeout=min(_POLL_S, timeout_s)).topics)
                break
            except KafkaException as exc:
                admin.poll(0)  # serves on_error
                if down:
                    raise ClusterUnavailableError(f"no broker at {bootstrap} accepts a connection: {down[0]}") from exc
                if time.monotonic() >= deadline:
                    raise ClusterUnavailableError(
                        f"Kafka at {bootstrap} did not say which topics exist within {timeout_s:g} s: {exc}"
                    ) from exc
        if not names:
            return {}
        remaining = max(deadline - time.monotonic(), _POLL_S)
        described = admin.describe_topics(TopicCollection(names), request_timeout=remaining)
        ids = {}
        for name, future in described.items():
            try:
                # The metadata and the bucket name topics by the canonical UUID, not Kafka's base64 form.
                topic_id = future.result(timeout=remaining).topic_id
                ids[name] = str(kafka_uuid(topic_id.get_most_significant_bits(), topic_id.get_least_significant_bits()))
            except KafkaException as exc:
                if "UNKNOWN_TOPIC" not in str(exc):  # deleted between the two calls: simply not there
                    raise
        return ids
    except KafkaException as exc:
        raise ClusterUnavailableError(f"asking Kafka at {bootstrap} which topics exist failed: {exc}") from exc


def canonical_topic_id(text: str) -> str:
    """A topic id in any form Kafka tools print, or as a view records it (confluent_kafka's Uuid text: standard,
    not url-safe, base64), as the canonical UUID string the bucket and the metadata use."""
    return str(parse_uuid(text.replace("+", "-").replace("/", "_")))


TOPIC_LISTED = "live"
TOPIC_NOT_LISTED = "not listed"


@dataclass(frozen=True, slots=True)
class ClusterTopics:
    """The cluster's topic listing at one moment, and where it came from."""

    bootstrap: str
    ids_by_name: Mapping[str, str]

    def lists(self, topic_id: str) -> bool:
        return topic_id in self.ids_by_name.values()

    def state_of(self, topic: str, topic_id: str | None = None) -> str:
        # By id when known: a topic deleted and re-created under its old name is a different topic.
        present = self.lists(topic_id) if topic_id is not None else topic in self.ids_by_name
        return TOPIC_LISTED if present else TOPIC_NOT_LISTED


def cluster_topics(client_config: Mapping[str, Any], timeout_s: float) -> ClusterTopics:
    return ClusterTopics(str(client_config.get("bootstrap.servers")), topic_ids_by_name(client_config, timeout_s))


def check_confirmed_deletions(
    cluster: ClusterTopics, metadata_topic: str, recorded_topic_id: str | None, confirmed: Iterable[str],
    named: Mapping[str, str],
) -> None:
    """Raise DeletionNotConfirmedError unless the metadata is of this cluster and every `confirmed` topic id
    (none: only the first check) may be taken as deleted.

    `recorded_topic_id` is the id of `metadata_topic` the metadata source was read from (a view records it; any
    form `canonical_topic_id` reads), None when it was read from this cluster just now; `named` maps the topic
    ids the metadata names to names.
    """
    found_id = cluster.ids_by_name.get(metadata_topic)
    if found_id is None:
        raise DeletionNotConfirmedError(
            f"the cluster at {cluster.bootstrap} lists no metadata topic {metadata_topic}: it is not the cluster "
            "this metadata belongs to (or this principal may not describe it); refusing to take any topic as deleted"
        )
    recorded = recorded_topic_id and canonical_topic_id(recorded_topic_id)
    if recorded_topic_id is not None and recorded != found_id:
        raise DeletionNotConfirmedError(
            f"the metadata was read from {metadata_topic} with topic id {recorded or '(none recorded)'}, but the "
            f"cluster at "
            f"{cluster.bootstrap} has {metadata_topic} with id {found_id}: another cluster (or the topic was "
            "recreated); refusing to take any topic as deleted. Point the command at the cluster the metadata "
            "belongs to"
        )
    wanted = sorted(set(confirmed))
    unknown = [t for t in wanted if t not in named]
    if unknown:
        raise DeletionNotConfirmedError(
            f"the metadata names no topic with id {', '.join(unknown)}: a mistyped id, or metadata of another "
            "cluster; refusing (objects no segment references are orphans without any confirmation)"
        )
    listed = [t for t in wanted if cluster.lists(t)]
    if listed:
        raise DeletionNotConfirmedError(
            "the cluster at " + cluster.bootstrap + " still has "
            + ", ".join(f"topic {named[t]} (id {t})" for t in listed) + "; refusing to delete its objects"
        )
