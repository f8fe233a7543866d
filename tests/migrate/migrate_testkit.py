"""Helpers for the migration tests: histories in Kafka's format on a source topic, `tierlog` runs against them, and
Kafka's real TopicBasedRemoteLogMetadataManager (TBRLMM) in a JVM answering the same reads as a tierlog node.

A history is what Kafka's TopicBasedRemoteLogMetadataManager appends to `__remote_log_metadata` for a sequence of
API calls: every call, in order, in the metadata partition its partitioner picks, except the two its API refuses
before writing (an add in another state than COPY_SEGMENT_STARTED, an update to COPY_SEGMENT_STARTED).
"""

from __future__ import annotations

import contextlib
import io
import json
import queue
import random
import subprocess
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from hypothesis import strategies as st
from rlmm_strategies import STEPS, Scenario, assert_answers_like, interesting_offsets, step
from rlmm_testkit import make_tp, workload
from support.reference_model import ReferenceModel

from dev.kafka import default_libs_dir, java_executable
from dev.process import wait_until
from rlmm import RemoteLogMetadataManager, state
from rlmm.errors import RemoteResourceNotFoundError, RemoteStorageError, RemoteStorageNotReadyError
from rlmm.kafka_format import KafkaMetadata, RemoteLogSegmentMetadataSnapshot, encode, metadata_partition
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
)
from tierlog.cli.main import main
from tierlog.migration.node import MigratingManager

KafkaWrite = RemoteLogSegmentMetadata | RemoteLogSegmentMetadataUpdate | RemotePartitionDeleteMetadata
SOURCE_PARTITIONS = 5
TARGET_PARTITIONS = 3


def written_by_tbrlmm(call: KafkaWrite) -> bool:
    """Whether TBRLMM's API appends the call to its topic (it refuses only these two before writing)."""
    if isinstance(call, RemoteLogSegmentMetadata):
        return call.state is RemoteLogSegmentState.COPY_SEGMENT_STARTED
    if isinstance(call, RemoteLogSegmentMetadataUpdate):
        return call.state is not RemoteLogSegmentState.COPY_SEGMENT_STARTED
    return True


@dataclass
class RecordingScenario(Scenario):
    """rlmm_strategies' scenario (the reference model of Kafka's rules and a writer), also keeping the history
    TBRLMM would have appended for its calls."""

    history: list[KafkaWrite] = field(default_factory=list)

    def call(self, tp: TopicIdPartition, name: str, *args: Any) -> None:
        if written_by_tbrlmm(args[0]):
            self.history.append(args[0])
        super().call(tp, name, *args)


@st.composite
def kafka_histories(draw: st.DrawFn) -> RecordingScenario:
    scenario = RecordingScenario()
    for _ in range(draw(STEPS)):
        step(draw, scenario)
    return scenario


def produce_history(bootstrap: str, topic: str, history: Iterable[KafkaWrite], partitions: int = SOURCE_PARTITIONS
                    ) -> None:
    """Append `history` to `topic` as TBRLMM does: Kafka's serde, its partitioner, null keys, acks=all."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                         "linger.ms": 20})
    for call in history:
        producer.produce(topic, value=encode(call), partition=metadata_partition(call.topic_id_partition, partitions))
    assert producer.flush(60) == 0, f"history for {topic} not delivered in 60 s"


def produce_raw(bootstrap: str, topic: str, partition: int, values: Sequence[bytes]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for value in values:
        producer.produce(topic, value=value, partition=partition)
    assert producer.flush(30) == 0


def _epochs_text(epochs: dict[int, int]) -> str:
    return ",".join(f"{e}:{o}" for e, o in epochs.items())


def _custom_text(custom: bytes | None) -> str:
    return "-" if custom is None else custom.hex()


def probe_request(record: KafkaMetadata) -> str:
    """The probe's line for `record` (see KafkaSerdeProbe.java)."""
    if isinstance(record, RemoteLogSegmentMetadataSnapshot):
        return (f"N {record.segment_id} {record.start_offset} {record.end_offset} {record.max_timestamp_ms} "
                f"{record.broker_id} {record.event_timestamp_ms} {record.segment_size_in_bytes} "
                f"{_epochs_text(dict(record.segment_leader_epochs))} {_custom_text(record.custom_metadata)} "
                f"{record.state.value} {int(record.txn_idx_empty)}")
    tp = record.topic_id_partition
    head = f"{tp.topic_id} {tp.topic} {tp.partition}"
    if isinstance(record, RemoteLogSegmentMetadata):
        return (f"S {head} {record.remote_log_segment_id.id} {record.start_offset} {record.end_offset} "
                f"{record.max_timestamp_ms} {record.broker_id} {record.event_timestamp_ms} "
                f"{record.segment_size_in_bytes} {_epochs_text(dict(record.segment_leader_epochs))} "
                f"{_custom_text(record.custom_metadata)} {record.state.value} {int(record.txn_idx_empty)}")
    if isinstance(record, RemoteLogSegmentMetadataUpdate):
        return (f"U {head} {record.remote_log_segment_id.id} {record.event_timestamp_ms} "
                f"{_custom_text(record.custom_metadata)} {record.state.value} {record.broker_id}")
    return f"D {head} {record.state.value} {record.event_timestamp_ms} {record.broker_id}"


