"""Side-by-side benchmark: tierlog's metadata manager against Kafka's own TopicBasedRemoteLogMetadataManager.

Starts its own one-node Kafka (the pinned version) and feeds both managers the same logical events over 2,000 user
partitions and 50 metadata partitions: segment adds, copy-finished updates, and retention deletes of a share of them,
drawn so that `--live` segments are live at the end (bench/rlmm_materialize.live_history: tierlog's records
pre-encoded and produced by one process per core; Kafka's written by the Java harness through Kafka's own serde).
Each node runs in a fresh process, the two systems interleaved step by step: cold rebuild from the topic (tierlog
also from a compacted copy, and from a snapshot of a view a tierlog node built), restart, first lookup of each hosted
partition, lookup and write latency, RSS, and the time until a partition newly hosted on a running node (1,000
segments) is ready and answers. A node hosts `--hosted-fraction` of the user partitions (every k-th; the same set
for both); the other partitions' records stay in the topic, which tierlog applies to its view on disk. Kafka's
manager is driven through its public API by the Java harness in bench/tbrlmm. Last, lookups are timed again on both
while they apply records a producer process appends (other partitions' uploads): as fast as it can, then paced at
the same events/s for both. Prints one JSON document on stdout and Markdown tables of ratios (tierlog/TBRLMM), one
per hosted fraction, on stderr. `--tierlog-only` leaves TBRLMM and the compacted copy out (the 10M mode: TBRLMM
would need a 6+ GB heap).

Usage: python bench/rlmm_vs_kafka.py [--full] [--live N] [--hosted-fraction F[,F...]] [--rounds R] [--tierlog-only]
       [--markdown FILE]
(quick: 40k live segments, the `make bench-kafka` target; --full: 1M live segments, hosting 10% and all.)
"""

from __future__ import annotations

import argparse
import bisect
import io
import json
import logging
import multiprocessing
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
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import partial
from itertools import accumulate, zip_longest
from pathlib import Path
from typing import Any, TypeVar

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from rlmm_materialize import (  # noqa: E402
    SEGMENT_OFFSETS,
    LivePlan,
    SegmentEvent,
    ShardJob,
    ShardResult,
    check_fast_encoding,
    history,
    produce_records,
    rss_mib,
    tierlog_records,
    user_partitions,
    write_shard,
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
    resume_file,
)
from rlmm.bootstrap import snapshot_key  # noqa: E402
from rlmm.event_log import TopicSettings, check_topic  # noqa: E402
from rlmm.events import RecordKey  # noqa: E402
from rlmm.snapshot import snapshot_entries, write_view_snapshot  # noqa: E402
from rlmm.view import MetadataView  # noqa: E402
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
# A metadata topic with no record: a node on it shows the manager's RSS that no segment accounts for.
EMPTY_TOPIC = "bench-tierlog-empty"
COMPACTED_TOPIC = "bench-tierlog-compacted"
SNAPSHOT_LOCATION = "snapshots"
# The compacted copy rolls and cleans quickly so that it reaches its compacted size within the run.
COMPACTED_SEGMENT_MS = 4000
NODE_TIMEOUT_S = 1800.0
NEWCOMER_TIMEOUT_S = 120.0
COMPACTION_TIMEOUT_S = 300.0
BUSY_TIMEOUT_S = 300.0
T = TypeVar("T")


# --- the events both managers are fed ----------------------------------------------------------------------

def write_events_file(path: Path, tps: Sequence[TopicIdPartition], events: Iterable[SegmentEvent]) -> None:
    """The harness's input: the user partitions, then one line per logical event (see TbrlmmHarness)."""
    index = {tp: i for i, tp in enumerate(tps)}
    with path.open("w", encoding="ascii") as out:
        write_partition_lines(out, tps, "o" * len(tps))
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


def write_partition_lines(out: io.TextIOBase, tps: Sequence[TopicIdPartition], roles: str) -> None:
    """"P topic-id topic partition role" per user partition (h: hosted, n: newcomer, o: only in the topic)."""
    for tp, role in zip(tps, roles, strict=True):
        out.write(f"P {tp.topic_id} {tp.topic} {tp.partition} {role}\n")


@dataclass(frozen=True)
class Lookup:
    tp: int  # index among the plan's user partitions
    epoch: int
    offset: int


@dataclass(frozen=True)
class NodePlan:
    """What a node does, for both systems (a text file the harness reads too): the user partitions and each one's
    role, the first lookup of each hosted partition after start, the timed lookups, each newcomer's first lookup."""

    tps: list[TopicIdPartition]
    roles: str
    first: list[Lookup]
    lookups: list[Lookup]
    newcomers: list[Lookup]

    def hosted(self) -> list[TopicIdPartition]:
        return [tp for tp, role in zip(self.tps, self.roles, strict=True) if role == "h"]

    def write(self, path: Path) -> None:
        with path.open("w", encoding="ascii") as out:
            write_partition_lines(out, self.tps, self.roles)
            for kind, lookups in (("F", self.first), ("L", self.lookups), ("N", self.newcomers)):
                out.writelines(f"{kind} {x.tp} {x.epoch} {x.offset}\n" for x in lookups)

    @classmethod
    def read(cls, path: Path) -> NodePlan:
        tps: list[TopicIdPartition] = []
        roles: list[str] = []
        lookups: dict[str, list[Lookup]] = {"F": [], "L": [], "N": []}
        with path.open(encoding="ascii") as lines:
            for line in lines:
                f = line.split()
                if f[0] == "P":
                    tps.append(TopicIdPartition(uuid.UUID(f[1]), f[2], int(f[3])))
                    roles.append(f[4])
                else:
                    lookups[f[0]].append(Lookup(int(f[1]), int(f[2]), int(f[3])))
        return cls(tps, "".join(roles), lookups["F"], lookups["L"], lookups["N"])


