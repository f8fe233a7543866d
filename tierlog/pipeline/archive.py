"""Reading the audit archive with Spark's Avro reader, and the compaction of it every job starts from.

A location is a directory or `s3://bucket[/prefix]`; the archive of one metadata topic sits under it at
`audit/<metadata topic>/<partition>/*.avro`.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql import DataFrame, Row, SparkSession
from pyspark.sql import functions as F

from rlmm.archive import archived_event_schema, from_archived
from rlmm.events import KEY_FIELDS, KEY_SEPARATOR, MetadataEvent, RecordKey
from tierlog.pipeline.archive_files import ArchiveNotFoundError
from tierlog.pipeline.session import spark_path

EVENT_COLUMNS = ("segment", "partition_delete", "epoch_checkpoint")
ARCHIVE_COLUMNS = ("metadata_topic", "metadata_partition", "offset", "timestamp_ms", "key", *EVENT_COLUMNS)


def archive_path(location: str, metadata_topic: str) -> str:
    return f"{spark_path(location).rstrip('/')}/audit/{metadata_topic}"


def read_archive(spark: SparkSession, location: str, metadata_topic: str) -> DataFrame:
    """Every archived record of `metadata_topic`, with the archive schema's columns and user partition."""
    path = archive_path(location, metadata_topic)
    reader = (
        spark.read.format("avro")
        # The schema is given, not inferred, so every file (old writer schemas included) reads alike.
        .option("avroSchema", json.dumps(archived_event_schema()))
        .option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.avro")
    )
    try:
        frame = reader.load(path)
    except Exception as exc:  # Spark reports a missing path as an AnalysisException
        if "PATH_NOT_FOUND" in str(exc) or "does not exist" in str(exc):
            raise ArchiveNotFoundError(
                f"no audit archive of metadata topic {metadata_topic!r} under {path}; "
                "run `tierlog archive` first, or check --archive and --metadata-topic"
            ) from exc
        raise
    return with_user_partition(frame)


def with_user_partition(frame: DataFrame) -> DataFrame:
    """Add `topic_id` and `partition` of the user partition a record belongs to, parsed from its key."""
    parts = F.split(F.col("key"), KEY_SEPARATOR)
    return frame.withColumn("topic_id", parts.getItem(KEY_FIELDS.index("topic_id"))).withColumn(
        "partition", parts.getItem(KEY_FIELDS.index("partition")).cast("int")
    )


def latest_per_key(frame: DataFrame) -> DataFrame:
    """The newest record of every key, tombstones included: what a fully compacted topic holds."""
    newest = F.max_by(F.struct(*[F.col(c) for c in frame.columns]), F.col("offset"))
    return frame.groupBy("key").agg(newest.alias("r")).select("r.*")


def without_tombstones(frame: DataFrame) -> DataFrame:
    present = [F.col(c).isNotNull() for c in EVENT_COLUMNS]
    return frame.where(present[0] | present[1] | present[2])


def end_offsets(frame: DataFrame) -> dict[int, int]:
    """Per metadata partition, the offset after the last archived record."""
    rows = frame.groupBy("metadata_partition").agg(F.max("offset").alias("last")).collect()
    return {int(r["metadata_partition"]): int(r["last"]) + 1 for r in rows}


def newest_times(frame: DataFrame) -> dict[int, int]:
    """Per metadata partition, the newest record timestamp archived."""
    rows = frame.groupBy("metadata_partition").agg(F.max("timestamp_ms").alias("newest")).collect()
    return {int(r["metadata_partition"]): int(r["newest"]) for r in rows}


def datum_of(row: Row) -> dict[str, Any]:
    """A Spark row of the archive as the Avro datum fastavro and rlmm.codec expect."""
    datum = {c: row[c] for c in ARCHIVE_COLUMNS}
    for column in EVENT_COLUMNS:
        value = datum[column]
        if value is not None:
            datum[column] = _plain(value.asDict(recursive=True))
    return datum


def _plain(value: Any) -> Any:
    # Spark hands Avro bytes back as bytearray; the value types insist on bytes.
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def record_of(row: Row) -> tuple[RecordKey, MetadataEvent | None]:
    """The record key and event (None for a tombstone) of one archive row."""
    return RecordKey.decode(row["key"].encode()), from_archived(datum_of(row))
