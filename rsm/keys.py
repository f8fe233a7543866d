"""The object-key layout: `[<hash>/]<topic>-<topicId>/<partition>/<startOffset:020d>-<uuid>.log|.indexes`.

The backend adds its configured prefix (`s3.prefix`, or the filesystem root) in front of these keys.
"""

from __future__ import annotations

import hashlib
import re
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
    "SegmentKeys",
    "keys_for",
    "normalize_prefix",
    "partition_prefix",
    "segment_keys",
]
