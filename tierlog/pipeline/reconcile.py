"""Reconcile job: join a listing of the bucket with the live metadata to find what disagrees.

Orphans are objects no live segment references (a delete plan; deleted only on request); missing
objects are COPY_SEGMENT_FINISHED segments whose objects are gone; size mismatches are `.log` objects
whose size is not the segment's size.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from rlmm.archive import ARCHIVE_ROOT
from rlmm.types import RemoteLogSegmentId, TopicIdPartition
from rlmm.view import MetadataView
from rsm.backend import ObjectInfo, StorageBackend
from rsm.keys import INDEXES_SUFFIX, LOG_SUFFIX, OBJECT_KEY_PATTERN, segment_keys

OBJECT_SCHEMA = StructType([StructField("key", StringType(), False), StructField("size", LongType(), False)])
DELETE_BATCH = 1000


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    objects: int
    live_segments: int
    orphans: tuple[dict[str, Any], ...]
    missing: tuple[dict[str, Any], ...]
    size_mismatches: tuple[dict[str, Any], ...]
    unrecognized: tuple[str, ...]
    deleted: tuple[str, ...] = field(default=())

    @property
    def clean(self) -> bool:
        return not (self.orphans or self.missing or self.size_mismatches)

    def delete_plan(self) -> list[str]:
        return sorted(o["key"] for o in self.orphans)

    def as_json(self) -> dict[str, Any]:
        return {
            "objects": self.objects,
            "live_segments": self.live_segments,
            "orphan_count": len(self.orphans),
            "missing_count": len(self.missing),
            "size_mismatch_count": len(self.size_mismatches),
            "orphans": list(self.orphans),
            "missing": list(self.missing),
            "size_mismatches": list(self.size_mismatches),
            "unrecognized": list(self.unrecognized),
            "deleted": list(self.deleted),
        }


def objects_frame(spark: SparkSession, objects: Iterable[ObjectInfo]) -> DataFrame:
    """The bucket listing (driver-side: S3 lists sequentially anyway), audit files left out."""
    rows = [(o.key, int(o.size)) for o in objects if not o.key.startswith(f"{ARCHIVE_ROOT}/")]
    return spark.createDataFrame(rows, OBJECT_SCHEMA)


def parse_objects(objects: DataFrame) -> DataFrame:
    extract = [F.regexp_extract("key", OBJECT_KEY_PATTERN, i) for i in range(1, 7)]
    return objects.select(
        "key", "size",
        extract[0].alias("o_topic"), extract[1].alias("o_topic_id"),
        extract[2].alias("o_partition"), extract[3].alias("o_start"),
        extract[4].alias("o_segment_id"), extract[5].alias("kind"),
    ).withColumn("recognized", F.col("o_segment_id") != "")


def reconcile(
    spark: SparkSession,
    live_segments: DataFrame,
    store: StorageBackend,
    hashed_keys: bool = False,
    delete_orphans: bool = False,
) -> ReconcileReport:
    """`live_segments` has topic_id, partition, topic, segment_id, state, start_offset, segment_size_in_bytes
    for every segment the metadata still holds (any state but DELETE_SEGMENT_FINISHED)."""
    objects = parse_objects(objects_frame(spark, store.list(""))).cache()
    live = live_segments.select(
        "topic_id", "partition", "topic", "segment_id", "state", "start_offset", "segment_size_in_bytes"
    ).cache()
    recognized = objects.where("recognized")
    orphans = recognized.join(live, recognized["o_segment_id"] == live["segment_id"], "left_anti")
    finished = live.where(F.col("state") == "COPY_SEGMENT_FINISHED")
    kinds = spark.createDataFrame([(LOG_SUFFIX,), (INDEXES_SUFFIX,)], "kind string")
    expected = finished.crossJoin(kinds)
    present = recognized.select(F.col("o_segment_id").alias("segment_id"), "kind")
    missing = expected.join(present, ["segment_id", "kind"], "left_anti")
    mismatched = recognized.where(F.col("kind") == LOG_SUFFIX).join(
        live, recognized["o_segment_id"] == live["segment_id"]
    ).where(F.col("size") != F.col("segment_size_in_bytes"))

    orphan_rows = tuple(
        {"key": r["key"], "size": r["size"], "segment_id": r["o_segment_id"]}
        for r in orphans.orderBy("key").collect()
    )
    missing_rows = tuple(
        {
            "key": _expected_key(r, hashed_keys),
            "segment_id": r["segment_id"], "topic": r["topic"], "partition": r["partition"],
            "kind": r["kind"],
        }
        for r in missing.orderBy("topic", "partition", "start_offset", "kind").collect()
    )
    mismatch_rows = tuple(
        {"key": r["key"], "size": r["size"], "expected_size": r["segment_size_in_bytes"],
         "segment_id": r["segment_id"]}
        for r in mismatched.orderBy("key").collect()
    )
    unrecognized = tuple(r["key"] for r in objects.where(~F.col("recognized")).orderBy("key").collect())
    report = ReconcileReport(
        objects=objects.count(), live_segments=live.count(), orphans=orphan_rows, missing=missing_rows,
        size_mismatches=mismatch_rows, unrecognized=unrecognized,
    )
    objects.unpersist()
    live.unpersist()
    if delete_orphans:
        plan = report.delete_plan()
        for i in range(0, len(plan), DELETE_BATCH):
            store.delete(plan[i:i + DELETE_BATCH])
        report = dataclasses.replace(report, deleted=tuple(plan))
    return report


def _expected_key(row: Row, hashed: bool) -> str:
    tp = TopicIdPartition(uuid.UUID(row["topic_id"]), row["topic"], row["partition"])
    keys = segment_keys(RemoteLogSegmentId(tp, uuid.UUID(row["segment_id"])), row["start_offset"], hashed)
    return keys.log if row["kind"] == LOG_SUFFIX else keys.indexes


LIVE_SEGMENT_SCHEMA = StructType([
    StructField("topic_id", StringType(), False),
    StructField("partition", LongType(), False),
    StructField("topic", StringType(), False),
    StructField("segment_id", StringType(), False),
    StructField("state", StringType(), False),
    StructField("start_offset", LongType(), False),
    StructField("segment_size_in_bytes", LongType(), False),
])


def live_segments_from_view(spark: SparkSession, view: MetadataView) -> DataFrame:
    """The segments a node's view holds, in the columns `reconcile` joins on."""
    rows = [
        (str(md.topic_id_partition.topic_id), md.topic_id_partition.partition, md.topic_id_partition.topic,
         str(md.remote_log_segment_id.id), md.state.name, md.start_offset, md.segment_size_in_bytes)
        for md in view.segments()
    ]
    return spark.createDataFrame(rows, LIVE_SEGMENT_SCHEMA)


def live_segments_of(entries: DataFrame) -> DataFrame:
    """The segments of a replayed state (see tierlog.pipeline.replay.ENTRY_SCHEMA)."""
    return entries.where(F.col("segment_id").isNotNull())


def write_report(report: ReconcileReport, directory: Path) -> tuple[Path, Path]:
    """`report.json` and `delete-plan.txt` (one key per line) under `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    report_path = directory / "report.json"
    plan_path = directory / "delete-plan.txt"
    report_path.write_text(json.dumps(report.as_json(), indent=2) + "\n")
    plan_path.write_text("".join(k + "\n" for k in report.delete_plan()))
    return report_path, plan_path
