"""The agent as the JVM adapter sees it: a Unix socket only its owner may use, lifecycle calls, tierlog's
errors as status codes the adapter maps to Kafka's exceptions, and segments streamed back in chunks."""

from __future__ import annotations

import logging
import socket
import stat
import uuid
from pathlib import Path
from urllib.request import urlopen

import grpc
import pytest
from agent_testkit import AgentUnderTest
from support.agent_segments import copy_segment, segment_metadata

from rlmm.errors import ConfigError
from rlmm.types import RemoteLogSegmentMetadata, TopicIdPartition
from tierlog.agent import messages
from tierlog.agent.components import ComponentName
from tierlog.agent.proto import agent_pb2 as pb
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc
from tierlog.agent.server import AgentServer
from tierlog.agent.servicers import CHUNK_BYTES

TP = TopicIdPartition(topic_id=uuid.uuid4(), topic="orders", partition=3)


def _copy(agent: AgentUnderTest, directory: Path, log: bytes) -> RemoteLogSegmentMetadata:
    return copy_segment(agent.storage, directory, log, segment_metadata(TP, len(log)))


def test_socket_is_readable_and_writable_by_its_owner_only(agent: AgentUnderTest) -> None:
    mode = stat.S_IMODE(agent.socket.stat().st_mode)
    assert mode == 0o600


def test_health_names_the_configured_components(agent: AgentUnderTest, rsm_config: dict[str, str]) -> None:
    agent.configure_rsm(rsm_config)

    health = agent.agent.Health(pb.Empty(), timeout=5)

    assert health.serving
    assert list(health.configured) == [pb.REMOTE_STORAGE_MANAGER]


def test_configure_with_an_unknown_key_fails_naming_the_key(
    agent: AgentUnderTest, rsm_config: dict[str, str]
) -> None:
    with pytest.raises(grpc.RpcError) as failure:
        agent.configure_rsm({**rsm_config, "s3.bucekt": "x"})

    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "s3.bucekt" in failure.value.details()


def test_call_to_an_unconfigured_component_asks_the_adapter_to_configure_it(agent: AgentUnderTest) -> None:
    with pytest.raises(grpc.RpcError) as failure:
        agent.storage.DeleteLogSegmentData(messages.segment_metadata_msg(segment_metadata(TP, 10)), timeout=5)

    assert failure.value.code() == grpc.StatusCode.FAILED_PRECONDITION


def test_configure_is_idempotent_for_an_equal_config(
    agent: AgentUnderTest, rsm_config: dict[str, str]
) -> None:
    agent.configure_rsm(rsm_config)
    agent.configure_rsm(rsm_config)

    assert list(agent.agent.Health(pb.Empty(), timeout=5).configured) == [pb.REMOTE_STORAGE_MANAGER]


