"""The RocksDB view against the in-memory state, batch atomicity, and snapshot bootstrap.

Logs come from a seeded random writer that validates calls as the manager does and appends follow-ups.
"""

from __future__ import annotations

import io
import random
import uuid
from pathlib import Path

import pytest

from rlmm import codec
from rlmm.archive import to_archived, write_snapshot
from rlmm.errors import InvalidArgumentError, RemoteResourceNotFoundError, SnapshotError
from rlmm.events import MetadataEvent, RecordKey, key_of
from rlmm.snapshot import load_snapshot
from rlmm.state import InMemoryState, apply_record, prepare_add, prepare_update, records_after
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    TopicIdPartition,
)
from rlmm.view import ConsumedRecord, MetadataView, apply_records

S = RemoteLogSegmentState
Log = list[tuple[RecordKey, MetadataEvent | None]]


def random_log(seed: int, steps: int = 1500) -> Log:
    """Adds, finishes and deletes overlapping segments across leader epochs of three partitions."""
    rng = random.Random(seed)
    tps = [TopicIdPartition(uuid.UUID(int=rng.getrandbits(128)), f"topic-{i}", i) for i in range(3)]
    state = InMemoryState()
    log: Log = []
    segments: list[RemoteLogSegmentId] = []

    def write(event: MetadataEvent) -> None:
        key = key_of(event)
        log.append((key, event))
        if apply_record(state, key, event).applied:
            for follow_key, follow in records_after(state, key, event, (), 0, 1):
                apply_record(state, follow_key, follow)
                log.append((follow_key, follow))

    for _ in range(steps):
        if rng.random() < 0.35 or not segments:
            start = rng.randrange(0, 400)
            end = start + rng.randrange(0, 80)
            epoch = rng.randrange(0, 4)
            epochs = {epoch: start}
            if end > start and rng.random() < 0.3:
                epochs[epoch + 1] = rng.randrange(start + 1, end + 1)
            segment_id = RemoteLogSegmentId(rng.choice(tps), uuid.UUID(int=rng.getrandbits(128)))
            write(prepare_add(state, RemoteLogSegmentMetadata(segment_id, start, end, 0, 1, 0, 10, epochs)))
            segments.append(segment_id)
            continue
        target = rng.choice([S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED])
        update = RemoteLogSegmentMetadataUpdate(rng.choice(segments), 1, None, target, 1)
        try:
            write(prepare_update(state, update))
        except (InvalidArgumentError, RemoteResourceNotFoundError):
            continue
    return log


def replay_into_view(view: MetadataView, log: Log, batch_size: int) -> None:
    records = [ConsumedRecord(0, offset, key, event) for offset, (key, event) in enumerate(log)]
    for first in range(0, len(records), batch_size):
        batch = records[first:first + batch_size]
        apply_records(view, "meta", batch, {0: batch[-1].offset + 1})


def memory_digest(log: Log) -> str:
    state = InMemoryState()
    for key, event in log:
        apply_record(state, key, event)
    return state.digest()


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("batch_size", [1, 97, 5000])
def test_view_replays_a_log_to_the_in_memory_digest(tmp_path: Path, seed: int, batch_size: int) -> None:
    log = random_log(seed)
    view = MetadataView.open(tmp_path)
    try:
        replay_into_view(view, log, batch_size)
        assert view.digest() == memory_digest(log)
        assert view.applied_offsets("meta") == {0: len(log)}
    finally:
        view.close()


def test_view_answers_queries_like_the_in_memory_state(tmp_path: Path) -> None:
    from rlmm import state as rules

    log = random_log(7)
    memory = InMemoryState()
    for key, event in log:
        apply_record(memory, key, event)
    view = MetadataView.open(tmp_path)
    try:
        replay_into_view(view, log, 250)
        for tp in memory.user_partitions():
            for epoch in range(6):
                assert rules.list_segments(view, tp, epoch) == rules.list_segments(memory, tp, epoch)
                assert rules.highest_offset_for_epoch(view, tp, epoch) == rules.highest_offset_for_epoch(
                    memory, tp, epoch)
                for offset in range(0, 500, 7):
                    assert rules.segment_for_offset(view, tp, epoch, offset) == rules.segment_for_offset(
                        memory, tp, epoch, offset)
    finally:
        view.close()


def test_a_batch_that_fails_midway_leaves_the_view_and_its_offsets_untouched(tmp_path: Path) -> None:
    log = random_log(4, steps=300)
    view = MetadataView.open(tmp_path)
    try:
        replay_into_view(view, log[:100], 50)
        before = view.digest()
        poisoned = [ConsumedRecord(0, 100 + i, key, event) for i, (key, event) in enumerate(log[100:150])]
        poisoned.append(ConsumedRecord(0, 150, poisoned[0].key, "not an event"))  # type: ignore[arg-type]
        with pytest.raises(AttributeError):
            apply_records(view, "meta", poisoned, {0: 151})
        assert view.digest() == before
        assert view.applied_offsets("meta") == {0: 100}
    finally:
        view.close()


def test_view_survives_reopen_with_same_digest_and_offsets(tmp_path: Path) -> None:
    log = random_log(5, steps=400)
    view = MetadataView.open(tmp_path)
    replay_into_view(view, log, 64)
    digest = view.digest()
    view.close()
    reopened = MetadataView.open(tmp_path)
    try:
        assert reopened.digest() == digest
        assert reopened.applied_offsets("meta") == {0: len(log)}
    finally:
        reopened.close()


def _compacted_archive(log: Log) -> list[dict[str, object]]:
    newest = {key.encode(): offset for offset, (key, _) in enumerate(log)}
    return [
        to_archived("meta", 0, offset, 0, key.encode(), None if event is None else codec.encode(event))
        for offset, (key, event) in enumerate(log)
        if newest[key.encode()] == offset and event is not None
    ]


def test_snapshot_of_the_compacted_log_loads_to_the_full_replay_digest(tmp_path: Path) -> None:
    log = random_log(6)
    snapshot = tmp_path / "snap.avro"
    with snapshot.open("wb") as out:
        write_snapshot(out, "meta", _compacted_archive(log), {0: len(log)})
    topic, ends = load_snapshot(snapshot, tmp_path / "node")
    assert (topic, ends) == ("meta", {0: len(log)})
    view = MetadataView.open(tmp_path / "node")
    try:
        assert view.digest() == memory_digest(log)
        assert view.applied_offsets("meta") == {0: len(log)}
    finally:
        view.close()


def test_snapshot_refuses_a_state_dir_that_already_holds_a_view(tmp_path: Path) -> None:
    snapshot = tmp_path / "snap.avro"
    with snapshot.open("wb") as out:
        write_snapshot(out, "meta", [], {0: 0})
    MetadataView.open(tmp_path / "node").close()
    with pytest.raises(SnapshotError, match="already holds a view"):
        load_snapshot(snapshot, tmp_path / "node")


def test_a_file_that_is_not_a_snapshot_is_refused_with_its_path(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.avro"
    buffer = io.BytesIO()
    import fastavro

    fastavro.writer(buffer, fastavro.parse_schema({"type": "record", "name": "X", "fields": []}), [])
    bogus.write_bytes(buffer.getvalue())
    with pytest.raises(SnapshotError, match=r"bogus\.avro"):
        load_snapshot(bogus, tmp_path / "node")
