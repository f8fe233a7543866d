"""A Python client of a running agent (the same protocol the JVM adapter speaks), for tools and tests:
ask what the broker's rlmm holds for a partition, or whether the agent is healthy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from rlmm.types import RemoteLogSegmentMetadata, TopicIdPartition
from tierlog.agent import messages
from tierlog.agent.proto import agent_pb2 as pb
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class AgentHealth:
    serving: bool
    configured: tuple[str, ...]
    pid: int


class AgentClient:
    """Blocking calls with a deadline against the agent serving on `socket_path`."""

    def __init__(self, socket_path: str | Path, timeout: float = 10.0) -> None:
        self.socket_path = Path(socket_path)
        self.timeout = timeout
        self._channel = grpc.insecure_channel(f"unix:{self.socket_path}")
        self._agent = pb_grpc.AgentStub(self._channel)
        self._metadata = pb_grpc.RemoteLogMetadataStub(self._channel)

    def __enter__(self) -> AgentClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def health(self) -> AgentHealth:
        answer: Any = self._agent.Health(pb.Empty(), timeout=self.timeout)
        names = tuple(pb.Component.Name(c) for c in answer.configured)
        return AgentHealth(answer.serving, names, answer.pid)

    def list_remote_log_segments(
        self, tp: TopicIdPartition, epoch: int | None = None
    ) -> list[RemoteLogSegmentMetadata]:
        """What the broker's rlmm lists for `tp`; grpc.RpcError (NOT_FOUND) for an unknown partition."""
        query = pb.ListQuery(topic_id_partition=messages.topic_id_partition_msg(tp))
        if epoch is not None:
            query.epoch = epoch
        # In one answer, as the adapter asks; streamed when the partition is too large for one, or the agent is
        # older than that call.
        try:
            answer: Any = self._metadata.ListRemoteLogSegmentsAtOnce(query, timeout=self.timeout)
        except grpc.RpcError as error:
            if error.code() is not grpc.StatusCode.UNIMPLEMENTED:
                raise
        else:
            if not answer.stream_instead:
                return [messages.segment_metadata(m) for m in answer.segments]
        return [
            messages.segment_metadata(m)
            for m in self._metadata.ListRemoteLogSegments(query, timeout=self.timeout)
        ]

