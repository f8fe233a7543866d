"""Benchmark of the metadata manager's write path on a real broker: latency until a write's future completes
(acknowledged by Kafka and applied to this node's view), sequentially and with partitions writing in parallel.

Usage: python bench/rlmm_write_latency.py [--segments 100] [--parallel 8] [--bootstrap HOST:PORT]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from confluent_kafka.admin import AdminClient

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from rlmm_materialize import bootstrap_from_env  # noqa: E402

from rlmm import (  # noqa: E402
    RemoteLogMetadataManager,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)


def upload(manager: RemoteLogMetadataManager, tp: TopicIdPartition, index: int) -> tuple[float, float]:
    """One segment upload as the broker records it: add (COPY_SEGMENT_STARTED), then COPY_SEGMENT_FINISHED."""
    start = index * 1000
    md = RemoteLogSegmentMetadata(RemoteLogSegmentId(tp, uuid.uuid4()), start, start + 999, -1, 0,
                                  int(time.time() * 1000), 1 << 20, {0: start})
    t0 = time.perf_counter()
    manager.add_remote_log_segment_metadata(md).result(timeout=60)
    t1 = time.perf_counter()
    manager.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
        md.remote_log_segment_id, int(time.time() * 1000), None, RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 0,
    )).result(timeout=60)
    return t1 - t0, time.perf_counter() - t1


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(len(ordered) * q))] * 1000, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--segments", type=int, default=100, help="uploads per partition")
    parser.add_argument("--parallel", type=int, default=8, help="partitions writing at once in the second run")
    parser.add_argument("--bootstrap", default=None)
    args = parser.parse_args()
    bootstrap = args.bootstrap or bootstrap_from_env()
    topic = f"bench-rlmm-writes-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="bench-rlmm-writes-"))
    config = {"bootstrap.servers": bootstrap, "broker.id": 0, "state.dir": str(work), "metadata.topic.name": topic,
              "metadata.topic.num.partitions": 4, "metadata.topic.replication.factor": 1,
              "metadata.topic.min.insync.replicas": 1}
    result: dict[str, object] = {"benchmark": "rlmm_write_latency", "segments_per_partition": args.segments}
    try:
        with RemoteLogMetadataManager(config) as manager:
            tps = [TopicIdPartition(uuid.uuid4(), "bench", p) for p in range(args.parallel)]
            manager.on_partition_leadership_changes(set(tps), set())
            while not all(manager.is_ready(tp) for tp in tps):
                time.sleep(0.01)
            sequential = [upload(manager, tps[0], i) for i in range(args.segments)]
            adds, finishes = [a for a, _ in sequential], [f for _, f in sequential]
            result.update(add_p50_ms=percentile(adds, 0.5), add_p99_ms=percentile(adds, 0.99),
                          finish_p50_ms=percentile(finishes, 0.5), finish_p99_ms=percentile(finishes, 0.99))
            started = time.perf_counter()
            with ThreadPoolExecutor(args.parallel) as pool:
                list(pool.map(lambda tp: [upload(manager, tp, args.segments + i) for i in range(args.segments)],
                              tps))
            elapsed = time.perf_counter() - started
            result.update(parallel_partitions=args.parallel,
                          parallel_uploads_per_s=round(args.parallel * args.segments / elapsed, 1),
                          sequential_uploads_per_s=round(args.segments / sum(adds + finishes), 1))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        AdminClient({"bootstrap.servers": bootstrap}).delete_topics([topic], operation_timeout=30)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
