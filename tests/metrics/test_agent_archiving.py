"""The agent's audit component against the dev Kafka and S3: the agent archives the metadata partitions its broker
leads into its rsm's bucket and writes bootstrap snapshots there, a new node bootstraps from them, an S3 outage is
survived and recovered from, and the whole is visible on the agent's /metrics page."""

from __future__ import annotations

import io
import logging
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from metrics_testkit import Scrape, scrape
from support import wait_until
from support.s3_proxy import CountingS3Proxy
from support.spark import s3_settings

from dev.s3 import S3Endpoint
from rlmm import RemoteLogMetadataManager
from rlmm.archive import read_archive_file, read_snapshot
from rlmm.bootstrap import list_snapshots
from rsm.backend import StorageBackend, read_all
from rsm.snapshot_source import BucketSnapshotSource
from tierlog.agent.components import ComponentName
from tierlog.agent.server import AgentServer
from tierlog.audit.archiver import list_archive_files
from tierlog.audit.assignment import MetadataTopicDescriber
from tierlog.pipeline.generate import HistoryGenerator, HistorySpec, RawRecord, produce_history
from tierlog.pipeline.locations import open_store

PARTITIONS = 2
DEV_NODE_ID = 0  # the dev broker's node id: it leads every partition
LOCATION = "snapshots"
# Small intervals, so that each test takes seconds.
FAST = {"archive.max.interval.ms": "100", "archive.leadership.check.interval.ms": "500",
        "snapshot.interval.ms": "300", "snapshot.location": LOCATION}


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Unix socket paths must stay under ~100 bytes; pytest's tmp_path can be longer.
    with tempfile.TemporaryDirectory(prefix="tlm-") as directory:
        yield Path(directory)


@pytest.fixture
def metadata_topic(unique_topic: str) -> str:
    return f"__tierlog_metadata_{unique_topic}"


@pytest.fixture
def prefix() -> str:
    return f"agent-archiving-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def bucket(s3_endpoint: S3Endpoint, prefix: str) -> Iterator[StorageBackend]:
    """The agent's bucket prefix, read directly; emptied after the test."""
    store = open_store(f"s3://{s3_endpoint.bucket}/{prefix}", s3_settings(s3_endpoint))
    try:
        yield store
    finally:
        keys = [info.key for info in store.list("")]
        if keys:
            store.delete(keys)
        store.close()


def rlmm_config(kafka_bootstrap: str, metadata_topic: str, state_dir: Path, broker_id: int) -> dict[str, str]:
    return {"bootstrap.servers": kafka_bootstrap, "broker.id": str(broker_id), "state.dir": str(state_dir),
            "metadata.topic.name": metadata_topic, "metadata.topic.num.partitions": str(PARTITIONS),
            "metadata.topic.replication.factor": "1", "metadata.topic.min.insync.replicas": "1"}


@pytest.fixture
def start_agent(kafka_bootstrap: str, metadata_topic: str, s3_endpoint: S3Endpoint, prefix: str, short_dir: Path,
                tmp_path: Path) -> Iterator[Callable[..., AgentServer]]:
    agents: list[AgentServer] = []

    def start(broker_id: int = DEV_NODE_ID, endpoint: str | None = None, **extra: str) -> AgentServer:
        rlmm = {**rlmm_config(kafka_bootstrap, metadata_topic, tmp_path / f"state-{len(agents)}", broker_id),
                **FAST, **extra}
        rsm = {"storage.backend": "s3", "s3.bucket": s3_endpoint.bucket, "s3.prefix": prefix,
               "s3.endpoint.url": endpoint or s3_endpoint.endpoint, "s3.region": s3_endpoint.region,
               "s3.access.key.id": s3_endpoint.access_key, "s3.secret.access.key": s3_endpoint.secret_key,
               "s3.retries.max": "0"}
        config = {**{f"rlmm.{k}": v for k, v in rlmm.items()}, **{f"rsm.{k}": v for k, v in rsm.items()}}
        agent = AgentServer(config, short_dir / f"a{len(agents)}.sock", metrics_port=0).start()
        agents.append(agent)
        return agent

    try:
        yield start
    finally:
        for agent in agents:
            started = time.monotonic()
            agent.stop(grace=1)
            assert time.monotonic() - started < 15, "the agent's audit component did not stop within its deadline"


def metrics(agent: AgentServer) -> Scrape:
    return scrape(f"http://127.0.0.1:{agent.metrics_port}/metrics")


