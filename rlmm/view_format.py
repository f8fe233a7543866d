"""RocksDB key and value encodings of the materialized view (format version 1).

Keys are big-endian so RocksDB's byte order is (topic id, partition, epoch, start offset) order, which
makes a floor lookup in a leader epoch's offset index one `seek_for_prev`.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass
from functools import lru_cache

from rlmm import codec
from rlmm.events import EpochLineage
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
)

FORMAT_VERSION = 1

# Column families; the first four are the view's content (hashed by view_digest), the rest bookkeeping.
SEGMENTS = "segments"
PARTITIONS = "partition_delete"
EPOCH_STATE = "epoch_state"
EPOCH_INDEX = "epoch_index"
PARTITION_META = "partition_meta"
APPLIED = "applied_offsets"
CONTENT_FAMILIES = (SEGMENTS, PARTITIONS, EPOCH_STATE, EPOCH_INDEX)
ALL_FAMILIES = (*CONTENT_FAMILIES, PARTITION_META, APPLIED)

_TP = struct.Struct(">16sI")
_EPOCH = struct.Struct(">i")
_OFFSET = struct.Struct(">q")
EPOCH, OFFSET = _EPOCH, _OFFSET  # the packing of a key's epoch and start offset, for code that builds keys in bulk
TP_KEY_LEN = _TP.size


@lru_cache(maxsize=65536)
def tp_key(topic_id: uuid.UUID, partition: int) -> bytes:
    return _TP.pack(topic_id.bytes, partition)


def tp_key_of(tp: TopicIdPartition) -> bytes:
    return tp_key(tp.topic_id, tp.partition)


def tp_of_key(key: bytes) -> tuple[uuid.UUID, int]:
    """(topic id, partition) of a key that starts with a user partition's key."""
    topic_id, partition = _TP.unpack_from(key, 0)
    return uuid.UUID(bytes=topic_id), int(partition)


def segment_key(segment_id: RemoteLogSegmentId) -> bytes:
    return tp_key_of(segment_id.topic_id_partition) + segment_id.id.bytes


def partition_key(tp: TopicIdPartition) -> bytes:
    return tp_key_of(tp)


def lineage_key(tp: TopicIdPartition, epoch: int) -> bytes:
    return tp_key_of(tp) + _EPOCH.pack(epoch)


def epoch_prefix(tp: TopicIdPartition, epoch: int) -> bytes:
    return lineage_key(tp, epoch)


def index_key(tp: TopicIdPartition, epoch: int, start_offset: int) -> bytes:
    return epoch_prefix(tp, epoch) + _OFFSET.pack(start_offset)


def index_start_offset(key: bytes) -> int:
    return int(_OFFSET.unpack_from(key, TP_KEY_LEN + _EPOCH.size)[0])


def lineage_epoch(key: bytes) -> int:
    return int(_EPOCH.unpack_from(key, TP_KEY_LEN)[0])


def encode_segment(md: RemoteLogSegmentMetadata) -> bytes:
    return codec.encode(md)


def decode_segment(raw: bytes) -> RemoteLogSegmentMetadata:
    event = codec.decode(raw)
    assert isinstance(event, RemoteLogSegmentMetadata)
    return event


def encode_partition_delete(md: RemotePartitionDeleteMetadata) -> bytes:
    return codec.encode(md)


def decode_partition_delete(raw: bytes) -> RemotePartitionDeleteMetadata:
    event = codec.decode(raw)
    assert isinstance(event, RemotePartitionDeleteMetadata)
    return event


def encode_lineage(lineage: EpochLineage) -> bytes:
    highest = -1 if lineage.highest_log_offset is None else lineage.highest_log_offset
    ids = b"".join(sorted(s.bytes for s in lineage.displaced_segment_ids))
    return _EPOCH.pack(lineage.epoch) + _OFFSET.pack(highest) + ids


def decode_lineage(raw: bytes) -> EpochLineage:
    epoch = _EPOCH.unpack_from(raw, 0)[0]
    highest = _OFFSET.unpack_from(raw, _EPOCH.size)[0]
    body = raw[_EPOCH.size + _OFFSET.size:]
    ids = frozenset(uuid.UUID(bytes=body[i:i + 16]) for i in range(0, len(body), 16))
    return EpochLineage(epoch, None if highest < 0 else highest, ids)


@dataclass(frozen=True, slots=True)
class PartitionMeta:
    """Bookkeeping of one user partition: its topic name, last applied lineage checkpoint, lineage position."""

    topic: str
    checkpointed: bytes | None = None
    lineage_position: int | None = None


_DIGEST_LEN = 32


def encode_partition_meta(meta: PartitionMeta) -> bytes:
    name = meta.topic.encode()
    position = b"" if meta.lineage_position is None else _OFFSET.pack(meta.lineage_position)
    return struct.pack(">H", len(name)) + name + (meta.checkpointed or b"") + position


def decode_partition_meta(raw: bytes) -> PartitionMeta:
    (length,) = struct.unpack_from(">H", raw, 0)
    topic = raw[2:2 + length].decode()
    rest = raw[2 + length:]
    # Optional parts told apart by length: a 32-byte lineage digest, then an 8-byte position. Views written
    # before positions existed hold no position, which reads as unknown.
    checkpointed = rest[:_DIGEST_LEN] if len(rest) >= _DIGEST_LEN else None
    tail = rest[_DIGEST_LEN:] if checkpointed is not None else rest
    position = int(_OFFSET.unpack(tail)[0]) if len(tail) == _OFFSET.size else None
    return PartitionMeta(topic, checkpointed, position)


def applied_key(metadata_topic: str, metadata_partition: int) -> bytes:
    return metadata_topic.encode() + b"\0" + _EPOCH.pack(metadata_partition)


def encode_offset(offset: int) -> bytes:
    return _OFFSET.pack(offset)


def decode_offset(raw: bytes) -> int:
    return int(_OFFSET.unpack(raw)[0])
