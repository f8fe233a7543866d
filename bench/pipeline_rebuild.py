"""Benchmark: a node's rebuild from a snapshot (built by the Spark job) against a rebuild from the topic.

Uses the dev services (.dev/services.env or KAFKA_BOOTSTRAP); prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from confluent_kafka.admin import AdminClient, NewTopic

from dev.env import services_env
from rlmm import RemoteLogMetadataManager
from rlmm.snapshot import load_snapshot
from tierlog.audit.archiver import Archiver, ArchiverSettings
from tierlog.pipeline.generate import HistoryGenerator, HistorySpec, produce_history
from tierlog.pipeline.locations import open_store
from tierlog.pipeline.session import get_spark
from tierlog.pipeline.snapshot import build_snapshot


def node_config(bootstrap: str, topic: str, partitions: int, state_dir: Path) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap, "broker.id": 1, "state.dir": str(state_dir),
        "metadata.topic.name": topic, "metadata.topic.num.partitions": partitions,
        "metadata.topic.replication.factor": 1, "metadata.topic.min.insync.replicas": 1,
    }


def start_and_catch_up(config: dict[str, Any]) -> str:
    with RemoteLogMetadataManager(config) as manager:
        manager.wait_caught_up(1800)
        return manager.view_digest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=8, help="metadata topic partitions")
    args = parser.parse_args()
    bootstrap = services_env().get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        sys.exit("no Kafka: run `dev/services up` (or set KAFKA_BOOTSTRAP)")

    topic = f"bench-rebuild-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics(
        [NewTopic(topic, args.partitions, 1, config={"cleanup.policy": "compact"})]
    )[topic].result(30)
    spec = HistorySpec(events=args.events, metadata_partitions=args.partitions)
    records = list(HistoryGenerator(spec).records())
    try:
        produce_history(bootstrap, topic, records)
        print(json.dumps(measure(bootstrap, topic, args.partitions, len(records)), indent=2))
    finally:
        admin.delete_topics([topic])[topic].result(30)


def measure(bootstrap: str, topic: str, partitions: int, topic_records: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tierlog-bench-") as work:
        base = Path(work)
        started = time.perf_counter()
        Archiver(open_store(str(base / "archive")), ArchiverSettings(bootstrap, topic)).run_until_caught_up()
        archive_s = time.perf_counter() - started

        spark = get_spark("tierlog-bench", master="local[2]")
        spark.sparkContext.setLogLevel("ERROR")
        started = time.perf_counter()
        summary = build_snapshot(spark, str(base / "archive"), topic, base / "snapshot.avro")
        snapshot_build_s = time.perf_counter() - started
        spark.stop()

        started = time.perf_counter()
        topic_digest = start_and_catch_up(node_config(bootstrap, topic, partitions, base / "from-topic"))
        from_topic_s = time.perf_counter() - started

        started = time.perf_counter()
        load_snapshot(summary.path, base / "from-snapshot")
        config = node_config(bootstrap, topic, partitions, base / "from-snapshot")
        snapshot_digest = start_and_catch_up(config)
        from_snapshot_s = time.perf_counter() - started
        snapshot_bytes = Path(summary.path).stat().st_size

    return {
        "benchmark": "pipeline_rebuild",
        "topic_records": topic_records,
        "snapshot_records": summary.records,
        "snapshot_bytes": snapshot_bytes,
        "archive_s": round(archive_s, 2),
        "snapshot_build_s": round(snapshot_build_s, 2),
        "rebuild_from_topic_s": round(from_topic_s, 2),
        "rebuild_from_snapshot_s": round(from_snapshot_s, 2),
        "speedup": round(from_topic_s / from_snapshot_s, 1),
        "digests_equal": topic_digest == snapshot_digest,
    }


if __name__ == "__main__":
    main()
