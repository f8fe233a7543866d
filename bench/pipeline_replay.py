"""Benchmark: replay throughput of the Spark replay job on local[2] against the single-process Python replay.

Both replay the same generated archive (Avro files in a temporary directory); prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rlmm import state
from rlmm.archive import from_archived, read_archive_file
from rlmm.events import RecordKey
from rsm.backend import read_all
from tierlog.audit.archiver import list_archive_files
from tierlog.pipeline.archive import read_archive
from tierlog.pipeline.generate import HistoryGenerator, HistorySpec, write_archive
from tierlog.pipeline.locations import open_store
from tierlog.pipeline.replay import compacted, entries_digest, fold_by_user_partition
from tierlog.pipeline.session import get_spark

TOPIC = "__tierlog_metadata"


def python_replay(location: str) -> tuple[str, int]:
    """What one process does without Spark: read every archive file and fold every record in order."""
    store = open_store(location)
    folded = state.InMemoryState()
    count = 0
    for archive_file in list_archive_files(store, TOPIC):
        for datum in read_archive_file(read_all(store.get_range(archive_file.key, 0))):
            state.apply_record(folded, RecordKey.decode(datum["key"].encode()), from_archived(datum))
            count += 1
    return folded.digest(), count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--runs", type=int, default=2, help="Spark runs; the first warms the JVM")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="tierlog-bench-") as location:
        records = list(HistoryGenerator(HistorySpec(events=args.events)).records())
        write_archive(records, open_store(location), TOPIC, records_per_file=10_000)

        started = time.perf_counter()
        python_digest, python_count = python_replay(location)
        python_s = time.perf_counter() - started

        started = time.perf_counter()
        spark = get_spark("tierlog-bench", master=args.master)
        spark.sparkContext.setLogLevel("ERROR")
        spark.conf.set("spark.sql.shuffle.partitions", "4")
        session_s = time.perf_counter() - started
        runs = []
        spark_digest = ""
        for _ in range(args.runs):
            started = time.perf_counter()
            entries = fold_by_user_partition(compacted(read_archive(spark, location, TOPIC)))
            spark_digest = entries_digest(entries)
            runs.append(time.perf_counter() - started)
        spark.stop()
    best = min(runs)
    print(json.dumps({
        "benchmark": "pipeline_replay",
        "events": len(records),
        "spark_master": args.master,
        "spark_session_start_s": round(session_s, 2),
        "spark_replay_s": [round(r, 2) for r in runs],
        "spark_events_per_s": round(len(records) / best),
        "python_replay_s": round(python_s, 2),
        "python_events_per_s": round(python_count / python_s),
        "digests_equal": spark_digest == python_digest,
    }, indent=2))


if __name__ == "__main__":
    main()
