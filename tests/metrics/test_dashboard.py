"""The Grafana dashboard and the Prometheus alert rules in docker/ against a real scrape: an agent hosting a
real rlmm (dev Kafka) and rsm (dev S3) serves metadata writes, a segment copy and fetches, and archives the
metadata partitions its broker leads; every metric the dashboard and the rules query must be on its /metrics page."""

from __future__ import annotations

import dataclasses
import json
import re
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import promql_parser
import pytest
import yaml
from confluent_kafka import Producer
from metrics_testkit import Scrape, fetch, fetch_index_chunks, scrape
from support.agent_segments import copy_segment, segment_metadata

from rlmm import RemoteLogSegmentMetadataUpdate, RemoteLogSegmentState, TopicIdPartition
from rlmm.events import metadata_partition_for
from tierlog.agent import messages
from tierlog.agent.proto import agent_pb2 as pb
from tierlog.agent.proto import agent_pb2_grpc as pb_grpc
from tierlog.agent.server import AgentServer

DOCKER = Path(__file__).resolve().parents[2] / "docker"
ALERTS = DOCKER / "prometheus" / "alerts.yml"
DASHBOARD = DOCKER / "grafana" / "dashboards" / "tierlog.json"
PARTITIONS = 2
# Recorded by Prometheus itself for every scrape, not exported by the agent.
PROMETHEUS_OWN = {"up"}
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")


def metric_names(expr: str) -> set[str]:
    """Every metric a PromQL expression selects (a parse error fails the test, as promtool would)."""
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr!r}"
            found.add(node.name)
        for attr in ("lhs", "rhs", "expr", "param", "vector_selector"):
            child = getattr(node, attr, None)
            if child is not None and not isinstance(child, (str, int, float)):
                walk(child)
        for arg in getattr(node, "args", None) or ():
            walk(arg)

    walk(promql_parser.parse(expr))
    return found


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def dashboard_exprs() -> list[str]:
    return [t["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"] for t in panel["targets"]]


def wait_for(check: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s}s: {what}")
        time.sleep(0.2)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="tlm-") as directory:
        yield Path(directory)


@pytest.fixture
def metadata_topic(unique_topic: str) -> str:
    return f"__tierlog_metadata_{unique_topic}"


def start_agent(socket: Path, kafka_bootstrap: str, metadata_topic: str, state_dir: Path, rsm: dict[str, str]
                ) -> AgentServer:
    config = {
        "rlmm.bootstrap.servers": kafka_bootstrap,
        "rlmm.broker.id": "0",  # the dev broker's node id: this agent archives the partitions it leads
        "rlmm.state.dir": str(state_dir),
        "rlmm.metadata.topic.name": metadata_topic,
        "rlmm.metadata.topic.num.partitions": str(PARTITIONS),
        "rlmm.metadata.topic.replication.factor": "1",
        "rlmm.metadata.topic.min.insync.replicas": "1",
        **{f"rsm.{k}": v for k, v in rsm.items()},
    }
    server = AgentServer(config, socket, metrics_port=0).start()
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    wait_for(lambda: scrape(url).value("tierlog_agent_component_ready") == 2, "the rlmm and the rsm created")
    return server


@pytest.fixture
def s3_rsm(s3_config: dict[str, str], s3_bucket: str) -> dict[str, str]:
    return {
        "storage.backend": "s3",
        "s3.bucket": s3_bucket,
        "s3.endpoint.url": s3_config["endpoint"],
        "s3.region": s3_config["region"],
        "s3.access.key.id": s3_config["access_key"],
        "s3.secret.access.key": s3_config["secret_key"],
    }


