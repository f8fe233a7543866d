"""Helpers for the migration tests: histories in Kafka's format on a source topic, and `tierlog` runs against them.

A history is what Kafka's TopicBasedRemoteLogMetadataManager appends to `__remote_log_metadata` for a sequence of
API calls: every call, in order, in the metadata partition its partitioner picks, except the two its API refuses
before writing (an add in another state than COPY_SEGMENT_STARTED, an update to COPY_SEGMENT_STARTED).
"""

from __future__ import annotations

import contextlib
import io
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from hypothesis import strategies as st
from rlmm_strategies import STEPS, Scenario, assert_answers_like, step
from rlmm_testkit import make_tp, workload
from support.reference_model import ReferenceModel

from rlmm import state
from rlmm.errors import RemoteStorageError
from rlmm.kafka_format import KafkaMetadata, RemoteLogSegmentMetadataSnapshot, encode, metadata_partition
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
)
from tierlog.cli.main import main

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
    queues = [workload(rng, tp, uploads, delete_partition=tp is tps[-1]) for tp in tps]
    history: list[KafkaWrite] = []
    while any(queues):
        history.append(rng.choice([q for q in queues if q]).pop(0))
    return history


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
