"""A rolling upgrade from the release before per-epoch checkpoints: with `metadata.checkpoint.whole.partition`, a
writer appends each checkpoint as that release did (every epoch of the partition under its one key, schema v2,
which that release reads), and a topic written so, then per epoch, replays to the writers' view.
"""

from __future__ import annotations

import io
import random
import uuid
from collections.abc import Callable
from typing import Any

import fastavro
from rlmm_testkit import decoded, drive, make_tp, read_topic, register, replay, workload

from rlmm import RemoteLogMetadataManager, codec
from rlmm.events import EpochCheckpoint, EpochLineage, RecordKey

MakeManager = Callable[..., RemoteLogMetadataManager]
TP = make_tp("upgrade")
WHOLE = {"metadata.checkpoint.whole.partition": True}


def _v2() -> codec.SchemaVersion:
    return codec.registry().version("epoch_checkpoint_record", 2)


def _fingerprint(value: bytes) -> bytes:
    return value[2:10][::-1]


def test_a_whole_partition_checkpoint_is_written_with_the_schema_the_release_before_reads() -> None:
    checkpoint = EpochCheckpoint(TP, (EpochLineage(0, 99), EpochLineage(3, 149, frozenset({uuid.UUID(int=7)}))),
                                 1, 2, 42, whole_partition=True)
    value = codec.encode(checkpoint)
    assert _fingerprint(value) == _v2().fingerprint
    # The release before decodes it with the v2 schema alone.
    datum: dict[str, Any] = fastavro.schemaless_reader(io.BytesIO(value[10:]), _v2().schema)  # type: ignore[assignment]
    assert [e["epoch"] for e in datum["epochs"]] == [0, 3] and datum["reflects_offset"] == 42
    assert codec.decode(value) == checkpoint
    # A per-epoch one with no overwritten segments: v3, which the release before overwritten ids reads.
    per_epoch = EpochCheckpoint(TP, (EpochLineage(3, 149),), 1, 2, 42, whole_partition=False)
    plain = codec.registry().version("epoch_checkpoint_record", codec.PLAIN_CHECKPOINT_VERSION)
    assert _fingerprint(codec.encode(per_epoch)) == plain.fingerprint


def test_a_topic_checkpointed_whole_partition_then_per_epoch_replays_to_the_writers_view(
    make_manager: MakeManager, kafka_bootstrap: str, metadata_topic: str
) -> None:
    tps = [make_tp("upgrading", p) for p in range(3)]
    old_style = make_manager(broker_id=0, partitions=2, **WHOLE)
    register(old_style, *tps)
    drive(old_style, {tp: workload(random.Random(90 + tp.partition), tp, uploads=8) for tp in tps})
    old_style.wait_caught_up(60)
    checkpoints = [r for r in read_topic(kafka_bootstrap, metadata_topic)
                   if r.key is not None and r.key.startswith(b"epochs:") and r.value is not None]
    assert checkpoints
    for record in checkpoints:  # what the release before reads: its key form and its schema
        assert RecordKey.decode(record.key or b"").epoch is None
        assert _fingerprint(record.value or b"") == _v2().fingerprint
    fresh = make_manager(broker_id=1, partitions=2)
    fresh.wait_caught_up(60)
    assert fresh.view_digest() == old_style.view_digest()

    # Every broker upgraded: the switch off, checkpoints per epoch again, on the same partitions.
    upgraded = make_manager(broker_id=2, partitions=2)
    register(upgraded, *tps)
    drive(upgraded, {tp: workload(random.Random(95 + tp.partition), tp, uploads=6) for tp in tps})
    upgraded.wait_caught_up(60)
    topic = read_topic(kafka_bootstrap, metadata_topic)
    assert any(RecordKey.decode(r.key or b"").epoch is not None for r in topic if (r.key or b"").startswith(b"epochs:"))
    fresh.wait_caught_up(60)
    old_style.wait_caught_up(60)
    assert fresh.view_digest() == upgraded.view_digest() == old_style.view_digest()
    assert replay(decoded(topic)).digest() == upgraded.view_digest()
