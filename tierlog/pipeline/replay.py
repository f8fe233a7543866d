"""Replay job: fold the audit archive into per-user-partition state, and diff it against a live view.

Spark reads and compacts the archive and groups it by user partition; each group goes through the pure
state machine (rlmm.state.apply_record), so the rules live in one place, and the result is view entries.
A small archive (archive_files.SMALL_ARCHIVE_BYTES) is folded in this process instead (`replay_in_process`): the
same compaction and the same state machine over the archive files (tierlog.pipeline.archive_files), no JVM.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType, StructField, StructType

from rlmm import state
from rlmm import view_format as vf
from rlmm.view import MetadataView
from rsm.backend import StorageBackend
from tierlog.pipeline.archive import (
    latest_per_key,
    read_archive,
    record_of,
    without_tombstones,
)
from tierlog.pipeline.archive_files import archive_files, compact_datums, fold_datums, read_archive_datums

# One row per entry of the materialized view; segment rows also carry the segment's fields in columns,
# so reconcile can join on them without decoding values again.
ENTRY_SCHEMA = StructType([
    StructField("topic_id", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("family", StringType(), False),
    StructField("entry_key", BinaryType(), False),
    StructField("entry_value", BinaryType(), False),
    StructField("topic", StringType(), True),
    StructField("segment_id", StringType(), True),
    StructField("state", StringType(), True),
    StructField("start_offset", LongType(), True),
    StructField("end_offset", LongType(), True),
    StructField("segment_size_in_bytes", LongType(), True),
])


def compacted(archive: DataFrame, up_to: dict[int, int] | None = None) -> DataFrame:
    """The newest non-tombstone record of every key, optionally only among offsets below `up_to`."""
    if up_to is not None:
        condition = F.lit(False)
        for partition, next_offset in up_to.items():
            below = (F.col("metadata_partition") == partition) & (F.col("offset") < next_offset)
            condition = condition | below
        archive = archive.where(condition)
    return without_tombstones(latest_per_key(archive))


def fold_by_user_partition(records: DataFrame, num_partitions: int | None = None) -> DataFrame:
    """Apply every user partition's records, in topic order, to its own state; return its view entries."""
    spark = records.sparkSession
    partitions = num_partitions or int(spark.conf.get("spark.sql.shuffle.partitions") or 8)
    ordered = records.repartition(partitions, "topic_id", "partition").sortWithinPartitions(
        "topic_id", "partition", "metadata_partition", "offset"
    )
    return spark.createDataFrame(ordered.rdd.mapPartitions(_fold_sorted_rows), ENTRY_SCHEMA)


def _fold_sorted_rows(rows: Iterable[Row]) -> Iterator[tuple[Any, ...]]:
    """Rows arrive sorted by user partition, so each partition's state is built, emitted and dropped."""
    current: tuple[str, int] | None = None
    folded = state.InMemoryState()
    for row in rows:
        user_partition = (row["topic_id"], row["partition"])
        if user_partition != current:
            yield from _entry_rows(folded)
            folded, current = state.InMemoryState(), user_partition
        key, event = record_of(row)
        state.apply_record(folded, key, event, row["offset"])
    yield from _entry_rows(folded)


def _entry_rows(folded: state.InMemoryState) -> Iterator[tuple[Any, ...]]:
    for family, key, value in view_entries(folded):
        topic_id, partition = _tp_of(key)
        if family == vf.SEGMENTS:
            md = vf.decode_segment(value)
            yield (
                topic_id, partition, family, key, value, md.topic_id_partition.topic,
                str(md.remote_log_segment_id.id), md.state.name, md.start_offset, md.end_offset,
                md.segment_size_in_bytes,
            )
        else:
            yield (topic_id, partition, family, key, value, None, None, None, None, None, None)


def _tp_of(key: bytes) -> tuple[str, int]:
    topic_id, partition = vf.tp_of_key(key)
    return str(topic_id), partition


def view_entries(folded: state.InMemoryState) -> Iterator[tuple[str, bytes, bytes]]:
    """The (column family, key, value) entries of an in-memory state, as the RocksDB view stores them."""
    # InMemoryState keeps its entry listing private; it is the same listing its digest() hashes.
    return folded.entries()


def entries_digest(entries: DataFrame) -> str:
    """The view digest (as `MetadataView.digest()` computes it) of replayed entries."""
    return digest_of_rows(entries.select("family", "entry_key", "entry_value").collect())


def digest_of_rows(rows: Iterable[Row]) -> str:
    return state.view_digest_of((r["family"], bytes(r["entry_key"]), bytes(r["entry_value"])) for r in rows)


