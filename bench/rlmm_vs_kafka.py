"""Side-by-side benchmark: tierlog's metadata manager against Kafka's own TopicBasedRemoteLogMetadataManager.

Starts its own one-node Kafka (the pinned version), feeds both managers the same logical events (segment adds,
copy-finished updates, and retention deletes of a share of them, over 2,000 user partitions and 50 metadata
partitions), then runs each node in a fresh process, interleaved: cold rebuild from the topic (tierlog also from
a compacted copy), restart, in-process lookup and write latency, RSS, metadata topic bytes. Kafka's manager is
driven through its public API by the Java harness in bench/tbrlmm. Last, lookups are timed again on both while
they apply records a producer process appends (other partitions' uploads): as fast as it can, then paced at the same
events/s for both. Prints one JSON document on stdout and a Markdown table of ratios (tierlog/TBRLMM) on stderr.

Usage: python bench/rlmm_vs_kafka.py [--full] [--events N] [--rounds R] [--markdown FILE]
(quick: 200k events, the `make bench-kafka` target; --full: 1M events.)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import platform
import random
import select
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import zip_longest
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from rlmm_materialize import (  # noqa: E402
    SegmentEvent,
    history,
    produce_records,
    rss_mib,
    tierlog_records,
    user_partitions,
)

from dev.env import services_env  # noqa: E402
from dev.kafka import KafkaCluster, java_executable, kafka_version  # noqa: E402
from rlmm import (  # noqa: E402
    RemoteLogMetadataManager,
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from rlmm.event_log import TopicSettings, check_topic  # noqa: E402
from rlmm.events import RecordKey  # noqa: E402
from rsm.backend import StorageBackend  # noqa: E402
from rsm.snapshot_source import BucketSnapshotSource  # noqa: E402
from tierlog.audit.archiver import Archiver, ArchiverSettings  # noqa: E402
from tierlog.audit.snapshots import SnapshotSettings, write_snapshot_now  # noqa: E402
from tierlog.pipeline.locations import open_store  # noqa: E402
from tierlog.pipeline.session import S3Settings  # noqa: E402

HARNESS_POM = REPO / "bench" / "tbrlmm" / "pom.xml"
HARNESS_BUILD = REPO / ".dev" / "bench-tbrlmm"
HARNESS_MAIN = "dev.tierlog.bench.TbrlmmHarness"
TBRLMM_TOPIC = "__remote_log_metadata"
UNCOMPACTED_TOPIC = "bench-tierlog-history"
COMPACTED_TOPIC = "bench-tierlog-compacted"
SNAPSHOT_LOCATION = "snapshots"
# The compacted copy rolls and cleans quickly so that it reaches its compacted size within the run.
COMPACTED_SEGMENT_MS = 4000
NODE_TIMEOUT_S = 3600.0
COMPACTION_TIMEOUT_S = 180.0
BUSY_TIMEOUT_S = 300.0
T = TypeVar("T")


# --- the events both managers are fed ----------------------------------------------------------------------

def write_events_file(path: Path, tps: Sequence[TopicIdPartition], events: Iterable[SegmentEvent]) -> None:
    """The harness's input: the user partitions, then one line per logical event (see TbrlmmHarness)."""
    index = {tp: i for i, tp in enumerate(tps)}
    with path.open("w", encoding="ascii") as out:
        for tp in tps:
            out.write(f"P {tp.topic_id} {tp.topic} {tp.partition}\n")
        for event in events:
            md = event.metadata
            tp_index = index[md.topic_id_partition]
            segment = md.remote_log_segment_id.id
            if event.update is None:
                (epoch,) = md.segment_leader_epochs
                out.write(f"A {tp_index} {segment} {md.start_offset} {md.end_offset} {epoch} {md.max_timestamp_ms} "
                          f"{md.broker_id} {md.event_timestamp_ms} {md.segment_size_in_bytes} "
                          f"{int(md.txn_idx_empty)}\n")
            else:
                u = event.update
                out.write(f"U {tp_index} {segment} {u.state.value} {u.event_timestamp_ms} {u.broker_id}\n")


