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
import itertools
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from array import array
from collections import deque
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


# --- a history of N live segments, generated fast --------------------------------------------------------------
# At a million live segments the objects above cost minutes: this path draws the same kind of history as plain
# values, encodes tierlog's records with a hand-written Avro encoder (checked byte for byte against rlmm.codec on the
# first events, see check_fast_encoding) and writes the harness's event lines beside them.

_SEGMENT_VERSION = codec.registry().current["segment_record"]
# The version a writer uses for checkpoints without overwritten segments (all of the bench's).
_CHECKPOINT_VERSION = codec.registry().version("epoch_checkpoint_record", codec.PLAIN_CHECKPOINT_VERSION)
_SEGMENT_HEAD = codec.MAGIC + _SEGMENT_VERSION.fingerprint[::-1]
_CHECKPOINT_HEAD = codec.MAGIC + _CHECKPOINT_VERSION.fingerprint[::-1]
FINISHED_CUSTOM = b"\x00" * 24


def _long(n: int) -> bytes:
    """Avro's zig-zag varint of an int or long."""
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _string(text: str) -> bytes:
    data = text.encode()
    return _long(len(data)) + data


_FINISHED_UNION = b"\x02" + _long(len(FINISHED_CUSTOM)) + FINISHED_CUSTOM  # the union's branch 1 (bytes)


@dataclass(frozen=True, slots=True)
class RawSegment:
    """A segment of a generated history as plain values (its one leader epoch starts at its start offset)."""

    tp_index: int
    segment_id: str
    start: int
    epoch: int
    timestamp_ms: int
    broker_id: int
    size: int
    txn_idx_empty: bool

    @property
    def end(self) -> int:
        return self.start + SEGMENT_OFFSETS - 1


class FastEncoder:
    """tierlog's records (key, value) of a generated history's events, as `tierlog_records` makes them."""

    def __init__(self, tps: list[TopicIdPartition]) -> None:
        self.tps = tps
        self._prefix = [_string(str(tp.topic_id)) + _string(tp.topic) + _long(tp.partition) for tp in tps]
        self._key = [f"{tp.topic_id}:{tp.partition}" for tp in tps]

    def records(self, seg: RawSegment, states: tuple[RemoteLogSegmentState, ...]) -> list[tuple[bytes, bytes | None]]:
        """The records of events that left `seg` in each of `states` in turn: its full state after each (the add
        as its upload started, every update with the update's time, +1 ms, and broker 1, as `_updated` makes them),
        a lineage checkpoint after a finished copy (its epoch now ends at the segment's end), a tombstone after the
        delete finished."""
        key = f"segment:{self._key[seg.tp_index]}:{seg.segment_id}".encode()
        start, epoch, updated_ms = _long(seg.start), _long(seg.epoch), _long(seg.timestamp_ms + 1)
        end = _long(seg.end)
        head = b"".join((_SEGMENT_HEAD, self._prefix[seg.tp_index], _string(seg.segment_id), start, end,
                         _long(seg.timestamp_ms)))
        tail = b"".join((_long(seg.size), b"\x02", epoch, start, b"\x00"))
        txn = b"\x01" if seg.txn_idx_empty else b"\x00"
        out: list[tuple[bytes, bytes | None]] = []
        for state in states:
            if state is S.COPY_SEGMENT_STARTED:
                out.append((key, b"".join((head, _long(seg.broker_id), _long(seg.timestamp_ms), tail, b"\x00\x00",
                                           txn))))
                continue
            custom = _FINISHED_UNION if state is S.COPY_SEGMENT_FINISHED else b"\x00"
            out.append((key, b"".join((head, b"\x02", updated_ms, tail, custom, bytes((2 * int(state),)), txn))))
            if state is S.COPY_SEGMENT_FINISHED:
                out.append((f"epochs:{self._key[seg.tp_index]}:{seg.epoch}".encode(), b"".join((
                    _CHECKPOINT_HEAD, self._prefix[seg.tp_index], b"\x02", epoch, b"\x02", end, b"\x00\x00",
                    updated_ms, b"\x00\x00\x00"))))
            elif state is S.DELETE_SEGMENT_FINISHED:
                out.append((key, None))
        return out


