"""A running tierlog broker loses its metadata topic: `tierlog restore --config server.properties` re-creates it from
the bucket, the agent restarted rebuilds its view from it, and every record is read back from tiered storage."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient
from e2e_testkit import agent_pid, describe, finished, remote_segments, wait_for_new_agent

from dev.demo import S3Location, consume, create_topic, produce, wait_for, wait_until_tiered
from dev.kafka import KafkaCluster
from rlmm import RemoteLogSegmentMetadata
from tierlog.audit.archiver import Archiver, ArchiverSettings
from tierlog.cli.main import main
from tierlog.pipeline.locations import open_store
from tierlog.pipeline.session import S3Settings

RECORDS = 25_000
METADATA_TOPIC = "__tierlog_metadata"


def tiering_settled(cluster: KafkaCluster, socket_dir: Path, topic: str) -> list[RemoteLogSegmentMetadata]:
    """The finished remote segments once every rolled segment is in remote storage (no copy, so no metadata write,
    is left to come)."""
    tp, _ = describe(cluster.bootstrap, topic)
    active = max(int(p.stem) for p in (cluster.log_dir(0) / f"{topic}-0").glob("*.log"))

    def settled() -> list[RemoteLogSegmentMetadata] | None:
        segments = finished(remote_segments(socket_dir, 0, tp))
        return segments if segments and max(s.end_offset for s in segments) + 1 == active else None

    return list(wait_for(settled, 60, f"every rolled segment of {topic} tiered"))


def test_a_lost_metadata_topic_is_restored_and_every_record_is_read_back_from_tiered_storage(
    tiered_cluster: Callable[..., KafkaCluster], socket_dir: Path, s3_location: S3Location,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = tiered_cluster()
    create_topic(cluster.bootstrap, "restored")
    produce(cluster.bootstrap, "restored", 0, RECORDS)
    wait_until_tiered(cluster.log_dir(0), "restored", min_local_start=RECORDS // 2)
    before = tiering_settled(cluster, socket_dir, "restored")
    store = open_store(f"s3://{s3_location.bucket}/{s3_location.prefix}",
                       S3Settings(s3_location.endpoint, s3_location.access_key, s3_location.secret_key))
    Archiver(store, ArchiverSettings(cluster.bootstrap, METADATA_TOPIC)).run_until_caught_up(60)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    admin.delete_topics([METADATA_TOPIC], operation_timeout=30)[METADATA_TOPIC].result(60)
    wait_for(lambda: METADATA_TOPIC not in admin.list_topics(timeout=10).topics or None, 30, "the topic deleted")
    capsys.readouterr()

    code = main(["restore", "--config", str(cluster.node(0).config_file), "--json", "--wait", "60"])

    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    # The broker may tier (or start to tier) one more segment between `before` and the topic's loss.
    assert report["written_digest"] == report["view_digest"] and report["segments"] >= len(before)
    old_agent = agent_pid(socket_dir, 0)
    assert old_agent is not None
    os.kill(old_agent, signal.SIGKILL)  # the broker's adapter starts a new one, which rebuilds from the new topic
    wait_for_new_agent(socket_dir, 0, old_agent)
    tp, _ = describe(cluster.bootstrap, "restored")
    after = wait_for(lambda: finished(remote_segments(socket_dir, 0, tp)) or None, 60, "the restored metadata")
    assert after[: len(before)] == before
    read = consume(cluster.bootstrap, "restored", RECORDS)
    assert read.indexes == list(range(RECORDS))
    assert not read.mismatched
