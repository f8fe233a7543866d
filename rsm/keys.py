"""The object-key layout: `[<hash>/]<topic>-<topicId>/<partition>/<startOffset:020d>-<uuid>.log|.indexes`.

The backend adds its configured prefix (`s3.prefix`, or the filesystem root) in front of these keys.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass

from rlmm.errors import InvalidArgumentError
from rlmm.types import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition

# Kafka's own rule for topic names (Topic.validate). Names within it can never form a path component
# such as "." or "..", and the "-<topicId>" suffix makes even the names "." and ".." harmless.
_LEGAL_TOPIC = re.compile(r"[a-zA-Z0-9._-]{1,249}")
LOG_SUFFIX = ".log"
INDEXES_SUFFIX = ".indexes"
_HASH_HEX_DIGITS = 4


@dataclass(frozen=True, slots=True)
class SegmentKeys:
    log: str
    indexes: str

    def both(self) -> tuple[str, str]:
        return (self.log, self.indexes)


def partition_prefix(tp: TopicIdPartition, hashed: bool) -> str:
    """The key prefix shared by every object of one partition (ends with '/').

    The hash is of the partition, not of the segment, so that one partition's objects can still be
    listed with one prefix while different partitions spread over the store's key space.
    """
    if not _LEGAL_TOPIC.fullmatch(tp.topic):
        raise InvalidArgumentError(
            f"topic name {tp.topic!r} is not a legal Kafka topic name (1-249 of [a-zA-Z0-9._-])"
        )
    base = f"{tp.topic}-{tp.topic_id}/{tp.partition}/"
    if not hashed:
        return base
    digest = hashlib.sha256(f"{tp.topic_id}/{tp.partition}".encode()).hexdigest()
    return f"{digest[:_HASH_HEX_DIGITS]}/{base}"


def segment_keys(segment_id: RemoteLogSegmentId, start_offset: int, hashed: bool) -> SegmentKeys:
    stem = f"{partition_prefix(segment_id.topic_id_partition, hashed)}{start_offset:020d}-{segment_id.id}"
    return SegmentKeys(log=stem + LOG_SUFFIX, indexes=stem + INDEXES_SUFFIX)


def keys_for(metadata: RemoteLogSegmentMetadata, hashed: bool) -> SegmentKeys:
    return segment_keys(metadata.remote_log_segment_id, metadata.start_offset, hashed)


# The layout read backwards: optional hash directory, topic-topicId, partition, start-uuid.kind. Plain
# regex syntax, so Spark's regexp_extract uses the same pattern (groups 1-6 in ObjectKey's field order).
_UUID = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
OBJECT_KEY_PATTERN = (
    rf"^(?:[0-9a-f]{{{_HASH_HEX_DIGITS}}}/)?(.+)-({_UUID})/(\d+)/(\d{{20}})-({_UUID})"
    rf"({LOG_SUFFIX.replace('.', '[.]')}|{INDEXES_SUFFIX.replace('.', '[.]')})$"
)
_OBJECT_KEY = re.compile(OBJECT_KEY_PATTERN)


@dataclass(frozen=True, slots=True)
class ObjectKey:
    """What a segment object's key says: its partition, start offset, segment and kind (suffix)."""

    topic: str
    topic_id: uuid.UUID
    partition: int
    start_offset: int
    segment_id: uuid.UUID
    suffix: str

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return TopicIdPartition(self.topic_id, self.topic, self.partition)


def parse_object_key(key: str) -> ObjectKey | None:
    """The segment object a key (without the backend's prefix) names, or None for any other object."""
    match = _OBJECT_KEY.match(key)
    if match is None:
        return None
    topic, topic_id, partition, start, segment, suffix = match.groups()
    return ObjectKey(topic, uuid.UUID(topic_id), int(partition), int(start), uuid.UUID(segment), suffix)


def normalize_prefix(prefix: str, owner: str) -> str:
    """Validate a configured key prefix and return it without surrounding slashes ('' for none)."""
    trimmed = prefix.strip("/")
    if not trimmed:
        return ""
    for part in trimmed.split("/"):
        if part in ("", ".", "..") or "\\" in part or any(ord(ch) < 0x20 for ch in part):
            raise InvalidArgumentError(
                f"{owner} {prefix!r} must be '/'-separated names without empty, '.' or '..' parts"
            )
    return trimmed


__all__ = [
    "INDEXES_SUFFIX",
    "LOG_SUFFIX",
    "OBJECT_KEY_PATTERN",
    "ObjectKey",
    "SegmentKeys",
    "keys_for",
    "normalize_prefix",
    "parse_object_key",
    "partition_prefix",
    "segment_keys",
]
