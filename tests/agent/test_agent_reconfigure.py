"""An rlmm whose creation failed in the agent is reported unconfigured to IsReady, never merely "not ready": the
broker's copy and expiration tasks ask only IsReady, so "not ready" would keep the adapter from configuring it
again and tiering would stop for good (as after an agent was killed and two of its replacement's rlmms raced).

The rlmm is real (the dev Kafka, its RocksDB view in a directory of the test's own); the agent runs in-process,
so a second opener of the view fails as in the CI run that found this: "lock hold by current process".
"""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path

import grpc
import pytest
from agent_testkit import AgentUnderTest

from dev.demo import wait_for
from rlmm.types import TopicIdPartition
from rlmm.view import MetadataView
from tierlog.agent import messages
from tierlog.agent.proto import agent_pb2 as pb

TP = TopicIdPartition(topic_id=uuid.uuid4(), topic="orders", partition=0)


@pytest.fixture
def rlmm_config(kafka_bootstrap: str, unique_topic: str, tmp_path: Path) -> dict[str, str]:
    """What a broker's RLMM configure() sends: its own metadata topic and state directory."""
    return {
        "bootstrap.servers": kafka_bootstrap,
        "broker.id": "0",
        "state.dir": str(tmp_path / "rlmm-state"),
        "metadata.topic.name": f"__tierlog_metadata_{unique_topic}",
        "metadata.topic.num.partitions": "1",
        "metadata.topic.replication.factor": "1",
        "metadata.topic.min.insync.replicas": "1",
    }


def _configure(agent: AgentUnderTest, config: dict[str, str]) -> None:
    """As the adapter after FAILED_PRECONDITION: configure, then replay the leadership the agent forgot."""
    agent.agent.Configure(pb.ConfigureRequest(component=pb.REMOTE_LOG_METADATA_MANAGER, config=config), timeout=30)
    leaders = pb.LeadershipChanges(leaders=[messages.topic_id_partition_msg(TP)])
    agent.metadata.OnPartitionLeadershipChanges(leaders, timeout=30)


def _ready(agent: AgentUnderTest) -> bool:
    return bool(agent.metadata.IsReady(messages.topic_id_partition_msg(TP), timeout=30).ready)


def test_an_rlmm_whose_creation_failed_is_unconfigured_until_configured_again(
    agent: AgentUnderTest, rlmm_config: dict[str, str]
) -> None:
    holder = MetadataView.open(rlmm_config["state.dir"])  # the view's one opener: creating the rlmm fails
    try:
        with contextlib.suppress(grpc.RpcError):  # failed within Configure's wait, or fails after it
            _configure(agent, rlmm_config)

        def refused() -> grpc.RpcError | None:
            try:
                _ready(agent)
            except grpc.RpcError as exc:
                return exc
            return None

        failure = wait_for(refused, 30, "IsReady to report the failed rlmm")
        assert failure.code() == grpc.StatusCode.FAILED_PRECONDITION, failure.details()
        assert "lock" in failure.details()
    finally:
        holder.close()

    _configure(agent, rlmm_config)
    wait_for(lambda: _ready(agent), 60, f"the agent's rlmm to be ready for {TP}")
