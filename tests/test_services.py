"""The test harness works: the real broker and S3 server answer, dev/services manages its processes.

Each test exercises one piece of dev/ or tests/conftest.py against the real components.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from botocore.exceptions import ClientError
from support.services import SERVICES_SCRIPT, Services
from support.topics import admin_client, consume, create_topic, produce, unique_topic_name

from dev.env import read_env_file
from dev.kafka import KafkaCluster
from dev.process import free_ports, pid_alive, wait_until
from dev.s3 import GRPC_OFFSET, S3Endpoint

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

# -- the shared services --------------------------------------------------------------------------


def test_record_produced_to_the_broker_is_consumed_back(
    kafka_bootstrap: str, create_topic: Callable[..., str]
) -> None:
    topic = create_topic()

    [(partition, offset)] = produce(kafka_bootstrap, topic, [(b"key-1", b"value-1")])
    [record] = consume(kafka_bootstrap, topic, 1, partition=partition, from_offset=offset)

    assert (record.key, record.value, record.offset) == (b"key-1", b"value-1", offset)


def test_object_put_to_seaweedfs_is_read_back(s3_client: S3Client, s3_bucket: str) -> None:
    body = os.urandom(64 * 1024)

    s3_client.put_object(Bucket=s3_bucket, Key="segments/00000000000000000000.log", Body=body)
    fetched = s3_client.get_object(Bucket=s3_bucket, Key="segments/00000000000000000000.log")["Body"].read()

    assert fetched == body


def test_s3_bucket_fixture_gives_each_test_an_empty_bucket(s3_client: S3Client, s3_bucket: str) -> None:
    assert s3_client.list_objects_v2(Bucket=s3_bucket).get("KeyCount") == 0


def test_s3_rejects_unknown_credentials(s3_config: dict[str, str]) -> None:
    stranger = S3Endpoint(s3_config["endpoint"], "not-a-key", "not-a-secret", s3_config["bucket"]).client()

    with pytest.raises(ClientError) as error:
        stranger.list_objects_v2(Bucket=s3_config["bucket"])
    assert error.value.response["Error"]["Code"] in {
        "InvalidAccessKeyId",
        "AccessDenied",
        "SignatureDoesNotMatch",
    }


# -- a cluster of three ---------------------------------------------------------------------------


def test_three_node_cluster_places_a_topic_with_replication_factor_three_on_every_node(
    kafka_cluster3: KafkaCluster,
) -> None:
    topic = create_topic(
        kafka_cluster3.bootstrap, unique_topic_name("rf3"), partitions=2, replication_factor=3
    )

    # A fresh client may ask a broker that has not applied the new topic's metadata yet (KRaft brokers
    # apply it each on their own), which answers with no partitions: wait until it has them.
    client = admin_client(kafka_cluster3.bootstrap)

    def placement() -> dict[int, list[int]]:
        metadata = client.list_topics(topic=topic, timeout=10).topics[topic]
        return {p: sorted(m.replicas) for p, m in metadata.partitions.items()}

    wait_until(lambda: len(placement()) == 2, timeout=30, description=f"both partitions of {topic} listed")
    assert placement() == {0: [0, 1, 2], 1: [0, 1, 2]}


def test_node_restarted_with_a_wiped_log_dir_replicates_its_partitions_again(
    kafka_cluster3: KafkaCluster,
) -> None:
    topic = create_topic(kafka_cluster3.bootstrap, unique_topic_name("wiped"), replication_factor=3)
    produce(kafka_cluster3.bootstrap, topic, [(None, b"record-%d" % i) for i in range(100)])

    kafka_cluster3.stop_node(2)
    kafka_cluster3.wipe_log_dir(2)
    kafka_cluster3.start_node(2)

    def back_in_sync() -> bool:
        metadata = admin_client(kafka_cluster3.bootstrap).list_topics(topic=topic, timeout=5).topics[topic]
        return 2 in metadata.partitions[0].isrs

    wait_until(back_in_sync, timeout=60, description=f"node 2 back in the ISR of {topic}")
    assert (kafka_cluster3.log_dir(2) / f"{topic}-0").is_dir()


# -- dev/services on its own ports and state directory ---------------------------------------------


def run_services(state: Path, *args: str) -> subprocess.CompletedProcess[str]:
    kafka_port, s3_port = free_ports(2, offset=GRPC_OFFSET)
    env = {
        **os.environ,
        "TIERLOG_DEV_DIR": str(state),
        # Only `up` reads the ports, and only when it has to start something.
        "TIERLOG_KAFKA_PORT": str(kafka_port),
        "TIERLOG_S3_PORT": str(s3_port),
    }
    return subprocess.run(
        [sys.executable, str(SERVICES_SCRIPT), *args],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )


def started_pids(state: Path) -> list[int]:
    recorded = json.loads((state / "services.pids").read_text(encoding="utf-8"))
    return [*recorded["kafka_pids"], recorded["s3_pid"]]


def services_started_in(state: Path) -> Iterator[Path]:
    started = run_services(state, "up")
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        yield state
    finally:
        run_services(state, "down")


@pytest.fixture(scope="module")
def running_services_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A state directory in which `dev/services up` runs Kafka and S3, for tests that leave them be."""
    yield from services_started_in(tmp_path_factory.mktemp("dev-state"))