def read_partitions(path: Path) -> list[TopicIdPartition]:
    with path.open(encoding="ascii") as lines:
        return [TopicIdPartition(uuid.UUID(f[1]), f[2], int(f[3]))
                for f in (line.split() for line in lines) if f[0] == "P"]


# --- one tierlog node, in a process of its own -------------------------------------------------------------

def tierlog_node(bootstrap: str, topic: str, partitions: int, state_dir: str, events_file: Path, lookups: int,
                 writes: int, seed: int, snapshots: str | None = None, busy: Sequence[BusyPhase] = ()
                 ) -> dict[str, Any]:
    """Start a manager on `state_dir`, wait until every user partition is ready, then time lookups and writes:
    the same steps, in the same order, as the harness's `node` command. With `snapshots` (a bucket location),
    an empty state dir bootstraps from the newest snapshot there, then tails the topic. With `busy` phases, lookups
    are then timed again while the applier applies each phase's records, appended by a producer process."""
    tps = read_partitions(events_file)
    rng = random.Random(seed)
    # A topic id of its own: drawn from `rng`, it was the first user partition's (the events' first draw too), and
    # the writes then landed in that partition under another topic name.
    write_target = TopicIdPartition(uuid.UUID(int=random.Random(f"writes-{seed}").getrandbits(128)), "bench-writes", 0)
    config = {"bootstrap.servers": bootstrap, "broker.id": 0, "state.dir": state_dir, "metadata.topic.name": topic,
              "metadata.topic.num.partitions": partitions, "metadata.topic.create": False,
              "startup.timeout.ms": int(NODE_TIMEOUT_S * 1000)}
    source = None
    if snapshots is not None:
        config["snapshot.location"] = SNAPSHOT_LOCATION
        source = BucketSnapshotSource(open_bench_store(snapshots))
    node_log = _Messages()
    logging.getLogger("rlmm").addHandler(node_log)
    logging.getLogger("rlmm").setLevel(logging.INFO)
    started = time.perf_counter()
    manager = RemoteLogMetadataManager(config, snapshot_source=source)
    if snapshots is not None and not any(m.startswith("bootstrapped") for m in node_log.messages):
        manager.close()
        raise SystemExit(f"the node did not bootstrap from the snapshot: {node_log.messages}")
    try:
        everything = {*tps, write_target}
        manager.on_partition_leadership_changes(everything, set())
        manager.wait_caught_up(NODE_TIMEOUT_S)
        deadline = time.monotonic() + NODE_TIMEOUT_S
        while not all(manager.is_ready(tp) for tp in everything):
            if time.monotonic() > deadline:
                raise SystemExit("tierlog node did not get ready in time")
            time.sleep(0.002)
        ready_s = time.perf_counter() - started
        rss_after_ready = rss_mib()

        live = [md for tp in tps for md in manager.list_remote_log_segments(tp)]
        # The read model reads a partition when first asked for: RSS once every partition has been read, the state
        # a node serving all of them reaches (TBRLMM holds every partition from the start).
        rss_after_reads = rss_mib()
        lookup_ns = [0] * lookups
        hits = 0
        for _round in range(2):  # the same warm-up round as the harness
            hits = 0
            for i in range(lookups):
                md = live[rng.randrange(len(live))]
                epoch = min(md.segment_leader_epochs)
                offset = md.start_offset + int(rng.random() * (md.end_offset - md.start_offset))
                t0 = time.perf_counter_ns()
                found = manager.remote_log_segment_metadata(md.topic_id_partition, epoch, offset)
                lookup_ns[i] = time.perf_counter_ns() - t0
                hits += found is not None

        add_ns, finish_ns = [], []
        for i in range(writes):
            start = i * 10_000
            md = RemoteLogSegmentMetadata(
                # A fresh id per upload, as a broker makes (a restarted node writes again).
                remote_log_segment_id=RemoteLogSegmentId(write_target, uuid.uuid4()),
                start_offset=start, end_offset=start + 9_999, max_timestamp_ms=0, broker_id=0,
                event_timestamp_ms=int(time.time() * 1000), segment_size_in_bytes=1 << 20,
                segment_leader_epochs={0: start}, txn_idx_empty=True)
            t0 = time.perf_counter_ns()
            manager.add_remote_log_segment_metadata(md).result(60)
            t1 = time.perf_counter_ns()
            manager.update_remote_log_segment_metadata(RemoteLogSegmentMetadataUpdate(
                md.remote_log_segment_id, int(time.time() * 1000), b"\x00" * 24,
                RemoteLogSegmentState.COPY_SEGMENT_FINISHED, 0)).result(60)
            add_ns.append(t1 - t0)
            finish_ns.append(time.perf_counter_ns() - t1)
        busy_figures: dict[str, Any] = {}
        for phase in busy:
            busy_figures |= lookups_while_busy(manager, live, rng, bootstrap, topic, partitions, phase)
    finally:
        manager.close()
    return {**busy_figures, "ready_s": round(ready_s, 3), "live_segments": len(live), "lookups": lookups,
            "lookup_hits": hits, "lookup_p50_us": _pct(lookup_ns, 0.5) / 1e3,
            "lookup_p99_us": _pct(lookup_ns, 0.99) / 1e3,
            "writes": writes, "add_p50_ms": _pct(add_ns, 0.5) / 1e6, "add_p99_ms": _pct(add_ns, 0.99) / 1e6,
            "finish_p50_ms": _pct(finish_ns, 0.5) / 1e6, "finish_p99_ms": _pct(finish_ns, 0.99) / 1e6,
            "rss_mib": round(rss_after_ready, 1), "rss_after_reads_mib": round(rss_after_reads, 1),
            "log": node_log.messages}


