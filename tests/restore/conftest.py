"""Shared setup of the restore tests: the rlmm test helpers on the path, the cluster a test restores on, and
managers of its metadata topic."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

_TESTS_DIR = Path(__file__).resolve().parents[1]
for _path in (str(_TESTS_DIR), str(_TESTS_DIR / "rlmm")):  # support.* and the rlmm testkit
    if _path not in sys.path:
        sys.path.insert(0, _path)

from restore_testkit import METADATA_PARTITIONS, Cluster  # noqa: E402
from support.topics import unique_topic_name  # noqa: E402

from tierlog.pipeline.session import S3Settings  # noqa: E402


@pytest.fixture
def cluster(kafka_bootstrap: str, s3_bucket: str, s3_config: dict[str, str], capsys: pytest.CaptureFixture[str],
            request: pytest.FixtureRequest) -> Iterator[Cluster]:
    yield Cluster(kafka_bootstrap, unique_topic_name(f"restore-{request.node.name}"), s3_bucket,
                  S3Settings(s3_config["endpoint"], s3_config["access_key"], s3_config["secret_key"],
                             s3_config["region"]), capsys)


@pytest.fixture
def manager_on(cluster: Cluster, tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Start managers on the cluster's metadata topic, each on a state dir of its own; all closed afterwards."""
    from rlmm_testkit import manager_config

    from rlmm import RemoteLogMetadataManager

    managers: list[RemoteLogMetadataManager] = []

    def make(broker_id: int = 0) -> RemoteLogMetadataManager:
        manager = RemoteLogMetadataManager(manager_config(
            cluster.bootstrap, tmp_path / f"state-{len(managers)}", cluster.metadata_topic,
            partitions=METADATA_PARTITIONS, broker_id=broker_id))
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        manager.close()
