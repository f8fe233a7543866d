"""FetchLogSegment, the streamed read path, tells the rsm the partition's next segment as FetchLogSegmentFiles does
(its request cannot name one, so the agent asks its own rlmm): a reader streaming the end of one segment finds the
next one's first chunk already in the disk chunk cache.

The rlmm is real (the dev Kafka, its own metadata topic and state directory); the agent runs in-process.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from pathlib import Path

import pytest
from agent_testkit import AgentUnderTest
from support.agent_segments import copy_segment, segment_metadata

from dev.demo import wait_for
from rlmm.types import RemoteLogSegmentMetadataUpdate, RemoteLogSegmentState, TopicIdPartition
from tierlog.agent import messages
from tierlog.agent.components import ComponentName
from tierlog.agent.proto import agent_pb2 as pb

CHUNK = 16 << 10
SEGMENT = 100_000


@pytest.fixture
def tiered(agent: AgentUnderTest, kafka_bootstrap: str, unique_topic: str, short_dir: Path) -> TopicIdPartition:
    """An agent hosting an rlmm that leads one partition and an rsm with a disk chunk cache."""
    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    agent.agent.Configure(pb.ConfigureRequest(component=pb.REMOTE_LOG_METADATA_MANAGER, config={
        "bootstrap.servers": kafka_bootstrap, "broker.id": "0", "state.dir": str(short_dir / "rlmm-state"),
        "metadata.topic.name": f"__tierlog_metadata_{unique_topic}", "metadata.topic.num.partitions": "1",
        "metadata.topic.replication.factor": "1", "metadata.topic.min.insync.replicas": "1",
    }), timeout=60)
    agent.metadata.OnPartitionLeadershipChanges(
        pb.LeadershipChanges(leaders=[messages.topic_id_partition_msg(tp)]), timeout=30
    )
    wait_for(lambda: agent.metadata.IsReady(messages.topic_id_partition_msg(tp), timeout=30).ready, 60,
             f"the agent's rlmm to be ready for {tp}")
    agent.configure_rsm({
        "storage.backend": "filesystem", "filesystem.root": str(short_dir / "remote"), "chunk.size": str(CHUNK),
        "fetch.chunk.cache.class": "disk", "fetch.chunk.cache.path": str(short_dir / "cache"),
    })
    return tp


def test_streaming_a_segments_end_prefetches_the_next_segment_the_rlmm_knows(
    agent: AgentUnderTest, tiered: TopicIdPartition, short_dir: Path
) -> None:
    first_bytes, second_bytes = random.Random(1).randbytes(SEGMENT), random.Random(2).randbytes(SEGMENT)
    first = segment_metadata(tiered, SEGMENT)
    second = dataclasses.replace(
        segment_metadata(tiered, SEGMENT), start_offset=100, end_offset=199, segment_leader_epochs={0: 100}
    )
    log_dir = short_dir / "logs"
    log_dir.mkdir()
    for metadata, data in ((first, first_bytes), (second, second_bytes)):
        agent.metadata.AddRemoteLogSegmentMetadata(messages.segment_metadata_msg(metadata), timeout=30)
        copied = copy_segment(agent.storage, log_dir, data, metadata)
        finished = RemoteLogSegmentMetadataUpdate(
            metadata.remote_log_segment_id, 2, copied.custom_metadata, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 0
        )
        agent.metadata.UpdateRemoteLogSegmentMetadata(messages.segment_update_msg(finished), timeout=30)
        if metadata is first:
            first = copied

    request = pb.FetchSegmentRequest(metadata=messages.segment_metadata_msg(first), start_position=SEGMENT - 100)
    streamed = b"".join(chunk.data for chunk in agent.storage.FetchLogSegment(request, timeout=30))

    assert streamed == first_bytes[-100:]
    rsm = agent.server.components.get(ComponentName.REMOTE_STORAGE_MANAGER, 5)
    assert rsm.prefetch_idle(30)
    cached = short_dir / "cache" / str(second.remote_log_segment_id.id) / "0"
    assert cached.read_bytes() == second_bytes[:CHUNK]