def lookups_while_busy(manager: RemoteLogMetadataManager, live: list[RemoteLogSegmentMetadata], rng: random.Random,
                       bootstrap: str, topic: str, partitions: int, busy: BusyPhase) -> dict[str, Any]:
    """Lookups timed back to back, in the thread that calls the manager, from the moment a producer process starts
    appending records (`busy.records`: other user partitions' uploads) until the applier has read past them all.
    The applier's thread shares the interpreter's lock with the lookups: this is what a fetch sees while metadata of
    other partitions streams in. The figures' names start with the phase's prefix."""
    busy_file = busy.records
    with busy_file.open("rb") as source:
        records = pickle.load(source)
    expected = len(records)
    # Registered first, as TBRLMM's harness does (it applies only the partitions it was given).
    busy_partitions = {tp for tp, _, _ in records}
    del records
    manager.on_partition_leadership_changes(busy_partitions, set())
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while not all(manager.is_ready(tp) for tp in busy_partitions):
        if time.monotonic() > deadline:
            raise SystemExit("the busy partitions did not get ready in time")
        time.sleep(0.002)
    applied_before = manager.record_counts()[0]
    read_before = sum(manager.applied_offsets().values())  # the next offset of each metadata partition
    producer = subprocess.Popen([sys.executable, __file__, "busy-producer", bootstrap, topic, str(partitions),
                                 str(busy_file), str(busy.seconds)], stdout=subprocess.PIPE)
    try:
        # The producer says when it has its records in hand and starts appending (the applier then reads a window
        # of them, applied at once: the count of applied records moves only at its end).
        assert producer.stdout is not None
        ready, _, _ = select.select([producer.stdout], [], [], BUSY_TIMEOUT_S)
        if not ready or producer.stdout.readline() != b"producing\n":
            raise SystemExit(f"the busy producer did not start (exit {producer.poll()})")
        busy_ns = array("q")  # not a list: millions of int objects would add allocation to what is timed
        started = time.perf_counter()
        while (read := sum(manager.applied_offsets().values()) - read_before) < expected:
            if time.monotonic() > deadline:
                raise SystemExit(f"the applier read {read} of {expected} busy records in {BUSY_TIMEOUT_S} s")
            for _ in range(1000):
                md = live[rng.randrange(len(live))]
                epoch = min(md.segment_leader_epochs)
                offset = md.start_offset + int(rng.random() * (md.end_offset - md.start_offset))
                t0 = time.perf_counter_ns()
                manager.remote_log_segment_metadata(md.topic_id_partition, epoch, offset)
                busy_ns.append(time.perf_counter_ns() - t0)
        busy_s = time.perf_counter() - started
        if not busy_ns:
            raise SystemExit("no lookup was timed while the applier was busy")
        if producer.wait(BUSY_TIMEOUT_S) != 0:
            raise SystemExit(f"the busy producer failed ({producer.returncode})")
    finally:
        if producer.poll() is None:
            producer.kill()
            producer.wait()
    p = busy.prefix
    return {f"{p}_records": expected, f"{p}_applied": manager.record_counts()[0] - applied_before,
            f"{p}_s": round(busy_s, 3), f"{p}_lookups": len(busy_ns),
            f"{p}_lookup_p50_us": _pct(busy_ns, 0.5) / 1e3, f"{p}_lookup_p99_us": _pct(busy_ns, 0.99) / 1e3,
            f"{p}_lookup_p999_us": _pct(busy_ns, 0.999) / 1e3, f"{p}_lookup_max_us": max(busy_ns) / 1e3}


