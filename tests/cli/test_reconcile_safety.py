"""`tierlog reconcile --delete` never deletes live data (issues 10 and 24).

Issue 10: segments tiered after the audit archive's last file were not in the archive, so reconcile against
the archive called them orphans and deleted them. Now the delete refuses while its metadata source is behind
the topic, the default source is the topic itself, objects younger than the grace period are never
candidates, and real orphans older than it are still found (with their reason) and deleted.
Issue 24: live segments of a topic the cluster did not list were deleted. Now such a topic is reported and
kept; a deleted topic's objects go only when the operator names its id and the cluster is the one the metadata
belongs to, through Kafka's partition-delete records; a plan above a share of the live bytes needs a second
flag; segments left in DELETE_SEGMENT_STARTED (a failed copy's cleanup) are reported apart from live ones and
finished by --delete.
Real Kafka (the manager writes the metadata topic), a real bucket directory or SeaweedFS, and `tierlog archive`.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cli_testkit import Run
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from support.topics import create_topic, unique_topic_name

from dev.s3 import S3Endpoint
from rlmm import RemoteLogMetadataManager
from rlmm.errors import RemoteResourceNotFoundError
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
    kafka_uuid_text,
)
from rsm.keys import segment_keys
from tierlog.cli.main import main
from tierlog.pipeline.cluster_topics import TOPIC_NOT_LISTED, topic_ids_by_name
from tierlog.pipeline.locations import open_store
from tierlog.pipeline.reconcile import ORPHAN_TOPIC_DELETED, ORPHAN_UNREFERENCED
from tierlog.pipeline.session import S3Settings

WAIT_S = 30.0
DAY_S = 86_400


@dataclass
class TieredTopic:
    """A real topic whose segments a real manager tiered into a bucket (a directory, or SeaweedFS)."""

    bootstrap: str
    metadata_topic: str
    manager: RemoteLogMetadataManager
    tp: TopicIdPartition
    location: str
    state_dir: Path  # the manager's
    s3: S3Endpoint | None = None
    next_offset: int = 0

    @property
    def bucket(self) -> Path:
        return Path(self.location)

    @property
    def store(self) -> Any:
        s3 = self.s3
        return open_store(self.location, None if s3 is None else S3Settings(s3.endpoint, s3.access_key, s3.secret_key))

    def kafka_options(self) -> list[str]:
        return ["-o", f"bootstrap.servers={self.bootstrap}", "-o", f"metadata.topic.name={self.metadata_topic}"]

    def options(self) -> list[str]:
        s3 = [] if self.s3 is None else ["-o", f"s3.endpoint.url={self.s3.endpoint}", "-o",
                                         f"s3.access.key.id={self.s3.access_key}", "-o",
                                         f"s3.secret.access.key={self.s3.secret_key}"]
        return [*self.kafka_options(), *s3, "--bucket", self.location]

    def _metadata(self, size: int) -> RemoteLogSegmentMetadata:
        md = RemoteLogSegmentMetadata(
            remote_log_segment_id=RemoteLogSegmentId(self.tp, uuid.uuid4()), start_offset=self.next_offset,
            end_offset=self.next_offset + 9, max_timestamp_ms=1, broker_id=0,
            event_timestamp_ms=int(time.time() * 1000), segment_size_in_bytes=size,
            segment_leader_epochs={0: self.next_offset},
        )
        self.next_offset += 10
        return md

    def _update(self, md: RemoteLogSegmentMetadata, state: RemoteLogSegmentState) -> None:
        self.manager.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
            md.remote_log_segment_id, int(time.time() * 1000), None, state, 0,
        )).result(WAIT_S)

    def tier(self, count: int, size: int = 100) -> list[str]:
        """Tier `count` segments (metadata then objects, as the broker does); return their object keys."""
        keys = []
        for _ in range(count):
            md = self._metadata(size + self.next_offset)
            self.manager.add_remote_log_segment_metadata(md).result(WAIT_S)
            keys += self.put_objects(md.remote_log_segment_id, md.start_offset, md.segment_size_in_bytes)
            self._update(md, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)
        return keys

    def fail_copy(self, uploaded: bytes | None) -> tuple[str, list[str]]:
        """What Kafka's RemoteLogManager leaves when a copy fails and so does the delete after it (a wrong S3
        secret): the segment in DELETE_SEGMENT_STARTED, with what the copy uploaded (here: `uploaded` as .log)."""
        md = self._metadata(1000)
        self.manager.add_remote_log_segment_metadata(md).result(WAIT_S)
        keys = segment_keys(md.remote_log_segment_id, md.start_offset, False)
        if uploaded is not None:
            self.store.put(keys.log, uploaded)
        self._update(md, RemoteLogSegmentState.DELETE_SEGMENT_STARTED)
        return str(md.remote_log_segment_id.id), [] if uploaded is None else [keys.log]

    def put_objects(self, segment_id: RemoteLogSegmentId, start: int, size: int, age_s: float = 0) -> list[str]:
        keys = segment_keys(segment_id, start, False)
        store = self.store
        for key, data in ((keys.log, b"x" * size), (keys.indexes, b"packed")):
            store.put(key, data)
            if age_s:
                assert self.s3 is None, "S3 objects cannot be aged"
                stamp = time.time() - age_s
                os.utime(self.bucket / key, (stamp, stamp))
        return [keys.log, keys.indexes]

    def age(self, keys: list[str], age_s: float) -> None:
        for key in keys:
            stamp = time.time() - age_s
            os.utime(self.bucket / key, (stamp, stamp))

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
        return {o.key for o in self.store.list("")}


def _node_config(bootstrap: str, metadata_topic: str, state_dir: Path, broker_id: int = 0) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap, "broker.id": broker_id, "state.dir": str(state_dir),
        "metadata.topic.name": metadata_topic, "metadata.topic.num.partitions": 2,
        "metadata.topic.replication.factor": 1, "metadata.topic.min.insync.replicas": 1,
    }


@contextmanager
def _tiered_topic(kafka_bootstrap: str, tmp_path: Path, location: str,
                  s3: S3Endpoint | None = None) -> Iterator[TieredTopic]:
    name = create_topic(kafka_bootstrap, unique_topic_name("reconcile-orders"))
    topic_id = topic_ids_by_name({"bootstrap.servers": kafka_bootstrap}, WAIT_S)[name]
    tp = TopicIdPartition(uuid.UUID(topic_id), name, 0)
    metadata_topic = unique_topic_name("reconcile-meta")
    manager = RemoteLogMetadataManager(_node_config(kafka_bootstrap, metadata_topic, tmp_path / "node"))
    try:
        manager.on_partition_leadership_changes({tp}, set())
        deadline = time.monotonic() + WAIT_S
        while not manager.is_ready(tp):
            assert time.monotonic() < deadline, f"manager not ready for {tp} within {WAIT_S} s"
            time.sleep(0.05)
        yield TieredTopic(kafka_bootstrap, metadata_topic, manager, tp, location, tmp_path / "node", s3)
    finally:
        manager.close()


@pytest.fixture
def tiered(kafka_bootstrap: str, tmp_path: Path) -> Iterator[TieredTopic]:
    with _tiered_topic(kafka_bootstrap, tmp_path, str(tmp_path / "bucket")) as topic:
        yield topic


@pytest.fixture
def tiered_in_s3(kafka_bootstrap: str, s3_endpoint: S3Endpoint, tmp_path: Path) -> Iterator[TieredTopic]:
    location = f"s3://{s3_endpoint.bucket}/reconcile-{uuid.uuid4().hex[:10]}"
    with _tiered_topic(kafka_bootstrap, tmp_path, location, s3_endpoint) as topic:
        yield topic


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
    archived = tierlog("archive", "--once", "--archive", str(archive), *tiered.kafka_options())
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
    live = tiered.tier(4, size=2_000)  # the orphans are a small share of the live bytes
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
    with RemoteLogMetadataManager(_node_config(tiered.bootstrap, tiered.metadata_topic, tmp_path / "other-node",
                                               broker_id=1)) as other:
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

    assert code == 1, err
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


def test_describe_shows_a_topic_gone_from_the_cluster_as_not_listed(
    tiered: TieredTopic, capsys: pytest.CaptureFixture[str]
) -> None:
    tiered.tier(1)
    node = str(tiered.state_dir)
    options = tiered.kafka_options()

    def topic_state() -> str:
        assert main(["describe", tiered.tp.topic, "--state-dir", node, "--json", *options]) == 0
        (described,) = json.loads(capsys.readouterr().out)
        return str(described["topic_state"])

    assert topic_state() == "live"
    _delete_topic(tiered)  # Kafka sends no partition delete to an RLMM for this (the broker hosts no replica)
    assert topic_state() == TOPIC_NOT_LISTED


ENGINES = pytest.mark.parametrize("engine", [[], ["--spark"]], ids=["in-process", "spark"])


def _engine(engine: list[str], request: pytest.FixtureRequest) -> list[str]:
    if engine:
        request.getfixturevalue("spark")  # the session's shared local Spark
    return engine


@ENGINES
def test_live_segments_of_a_topic_the_cluster_does_not_list_are_kept_and_reported(
    engine: list[str], tiered: TieredTopic, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tiered.tier(2)
    tiered.age(keys, 2 * DAY_S)
    _delete_topic(tiered)  # as an ACL-restricted principal, or a CLI pointed at another cluster, sees it

    code, report, err = _reconcile(capsys, "--delete", *_engine(engine, request), *tiered.options())

    assert code == 1, err
    assert report["deleted"] == [] and report["orphans"] == []
    assert tiered.objects() == set(keys)
    sizes = 100 + 110  # the two segments' sizes
    assert report["unlisted_topics"] == [
        {"topic_id": str(tiered.tp.topic_id), "topic": tiered.tp.topic, "segments": 2, "bytes": sizes}]
    (advice,) = [line for line in report["advice"] if line.startswith("not listed by the cluster")]
    assert f"{tiered.tp.topic} (id {tiered.tp.topic_id}): 2 segments" in advice
    assert f"--deleted-topic-id {tiered.tp.topic_id} to confirm" in advice


@ENGINES
def test_a_confirmed_deleted_topic_goes_through_kafkas_partition_delete_path_with_the_second_flag(
    engine: list[str], tiered: TieredTopic, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tiered.tier(2)
    tiered.age(keys, 2 * DAY_S)
    _delete_topic(tiered)
    confirm = ["--deleted-topic-id", kafka_uuid_text(tiered.tp.topic_id)]  # as broker logs print it
    spark = _engine(engine, request)

    # The whole of the live bytes: refused without the second flag, naming the figures, deleting nothing.
    code, _, err = _reconcile(capsys, "--delete", *confirm, *spark, *tiered.options())
    assert code == 1
    # Segments of 100 and 110 bytes, each with a 6-byte .indexes object.
    assert "refusing to delete: the plan removes 222 bytes in 4 objects, 105.7% of the 210 bytes" in err
    assert "--allow-large-delete" in err
    assert tiered.objects() == set(keys)

    code, report, err = _reconcile(capsys, "--delete", "--allow-large-delete", *confirm, *spark, *tiered.options())

    assert code == 0, err
    assert {o["reason"] for o in report["orphans"]} == {ORPHAN_TOPIC_DELETED}
    assert sorted(report["deleted"]) == sorted(keys)
    assert report["unlisted_topics"] == [] and report["missing_count"] == 0
    assert tiered.objects() == set()
    # The metadata went through Kafka's own path: the partition's delete is FINISHED, so the node forgot it.
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            tiered.manager.list_remote_log_segments(tiered.tp)
        except RemoteResourceNotFoundError:
            break
        assert time.monotonic() < deadline, "the partition delete did not reach the node"
        time.sleep(0.05)
    code, again, err = _reconcile(capsys, *tiered.options())
    assert code == 0, err
    assert again["live_segments"] == 0 and again["unlisted_topics"] == []


def test_a_confirmation_against_another_incarnation_of_the_metadata_topic_is_refused(
    tiered: TieredTopic, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tiered.tier(2)
    tiered.age(keys, 2 * DAY_S)
    _delete_topic(tiered)
    tiered.manager.close()
    # The view was built from one metadata topic; the cluster the CLI reaches has another of that name.
    admin = AdminClient({"bootstrap.servers": tiered.bootstrap})
    admin.delete_topics([tiered.metadata_topic], operation_timeout=WAIT_S)[tiered.metadata_topic].result(WAIT_S)
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            create_topic(tiered.bootstrap, tiered.metadata_topic, partitions=2)
            break
        except Exception:  # the deletion is still under way
            assert time.monotonic() < deadline, "could not recreate the metadata topic"
            time.sleep(0.2)

    code, _, err = _reconcile(capsys, "--state-dir", str(tmp_path / "node"), "--delete", "--allow-large-delete",
                              "--deleted-topic-id", str(tiered.tp.topic_id), *tiered.options())

    assert code == 2
    assert "another cluster (or the topic was recreated); refusing" in err
    assert tiered.objects() == set(keys)


def test_a_confirmation_the_metadata_of_this_cluster_does_not_back_is_refused(
    tiered: TieredTopic, kafka_bootstrap: str, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tiered.tier(2)
    tiered.age(keys, 2 * DAY_S)
    _delete_topic(tiered)
    # Another cluster's tierlog metadata (here: another metadata topic) knows nothing of this bucket's topics.
    elsewhere = create_topic(kafka_bootstrap, unique_topic_name("reconcile-other-meta"), partitions=2)
    options = [*tiered.options(), "-o", f"metadata.topic.name={elsewhere}"]

    code, _, err = _reconcile(capsys, "--delete", "--allow-large-delete", "--deleted-topic-id",
                              str(tiered.tp.topic_id), *options)

    assert code == 2
    assert f"the metadata names no topic with id {tiered.tp.topic_id}" in err
    assert tiered.objects() == set(keys)


def test_failed_copies_are_pending_deletions_apart_from_live_ones_and_delete_finishes_them(
    tiered_in_s3: TieredTopic, capsys: pytest.CaptureFixture[str]
) -> None:
    tiered = tiered_in_s3
    live = tiered.tier(4, size=2_000)
    partial_id, partial_keys = tiered.fail_copy(b"half a segment")
    empty_id, _ = tiered.fail_copy(None)
    grace = ["--grace-minutes", "0"]  # S3 objects cannot be aged; the failures are seconds old

    assert main(["verify", "bucket", "--json", "--state-dir", str(tiered.state_dir), *grace,
                 *tiered.options()]) == 1
    (check,) = json.loads(capsys.readouterr().out)["checks"]
    assert check["report"]["live_segments"] == 4 and check["report"]["deletion_pending_count"] == 2
    assert "2 deletion pending (2000 bytes)" in check["detail"]
    assert any(line.startswith("deletion pending: 2 segments") for line in check["advice"])

    code, report, _ = _reconcile(capsys, *grace, *tiered.options())
    assert code == 1
    assert report["live_segments"] == 4 and report["orphans"] == []
    assert {p["segment_id"] for p in report["deletion_pending"]} == {partial_id, empty_id}
    assert tiered.objects() == set(live + partial_keys)

    code, report, err = _reconcile(capsys, "--delete", *grace, *tiered.options())

    assert code == 0, err
    assert sorted(report["finished"]) == sorted([partial_id, empty_id])
    assert tiered.objects() == set(live)
    deadline = time.monotonic() + WAIT_S
    while {str(md.remote_log_segment_id.id) for md in tiered.manager.list_remote_log_segments(tiered.tp)} \
            & {partial_id, empty_id}:
        assert time.monotonic() < deadline, "DELETE_SEGMENT_FINISHED did not reach the node"
        time.sleep(0.05)
    code, again, err = _reconcile(capsys, "--delete", *grace, *tiered.options())
    assert code == 0, err
    assert again["deletion_pending"] == [] and again["finished"] == [] and again["deleted"] == []


def test_objects_gone_from_the_bucket_are_reported_missing_and_the_advice_blames_the_bucket(
    tiered: TieredTopic, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tiered.tier(2)
    (tiered.bucket / keys[0]).unlink()

    code = main(["verify", "bucket", "--json", "--state-dir", str(tiered.state_dir),
                 *tiered.options()])
    result = json.loads(capsys.readouterr().out)

    assert code == 1
    (check,) = result["checks"]
    assert [m["key"] for m in check["report"]["missing"]] == [keys[0]]
    assert any("the BUCKET lost data" in line for line in check["advice"])
    assert not any("METADATA side is stale" in line for line in check["advice"])


def test_usage_marks_a_topic_gone_from_the_cluster_as_not_listed(
    tiered: TieredTopic, tierlog: Callable[..., Run], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiered.tier(2)
    archive = str(tmp_path / "archive")
    archived = tierlog("archive", "--once", "--archive", archive, *tiered.kafka_options())
    assert archived.returncode == 0, archived.stderr
    _delete_topic(tiered)

    code = main(["usage", "--archive", archive, "--out", str(tmp_path / "usage"), "--json", *tiered.kafka_options()])
    latest = json.loads(capsys.readouterr().out)["latest_per_topic"]

    assert code == 0
    assert [(r["topic"], r["topic_state"]) for r in latest] == [(tiered.tp.topic, TOPIC_NOT_LISTED)]
