"""Fixtures for the end-to-end tests: real Kafka brokers running tierlog's plugin jar, each broker with its
own agent, writing to the shared SeaweedFS S3 under a prefix of the test's own. tierlog's RSM gets a disk chunk
cache beside the agent's socket, so brokers read fetched segments from its files (FetchLogSegmentFiles).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from dev.demo import TIERLOG_RSM, PluginChoice, S3Location, broker_properties, ensure_plugin_jar  # noqa: E402
from dev.kafka import KafkaCluster  # noqa: E402
from dev.process import free_ports  # noqa: E402
from dev.s3 import S3Endpoint  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == Path(_HERE):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def plugin_jar() -> Path:
    """tierlog's Kafka plugin jar (built by Maven on first use)."""
    return ensure_plugin_jar()


def _s3_location(endpoint: S3Endpoint, name: str) -> S3Location:
    return S3Location(
        endpoint.endpoint,
        endpoint.access_key,
        endpoint.secret_key,
        endpoint.bucket,
        f"e2e-{name[:40]}-{uuid.uuid4().hex[:8]}",
    )


def _delete_prefix(location: S3Location) -> None:
    client = location.client()
    for obj in location.objects():
        client.delete_object(Bucket=location.bucket, Key=obj["Key"])


def _chunk_cache(socket_dir: Path) -> dict[str, str]:
    """tierlog RSM keys for a disk chunk cache per broker, so the adapter reads segment bytes from its files."""
    return {
        "rsm.config.fetch.chunk.cache.class": "disk",
        "rsm.config.fetch.chunk.cache.path": str(socket_dir / "chunks-{node_id}"),
    }


@pytest.fixture
def s3_location(s3_endpoint: S3Endpoint, request: pytest.FixtureRequest) -> Iterator[S3Location]:
    """A prefix of the shared bucket for one test, emptied afterwards."""
    location = _s3_location(s3_endpoint, request.node.name)
    yield location
    _delete_prefix(location)


@pytest.fixture
def socket_dir(tmp_path: Path) -> Iterator[Path]:
    """A short directory for agent sockets (a Unix socket path must stay under ~100 bytes). The agents' logs
    written there are copied to the test's tmp_path, beside its brokers' logs, when the test ends."""
    with tempfile.TemporaryDirectory(prefix="tl-") as directory:
        yield Path(directory)
        for log in Path(directory).glob("*.log*"):
            shutil.copy2(log, tmp_path / log.name)


@pytest.fixture
def tiered_cluster(
    make_kafka_cluster: Callable[..., KafkaCluster],
    plugin_jar: Path,
    socket_dir: Path,
    s3_location: S3Location,
) -> Callable[..., KafkaCluster]:
    """Start a cluster whose brokers load the chosen plugins: `tiered_cluster(nodes, **PluginChoice)`."""

    def start(nodes: int = 1, **choice: Any) -> KafkaCluster:
        choice.setdefault("s3", s3_location)
        choice.setdefault("metadata_replication_factor", min(nodes, 3))
        if choice.get("rsm", TIERLOG_RSM) == TIERLOG_RSM:
            choice["extra"] = {**_chunk_cache(socket_dir), **choice.get("extra", {})}
        properties = broker_properties(PluginChoice(**choice), socket_dir, plugin_jar)
        return make_kafka_cluster(nodes, properties=properties)

    return start


@pytest.fixture(scope="module")
def shared_tiered_cluster(
    tmp_path_factory: pytest.TempPathFactory, plugin_jar: Path, s3_endpoint: S3Endpoint
) -> Iterator[tuple[KafkaCluster, S3Location, Path, int]]:
    """One single-broker tierlog cluster for a module's tests that only add topics of their own: the cluster,
    its S3 location, its agent's socket directory and its agent's metrics port."""
    location = _s3_location(s3_endpoint, "shared")
    metrics_port = free_ports(1)[0]
    with tempfile.TemporaryDirectory(prefix="tl-") as sockets:
        choice = PluginChoice(s3=location, metrics_port=metrics_port, extra=_chunk_cache(Path(sockets)))
        properties = broker_properties(choice, Path(sockets), plugin_jar)
        cluster = KafkaCluster(tmp_path_factory.mktemp("shared-kafka"), 1, properties=properties)
        try:
            yield cluster.start(), location, Path(sockets), metrics_port
        finally:
            cluster.stop()
            _delete_prefix(location)