@dataclass(frozen=True)
class BusyPhase:
    """Records appended while lookups are timed: at full speed (`seconds` 0, prefix "busy"), or spread evenly over
    `seconds` (prefix "paced"), the same events per second for both systems."""

    records: Path
    seconds: float = 0.0

    @property
    def prefix(self) -> str:
        return "paced" if self.seconds else "busy"

    def arg(self) -> str:
        return f"{self.records}@{self.seconds}"

    @classmethod
    def parse(cls, text: str) -> BusyPhase:
        path, _, seconds = text.rpartition("@")
        return cls(Path(path), float(seconds))


def write_busy_events(directory: Path, name: str, count: int, seed: int, retention: int) -> tuple[Path, Path]:
    """`count` logical events over 200 user partitions the nodes do not look up in (drawn from `name` and the
    seed, so each phase has partitions of its own): tierlog's records (a pickle) and the harness's events file."""
    rng = random.Random(f"{name}-{seed}")
    tps = user_partitions(200, rng)
    events = list(history(count, tps, rng, retention))
    records, events_file = directory / f"{name}.pickle", directory / f"{name}-events.txt"
    with records.open("wb") as out:
        pickle.dump(list(tierlog_records(events)), out)
    write_events_file(events_file, tps, events)
    return records, events_file


def paced(records: Sequence[T], seconds: float) -> Iterator[T]:
    """`records`, handed out evenly over `seconds` (at once with 0): the harness's paced producer does the same."""
    if not seconds:
        yield from records
        return
    started, interval = time.monotonic(), seconds / max(1, len(records))
    for i, record in enumerate(records):
        wait = started + i * interval - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        yield record


class _Messages(logging.Handler):
    """Keeps the messages the node's manager logs: whether it really started from the snapshot, whether its fold
    worker answered. They go into the step's JSON, so a slow round can be explained afterwards."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _pct(values: Sequence[int], q: float) -> float:
    ordered = sorted(values)
    return float("nan") if not ordered else round(float(ordered[min(len(ordered) - 1, int(len(ordered) * q))]), 2)


def open_bench_store(location: str) -> StorageBackend:
    """The bucket (or directory) the benchmark's snapshots go to; S3 settings from the dev services."""
    env = services_env()
    settings = S3Settings(env.get("S3_ENDPOINT"), env.get("S3_ACCESS_KEY"), env.get("S3_SECRET_KEY"),
                          env.get("S3_REGION", "us-east-1"))
    return open_store(location, settings)


def snapshot_location(work: Path) -> str:
    """A fresh prefix in the dev services' bucket, or a local directory when no S3 is configured."""
    env = services_env()
    if env.get("S3_ENDPOINT") and env.get("S3_BUCKET"):
        return f"s3://{env['S3_BUCKET']}/bench-rlmm-vs-kafka-{uuid.uuid4().hex[:8]}"
    return str(work / "bucket")


