"""The reconcile rules as pure functions (issue 10): grace period against the listing time (the clock is
an input), reasons for orphans, deleted topics, missing objects only for segments finished before the
listing; the in-process and Spark runs give the same report."""

from __future__ import annotations

import uuid

from pyspark.sql import SparkSession

from rlmm.types import RemoteLogSegmentId, TopicIdPartition
from rsm.backend import ObjectInfo
from rsm.keys import segment_keys
from tierlog.pipeline.reconcile import (
    ORPHAN_TOPIC_DELETED,
    ORPHAN_UNREFERENCED,
    LiveSegment,
    ReconcileRules,
    live_segments_frame,
    reconcile_in_process,
    reconcile_on_spark,
)

NOW = 1_800_000_000_000
HOUR = 3_600_000
TP = TopicIdPartition(uuid.uuid4(), "orders", 0)


def _segment(start: int, state: str = "COPY_SEGMENT_FINISHED", finished_at: int = NOW - HOUR,
             tp: TopicIdPartition = TP) -> LiveSegment:
    return LiveSegment(str(tp.topic_id), tp.partition, tp.topic, str(uuid.uuid4()), state, start, 100, finished_at)


def _objects(live: LiveSegment, age_ms: int, size: int = 100) -> list[ObjectInfo]:
    tp = TopicIdPartition(uuid.UUID(live.topic_id), live.topic, live.partition)
    keys = segment_keys(RemoteLogSegmentId(tp, uuid.UUID(live.segment_id)), live.start_offset, False)
    return [ObjectInfo(keys.log, size, NOW - age_ms), ObjectInfo(keys.indexes, 7, NOW - age_ms)]


def test_an_unreferenced_object_younger_than_the_grace_period_is_never_an_orphan() -> None:
    stray = _segment(0)
    report = reconcile_in_process(_objects(stray, age_ms=HOUR - 1), [], ReconcileRules(NOW, grace_ms=HOUR))
    assert report.orphans == ()
    assert len(report.too_young) == 2 and report.delete_plan() == []


def test_an_unreferenced_object_older_than_the_grace_period_is_an_orphan_with_its_reason() -> None:
    stray = _segment(0)
    report = reconcile_in_process(_objects(stray, age_ms=HOUR), [], ReconcileRules(NOW, grace_ms=HOUR))
    assert [o["reason"] for o in report.orphans] == [ORPHAN_UNREFERENCED] * 2


def test_an_object_of_unknown_age_is_never_an_orphan() -> None:
    stray = _segment(0)
    objects = [ObjectInfo(o.key, o.size, None) for o in _objects(stray, 0)]
    assert reconcile_in_process(objects, [], ReconcileRules(NOW, grace_ms=0)).orphans == ()


def test_objects_of_a_live_segment_of_a_deleted_topic_are_orphans_and_never_missing() -> None:
    live = _segment(0)
    half = _objects(live, age_ms=2 * HOUR)[:1]
    rules = ReconcileRules(NOW, grace_ms=HOUR, deleted_topic_ids=frozenset({live.topic_id}))
    report = reconcile_in_process(half, [live], rules)
    assert [o["reason"] for o in report.orphans] == [ORPHAN_TOPIC_DELETED]
    assert report.missing == ()


def test_a_segment_finished_after_the_listing_started_is_not_missing() -> None:
    late = _segment(0, finished_at=NOW + 5)
    assert reconcile_in_process([], [late], ReconcileRules(NOW)).missing == ()


def test_a_finished_segment_without_objects_is_missing_both() -> None:
    gone = _segment(0)
    report = reconcile_in_process([], [gone], ReconcileRules(NOW))
    assert sorted(m["kind"] for m in report.missing) == [".indexes", ".log"]


def test_a_started_copy_without_objects_is_not_missing() -> None:
    assert reconcile_in_process([], [_segment(0, "COPY_SEGMENT_STARTED")], ReconcileRules(NOW)).missing == ()


def test_spark_and_in_process_runs_give_the_same_report(spark: SparkSession) -> None:
    other_tp = TopicIdPartition(uuid.uuid4(), "gone", 1)
    live = [_segment(0), _segment(10), _segment(20, "COPY_SEGMENT_STARTED"), _segment(30, tp=other_tp)]
    objects = [*_objects(live[0], HOUR), *_objects(live[1], HOUR, size=99), *_objects(live[3], 3 * HOUR),
               *_objects(_segment(40), 3 * HOUR), *_objects(_segment(50), 1), ObjectInfo("notes.txt", 3, NOW)]
    rules = ReconcileRules(NOW, grace_ms=2 * HOUR, deleted_topic_ids=frozenset({str(other_tp.topic_id)}))
    in_process = reconcile_in_process(objects, live, rules)
    on_spark = reconcile_on_spark(spark, objects, live_segments_frame(spark, live), rules)
    assert on_spark == in_process
    assert (len(in_process.orphans), len(in_process.too_young), len(in_process.size_mismatches),
            in_process.unrecognized) == (4, 2, 1, ("notes.txt",))