def history(kafka_bootstrap: str, metadata_topic: str, seed: int, events: int = 400) -> list[RawRecord]:
    records = list(HistoryGenerator(HistorySpec(events=events, metadata_partitions=PARTITIONS, topics=2,
                                                partitions_per_topic=3, seed=seed)).records())
    produce_history(kafka_bootstrap, metadata_topic, records)
    return records


def archived(store: StorageBackend, metadata_topic: str) -> Counter[tuple[int, int]]:
    """(metadata partition, offset) -> how often the archive holds it."""
    held: Counter[tuple[int, int]] = Counter()
    for archive_file in list_archive_files(store, metadata_topic):
        held.update((d["metadata_partition"], d["offset"])
                    for d in read_archive_file(read_all(store.get_range(archive_file.key, 0))))
    return held


def topic_ends(kafka_bootstrap: str, metadata_topic: str) -> dict[int, int]:
    return MetadataTopicDescriber({"bootstrap.servers": kafka_bootstrap}, metadata_topic, None).end_offsets()


def caught_up(agent: AgentServer, ends: dict[int, int]) -> Callable[[], bool]:
    def check() -> bool:
        found = metrics(agent)
        return all(found.value("tierlog_archiver_archived_offset", partition=str(p)) == end - 1
                   and found.value("tierlog_archiver_lag_records", partition=str(p)) == 0
                   for p, end in ends.items())
    return check


