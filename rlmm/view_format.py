"""RocksDB key and value encodings of the materialized view (format version 2).

Keys are big-endian so RocksDB's byte order is (topic id, partition, epoch, start offset) order, which
makes a floor lookup in a leader epoch's offset index one `seek_for_prev`.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable
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

FORMAT_VERSION = 2
# The formats a view or a snapshot's entries may be in and still be read as this one. Format 1 differs only in a
# partition's bookkeeping (a lineage digest, before checkpoints were keyed per epoch), which decode_partition_meta
# reads too: a format 1 view upgrades in place, while a release that reads only format 1 refuses format 2.
READABLE_FORMATS = frozenset({1, FORMAT_VERSION})

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


# A lineage is (epoch, highest offset or -1, displaced ids), then, only when it has overwritten ids, those ids and
# their count (big-endian uint32): a value without them is as views before overwritten ids wrote it (its length is
# 12 plus a multiple of 16, with them it is 16 more than that), so those views and their digests stay the same.
_COUNT = struct.Struct(">I")
_ID = 16


def encode_lineage(lineage: EpochLineage) -> bytes:
    highest = -1 if lineage.highest_log_offset is None else lineage.highest_log_offset
    ids = b"".join(sorted(s.bytes for s in lineage.displaced_segment_ids))
    head = _EPOCH.pack(lineage.epoch) + _OFFSET.pack(highest) + ids
    if not lineage.overwritten_segment_ids:
        return head
    overwritten = sorted(s.bytes for s in lineage.overwritten_segment_ids)
    return head + b"".join(overwritten) + _COUNT.pack(len(overwritten))


def decode_lineage(raw: bytes) -> EpochLineage:
    epoch = _EPOCH.unpack_from(raw, 0)[0]
    highest = _OFFSET.unpack_from(raw, _EPOCH.size)[0]
    body = raw[_EPOCH.size + _OFFSET.size:]
    overwritten: frozenset[uuid.UUID] = frozenset()
    if len(body) % _ID == _COUNT.size:
        (count,) = _COUNT.unpack_from(body, len(body) - _COUNT.size)
        split = len(body) - _COUNT.size - count * _ID
        if split < 0:
            raise ValueError(f"a stored lineage of epoch {epoch} counts {count} overwritten ids but holds fewer")
        overwritten = _ids(body[split:len(body) - _COUNT.size])
        body = body[:split]
    return EpochLineage(epoch, None if highest < 0 else highest, _ids(body), overwritten)


def _ids(body: bytes) -> frozenset[uuid.UUID]:
    if len(body) % _ID:
        raise ValueError(f"a stored lineage's ids take {len(body)} bytes, not a multiple of {_ID}")
    return frozenset(uuid.UUID(bytes=body[i:i + _ID]) for i in range(0, len(body), _ID))


@dataclass(frozen=True, slots=True)
class PartitionMeta:
    """Bookkeeping of one user partition: its topic name, the leader epochs that owe a checkpoint (`checkpointed`,
    see below), lineage position."""

    topic: str
    checkpointed: bytes | None = None
    lineage_position: int | None = None


# `PartitionMeta.checkpointed`, which epochs owe a checkpoint record (rlmm.lineage): None when each epoch's newest
# checkpoint describes its lineage; b"E" and the owing epochs (big-endian int32, ascending); or ALL_OWED when each
# epoch may owe one. Views written before checkpoints were keyed per epoch hold a 32-byte sha256 of the whole
# lineage as last checkpointed, or nothing (read as ALL_OWED: then the last checkpoint was stale or missing).
_OWED = b"E"
ALL_OWED = b"*"
_DIGEST_LEN = 32


def encode_owed(epochs: Iterable[int]) -> bytes | None:
    ordered = sorted(epochs)
    return _OWED + b"".join(map(_EPOCH.pack, ordered)) if ordered else None


# Every lineage change reads its partition's owing epochs; most partitions owe the same few.
@lru_cache(maxsize=4096)
def decode_owed(raw: bytes) -> frozenset[int] | None:
    """The owing epochs of an `encode_owed` value; None for the other forms (ALL_OWED, a legacy digest)."""
    if not raw.startswith(_OWED) or (len(raw) - len(_OWED)) % _EPOCH.size:
        return None
    return frozenset(epoch for (epoch,) in _EPOCH.iter_unpack(raw[len(_OWED):]))


def is_legacy_digest(raw: bytes) -> bool:
    return len(raw) == _DIGEST_LEN


# Partition bookkeeping is encoded as (topic name length | _TAGGED, name, position or -1, `checkpointed` to the end):
# the tag tells it from the format before, which told its optional parts apart by length (names are at most 249
# bytes, so the tag bit is never part of a length).
_TAGGED = 0x8000
_NAME_LEN = struct.Struct(">H")


def encode_partition_meta(meta: PartitionMeta) -> bytes:
    name = meta.topic.encode()
    position = -1 if meta.lineage_position is None else meta.lineage_position
    return _NAME_LEN.pack(len(name) | _TAGGED) + name + _OFFSET.pack(position) + (meta.checkpointed or b"")


def decode_partition_meta(raw: bytes) -> PartitionMeta:
    (length,) = _NAME_LEN.unpack_from(raw, 0)
    if length & _TAGGED:
        end = _NAME_LEN.size + (length & ~_TAGGED)
        topic = raw[_NAME_LEN.size:end].decode()
        (position,) = _OFFSET.unpack_from(raw, end)
        checkpointed = raw[end + _OFFSET.size:]
        return PartitionMeta(topic, checkpointed or None, None if position < 0 else int(position))
    topic = raw[2:2 + length].decode()
    rest = raw[2 + length:]
    # Optional parts told apart by length: a 32-byte lineage digest, then an 8-byte position. Views written
    # before positions existed hold no position, which reads as unknown.
    has_digest = len(rest) >= _DIGEST_LEN
    checkpointed = rest[:_DIGEST_LEN] if has_digest else ALL_OWED
    tail = rest[_DIGEST_LEN:] if has_digest else rest
    position = int(_OFFSET.unpack(tail)[0]) if len(tail) == _OFFSET.size else None
    return PartitionMeta(topic, checkpointed, position)


def applied_key(metadata_topic: str, metadata_partition: int) -> bytes:
    return metadata_topic.encode() + b"\0" + _EPOCH.pack(metadata_partition)


def encode_offset(offset: int) -> bytes:
    return _OFFSET.pack(offset)


def decode_offset(raw: bytes) -> int:
    return int(_OFFSET.unpack(raw)[0])


def clear_caches() -> None:
    """Empty the decoding caches (a node clears them once a backlog is applied; they refill as needed)."""
    tp_key.cache_clear()
    decode_owed.cache_clear()
