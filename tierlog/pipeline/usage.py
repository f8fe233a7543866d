"""Usage job: remote bytes and segment counts per topic and partition over time, as a table and a chart.

A segment counts from the record that finished its copy until the record that started its deletion;
Spark turns those into per-bucket deltas and a running sum per partition, filled for every bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from tierlog.pipeline.archive import read_archive

HOUR_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class UsageResult:
    table: DataFrame  # topic, partition, bucket_start_ms, remote_bytes, segments
    buckets: int


def segment_lifetimes(archive: DataFrame) -> DataFrame:
    """Per segment: when its copy finished and when its deletion started (null while it is live)."""
    segments = archive.where(F.col("segment").isNotNull()).select(
        F.col("segment.topic").alias("topic"),
        F.col("segment.partition").alias("partition"),
        F.col("segment.segment_id").alias("segment_id"),
        F.col("segment.segment_size_in_bytes").cast("long").alias("size"),
        F.col("segment.state").alias("state"),
        F.col("timestamp_ms"),
    )
    ts = F.col("timestamp_ms")
    return (
        segments.groupBy("topic", "partition", "segment_id")
        .agg(
            F.max("size").alias("size"),
            F.min(F.when(F.col("state") == "COPY_SEGMENT_FINISHED", ts)).alias("finished_ms"),
            F.min(F.when(F.col("state").isin("DELETE_SEGMENT_STARTED", "DELETE_SEGMENT_FINISHED"), ts))
            .alias("deleted_ms"),
        )
        .where(F.col("finished_ms").isNotNull())
    )


def usage_over_time(
    spark: SparkSession, archive_location: str, metadata_topic: str, bucket_ms: int = HOUR_MS
) -> UsageResult:
    archive = read_archive(spark, archive_location, metadata_topic)
    lifetimes = segment_lifetimes(archive).cache()
    bucket = lambda column: (F.floor(F.col(column) / bucket_ms) * bucket_ms).cast("long")  # noqa: E731
    added = lifetimes.select("topic", "partition", bucket("finished_ms").alias("bucket_start_ms"),
                             F.col("size").alias("d_bytes"), F.lit(1).alias("d_segments"))
    removed = lifetimes.where(F.col("deleted_ms").isNotNull()).select(
        "topic", "partition", bucket("deleted_ms").alias("bucket_start_ms"),
        (-F.col("size")).alias("d_bytes"), F.lit(-1).alias("d_segments"),
    )
    deltas = added.unionByName(removed).groupBy("topic", "partition", "bucket_start_ms").agg(
        F.sum("d_bytes").alias("d_bytes"), F.sum("d_segments").alias("d_segments")
    )
    span = archive.agg(F.min("timestamp_ms").alias("lo"), F.max("timestamp_ms").alias("hi")).first()
    if span is None or span["lo"] is None:
        empty = deltas.select("topic", "partition", "bucket_start_ms",
                              F.col("d_bytes").alias("remote_bytes"), F.col("d_segments").alias("segments"))
        return UsageResult(empty, 0)
    first, last = (span["lo"] // bucket_ms) * bucket_ms, (span["hi"] // bucket_ms) * bucket_ms
    grid = lifetimes.select("topic", "partition").distinct().crossJoin(
        spark.range(first, last + 1, bucket_ms).select(F.col("id").alias("bucket_start_ms"))
    )
    running = Window.partitionBy("topic", "partition").orderBy("bucket_start_ms").rowsBetween(
        Window.unboundedPreceding, Window.currentRow
    )
    table = (
        grid.join(deltas, ["topic", "partition", "bucket_start_ms"], "left")
        .fillna(0, ["d_bytes", "d_segments"])
        .withColumn("remote_bytes", F.sum("d_bytes").over(running))
        .withColumn("segments", F.sum("d_segments").over(running))
        .select("topic", "partition", "bucket_start_ms", "remote_bytes", "segments")
        .orderBy("topic", "partition", "bucket_start_ms")
    )
    return UsageResult(table, int((last - first) // bucket_ms + 1))


def per_topic(table: DataFrame) -> DataFrame:
    return table.groupBy("topic", "bucket_start_ms").agg(
        F.sum("remote_bytes").alias("remote_bytes"), F.sum("segments").alias("segments")
    ).orderBy("topic", "bucket_start_ms")


def write_usage(result: UsageResult, directory: Path) -> tuple[Path, Path]:
    """`usage.csv` (per partition and bucket) and `usage.png` (remote bytes per topic over time)."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = directory / "usage.csv", directory / "usage.png"
    rows = result.table.collect()
    with csv_path.open("w") as out:
        out.write("topic,partition,bucket_start_ms,remote_bytes,segments\n")
        for r in rows:
            out.write(f"{r['topic']},{r['partition']},{r['bucket_start_ms']},{r['remote_bytes']},{r['segments']}\n")
    series: dict[str, tuple[list[float], list[float]]] = {}
    for r in per_topic(result.table).collect():
        xs, ys = series.setdefault(r["topic"], ([], []))
        xs.append((r["bucket_start_ms"] - rows[0]["bucket_start_ms"]) / HOUR_MS if rows else 0)
        ys.append(r["remote_bytes"] / 2**30)
    figure, axes = plt.subplots(figsize=(10, 5))
    for topic, (xs, ys) in sorted(series.items()):
        axes.plot(xs, ys, label=topic)
    axes.set_xlabel("hours since the first archived record")
    axes.set_ylabel("remote bytes (GiB)")
    axes.set_title("tierlog remote storage per topic")
    if series:
        axes.legend(loc="upper left", fontsize="small", ncol=2)
    figure.tight_layout()
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
    return csv_path, png_path