def test_the_agent_archives_and_snapshots_the_metadata_partitions_its_broker_leads_and_a_new_node_boots_from_them(
    start_agent: Callable[..., AgentServer], kafka_bootstrap: str, metadata_topic: str, bucket: StorageBackend,
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    agent = start_agent()
    manager = agent.components.get(ComponentName.REMOTE_LOG_METADATA_MANAGER, 60)
    records = history(kafka_bootstrap, metadata_topic, seed=3)
    ends = topic_ends(kafka_bootstrap, metadata_topic)
    wait_until(caught_up(agent, ends), timeout=60, description="the agent archiving every record")
    manager.wait_caught_up(30)
    topic = MetadataTopicDescriber({"bootstrap.servers": kafka_bootstrap}, metadata_topic, None)
    topic_id = topic.assignment().topic_id
    source = BucketSnapshotSource(agent.components.get(ComponentName.REMOTE_STORAGE_MANAGER, 10).backend)

    def snapshot_of_everything() -> bool:
        refs = list_snapshots(source, LOCATION, metadata_topic, topic_id)
        return bool(refs) and metrics(agent).value("tierlog_archiver_snapshots_written_total") >= 1 and \
            _snapshot_ends(source, refs[0].key) == ends
    wait_until(snapshot_of_everything, timeout=60, description="a snapshot holding every record")

    assert archived(bucket, metadata_topic) == Counter((r.metadata_partition, r.offset) for r in records)
    found = metrics(agent)
    assert found.value("tierlog_archiver_running") == 1
    assert found.value("tierlog_archiver_partition_archiving") == PARTITIONS
    assert found.value("tierlog_archiver_failures_total") == 0
    assert time.time() - found.value("tierlog_archiver_last_archive_timestamp_seconds", partition="0") < 60
    assert time.time() - found.value("tierlog_archiver_last_snapshot_timestamp_seconds") < 60

    node_config: dict[str, Any] = {**rlmm_config(kafka_bootstrap, metadata_topic, tmp_path / "new-node", 7),
                                   "snapshot.location": LOCATION}
    with caplog.at_level(logging.INFO, logger="rlmm.bootstrap"), \
            RemoteLogMetadataManager(node_config, snapshot_source=BucketSnapshotSource(bucket)) as node:
        assert any("bootstrapped" in r.getMessage() and LOCATION in r.getMessage() for r in caplog.records)
        node.wait_caught_up(30)
        assert node.view_digest() == manager.view_digest()


def _snapshot_ends(source: BucketSnapshotSource, key: str) -> dict[int, int]:
    header, _ = read_snapshot(io.BytesIO(source.read(key)))
    return dict(header.end_offsets)


def test_an_agent_whose_broker_leads_no_metadata_partition_archives_none(
    start_agent: Callable[..., AgentServer], kafka_bootstrap: str, metadata_topic: str, bucket: StorageBackend,
) -> None:
    agent = start_agent(broker_id=DEV_NODE_ID + 1)
    agent.components.get(ComponentName.REMOTE_LOG_METADATA_MANAGER, 60)  # it creates the metadata topic
    history(kafka_bootstrap, metadata_topic, seed=4, events=50)

    wait_until(lambda: len(metrics(agent).samples("tierlog_archiver_partition_archiving")) == PARTITIONS,
               timeout=30, description="the agent learning the metadata partitions' leaders")
    found = metrics(agent)
    assert found.value("tierlog_archiver_partition_archiving") == 0
    assert found.samples("tierlog_archiver_archived_offset") == []
    assert found.value("tierlog_archiver_running") == 1
    assert list(bucket.list("audit/")) == []


def test_an_s3_outage_is_survived_logged_once_and_archiving_resumes_where_it_stopped(
    start_agent: Callable[..., AgentServer], kafka_bootstrap: str, metadata_topic: str, bucket: StorageBackend,
    s3_endpoint: S3Endpoint, caplog: pytest.LogCaptureFixture,
) -> None:
    with CountingS3Proxy(s3_endpoint.endpoint) as proxy, caplog.at_level(logging.INFO, logger="tierlog.audit.loop"):
        agent = start_agent(endpoint=proxy.endpoint_url, **{"snapshot.location": ""})
        agent.components.get(ComponentName.REMOTE_LOG_METADATA_MANAGER, 60)
        history(kafka_bootstrap, metadata_topic, seed=5, events=100)
        wait_until(caught_up(agent, topic_ends(kafka_bootstrap, metadata_topic)), timeout=60,
                   description="the first records archived")

        proxy.fail_when(lambda r: "/audit/" in r.path, status=503)  # the bucket refuses the archive
        history(kafka_bootstrap, metadata_topic, seed=6, events=100)
        wait_until(lambda: metrics(agent).value("tierlog_archiver_failures_total", stage="archive") >= 1,
                   timeout=60, description="the archiver failing")
        failing = metrics(agent)
        wait_until(lambda: metrics(agent).value("tierlog_archiver_failures_total", stage="archive") >= 2,
                   timeout=60, description="the archiver retrying and failing again")
        during = metrics(agent)
        assert during.value("tierlog_archiver_running") == 1
        # What TierlogArchiverStopped watches: failures counted, and the archive's time standing still while the
        # partition's lag grows.
        lagging = [s.labels["partition"] for s in during.samples("tierlog_archiver_lag_records") if s.value > 0]
        assert lagging
        for partition in lagging:
            assert during.value("tierlog_archiver_last_archive_timestamp_seconds", partition=partition) == \
                failing.value("tierlog_archiver_last_archive_timestamp_seconds", partition=partition)

        proxy.clear_faults()
        ends = topic_ends(kafka_bootstrap, metadata_topic)
        wait_until(caught_up(agent, ends), timeout=60, description="archiving resumed after the outage")

    # Every record exactly once: the archiver after a failure resumes from the archive itself.
    assert archived(bucket, metadata_topic) == Counter((p, offset) for p, end in ends.items() for offset in range(end))
    failures = [r for r in caplog.records if r.name == "tierlog.audit.loop" and r.levelno >= logging.WARNING]
    assert len(failures) == 1, [r.getMessage() for r in failures]
    assert any("works again after" in r.getMessage() for r in caplog.records)


def test_a_snapshot_the_bucket_refuses_is_retried_while_archiving_goes_on(
    start_agent: Callable[..., AgentServer], kafka_bootstrap: str, metadata_topic: str, bucket: StorageBackend,
    s3_endpoint: S3Endpoint,
) -> None:
    with CountingS3Proxy(s3_endpoint.endpoint) as proxy:
        proxy.fail_when(lambda r: r.method == "PUT" and f"/{LOCATION}/" in r.path, status=503)
        agent = start_agent(endpoint=proxy.endpoint_url)
        agent.components.get(ComponentName.REMOTE_LOG_METADATA_MANAGER, 60)
        history(kafka_bootstrap, metadata_topic, seed=7, events=100)
        wait_until(lambda: metrics(agent).value("tierlog_archiver_failures_total", stage="snapshot") >= 2,
                   timeout=60, description="the snapshot writes failing")
        wait_until(caught_up(agent, topic_ends(kafka_bootstrap, metadata_topic)), timeout=60,
                   description="archiving going on meanwhile")
        assert metrics(agent).value("tierlog_archiver_snapshots_written_total") == 0

        proxy.clear_faults()
        wait_until(lambda: metrics(agent).value("tierlog_archiver_snapshots_written_total") >= 1, timeout=60,
                   description="a snapshot written once the bucket takes it")
    assert list(bucket.list(f"{LOCATION}/"))
    assert metrics(agent).value("tierlog_archiver_failures_total", stage="archive") == 0
