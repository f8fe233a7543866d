"""ListRemoteLogSegmentsAtOnce answers a partition of more segments than one answer holds with `stream_instead`
and no segments, for the adapter to list it through the stream (in-process: the bound lowered to one segment; the
listing in one answer against a real rlmm is in test_agent_server_properties.py). The Python client lists as the
adapter does: in one answer, else through the stream."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from support.agent_segments import segment_metadata

from rlmm import TopicIdPartition
from tierlog.agent import messages, servicers
from tierlog.agent.client import AgentClient
from tierlog.agent.components import Components
from tierlog.agent.metrics import AgentMetrics
from tierlog.agent.proto import agent_pb2 as pb
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc

TP = TopicIdPartition(uuid.uuid4(), "listings", 0)
SEGMENTS = [segment_metadata(TP, 100), segment_metadata(TP, 100)]


class _Listing:
    """What the servicer asks of the rlmm here: the partition's listing."""

    def list_remote_log_segments(self, tp: TopicIdPartition, epoch: int | None) -> list[Any]:
        assert tp == TP
        return SEGMENTS


class _Servicer(servicers.RemoteLogMetadataServicer):
    def rlmm(self, context: grpc.ServicerContext) -> Any:
        return _Listing()


class _CountingServicer(_Servicer):
    """Counts the listing calls it answers; `at_once` False answers that call as an agent without it does."""

    def __init__(self, at_once: bool) -> None:
        super().__init__(Components({}), AgentMetrics())
        self.at_once = at_once
        self.calls: list[str] = []

    def ListRemoteLogSegmentsAtOnce(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls.append("at once")
        if not self.at_once:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        return super().ListRemoteLogSegmentsAtOnce(request, context)

    def ListRemoteLogSegments(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.calls.append("stream")
        return super().ListRemoteLogSegments(request, context)


@pytest.mark.parametrize("at_once, over_the_bound, calls", [
    (True, False, ["at once"]),
    (True, True, ["at once", "stream"]),
    (False, False, ["at once", "stream"]),
])
def test_the_client_lists_in_one_answer_else_through_the_stream(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: bool, over_the_bound: bool, calls: list[str]) -> None:
    if over_the_bound:
        monkeypatch.setattr(servicers, "LIST_AT_ONCE_MAX", 1)
    servicer = _CountingServicer(at_once)
    server = grpc.server(ThreadPoolExecutor(2))
    pb_grpc.add_RemoteLogMetadataServicer_to_server(servicer, server)
    socket = tmp_path / "agent.sock"
    server.add_insecure_port(f"unix:{socket}")
    server.start()
    try:
        with AgentClient(socket, timeout=10) as client:
            assert client.list_remote_log_segments(TP) == SEGMENTS
    finally:
        server.stop(grace=None)
    assert servicer.calls == calls


def test_a_partition_over_the_bound_is_answered_stream_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    servicer = _Servicer(Components({}), AgentMetrics())
    query = pb.ListQuery(topic_id_partition=messages.topic_id_partition_msg(TP))
    at_once = servicer.ListRemoteLogSegmentsAtOnce(query, None)
    assert not at_once.stream_instead
    assert [messages.segment_metadata(m) for m in at_once.segments] == SEGMENTS
    monkeypatch.setattr(servicers, "LIST_AT_ONCE_MAX", 1)
    assert servicer.ListRemoteLogSegmentsAtOnce(query, None) == pb.SegmentList(stream_instead=True)