@pytest.fixture
def services_state(tmp_path: Path) -> Iterator[Path]:
    """Like running_services_state, but one test's own, for tests that stop or kill the services."""
    yield from services_started_in(tmp_path / "dev-state")


def test_services_up_writes_the_connection_settings(running_services_state: Path) -> None:
    settings = read_env_file(running_services_state / "services.env")

    assert sorted(settings) == [
        "KAFKA_BOOTSTRAP",
        "S3_ACCESS_KEY",
        "S3_BUCKET",
        "S3_ENDPOINT",
        "S3_REGION",
        "S3_SECRET_KEY",
    ]
    assert settings["KAFKA_BOOTSTRAP"].startswith("127.0.0.1:")
    assert settings["S3_ENDPOINT"].startswith("http://127.0.0.1:")


def test_second_services_up_keeps_the_running_processes(running_services_state: Path) -> None:
    before = started_pids(running_services_state)

    again = run_services(running_services_state, "up")

    assert again.returncode == 0, again.stderr
    assert started_pids(running_services_state) == before


def test_services_status_succeeds_while_everything_runs(running_services_state: Path) -> None:
    status = run_services(running_services_state, "status")

    assert status.returncode == 0, status.stdout + status.stderr
    assert "DOWN" not in status.stdout


def test_services_down_stops_the_processes_up_started_and_status_then_fails(services_state: Path) -> None:
    pids = started_pids(services_state)

    stopped = run_services(services_state, "down")
    status = run_services(services_state, "status")

    assert stopped.returncode == 0, stopped.stderr
    assert [pid for pid in pids if pid_alive(pid)] == []
    assert status.returncode != 0


def test_services_status_fails_when_a_started_process_died(services_state: Path) -> None:
    kafka_pid = started_pids(services_state)[0]
    os.kill(kafka_pid, signal.SIGKILL)

    status = run_services(services_state, "status")

    assert status.returncode != 0
    assert f"pid {kafka_pid}" in status.stderr


# -- Docker, where there is one ---------------------------------------------------------------------


def test_containers_serve_kafka_records_and_s3_objects(docker_services: Services) -> None:
    containers = docker_services
    topic = create_topic(containers.kafka_bootstrap, unique_topic_name("docker"))
    client = containers.s3.client()

    produce(containers.kafka_bootstrap, topic, [(None, b"from-a-container")])
    client.put_object(Bucket=containers.s3.bucket, Key="probe", Body=b"object")

    assert consume(containers.kafka_bootstrap, topic, 1)[0].value == b"from-a-container"
    assert client.get_object(Bucket=containers.s3.bucket, Key="probe")["Body"].read() == b"object"
