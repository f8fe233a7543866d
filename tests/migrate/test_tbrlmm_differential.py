"""Differential test of migration mode against Kafka's real TopicBasedRemoteLogMetadataManager (TBRLMM): both run on
the dev broker's `__remote_log_metadata` (TBRLMM in a JVM, tests/migrate/TbrlmmProbe.java), writes go through either
one as during a roll, and tierlog must answer every read exactly as TBRLMM does.

TBRLMM's topic name is fixed, so these tests share `__remote_log_metadata` with whatever else ran on the dev broker:
each uses user partitions of fresh topic ids, and TBRLMM only ever reads the partitions registered with it.
"""

from __future__ import annotations

import contextlib
import json
import queue
import random
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from migrate_testkit import KafkaWrite, probe_request
from rlmm_strategies import interesting_offsets
from rlmm_testkit import make_tp, manager_config, segment, submit, update_of, workload
from support.topics import unique_topic_name

from dev.kafka import default_libs_dir, java_executable, kafka_libs_cached
from dev.process import wait_until
from rlmm import RemoteLogMetadataManager
from rlmm.errors import RemoteResourceNotFoundError, RemoteStorageError, RemoteStorageNotReadyError
from rlmm.kafka_format import metadata_partition
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
)
from tierlog.migration.node import MigratingManager, import_group, split_config, wrap

PROBE = Path(__file__).resolve().parent / "TbrlmmProbe.java"
SOURCE_TOPIC = "__remote_log_metadata"  # TBRLMM's, not configurable
KAFKA_DEFAULT_PARTITIONS = 50  # remote.log.metadata.topic.num.partitions when a test creates the topic
TBRLMM_BROKER_ID = 1  # the tierlog node is broker 0
DEADLINE_S = 30.0
# Kafka's exception for each error tierlog raises (the broker's adapter maps one to the other).
KAFKA_ERRORS = {RemoteResourceNotFoundError: "RemoteResourceNotFoundException",
                RemoteStorageNotReadyError: "ReplicaNotAvailableException"}