def prepare_snapshot(bootstrap: str, location: str, partitions: int) -> dict[str, Any]:
    """Archive the uncompacted topic and fold the archive into a snapshot, as the agent does periodically."""
    store = open_bench_store(location)
    started = time.perf_counter()
    Archiver(store, ArchiverSettings(bootstrap, UNCOMPACTED_TOPIC)).run_until_caught_up(timeout_s=NODE_TIMEOUT_S)
    archived = time.perf_counter()
    topic_id = check_topic(AdminClient({"bootstrap.servers": bootstrap}), UNCOMPACTED_TOPIC, partitions, 60).topic_id
    key = write_snapshot_now(store, SnapshotSettings(SNAPSHOT_LOCATION, UNCOMPACTED_TOPIC), topic_id)
    if key is None:
        raise SystemExit("no snapshot was written: the archive is empty")
    size = len(BucketSnapshotSource(store).read(key))
    return {"archive_s": round(archived - started, 2), "snapshot_write_s": round(time.perf_counter() - archived, 2),
            "snapshot_bytes": size, "location": location}


def remove_location(location: str) -> None:
    store = open_bench_store(location)
    keys = [o.key for o in store.list("")]
    for i in range(0, len(keys), 1000):
        store.delete(keys[i:i + 1000])


# --- the runner ---------------------------------------------------------------------------------------------

def build_harness() -> str:
    """Build the Java harness (Maven, output under .dev/) and return its classpath."""
    # Maven's output is kept off stdout, which carries only the JSON document.
    built = subprocess.run(["mvn", "-q", "-B", "-Dstyle.color=never", "-f", str(HARNESS_POM),
                            f"-Dkafka.version={kafka_version()}", "package", "-DskipTests"],
                           capture_output=True, text=True, timeout=600)
    if built.returncode != 0:
        raise SystemExit(f"building the TBRLMM harness failed:\n{built.stdout[-4000:]}{built.stderr[-4000:]}")
    return os.pathsep.join([str(HARNESS_BUILD / "classes"), str(HARNESS_BUILD / "lib" / "*")])


def run_json(command: Sequence[str], timeout_s: float = NODE_TIMEOUT_S) -> dict[str, Any]:
    """Run one measurement process and return the JSON object it printed last."""
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command[:3])} ... failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def topic_bytes(cluster: KafkaCluster, topic: str) -> int:
    """Bytes of a topic's log segments on the broker's disk (indexes are preallocated, so left out)."""
    return sum(f.stat().st_size for f in cluster.log_dir(0).glob(f"{topic}-*/*.log"))