@pytest.fixture
def served(
    short_dir: Path, tmp_path: Path, kafka_bootstrap: str, metadata_topic: str, s3_rsm: dict[str, str]
) -> Iterator[tuple[Scrape, bytes]]:
    """A scrape of an agent that served real traffic: metadata writes (one failing), a copy to S3, fetches."""
    server = start_agent(short_dir / "a.sock", kafka_bootstrap, metadata_topic, tmp_path / "state", s3_rsm)
    channel = grpc.insecure_channel(f"unix:{server.socket_path}")
    try:
        metadata, storage = pb_grpc.RemoteLogMetadataStub(channel), pb_grpc.RemoteStorageStub(channel)
        tp = TopicIdPartition(uuid.uuid4(), "orders", 0)
        log = bytes(range(256)) * 2000
        segment = segment_metadata(tp, len(log))
        metadata.OnPartitionLeadershipChanges(
            pb.LeadershipChanges(leaders=[messages.topic_id_partition_msg(tp)]), timeout=10
        )
        metadata.AddRemoteLogSegmentMetadata(messages.segment_metadata_msg(segment), timeout=30)
        segment = copy_segment(storage, tmp_path, log, segment)
        finished = RemoteLogSegmentMetadataUpdate(
            segment.remote_log_segment_id, 2, segment.custom_metadata,
            RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 1,
        )
        metadata.UpdateRemoteLogSegmentMetadata(messages.segment_update_msg(finished), timeout=30)
        # An update of a segment nobody added: the rlmm refuses it, a write failure.
        unknown = dataclasses.replace(
            finished, remote_log_segment_id=segment_metadata(tp, 1).remote_log_segment_id
        )
        with pytest.raises(grpc.RpcError):
            metadata.UpdateRemoteLogSegmentMetadata(messages.segment_update_msg(unknown), timeout=30)
        assert fetch(storage, segment) == log
        fetch_index_chunks(storage, segment, pb.OFFSET)
        with pytest.raises(grpc.RpcError):
            fetch_index_chunks(storage, segment, pb.TRANSACTION)
        # A segment whose objects are not in the bucket: S3 answers NoSuchKey, a real error.
        with pytest.raises(grpc.RpcError):
            fetch(storage, segment_metadata(tp, len(log)))
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        wait_for(
            lambda: (lambda now: now.value("tierlog_rlmm_end_offsets_available") == 1
                     and now.value("tierlog_rlmm_lag_records") == 0
                     and now.samples("tierlog_archiver_lag_records") != []
                     and now.value("tierlog_archiver_lag_records") == 0)(scrape(url)),
            "the view applied and the archive holds every record",
        )
        yield scrape(url), log
    finally:
        channel.close()
        server.stop(grace=1)


def test_every_metric_of_the_dashboard_and_the_alert_rules_is_exported(served: tuple[Scrape, bytes]) -> None:
    found, _ = served
    used = {name for expr in dashboard_exprs() + [r["expr"] for r in alert_rules()] for name in metric_names(expr)}

    missing = sorted(used - found.sample_names - PROMETHEUS_OWN)

    assert used, "the dashboard and the rules query no metric"
    assert missing == []


def test_a_real_scrape_shows_the_traffic_the_agent_served(served: tuple[Scrape, bytes]) -> None:
    found, log = served

    assert found.value("tierlog_rlmm_write_seconds_count", operation="add_segment") == 1
    assert found.value("tierlog_rlmm_write_seconds_count", operation="update_segment") == 2
    assert found.value("tierlog_rlmm_write_failures_total", operation="update_segment") == 1
    assert found.value("tierlog_rlmm_view_segments", state="COPY_SEGMENT_FINISHED") == 1
    assert found.value("tierlog_rlmm_view_segment_bytes", state="COPY_SEGMENT_FINISHED") == len(log)
    assert found.value("tierlog_rlmm_view_user_partitions") == 1
    assert found.value("tierlog_rlmm_applied_offset") >= 2  # the add and the update, at least
    assert found.value("tierlog_rlmm_halted_partitions") == 0
    assert found.value("tierlog_rlmm_partitions_loading") in (0, 1)  # the one hosted partition, read or not yet
    # The add and the update applied (and the lineage checkpoint after it); the refused update never reached
    # the topic, so nothing was dropped.
    assert found.value("tierlog_rlmm_records_applied_total") >= 2
    assert found.value("tierlog_rlmm_records_dropped_total") == 0
    assert found.value("tierlog_rlmm_end_offsets_available") == 1
    assert found.value("tierlog_agent_component_ready", component="rlmm") == 1
    assert found.value("tierlog_archiver_running") == 1
    assert found.value("tierlog_archiver_partition_archiving") == PARTITIONS
    assert found.value("tierlog_archiver_failures_total") == 0
    assert found.value("tierlog_rsm_operation_bytes_total", operation="rsm.fetch_log_segment") == len(log)
    # The one S3 error, by its code; the absent transaction index is not one.
    assert found.value("tierlog_rsm_operation_errors_total") == found.value(
        "tierlog_rsm_operation_errors_total", code="NoSuchKey") == 2  # the rsm's fetch and its backend's GET
    assert found.value("tierlog_rsm_operation_errors_total", operation="backend.get", code="NoSuchKey") == 1