@dataclass(frozen=True, slots=True)
class Difference:
    """One view entry on which the archive replay and the live view disagree."""

    topic_id: str
    partition: int
    family: str
    entry_key: str  # hex
    kind: str  # only_in_archive | only_in_view | value_differs


@dataclass(frozen=True, slots=True)
class ReplayReport:
    metadata_topic: str
    archived_records: int
    replayed_records: int
    user_partitions: int
    archive_digest: str
    view_digest: str | None
    replayed_up_to: dict[int, int] | None
    differences: tuple[Difference, ...]
    difference_count: int
    # Per user partition of the replayed state: topic, partition, segments, remote_bytes.
    partitions: tuple[dict[str, Any], ...] = ()

    @property
    def matches(self) -> bool | None:
        return None if self.view_digest is None else self.archive_digest == self.view_digest

    def as_json(self) -> dict[str, Any]:
        return {
            "metadata_topic": self.metadata_topic,
            "archived_records": self.archived_records,
            "replayed_records": self.replayed_records,
            "user_partitions": self.user_partitions,
            "archive_digest": self.archive_digest,
            "view_digest": self.view_digest,
            "matches": self.matches,
            "replayed_up_to": None if self.replayed_up_to is None else {
                str(k): v for k, v in sorted(self.replayed_up_to.items())
            },
            "difference_count": self.difference_count,
            "differences": [dataclasses.asdict(d) for d in self.differences],
            "partitions": list(self.partitions),
        }


def live_view_entries(spark: SparkSession, view: MetadataView) -> DataFrame:
    """The entries of a node's RocksDB view as a DataFrame."""
    rows = [(f, bytearray(k), bytearray(v)) for f, k, v in view.entries()]
    schema = StructType([
        StructField("family", StringType(), False),
        StructField("entry_key", BinaryType(), False),
        StructField("entry_value", BinaryType(), False),
    ])
    return spark.createDataFrame(rows, schema)


def partition_summary(entries: DataFrame) -> tuple[dict[str, Any], ...]:
    """Segments and remote bytes (copy finished) of every user partition holding segments."""
    finished = F.col("state") == "COPY_SEGMENT_FINISHED"
    summary = (
        entries.where(F.col("segment_id").isNotNull())
        .groupBy("topic", "topic_id", "partition")
        .agg(
            F.count("*").alias("segments"),
            F.sum(F.when(finished, F.col("segment_size_in_bytes")).otherwise(0)).alias("remote_bytes"),
        )
        .orderBy("topic", "partition")
    )
    return tuple(row.asDict() for row in summary.collect())


def open_view(state_dir: Path) -> MetadataView:
    """A node's view, read-only so that a running node keeps writing to it meanwhile."""
    if not (Path(state_dir) / "view").is_dir():
        raise FileNotFoundError(
            f"no metadata view under state dir {state_dir} (expected {Path(state_dir) / 'view'}); "
            "pass the state.dir of a node that has run"
        )
    return MetadataView.open(state_dir, read_only=True)


def replay(
    spark: SparkSession,
    archive_location: str,
    metadata_topic: str,
    state_dir: Path | None = None,
    max_differences: int = 100,
) -> ReplayReport:
    """Fold the archive; with `state_dir`, only up to the offsets that view applied, and diff the two."""
    archive = read_archive(spark, archive_location, metadata_topic).cache()
    up_to: dict[int, int] | None = None
    view_digest: str | None = None
    view_entries_frame: DataFrame | None = None
    if state_dir is not None:
        view = open_view(state_dir)
        try:
            up_to = view.applied_offsets(metadata_topic)
            view_digest = view.digest()
            view_entries_frame = live_view_entries(spark, view).cache()
            view_entries_frame.count()  # materialize before the view closes
        finally:
            view.close()
    records = compacted(archive, up_to).cache()
    entries = fold_by_user_partition(records).cache()
    collected = entries.select("topic_id", "partition", "family", "entry_key", "entry_value").collect()
    archive_digest = digest_of_rows(collected)
    differences: list[Difference] = []
    count = 0
    if view_entries_frame is not None and view_digest != archive_digest:
        # Equal digests mean equal entries; only a mismatch is worth a join.
        diff = diff_entries(entries, view_entries_frame).cache()
        count = diff.count()
        first = diff.orderBy("topic_id", "partition", "family", "entry_key").limit(max_differences)
        differences = [
            Difference(r["topic_id"], r["partition"], r["family"], bytes(r["entry_key"]).hex(), r["kind"])
            for r in first.collect()
        ]
    report = ReplayReport(
        metadata_topic=metadata_topic,
        archived_records=archive.count(),
        replayed_records=records.count(),
        user_partitions=len({(r["topic_id"], r["partition"]) for r in collected}),
        archive_digest=archive_digest,
        view_digest=view_digest,
        replayed_up_to=up_to,
        differences=tuple(differences),
        difference_count=count,
        partitions=partition_summary(entries),
    )
    for frame in (entries, records, archive, view_entries_frame):
        if frame is not None:
            frame.unpersist()
    return report