def tierlog_options(bootstrap: str, target_topic: str, state_dir: Path) -> list[str]:
    """`-o` options for a tierlog node of its own (RF 1) on `target_topic`."""
    config = {
        "bootstrap.servers": bootstrap, "metadata.topic.name": target_topic, "state.dir": str(state_dir),
        "metadata.topic.num.partitions": str(TARGET_PARTITIONS), "metadata.topic.replication.factor": "1",
        "metadata.topic.min.insync.replicas": "1", "broker.id": "0",
    }
    return [arg for key, value in config.items() for arg in ("-o", f"{key}={value}")]


def run_tierlog(*argv: str) -> tuple[int, Any]:
    """Run `tierlog ARGV --json` in this process; its exit code and its JSON output."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main([*argv, "--json"])
    text = out.getvalue()
    return code, json.loads(text) if text.strip() else None


def workload_history(seed: int, partitions: int = 6, uploads: int = 12) -> list[KafkaWrite]:
    """Brokers' valid call sequences for several user partitions (uploads across leader epochs, re-uploads,
    retention, the last partition deleted), interleaved as they reach the topic: each partition's in its order."""
    rng = random.Random(seed)
    tps = [make_tp(f"topic-{i % 2}", i) for i in range(partitions)]
    return interleaved(rng, {tp: workload(rng, tp, uploads, delete_partition=tp is tps[-1]) for tp in tps})


def interleaved(rng: random.Random, writes: Mapping[TopicIdPartition, Sequence[KafkaWrite]]) -> list[KafkaWrite]:
    """The partitions' writes as they reach the topic from the brokers' threads: each partition's in its order."""
    queues = [list(calls) for calls in writes.values()]
    merged: list[KafkaWrite] = []
    while any(queues):
        merged.append(rng.choice([q for q in queues if q]).pop(0))
    return merged


def kafka_model(history: Iterable[KafkaWrite]) -> ReferenceModel:
    """Kafka's rules over the history: each record applied as TBRLMM's consumer applies it, invalid ones dropped."""
    model = ReferenceModel()
    for call in history:
        with contextlib.suppress(RemoteStorageError):
            if isinstance(call, RemoteLogSegmentMetadata):
                model.add_remote_log_segment_metadata(call)
            elif isinstance(call, RemoteLogSegmentMetadataUpdate):
                model.update_remote_log_segment_metadata(call)
            else:
                model.put_remote_partition_delete_metadata(call)
    return model


def assert_answers_as_kafka(model: ReferenceModel, store: state.StateReader, history: Sequence[KafkaWrite]) -> None:
    """Every query tierlog's `store` answers agrees with Kafka's rules over `history`, for each user partition."""
    added: dict[TopicIdPartition, list[RemoteLogSegmentMetadata]] = {}
    for call in history:
        added.setdefault(call.topic_id_partition, [])
        if isinstance(call, RemoteLogSegmentMetadata):
            added[call.topic_id_partition].append(call)
    for tp, segments in added.items():
        assert state.is_deleted(store, tp) == model.is_deleted(tp), tp
        if not model.is_deleted(tp):
            assert_answers_like(model, store, tp, segments)


# --- Kafka's real TopicBasedRemoteLogMetadataManager (TBRLMM) beside a tierlog node ------------------------------

TBRLMM_PROBE = Path(__file__).resolve().parent / "TbrlmmProbe.java"
SOURCE_TOPIC = "__remote_log_metadata"  # TBRLMM's, not configurable
KAFKA_DEFAULT_PARTITIONS = 50  # remote.log.metadata.topic.num.partitions when a test creates the topic
TBRLMM_BROKER_ID = 1  # the tierlog node is broker 0
DEADLINE_S = 30.0
# Kafka's exception for each error tierlog raises (the broker's adapter maps one to the other).
KAFKA_ERRORS = {RemoteResourceNotFoundError: "RemoteResourceNotFoundException",
                RemoteStorageNotReadyError: "ReplicaNotAvailableException"}


