"""`tierlog reconcile --delete` never deletes live data (issue 10).

The incident: segments tiered after the audit archive's last file were not in the archive, so reconcile
against the archive called them orphans and deleted them. Now the delete refuses while its metadata
source is behind the topic, the default source is the topic itself, objects younger than the grace period
are never candidates, and real orphans older than it are still found (with their reason) and deleted.
Real Kafka (the manager writes the metadata topic), a real bucket directory, and `tierlog archive`.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_testkit import Run
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from support.topics import create_topic, unique_topic_name

from rlmm import RemoteLogMetadataManager
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from rsm.keys import segment_keys
from tierlog.cli.main import main
from tierlog.pipeline.cluster_topics import topic_ids_by_name
from tierlog.pipeline.locations import open_store
from tierlog.pipeline.reconcile import ORPHAN_TOPIC_DELETED, ORPHAN_UNREFERENCED

WAIT_S = 30.0
DAY_S = 86_400


@dataclass
class TieredTopic:
    """A real topic whose segments a real manager tiered into a bucket directory."""

    bootstrap: str
    metadata_topic: str
    manager: RemoteLogMetadataManager
    tp: TopicIdPartition
    bucket: Path
    next_offset: int = 0

    def options(self) -> list[str]:
        return ["-o", f"bootstrap.servers={self.bootstrap}", "-o", f"metadata.topic.name={self.metadata_topic}",
                "--bucket", str(self.bucket)]

    def tier(self, count: int) -> list[str]:
        """Tier `count` segments (metadata then objects, as the broker does); return their object keys."""
        keys = []
        for _ in range(count):
            segment_id = RemoteLogSegmentId(self.tp, uuid.uuid4())
            size = 100 + self.next_offset
            md = RemoteLogSegmentMetadata(
                remote_log_segment_id=segment_id, start_offset=self.next_offset, end_offset=self.next_offset + 9,
                max_timestamp_ms=1, broker_id=0, event_timestamp_ms=int(time.time() * 1000),
                segment_size_in_bytes=size, segment_leader_epochs={0: self.next_offset},
            )
            self.manager.add_remote_log_segment_metadata(md).result(WAIT_S)
            keys += self.put_objects(segment_id, self.next_offset, size)
            self.manager.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
                segment_id, int(time.time() * 1000), None, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 0,
            )).result(WAIT_S)
            self.next_offset += 10
        return keys

    def put_objects(self, segment_id: RemoteLogSegmentId, start: int, size: int, age_s: float = 0) -> list[str]:
        keys = segment_keys(segment_id, start, False)
        for key, data in ((keys.log, b"x" * size), (keys.indexes, b"packed")):
            path = self.bucket / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if age_s:
                stamp = time.time() - age_s
                os.utime(path, (stamp, stamp))
        return [keys.log, keys.indexes]

    def plant_orphans(self, count: int, age_s: float) -> list[str]:
        """Objects of this topic no segment references (a crashed upload's leftovers)."""
        keys = []
        for i in range(count):
            keys += self.put_objects(RemoteLogSegmentId(self.tp, uuid.uuid4()), 10_000 + i, 50, age_s)
        return keys

    def metadata_records(self) -> int:
        """The metadata topic's end offsets, summed: how many records it holds."""
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "reconcile-safety-test"})
        try:
            return sum(consumer.get_watermark_offsets(TopicPartition(self.metadata_topic, p), timeout=WAIT_S)[1]
                       for p in range(2))
        finally:
            consumer.close()

    def objects(self) -> set[str]:
        store = open_store(str(self.bucket))
        return {o.key for o in store.list("")}


