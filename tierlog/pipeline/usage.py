"""Usage job: remote bytes and segment counts per topic and partition over time, as a table and a chart.

A segment counts from the record that finished its copy until the record that started its deletion;
Spark turns those into per-bucket deltas and a running sum per partition, filled for every bucket.
`usage_in_process` applies the same rule to archive datums without Spark, for small archives; pyspark is
imported only by the Spark functions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

HOUR_MS = 3_600_000
USAGE_COLUMNS = ("topic", "partition", "bucket_start_ms", "remote_bytes", "segments")


@dataclass(frozen=True, slots=True)
class UsageRow:
    """Remote bytes and segments of one user partition at the end of one time bucket."""

    topic: str
    partition: int
    bucket_start_ms: int
    remote_bytes: int
    segments: int


@dataclass(frozen=True, slots=True)
class UsageTable:
    """The usage table in this process: what the CSV holds and the chart draws."""

    rows: tuple[UsageRow, ...]  # by topic, partition, bucket
    buckets: int
    bucket_ms: int
    metadata_topic: str


@dataclass(frozen=True, slots=True)
class UsageResult:
    table: DataFrame  # topic, partition, bucket_start_ms, remote_bytes, segments
    buckets: int
    bucket_ms: int = HOUR_MS
    metadata_topic: str = ""

    def collected(self) -> UsageTable:
        rows = tuple(UsageRow(*(r[c] for c in USAGE_COLUMNS)) for r in self.table.collect())
        return UsageTable(rows, self.buckets, self.bucket_ms, self.metadata_topic)


def segment_lifetimes(archive: DataFrame) -> DataFrame:
    """Per segment: when its copy finished and when its deletion started (null while it is live)."""
    from pyspark.sql import functions as F

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
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from tierlog.pipeline.archive import read_archive

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
        return UsageResult(empty, 0, bucket_ms, metadata_topic)
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
    return UsageResult(table, int((last - first) // bucket_ms + 1), bucket_ms, metadata_topic)


def usage_in_process(datums: Iterable[dict[str, Any]], metadata_topic: str, bucket_ms: int = HOUR_MS) -> UsageTable:
    """`usage_over_time` over archive datums, without Spark: the same lifetimes, buckets and running sums."""
    lifetimes: dict[tuple[str, int, str], list[Any]] = {}  # -> [size, finished_ms, deleted_ms]
    lo = hi = None
    for datum in datums:
        ts = datum["timestamp_ms"]
        lo, hi = min(lo, ts) if lo is not None else ts, max(hi, ts) if hi is not None else ts
        segment = datum.get("segment")
        if segment is None:
            continue
        life = lifetimes.setdefault((segment["topic"], segment["partition"], segment["segment_id"]), [0, None, None])
        life[0] = max(life[0], segment["segment_size_in_bytes"])
        slot = {"COPY_SEGMENT_FINISHED": 1, "DELETE_SEGMENT_STARTED": 2, "DELETE_SEGMENT_FINISHED": 2}.get(
            segment["state"])
        if slot is not None and (life[slot] is None or ts < life[slot]):
            life[slot] = ts
    if lo is None or hi is None:
        return UsageTable((), 0, bucket_ms, metadata_topic)
    first, last = (lo // bucket_ms) * bucket_ms, (hi // bucket_ms) * bucket_ms
    deltas: dict[tuple[str, int], dict[int, list[int]]] = {}
    for (topic, partition, _segment), (size, finished, deleted) in lifetimes.items():
        if finished is None:
            continue
        changes = deltas.setdefault((topic, partition), {})
        for at, sign in ((finished, 1), (deleted, -1)):
            if at is not None:
                change = changes.setdefault((at // bucket_ms) * bucket_ms, [0, 0])
                change[0] += sign * size
                change[1] += sign
    rows = []
    for (topic, partition), changes in sorted(deltas.items()):
        remote, segments = 0, 0
        for bucket in range(first, last + 1, bucket_ms):
            d_bytes, d_segments = changes.get(bucket, (0, 0))
            remote, segments = remote + d_bytes, segments + d_segments
            rows.append(UsageRow(topic, partition, bucket, remote, segments))
    return UsageTable(tuple(rows), (last - first) // bucket_ms + 1, bucket_ms, metadata_topic)


def topic_totals(table: UsageTable) -> dict[str, list[tuple[int, int, int]]]:
    """Per topic, (bucket start, remote bytes, segments) for every bucket."""
    summed: dict[str, dict[int, list[int]]] = {}
    for r in table.rows:
        at = summed.setdefault(r.topic, {}).setdefault(r.bucket_start_ms, [0, 0])
        at[0] += r.remote_bytes
        at[1] += r.segments
    return {topic: [(t, b, n) for t, (b, n) in sorted(buckets.items())] for topic, buckets in sorted(summed.items())}


_UNITS = (("B", 1), ("KiB", 2**10), ("MiB", 2**20), ("GiB", 2**30), ("TiB", 2**40), ("PiB", 2**50))


def byte_unit(largest: float) -> tuple[str, int]:
    """The largest binary unit in which `largest` is at least 1 (bytes for nothing at all)."""
    return next(((name, size) for name, size in reversed(_UNITS) if largest >= size), _UNITS[0])


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def write_usage(result: UsageResult | UsageTable, directory: Path) -> tuple[Path, Path]:
    """`usage.csv` (per partition and bucket) and `usage.png` (`usage_chart`)."""
    import matplotlib.pyplot as plt

    table = result.collected() if isinstance(result, UsageResult) else result
    directory.mkdir(parents=True, exist_ok=True)
    csv_path, png_path = directory / "usage.csv", directory / "usage.png"
    with csv_path.open("w") as out:
        out.write(",".join(USAGE_COLUMNS) + "\n")
        for r in table.rows:
            out.write(f"{r.topic},{r.partition},{r.bucket_start_ms},{r.remote_bytes},{r.segments}\n")
    figure = usage_chart(table)
    figure.savefig(png_path, dpi=100)
    plt.close(figure)
    return csv_path, png_path


def usage_chart(table: UsageTable) -> Any:
    """A matplotlib Figure: remote bytes per topic and in total over wall-clock time (UTC), as steps (usage
    changes at a bucket's start and holds until the next), in the largest unit the data fills."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    totals = topic_totals(table)
    overall: dict[int, int] = {}
    for series in totals.values():
        for at, remote, _segments in series:
            overall[at] = overall.get(at, 0) + remote
    unit, scale = byte_unit(max(overall.values(), default=0))
    figure, axes = plt.subplots(figsize=(11, 5.5))
    # One more point at the end of the last bucket, so the last step has its width.
    end = max(overall, default=0) + table.bucket_ms

    def draw(points: list[tuple[int, int]], **style: Any) -> None:
        xs = mdates.date2num([_utc(at) for at, _ in points] + [_utc(end)])
        ys = [value / scale for _, value in points] + [points[-1][1] / scale]
        axes.plot(xs, ys, drawstyle="steps-post", **style)

    for topic, series in totals.items():
        draw([(at, remote) for at, remote, _ in series], label=topic, linewidth=1.4)
    if overall:
        draw(sorted(overall.items()), label="total", color="black", linewidth=2.4)
    locator = mdates.AutoDateLocator()
    axes.xaxis.set_major_locator(locator)
    axes.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
    axes.set_xlabel("time (UTC)")
    axes.set_ylabel(f"remote bytes ({unit})")
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    if overall:
        span = f"{_utc(min(overall)):%Y-%m-%d %H:%M} to {_utc(end):%Y-%m-%d %H:%M} UTC"
        axes.set_title(f"Remote (tiered) storage per topic, {table.metadata_topic or 'metadata topic'}: {span}, "
                       f"{table.bucket_ms / 60_000:g}-minute buckets", fontsize=11)
        axes.legend(loc="upper left", fontsize="small", ncol=2)
    else:
        axes.set_title("Remote (tiered) storage per topic: the archive holds no finished segment", fontsize=11)
    figure.tight_layout()
    return figure
