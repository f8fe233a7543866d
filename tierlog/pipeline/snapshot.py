"""Snapshot job: build, from the audit archive, the bootstrap snapshot a new node loads instead of the topic.

Spark compacts the archive (newest record per key, tombstoned keys dropped) and orders it; the driver
streams the result into the one Avro file that rlmm.snapshot reads, with the topic's end offsets.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from rlmm.archive import write_snapshot
from rlmm.snapshot import holds_everything_until
from tierlog.pipeline.archive import datum_of, end_offsets, newest_times, read_archive
from tierlog.pipeline.replay import compacted


@dataclass(frozen=True, slots=True)
class SnapshotSummary:
    path: str
    metadata_topic: str
    records: int
    archived_records: int
    end_offsets: dict[int, int]


def build_snapshot(
    spark: SparkSession, archive_location: str, metadata_topic: str, output: Path, topic_id: str | None = None,
    topic_ends: Mapping[int, int] | None = None, topic_ends_at_ms: int | None = None,
) -> SnapshotSummary:
    """Write the snapshot to `output` atomically (a temporary file renamed into place). With the topic's id, the
    header names it and the time up to which the snapshot holds every record (rlmm.snapshot.holds_everything_until:
    the time `topic_ends` were asked, for partitions the archive holds to those ends; else their newest record's;
    without `topic_ends`, now), so a node loading it trusts it and tails the topic while it keeps what came after."""
    asked_ms = int(time.time() * 1000) if topic_ends_at_ms is None else topic_ends_at_ms
    archive = read_archive(spark, archive_location, metadata_topic).cache()
    ends = end_offsets(archive)
    created_ms = None
    if topic_id is not None:
        created_ms = asked_ms if topic_ends is None else holds_everything_until(ends, newest_times(archive), 0,
                                                                                topic_ends, asked_ms)
    records = compacted(archive).orderBy("metadata_partition", "offset").cache()
    count = records.count()
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, temp_name = tempfile.mkstemp(prefix=f".{output.name}.", dir=output.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            # toLocalIterator streams one Spark partition at a time, keeping the order of orderBy.
            write_snapshot(out, metadata_topic, (datum_of(row) for row in records.toLocalIterator()), ends,
                           topic_id, created_ms)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp_name, output)
    except BaseException:
        Path(temp_name).unlink(missing_ok=True)
        raise
    summary = SnapshotSummary(str(output), metadata_topic, count, archive.count(), ends)
    records.unpersist()
    archive.unpersist()
    return summary
