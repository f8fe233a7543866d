"""An empty or missing S3 secret is refused when the rsm is configured, naming the key (issue 10); a wrong one, or a
missing bucket, is found by the agent at start against the real S3 server: the rsm stays not ready (its metric) while
the check fails, and the failure is one log line then a count, as are repeated copy failures (issue 24)."""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.request import urlopen

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.agent_segments import copy_segment
from support.buckets import delete_bucket, unique_bucket_name

from rsm import ConfigError, RemoteStorageError, RemoteStorageManager
from rsm.failure_log import RepeatedFailureLog
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc
from tierlog.agent.server import AgentServer

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

S3 = {"storage.backend": "s3", "s3.bucket": "b", "s3.endpoint.url": "http://127.0.0.1:1"}


def test_an_empty_secret_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"config key s3\.secret\.access\.key is empty"):
        RemoteStorageManager({**S3, "s3.access.key.id": "AKIA", "s3.secret.access.key": ""})


def test_a_blank_secret_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"config key s3\.secret\.access\.key is empty"):
        RemoteStorageManager({**S3, "s3.access.key.id": "AKIA", "s3.secret.access.key": "   "})


def test_a_missing_secret_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"config key s3\.secret\.access\.key is missing"):
        RemoteStorageManager({**S3, "s3.access.key.id": "AKIA"})


def test_an_empty_access_key_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"config key s3\.access\.key\.id is empty"):
        RemoteStorageManager({**S3, "s3.access.key.id": "", "s3.secret.access.key": "secret"})


# -- issue 24: bad credentials or a missing bucket show at start, and a repeated failure is one line and a count ----


def _readiness(server: AgentServer) -> float:
    with urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == "tierlog_agent_component_ready" and s.labels["component"] == "rsm")


def _rsm_errors(server: AgentServer) -> dict[tuple[str, str], float]:
    with urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {(s.labels["operation"], s.labels["code"]): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name == "tierlog_rsm_operation_errors_total"}


def _wait(check: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.05)


@pytest.fixture
def start_agent(short_dir: Path, s3_config: dict[str, str]) -> Iterator[Callable[..., AgentServer]]:
    started: list[AgentServer] = []

    def start(bucket: str, **overrides: str) -> AgentServer:
        rsm = {"storage.backend": "s3", "s3.bucket": bucket, "s3.endpoint.url": s3_config["endpoint"],
               "s3.region": s3_config["region"], "s3.access.key.id": s3_config["access_key"],
               "s3.secret.access.key": s3_config["secret_key"], "s3.retries.max": "0", **overrides}
        server = AgentServer({f"rsm.{k}": v for k, v in rsm.items()}, short_dir / f"{len(started)}.sock",
                             metrics_port=0).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop(grace=1)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="tls-") as directory:
        yield Path(directory)


def _lines(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and r.levelno >= logging.INFO]


def test_a_wrong_secret_keeps_the_rsm_not_ready_and_is_logged_once_in_one_line(
    start_agent: Callable[..., AgentServer], s3_bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    server = start_agent(s3_bucket, **{"s3.secret.access.key": "not-the-secret"})
    # Several background attempts (0.5 s, then 1 s later), none of them ready.
    _wait(lambda: _rsm_errors(server).get(("backend.check", "SignatureDoesNotMatch"), 0) >= 3, "three checks")
    assert _readiness(server) == 0

    (line,) = _lines(caplog, "tierlog.agent.storage_check")
    assert line.levelno == logging.WARNING and line.exc_info is None
    message = line.getMessage()
    assert "failed" in message and "SignatureDoesNotMatch" in message and s3_bucket in message
    assert "\n" not in message and "not-the-secret" not in message


def test_repeated_copy_failures_are_logged_once_then_counted(
    start_agent: Callable[..., AgentServer], s3_bucket: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = start_agent(s3_bucket, **{"s3.secret.access.key": "not-the-secret"})
    caplog.set_level(logging.INFO)
    with grpc.insecure_channel(f"unix:{server.socket_path}") as channel:
        storage = pb_grpc.RemoteStorageStub(channel)
        for _ in range(3):
            with pytest.raises(grpc.RpcError) as failure:
                copy_segment(storage, tmp_path, b"segment bytes")
            assert failure.value.code() == grpc.StatusCode.INTERNAL

    (line,) = _lines(caplog, "tierlog.agent.servicers")
    assert "RemoteStorage.CopyLogSegmentData failed" in line.getMessage() and line.exc_info is None
    assert _rsm_errors(server)[("rsm.copy_log_segment_data", "SignatureDoesNotMatch")] == 3


def test_a_missing_bucket_is_not_ready_until_it_exists_then_ready_with_one_line(
    start_agent: Callable[..., AgentServer], s3_client: S3Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    bucket = unique_bucket_name()
    server = start_agent(bucket)
    _wait(lambda: _rsm_errors(server).get(("backend.check", "NoSuchBucket"), 0) >= 1, "the first check")
    assert _readiness(server) == 0
    s3_client.create_bucket(Bucket=bucket)
    try:
        _wait(lambda: _readiness(server) == 1, "the rsm ready once its bucket exists")
    finally:
        delete_bucket(s3_client, bucket)

    failed, recovered = _lines(caplog, "tierlog.agent.storage_check")
    assert "NoSuchBucket" in failed.getMessage()
    assert "works again after" in recovered.getMessage()


def test_a_repeated_failure_is_reported_at_a_decaying_rate_and_its_recovery_once(
    caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    failures = RepeatedFailureLog(logging.getLogger("test.failures"), "the check", clock=lambda: now[0])
    caplog.set_level(logging.INFO, logger="test.failures")
    for _ in range(700):  # one failure a second for 700 s
        failures.failed(RemoteStorageError("S3 says no"))
        now[0] += 1.0
    failures.succeeded()

    messages = [r.getMessage() for r in caplog.records]
    assert messages[0] == "the check failed: RemoteStorageError: S3 says no"
    # Then after 10 s, 20 s more, 40, 80, 160, and at most every 300 s: 10, 30, 70, 150, 310, 610.
    assert [m.split("(")[1].split()[0] for m in messages[1:-1]] == ["11", "31", "71", "151", "311", "611"]
    assert messages[-1] == "the check works again after 700 failed attempts"
    assert failures.retry_s == 0.5