def test_fetched_segment_streams_back_in_bounded_chunks(
    agent: AgentUnderTest, rsm_config: dict[str, str], tmp_path: Path
) -> None:
    agent.configure_rsm(rsm_config)
    log = bytes(range(256)) * (3 * CHUNK_BYTES // 256 + 7)
    segment = _copy(agent, tmp_path, log)

    chunks = [
        c.data
        for c in agent.storage.FetchLogSegment(
            pb.FetchSegmentRequest(metadata=messages.segment_metadata_msg(segment), start_position=0),
            timeout=30,
        )
    ]

    assert b"".join(chunks) == log
    assert len(chunks) >= 4
    assert max(len(c) for c in chunks) <= CHUNK_BYTES


def test_fetch_with_an_end_position_returns_the_inclusive_range(
    agent: AgentUnderTest, rsm_config: dict[str, str], tmp_path: Path
) -> None:
    agent.configure_rsm(rsm_config)
    log = bytes(range(256)) * 40
    segment = _copy(agent, tmp_path, log)

    chunks = agent.storage.FetchLogSegment(
        pb.FetchSegmentRequest(
            metadata=messages.segment_metadata_msg(segment), start_position=100, end_position=1099
        ),
        timeout=30,
    )

    assert b"".join(c.data for c in chunks) == log[100:1100]


def test_fetch_of_a_segment_never_copied_is_not_found(
    agent: AgentUnderTest, rsm_config: dict[str, str]
) -> None:
    agent.configure_rsm(rsm_config)

    with pytest.raises(grpc.RpcError) as failure:
        list(
            agent.storage.FetchLogSegment(
                pb.FetchSegmentRequest(
                    metadata=messages.segment_metadata_msg(segment_metadata(TP, 10)), start_position=0
                ),
                timeout=10,
            )
        )

    assert failure.value.code() == grpc.StatusCode.NOT_FOUND


def test_missing_transaction_index_is_not_found_and_logs_nothing_at_info(
    agent: AgentUnderTest, rsm_config: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    agent.configure_rsm(rsm_config)
    segment = _copy(agent, tmp_path, b"x" * 100)
    caplog.set_level(logging.INFO, logger="tierlog")
    caplog.clear()

    with pytest.raises(grpc.RpcError) as failure:
        list(
            agent.storage.FetchIndex(
                pb.FetchIndexRequest(
                    metadata=messages.segment_metadata_msg(segment), index_type=pb.TRANSACTION
                ),
                timeout=10,
            )
        )

    assert failure.value.code() == grpc.StatusCode.NOT_FOUND
    # Most segments have no transaction index: a healthy read must not write a line per segment.
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []


def test_metrics_endpoint_counts_calls_by_method_and_status(agent: AgentUnderTest) -> None:
    agent.agent.Health(pb.Empty(), timeout=5)

    with urlopen(f"http://127.0.0.1:{agent.server.metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()

    assert 'tierlog_agent_calls_total{code="OK",method="Health",outcome="ok",service="Agent"} 1.0' in text


def test_closing_every_component_stops_an_agent_that_exits_when_idle(
    short_dir: Path, rsm_config: dict[str, str]
) -> None:
    server = AgentServer({}, short_dir / "idle.sock", exit_when_idle=True).start()
    try:
        with grpc.insecure_channel(f"unix:{server.socket_path}") as channel:
            stub = pb_grpc.AgentStub(channel)
            stub.Configure(
                pb.ConfigureRequest(component=pb.REMOTE_STORAGE_MANAGER, config=rsm_config), timeout=10
            )
            assert not server.stopped.is_set()
            stub.Close(pb.CloseRequest(component=pb.REMOTE_STORAGE_MANAGER), timeout=10)

        assert server.stopped.wait(5)
    finally:
        server.stop(grace=1)


def test_second_agent_refuses_a_socket_a_live_agent_serves(agent: AgentUnderTest) -> None:
    with pytest.raises(ConfigError, match=str(agent.socket)):
        AgentServer({}, agent.socket).start()


def test_stale_socket_of_a_dead_agent_is_replaced(short_dir: Path) -> None:
    path = short_dir / "stale.sock"
    # A socket file nobody listens on any more, as a SIGKILLed agent leaves behind.
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()
    assert path.exists()

    server = AgentServer({}, path).start()
    try:
        with grpc.insecure_channel(f"unix:{path}") as channel:
            assert pb_grpc.AgentStub(channel).Health(pb.Empty(), timeout=5).serving
    finally:
        server.stop(grace=1)


def test_component_in_the_agents_own_config_is_created_at_start_and_keeps_it(
    short_dir: Path, tmp_path: Path, rsm_config: dict[str, str]
) -> None:
    own = {"rsm.storage.backend": "filesystem", "rsm.filesystem.root": str(tmp_path / "own")}
    server = AgentServer(own, short_dir / "own.sock").start()
    try:
        with grpc.insecure_channel(f"unix:{server.socket_path}") as channel:
            stub = pb_grpc.AgentStub(channel)
            # The broker's config for a component the agent already runs is not used.
            stub.Configure(
                pb.ConfigureRequest(component=pb.REMOTE_STORAGE_MANAGER, config=rsm_config), timeout=10
            )
            assert list(stub.Health(pb.Empty(), timeout=5).configured) == [pb.REMOTE_STORAGE_MANAGER]
        assert server.components.slot(ComponentName.REMOTE_STORAGE_MANAGER).config["filesystem.root"] == str(
            tmp_path / "own"
        )
    finally:
        server.stop(grace=1)


def test_agent_config_key_without_a_component_prefix_is_rejected_by_name(short_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"storage\.backend"):
        AgentServer({"storage.backend": "filesystem"}, short_dir / "bad.sock")