@pytest.fixture
def tiered(kafka_bootstrap: str, tmp_path: Path) -> Iterator[TieredTopic]:
    name = create_topic(kafka_bootstrap, unique_topic_name("reconcile-orders"))
    topic_id = topic_ids_by_name({"bootstrap.servers": kafka_bootstrap}, WAIT_S)[name]
    tp = TopicIdPartition(uuid.UUID(topic_id), name, 0)
    metadata_topic = unique_topic_name("reconcile-meta")
    manager = RemoteLogMetadataManager({
        "bootstrap.servers": kafka_bootstrap, "broker.id": 0, "state.dir": str(tmp_path / "node"),
        "metadata.topic.name": metadata_topic, "metadata.topic.num.partitions": 2,
        "metadata.topic.replication.factor": 1, "metadata.topic.min.insync.replicas": 1,
    })
    try:
        manager.on_partition_leadership_changes({tp}, set())
        deadline = time.monotonic() + WAIT_S
        while not manager.is_ready(tp):
            assert time.monotonic() < deadline, f"manager not ready for {tp} within {WAIT_S} s"
            time.sleep(0.05)
        yield TieredTopic(kafka_bootstrap, metadata_topic, manager, tp, tmp_path / "bucket")
    finally:
        manager.close()


def _reconcile(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any], str]:
    code = main(["reconcile", "--json", *args])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out.strip() else {}, captured.err