def hosted_indices(count: int, fraction: float) -> list[int]:
    """Every k-th of `count` user partitions, k = round(1 / fraction): the share a node hosts (none for 0)."""
    if fraction <= 0:
        return []
    return list(range(0, count, max(1, round(1 / fraction))))


def node_plan(plan: LivePlan, users: int, hosted: Sequence[int], live: dict[int, tuple[array, array]],
              lookups: int, rng: random.Random) -> NodePlan:
    """The plan of a node hosting the user partitions `hosted` (of the first `users` of `plan`; the rest of `plan`
    are newcomers): lookups of uniformly drawn live segments of hosted partitions, at a random offset in each."""
    def target(i: int, k: int) -> Lookup:
        starts, epochs = live[i]
        return Lookup(i, epochs[k], starts[k] + int(rng.random() * (SEGMENT_OFFSETS - 1)))

    holding = [i for i in hosted if len(live[i][0])]
    first_order = holding[:]
    rng.shuffle(first_order)
    first = [target(i, rng.randrange(len(live[i][0]))) for i in first_order]
    cumulative = list(accumulate(len(live[i][0]) for i in holding))
    timed = []
    for _ in range(lookups if holding else 0):
        k = rng.randrange(cumulative[-1])
        at = bisect.bisect_right(cumulative, k)
        timed.append(target(holding[at], k - (cumulative[at - 1] if at else 0)))
    newcomer_indices = range(users, len(plan.tps))
    newcomers = [target(i, rng.randrange(len(live[i][0]))) for i in newcomer_indices]
    hosted_set = set(hosted)
    roles = "".join("h" if i in hosted_set else "n" if i >= users else "o" for i in range(len(plan.tps)))
    return NodePlan(plan.tps, roles, first, timed, newcomers)


# --- one tierlog node, in a process of its own -------------------------------------------------------------

def tierlog_node(bootstrap: str, topic: str, partitions: int, state_dir: str, plan_file: Path, writes: int,
                 seed: int, snapshots: str | None = None, newcomers: bool = False, busy: Sequence[BusyPhase] = ()
                 ) -> dict[str, Any]:
    """Start a manager on `state_dir`, register the plan's hosted partitions, wait until every one is ready, then
    time the first lookup of each, lookups and writes, and with `newcomers` the time until each newcomer partition,
    registered alone on the running node, is ready and answers its first lookup: the same steps, in the same order,
    as the harness's `node` command. With `snapshots` (a bucket location), an empty state dir bootstraps from the
    newest snapshot there, then tails the topic. With `busy` phases, lookups are then timed again while the applier
    applies each phase's records, appended by a producer process."""
    plan = NodePlan.read(plan_file)
    tps = plan.tps
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
    rss_before = rss_mib()
    started = time.perf_counter()
    manager = RemoteLogMetadataManager(config, snapshot_source=source)
    constructed_s = time.perf_counter() - started
    if snapshots is not None and not any(m.startswith("bootstrapped") for m in node_log.messages):
        manager.close()
        raise SystemExit(f"the node did not bootstrap from the snapshot: {node_log.messages}")
    try:
        hosted = {*plan.hosted(), write_target}
        manager.on_partition_leadership_changes(hosted, set())
        registered_s = time.perf_counter() - started
        deadline = time.monotonic() + NODE_TIMEOUT_S
        # One partition at a time, as the harness waits for TBRLMM (not every partition found ready again at each
        # poll: work on the node's cores that the harness does not do).
        for tp in hosted:
            while not manager.is_ready(tp):
                if time.monotonic() > deadline:
                    raise SystemExit("tierlog node did not get ready in time")
                time.sleep(0.002)
        ready_s = time.perf_counter() - started
        # A new node's hosted partitions may be ready before the rest of the view is loaded (MetadataApplier's
        # hosted partitions first): the figures below are taken once the node holds the whole view, as before.
        manager.wait_caught_up(NODE_TIMEOUT_S)
        caught_up_s = time.perf_counter() - started
        rss_after_ready = rss_mib()

        def lookup(x: Lookup) -> bool:
            return manager.remote_log_segment_metadata(tps[x.tp], x.epoch, x.offset) is not None

        # The first lookup of each hosted partition, while the node reads its hosted partitions into memory in the
        # background (lookup.warmup); one not read yet is answered from the view on disk.
        first_ns, first_hits = timed_each(lookup, plan.first)
        # Then until every hosted partition is in memory, as TBRLMM's are once it is ready: the lookups below
        # measure the steady state.
        while manager.partitions_loading():
            if time.monotonic() > deadline:
                raise SystemExit("tierlog node did not read its hosted partitions into memory in time")
            time.sleep(0.005)
        in_memory_s = time.perf_counter() - started
        # RSS once every hosted partition has been read: the state a node serving all of them reaches.
        rss_after_reads = rss_mib()
        lookup_ns = array("q")
        hits = 0
        for _round in range(2):  # the same warm-up round as the harness
            lookup_ns, hits = timed_each(lookup, plan.lookups)

        add_ns, finish_ns = [], []
        # Past what earlier steps uploaded, as a broker's copier goes on from the highest offset already remote in
        # the epoch: the same ranges uploaded again at every step would leave one epoch with ever more overwritten
        # segments, which no broker does and which every later checkpoint of it carries.
        base = (manager.highest_offset_for_epoch(write_target, 0) or -1) + 1
        for i in range(writes):
            start = base + i * 10_000
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
        newcomer_figures = newly_hosted(manager, tps, plan.newcomers) if newcomers else {}
        busy_figures: dict[str, Any] = {}
        for phase in busy:
            busy_figures |= lookups_while_busy(manager, plan, bootstrap, topic, partitions, phase)
        hosted_live = sum(len(manager.list_remote_log_segments(tp)) for tp in plan.hosted())
        rss_end = rss_mib()
    finally:
        manager.close()
    # Where the time to ready went: the manager's construction (the view's opening), then the registration (which
    # holds again the kept state of a restart, for up to rlmm.manager.RESUME_AT_ONCE_S), then the applier.
    return {**busy_figures, **newcomer_figures, "constructed_s": round(constructed_s, 3),
            "registered_s": round(registered_s, 3), "ready_s": round(ready_s, 3), "caught_up_s": round(caught_up_s, 3),
            "in_memory_s": round(in_memory_s, 3),
            "hosted_partitions": len(plan.hosted()), "hosted_live_segments": hosted_live,
            "first_lookups": len(first_ns), "first_lookup_hits": first_hits,
            "first_lookup_p50_us": _pct(first_ns, 0.5) / 1e3, "first_lookup_p99_us": _pct(first_ns, 0.99) / 1e3,
            "lookups": len(lookup_ns), "lookup_hits": hits, "lookup_p50_us": _pct(lookup_ns, 0.5) / 1e3,
            "lookup_p99_us": _pct(lookup_ns, 0.99) / 1e3,
            "writes": writes, "add_p50_ms": _pct(add_ns, 0.5) / 1e6, "add_p99_ms": _pct(add_ns, 0.99) / 1e6,
            "finish_p50_ms": _pct(finish_ns, 0.5) / 1e6, "finish_p99_ms": _pct(finish_ns, 0.99) / 1e6,
            "rss_before_mib": round(rss_before, 1), "rss_mib": round(rss_after_ready, 1),
            "rss_after_reads_mib": round(rss_after_reads, 1), "rss_end_mib": round(rss_end, 1),
            "log": node_log.messages}


