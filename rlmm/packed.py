"""A segment's metadata packed into one bytes object: how the read model holds the segments of hosted partitions.

A decoded RemoteLogSegmentMetadata is a graph of seven objects (the metadata, its id, the id's UUID and that UUID's
int, its leader epochs, five int fields): about 480 bytes. Packed, it is one bytes object of about 100; unpacking it
again takes about 0.45 µs in C (rlmm/_slots.c's unpacker, for the plain layouts most segments have) and 0.86 in
Python, paid by a listing for each segment it returns and by a lookup whose answer the read model keeps packed
(rlmm.read_model.DECODED_ANSWERS_MAX). A node serving a million hosted segments holds about 300 MiB less.

The layout starts with the start offset, the end offset (both big-endian, never negative) and the segment id, so
that packed segments sort as listings go (rlmm.state.listing_order) by comparing the bytes. What the packed form does
not hold is the segment's topic-partition, which is its user partition's (`tp`, given back to `unpack`), unless the
segment names another topic for it: that name is then packed too.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from types import MappingProxyType
from typing import cast

from rlmm.types import (
    OneEpoch,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    TopicIdPartition,
    _make_segment,
    _make_segment_id,
    _make_uuid,
    _slots,
    slot_maker,
)

# start, end, id, max timestamp, event timestamp, broker, size, state, flags, first epoch and its start offset.
_HEAD = struct.Struct(">qq16sqqiiBBiq")
_LENGTH = struct.Struct(">I")
_EPOCH = struct.Struct(">iq")
_SIZE = struct.Struct(">i")
_SIZE_AT = 8 + 8 + 16 + 8 + 8 + 4
ORDER_LEN = 8 + 8 + 16  # the bytes that order packed segments as listings go

# flags
_TXN_IDX_EMPTY = 1
_CUSTOM = 2  # custom metadata follows: its length, then its bytes
_EPOCHS = 4  # more leader epochs follow: their count, then (epoch, start) each
_TOPIC = 8  # a topic name of its own follows: its length, then its UTF-8 bytes

_STATES = tuple(RemoteLogSegmentState)
_TXN = (False, True)
_from_bytes = int.from_bytes
_UNKNOWN_SAFETY = uuid.SafeUUID.unknown
_make_one_epoch = slot_maker(OneEpoch, OneEpoch.__slots__)


def pack(md: RemoteLogSegmentMetadata, tp: TopicIdPartition) -> bytes:
    """md packed, for a partition whose segments are `tp`'s (a segment naming another topic keeps that name)."""
    epochs = iter(md.segment_leader_epochs.items())
    first_epoch, first_start = next(epochs)
    segment_id = md.remote_log_segment_id
    own = segment_id.topic_id_partition
    return pack_fields(md.start_offset, md.end_offset, segment_id.id.bytes, md.max_timestamp_ms, md.event_timestamp_ms,
                       md.broker_id, md.segment_size_in_bytes, md.state, md.txn_idx_empty, first_epoch, first_start,
                       list(epochs), md.custom_metadata, None if own == tp else own.topic)


def pack_fields(start: int, end: int, segment_id: bytes, max_timestamp: int, event_timestamp: int, broker: int,
                size: int, state: int, txn_idx_empty: bool, first_epoch: int, first_start: int,
                more_epochs: list[tuple[int, int]], custom: bytes | None, topic: str | None) -> bytes:
    """`pack` from a segment's values (its id's 16 bytes; `topic` only when it is not its partition's)."""
    flags = ((_TXN_IDX_EMPTY if txn_idx_empty else 0) | (0 if custom is None else _CUSTOM)
             | (_EPOCHS if more_epochs else 0) | (0 if topic is None else _TOPIC))
    head = _HEAD.pack(start, end, segment_id, max_timestamp, event_timestamp, broker, size, state, flags, first_epoch,
                      first_start)
    if flags <= _CUSTOM | _TXN_IDX_EMPTY:
        return head if custom is None else b"".join((head, _LENGTH.pack(len(custom)), custom))
    parts = [head]
    if custom is not None:
        parts += (_LENGTH.pack(len(custom)), custom)
    if more_epochs:
        parts.append(_LENGTH.pack(len(more_epochs)))
        parts += (_EPOCH.pack(epoch, epoch_start) for epoch, epoch_start in more_epochs)
    if topic is not None:
        name = topic.encode()
        parts += (_LENGTH.pack(len(name)), name)
    return b"".join(parts)


def _unpack(packed: bytes, tp: TopicIdPartition) -> RemoteLogSegmentMetadata:
    """The segment `pack(md, tp)` packed: equal to md (`unpack`, in Python)."""
    (start, end, segment_id, max_timestamp, event_timestamp, broker, size, state, flags, first_epoch,
     first_start) = _HEAD.unpack_from(packed)
    epochs: OneEpoch | MappingProxyType[int, int] = _make_one_epoch(first_epoch, first_start)
    custom = None
    if flags > _TXN_IDX_EMPTY:  # anything but the plain layout
        at = _HEAD.size
        if flags & _CUSTOM:
            (length,) = _LENGTH.unpack_from(packed, at)
            custom = packed[at + 4:at + 4 + length]
            at += 4 + length
        if flags & _EPOCHS:
            (count,) = _LENGTH.unpack_from(packed, at)
            more = dict(_EPOCH.iter_unpack(packed[at + 4:at + 4 + count * _EPOCH.size]))
            epochs = MappingProxyType({first_epoch: first_start, **more})
            at += 4 + count * _EPOCH.size
        if flags & _TOPIC:
            (length,) = _LENGTH.unpack_from(packed, at)
            tp = TopicIdPartition(tp.topic_id, packed[at + 4:at + 4 + length].decode(), tp.partition)
    return cast(RemoteLogSegmentMetadata, _make_segment(
        _make_segment_id(tp, _make_uuid(_from_bytes(segment_id, "big"), _UNKNOWN_SAFETY)), start, end, max_timestamp,
        broker, event_timestamp, size, epochs, custom, _STATES[state], _TXN[flags & _TXN_IDX_EMPTY]))


def size_of(packed: bytes) -> int:
    """The packed segment's size in bytes (segment_size_in_bytes)."""
    return cast(int, _SIZE.unpack_from(packed, _SIZE_AT)[0])


def uuid_of(value: int) -> uuid.UUID:
    """uuid.UUID(int=value), made the way rlmm.types makes decoded ids (a fifth of the constructor's time)."""
    return cast(uuid.UUID, _make_uuid(value, _UNKNOWN_SAFETY))


unpack: Callable[[bytes, TopicIdPartition], RemoteLogSegmentMetadata]
if _slots is not None:  # the plain layouts (most segments) in C, in about half the time: rlmm/_slots.c
    unpack = _slots.unpacker(_make_segment, _make_segment_id, _make_uuid, _make_one_epoch, _STATES, _UNKNOWN_SAFETY,
                             _unpack)
else:
    unpack = _unpack
