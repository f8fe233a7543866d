"""The agent reads segment files only inside the broker's log directories (issue 10): a copy request
naming any other file is refused with INVALID_ARGUMENT, symlinks resolved before the check."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlmm.types import RemoteLogSegmentId, RemoteLogSegmentMetadata, TopicIdPartition
from tierlog.agent import messages
from tierlog.agent.proto import agent_pb2 as pb
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc
from tierlog.agent.server import AgentServer


@pytest.fixture
def channel() -> Iterator[grpc.Channel]:
    # Unix socket paths must stay under ~100 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="tlo-") as directory:
        socket = Path(directory) / "agent.sock"
        server = AgentServer({}, socket, metrics_port=0).start()
        opened = grpc.insecure_channel(f"unix:{socket}")
        try:
            yield opened
        finally:
            opened.close()
            server.stop(grace=1)


def _segment_files(directory: Path) -> dict[str, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    files = {}
    for name, data in {"log": b"x" * 64, "index": b"\0" * 16, "timeindex": b"\0" * 24, "snapshot": b"s"}.items():
        files[name] = directory / f"00000000000000000000.{name}"
        files[name].write_bytes(data)
    return files


def _copy(channel: grpc.Channel, files: dict[str, Path]) -> Any:
    tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
    segment = RemoteLogSegmentMetadata(
        remote_log_segment_id=RemoteLogSegmentId(tp, uuid.uuid4()), start_offset=0, end_offset=9,
        max_timestamp_ms=1, broker_id=1, event_timestamp_ms=1, segment_size_in_bytes=64,
        segment_leader_epochs={0: 0},
    )
    return pb_grpc.RemoteStorageStub(channel).CopyLogSegmentData(
        pb.CopyRequest(
            metadata=messages.segment_metadata_msg(segment), log_segment=str(files["log"]),
            offset_index=str(files["index"]), time_index=str(files["timeindex"]),
            producer_snapshot_index=str(files["snapshot"]), leader_epoch_index=b"0\n1\n0 0\n",
        ),
        timeout=30,
    )


def _configure(channel: grpc.Channel, tmp_path: Path, log_dirs_key: str, log_dirs: str) -> None:
    config = {"storage.backend": "filesystem", "filesystem.root": str(tmp_path / "remote"), "broker.id": "1",
              log_dirs_key: log_dirs}
    pb_grpc.AgentStub(channel).Configure(
        pb.ConfigureRequest(component=pb.REMOTE_STORAGE_MANAGER, config=config), timeout=10
    )


def test_a_copy_of_files_in_a_log_dir_succeeds(channel: grpc.Channel, tmp_path: Path) -> None:
    _configure(channel, tmp_path, "log.dirs", f"{tmp_path / 'other'},{tmp_path / 'logs'}")
    answer = _copy(channel, _segment_files(tmp_path / "logs" / "orders-0"))
    assert answer.HasField("custom_metadata")


def test_a_copy_naming_a_file_outside_the_log_dirs_is_invalid_argument(
    channel: grpc.Channel, tmp_path: Path
) -> None:
    _configure(channel, tmp_path, "log.dir", str(tmp_path / "logs"))
    files = {**_segment_files(tmp_path / "logs" / "orders-0"), "log": Path("/etc/shadow")}
    with pytest.raises(grpc.RpcError) as raised:
        _copy(channel, files)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "/etc/shadow" in (raised.value.details() or "")
    assert "log.dirs" in (raised.value.details() or "")
    assert not list((tmp_path / "remote").rglob("*.log"))


def test_a_symlink_in_a_log_dir_pointing_outside_is_refused(channel: grpc.Channel, tmp_path: Path) -> None:
    _configure(channel, tmp_path, "log.dirs", str(tmp_path / "logs"))
    files = _segment_files(tmp_path / "logs" / "orders-0")
    secret = tmp_path / "secret.txt"
    secret.write_text("not a segment")
    link = tmp_path / "logs" / "orders-0" / "00000000000000000010.log"
    link.symlink_to(secret)
    with pytest.raises(grpc.RpcError) as raised:
        _copy(channel, {**files, "log": link})
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert str(secret) in (raised.value.details() or "")


def test_a_dot_dot_path_escaping_the_log_dir_is_refused(channel: grpc.Channel, tmp_path: Path) -> None:
    _configure(channel, tmp_path, "log.dirs", str(tmp_path / "logs"))
    files = _segment_files(tmp_path / "logs" / "orders-0")
    outside = _segment_files(tmp_path / "elsewhere")
    sneaky = tmp_path / "logs" / ".." / "elsewhere" / outside["index"].name
    with pytest.raises(grpc.RpcError) as raised:
        _copy(channel, {**files, "index": sneaky})
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT


def _broker_without_log_dirs(channel: grpc.Channel, root: Path) -> None:
    # What Kafka hands its RSM: rsm.config.* and broker.id, no log.dirs.
    pb_grpc.AgentStub(channel).Configure(pb.ConfigureRequest(
        component=pb.REMOTE_STORAGE_MANAGER,
        config={"storage.backend": "filesystem", "filesystem.root": str(root / "remote"), "broker.id": "1"},
    ), timeout=30)


def test_without_log_dirs_only_files_inside_a_kafka_log_dir_are_read(channel: grpc.Channel, tmp_path: Path) -> None:
    _broker_without_log_dirs(channel, tmp_path)
    log_dir = tmp_path / "kafka-logs"
    (log_dir / "orders-0").mkdir(parents=True)
    (log_dir / "meta.properties").write_text("version=1\n")

    assert _copy(channel, _segment_files(log_dir / "orders-0")).HasField("custom_metadata")
    with pytest.raises(grpc.RpcError) as failure:
        _copy(channel, {**_segment_files(log_dir / "orders-0"), "log": Path("/etc/shadow")})
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "meta.properties" in (failure.value.details() or "")
    with pytest.raises(grpc.RpcError) as failure:
        _copy(channel, _segment_files(tmp_path / "elsewhere" / "orders-0"))
    assert failure.value.code() == grpc.StatusCode.INVALID_ARGUMENT
