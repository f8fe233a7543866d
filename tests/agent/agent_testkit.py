"""The agent under test: an in-process AgentServer and stubs of the protocol the JVM adapter speaks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from tierlog.agent.proto import agent_pb2 as pb
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc
from tierlog.agent.server import AgentServer


@dataclass
class AgentUnderTest:
    server: AgentServer
    socket: Path
    channel: grpc.Channel

    @property
    def agent(self) -> Any:
        return pb_grpc.AgentStub(self.channel)

    @property
    def metadata(self) -> Any:
        return pb_grpc.RemoteLogMetadataStub(self.channel)

    @property
    def storage(self) -> Any:
        return pb_grpc.RemoteStorageStub(self.channel)

    def configure_rsm(self, config: dict[str, str]) -> None:
        self.agent.Configure(
            pb.ConfigureRequest(component=pb.REMOTE_STORAGE_MANAGER, config=config), timeout=10
        )