class Tbrlmm:
    """Kafka's TopicBasedRemoteLogMetadataManager in a JVM of its own: one request line in, one JSON answer out."""

    def __init__(self, bootstrap: str, partitions: int, log_dir: Path, stderr: IO[str]) -> None:
        self.partitions = partitions
        self._stderr_path = Path(stderr.name)
        self._process = subprocess.Popen(
            [java_executable(), "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{default_libs_dir()}/*",
             str(PROBE), bootstrap, str(partitions), str(TBRLMM_BROKER_ID), str(log_dir)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1)
        self._answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_answers, name="tbrlmm-probe-answers", daemon=True).start()

    def _read_answers(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._answers.put(line)
        self._answers.put(None)

    def ask(self, request: str, timeout_s: float = DEADLINE_S) -> dict[str, Any]:
        assert self._process.stdin is not None
        self._process.stdin.write(f"{request}\n")
        self._process.stdin.flush()
        try:
            answer = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            answer = None
        assert answer is not None, (f"TBRLMM's probe exited or gave no answer to {request!r} within "
                                    f"{timeout_s:g} s; its stderr ends:\n{self._stderr_path.read_text()[-4000:]}")
        parsed: dict[str, Any] = json.loads(answer)
        return parsed

    def register(self, tps: Sequence[TopicIdPartition]) -> None:
        for tp in tps:
            assert self.ask(f"REGISTER L {_tp_text(tp)}") == {"ok": True}
        for tp in tps:
            assert self.ask(f"READY {_tp_text(tp)} {int(DEADLINE_S * 1000)}", DEADLINE_S + 5) == {"ready": True}, (
                f"TBRLMM not ready for {tp}")

    def write(self, call: KafkaWrite) -> None:
        verb = {RemoteLogSegmentMetadata: "ADD", RemotePartitionDeleteMetadata: "DELETE"}.get(type(call), "UPDATE")
        answer = self.ask(f"{verb} {probe_request(call)} {int(DEADLINE_S * 1000)}", DEADLINE_S + 5)
        assert answer == {"ok": True}, f"TBRLMM refused {call}: {answer}"

    def catch_up(self, bootstrap: str, tps: Sequence[TopicIdPartition]) -> None:
        """Wait until TBRLMM's consumer has read every record on the metadata partitions of `tps` now."""
        for mp, end in source_ends(bootstrap, {metadata_partition(tp, self.partitions) for tp in tps}).items():
            if end:
                answer = self.ask(f"SYNC {mp} {end - 1} {int(DEADLINE_S * 1000)}", DEADLINE_S + 5)
                assert answer == {"ok": True}, f"TBRLMM did not read {SOURCE_TOPIC}-{mp} up to {end - 1}: {answer}"

    def close(self) -> None:
        assert self._process.stdin is not None
        with contextlib.suppress(OSError):
            self._process.stdin.close()  # the probe closes TBRLMM and exits
        try:
            self._process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(timeout=5)


def _tp_text(tp: TopicIdPartition) -> str:
    return f"{tp.topic_id} {tp.topic} {tp.partition}"


def source_ends(bootstrap: str, partitions: int | set[int]) -> dict[int, int]:
    """The end offsets of `__remote_log_metadata`'s `partitions` (a set, or all of a count) now."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "tests-tbrlmm-ends"})

    def end(p: int) -> int:
        # A topic created a moment ago answers "not leader" until the broker's metadata has its leaders: ask again.
        # (A 1-tuple, so that an end offset of 0 counts as an answer.)
        found = wait_until(lambda: (consumer.get_watermark_offsets(TopicPartition(SOURCE_TOPIC, p), timeout=10),),
                           timeout=DEADLINE_S, description=f"the end offset of {SOURCE_TOPIC}-{p}")
        return int(found[0][1])

    try:
        return {p: end(p) for p in (range(partitions) if isinstance(partitions, int) else partitions)}
    finally:
        consumer.close()


def _source_partitions(bootstrap: str) -> int:
    """The partition count of `__remote_log_metadata` on the dev broker, created as TBRLMM creates it if missing."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if SOURCE_TOPIC not in admin.list_topics(timeout=10).topics:
        created = admin.create_topics([NewTopic(SOURCE_TOPIC, KAFKA_DEFAULT_PARTITIONS, 1, config={
            "cleanup.policy": "delete", "retention.ms": "-1"})], operation_timeout=DEADLINE_S)[SOURCE_TOPIC]
        with contextlib.suppress(KafkaException):  # created meanwhile by someone else: its count is read below
            created.result(DEADLINE_S)

    def described() -> int:
        topic = admin.list_topics(topic=SOURCE_TOPIC, timeout=5).topics.get(SOURCE_TOPIC)
        ok = topic is not None and topic.error is None and topic.partitions and all(
            p.leader >= 0 for p in topic.partitions.values())
        return len(topic.partitions) if ok and topic is not None else 0

    return int(wait_until(described, timeout=DEADLINE_S, description=f"leaders of {SOURCE_TOPIC}"))


@pytest.fixture(scope="module")
def tbrlmm(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tbrlmm]:
    """One TBRLMM JVM for the module, on the dev broker's `__remote_log_metadata`."""
    if not kafka_libs_cached():
        pytest.skip(f"the Kafka jars are not in {default_libs_dir()} (`dev/services up` fetches them)")
    partitions = _source_partitions(kafka_bootstrap)
    workdir = tmp_path_factory.mktemp("tbrlmm")
    with open(workdir / "stderr.log", "w", encoding="utf-8") as stderr:
        probe = Tbrlmm(kafka_bootstrap, partitions, workdir / "log", stderr)
        try:
            yield probe
        finally:
            probe.close()


@pytest.fixture(scope="module")
def migrating_node(kafka_bootstrap: str, tbrlmm: Tbrlmm, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[Callable[..., MigratingManager]]:
    """`start(from_offsets)` a tierlog node in migration mode (a metadata topic of its own) importing
    `__remote_log_metadata` from `from_offsets` (default: its end now), as after a `tierlog migrate` up to there: the
    topic keeps every run's records on the dev broker, none of them of this test's partitions."""
    started: list[MigratingManager] = []

    def start(from_offsets: dict[int, int] | None = None) -> MigratingManager:
        topic = unique_topic_name("tbrlmm-differential")
        positions = from_offsets if from_offsets is not None else source_ends(kafka_bootstrap, tbrlmm.partitions)
        consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": import_group(topic)})
        try:
            consumer.commit(offsets=[TopicPartition(SOURCE_TOPIC, p, end) for p, end in positions.items()],
                            asynchronous=False)
        finally:
            consumer.close()
        config = manager_config(kafka_bootstrap, tmp_path_factory.mktemp("node"), topic, partitions=3, **{
            "migration.mode": "dual-write", "migration.source.topic": SOURCE_TOPIC,
            "migration.control.topic": f"{topic}-control", "migration.heartbeat.ms": 200})
        own, migration = split_config(config)
        node = wrap(RemoteLogMetadataManager(own), own, migration)
        assert isinstance(node, MigratingManager)
        started.append(node)
        return node

    yield start
    for node in started:
        node.close()


# --- the workload ------------------------------------------------------------------------------------------------

def roll_workload(seed: int, partitions: int, uploads: int) -> dict[TopicIdPartition, list[KafkaWrite]]:
    """Per user partition (fresh topic ids), a broker's valid calls: rlmm_testkit.workload's uploads across leader
    epochs, re-uploads and retention, plus failed uploads cleaned up (a COPY_SEGMENT_STARTED segment deleted, as
    Kafka's RemoteLogManager does); the last partition is deleted in the end."""
    rng = random.Random(seed)
    writes: dict[TopicIdPartition, list[KafkaWrite]] = {}
    for i in range(partitions):
        tp = make_tp(f"differential-{i % 2}", i)
        calls = workload(rng, tp, uploads, delete_partition=i == partitions - 1)
        body = [c for c in calls if not isinstance(c, RemotePartitionDeleteMetadata)]
        finished = {c.remote_log_segment_id for c in body if c.state is RemoteLogSegmentState.COPY_SEGMENT_FINISHED}
        for failed in [c for c in body if isinstance(c, RemoteLogSegmentMetadata)
                       and c.remote_log_segment_id not in finished]:
            body.append(update_of(failed, RemoteLogSegmentState.DELETE_SEGMENT_STARTED))
            if rng.random() < 0.5:
                body.append(update_of(failed, RemoteLogSegmentState.DELETE_SEGMENT_FINISHED))
        writes[tp] = body + [c for c in calls if isinstance(c, RemotePartitionDeleteMetadata)]
    return writes


# --- the answers of both sides, in one shape ---------------------------------------------------------------------

Query = tuple[Any, ...]  # ("LIST",), ("LIST", epoch), ("LOOKUP"|"TXN", epoch, offset), ("HIGHEST"|"SIZE", epoch)


def queries(writes: Sequence[KafkaWrite]) -> list[Query]:
    """Every read the broker makes, at every leader epoch of the partition's segments (and the next) and every offset
    around their bounds."""
    added = [c for c in writes if isinstance(c, RemoteLogSegmentMetadata)]
    epochs = range(max((e for c in added for e in c.segment_leader_epochs), default=0) + 2)
    offsets = sorted(interesting_offsets(added))
    found: list[Query] = [("LIST",)]
    for epoch in epochs:
        found += [("LIST", epoch), ("HIGHEST", epoch), ("SIZE", epoch)]
        found += [(kind, epoch, offset) for offset in offsets for kind in ("LOOKUP", "TXN")]
    return found


def _segment(md: RemoteLogSegmentMetadata) -> dict[str, Any]:
    return {"id": str(md.remote_log_segment_id.id), "start": md.start_offset, "end": md.end_offset,
            "max_ts": md.max_timestamp_ms, "broker": md.broker_id, "event_ts": md.event_timestamp_ms,
            "size": md.segment_size_in_bytes, "epochs": {str(e): o for e, o in md.segment_leader_epochs.items()},
            "custom": None if md.custom_metadata is None else md.custom_metadata.hex(), "state": md.state.value,
            "txn_idx_empty": md.txn_idx_empty}


def tierlog_answer(node: MigratingManager, tp: TopicIdPartition, query: Query) -> dict[str, Any]:
    kind, *args = query
    try:
        if kind == "LIST":
            return {"segments": [_segment(md) for md in node.list_remote_log_segments(tp, *args)]}
        if kind in ("LOOKUP", "TXN"):
            read = node.remote_log_segment_metadata if kind == "LOOKUP" else node.next_segment_with_txn_index
            found = read(tp, *args)
            return {"segment": None if found is None else _segment(found)}
        if kind == "HIGHEST":
            return {"offset": node.highest_offset_for_epoch(tp, *args)}
        return {"size": node.remote_log_size(tp, *args)}
    except RemoteStorageError as exc:
        return {"error": KAFKA_ERRORS.get(type(exc), type(exc).__name__)}


def kafka_answer(probe: Tbrlmm, tp: TopicIdPartition, query: Query) -> dict[str, Any]:
    answer = probe.ask(" ".join(map(str, (query[0], _tp_text(tp), *query[1:]))))
    answer.pop("message", None)
    return answer


def _comparable(query: Query, answer: dict[str, Any]) -> dict[str, Any]:
    """Kafka defines no order for a partition's listing, and orders an epoch's only by start offset: both sides'
    listings sorted by (start offset, id) once their own order is checked."""
    if "segments" not in answer:
        return answer
    starts = [s["start"] for s in answer["segments"]]
    in_order = len(query) == 1 or starts == sorted(starts)
    return {"segments": sorted(answer["segments"], key=lambda s: (s["start"], s["id"])), "in_order": in_order}


def assert_answers_as_tbrlmm(node: MigratingManager, probe: Tbrlmm, writes: dict[TopicIdPartition, list[KafkaWrite]]
                             ) -> int:
    """Every read of every partition answers alike on both sides; the number of reads compared."""
    differences, compared = [], 0
    for tp, calls in writes.items():
        for query in queries(calls):
            ours, theirs = (_comparable(query, tierlog_answer(node, tp, query)),
                            _comparable(query, kafka_answer(probe, tp, query)))
            compared += 1
            if ours != theirs:
                differences.append(f"{tp} {query}:\n  tierlog {ours}\n  TBRLMM  {theirs}")
    assert not differences, f"{len(differences)} of {compared} reads differ:\n" + "\n".join(differences[:10])
    return compared


# --- driving both sides ------------------------------------------------------------------------------------------

def wait_imported(node: MigratingManager) -> None:
    """Until the node's import has taken in all of `__remote_log_metadata` and its view applied it."""
    wait_until(lambda: not any(node.import_lag(5.0).values()), timeout=DEADLINE_S,
               description=f"the import of {SOURCE_TOPIC}")
    node.wait_caught_up(DEADLINE_S)


def take_over(node: MigratingManager, tp: TopicIdPartition) -> None:
    """Leadership of `tp` moves to the tierlog node: it serves tp once its predecessor's writes are imported."""
    node.on_partition_leadership_changes([tp], [])
    wait_until(lambda: node.is_ready(tp), timeout=DEADLINE_S, interval=0.02,
               description=f"the tierlog node ready for {tp}")


def roll(kafka_bootstrap: str, node: MigratingManager, probe: Tbrlmm,
         writes: dict[TopicIdPartition, list[KafkaWrite]], seed: int) -> dict[str, int]:
    """Make every partition's calls in its order, partitions interleaved, each call on the broker leading the
    partition then (TBRLMM or tierlog); leadership moves now and then, the new leader catching up first."""
    rng = random.Random(seed)
    queues = {tp: list(calls) for tp, calls in writes.items()}
    leader = {tp: rng.choice(("tierlog", "tbrlmm")) for tp in queues}
    made = {"tierlog": 0, "tbrlmm": 0}
    for tp, side in leader.items():
        if side == "tierlog":
            take_over(node, tp)
    while any(queues.values()):
        tp = rng.choice([tp for tp, left in queues.items() if left])
        if rng.random() < 0.2:
            leader[tp] = "tbrlmm" if leader[tp] == "tierlog" else "tierlog"
            if leader[tp] == "tierlog":
                take_over(node, tp)
            else:
                probe.catch_up(kafka_bootstrap, [tp])
        call = queues[tp].pop(0)
        if leader[tp] == "tierlog":
            submit(node, call).result(timeout=DEADLINE_S)
        else:
            probe.write(call)
        made[leader[tp]] += 1
    return made


def caught_up_both(kafka_bootstrap: str, node: MigratingManager, probe: Tbrlmm, tps: Sequence[TopicIdPartition]
                   ) -> None:
    probe.catch_up(kafka_bootstrap, tps)
    wait_imported(node)


# --- the tests ---------------------------------------------------------------------------------------------------

def test_during_a_roll_tierlog_answers_every_read_as_kafkas_tbrlmm(
        kafka_bootstrap: str, tbrlmm: Tbrlmm, migrating_node: Callable[..., MigratingManager]) -> None:
    writes = roll_workload(seed=26, partitions=4, uploads=10)
    node = migrating_node()
    tps = list(writes)
    tbrlmm.register(tps)
    node.on_partition_leadership_changes([], tps)
    made = roll(kafka_bootstrap, node, tbrlmm, writes, seed=26)
    assert min(made.values()) > 5, made  # both sides wrote a fair share
    caught_up_both(kafka_bootstrap, node, tbrlmm, tps)
    assert assert_answers_as_tbrlmm(node, tbrlmm, writes) > 500


def test_a_node_started_later_imports_what_tbrlmm_alone_wrote_and_answers_alike(
        kafka_bootstrap: str, tbrlmm: Tbrlmm, migrating_node: Callable[..., MigratingManager]) -> None:
    writes = roll_workload(seed=27, partitions=3, uploads=8)
    tps = list(writes)
    before = source_ends(kafka_bootstrap, tbrlmm.partitions)
    tbrlmm.register(tps)
    for calls in writes.values():
        for call in calls:
            tbrlmm.write(call)
    node = migrating_node(before)  # the first broker rolled to tierlog: it imports all TBRLMM wrote
    for tp in tps:
        take_over(node, tp)
    wait_imported(node)
    assert assert_answers_as_tbrlmm(node, tbrlmm, writes) > 300


def test_tbrlmm_taking_over_partitions_tierlog_alone_wrote_answers_alike(
        kafka_bootstrap: str, tbrlmm: Tbrlmm, migrating_node: Callable[..., MigratingManager]) -> None:
    """A rollback: TBRLMM is assigned the partitions after tierlog wrote them, and replays them from the topic. (The
    deleted partition is assigned before its delete: TBRLMM's consumer thread dies on a partition assigned after its
    DELETE_PARTITION_FINISHED, a NullPointerException in RemotePartitionMetadataStore.markInitialized.)"""
    writes = roll_workload(seed=28, partitions=3, uploads=8)
    *kept, deleted = list(writes)
    tbrlmm.register([deleted])
    node = migrating_node()
    for tp, calls in writes.items():
        take_over(node, tp)
        for call in calls:
            submit(node, call).result(timeout=DEADLINE_S)
    tbrlmm.register(kept)
    tbrlmm.catch_up(kafka_bootstrap, list(writes))
    assert assert_answers_as_tbrlmm(node, tbrlmm, writes) > 300


def test_a_segments_whole_life_written_through_tierlog_completes_each_call_as_tbrlmms_would(
        kafka_bootstrap: str, tbrlmm: Tbrlmm, migrating_node: Callable[..., MigratingManager]) -> None:
    """Each call returns once its record is applied, DELETE_SEGMENT_FINISHED too (after which tierlog's view no longer
    holds the segment at all), and TBRLMM ends with the same answers."""
    tp = make_tp("whole-life", 0)
    added = segment(tp, 0, 99, {0: 0})
    writes = {tp: [added, *(update_of(added, s) for s in list(RemoteLogSegmentState)[1:])]}
    tbrlmm.register([tp])
    node = migrating_node()
    take_over(node, tp)
    for call in writes[tp]:
        submit(node, call).result(timeout=DEADLINE_S)
    tbrlmm.catch_up(kafka_bootstrap, [tp])
    assert node.list_remote_log_segments(tp) == []
    assert_answers_as_tbrlmm(node, tbrlmm, writes)


@pytest.mark.parametrize("last", ["tbrlmm", "tierlog"])
def test_two_leaders_copying_the_same_offsets_end_as_in_tbrlmm_whichever_finishes_last(
        last: str, kafka_bootstrap: str, tbrlmm: Tbrlmm, migrating_node: Callable[..., MigratingManager]) -> None:
    """The roll's race: the old leader (TBRLMM) has not finished its copy when its successor (tierlog) copies the same
    offsets; one finishes after the other."""
    tp = make_tp("race", 0)
    old, new = segment(tp, 0, 99, {0: 0}), segment(tp, 0, 99, {0: 0})
    finish = {"tbrlmm": update_of(old, RemoteLogSegmentState.COPY_SEGMENT_FINISHED),
              "tierlog": update_of(new, RemoteLogSegmentState.COPY_SEGMENT_FINISHED)}
    tbrlmm.register([tp])
    node = migrating_node()
    tbrlmm.write(old)
    take_over(node, tp)
    submit(node, new).result(timeout=DEADLINE_S)
    first = "tierlog" if last == "tbrlmm" else "tbrlmm"
    for side in (first, last):
        if side == "tbrlmm":
            tbrlmm.write(finish[side])
        else:
            submit(node, finish[side]).result(timeout=DEADLINE_S)
    caught_up_both(kafka_bootstrap, node, tbrlmm, [tp])
    assert_answers_as_tbrlmm(node, tbrlmm, {tp: [old, new]})
    assert node.remote_log_segment_metadata(tp, 0, 50) is not None
