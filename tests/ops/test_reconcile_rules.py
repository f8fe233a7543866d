"""The reconcile rules as pure functions (issues 10, 24): grace period against the listing time (the clock is
an input), reasons for orphans, confirmed deleted topics and partitions the metadata deletes, missing objects
only for segments finished before the listing, pending deletions apart from live segments, the refusal of a
large plan; the in-process and Spark runs give the same report."""

from __future__ import annotations

import uuid

import pytest
from pyspark.sql import SparkSession

from rlmm.types import RemoteLogSegmentId, TopicIdPartition
from rsm.backend import ObjectInfo
from rsm.keys import segment_keys
from tierlog.pipeline.reconcile import (
    ORPHAN_PARTITION_DELETED,
    ORPHAN_TOPIC_DELETED,
    ORPHAN_UNREFERENCED,
    DeleteLimit,
    LargeDeleteError,
    LiveSegment,
    MetadataFreshness,
    ReconcileRules,
    TopicHoldings,
    check_delete_allowed,
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


def test_objects_of_a_live_segment_of_a_confirmed_deleted_topic_are_orphans_and_never_missing() -> None:
    live = _segment(0)
    half = _objects(live, age_ms=2 * HOUR)[:1]
    rules = ReconcileRules(NOW, grace_ms=HOUR, deleted_topic_ids=frozenset({live.topic_id}))
    report = reconcile_in_process(half, [live], rules)
    assert [o["reason"] for o in report.orphans] == [ORPHAN_TOPIC_DELETED]
    assert report.missing == ()


def test_objects_of_a_live_segment_are_kept_without_a_confirmation_whatever_the_cluster_lists() -> None:
    live = _segment(0)
    report = reconcile_in_process(_objects(live, age_ms=2 * HOUR), [live], ReconcileRules(NOW, grace_ms=HOUR))
    assert report.orphans == () and report.delete_plan() == []
    assert report.live_topics == (TopicHoldings(live.topic_id, live.topic, 1, 100),)


def test_objects_of_a_partition_whose_deletion_the_metadata_records_are_orphans() -> None:
    live, other = _segment(0), _segment(10, tp=TopicIdPartition(TP.topic_id, TP.topic, 1))
    rules = ReconcileRules(NOW, grace_ms=HOUR, deleting_partitions=frozenset({(live.topic_id, 0)}))
    report = reconcile_in_process([*_objects(live, 2 * HOUR), *_objects(other, 2 * HOUR)], [live, other], rules)
    assert {o["segment_id"] for o in report.orphans} == {live.segment_id}
    assert {o["reason"] for o in report.orphans} == {ORPHAN_PARTITION_DELETED}


def test_a_segment_whose_deletion_started_is_pending_not_live_and_finishable_after_the_grace_period() -> None:
    started_long_ago, started_now = _segment(0, "DELETE_SEGMENT_STARTED", NOW - 2 * HOUR), \
        _segment(10, "DELETE_SEGMENT_STARTED", NOW - 1)
    live = _segment(20)
    objects = [*_objects(started_long_ago, 2 * HOUR), *_objects(live, 2 * HOUR)]
    report = reconcile_in_process(objects, [started_long_ago, started_now, live], ReconcileRules(NOW, grace_ms=HOUR))
    assert report.live_segments == 1 and report.live_bytes == 100
    assert report.orphans == () and report.missing == ()
    pending = {p["segment_id"]: p for p in report.deletion_pending}
    assert pending.keys() == {started_long_ago.segment_id, started_now.segment_id}
    assert pending[started_long_ago.segment_id]["finishable"] is True
    assert pending[started_now.segment_id]["finishable"] is False
    assert pending[started_long_ago.segment_id]["object_bytes"] == 107  # .log and .indexes, as listed
    assert [p["segment_id"] for p in report.pending_to_finish] == [started_long_ago.segment_id]
    # Its objects (listed or not: deleting an absent one is fine) are in the delete plan.
    assert sorted(report.delete_plan()) == sorted(pending[started_long_ago.segment_id]["keys"])
    assert not report.clean


def _caught_up() -> MetadataFreshness:
    return MetadataFreshness("metadata topic", {0: 5}, {0: 5})


def test_a_plan_above_the_share_of_live_bytes_is_refused_naming_the_figures_unless_allowed() -> None:
    live = [_segment(i * 10) for i in range(10)]  # 1,000 live bytes
    strays = [o for i in range(3) for o in _objects(_segment(100 + i), 2 * HOUR, size=20)]  # 3 x (20 + 7) bytes
    report = reconcile_in_process([*strays, *(o for s in live for o in _objects(s, 2 * HOUR))], live,
                                  ReconcileRules(NOW, grace_ms=HOUR))
    assert report.plan_bytes == 81 and report.live_bytes == 1000
    with pytest.raises(LargeDeleteError, match=r"removes 81 bytes in 6 objects, 8\.1% of the 1,000 bytes .* 5\.0%"):
        check_delete_allowed(report, _caught_up(), DeleteLimit())
    check_delete_allowed(report, _caught_up(), DeleteLimit(max_share=0.1))
    check_delete_allowed(report, _caught_up(), DeleteLimit(allow_large=True))


def test_any_plan_is_large_when_the_metadata_holds_nothing_live() -> None:
    report = reconcile_in_process(_objects(_segment(0), 2 * HOUR), [], ReconcileRules(NOW, grace_ms=HOUR))
    with pytest.raises(LargeDeleteError, match="holds no live bytes"):
        check_delete_allowed(report, _caught_up(), DeleteLimit())


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
    deleting_tp = TopicIdPartition(TP.topic_id, TP.topic, 7)
    live = [_segment(0), _segment(10), _segment(20, "COPY_SEGMENT_STARTED"), _segment(30, tp=other_tp),
            _segment(60, "DELETE_SEGMENT_STARTED", NOW - 3 * HOUR), _segment(70, tp=deleting_tp)]
    objects = [*_objects(live[0], HOUR), *_objects(live[1], HOUR, size=99), *_objects(live[3], 3 * HOUR),
               *_objects(live[4], 3 * HOUR), *_objects(live[5], 3 * HOUR),
               *_objects(_segment(40), 3 * HOUR), *_objects(_segment(50), 1), ObjectInfo("notes.txt", 3, NOW)]
    rules = ReconcileRules(NOW, grace_ms=2 * HOUR, deleted_topic_ids=frozenset({str(other_tp.topic_id)}),
                           deleting_partitions=frozenset({(str(deleting_tp.topic_id), 7)}))
    in_process = reconcile_in_process(objects, live, rules)
    on_spark = reconcile_on_spark(spark, objects, live_segments_frame(spark, live), rules)
    assert on_spark == in_process
    assert (len(in_process.orphans), len(in_process.too_young), len(in_process.size_mismatches),
            len(in_process.deletion_pending), in_process.live_segments, in_process.unrecognized) == \
        (6, 2, 1, 1, 5, ("notes.txt",))