@dataclass(frozen=True)
class LivePlan:
    """Per user partition of `tps`: the segments live at the end of the history, and those retention deleted."""

    tps: list[TopicIdPartition]
    live: list[int]
    deleted: list[int]

    @classmethod
    def spread(cls, tps: list[TopicIdPartition], live_total: int, deleted_share: float) -> LivePlan:
        """`live_total` live segments spread evenly over `tps`, and `deleted_share` as many again deleted."""
        base, extra = divmod(live_total, len(tps))
        live = [base + (i < extra) for i in range(len(tps))]
        return cls(tps, live, [round(n * deleted_share) for n in live])

    def extended(self, tps: list[TopicIdPartition], live_each: int) -> LivePlan:
        """This plan plus `tps`, each with `live_each` live segments and none deleted."""
        return LivePlan([*self.tps, *tps], [*self.live, *[live_each] * len(tps)], [*self.deleted, *[0] * len(tps)])

    def shard(self, partitions: int, shards: int, shard: int) -> list[int]:
        """The indices of the user partitions whose metadata partition falls to `shard` of `shards`."""
        return [i for i, tp in enumerate(self.tps)
                if metadata_partition_for(tp.topic_id, tp.partition, partitions) % shards == shard]


_UPLOAD = (S.COPY_SEGMENT_STARTED, S.COPY_SEGMENT_FINISHED)
_DELETE = (S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED)


def live_history(plan: LivePlan, indices: list[int], rng: random.Random,
                 live_out: dict[int, list[RawSegment]] | None = None
                 ) -> Iterator[tuple[RawSegment, tuple[RemoteLogSegmentState, ...]]]:
    """The events of the user partitions `indices` of `plan`, as `history` draws them (uploads in random order across
    partitions, add then copy finished, leader epochs bumping now and then), with retention deleting a partition's
    oldest segment (delete started, delete finished) whenever it holds more than its live count: yields each
    segment with the states its events leave it in, in turn. `live_out` gets each partition's live segments."""
    slots = [i for i in indices for _ in range(plan.live[i] + plan.deleted[i])]
    rng.shuffle(slots)
    next_offset = dict.fromkeys(indices, 0)
    epoch = dict.fromkeys(indices, 0)
    live: dict[int, deque[RawSegment]] = {i: deque() for i in indices}
    now = 1_700_000_000_000
    for i in slots:
        if rng.random() < 0.02:
            epoch[i] += 1
        seg = RawSegment(i, str(uuid.UUID(int=rng.getrandbits(128))), next_offset[i], epoch[i], now,
                         rng.randrange(3), rng.randint(1 << 20, 1 << 30), rng.random() < 0.9)
        next_offset[i] += SEGMENT_OFFSETS
        yield seg, _UPLOAD
        kept = live[i]
        kept.append(seg)
        if len(kept) > plan.live[i]:
            oldest = kept.popleft()
            yield oldest, _DELETE
        now += 1000
    if live_out is not None:
        live_out.update((i, list(kept)) for i, kept in live.items())


def harness_lines(seg: RawSegment, states: tuple[RemoteLogSegmentState, ...]) -> str:
    """The events as lines of the TBRLMM harness's events file (see bench/rlmm_vs_kafka.write_events_file)."""
    return "".join(
        f"A {seg.tp_index} {seg.segment_id} {seg.start} {seg.end} {seg.epoch} {seg.timestamp_ms} {seg.broker_id} "
        f"{seg.timestamp_ms} {seg.size} {int(seg.txn_idx_empty)}\n" if state is S.COPY_SEGMENT_STARTED
        else f"U {seg.tp_index} {seg.segment_id} {int(state)} {seg.timestamp_ms + 1} 1\n" for state in states)