def timed_each(call: Callable[[T], bool], items: Sequence[T]) -> tuple[array, int]:
    """Each call's nanoseconds, and how many answered True."""
    took = array("q", bytes(8 * len(items)))  # not a list: a million int objects would add allocation to what is timed
    hits = 0
    for i, item in enumerate(items):
        t0 = time.perf_counter_ns()
        hits += call(item)
        took[i] = time.perf_counter_ns() - t0
    return took, hits


def newly_hosted(manager: RemoteLogMetadataManager, tps: Sequence[TopicIdPartition], newcomers: Sequence[Lookup]
                 ) -> dict[str, Any]:
    """A partition newly hosted on the running node (leadership or a reassignment moved it here), one at a time:
    from its registration until it is ready, and until its first lookup answers."""
    ready_ns, answer_ns = [], []
    hits = 0
    for x in newcomers:
        tp = tps[x.tp]
        deadline = time.monotonic() + NEWCOMER_TIMEOUT_S
        t0 = time.perf_counter_ns()
        manager.on_partition_leadership_changes({tp}, set())
        while not manager.is_ready(tp):
            if time.monotonic() > deadline:
                raise SystemExit(f"newcomer {tp} did not get ready within {NEWCOMER_TIMEOUT_S} s")
            time.sleep(0.0001)
        ready_ns.append(time.perf_counter_ns() - t0)
        hits += manager.remote_log_segment_metadata(tp, x.epoch, x.offset) is not None
        answer_ns.append(time.perf_counter_ns() - t0)
    return {"newcomers": len(newcomers), "newcomer_hits": hits,
            "newcomer_ready_p50_ms": _pct(ready_ns, 0.5) / 1e6, "newcomer_ready_p99_ms": _pct(ready_ns, 0.99) / 1e6,
            "newcomer_answer_p50_ms": _pct(answer_ns, 0.5) / 1e6,
            "newcomer_answer_p99_ms": _pct(answer_ns, 0.99) / 1e6}


def lookups_while_busy(manager: RemoteLogMetadataManager, plan: NodePlan, bootstrap: str, topic: str, partitions: int,
                       busy: BusyPhase) -> dict[str, Any]:
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
                x = plan.lookups[len(busy_ns) % len(plan.lookups)]
                t0 = time.perf_counter_ns()
                manager.remote_log_segment_metadata(plan.tps[x.tp], x.epoch, x.offset)
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


def snapshot_from_archive(bootstrap: str, location: str, partitions: int) -> dict[str, Any]:
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
    return {"from": "archive", "archive_s": round(archived - started, 2),
            "snapshot_write_s": round(time.perf_counter() - archived, 2),
            "snapshot_bytes": size, "location": location}


def snapshot_from_view(bootstrap: str, location: str, partitions: int, state_dir: Path, caught_up_ms: int
                       ) -> dict[str, Any]:
    """Write the view a tierlog node built in `state_dir` (closed, and caught up with the topic at `caught_up_ms`)
    as a snapshot, as a node of a cluster can: its entries, applied offsets and digest, filed under the topic's id
    like the audit's snapshots."""
    store = open_bench_store(location)
    started = time.perf_counter()
    topic_id = check_topic(AdminClient({"bootstrap.servers": bootstrap}), UNCOMPACTED_TOPIC, partitions, 60).topic_id
    view = MetadataView.open(state_dir, read_only=True)
    buffer = io.BytesIO()
    try:
        write_view_snapshot(buffer, UNCOMPACTED_TOPIC, snapshot_entries(view), view.applied_offsets(UNCOMPACTED_TOPIC),
                            view.digest(), topic_id, caught_up_ms)
    finally:
        view.close()
    data = buffer.getvalue()
    store.put(snapshot_key(SNAPSHOT_LOCATION, UNCOMPACTED_TOPIC, topic_id, caught_up_ms, data), data)
    return {"from": "view", "snapshot_write_s": round(time.perf_counter() - started, 2), "snapshot_bytes": len(data),
            "location": location}


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


