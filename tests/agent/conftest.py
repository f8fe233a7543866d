"""Fixtures for the agent tests: an agent serving in-process on a Unix socket, hosting a real rsm on the
filesystem backend, and a gRPC client speaking the same protocol as the JVM adapter."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from agent_testkit import AgentUnderTest

from tierlog.agent.server import AgentServer


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Unix socket paths must stay under ~100 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="tla-") as directory:
        yield Path(directory)


@pytest.fixture
def agent(short_dir: Path) -> Iterator[AgentUnderTest]:
    socket = short_dir / f"{uuid.uuid4().hex[:8]}.sock"
    server = AgentServer({}, socket, metrics_port=0).start()
    channel = grpc.insecure_channel(f"unix:{socket}")
    try:
        yield AgentUnderTest(server, socket, channel)
    finally:
        channel.close()
        server.stop(grace=1)


@pytest.fixture
def rsm_config(tmp_path: Path) -> dict[str, str]:
    """The map a broker's RSM configure() would send: rsm.config.* plus what Kafka adds."""
    return {
        "storage.backend": "filesystem",
        "filesystem.root": str(tmp_path / "remote"),
        "broker.id": "1",
        "node.id": "1",
    }