def test_calls_the_broker_expects_are_counted_apart_from_errors(served: tuple[Scrape, bytes]) -> None:
    found, _ = served

    # Not errors: the absent transaction index; errors: the refused update and the fetch of a missing object.
    assert found.value("tierlog_agent_calls_total", method="FetchIndex", code="NOT_FOUND", outcome="expected") == 1
    assert found.value("tierlog_agent_calls_total", method="FetchIndex", outcome="error") == 0
    assert found.value("tierlog_agent_calls_total", method="UpdateRemoteLogSegmentMetadata", outcome="error") == 1
    assert found.value("tierlog_agent_calls_total", method="FetchLogSegment", code="NOT_FOUND", outcome="error") == 1
    assert found.value("tierlog_agent_calls_total", outcome="error") == 2
    assert found.value("tierlog_agent_calls_total", outcome="ok") > 0


def test_the_alerts_on_broker_calls_watch_only_errors() -> None:
    (rule,) = [r for r in alert_rules() if r["alert"] == "TierlogBrokerCallErrors"]
    assert 'outcome="error"' in rule["expr"]
    for expr in [r["expr"] for r in alert_rules()] + dashboard_exprs():
        assert 'code!="OK"' not in expr and "code!='OK'" not in expr


def test_alert_rules_are_well_formed() -> None:
    rules = alert_rules()
    assert {r["alert"] for r in rules} >= {
        "TierlogAgentDown", "TierlogMetadataPartitionHalted", "TierlogMetadataLagGrowing",
        "TierlogMetadataWritesFailing", "TierlogMetadataWritesSlow", "TierlogRemoteStorageErrors",
        "TierlogArchiverStopped",
    }
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert DURATION.match(rule.get("for", "0s")), rule["alert"]
        assert metric_names(rule["expr"]), rule["alert"]


def test_prometheus_in_compose_scrapes_the_agent_and_loads_the_rules() -> None:
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    prometheus = yaml.safe_load((DOCKER / "prometheus" / "prometheus.yml").read_text())
    mounts = compose["services"]["prometheus"]["volumes"]

    assert "./prometheus/alerts.yml:/etc/prometheus/alerts.yml:ro" in mounts
    assert prometheus["rule_files"] == ["/etc/prometheus/alerts.yml"]
    (job,) = prometheus["scrape_configs"]
    assert job["job_name"] == "tierlog-agent"  # the job TierlogAgentDown watches
    assert job["static_configs"][0]["targets"] == ["kafka:9464"]
    assert "9464" in compose["services"]["kafka"]["expose"]


def test_a_halted_metadata_partition_and_a_failing_archiver_are_exported(
    short_dir: Path, tmp_path: Path, kafka_bootstrap: str, metadata_topic: str, s3_rsm: dict[str, str]
) -> None:
    server = start_agent(short_dir / "h.sock", kafka_bootstrap, metadata_topic, tmp_path / "state", s3_rsm)
    try:
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        halted = metadata_partition_for(uuid.uuid4(), 0, PARTITIONS)
        producer = Producer({"bootstrap.servers": kafka_bootstrap})
        producer.produce(metadata_topic, key=b"not a tierlog key", value=b"not avro", partition=halted)
        assert producer.flush(30) == 0

        wait_for(lambda: scrape(url).value("tierlog_rlmm_halted_partitions") == 1, "the partition halted")
        found = scrape(url)
        assert found.value("tierlog_rlmm_partition_halted", partition=str(halted)) == 1
        assert found.value("tierlog_rlmm_partition_halted", partition=str(1 - halted)) == 0
        # The archiver stops before a record it cannot archive, so that none is skipped, and keeps retrying.
        wait_for(lambda: scrape(url).value("tierlog_archiver_failures_total", stage="archive") >= 2,
                 "the archiver's failures")
        assert scrape(url).value("tierlog_archiver_running") == 1
    finally:
        server.stop(grace=1)