def test_delete_against_an_archive_behind_the_topic_refuses_and_deletes_nothing(
    tiered: TieredTopic, tierlog: Callable[..., Run], spark: object, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    archive = tmp_path / "archive"
    archived_live = tiered.tier(3)
    archived = tierlog("archive", "--once", "--archive", str(archive), *tiered.options()[:4])
    assert archived.returncode == 0, archived.stderr
    archived_records = tiered.metadata_records()
    fresh_live = tiered.tier(6)  # tiered after the archive's last file, not archived
    unarchived = tiered.metadata_records() - archived_records
    orphans = tiered.plant_orphans(2, age_s=3 * DAY_S)
    before = tiered.objects()

    code, _, err = _reconcile(capsys, "--archive", str(archive), "--delete", *tiered.options())

    assert code == 1
    assert "refusing to delete" in err and f"behind the metadata topic by {unarchived} records" in err
    assert tiered.objects() == before
    assert set(archived_live + fresh_live + orphans) <= before


@pytest.mark.parametrize("engine", [[], ["--spark"]], ids=["in-process", "spark"])
def test_delete_against_the_topic_removes_only_old_orphans_and_keeps_every_live_and_young_object(
    engine: list[str], tiered: TieredTopic, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    if engine:
        request.getfixturevalue("spark")  # the session's shared local Spark
    live = tiered.tier(4)
    old_orphans = tiered.plant_orphans(2, age_s=3 * DAY_S)
    young_stray = tiered.plant_orphans(1, age_s=0)  # an upload whose metadata may not be readable yet

    code, report, err = _reconcile(capsys, "--delete", *engine, *tiered.options())

    assert code == 0, err
    assert sorted(report["deleted"]) == sorted(old_orphans)
    assert {o["reason"] for o in report["orphans"]} == {ORPHAN_UNREFERENCED}
    assert sorted(o["key"] for o in report["too_young"]) == sorted(young_stray)
    assert report["freshness"]["behind_records"] == 0
    assert tiered.objects() == set(live + young_stray)


def test_a_zero_grace_period_offers_young_orphans_too(
    tiered: TieredTopic, capsys: pytest.CaptureFixture[str]
) -> None:
    tiered.tier(1)
    stray = tiered.plant_orphans(1, age_s=0)

    code, report, _ = _reconcile(capsys, "--grace-minutes", "0", *tiered.options())

    assert code == 1
    assert sorted(o["key"] for o in report["orphans"]) == sorted(stray)
    assert report["deleted"] == []


def test_a_view_behind_the_topic_is_refused_naming_the_lag_and_the_stale_side(
    tiered: TieredTopic, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiered.tier(2)
    stale = tmp_path / "node"
    tiered.manager.close()  # its view stops here; the topic moves on
    applied = tiered.metadata_records()
    with RemoteLogMetadataManager({
        "bootstrap.servers": tiered.bootstrap, "broker.id": 1, "state.dir": str(tmp_path / "other-node"),
        "metadata.topic.name": tiered.metadata_topic, "metadata.topic.num.partitions": 2,
        "metadata.topic.replication.factor": 1, "metadata.topic.min.insync.replicas": 1,
    }) as other:
        tiered.manager = other
        other.on_partition_leadership_changes({tiered.tp}, set())
        deadline = time.monotonic() + WAIT_S
        while not other.is_ready(tiered.tp):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        newer = tiered.tier(2)
        before = tiered.objects()
        unapplied = tiered.metadata_records() - applied

        code, _, err = _reconcile(capsys, "--state-dir", str(stale), "--delete", *tiered.options())

    assert code == 1
    assert f"behind the metadata topic by {unapplied} records" in err and "metadata side is stale" in err
    assert tiered.objects() == before
    assert set(newer) <= before


def _delete_topic(tiered: TieredTopic) -> None:
    admin = AdminClient({"bootstrap.servers": tiered.bootstrap})
    admin.delete_topics([tiered.tp.topic], operation_timeout=WAIT_S)[tiered.tp.topic].result(WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while tiered.tp.topic in topic_ids_by_name({"bootstrap.servers": tiered.bootstrap}, WAIT_S):
        assert time.monotonic() < deadline, "the topic deletion did not finish"
        time.sleep(0.1)


def test_describe_shows_a_topic_gone_from_the_cluster_as_deleted(
    tiered: TieredTopic, capsys: pytest.CaptureFixture[str]
) -> None:
    tiered.tier(1)
    node = str(tiered.bucket.parent / "node")
    options = tiered.options()[:4]

    def topic_state() -> str:
        assert main(["describe", tiered.tp.topic, "--state-dir", node, "--json", *options]) == 0
        (described,) = json.loads(capsys.readouterr().out)
        return str(described["topic_state"])

    assert topic_state() == "live"
    _delete_topic(tiered)  # Kafka sends no partition delete to an RLMM for this (the broker hosts no replica)
    assert topic_state() == "deleted"


def test_objects_of_a_topic_deleted_from_the_cluster_are_offered_after_the_grace_period(
    tiered: TieredTopic, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tiered.tier(2)
    for key in keys:  # tiered two days ago
        stamp = time.time() - 2 * DAY_S
        os.utime(tiered.bucket / key, (stamp, stamp))
    _delete_topic(tiered)

    code, report, err = _reconcile(capsys, "--delete", *tiered.options())

    assert code == 0, err
    assert report["deleted_topics"] == {str(tiered.tp.topic_id): tiered.tp.topic}
    assert {o["reason"] for o in report["orphans"]} == {ORPHAN_TOPIC_DELETED}
    assert sorted(report["deleted"]) == sorted(keys)
    assert report["missing_count"] == 0
    assert tiered.objects() == set()


def test_objects_gone_from_the_bucket_are_reported_missing_and_the_advice_blames_the_bucket(
    tiered: TieredTopic, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tiered.tier(2)
    (tiered.bucket / keys[0]).unlink()

    code = main(["verify", "bucket", "--json", "--state-dir", str(tiered.bucket.parent / "node"),
                 *tiered.options()])
    result = json.loads(capsys.readouterr().out)

    assert code == 1
    (check,) = result["checks"]
    assert [m["key"] for m in check["report"]["missing"]] == [keys[0]]
    assert any("the BUCKET lost data" in line for line in check["advice"])
    assert not any("METADATA side is stale" in line for line in check["advice"])


def test_usage_marks_a_topic_gone_from_the_cluster_as_deleted(
    tiered: TieredTopic, tierlog: Callable[..., Run], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiered.tier(2)
    archive = str(tmp_path / "archive")
    archived = tierlog("archive", "--once", "--archive", archive, *tiered.options()[:4])
    assert archived.returncode == 0, archived.stderr
    _delete_topic(tiered)

    code = main(["usage", "--archive", archive, "--out", str(tmp_path / "usage"), "--json", *tiered.options()[:4]])
    latest = json.loads(capsys.readouterr().out)["latest_per_topic"]

    assert code == 0
    assert [(r["topic"], r["topic_state"]) for r in latest] == [(tiered.tp.topic, "deleted")]