def create_tierlog_topics(bootstrap: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # The project's defaults (seven days of uncompacted history), and a copy that compacts at once.
    history_topic = TopicSettings(UNCOMPACTED_TOPIC, partitions, 1, 1, 7 * 24 * 3600 * 1000, {})
    compacted = TopicSettings(COMPACTED_TOPIC, partitions, 1, 1, 0,
                              {"min.cleanable.dirty.ratio": "0.01", "segment.bytes": str(1 << 20)},
                              delete_retention_ms=0, segment_ms=COMPACTED_SEGMENT_MS)
    futures = admin.create_topics([NewTopic(s.name, s.partitions, s.replication_factor, config=s.configs())
                                   for s in (history_topic, compacted)])
    for future in futures.values():
        future.result(60)


def wait_compacted(cluster: KafkaCluster, partitions: int) -> int:
    """Let the compacted copy's cleaner finish: roll every partition's active segment (compaction never touches
    it) with a tombstone for a segment that never existed, then wait until the topic's size stops shrinking."""
    time.sleep(COMPACTED_SEGMENT_MS / 1000 + 0.5)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for p in range(partitions):
        key = RecordKey("segment", uuid.UUID(int=0), p, uuid.uuid4()).encode()
        producer.produce(COMPACTED_TOPIC, key=key, value=None, partition=p)
    producer.flush(60)
    deadline = time.monotonic() + COMPACTION_TIMEOUT_S
    sizes = [topic_bytes(cluster, COMPACTED_TOPIC)]
    while time.monotonic() < deadline:
        time.sleep(3)
        sizes.append(topic_bytes(cluster, COMPACTED_TOPIC))
        if len(sizes) >= 4 and sizes[-1] == sizes[-2] == sizes[-3]:
            break
    return sizes[-1]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="1M events instead of the quick 200k")
    parser.add_argument("--events", type=int, default=None, help="logical events (overrides --full)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (quick 1, full 2)")
    parser.add_argument("--user-partitions", type=int, default=2000)
    parser.add_argument("--partitions", type=int, default=50, help="metadata topic partitions")
    parser.add_argument("--retention", type=int, default=20,
                        help="segments kept per user partition before the oldest is deleted")
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--writes", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--busy-events", type=int, default=100_000,
                        help="logical events the applier applies while lookups are timed again (0: no such step)")
    parser.add_argument("--paced-events", type=int, default=10_000,
                        help="logical events appended at --paced-rate while lookups are timed (0: no such step)")
    parser.add_argument("--paced-rate", type=float, default=2_000.0,
                        help="events/s of the paced step: the same for both systems (TBRLMM applies ~8k/s at most)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the ratio table to this file")
    args = parser.parse_args(argv)
    if args.paced_rate <= 0:
        parser.error("--paced-rate must be above 0 (--paced-events 0 leaves the paced step out)")
    total = args.events or (1_000_000 if args.full else 200_000)
    rounds = args.rounds or (2 if args.full else 1)

    classpath = build_harness()
    work = Path(tempfile.mkdtemp(prefix="bench-rlmm-vs-kafka-"))
    try:
        result = _run(args, total, rounds, classpath, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = ratio_table(result)
    print(json.dumps(result, indent=2))
    print(table, file=sys.stderr)
    if args.markdown:
        args.markdown.write_text(table + "\n", encoding="utf-8")


def _run(args: argparse.Namespace, total: int, rounds: int, classpath: str, work: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    tps = user_partitions(args.user_partitions, rng)
    events = list(history(total, tps, rng, args.retention))
    events_file = work / "events.txt"
    write_events_file(events_file, tps, events)
    records = list(tierlog_records(events))
    deleted = sum(e.metadata.state is RemoteLogSegmentState.DELETE_SEGMENT_FINISHED for e in events)
    created = sum(e.update is None for e in events)
    result: dict[str, Any] = {
        "benchmark": "rlmm_vs_kafka", "mode": "full" if total >= 1_000_000 else "quick",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "kafka": kafka_version()},
        "logical_events": len(events), "tierlog_records": len(records), "segments_created": created,
        "segments_deleted": deleted, "user_partitions": args.user_partitions,
        "metadata_partitions": args.partitions, "rounds": rounds, "paced_rate": args.paced_rate,
    }
    java = [java_executable(), "-Xmx1g", "-XX:+UseSerialGC", "-cp", classpath, HARNESS_MAIN]
    with KafkaCluster(work / "kafka", heap="768m", properties={"log.cleaner.backoff.ms": 500}) as cluster:
        bootstrap = cluster.bootstrap
        create_tierlog_topics(bootstrap, args.partitions)
        _, produce_s = produce_records(bootstrap, UNCOMPACTED_TOPIC, args.partitions, records)
        produce_records(bootstrap, COMPACTED_TOPIC, args.partitions, records)
        kafka_produce = run_json([*java, "produce", str(events_file), bootstrap, str(args.partitions)])
        result["produce_s"] = {"tierlog": round(produce_s, 2), "tbrlmm": kafka_produce["produce_s"]}
        result["topic_bytes"] = {"tierlog_uncompacted": topic_bytes(cluster, UNCOMPACTED_TOPIC),
                                 "tbrlmm": topic_bytes(cluster, TBRLMM_TOPIC)}
        result["topic_bytes"]["tierlog_compacted"] = wait_compacted(cluster, args.partitions)
        location = snapshot_location(work)
        try:
            print("archiving the topic and writing a snapshot", file=sys.stderr, flush=True)
            result["snapshot"] = prepare_snapshot(bootstrap, location, args.partitions)
            print(f"snapshot: {result['snapshot']}", file=sys.stderr, flush=True)

            def tierlog(topic: str, state_dir: Path, snapshots: str = "-", *busy: str) -> dict[str, Any]:
                return run_json([sys.executable, __file__, "tierlog-node", bootstrap, topic, str(args.partitions),
                                 str(state_dir), str(events_file), str(args.lookups), str(args.writes), str(args.seed),
                                 snapshots, *busy])

            def tbrlmm(log_dir: Path, *busy: str) -> dict[str, Any]:
                return run_json([*java, "node", str(events_file), bootstrap, str(args.partitions), str(log_dir),
                                 str(args.lookups), str(args.writes), str(args.seed), *busy])

            runs: list[dict[str, Any]] = []
            for r in range(rounds):
                steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                    ("tierlog_cold", partial(tierlog, UNCOMPACTED_TOPIC, work / f"tierlog-{r}")),
                    ("tierlog_restart", partial(tierlog, UNCOMPACTED_TOPIC, work / f"tierlog-{r}")),
                    ("tierlog_cold_compacted", partial(tierlog, COMPACTED_TOPIC, work / f"tierlog-c-{r}")),
                    ("snapshot_bootstrap", partial(tierlog, UNCOMPACTED_TOPIC, work / f"tierlog-s-{r}", location)),
                ]
                kafka_steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                    ("tbrlmm_cold", partial(tbrlmm, work / f"tbrlmm-{r}")),
                    ("tbrlmm_restart", partial(tbrlmm, work / f"tbrlmm-{r}")),
                ]
                # Alternate the systems step by step, and which goes first from round to round, so that load from
                # the rest of the machine falls on both alike.
                first, second = (steps, kafka_steps) if r % 2 == 0 else (kafka_steps, steps)
                ordered = [step for pair in zip_longest(first, second) for step in pair if step is not None]
                measured: dict[str, Any] = {"round": r}
                for name, step in ordered:
                    print(f"round {r}: {name}", file=sys.stderr, flush=True)
                    measured[name] = step()
                runs.append(measured)
            # Last, on the first round's restarted nodes (the records appended would make later steps' topics
            # longer): lookups while records of other partitions arrive, at full speed, then paced.
            ours, theirs = [], []
            for name, count, seconds in (("busy", args.busy_events, 0.0),
                                         ("paced", args.paced_events, args.paced_events / args.paced_rate)):
                if count:
                    busy_records, busy_events = write_busy_events(work, name, count, args.seed, args.retention)
                    ours.append(BusyPhase(busy_records, seconds).arg())
                    theirs.append(BusyPhase(busy_events, seconds).arg())
            if ours:
                print("lookups while the applier is busy: tierlog", file=sys.stderr, flush=True)
                busy = {"tierlog": tierlog(UNCOMPACTED_TOPIC, work / "tierlog-0", "-", *ours)}
                print("lookups while the applier is busy: tbrlmm", file=sys.stderr, flush=True)
                busy["tbrlmm"] = tbrlmm(work / "tbrlmm-0", *theirs)
                result["busy"] = busy
        finally:
            remove_location(location)
    result["runs"] = runs
    result["median"] = medians(runs, len(events))
    return result


