"""Segments copied through a running agent, as a broker would: files laid out in a Kafka log directory
(the agent reads segment files only inside one), metadata sent over gRPC."""

from __future__ import annotations

import dataclasses
import uuid
from pathlib import Path
from typing import Any

from rlmm import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition
from tierlog.agent import messages
from tierlog.agent.proto import agent_pb2 as pb


def segment_metadata(tp: TopicIdPartition, size: int) -> RemoteLogSegmentMetadata:
    return RemoteLogSegmentMetadata(
        remote_log_segment_id=RemoteLogSegmentId(tp, uuid.uuid4()),
        start_offset=0,
        end_offset=99,
        max_timestamp_ms=1,
        broker_id=1,
        event_timestamp_ms=1,
        segment_size_in_bytes=size,
        segment_leader_epochs={0: 0},
    )


def copy_segment(
    storage: Any, directory: Path, log: bytes, metadata: RemoteLogSegmentMetadata | None = None
) -> RemoteLogSegmentMetadata:
    """Copy a segment (without a transaction index) through the agent; return its metadata with the
    custom metadata the copy returned."""
    segment = metadata or segment_metadata(TopicIdPartition(uuid.uuid4(), "orders", 0), len(log))
    # Laid out as a broker's log dir: the agent reads segment files only inside one.
    (directory / "meta.properties").write_text("version=1\n")
    directory = directory / "orders-0"
    directory.mkdir(exist_ok=True)
    files = {}
    for name, data in {"log": log, "index": b"\0" * 16, "timeindex": b"\0" * 24, "snapshot": b"snap"}.items():
        files[name] = directory / f"{segment.remote_log_segment_id.id}.{name}"
        files[name].write_bytes(data)
    answer = storage.CopyLogSegmentData(
        pb.CopyRequest(
            metadata=messages.segment_metadata_msg(segment),
            log_segment=str(files["log"]),
            offset_index=str(files["index"]),
            time_index=str(files["timeindex"]),
            producer_snapshot_index=str(files["snapshot"]),
            leader_epoch_index=b"0\n1\n0 0\n",
        ),
        timeout=60,
    )
    custom = answer.custom_metadata if answer.HasField("custom_metadata") else None
    return dataclasses.replace(segment, custom_metadata=custom)
