"""Fixtures for the RSM tests: one manager per backend (real SeaweedFS S3, the filesystem, Google Cloud Storage's
and Azure Blob Storage's emulators) and segments.

The S3 server and the broker come from the shared fixtures of tests/conftest.py; the GCS and Azure emulators are
started once per session on free 127.0.0.1 ports (dev/emulators.py); each test gets its own key prefix.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rsm_testkit import S3Server, SegmentFactory, SegmentFixture, config_of_backend, metadata_for
from support.s3_proxy import CountingS3Proxy
from support.services import broker_log_dir

from dev.emulators import AzureEndpoint, Azurite, GcsEmulator, GcsEndpoint
from rlmm.types import RemoteLogSegmentId, TopicIdPartition
from rsm import LogSegmentData, RemoteStorageManager


@pytest.fixture(scope="session")
def s3_server(s3_config: dict[str, str]) -> S3Server:
    """The shared S3 server (from tests/conftest.py) as the RSM tests use it."""
    return S3Server(s3_config["endpoint"], s3_config["access_key"], s3_config["secret_key"], s3_config["bucket"])


@pytest.fixture
def key_prefix() -> str:
    return f"rsm-tests/{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """moto's server (S3, STS, KMS; it accepts any credentials) on a free 127.0.0.1 port, for what SeaweedFS lacks."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEndpoint]:
    """gcp-storage-emulator on a free 127.0.0.1 port, with its bucket."""
    with GcsEmulator(tmp_path_factory.mktemp("gcs-emulator")) as emulator:
        yield emulator.endpoint


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AzureEndpoint]:
    """Azurite's Blob service on a free 127.0.0.1 port, with its container."""
    with Azurite(tmp_path_factory.mktemp("azurite")) as emulator:
        yield emulator.endpoint


@pytest.fixture(params=["filesystem", pytest.param("s3", marks=pytest.mark.services), "gcs", "azure"])
def backend_config(request: pytest.FixtureRequest, tmp_path: Path, key_prefix: str) -> dict[str, Any]:
    return config_of_backend(request, tmp_path, key_prefix)


@pytest.fixture
def manager(backend_config: dict[str, Any]) -> Iterator[RemoteStorageManager]:
    with RemoteStorageManager(backend_config) as rsm:
        yield rsm


@pytest.fixture
def make_segment(tmp_path: Path) -> SegmentFactory:
    """Segment files with random contents (seeded); sizes chosen per test."""

    def make(
        log_size: int = 200_000, with_txn: bool = True, topic: str = "orders", seed: int = 7
    ) -> SegmentFixture:
        rng = random.Random(seed)
        directory = tmp_path / f"segment-{uuid.uuid4().hex[:8]}"
        directory.mkdir()

        def write(name: str, size: int) -> Path:
            path = directory / name
            path.write_bytes(rng.randbytes(size))
            return path

        tp = TopicIdPartition(uuid.uuid4(), topic, rng.randrange(8))
        data = LogSegmentData(
            log_segment=write("00000000000000000100.log", log_size),
            offset_index=write("00000000000000000100.index", 8 * 300),
            time_index=write("00000000000000000100.timeindex", 12 * 300),
            transaction_index=write("00000000000000000100.txnindex", 34 * 3) if with_txn else None,
            producer_snapshot_index=write("00000000000000000100.snapshot", 700),
            leader_epoch_index=b"0\n2\n0 0\n3 100\n",
        )
        return SegmentFixture(metadata_for(RemoteLogSegmentId.generate(tp), log_size), data)

    return make


@pytest.fixture
def copied(manager: RemoteStorageManager, make_segment: SegmentFactory) -> SegmentFixture:
    """A segment already copied, its metadata carrying the custom metadata the copy returned."""
    segment = make_segment()
    custom = manager.copy_log_segment_data(segment.metadata, segment.data)
    return SegmentFixture(segment.with_custom_metadata(custom), segment.data)


@pytest.fixture
def s3_proxy(s3_server: S3Server) -> Iterator[CountingS3Proxy]:
    """A counting proxy on 127.0.0.1 in front of the real S3 server."""
    with CountingS3Proxy(s3_server.endpoint) as proxy:
        yield proxy


@pytest.fixture
def proxied_manager(
    s3_server: S3Server, s3_proxy: CountingS3Proxy, key_prefix: str
) -> Iterator[RemoteStorageManager]:
    """A manager that talks to S3 through the counting proxy, with small multipart settings."""
    config = s3_server.rsm_config(
        key_prefix,
        endpoint=s3_proxy.endpoint_url,
        **{"s3.multipart.threshold.bytes": 6 << 20, "s3.multipart.part.size.bytes": 5 << 20},
    )
    with RemoteStorageManager(config) as rsm:
        yield rsm


@pytest.fixture(scope="session")
def kafka_log_dir(kafka_bootstrap: str) -> Path:
    """The `log.dirs` of the broker serving `kafka_bootstrap`, read from its server.properties."""
    return broker_log_dir(kafka_bootstrap)