class Tbrlmm:
    """Kafka's TopicBasedRemoteLogMetadataManager in a JVM of its own (tests/migrate/TbrlmmProbe.java): one request
    line in, one JSON answer out."""

    def __init__(self, bootstrap: str, partitions: int, log_dir: Path, stderr: IO[str]) -> None:
        self.partitions = partitions
        self._stderr_path = Path(stderr.name)
        self._process = subprocess.Popen(
            [java_executable(), "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-cp", f"{default_libs_dir()}/*",
             str(TBRLMM_PROBE), bootstrap, str(partitions), str(TBRLMM_BROKER_ID), str(log_dir)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1)
        self._answers: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read_answers, name="tbrlmm-probe-answers", daemon=True).start()

    def _read_answers(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self._answers.put(line)
        self._answers.put(None)

    def ask_all(self, requests: Sequence[str], timeout_s: float = DEADLINE_S) -> list[dict[str, Any]]:
        """The answers to `requests`, sent at once (the probe answers in order; a thread drains its answers meanwhile,
        so neither pipe fills); each answer within `timeout_s` of the one before."""
        assert self._process.stdin is not None
        self._process.stdin.write("".join(f"{request}\n" for request in requests))
        self._process.stdin.flush()
        answers: list[dict[str, Any]] = []
        for request in requests:
            try:
                answer = self._answers.get(timeout=timeout_s)
            except queue.Empty:
                answer = None
            assert answer is not None, (f"TBRLMM's probe exited or gave no answer to {request!r} within "
                                        f"{timeout_s:g} s; its stderr ends:\n{self._stderr_path.read_text()[-4000:]}")
            answers.append(json.loads(answer))
        return answers

    def ask(self, request: str, timeout_s: float = DEADLINE_S) -> dict[str, Any]:
        return self.ask_all([request], timeout_s)[0]

    def register(self, tps: Sequence[TopicIdPartition]) -> None:
        for tp in tps:
            assert self.ask(f"REGISTER L {tp_text(tp)}") == {"ok": True}
        for tp in tps:
            assert self.ask(f"READY {tp_text(tp)} {int(DEADLINE_S * 1000)}", DEADLINE_S + 5) == {"ready": True}, (
                f"TBRLMM not ready for {tp}")

    def write(self, call: KafkaWrite) -> None:
        """One API call, returning once TBRLMM completed it (its record written and read back)."""
        answer = self.ask(f"{_verb(call)} {probe_request(call)} {int(DEADLINE_S * 1000)}", DEADLINE_S + 5)
        assert answer == {"ok": True}, f"TBRLMM refused {call}: {answer}"

    def write_all(self, calls: Sequence[KafkaWrite]) -> None:
        """The API calls in their order, each made without waiting for the one before (TBRLMM's one producer keeps
        their order on its topic), returning once TBRLMM completed them all."""
        answers = self.ask_all([f"SEND {_verb(call)} {probe_request(call)}" for call in calls]
                               + [f"AWAIT {int(DEADLINE_S * 1000)}"], DEADLINE_S + 5)
        refused = [(call, answer) for call, answer in zip(calls, answers, strict=False) if answer != {"ok": True}]
        assert not refused, f"TBRLMM refused {len(refused)} of {len(calls)} calls, the first {refused[0]}"
        assert answers[-1] == {"ok": True, "writes": len(calls)}, f"TBRLMM did not complete the calls: {answers[-1]}"

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


def _verb(call: KafkaWrite) -> str:
    return {RemoteLogSegmentMetadata: "ADD", RemotePartitionDeleteMetadata: "DELETE"}.get(type(call), "UPDATE")


def tp_text(tp: TopicIdPartition) -> str:
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


def source_partitions(bootstrap: str) -> int:
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


def tierlog_answer(node: RemoteLogMetadataManager | MigratingManager, tp: TopicIdPartition, query: Query
                   ) -> dict[str, Any]:
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


def _kafka_request(tp: TopicIdPartition, query: Query) -> str:
    return " ".join(map(str, (query[0], tp_text(tp), *query[1:])))


def _comparable(query: Query, answer: dict[str, Any]) -> dict[str, Any]:
    """Kafka defines no order for a partition's listing, and orders an epoch's only by start offset: both sides'
    listings sorted by (start offset, id) once their own order is checked; an error compared by its class only."""
    answer = {key: value for key, value in answer.items() if key != "message"}
    if "segments" not in answer:
        return answer
    starts = [s["start"] for s in answer["segments"]]
    in_order = len(query) == 1 or starts == sorted(starts)
    return {"segments": sorted(answer["segments"], key=lambda s: (s["start"], s["id"])), "in_order": in_order}


def assert_answers_as_tbrlmm(node: RemoteLogMetadataManager | MigratingManager, probe: Tbrlmm,
                             writes: Mapping[TopicIdPartition, Sequence[KafkaWrite]]) -> int:
    """Every read of every partition answers alike on both sides; the number of reads compared."""
    asked = [(tp, query) for tp, calls in writes.items() for query in queries(calls)]
    theirs = probe.ask_all([_kafka_request(tp, query) for tp, query in asked])
    differences = []
    for (tp, query), kafka in zip(asked, theirs, strict=True):
        ours, kafkas = _comparable(query, tierlog_answer(node, tp, query)), _comparable(query, kafka)
        if ours != kafkas:
            differences.append(f"{tp} {query}:\n  tierlog {ours}\n  TBRLMM  {kafkas}")
    assert not differences, f"{len(differences)} of {len(asked)} reads differ:\n" + "\n".join(differences[:10])
    return len(asked)