def diff_entries(archive_entries: DataFrame, view_entries: DataFrame) -> DataFrame:
    """Entries present on one side only, or with different values, named by user partition."""
    a = archive_entries.select("family", "entry_key", F.col("entry_value").alias("archive_value"))
    v = view_entries.select("family", "entry_key", F.col("entry_value").alias("view_value"))
    joined = a.join(v, ["family", "entry_key"], "full_outer")
    kind = (
        F.when(F.col("view_value").isNull(), F.lit("only_in_archive"))
        .when(F.col("archive_value").isNull(), F.lit("only_in_view"))
        .when(F.col("archive_value") != F.col("view_value"), F.lit("value_differs"))
    )
    key = F.col("entry_key")
    return (
        joined.withColumn("kind", kind)
        .where(F.col("kind").isNotNull())
        .withColumn("topic_id", _uuid_text(key))
        .withColumn("partition", F.conv(F.hex(key.substr(17, 4)), 16, 10).cast("int"))
        .select("topic_id", "partition", "family", "entry_key", "kind")
    )


def _uuid_text(key: Any) -> Any:
    h = F.lower(F.hex(key.substr(1, 16)))
    groups = [h.substr(1, 8), h.substr(9, 4), h.substr(13, 4), h.substr(17, 4), h.substr(21, 12)]
    return F.concat_ws("-", *groups)


# -- in-process: the same job without Spark, for small archives (tierlog.pipeline.archive_files) -----------


def replay_in_process(
    store: StorageBackend,
    metadata_topic: str,
    state_dir: Path | None = None,
    max_differences: int = 100,
    progress: Callable[[int], None] | None = None,
) -> ReplayReport:
    """`replay` without Spark: the same report, for an archive that fits in this process."""
    archived = read_archive_datums(store, archive_files(store, metadata_topic), progress)
    up_to: dict[int, int] | None = None
    view_digest: str | None = None
    view_entries: dict[tuple[str, bytes], bytes] = {}
    if state_dir is not None:
        view = open_view(state_dir)
        try:
            up_to = view.applied_offsets(metadata_topic)
            view_digest = view.digest()
            view_entries = {(f, bytes(k)): bytes(v) for f, k, v in view.entries()}
        finally:
            view.close()
    records = compact_datums(archived, up_to)
    folded = fold_datums(records)
    archive_digest = folded.digest()
    entries = {(f, k): v for f, k, v in folded.entries()}
    differences: list[Difference] = []
    if state_dir is not None and view_digest != archive_digest:
        for family, key in sorted(entries.keys() | view_entries.keys(), key=lambda fk: (fk[1][:vf.TP_KEY_LEN], fk)):
            ours, theirs = entries.get((family, key)), view_entries.get((family, key))
            kind = ("only_in_view" if ours is None else "only_in_archive" if theirs is None
                    else "value_differs" if ours != theirs else None)
            if kind is not None:
                topic_id, partition = _tp_of(key)
                differences.append(Difference(topic_id, partition, family, key.hex(), kind))
    summary = []
    for tp in sorted(folded.user_partitions(), key=lambda tp: (tp.topic, tp.partition)):
        segments = list(folded.segments_of(tp))
        if segments:
            summary.append({
                "topic": tp.topic, "topic_id": str(tp.topic_id), "partition": tp.partition,
                "segments": len(segments),
                "remote_bytes": sum(md.segment_size_in_bytes for md in segments
                                    if md.state.name == "COPY_SEGMENT_FINISHED"),
            })
    return ReplayReport(
        metadata_topic=metadata_topic,
        archived_records=len(archived),
        replayed_records=len(records),
        user_partitions=len({_tp_of(key) for _family, key in entries}),
        archive_digest=archive_digest,
        view_digest=view_digest,
        replayed_up_to=up_to,
        differences=tuple(differences[:max_differences]),
        difference_count=len(differences),
        partitions=tuple(summary),
    )
