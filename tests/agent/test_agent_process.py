"""The agent as a process (`python -m tierlog.agent.server`, what the JVM adapter runs): SIGTERM stops it gracefully
and removes its socket; it also stops when the broker that started it is gone."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc

from tierlog.agent.proto import agent_pb2 as pb
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc


def _wait_serving(socket: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if socket.exists():
            with grpc.insecure_channel(f"unix:{socket}") as channel:
                try:
                    if pb_grpc.AgentStub(channel).Health(pb.Empty(), timeout=2).serving:
                        return
                except grpc.RpcError:
                    pass
        time.sleep(0.1)
    raise TimeoutError(f"no agent answered on {socket}")


def test_sigterm_stops_the_agent_and_removes_its_socket(short_dir: Path) -> None:
    socket = short_dir / "term.sock"
    agent = subprocess.Popen([sys.executable, "-m", "tierlog.agent.server", "--socket", str(socket)])
    try:
        _wait_serving(socket)

        agent.send_signal(signal.SIGTERM)

        assert agent.wait(20) == 0
        assert not socket.exists()
    finally:
        agent.kill()


def test_agent_exits_when_its_parent_process_is_gone(short_dir: Path) -> None:
    socket = short_dir / "orphan.sock"
    parent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    agent = subprocess.Popen(
        [sys.executable, "-m", "tierlog.agent.server", "--socket", str(socket), "--parent-pid", str(parent.pid)]
    )
    try:
        _wait_serving(socket)

        parent.kill()
        parent.wait(5)

        assert agent.wait(20) == 0
    finally:
        parent.kill()
        agent.kill()
