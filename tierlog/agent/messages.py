"""Conversions between the agent protocol's messages and tierlog's value types (rlmm.types, rsm.types).

One module owns the wire mapping; UUIDs travel as their 16 big-endian bytes, like Kafka's Uuid bits.
"""

from __future__ import annotations

import uuid
from typing import Any

from rlmm.errors import InvalidArgumentError
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from rsm.types import IndexType, LogSegmentData
from tierlog.agent.proto import agent_pb2 as pb


def _uuid(raw: bytes, what: str) -> uuid.UUID:
    if len(raw) != 16:
        raise InvalidArgumentError(f"{what} must be 16 bytes, got {len(raw)}")
    return uuid.UUID(bytes=raw)


def topic_id_partition(msg: Any) -> TopicIdPartition:
    return TopicIdPartition(
        topic_id=_uuid(msg.topic_id, "TopicIdPartition.topic_id"), topic=msg.topic, partition=msg.partition
    )


def topic_id_partition_msg(tp: TopicIdPartition) -> Any:
    return pb.TopicIdPartition(topic_id=tp.topic_id.bytes, topic=tp.topic, partition=tp.partition)


def segment_id(msg: Any) -> RemoteLogSegmentId:
    return RemoteLogSegmentId(
        topic_id_partition=topic_id_partition(msg.topic_id_partition),
        id=_uuid(msg.id, "RemoteLogSegmentId.id"),
    )


def segment_id_msg(sid: RemoteLogSegmentId) -> Any:
    return pb.RemoteLogSegmentId(
        topic_id_partition=topic_id_partition_msg(sid.topic_id_partition), id=sid.id.bytes
    )


def segment_metadata(msg: Any) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        remote_log_segment_id=segment_id(msg.remote_log_segment_id),
        start_offset=msg.start_offset,
        end_offset=msg.end_offset,
        max_timestamp_ms=msg.max_timestamp_ms,
        broker_id=msg.broker_id,
        event_timestamp_ms=msg.event_timestamp_ms,
        segment_size_in_bytes=msg.segment_size_in_bytes,
        segment_leader_epochs=dict(msg.segment_leader_epochs),
        custom_metadata=msg.custom_metadata if msg.HasField("custom_metadata") else None,
        state=RemoteLogSegmentState(msg.state),
        txn_idx_empty=msg.txn_idx_empty,
    )


def segment_metadata_msg(m: RemoteLogSegmentMetadata) -> Any:
    msg = pb.RemoteLogSegmentMetadata(
        remote_log_segment_id=segment_id_msg(m.remote_log_segment_id),
        start_offset=m.start_offset,
        end_offset=m.end_offset,
        max_timestamp_ms=m.max_timestamp_ms,
        broker_id=m.broker_id,
        event_timestamp_ms=m.event_timestamp_ms,
        segment_size_in_bytes=m.segment_size_in_bytes,
        segment_leader_epochs=dict(m.segment_leader_epochs),
        state=int(m.state),
        txn_idx_empty=m.txn_idx_empty,
    )
    if m.custom_metadata is not None:
        msg.custom_metadata = m.custom_metadata
    return msg


def segment_update(msg: Any) -> RemoteLogSegmentMetadataUpdate:
    return RemoteLogSegmentMetadataUpdate(
        remote_log_segment_id=segment_id(msg.remote_log_segment_id),
        event_timestamp_ms=msg.event_timestamp_ms,
        custom_metadata=msg.custom_metadata if msg.HasField("custom_metadata") else None,
        state=RemoteLogSegmentState(msg.state),
        broker_id=msg.broker_id,
    )


def segment_update_msg(u: RemoteLogSegmentMetadataUpdate) -> Any:
    msg = pb.RemoteLogSegmentMetadataUpdate(
        remote_log_segment_id=segment_id_msg(u.remote_log_segment_id),
        event_timestamp_ms=u.event_timestamp_ms,
        state=int(u.state),
        broker_id=u.broker_id,
    )
    if u.custom_metadata is not None:
        msg.custom_metadata = u.custom_metadata
    return msg


def partition_delete(msg: Any) -> RemotePartitionDeleteMetadata:
    return RemotePartitionDeleteMetadata(
        topic_id_partition=topic_id_partition(msg.topic_id_partition),
        state=RemotePartitionDeleteState(msg.state),
        event_timestamp_ms=msg.event_timestamp_ms,
        broker_id=msg.broker_id,
    )


def partition_delete_msg(d: RemotePartitionDeleteMetadata) -> Any:
    return pb.RemotePartitionDeleteMetadata(
        topic_id_partition=topic_id_partition_msg(d.topic_id_partition),
        state=int(d.state),
        event_timestamp_ms=d.event_timestamp_ms,
        broker_id=d.broker_id,
    )


def log_segment_data(msg: Any) -> LogSegmentData:
    return LogSegmentData(
        log_segment=msg.log_segment,
        offset_index=msg.offset_index,
        time_index=msg.time_index,
        transaction_index=msg.transaction_index if msg.HasField("transaction_index") else None,
        producer_snapshot_index=msg.producer_snapshot_index,
        leader_epoch_index=msg.leader_epoch_index,
    )


def index_type(value: int) -> IndexType:
    try:
        return IndexType(value)
    except ValueError:
        raise InvalidArgumentError(f"unknown index type {value}") from None
