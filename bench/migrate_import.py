"""Import speed of `tierlog migrate`: a `__remote_log_metadata` history of N live segments in Kafka's own format,
imported into a fresh tierlog metadata topic on the dev broker.

The history is bench/rlmm_materialize's (the one bench/rlmm_vs_kafka.py feeds both managers): 2,000 user partitions,
uploads in random order across them (add, then COPY_SEGMENT_FINISHED), leader epochs bumping now and then, retention
deleting each partition's oldest segments (`--deleted-share` as many again as live: DELETE_SEGMENT_STARTED, then
DELETE_SEGMENT_FINISHED), written as TBRLMM writes it (Kafka's serde through rlmm.kafka_format, its partitioner, null
keys) to a fresh source topic of 50 partitions by one process per core. Then times, each as the operator runs it (a
`tierlog` process of its own): `--dry-run`, the import, and the same import again (an idempotent no-op); for each the
wall time, records/s and segments/s (live segments) and the process's peak RSS. Prints one JSON document.

Usage: python bench/migrate_import.py [--live N] [--deleted-share F] [--keep]   (default 1,000,000 live segments)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from rlmm_materialize import LivePlan, as_event, live_history, user_partitions  # noqa: E402

from dev.env import services_env  # noqa: E402
from rlmm.kafka_format import encode, metadata_partition  # noqa: E402

SOURCE_PARTITIONS = 50
USER_PARTITIONS = 2000
TARGET_PARTITIONS = 50
RUN_TIMEOUT_S = 3600.0
POLL_S = 0.5


@dataclass(frozen=True)
class ShardJob:
    """One producer process's share of the history: the user partitions whose source partition falls to it."""

    plan: LivePlan
    bootstrap: str
    topic: str
    shards: int
    shard: int
    seed: int


def write_shard(job: ShardJob) -> int:
    """Produce one shard's records in Kafka's format; the number produced."""
    indices = [i for i, tp in enumerate(job.plan.tps)
               if metadata_partition(tp, SOURCE_PARTITIONS) % job.shards == job.shard]
    placed = {i: metadata_partition(job.plan.tps[i], SOURCE_PARTITIONS) for i in indices}
    producer = Producer({"bootstrap.servers": job.bootstrap, "linger.ms": 100, "acks": "all",
                         "enable.idempotence": True, "queue.buffering.max.messages": 1_000_000})
    records = 0
    for seg, states in live_history(job.plan, indices, random.Random(f"{job.seed}-{job.shard}")):
        for segment_state in states:
            event = as_event(job.plan.tps, seg, segment_state)
            value = encode(event.update if event.update is not None else event.metadata)
            while True:
                try:
                    producer.produce(job.topic, value, partition=placed[seg.tp_index])
                    break
                except BufferError:
                    producer.poll(0.05)
            records += 1
    if producer.flush(600) != 0:
        raise SystemExit(f"producing shard {job.shard} of the history did not finish in 600 s")
    return records


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config={"cleanup.policy": "delete", "retention.ms": "-1"})]
                        )[name].result(60)


