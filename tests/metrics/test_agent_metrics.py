"""What Prometheus sees from an agent: its /metrics page scraped over HTTP and parsed with prometheus_client's
own parser, after real calls (rsm on the filesystem here; tests/metrics/test_dashboard.py adds Kafka and S3)."""

from __future__ import annotations

import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from metrics_testkit import fetch, fetch_index_chunks, scrape
from support.agent_segments import copy_segment

from tierlog.agent.proto import agent_pb2 as pb
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc
from tierlog.agent.server import AgentServer, main


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Unix socket paths must stay under ~100 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="tlm-") as directory:
        yield Path(directory)


@pytest.fixture
def agent(short_dir: Path, tmp_path: Path) -> Iterator[tuple[AgentServer, grpc.Channel]]:
    config = {"rsm.storage.backend": "filesystem", "rsm.filesystem.root": str(tmp_path / "remote")}
    server = AgentServer(config, short_dir / "a.sock", metrics_port=0).start()
    channel = grpc.insecure_channel(f"unix:{server.socket_path}")
    try:
        yield server, channel
    finally:
        channel.close()
        server.stop(grace=1)


def test_metrics_bind_loopback_by_default(agent: tuple[AgentServer, grpc.Channel]) -> None:
    server, _ = agent
    assert server.metrics._server.server_address[0] == "127.0.0.1"
    assert scrape(f"http://127.0.0.1:{server.metrics_port}/metrics").value("tierlog_agent_up") == 1


def test_metrics_bind_the_configured_address(short_dir: Path) -> None:
    # ::1 is another address than the default and still loopback-only, as tests must be.
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    server = AgentServer({}, short_dir / "b.sock", metrics_port=0, metrics_address="::1").start()
    try:
        assert server.metrics._server.server_address[0] == "::1"
        assert scrape(f"http://[::1]:{server.metrics_port}/metrics").value("tierlog_agent_up") == 1
        with pytest.raises(OSError):
            scrape(f"http://127.0.0.1:{server.metrics_port}/metrics")
    finally:
        server.stop(grace=1)


@pytest.fixture
def served_with(monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """The options the agent's main() passes to serve(), which does not run. Nor does main's logging setup: it points
    the root logger, at INFO, at stderr, here pytest's capture, which the rest of the run then wrote every INFO record
    to, and py4j's shutdown too, once it was closed."""
    seen: dict[str, object] = {}
    monkeypatch.setattr("tierlog.agent.server.serve", lambda *a, **kw: seen.update(kw))
    monkeypatch.setattr("tierlog.agent.server.setup_logging", lambda *a, **kw: None)
    return seen


def test_metrics_address_option_reaches_the_server(served_with: dict[str, object]) -> None:
    main(["--socket", "/nonexistent/s.sock", "--metrics-port", "0", "--metrics-address", "::1"])
    assert served_with["metrics_address"] == "::1"


def test_build_info_and_component_readiness(agent: tuple[AgentServer, grpc.Channel]) -> None:
    server, channel = agent
    pb_grpc.AgentStub(channel).Health(pb.Empty(), timeout=10)  # the rsm was created at start

    found = scrape(f"http://127.0.0.1:{server.metrics_port}/metrics")

    build = found.samples("tierlog_build_info")
    assert len(build) == 1 and build[0].labels["version"] and build[0].value == 1
    assert found.value("tierlog_agent_component_ready", component="rsm") == 1
    # The rlmm is not hosted here (the broker may use Kafka's own): absent, so no alert says it is not ready.
    assert found.samples("tierlog_agent_component_ready", component="rlmm") == []
    # No archiver runs beside this agent: its gauge is absent rather than a 0 that would page someone.
    assert found.samples("tierlog_archiver_running") == []


def test_rsm_bytes_latency_cache_and_absent_index(agent: tuple[AgentServer, grpc.Channel], tmp_path: Path) -> None:
    server, channel = agent
    storage = pb_grpc.RemoteStorageStub(channel)
    log = bytes(range(256)) * 4000  # ~1 MB: several streamed chunks
    segment = copy_segment(storage, tmp_path, log)

    assert fetch(storage, segment) == log
    for index_type in (pb.OFFSET, pb.TIMESTAMP):
        fetch_index_chunks(storage, segment, index_type)
    with pytest.raises(grpc.RpcError) as absent:
        fetch_index_chunks(storage, segment, pb.TRANSACTION)  # the segment has none: normal
    assert absent.value.code() == grpc.StatusCode.NOT_FOUND

    found = scrape(f"http://127.0.0.1:{server.metrics_port}/metrics")
    # Bytes of a fetched segment are counted as its stream is read (it used to say 0).
    assert found.value("tierlog_rsm_operation_bytes_total", operation="rsm.fetch_log_segment") == len(log)
    # A missing transaction index is absent, not an error.
    assert found.value("tierlog_rsm_operation_errors_total", operation="rsm.fetch_index") == 0
    assert found.value("tierlog_rsm_index_absent_total", index_type="TRANSACTION") == 1
    # The broker's three index calls: one miss loads the read group, the next two are hits.
    assert found.value("tierlog_rsm_index_cache_requests_total", result="misses") == 1
    assert found.value("tierlog_rsm_index_cache_requests_total", result="hits") == 2
    # Latency is a histogram per operation, with cumulative buckets ending in +Inf = count.
    assert found.value("tierlog_rsm_operation_seconds_count", operation="rsm.fetch_index") == 3
    assert found.value("tierlog_rsm_operation_seconds_bucket", operation="rsm.fetch_index", le="+Inf") == 3
    assert found.value("tierlog_rsm_operation_seconds_count", operation="rsm.copy_log_segment_data") == 1
    assert found.value("tierlog_rsm_operation_seconds_sum", operation="rsm.copy_log_segment_data") > 0



def test_tierlog_agent_passes_its_metrics_address_to_the_agent(served_with: dict[str, object]) -> None:
    from tierlog.cli.main import main as tierlog

    assert tierlog(["agent", "--socket", "/nonexistent/s.sock", "--metrics-port", "0", "--metrics-address", "::1"]) == 0
    assert served_with["metrics_address"] == "::1"