def medians(runs: list[dict[str, Any]], events: int) -> dict[str, dict[str, float]]:
    """Per step, the median of every numeric figure over the rounds, plus events/s for the ready time."""
    out: dict[str, dict[str, float]] = {}
    for step in (k for k in runs[0] if k != "round"):
        figures = {k for k, v in runs[0][step].items() if isinstance(v, (int, float))}
        out[step] = {k: round(statistics.median(run[step][k] for run in runs), 3) for k in sorted(figures)}
        out[step]["events_per_s"] = round(events / out[step]["ready_s"])
    return out


def ratio_table(result: dict[str, Any]) -> str:
    m = result["median"]
    t, k, tc = m["tierlog_cold"], m["tbrlmm_cold"], m["tierlog_cold_compacted"]
    tr, kr = m["tierlog_restart"], m["tbrlmm_restart"]
    sizes = result["topic_bytes"]
    rows: list[tuple[str, float, float, str, str]] = [
        ("cold rebuild, uncompacted topic (events/s)", t["events_per_s"], k["events_per_s"], "higher", "{:,.0f}"),
        ("cold rebuild, compacted topic (events/s; TBRLMM: its only topic)", tc["events_per_s"],
         k["events_per_s"], "higher", "{:,.0f}"),
        ("restart to ready (s)", tr["ready_s"], kr["ready_s"], "lower", "{:.2f}"),
        ("lookup p50 (µs)", t["lookup_p50_us"], k["lookup_p50_us"], "lower", "{:.1f}"),
        ("lookup p99 (µs)", t["lookup_p99_us"], k["lookup_p99_us"], "lower", "{:.1f}"),
        ("write: add p50 (ms)", t["add_p50_ms"], k["add_p50_ms"], "lower", "{:.2f}"),
        ("write: copy finished p50 (ms)", t["finish_p50_ms"], k["finish_p50_ms"], "lower", "{:.2f}"),
        ("RSS after cold rebuild (MiB)", t["rss_mib"], k["rss_mib"], "lower", "{:.0f}"),
        ("RSS after restart (MiB)", tr["rss_mib"], kr["rss_mib"], "lower", "{:.0f}"),
        ("RSS after cold rebuild, every partition read (MiB)", t["rss_after_reads_mib"],
         k.get("rss_after_reads_mib", k["rss_mib"]), "lower", "{:.0f}"),
        ("RSS after restart, every partition read (MiB)", tr["rss_after_reads_mib"],
         kr.get("rss_after_reads_mib", kr["rss_mib"]), "lower", "{:.0f}"),
        ("metadata topic bytes, uncompacted (MB)", sizes["tierlog_uncompacted"] / 1e6, sizes["tbrlmm"] / 1e6,
         "lower", "{:.1f}"),
        ("metadata topic bytes, compacted (MB)", sizes["tierlog_compacted"] / 1e6, sizes["tbrlmm"] / 1e6,
         "lower", "{:.1f}"),
    ]
    if "busy" in result:
        ours, theirs = result["busy"]["tierlog"], result["busy"]["tbrlmm"]
        at = rows.index(next(row for row in rows if row[0] == "lookup p99 (µs)")) + 1
        paced = (f" arriving at {result['paced_rate']:,.0f}/s" if "paced_records" in theirs else "")
        rows[at:at] = [
            (f"lookup {q} while {theirs[f'{p}_records']:,} events of other partitions are applied{how} (µs)",
             ours[f"{p}_lookup_{q}_us"], theirs[f"{p}_lookup_{q}_us"], "lower", "{:.1f}")
            for p, how in (("busy", " at full speed"), ("paced", paced)) if f"{p}_records" in theirs
            for q in ("p50", "p99")
        ]
    if "snapshot_bootstrap" in m:
        s = m["snapshot_bootstrap"]
        rows.insert(2, ("bootstrap from snapshot + tail (events/s)", s["events_per_s"], k["events_per_s"],
                        "higher", "{:,.0f}"))
    machine = result["machine"]
    lines = [f"{result['logical_events']:,} logical events ({result['segments_created']:,} segments created, "
             f"{result['segments_deleted']:,} deleted) over {result['user_partitions']:,} user partitions and "
             f"{result['metadata_partitions']} metadata partitions; Kafka {machine['kafka']}, {machine['cpus']} "
             f"cores, median of {result['rounds']} interleaved round(s).", "",
             "| figure | tierlog | TBRLMM | tierlog/TBRLMM | better |", "|---|---|---|---|---|"]
    for name, ours, theirs, better, fmt in rows:
        ratio = ours / theirs if theirs else float("nan")
        lines.append(f"| {name} | {fmt.format(ours)} | {fmt.format(theirs)} | {ratio:.2f} | {better} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "tierlog-node":
        b, topic, parts, state, events_path, lookups, writes, seed, snapshots = sys.argv[2:11]
        print(json.dumps(tierlog_node(b, topic, int(parts), state, Path(events_path), int(lookups), int(writes),
                                      int(seed), None if snapshots == "-" else snapshots,
                                      [BusyPhase.parse(phase) for phase in sys.argv[11:]])))
    elif len(sys.argv) > 1 and sys.argv[1] == "busy-producer":
        b, topic, parts, busy, seconds = sys.argv[2:7]
        with open(busy, "rb") as source:
            busy_records = pickle.load(source)
        print("producing", flush=True)
        produce_records(b, topic, int(parts), paced(busy_records, float(seconds)))
    else:
        main()
