"""Snapshot job: build, from the audit archive, the bootstrap snapshot a new node loads instead of the topic.

Spark compacts the archive (newest record per key, tombstoned keys dropped) and orders it; the driver
streams the result into the one Avro file that rlmm.snapshot reads, with the topic's end offsets.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import SparkSession

from rlmm.archive import write_snapshot
from tierlog.pipeline.archive import datum_of, end_offsets, read_archive
from tierlog.pipeline.replay import compacted


@dataclass(frozen=True, slots=True)
class SnapshotSummary:
    path: str
    metadata_topic: str
    records: int
    archived_records: int
    end_offsets: dict[int, int]


def build_snapshot(
    spark: SparkSession, archive_location: str, metadata_topic: str, output: Path, topic_id: str | None = None
) -> SnapshotSummary:
    """Write the snapshot to `output` atomically (a temporary file renamed into place). With the topic's id, the
    header names it and the time the archive was read, so a node loading the file trusts it and tails the topic."""
    created_ms = None if topic_id is None else int(time.time() * 1000)
    archive = read_archive(spark, archive_location, metadata_topic).cache()
    ends = end_offsets(archive)
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
