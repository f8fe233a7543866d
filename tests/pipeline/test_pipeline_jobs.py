"""The PySpark jobs on local[2]: replay, reconcile, snapshot and usage, against real S3 and Kafka.

Replay is checked against the single-process fold and the independent reference model; reconcile against
objects planted in a real bucket; the snapshot against a node that rebuilt from the real topic.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pipeline_testkit import METADATA_TOPIC, ArchivedHistory
from pyspark.sql import DataFrame, SparkSession
from support.reference_model import ReferenceModel
from support.spark import s3_settings

from dev.s3 import S3Endpoint
from rlmm import RemoteLogMetadataManager, codec
from rlmm import view_format as vf
from rlmm.events import RecordKey
from rlmm.snapshot import load_snapshot
from rlmm.types import RemoteLogSegmentState, TopicIdPartition
from rlmm.view import ConsumedRecord, MetadataView, apply_records
from rsm.keys import segment_keys
from tierlog.audit.archiver import Archiver, ArchiverSettings
from tierlog.pipeline.archive import read_archive
from tierlog.pipeline.generate import (
    HistoryGenerator,
    HistorySpec,
    RawRecord,
    fold,
    produce_history,
    write_archive,
)
from tierlog.pipeline.locations import open_store
from tierlog.pipeline.reconcile import MetadataFreshness, live_segments_of, reconcile
from tierlog.pipeline.replay import compacted, entries_digest, fold_by_user_partition, replay
from tierlog.pipeline.snapshot import build_snapshot
from tierlog.pipeline.usage import usage_over_time, write_usage

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def replayed_entries(spark: SparkSession, archived_history: ArchivedHistory) -> DataFrame:
    archive = read_archive(spark, archived_history.location, archived_history.metadata_topic)
    return fold_by_user_partition(compacted(archive)).cache()


def test_replay_of_the_archive_reaches_the_digest_of_the_single_process_fold(
    replayed_entries: DataFrame, archived_history: ArchivedHistory
) -> None:
    assert len(archived_history.records) >= 100_000
    assert entries_digest(replayed_entries) == fold(archived_history.records).digest()


def test_replay_of_the_archive_agrees_with_the_reference_model(
    replayed_entries: DataFrame, archived_history: ArchivedHistory
) -> None:
    model = ReferenceModel()
    methods = {
        "add": model.add_remote_log_segment_metadata,
        "update": model.update_remote_log_segment_metadata,
        "delete_partition": model.put_remote_partition_delete_metadata,
    }
    for call, argument in archived_history.generator.api_calls:
        methods[call](argument)
    replayed_segments: dict[tuple[str, int], set[tuple[str, str]]] = {}
    replayed_highest: dict[tuple[str, int], dict[int, int | None]] = {}
    for row in replayed_entries.collect():
        owner = (row["topic_id"], row["partition"])
        if row["family"] == vf.SEGMENTS:
            replayed_segments.setdefault(owner, set()).add((row["segment_id"], row["state"]))
        elif row["family"] == vf.EPOCH_STATE:
            lineage = vf.decode_lineage(bytes(row["entry_value"]))
            replayed_highest.setdefault(owner, {})[lineage.epoch] = lineage.highest_log_offset
    partitions: set[TopicIdPartition] = {
        argument.topic_id_partition for _, argument in archived_history.generator.api_calls
    }
    checked = 0
    for tp in partitions:
        key = (str(tp.topic_id), tp.partition)
        if model.is_deleted(tp):
            assert key not in replayed_segments, f"{tp} was deleted but the replay still holds segments"
            continue
        listed = model.list_remote_log_segments(tp)
        expected = {(str(md.remote_log_segment_id.id), md.state.name) for md in listed}
        assert replayed_segments.get(key, set()) == expected, f"segments of {tp}"
        highest = replayed_highest.get(key, {})
        for epoch in range(max(highest, default=0) + 20):
            assert model.highest_offset_for_epoch(tp, epoch) == highest.get(epoch), f"{tp} epoch {epoch}"
        checked += 1
    assert checked >= 20


# --- replay against a live view ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_history(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[RawRecord], str]:
    spec = HistorySpec(events=4_000, topics=2, partitions_per_topic=3, seed=5)
    records = list(HistoryGenerator(spec).records())
    location = str(tmp_path_factory.mktemp("small-archive"))
    store = open_store(location)
    write_archive(records, store, METADATA_TOPIC, records_per_file=700)
    return records, location


def build_view(state_dir: Path, records: list[RawRecord], next_offsets: dict[int, int]) -> None:
    view = MetadataView.open(state_dir)
    try:
        consumed = [
            ConsumedRecord(r.metadata_partition, r.offset, RecordKey.decode(r.key),
                           None if r.value is None else codec.decode(r.value))
            for r in sorted(records, key=lambda r: (r.metadata_partition, r.offset))
        ]
        apply_records(view, METADATA_TOPIC, consumed, next_offsets)
    finally:
        view.close()


def end_offsets_of(records: list[RawRecord]) -> dict[int, int]:
    ends: dict[int, int] = {}
    for r in records:
        ends[r.metadata_partition] = max(ends.get(r.metadata_partition, 0), r.offset + 1)
    return ends


def test_replay_stops_at_the_offsets_a_lagging_view_applied(
    spark: SparkSession, small_history: tuple[list[RawRecord], str], tmp_path: Path
) -> None:
    records, location = small_history
    applied = [r for r in records if r.offset < 600]
    build_view(tmp_path, applied, end_offsets_of(applied))
    report = replay(spark, location, METADATA_TOPIC, state_dir=tmp_path)
    assert report.matches is True
    assert report.difference_count == 0
    assert report.replayed_up_to == end_offsets_of(applied)


def test_replay_names_the_user_partition_whose_events_a_view_missed(
    spark: SparkSession, small_history: tuple[list[RawRecord], str], tmp_path: Path
) -> None:
    records, location = small_history
    victim = fold(records).user_partitions()[0]
    missed = [r for r in records if not RecordKey.decode(r.key).same_user_partition(victim)]
    build_view(tmp_path, missed, end_offsets_of(records))
    report = replay(spark, location, METADATA_TOPIC, state_dir=tmp_path)
    assert report.matches is False
    assert report.difference_count > 0
    assert {(d.topic_id, d.partition, d.kind) for d in report.differences} == {
        (str(victim.topic_id), victim.partition, "only_in_archive")
    }


# --- reconcile -------------------------------------------------------------------------------------------


def upload_segment_objects(store: Any, live: list[Any]) -> None:
    for row in live:
        keys = keys_of(row)
        store.put(keys.log, b"x" * row["segment_size_in_bytes"])
        store.put(keys.indexes, b"packed-indexes")


def keys_of(row: Any) -> Any:
    from rlmm.types import RemoteLogSegmentId

    tp = TopicIdPartition(uuid.UUID(row["topic_id"]), row["topic"], row["partition"])
    return segment_keys(RemoteLogSegmentId(tp, uuid.UUID(row["segment_id"])), row["start_offset"], False)


@pytest.fixture
def reconciled_bucket(
    spark: SparkSession, s3_endpoint: S3Endpoint, tmp_path: Path
) -> tuple[DataFrame, Any, dict[str, Any]]:
    """Live metadata of a small history, a bucket prefix holding its objects plus planted faults."""
    spec = HistorySpec(events=3_000, topics=2, partitions_per_topic=2, seed=3, segment_bytes=(10, 400))
    records = list(HistoryGenerator(spec).records())
    archive_store = open_store(str(tmp_path))
    write_archive(records, archive_store, METADATA_TOPIC)
    entries = fold_by_user_partition(compacted(read_archive(spark, str(tmp_path), METADATA_TOPIC)))
    live = live_segments_of(entries).cache()
    rows = live.collect()
    location = f"s3://{s3_endpoint.bucket}/reconcile-{uuid.uuid4().hex[:10]}"
    store = open_store(location, s3_settings(s3_endpoint))
    upload_segment_objects(store, rows)
    finished = [r for r in rows if r["state"] == RemoteLogSegmentState.COPY_SEGMENT_FINISHED.name]
    assert len(finished) >= 4
    template = finished[0]
    orphans = []
    for _ in range(3):
        stranger = {**template.asDict(), "segment_id": str(uuid.uuid4())}
        keys = keys_of(stranger)
        store.put(keys.log, b"orphan")
        orphans.append(keys.log)
    missing = [keys_of(finished[1]).log, keys_of(finished[2]).indexes]
    store.delete(missing)
    wrong_size = keys_of(finished[3]).log
    store.put(wrong_size, b"y" * (finished[3]["segment_size_in_bytes"] + 1))
    store.put(f"audit/{METADATA_TOPIC}/0/{0:020d}-{5:020d}.avro", b"not a segment")
    return live, store, {"orphans": sorted(orphans), "missing": sorted(missing), "wrong_size": [wrong_size]}


def test_reconcile_finds_exactly_the_planted_orphans_missing_objects_and_size_mismatches(
    spark: SparkSession, reconciled_bucket: tuple[DataFrame, Any, dict[str, Any]]
) -> None:
    live, store, planted = reconciled_bucket
    report = reconcile(spark, live, store, grace_ms=0)  # the planted orphans are seconds old
    assert sorted(o["key"] for o in report.orphans) == planted["orphans"]
    assert sorted(m["key"] for m in report.missing) == planted["missing"]
    assert [m["key"] for m in report.size_mismatches] == planted["wrong_size"]
    assert report.unrecognized == ()
    assert report.deleted == ()


def test_reconcile_deletes_the_orphans_only_when_asked(
    spark: SparkSession, reconciled_bucket: tuple[DataFrame, Any, dict[str, Any]]
) -> None:
    live, store, planted = reconciled_bucket
    reconcile(spark, live, store, grace_ms=0)
    assert {o.key for o in store.list("")} >= set(planted["orphans"])
    # The archive here is the whole history: as caught up as the topic it came from.
    caught_up = MetadataFreshness("the test's archive", applied={0: 3_000}, topic_ends={0: 3_000})
    report = reconcile(spark, live, store, grace_ms=0, delete_orphans=True, freshness=caught_up)
    assert sorted(report.deleted) == planted["orphans"]
    remaining = {o.key for o in store.list("")}
    assert not remaining & set(planted["orphans"])
    assert reconcile(spark, live, store, grace_ms=0).orphans == ()


# --- snapshot ------------------------------------------------------------------------------------------


def test_snapshot_bootstrap_reaches_the_digest_of_a_topic_rebuild(
    spark: SparkSession,
    kafka_bootstrap: str,
    create_topic: Callable[..., str],
    s3_endpoint: S3Endpoint,
    tmp_path: Path,
) -> None:
    spec = HistorySpec(events=20_000, metadata_partitions=3, seed=21)
    records = list(HistoryGenerator(spec).records())
    topic = create_topic("snapshot-meta", partitions=3, config={"cleanup.policy": "compact"})
    produce_history(kafka_bootstrap, topic, records)
    location = f"s3://{s3_endpoint.bucket}/snapshot-{uuid.uuid4().hex[:10]}"
    store = open_store(location, s3_settings(s3_endpoint))
    archiver = Archiver(store, ArchiverSettings(kafka_bootstrap, topic, max_records_per_file=4_000))
    archiver.run_until_caught_up(120)

    snapshot = build_snapshot(spark, location, topic, tmp_path / "snapshot.avro")
    assert snapshot.end_offsets == end_offsets_of(records)
    load_snapshot(snapshot.path, tmp_path / "from-snapshot")

    def node(state_dir: Path) -> dict[str, Any]:
        return {
            "bootstrap.servers": kafka_bootstrap, "broker.id": 1, "state.dir": str(state_dir),
            "metadata.topic.name": topic, "metadata.topic.num.partitions": 3,
            "metadata.topic.replication.factor": 1, "metadata.topic.min.insync.replicas": 1,
        }

    with RemoteLogMetadataManager(node(tmp_path / "from-snapshot")) as bootstrapped:
        bootstrapped.wait_caught_up(60)
        snapshot_digest = bootstrapped.view_digest()
    with RemoteLogMetadataManager(node(tmp_path / "from-topic")) as rebuilt:
        rebuilt.wait_caught_up(120)
        topic_digest = rebuilt.view_digest()
    assert snapshot_digest == topic_digest == fold(records).digest()


# --- usage ---------------------------------------------------------------------------------------------


def test_usage_ends_at_the_bytes_of_the_segments_still_copied(
    spark: SparkSession, small_history: tuple[list[RawRecord], str], tmp_path: Path
) -> None:
    records, location = small_history
    result = usage_over_time(spark, location, METADATA_TOPIC, bucket_ms=600_000)
    last_bucket = result.table.agg({"bucket_start_ms": "max"}).collect()[0][0]
    last = result.table.where(f"bucket_start_ms = {last_bucket}")
    at_end = last.groupBy().sum("remote_bytes").collect()[0][0]
    final = fold(records)
    expected = sum(
        md.segment_size_in_bytes
        for tp in final.user_partitions() for md in final.segments_of(tp)
        if md.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED
    )
    assert at_end == expected


def test_usage_writes_a_table_and_a_chart(
    spark: SparkSession, small_history: tuple[list[RawRecord], str], tmp_path: Path
) -> None:
    _records, location = small_history
    result = usage_over_time(spark, location, METADATA_TOPIC, bucket_ms=600_000)
    csv_path, png_path = write_usage(result, tmp_path)
    lines = csv_path.read_text().splitlines()
    assert lines[0] == "topic,partition,bucket_start_ms,remote_bytes,segments"
    partitions = result.table.select("topic", "partition").distinct().count()
    assert len(lines) == 1 + partitions * result.buckets  # every partition has a row in every bucket
    assert png_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