def as_event(tps: list[TopicIdPartition], seg: RawSegment, state: RemoteLogSegmentState) -> SegmentEvent:
    """The event of `live_history` as `history` would have made it (the slow path `check_fast_encoding` compares)."""
    md = RemoteLogSegmentMetadata(
        remote_log_segment_id=RemoteLogSegmentId(tps[seg.tp_index], uuid.UUID(seg.segment_id)),
        start_offset=seg.start, end_offset=seg.end, max_timestamp_ms=seg.timestamp_ms, broker_id=seg.broker_id,
        event_timestamp_ms=seg.timestamp_ms, segment_size_in_bytes=seg.size,
        segment_leader_epochs={seg.epoch: seg.start}, txn_idx_empty=seg.txn_idx_empty)
    if state is S.COPY_SEGMENT_STARTED:
        return SegmentEvent(md)
    return _updated(md, state, FINISHED_CUSTOM if state is S.COPY_SEGMENT_FINISHED else None)


def check_fast_encoding(plan: LivePlan, events: int = 4000) -> None:
    """Fail unless the fast path's first `events` events encode to exactly the records `tierlog_records` makes."""
    sample = list(itertools.islice(live_history(plan, list(range(len(plan.tps))), random.Random(0)), events // 2))
    encoder = FastEncoder(plan.tps)
    fast = [(plan.tps[seg.tp_index], key, value) for seg, states in sample
            for key, value in encoder.records(seg, states)]
    slow = list(tierlog_records(as_event(plan.tps, seg, state) for seg, states in sample for state in states))
    if fast != slow:
        wrong = next(i for i, (a, b) in enumerate(zip(fast, slow, strict=False)) if a != b)
        raise SystemExit(f"the fast history encoder differs from rlmm.codec at record {wrong}: "
                         f"{fast[wrong]!r} != {slow[wrong]!r}")


@dataclass(frozen=True)
class ShardJob:
    """One producer process's share of a generated history (see write_shard)."""

    plan: LivePlan
    bootstrap: str
    topics: tuple[str, ...]
    partitions: int
    shards: int
    shard: int
    seed: int
    events_file: Path | None  # where the harness's lines go (None: tierlog alone)
    wanted: frozenset[int]  # the user partitions whose live segments are returned


@dataclass(frozen=True)
class ShardResult:
    records: int
    events: int
    seconds: float
    live: dict[int, tuple[array, array]]  # user partition index -> its live segments' start offsets, epochs


def write_shard(job: ShardJob) -> ShardResult:
    """Produce tierlog's records of one shard of the plan's history to every topic of `job.topics`, and write the
    harness's lines of the same events; run in a process of its own, one per core."""
    started = time.perf_counter()
    indices = job.plan.shard(job.partitions, job.shards, job.shard)
    encoder = FastEncoder(job.plan.tps)
    target = {i: metadata_partition_for(tp.topic_id, tp.partition, job.partitions) for i, tp in enumerate(job.plan.tps)}
    producer = Producer({"bootstrap.servers": job.bootstrap, "linger.ms": 100, "batch.size": 1_000_000,
                         "compression.type": "lz4", "acks": "all", "enable.idempotence": True,
                         "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1 << 20})
    live: dict[int, list[RawSegment]] = {}
    records = events = 0
    out = job.events_file.open("w", encoding="ascii") if job.events_file else None
    try:
        for seg, states in live_history(job.plan, indices, random.Random(f"{job.seed}-{job.shard}"), live):
            events += len(states)
            if out is not None:
                out.write(harness_lines(seg, states))
            mp = target[seg.tp_index]
            for key, value in encoder.records(seg, states):
                records += 1
                for topic in job.topics:
                    while True:
                        try:
                            producer.produce(topic, value, key, partition=mp)
                            break
                        except BufferError:
                            producer.poll(0.05)
    finally:
        if out is not None:
            out.close()
    if producer.flush(600) != 0:
        raise SystemExit(f"producing shard {job.shard} of the history did not finish")
    summary = {i: (array("q", (s.start for s in segs)), array("i", (s.epoch for s in segs)))
               for i, segs in live.items() if i in job.wanted}
    return ShardResult(records, events, time.perf_counter() - started, summary)


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