def create_tierlog_topics(bootstrap: str, partitions: int, compacted: bool) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # The project's defaults (seven days of uncompacted history), and a copy that compacts at once.
    topics = [TopicSettings(name, partitions, 1, 1, 7 * 24 * 3600 * 1000, {}) for name in (UNCOMPACTED_TOPIC,
                                                                                           EMPTY_TOPIC)]
    if compacted:
        topics.append(TopicSettings(COMPACTED_TOPIC, partitions, 1, 1, 0,
                                    {"min.cleanable.dirty.ratio": "0.01", "segment.bytes": str(1 << 20)},
                                    delete_retention_ms=0, segment_ms=COMPACTED_SEGMENT_MS))
    futures = admin.create_topics([NewTopic(s.name, s.partitions, s.replication_factor, config=s.configs())
                                   for s in topics])
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
    parser.add_argument("--full", action="store_true",
                        help="1M live segments, hosting 10%% and all (instead of the quick 40k, hosting all)")
    parser.add_argument("--live", type=int, default=None, help="segments live at the end of the history")
    parser.add_argument("--deleted-share", type=float, default=0.1,
                        help="segments retention deleted before the end, as a share of the live ones")
    parser.add_argument("--hosted-fraction", default=None,
                        help="share(s) of the user partitions a node hosts, comma-separated (quick 1, full 0.1,1)")
    parser.add_argument("--tierlog-only", action="store_true",
                        help="leave TBRLMM and the compacted copy out (the 10M mode)")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds per hosted fraction")
    parser.add_argument("--user-partitions", type=int, default=2000)
    parser.add_argument("--partitions", type=int, default=50, help="metadata topic partitions")
    parser.add_argument("--lookups", type=int, default=20_000)
    parser.add_argument("--writes", type=int, default=100)
    parser.add_argument("--newcomers", type=int, default=20,
                        help="partitions registered one at a time on a restarted node (0: no such step)")
    parser.add_argument("--newcomer-segments", type=int, default=1000, help="live segments of each newcomer")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--busy-events", type=int, default=100_000,
                        help="logical events the applier applies while lookups are timed again (0: no such step)")
    parser.add_argument("--paced-events", type=int, default=10_000,
                        help="logical events appended at --paced-rate while lookups are timed (0: no such step)")
    parser.add_argument("--paced-rate", type=float, default=2_000.0,
                        help="events/s of the paced step: the same for both systems (TBRLMM applies ~8k/s at most)")
    parser.add_argument("--snapshot-from", choices=("view", "archive"), default="view",
                        help="write the snapshot from a tierlog node's view, or archive the topic and fold it")
    parser.add_argument("--tbrlmm-heap", default="4g", help="the harness JVM's -Xmx (TBRLMM holds ~600 MiB at 1M)")
    parser.add_argument("--shards", type=int, default=os.cpu_count() or 2, help="producer processes of the history")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the ratio tables to this file")
    args = parser.parse_args(argv)
    if args.paced_rate <= 0:
        parser.error("--paced-rate must be above 0 (--paced-events 0 leaves the paced step out)")
    args.live = args.live or (1_000_000 if args.full else 40_000)
    fractions = [float(f) for f in (args.hosted_fraction or ("0.1,1" if args.full else "1")).split(",")]
    if not all(0 < f <= 1 for f in fractions):
        parser.error("--hosted-fraction: each share must be above 0 and at most 1")
    if args.tierlog_only:
        args.busy_events = args.paced_events = 0

    classpath = "" if args.tierlog_only else build_harness()
    work = Path(tempfile.mkdtemp(prefix="bench-rlmm-vs-kafka-"))
    try:
        result = _run(args, fractions, classpath, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = "\n\n".join(ratio_table(result, fraction) for fraction in result["by_fraction"])
    print(json.dumps(result, indent=2))
    print(table, file=sys.stderr)
    if args.markdown:
        args.markdown.write_text(table + "\n", encoding="utf-8")


def generate(args: argparse.Namespace, plan: LivePlan, bootstrap: str, topics: tuple[str, ...], work: Path,
             wanted: frozenset[int]) -> tuple[list[ShardResult], list[Path]]:
    """Produce the plan's history to `topics`, one process per shard, each writing its share of the harness's
    events file too (unless tierlog runs alone)."""
    files = [work / f"events-{shard}.txt" for shard in range(args.shards)]
    jobs = [ShardJob(plan, bootstrap, topics, args.partitions, args.shards, shard, args.seed,
                     None if args.tierlog_only else files[shard], wanted) for shard in range(args.shards)]
    with ProcessPoolExecutor(args.shards, mp_context=multiprocessing.get_context("spawn")) as pool:
        return list(pool.map(write_shard, jobs)), files


def _run(args: argparse.Namespace, fractions: list[float], classpath: str, work: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    tps = user_partitions(args.user_partitions, rng)
    newcomer_tps = [TopicIdPartition(uuid.UUID(int=rng.getrandbits(128)), f"newcomer{i}", i)
                    for i in range(args.newcomers)]
    plan = LivePlan.spread(tps, args.live, args.deleted_share).extended(newcomer_tps, args.newcomer_segments)
    check_fast_encoding(plan)
    live_total, deleted = sum(plan.live), sum(plan.deleted)
    events = 2 * (live_total + deleted) + 2 * deleted
    compacted = not args.tierlog_only
    result: dict[str, Any] = {
        "benchmark": "rlmm_vs_kafka", "mode": "tierlog-only" if args.tierlog_only else "side-by-side",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "kafka": kafka_version(), "load_avg_at_start": os.getloadavg()},
        "live_segments": live_total, "newcomer_segments": args.newcomers * args.newcomer_segments,
        "segments_created": live_total + deleted, "segments_deleted": deleted, "logical_events": events,
        "user_partitions": args.user_partitions, "metadata_partitions": args.partitions, "rounds": args.rounds,
        "hosted_fractions": fractions, "paced_rate": args.paced_rate,
    }
    stages: dict[str, float] = {}
    result["stage_s"] = stages
    java = [java_executable(), f"-Xmx{args.tbrlmm_heap}", "-XX:+UseSerialGC", "-cp", classpath, HARNESS_MAIN]
    newcomer_indices = range(args.user_partitions, len(plan.tps))
    hosted_by_fraction = {f: hosted_indices(args.user_partitions, f) for f in fractions}
    wanted = frozenset({i for hosted in hosted_by_fraction.values() for i in hosted} | set(newcomer_indices))
    with KafkaCluster(work / "kafka", heap="768m", properties={"log.cleaner.backoff.ms": 500}) as cluster:
        bootstrap = cluster.bootstrap
        create_tierlog_topics(bootstrap, args.partitions, compacted)
        stage = _Stages(stages)
        with stage("generate_and_produce_tierlog"):
            shards, shard_files = generate(args, plan, bootstrap, (UNCOMPACTED_TOPIC, COMPACTED_TOPIC)[:1 + compacted],
                                           work, wanted)
        result["tierlog_records"] = sum(r.records for r in shards)
        if sum(r.events for r in shards) != events:
            raise SystemExit(f"the history has {sum(r.events for r in shards)} events, the plan {events}")
        live = {i: figures for r in shards for i, figures in r.live.items()}
        partitions_file = work / "partitions.txt"
        with partitions_file.open("w", encoding="ascii") as out:
            write_partition_lines(out, plan.tps, "o" * len(plan.tps))
        result["topic_bytes"] = {"tierlog_uncompacted": topic_bytes(cluster, UNCOMPACTED_TOPIC)}
        if not args.tierlog_only:
            with stage("produce_tbrlmm"):
                run_json([*java, "produce", bootstrap, str(args.partitions), "0", str(partitions_file),
                          *map(str, shard_files)])
            result["topic_bytes"]["tbrlmm"] = topic_bytes(cluster, TBRLMM_TOPIC)
            with stage("compaction"):
                result["topic_bytes"]["tierlog_compacted"] = wait_compacted(cluster, args.partitions)
        for file in shard_files:
            file.unlink(missing_ok=True)
        plans: dict[float, Path] = {}
        for fraction in [*fractions, 0.0]:
            plans[fraction] = work / f"plan-{fraction}.txt"
            node_plan(plan, args.user_partitions, hosted_indices(args.user_partitions, fraction), live, args.lookups,
                      random.Random(f"{args.seed}-{fraction}")).write(plans[fraction])
        location = snapshot_location(work)
        closed_ms: dict[Path, int] = {}
        try:
            if args.snapshot_from == "archive":
                with stage("snapshot_from_archive"):
                    result["snapshot"] = snapshot_from_archive(bootstrap, location, args.partitions)

            def tierlog(topic: str, state_dir: Path, fraction: float, snapshots: str = "-", newcomers: bool = False,
                        *busy: str) -> dict[str, Any]:
                answer = run_json([sys.executable, __file__, "tierlog-node", bootstrap, topic, str(args.partitions),
                                   str(state_dir), str(plans[fraction]), str(args.writes), str(args.seed), snapshots,
                                   str(int(newcomers)), *busy])
                closed_ms[state_dir] = int(time.time() * 1000)
                # The view, and apart from it what the node kept of its hosted partitions when it closed
                # (rlmm.resume_file: until its next start takes it).
                kept = state_dir / "view" / resume_file.FILE_NAME
                answer["kept_state_bytes"] = kept.stat().st_size if kept.exists() else 0
                answer["state_dir_bytes"] = dir_bytes(state_dir) - answer["kept_state_bytes"]
                return answer

            def from_snapshot(state_dir: Path, fraction: float) -> dict[str, Any]:
                if "snapshot" not in result:  # from the first node's view, caught up with the topic when it closed
                    built = work / f"tierlog-{fractions[0]}-0"
                    with stage("snapshot_from_view"):
                        result["snapshot"] = snapshot_from_view(bootstrap, location, args.partitions, built,
                                                                closed_ms[built])
                return tierlog(UNCOMPACTED_TOPIC, state_dir, fraction, location)

            def tbrlmm(log_dir: Path, fraction: float, newcomers: bool = False, *busy: str) -> dict[str, Any]:
                return run_json([*java, "node", str(plans[fraction]), bootstrap, str(args.partitions), str(log_dir),
                                 str(args.writes), str(args.seed), str(int(newcomers)), *busy])

            by_fraction: dict[str, Any] = {}
            for fraction in fractions:
                runs: list[dict[str, Any]] = []
                for r in range(args.rounds):
                    d = f"{fraction}-{r}"
                    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                        ("tierlog_cold", partial(tierlog, UNCOMPACTED_TOPIC, work / f"tierlog-{d}", fraction)),
                        ("tierlog_restart", partial(tierlog, UNCOMPACTED_TOPIC, work / f"tierlog-{d}", fraction, "-",
                                                    True)),
                        ("tierlog_cold_compacted", partial(tierlog, COMPACTED_TOPIC, work / f"tierlog-c-{d}",
                                                           fraction)),
                        ("snapshot_bootstrap", partial(from_snapshot, work / f"tierlog-s-{d}", fraction)),
                    ]
                    kafka_steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
                        ("tbrlmm_cold", partial(tbrlmm, work / f"tbrlmm-{d}", fraction)),
                        ("tbrlmm_restart", partial(tbrlmm, work / f"tbrlmm-{d}", fraction, True)),
                    ]
                    if args.tierlog_only:
                        steps, kafka_steps = [step for step in steps if step[0] != "tierlog_cold_compacted"], []
                    if fraction == fractions[0] and r == 0:
                        # Nothing hosted: what the view costs in RAM for partitions the node does not host, and
                        # what a manager costs with no segment at all.
                        steps.append(("tierlog_restart_unhosted", partial(
                            tierlog, UNCOMPACTED_TOPIC, work / f"tierlog-{d}", 0.0)))
                        steps.append(("tierlog_cold_unhosted", partial(
                            tierlog, UNCOMPACTED_TOPIC, work / "tierlog-unhosted", 0.0)))
                        steps.append(("tierlog_empty", partial(tierlog, EMPTY_TOPIC, work / "tierlog-empty", 0.0)))
                    # Alternate the systems step by step, and which goes first from round to round, so that load
                    # from the rest of the machine falls on both alike.
                    first, second = (steps, kafka_steps) if r % 2 == 0 else (kafka_steps, steps)
                    ordered = [step for pair in zip_longest(first, second) for step in pair if step is not None]
                    measured: dict[str, Any] = {"round": r}
                    for name, step in ordered:
                        print(f"hosting {fraction:g}, round {r}: {name}", file=sys.stderr, flush=True)
                        # What earlier steps wrote (the topics produced, the state dirs kept for later steps) is on
                        # disk before a step starts: the kernel's write-back of it would fall on whichever step runs
                        # next (the first steps after producing the topics were the slowest of their kind).
                        os.sync()
                        with stage(f"{name}@{fraction:g}#{r}"):
                            measured[name] = step()
                        # The step's figures as they come, so that a run stopped early still tells them.
                        print(json.dumps({k: v for k, v in measured[name].items() if isinstance(v, (int, float))}),
                              file=sys.stderr, flush=True)
                    runs.append(measured)
                by_fraction[f"{fraction:g}"] = {"runs": runs, "median": medians(runs, events)}
            # Last, on the first round's restarted nodes (the records appended would make later steps' topics
            # longer): lookups while records of other partitions arrive, at full speed, then paced.
            ours, theirs = [], []
            for name, count, seconds in (("busy", args.busy_events, 0.0),
                                         ("paced", args.paced_events, args.paced_events / args.paced_rate)):
                if count:
                    busy_records, busy_events = write_busy_events(work, name, count, args.seed, 20)
                    ours.append(BusyPhase(busy_records, seconds).arg())
                    theirs.append(BusyPhase(busy_events, seconds).arg())
            if ours:
                d = f"{fractions[0]}-0"
                print("lookups while the applier is busy: tierlog", file=sys.stderr, flush=True)
                busy = {"tierlog": tierlog(UNCOMPACTED_TOPIC, work / f"tierlog-{d}", fractions[0], "-", False, *ours)}
                print("lookups while the applier is busy: tbrlmm", file=sys.stderr, flush=True)
                busy["tbrlmm"] = tbrlmm(work / f"tbrlmm-{d}", fractions[0], False, *theirs)
                by_fraction[f"{fractions[0]:g}"]["busy"] = busy
        finally:
            remove_location(location)
    result["by_fraction"] = by_fraction
    derive_per_segment(result)
    return result


