"""Fixtures for every test package: the real Kafka and S3 of dev/services, topics, buckets, clusters.

Uses running services (KAFKA_BOOTSTRAP/S3_* or .dev/services.env), else starts them for the session.
"""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# The repository root makes `dev` (and the packages, without an install) importable; `tests/` makes
# the shared helpers importable as `support.*` from any test package.
REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (str(REPO_ROOT), str(REPO_ROOT / "tests")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from support.buckets import delete_bucket, unique_bucket_name  # noqa: E402
from support.services import (  # noqa: E402
    Services,
    configured_services,
    env_file,
    run_services_command,
)
from support.topics import create_topic as _create_topic  # noqa: E402
from support.topics import unique_topic_name  # noqa: E402

from dev.kafka import KafkaCluster  # noqa: E402
from dev.s3 import S3Endpoint  # noqa: E402

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from pyspark.sql import SparkSession

# Fixtures that need the shared services / the 3-node cluster / Docker; tests using them get the marker
# automatically, so `-m "not services"` selects the tests that need nothing running.
SERVICES_FIXTURES = {
    "services",
    "kafka_bootstrap",
    "s3_config",
    "s3_endpoint",
    "s3_client",
    "s3_bucket",
    "create_topic",
}
CLUSTER_FIXTURES = {"kafka_cluster3"}
DOCKER_FIXTURES = {"docker_services"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "docker: needs a Docker engine (testcontainers); skipped without one")
    # Publish already running services to the environment at once, for code that reads the
    # variables directly instead of through a fixture.
    services = configured_services()
    if services is not None:
        for key, value in services.as_env().items():
            os.environ.setdefault(key, value)


# First: pytest-xdist's worker reads the xdist_group marks in its own hook of this name, so they must be on the
# items before it runs, or each module's tests scatter over the workers (and set its module fixtures up on each).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & SERVICES_FIXTURES:
            item.add_marker(pytest.mark.services)
        if fixtures & CLUSTER_FIXTURES:
            item.add_marker(pytest.mark.cluster)
        if fixtures & DOCKER_FIXTURES:
            item.add_marker(pytest.mark.docker)
    _group_for_workers(items)


def _group_for_workers(items: list[pytest.Item]) -> None:
    """Under pytest-xdist's `--dist loadgroup` (`make test`), keep the tests that share the session's SparkSession on
    one worker, and each module whose tests share a module-scoped fixture (a 3-node cluster, a generated history) on
    one worker; every other test goes to whichever worker is free. Without xdist the marker means nothing.
    """
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            group = "spark"
        elif _uses_module_fixture(item):
            group = str(item.path.relative_to(REPO_ROOT))
        else:
            continue
        item.add_marker(pytest.mark.xdist_group(group))


def pytest_collection_finish(session: pytest.Session) -> None:
    """On an xdist worker of `--dist loadgroup`: refuse to run if xdist did not group what _group_for_workers marked
    (it groups by renaming item ids, which pytest 9 no longer reads), rather than scatter a module's tests over both
    workers, each setting up its module fixtures (a wheel built twice into one build directory at once)."""
    if "PYTEST_XDIST_WORKER" not in os.environ or not session.config.getvalue("loadgroup"):
        return
    ungrouped = [item.nodeid for item in session.items
                 if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid]
    if ungrouped:
        raise pytest.UsageError(
            f"pytest-xdist did not group {len(ungrouped)} tests marked xdist_group (first: {ungrouped[0]}): this "
            f"pytest ({pytest.__version__}) and pytest-xdist do not work together; see pyproject.toml's pin"
        )


def _uses_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope in ("module", "package", "class") for defs in info.name2fixturedefs.values() for d in defs)


# Every MetadataView.close() runs a full garbage collection (RocksDB lets go of its lock only once no column-family
# object is left), and the suite closes hundreds of views. A full collection walks every tracked object, most of
# them the modules the suite imported (pyspark, IPython, hypothesis, boto3...): 0.2-0.3 s each, 200 s of a run.
# What is alive as a module's tests start (after its garbage is collected) lives for the run: modules, classes,
# session fixtures. Freezing it leaves each collection only what was made since. The hook runs before the module's
# own fixtures are set up, so nothing a test opens is ever frozen.
_frozen_before: list[Path | None] = [None]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.path != _frozen_before[0]:
        _frozen_before[0] = item.path
        gc.collect()
        gc.freeze()


# -- the shared services ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    """The running dev services; started here (and stopped at session end) when none run."""
    found = configured_services()
    started_here = False
    if found is None or not found.reachable():
        run_services_command("up")
        started_here = True
        found = configured_services()
        if found is None:
            raise RuntimeError(f"`dev/services up` succeeded but wrote no {env_file()}")
    for key, value in found.as_env().items():
        os.environ[key] = value
    try:
        yield found
    finally:
        if started_here:
            run_services_command("down")


@pytest.fixture(scope="session")
def kafka_bootstrap(services: Services) -> str:
    """`bootstrap.servers` of the shared Kafka broker."""
    return services.kafka_bootstrap


@pytest.fixture(scope="session")
def s3_endpoint(services: Services) -> S3Endpoint:
    """The shared S3 server (endpoint, credentials, default bucket) as a value with `.client()`."""
    return services.s3


