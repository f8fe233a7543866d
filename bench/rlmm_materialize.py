"""Benchmark of the metadata manager on a real broker: cold materialization, restart, lookups, memory.

Produces N realistic logical metadata events (segment uploads across many user partitions with lineage checkpoints
and retention deletes) straight onto a fresh metadata topic, then times a fresh node to ready (rebuild) and a
restart of that caught-up node (resume from stored offsets), each in a process of its own as a broker's agent, with
their RSS at ready and once every partition is read, and in-process lookup latency; prints JSON.

Usage: python bench/rlmm_materialize.py [--events 1000000] [--retention 20] [--bootstrap HOST:PORT] [--partitions 8]
(--retention 0 keeps every segment live: `--events 2000000 --retention 0` is the memory figure at 1M live segments.)
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from dev.env import services_env  # noqa: E402
from rlmm import (  # noqa: E402
    RemoteLogMetadataManager,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
    codec,
)
from rlmm.events import EpochCheckpoint, EpochLineage, key_of, metadata_partition_for  # noqa: E402

S = RemoteLogSegmentState
SEGMENT_OFFSETS = 10_000


def bootstrap_from_env() -> str:
    bootstrap = services_env().get("KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise SystemExit("no Kafka: run dev/services up or pass --bootstrap")
    return bootstrap


@dataclass
class _History:
    next_offset: int = 0
    epoch: int = 0
    live: list[RemoteLogSegmentMetadata] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SegmentEvent:
    """One logical metadata event, as a broker's API call makes it: a segment's add or one state update.

    `metadata` is the segment as it stands after the event; `update` is None for the add."""

    metadata: RemoteLogSegmentMetadata
    update: RemoteLogSegmentMetadataUpdate | None = None


def history(total: int, user_partitions: list[TopicIdPartition], rng: random.Random, retention: int
            ) -> Iterator[SegmentEvent]:
    """A broker's metadata history of `total` logical events: per user partition, segments uploaded in order
    (add, then COPY_SEGMENT_FINISHED), leader epochs bumping now and then, retention deleting the oldest
    segments (DELETE_SEGMENT_STARTED, then DELETE_SEGMENT_FINISHED)."""
    produced = 0
    state = {tp: _History() for tp in user_partitions}
    now = 1_700_000_000_000
    while produced < total:
        tp = rng.choice(user_partitions)
        st = state[tp]
        if rng.random() < 0.02:
            st.epoch += 1
        start = st.next_offset
        end = start + SEGMENT_OFFSETS - 1
        st.next_offset = end + 1
        md = RemoteLogSegmentMetadata(
            remote_log_segment_id=RemoteLogSegmentId(tp, uuid.UUID(int=rng.getrandbits(128))),
            start_offset=start, end_offset=end, max_timestamp_ms=now, broker_id=rng.randrange(3),
            event_timestamp_ms=now, segment_size_in_bytes=rng.randint(1 << 20, 1 << 30),
            segment_leader_epochs={st.epoch: start}, txn_idx_empty=rng.random() < 0.9,
        )
        yield SegmentEvent(md)
        yield _updated(md, S.COPY_SEGMENT_FINISHED, b"\x00" * 24)
        produced += 2
        st.live.append(md)
        if retention and len(st.live) > retention and produced < total:  # retention: the oldest segment goes
            oldest = st.live.pop(0)
            yield _updated(oldest, S.DELETE_SEGMENT_STARTED, None)
            yield _updated(oldest, S.DELETE_SEGMENT_FINISHED, None)
            produced += 2
        now += 1000


def _updated(md: RemoteLogSegmentMetadata, state: RemoteLogSegmentState, custom: bytes | None) -> SegmentEvent:
    update = RemoteLogSegmentMetadataUpdate(md.remote_log_segment_id, md.event_timestamp_ms + 1, custom, state, 1)
    return SegmentEvent(md.create_with_update(update), update)


def tierlog_records(events: Iterable[SegmentEvent]) -> Iterator[tuple[TopicIdPartition, bytes, bytes | None]]:
    """The records tierlog's manager appends for `events`: each segment's full state under its key, a lineage
    checkpoint of each leader epoch whose highest offset a finished copy raised, and a tombstone once a segment is
    deleted."""
    highest: dict[TopicIdPartition, dict[int, int]] = {}
    for event in events:
        md = event.metadata
        tp = md.topic_id_partition
        key = key_of(md).encode()
        yield tp, key, codec.encode(md)
        if md.state is S.COPY_SEGMENT_FINISHED:
            epochs = highest.setdefault(tp, {})
            for epoch in md.segment_leader_epochs:
                end = md.epoch_end_offset(epoch)
                if end > epochs.get(epoch, -1):
                    epochs[epoch] = end
                    checkpoint = EpochCheckpoint(tp, (EpochLineage(epoch, end),), md.event_timestamp_ms, 0,
                                                 whole_partition=False)
                    yield tp, key_of(checkpoint).encode(), codec.encode(checkpoint)
        elif md.state is S.DELETE_SEGMENT_FINISHED:
            yield tp, key, None


def user_partitions(count: int, rng: random.Random) -> list[TopicIdPartition]:
    return [TopicIdPartition(uuid.UUID(int=rng.getrandbits(128)), f"topic{i % 50}", i) for i in range(count)]


def produce_history(bootstrap: str, topic: str, partitions: int, total: int, user_partition_count: int, seed: int,
                    retention: int) -> tuple[int, list[TopicIdPartition], float]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1, config={"cleanup.policy": "compact",
                                                                 "min.compaction.lag.ms": str(7 * 86400_000)})]
                        )[topic].result(60)
    rng = random.Random(seed)
    tps = user_partitions(user_partition_count, rng)
    count, seconds = produce_records(bootstrap, topic, partitions, tierlog_records(history(total, tps, rng, retention)))
    return count, tps, seconds


def produce_records(bootstrap: str, topic: str, partitions: int,
                    records: Iterable[tuple[TopicIdPartition, bytes, bytes | None]]) -> tuple[int, float]:
    """Append tierlog records straight onto `topic`, each to its user partition's metadata partition;
    returns how many and the seconds it took."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000,
                         "compression.type": "lz4", "acks": "all", "enable.idempotence": True,
                         "queue.buffering.max.messages": 500_000})
    started = time.perf_counter()
    count = 0
    for tp, key, value in records:
        while True:
            try:
                producer.produce(topic, key=key, value=value,
                                 partition=metadata_partition_for(tp.topic_id, tp.partition, partitions))
                break
            except BufferError:
                producer.poll(0.05)
        count += 1
    if producer.flush(300) != 0:
        raise SystemExit(f"producing records to {topic} did not finish")
    return count, time.perf_counter() - started


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def dir_mib(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / (1 << 20)


def node_step(config: dict[str, object], tps: list[TopicIdPartition], lookups: int, seed: int
              ) -> dict[str, object]:
    """Run in a fresh process, as a broker's agent: a node on `config` until every user partition is ready (a
    rebuild on an empty state dir, else a restart); its RSS then and once every partition is read; lookup latency."""
    started = time.perf_counter()
    manager = RemoteLogMetadataManager(config)
    manager.on_partition_leadership_changes(set(tps), set())
    manager.wait_caught_up(3600)
    while not all(manager.is_ready(tp) for tp in tps):
        time.sleep(0.01)
    ready_s = time.perf_counter() - started
    rss_ready = rss_mib()
    listed = {tp: manager.list_remote_log_segments(tp) for tp in tps}
    result: dict[str, object] = {"ready_s": round(ready_s, 3), "live_segments": sum(map(len, listed.values())),
                                 "rss_mib_at_ready": round(rss_ready, 1), "rss_mib_all_read": round(rss_mib(), 1)}
    rng = random.Random(seed + 1)
    latencies = []
    hits = 0
    for tp in (rng.choice(tps) for _ in range(lookups)):
        md = rng.choice(listed[tp]) if listed[tp] else None
        epoch = next(iter(md.segment_leader_epochs)) if md else 0
        offset = rng.randint(md.start_offset, md.end_offset) if md else 0
        t0 = time.perf_counter_ns()
        found = manager.remote_log_segment_metadata(tp, epoch, offset)
        latencies.append(time.perf_counter_ns() - t0)
        hits += found is not None
    latencies.sort()
    if latencies:
        result.update(lookups=len(latencies), lookup_hits=hits,
                      lookup_p50_us=round(latencies[len(latencies) // 2] / 1000, 1),
                      lookup_p99_us=round(latencies[int(len(latencies) * 0.99)] / 1000, 1))
    result["digest"] = manager.view_digest()
    manager.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--user-partitions", type=int, default=2000)
    parser.add_argument("--partitions", type=int, default=8, help="metadata topic partitions")
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--bootstrap", default=None)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--retention", type=int, default=20,
                        help="segments kept per user partition before the oldest is deleted (0: keep all)")
    parser.add_argument("--node-step", default=None, help=argparse.SUPPRESS)  # internal: a node's own process
    args = parser.parse_args()
    tps = user_partitions(args.user_partitions, random.Random(args.seed))
    if args.node_step is not None:
        print(json.dumps(node_step(json.loads(args.node_step), tps, args.lookups, args.seed)))
        return
    bootstrap = args.bootstrap or bootstrap_from_env()
    topic = f"bench-rlmm-{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="bench-rlmm-"))
    result: dict[str, object] = {"benchmark": "rlmm_materialize", "events_requested": args.events,
                                 "metadata_partitions": args.partitions, "user_partitions": args.user_partitions,
                                 "retention_segments": args.retention}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        produced, produced_tps, produce_s = produce_history(bootstrap, topic, args.partitions, args.events,
                                                            args.user_partitions, args.seed, args.retention)
        assert produced_tps == tps
        result.update(events_produced=produced, produce_s=round(produce_s, 2),
                      produce_events_per_s=round(produced / produce_s))
        config = {"bootstrap.servers": bootstrap, "broker.id": 0, "state.dir": str(work / "node"),
                  "metadata.topic.name": topic, "metadata.topic.num.partitions": args.partitions,
                  "metadata.topic.replication.factor": 1, "metadata.topic.min.insync.replicas": 1,
                  "startup.timeout.ms": 600_000}

        def step(lookups: int) -> dict[str, object]:
            child = subprocess.run(
                [sys.executable, __file__, "--node-step", json.dumps(config), "--user-partitions",
                 str(args.user_partitions), "--seed", str(args.seed), "--lookups", str(lookups)],
                capture_output=True, text=True, timeout=3600, check=True)
            answer: dict[str, object] = json.loads(child.stdout.strip().splitlines()[-1])
            return answer

        rebuilt = step(args.lookups)
        result.update(rebuild_to_ready_s=rebuilt["ready_s"], rebuild_events_per_s=round(
                          produced / float(rebuilt["ready_s"])),  # type: ignore[arg-type]
                      live_segments=rebuilt["live_segments"], rss_mib_after_rebuild=rebuilt["rss_mib_at_ready"],
                      rss_mib_after_rebuild_all_read=rebuilt["rss_mib_all_read"],
                      state_dir_mib=round(dir_mib(work / "node"), 1),
                      **{k: rebuilt[k] for k in ("lookups", "lookup_hits", "lookup_p50_us", "lookup_p99_us")})
        restarted = step(0)
        result.update(restart_to_ready_s=restarted["ready_s"], rss_mib_after_restart=restarted["rss_mib_at_ready"],
                      rss_mib_after_restart_all_read=restarted["rss_mib_all_read"],
                      restart_digest_equal=restarted["digest"] == rebuilt["digest"],
                      rss_rebuild_over_restart_all_read=round(
                          float(rebuilt["rss_mib_all_read"])  # type: ignore[arg-type]
                          / float(restarted["rss_mib_all_read"]), 2))  # type: ignore[arg-type]
    finally:
        shutil.rmtree(work, ignore_errors=True)
        admin.delete_topics([topic], operation_timeout=60)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