class _Stages:
    """Times each stage of the run into `into` (seconds), and says on stderr when each starts."""

    def __init__(self, into: dict[str, float]) -> None:
        self.into = into

    def __call__(self, name: str) -> _Stage:
        return _Stage(self.into, name)


class _Stage:
    def __init__(self, into: dict[str, float], name: str) -> None:
        self.into, self.name = into, name

    def __enter__(self) -> None:
        print(f"{time.strftime('%H:%M:%S')} {self.name}", file=sys.stderr, flush=True)
        self.started = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self.into[self.name] = round(time.perf_counter() - self.started, 2)


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def medians(runs: list[dict[str, Any]], events: int) -> dict[str, dict[str, float]]:
    """Per step, the median of every numeric figure over the rounds (a step run in one round only: its figures),
    plus events/s for the ready time."""
    out: dict[str, dict[str, float]] = {}
    for step in {k for run in runs for k in run if k != "round"}:
        taken = [run[step] for run in runs if step in run]
        figures = {k for k, v in taken[0].items() if isinstance(v, (int, float))}
        out[step] = {k: round(statistics.median(t[k] for t in taken), 3) for k in sorted(figures)}
        out[step]["events_per_s"] = round(events / out[step]["ready_s"])
    return out


def derive_per_segment(result: dict[str, Any]) -> None:
    """RSS per hosted and per non-hosted live segment (bytes). A node's RSS less its RSS before the manager started,
    less what a manager on a topic with no record grew by (`tierlog_empty`: its clients, threads and empty view,
    which no segment accounts for), is taken as hosted * h + (live - hosted) * n. n comes from a node on the same
    topic that hosts nothing, restarted and rebuilt cold. TBRLMM holds only what it hosts: its figure is (RSS - RSS
    before) / hosted. The view's bytes on disk per live segment: the cold node's state dir."""
    live = result["live_segments"] + result["newcomer_segments"]
    by_fraction = result["by_fraction"]
    first = by_fraction[f"{result['hosted_fractions'][0]:g}"]["median"]

    def growth(step: dict[str, float], after_reads: bool) -> float:
        return (step["rss_after_reads_mib" if after_reads else "rss_mib"] - step["rss_before_mib"]) * 2**20

    fixed = growth(first["tierlog_empty"], False) if "tierlog_empty" in first else 0.0

    def grown(step: dict[str, float], after_reads: bool = True) -> float:
        return growth(step, after_reads) - fixed

    # kind -> (the hosted step, RSS growth per non-hosted segment)
    per_other: dict[str, tuple[str, float]] = {}
    for kind in ("restart", "cold"):
        if f"tierlog_{kind}_unhosted" in first:
            per_other[kind] = (f"tierlog_{kind}", grown(first[f"tierlog_{kind}_unhosted"], False) / live)
    for entry in by_fraction.values():
        m = entry["median"]
        derived: dict[str, float] = {}
        for kind, (hosted_step, other) in per_other.items():
            derived[f"tierlog_{kind}_rss_per_nonhosted_segment_b"] = round(other, 1)
            step = m[hosted_step]
            hosted = step["hosted_live_segments"]
            if hosted:
                derived[f"tierlog_{kind}_rss_per_hosted_segment_b"] = round(
                    (grown(step) - other * (live - hosted)) / hosted, 1)
        for kind in ("cold", "restart"):
            step = m.get(f"tbrlmm_{kind}")
            if step and step["hosted_live_segments"]:
                derived[f"tbrlmm_{kind}_rss_per_hosted_segment_b"] = round(
                    growth(step, False) / step["hosted_live_segments"], 1)
                derived[f"tbrlmm_{kind}_heap_per_hosted_segment_b"] = round(
                    step["heap_used_mib"] * 2**20 / step["hosted_live_segments"], 1)
        derived["tierlog_view_bytes_per_live_segment"] = round(m["tierlog_cold"]["state_dir_bytes"] / live, 1)
        if m["tierlog_cold"]["hosted_live_segments"]:
            derived["tierlog_kept_bytes_per_hosted_segment"] = round(
                m["tierlog_cold"]["kept_state_bytes"] / m["tierlog_cold"]["hosted_live_segments"], 1)
        derived["tierlog_fixed_rss_mib"] = round(fixed / 2**20, 1)
        entry["derived"] = derived