@pytest.fixture(scope="session")
def s3_config(services: Services) -> dict[str, str]:
    """The shared S3 server: endpoint, access_key, secret_key, bucket, region."""
    s3 = services.s3
    return {
        "endpoint": s3.endpoint,
        "access_key": s3.access_key,
        "secret_key": s3.secret_key,
        "bucket": s3.bucket,
        "region": s3.region,
    }


@pytest.fixture(scope="session")
def s3_client(s3_endpoint: S3Endpoint) -> S3Client:
    """A boto3 client for the shared S3 server (path-style addressing)."""
    return s3_endpoint.client()


@pytest.fixture
def s3_bucket(s3_client: S3Client) -> Iterator[str]:
    """A fresh, empty bucket for one test; emptied and deleted afterwards."""
    bucket = unique_bucket_name()
    s3_client.create_bucket(Bucket=bucket)
    try:
        yield bucket
    finally:
        delete_bucket(s3_client, bucket)


# -- Spark ----------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark(s3_endpoint: S3Endpoint) -> Iterator[SparkSession]:
    """The one local[2] SparkSession of the run (s3a on the shared S3 server), for tests that run jobs in-process.

    One fixture for every package: a module's own session stopped the shared one, and the next had to start again.
    Imported here: a run without Spark tests does not load pyspark.
    """
    from support.spark import local_spark

    with local_spark(s3_endpoint) as session:
        yield session


# -- topics -------------------------------------------------------------------------------------


@pytest.fixture
def unique_topic(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses: the test's name plus a random suffix (not created)."""
    return unique_topic_name(request.node.name)


@pytest.fixture
def create_topic(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Callable[..., str]:
    """Create a uniquely named topic on the shared broker: `create_topic(partitions=1, config={...})`.

    Returns the name once every partition has a leader. Pass `name=` to choose the prefix and
    `bootstrap=` to create it on another cluster.
    """

    def create(
        name: str | None = None,
        *,
        partitions: int = 1,
        replication_factor: int = 1,
        config: Mapping[str, object] | None = None,
        bootstrap: str | None = None,
    ) -> str:
        topic = unique_topic_name(name or request.node.name)
        return _create_topic(
            bootstrap or kafka_bootstrap,
            topic,
            partitions=partitions,
            replication_factor=replication_factor,
            config=config,
        )

    return create


# -- clusters started by tests ------------------------------------------------------------------


@pytest.fixture
def make_kafka_cluster(tmp_path: Path) -> Iterator[Callable[..., KafkaCluster]]:
    """Start KafkaClusters for one test (free ports, own directory); all stopped afterwards.

    `make_kafka_cluster(nodes=1, properties={...}, classpath=[...])` takes KafkaCluster's options.
    """
    clusters: list[KafkaCluster] = []

    def make(nodes: int = 1, **options: Any) -> KafkaCluster:
        cluster = KafkaCluster(tmp_path / f"kafka-{len(clusters)}", nodes, **options)
        clusters.append(cluster)
        return cluster.start()

    try:
        yield make
    finally:
        for cluster in clusters:
            cluster.stop()


# Module scope: three idle brokers still cost CPU on two cores, so they live only while the tests of one
# module need them.
@pytest.fixture(scope="module")
def kafka_cluster3() -> Iterator[KafkaCluster]:
    """A plain 3-node KRaft cluster of its own (free ports, temporary directory), shared by a module."""
    base = Path(tempfile.mkdtemp(prefix="tierlog-kafka3-"))
    cluster = KafkaCluster(base, 3)
    try:
        yield cluster.start()
    finally:
        # Killed, not stopped: its directory goes next, and three nodes stopped at once wait about 5 s for
        # controlled shutdowns that no longer have a controller quorum.
        for node_id in cluster.node_ids:
            cluster.kill_node(node_id)
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)


# -- Docker (optional) ----------------------------------------------------------------------------


def docker_unavailable_reason() -> str | None:
    """Why Docker-based tests cannot run here, or None when they can."""
    if shutil.which("docker") is None:
        return "no `docker` command on this machine"
    try:
        probe = subprocess.run(["docker", "info"], stdin=subprocess.DEVNULL, capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"`docker info` failed: {exc}"
    if probe.returncode != 0:
        return "no Docker engine reachable (`docker info` failed)"
    try:
        import testcontainers  # noqa: F401
    except ImportError:
        return "testcontainers is not installed (pip install 'testcontainers[kafka,minio]')"
    return None


@pytest.fixture(scope="session")
def docker_services() -> Iterator[Services]:
    """Kafka and MinIO in containers through testcontainers; skips when Docker is unavailable."""
    reason = docker_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    from testcontainers.kafka import KafkaContainer
    from testcontainers.minio import MinioContainer

    with KafkaContainer().with_kraft() as kafka, MinioContainer() as minio:
        config = minio.get_config()
        s3 = S3Endpoint(
            endpoint=f"http://{config['endpoint']}",
            access_key=config["access_key"],
            secret_key=config["secret_key"],
            bucket="tierlog",
        )
        s3.client().create_bucket(Bucket=s3.bucket)
        yield Services(kafka_bootstrap=kafka.get_bootstrap_server(), s3=s3)
