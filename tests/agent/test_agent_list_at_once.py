"""ListRemoteLogSegmentsAtOnce answers a partition of more segments than one answer holds with `stream_instead`
and no segments, for the adapter to list it through the stream (in-process: the bound lowered to one segment; the
listing in one answer against a real rlmm is in test_agent_server_properties.py)."""

from __future__ import annotations

import uuid
from typing import Any

import grpc
import pytest
from support.agent_segments import segment_metadata

from rlmm import TopicIdPartition
from tierlog.agent import messages, servicers
from tierlog.agent.components import Components
from tierlog.agent.metrics import AgentMetrics
from tierlog.agent.proto import agent_pb2 as pb

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


def test_a_partition_over_the_bound_is_answered_stream_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    servicer = _Servicer(Components({}), AgentMetrics())
    query = pb.ListQuery(topic_id_partition=messages.topic_id_partition_msg(TP))
    at_once = servicer.ListRemoteLogSegmentsAtOnce(query, None)
    assert not at_once.stream_instead
    assert [messages.segment_metadata(m) for m in at_once.segments] == SEGMENTS
    monkeypatch.setattr(servicers, "LIST_AT_ONCE_MAX", 1)
    assert servicer.ListRemoteLogSegmentsAtOnce(query, None) == pb.SegmentList(stream_instead=True)