def delete_topics(bootstrap: str, names: Sequence[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_topics(list(names)).values():
        try:
            future.result(60)
        except Exception as exc:  # a topic the run never created: nothing to delete
            print(f"note: {exc}", file=sys.stderr)


def timed_migrate(options: Sequence[str], *extra: str) -> dict[str, Any]:
    """Run `tierlog migrate` as an operator does; its wall time, CPU time (user + system, every thread), peak RSS and
    JSON report."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "tierlog.cli", "migrate", *options, *extra, "--json"],
                             stdout=subprocess.PIPE, text=True, cwd=REPO)
    peak_kib = 0
    cpu_ticks = 0
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while child.poll() is None:
        if time.monotonic() > deadline:
            child.kill()
            raise SystemExit(f"tierlog migrate {' '.join(extra)} did not finish in {RUN_TIMEOUT_S:g} s")
        try:
            status = Path(f"/proc/{child.pid}/status").read_text()
            peak_kib = max(peak_kib, next(int(line.split()[1]) for line in status.splitlines()
                                          if line.startswith("VmHWM:")))
            fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu_ticks = int(fields[11]) + int(fields[12])  # utime, stime (the 14th and 15th fields)
        except (OSError, StopIteration, IndexError, ValueError):
            pass
        time.sleep(POLL_S)
    out = child.stdout.read() if child.stdout else ""
    wall = time.perf_counter() - started
    if child.returncode != 0:
        raise SystemExit(f"tierlog migrate {' '.join(extra)} exited {child.returncode}: {out[-2000:]}")
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu_ticks / os.sysconf("SC_CLK_TCK"), 1),
            "peak_rss_mib": round(peak_kib / 1024), "report": json.loads(out)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=1_000_000, help="live segments at the end of the history")
    parser.add_argument("--deleted-share", type=float, default=0.125,
                        help="segments retention deleted, as a share of the live ones")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shards", type=int, default=os.cpu_count() or 2, help="generating processes")
    parser.add_argument("--keep", action="store_true", help="keep the topics and the state dir")
    args = parser.parse_args(argv)

    bootstrap = services_env()["KAFKA_BOOTSTRAP"]
    run = uuid.uuid4().hex[:8]
    source, target = f"bench-migrate-src-{run}", f"bench-migrate-tgt-{run}"
    plan = LivePlan.spread(user_partitions(USER_PARTITIONS, random.Random(args.seed)), args.live, args.deleted_share)
    create_topic(bootstrap, source, SOURCE_PARTITIONS)
    started = time.perf_counter()
    jobs = [ShardJob(plan, bootstrap, source, args.shards, shard, args.seed) for shard in range(args.shards)]
    with ProcessPoolExecutor(args.shards, mp_context=multiprocessing.get_context("spawn")) as pool:
        records = sum(pool.map(write_shard, jobs))
    generated_s = time.perf_counter() - started
    print(f"{records} records produced to {source} in {generated_s:.0f} s", file=sys.stderr)

    work = Path(tempfile.mkdtemp(prefix="bench-migrate-"))
    config = {"bootstrap.servers": bootstrap, "metadata.topic.name": target, "state.dir": str(work / "state"),
              "metadata.topic.num.partitions": str(TARGET_PARTITIONS), "metadata.topic.replication.factor": "1",
              "metadata.topic.min.insync.replicas": "1", "broker.id": "0"}
    options = ["--source-topic", source, *(arg for key, value in config.items() for arg in ("-o", f"{key}={value}")),
               "--timeout", "120"]
    try:
        runs = {"dry_run": timed_migrate(options, "--dry-run"), "import": timed_migrate(options),
                "second_run": timed_migrate(options)}
    finally:
        if not args.keep:
            delete_topics(bootstrap, [source, target])
            subprocess.run(["rm", "-rf", str(work)], check=False)
    for result in runs.values():
        result["records_per_s"] = round(records / result["wall_s"])
        result["live_segments_per_s"] = round(args.live / result["wall_s"])
    written = runs["import"]["report"]["written"]
    print(json.dumps({
        "live_segments": args.live, "deleted_segments": sum(plan.deleted), "source_records": records,
        "user_partitions": USER_PARTITIONS, "source_partitions": SOURCE_PARTITIONS,
        "target_partitions": TARGET_PARTITIONS, "generate_s": round(generated_s, 1),
        "load_average": os.getloadavg(), "cores": os.cpu_count(), "written": written,
        **{name: {k: v for k, v in result.items() if k != "report"} | {
            "already_migrated": result["report"]["already_migrated"],
            "written": result["report"].get("written", result["report"].get("would_write"))}
           for name, result in runs.items()},
    }, indent=2))


if __name__ == "__main__":
    main()