def ratio_table(result: dict[str, Any], fraction: str) -> str:
    entry = result["by_fraction"][fraction]
    m, derived = entry["median"], entry["derived"]
    t, tr, s = m["tierlog_cold"], m["tierlog_restart"], m["snapshot_bootstrap"]
    k, kr = m.get("tbrlmm_cold", {}), m.get("tbrlmm_restart", {})
    sizes = result["topic_bytes"]
    rows: list[tuple[str, float, float | None, str, str]] = []

    def row(name: str, ours: float, theirs: float | None, better: str, fmt: str) -> None:
        rows.append((name, ours, theirs, better, fmt))

    row("cold rebuild, uncompacted topic (events/s)", t["events_per_s"], k.get("events_per_s"), "higher", "{:,.0f}")
    if "tierlog_cold_compacted" in m:
        row("cold rebuild, compacted topic (events/s; TBRLMM: its only topic)",
            m["tierlog_cold_compacted"]["events_per_s"], k.get("events_per_s"), "higher", "{:,.0f}")
    row("bootstrap from snapshot + tail (events/s)", s["events_per_s"], k.get("events_per_s"), "higher", "{:,.0f}")
    row("cold rebuild to ready (s)", t["ready_s"], k.get("ready_s"), "lower", "{:.1f}")
    row("cold rebuild to the whole view loaded (s; TBRLMM: to ready)", t["caught_up_s"], k.get("ready_s"), "lower",
        "{:.1f}")
    if "tierlog_cold_compacted" in m:
        row("cold rebuild, compacted topic, to ready (s)", m["tierlog_cold_compacted"]["ready_s"], k.get("ready_s"),
            "lower", "{:.1f}")
        row("cold rebuild, compacted topic, to the whole view loaded (s; TBRLMM: to ready)",
            m["tierlog_cold_compacted"]["caught_up_s"], k.get("ready_s"), "lower", "{:.1f}")
    row("bootstrap from snapshot + tail to ready (s)", s["ready_s"], k.get("ready_s"), "lower", "{:.1f}")
    row("restart to ready (s)", tr["ready_s"], kr.get("ready_s"), "lower", "{:.2f}")
    row("restart to every hosted partition in memory (s; TBRLMM: to ready)", tr["in_memory_s"], kr.get("ready_s"),
        "lower", "{:.2f}")
    row("first lookup of each hosted partition after restart, p50 (µs)", tr["first_lookup_p50_us"],
        kr.get("first_lookup_p50_us"), "lower", "{:.1f}")
    row("first lookup of each hosted partition after restart, p99 (µs)", tr["first_lookup_p99_us"],
        kr.get("first_lookup_p99_us"), "lower", "{:.1f}")
    row("lookup p50 (µs)", t["lookup_p50_us"], k.get("lookup_p50_us"), "lower", "{:.1f}")
    row("lookup p99 (µs)", t["lookup_p99_us"], k.get("lookup_p99_us"), "lower", "{:.1f}")
    if "busy" in entry:
        ours, theirs = entry["busy"]["tierlog"], entry["busy"]["tbrlmm"]
        paced = (f" arriving at {result['paced_rate']:,.0f}/s" if "paced_records" in theirs else "")
        for p, how in (("busy", " at full speed"), ("paced", paced)):
            if f"{p}_records" in theirs:
                for q in ("p50", "p99"):
                    row(f"lookup {q} while {theirs[f'{p}_records']:,} events of other partitions are applied{how} (µs)",
                        ours[f"{p}_lookup_{q}_us"], theirs[f"{p}_lookup_{q}_us"], "lower", "{:.1f}")
    if "newcomer_ready_p99_ms" in tr:
        row(f"newly hosted partition ({int(result['newcomer_segments'] // max(1, tr['newcomers'])):,} segments) "
            "to ready, p99 (ms)", tr["newcomer_ready_p99_ms"], kr.get("newcomer_ready_p99_ms"), "lower", "{:.1f}")
        row("newly hosted partition to its first answer, p50 (ms)", tr["newcomer_answer_p50_ms"],
            kr.get("newcomer_answer_p50_ms"), "lower", "{:.1f}")
        row("newly hosted partition to its first answer, p99 (ms)", tr["newcomer_answer_p99_ms"],
            kr.get("newcomer_answer_p99_ms"), "lower", "{:.1f}")
    row("write: add p50 (ms)", t["add_p50_ms"], k.get("add_p50_ms"), "lower", "{:.2f}")
    row("write: copy finished p50 (ms)", t["finish_p50_ms"], k.get("finish_p50_ms"), "lower", "{:.2f}")
    row("RSS after cold rebuild (MiB)", t["rss_mib"], k.get("rss_mib"), "lower", "{:.0f}")
    row("RSS after restart (MiB)", tr["rss_mib"], kr.get("rss_mib"), "lower", "{:.0f}")
    row("RSS after cold rebuild, every hosted partition read (MiB)", t["rss_after_reads_mib"], k.get("rss_mib"),
        "lower", "{:.0f}")
    row("RSS after restart, every hosted partition read (MiB)", tr["rss_after_reads_mib"], kr.get("rss_mib"),
        "lower", "{:.0f}")
    for kind, label in (("cold", "cold rebuild"), ("restart", "restart")):
        if f"tierlog_{kind}_rss_per_hosted_segment_b" in derived:
            row(f"RSS per hosted live segment after {label}, every one read (bytes)",
                derived[f"tierlog_{kind}_rss_per_hosted_segment_b"],
                derived.get(f"tbrlmm_{kind}_rss_per_hosted_segment_b"), "lower", "{:,.0f}")
        if f"tierlog_{kind}_rss_per_nonhosted_segment_b" in derived:
            row(f"RSS per non-hosted live segment after {label} (bytes; TBRLMM holds none)",
                derived[f"tierlog_{kind}_rss_per_nonhosted_segment_b"], None, "lower", "{:,.1f}")
    if derived.get("tierlog_fixed_rss_mib"):
        row("RSS a manager on a topic with no record grew by (MiB; left out of the per-segment figures)",
            derived["tierlog_fixed_rss_mib"], None, "lower", "{:.1f}")
    if "tbrlmm_cold_heap_per_hosted_segment_b" in derived:
        row("TBRLMM heap after GC per hosted live segment (bytes)", derived["tbrlmm_cold_heap_per_hosted_segment_b"],
            None, "-", "{:,.0f}")
    row("view bytes on disk per live segment (tierlog's state dir)", derived["tierlog_view_bytes_per_live_segment"],
        None, "lower", "{:,.0f}")
    if "tierlog_kept_bytes_per_hosted_segment" in derived:
        row("hosted state kept on disk for the next start, per hosted live segment (bytes)",
            derived["tierlog_kept_bytes_per_hosted_segment"], None, "lower", "{:,.0f}")
    row("snapshot bytes per live segment", result["snapshot"]["snapshot_bytes"]
        / (result["live_segments"] + result["newcomer_segments"]), None, "lower", "{:,.1f}")
    row("metadata topic bytes, uncompacted (MB)", sizes["tierlog_uncompacted"] / 1e6, sizes.get("tbrlmm", 0) / 1e6
        or None, "lower", "{:.1f}")
    if "tierlog_compacted" in sizes:
        row("metadata topic bytes, compacted (MB)", sizes["tierlog_compacted"] / 1e6, sizes["tbrlmm"] / 1e6, "lower",
            "{:.1f}")
    machine = result["machine"]
    hosted = int(t["hosted_partitions"])  # a median of rounds is a float
    lines = [f"{result['live_segments']:,} live segments ({result['segments_created']:,} created, "
             f"{result['segments_deleted']:,} deleted: {result['logical_events']:,} logical events, "
             f"{result['tierlog_records']:,} tierlog records) over {result['user_partitions']:,} user partitions "
             f"and {result['metadata_partitions']} metadata partitions, the node hosting {hosted:,} of them "
             f"({float(fraction):.0%}); Kafka {machine['kafka']}, {machine['cpus']} cores, median of "
             f"{result['rounds']} interleaved round(s).", "",
             "| figure | tierlog | TBRLMM | tierlog/TBRLMM | better |", "|---|---|---|---|---|"]
    for name, ours, theirs, better, fmt in rows:
        ratio = f"{ours / theirs:.2f}" if theirs else "—"
        lines.append(f"| {name} | {fmt.format(ours)} | {'—' if theirs is None else fmt.format(theirs)} | {ratio} "
                     f"| {better} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "tierlog-node":
        b, topic, parts, state, plan_path, writes, seed, snapshots, newcomers = sys.argv[2:11]
        print(json.dumps(tierlog_node(b, topic, int(parts), state, Path(plan_path), int(writes), int(seed),
                                      None if snapshots == "-" else snapshots, newcomers == "1",
                                      [BusyPhase.parse(phase) for phase in sys.argv[11:]])))
    elif len(sys.argv) > 1 and sys.argv[1] == "busy-producer":
        b, topic, parts, busy, seconds = sys.argv[2:7]
        with open(busy, "rb") as source:
            busy_records = pickle.load(source)
        print("producing", flush=True)
        produce_records(b, topic, int(parts), paced(busy_records, float(seconds)))
    else:
        main()
