"""Lineage checkpoints keyed per leader epoch: a checkpoint costs the epochs an event changed, whatever the number of
epochs the partition ever had, and a topic or view written by the release before (whole-partition checkpoints
under `epochs:<tp>`, a lineage digest as bookkeeping) upgrades in place.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import given
from hypothesis import strategies as st
from rlmm_strategies import PROPERTY_SETTINGS, STEPS, Scenario, assert_same_answers, step
from rlmm_testkit import LogRecord, LogWriter, compacted, make_tp, partition_delete, replay, segment, update_of

from rlmm import codec, lineage
from rlmm import view_format as vf
from rlmm.archive import read_snapshot
from rlmm.errors import InvalidArgumentError, RemoteStorageError, ViewFormatError
from rlmm.events import EpochCheckpoint, EpochLineage, RecordKey, epoch_key, epochs_key, key_of
from rlmm.snapshot import load_into, write_view_snapshot
from rlmm.state import (
    InMemoryState,
    apply_record,
    doomed_keys,
    list_segments,
    pending_checkpoint,
    records_after,
)
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from rlmm.view import ConsumedRecord, MetadataView, apply_records

S = RemoteLogSegmentState
P = RemotePartitionDeleteState
TP = make_tp("orders", 0)
METADATA_TOPIC = "__tierlog_metadata"


class CountingState(InMemoryState):
    """An InMemoryState that counts the epoch lineages read and written through it."""

    def __init__(self) -> None:
        super().__init__()
        self.touched: Counter[str] = Counter()

    def lineage(self, tp: TopicIdPartition, epoch: int) -> EpochLineage | None:
        self.touched["read"] += 1
        return super().lineage(tp, epoch)

    def lineages_of(self, tp: TopicIdPartition) -> Iterator[EpochLineage]:
        found = list(super().lineages_of(tp))
        self.touched["read"] += len(found)
        return iter(found)

    def put_lineage(self, tp: TopicIdPartition, lineage: EpochLineage) -> None:
        self.touched["written"] += 1
        super().put_lineage(tp, lineage)

    def remove_lineage(self, tp: TopicIdPartition, epoch: int) -> None:
        self.touched["written"] += 1
        super().remove_lineage(tp, epoch)


def _finished_in(store: InMemoryState, offset: int, md: RemoteLogSegmentMetadata) -> tuple[int, list[LogRecord]]:
    """Add and finish `md` at offsets from `offset`; return the next offset and the checkpoints that follow."""
    finished = md.create_with_update(update_of(md, S.COPY_SEGMENT_FINISHED))
    apply_record(store, key_of(md), md, offset)
    apply_record(store, key_of(finished), finished, offset + 1)
    follow = [(key, event) for key, event in records_after(store, key_of(finished), finished, (), 0, 0)]
    for position, (key, event) in enumerate(follow):
        apply_record(store, key, event, offset + 2 + position)
    return offset + 2 + len(follow), follow


def _one_more_checkpoint(epochs: int) -> dict[str, object]:
    """The work one more checkpoint costs on a partition that had `epochs` leader epochs, all ending at epoch
    9999 (so keys and offsets are spelled alike whatever the count)."""
    store = CountingState()
    offset = 0
    first = 10_000 - epochs
    for epoch in range(first, 10_000):
        offset, _ = _finished_in(store, offset, segment(TP, epoch * 100, epoch * 100 + 99, {epoch: epoch * 100}))
    store.touched.clear()
    offset = 1_000_000  # the same metadata offsets (and so the same stamps) whatever the history before
    md = segment(TP, 1_000_000, 1_000_099, {9999: 1_000_000}, segment_id=uuid.UUID(int=1))
    _, follow = _finished_in(store, offset, md)
    encoded = [(key.encode(), codec.encode(event)) for key, event in follow if event is not None]
    decoded = [(RecordKey.decode(key), codec.decode(value)) for key, value in encoded]
    for position, (key, event) in enumerate(decoded):
        apply_record(store, key, event, offset + 10 + position)
    return {"records": len(encoded), "bytes": sum(len(k) + len(v) for k, v in encoded),
            "epochs read": store.touched["read"], "epochs written": store.touched["written"]}


def test_one_more_checkpoint_costs_the_same_work_with_1000_leader_epochs_as_with_10() -> None:
    few, many = _one_more_checkpoint(10), _one_more_checkpoint(1000)
    assert many == few
    assert few["records"] == 1


def test_an_event_is_followed_by_a_checkpoint_of_each_epoch_it_changed_under_that_epochs_key() -> None:
    writer = LogWriter()
    writer.add_and_update(segment(TP, 0, 99, {0: 0, 1: 50}), S.COPY_SEGMENT_FINISHED)
    before = len(writer.log)
    writer.add_and_update(segment(TP, 100, 199, {1: 100, 2: 150}), S.COPY_SEGMENT_FINISHED)
    checkpoints = [(key, event) for key, event in writer.log[before:] if key.kind == "epochs"]
    assert [key for key, _ in checkpoints] == [epoch_key(TP, 1), epoch_key(TP, 2)]
    assert [event.epochs for _, event in checkpoints if isinstance(event, EpochCheckpoint)] == [
        (EpochLineage(1, 149),), (EpochLineage(2, 199),)]
    assert pending_checkpoint(writer.store, TP, 0, 0) is None


def test_a_partition_delete_tombstones_every_key_of_the_partition_old_whole_partition_key_included() -> None:
    writer = LogWriter()
    writer.add_and_update(segment(TP, 0, 99, {0: 0, 3: 50}), S.COPY_SEGMENT_FINISHED)
    doomed = doomed_keys(writer.store, TP)
    for state in P:
        writer.delete_partition(partition_delete(TP, state))
    tombstoned = records_after(writer.store, key_of(partition_delete(TP, P.DELETE_PARTITION_FINISHED)),
                               partition_delete(TP, P.DELETE_PARTITION_FINISHED), doomed, 0, 0)
    assert {key for key, event in tombstoned if event is None} == {
        *doomed, epoch_key(TP, 0), epoch_key(TP, 3), epochs_key(TP)}
    # Once compacted, what is left of the partition is its FINISHED record (and, for a while, tombstones).
    log = [*writer.log, *tombstoned]
    assert [key.kind for key, _ in compacted(log)] == ["partition-delete"]


def test_a_checkpoint_of_several_epochs_is_appended_as_one_record_per_epoch() -> None:
    checkpoint = EpochCheckpoint(TP, (EpochLineage(2, 9), EpochLineage(5, 20)), 1, 0, 7, whole_partition=False)
    with pytest.raises(InvalidArgumentError, match="one record per epoch"):
        key_of(checkpoint)
    records = lineage.checkpoint_records(checkpoint)
    assert [key for key, _ in records] == [epoch_key(TP, 2), epoch_key(TP, 5)]
    assert all(key_of(event) == key and event.reflects_offset == 7 for key, event in records)
    assert apply_record(InMemoryState(), epoch_key(TP, 2), checkpoint).applied is False


def test_an_epoch_key_round_trips_and_a_malformed_one_is_refused() -> None:
    key = epoch_key(TP, 2**31 - 1)
    assert key.encode() == f"epochs:{TP.topic_id}:0:{2**31 - 1}".encode()
    assert RecordKey.decode(key.encode()) == key
    assert RecordKey.decode(epochs_key(TP).encode()) == epochs_key(TP)
    for bad in (f"epochs:{TP.topic_id}:0:x", f"epochs:{TP.topic_id}:0:-1", f"epochs:{TP.topic_id}:0:1:2"):
        with pytest.raises(InvalidArgumentError):
            RecordKey.decode(bad.encode())


def test_a_per_epoch_checkpoint_round_trips_and_one_written_with_schema_v2_reads_as_whole_partition() -> None:
    per_epoch = EpochCheckpoint(TP, (EpochLineage(4, 149, frozenset({uuid.UUID(int=7)})),), 1, 2, 42,
                                whole_partition=False)
    assert codec.decode(codec.encode(per_epoch)) == per_epoch
    v2 = next(v for v in codec.registry().by_fingerprint.values()
              if v.name == "epoch_checkpoint_record" and v.version == 2)
    _, datum = codec.to_datum(per_epoch)
    del datum["whole_partition"]
    assert codec.decode(codec.encode_with(v2, datum)) == EpochCheckpoint(
        TP, per_epoch.epochs, 1, 2, 42, whole_partition=True)


# --- the release before: whole-partition checkpoints, a lineage digest as bookkeeping ----------------------

def _legacy_digest(lineages: Iterable[EpochLineage]) -> bytes:
    """The bookkeeping that release stored: sha256 over the epochs' view encodings, in epoch order."""
    return hashlib.sha256(b"".join(vf.encode_lineage(lin) for lin in sorted(lineages, key=lambda lin: lin.epoch))
                          ).digest()


def _legacy_meta(topic: str, checkpointed: bytes | None, position: int | None) -> bytes:
    """A partition's bookkeeping as that release encoded it (digest and position told apart by length)."""
    name = topic.encode()
    tail = b"" if position is None else position.to_bytes(8, "big")
    return len(name).to_bytes(2, "big") + name + (checkpointed or b"") + tail


@dataclass
class UpgradingWriter(LogWriter):
    """A writer that runs the release before (`legacy`: a checkpoint of every epoch of the partition under its
    `epochs:` key after each event that changed the lineage) until it is upgraded, then today's write path."""

    legacy: bool = True
    described: dict[TopicIdPartition, tuple[EpochLineage, ...]] = field(default_factory=dict)

    def delete_partition(self, md: RemotePartitionDeleteMetadata) -> None:
        if self.legacy:
            super().delete_partition(md)
            return
        from rlmm.state import prepare_partition_delete

        prepare_partition_delete(self.store, md)
        self._write(md, doomed_keys(self.store, md.topic_id_partition))

    def _write(self, event: Any, doomed: Iterable[RecordKey] = ()) -> None:
        if not self.legacy:
            super()._write(event, doomed)
            return
        self._append(key_of(event), event)
        self.clock_ms += 1
        tp = event.topic_id_partition
        if isinstance(event, RemotePartitionDeleteMetadata):
            if event.state is P.DELETE_PARTITION_FINISHED:
                for key in [*doomed, epochs_key(tp)]:
                    self._append(key, None)
            return
        lineages = tuple(self.store.lineages_of(tp))
        if lineages != self.described.get(tp, ()):
            self.described[tp] = lineages
            self._append(epochs_key(tp), EpochCheckpoint(tp, lineages, self.clock_ms, self.broker_id,
                                                         self.store.lineage_position(tp)))
        if event.state is S.DELETE_SEGMENT_FINISHED:
            self._append(key_of(event), None)


@dataclass
class RecordedScenario(Scenario):
    """A Scenario that keeps its API calls, to make them again on another writer."""

    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)

    def call(self, tp: TopicIdPartition, name: str, *args: Any) -> None:
        self.calls.append((name, args))
        super().call(tp, name, *args)


_CALLS: dict[str, Callable[..., object]] = {
    "add_remote_log_segment_metadata": LogWriter.add,
    "update_remote_log_segment_metadata": LogWriter.update,
    "put_remote_partition_delete_metadata": LogWriter.delete_partition,
}


def _todays_writer(calls: Iterable[tuple[str, tuple[Any, ...]]]) -> LogWriter:
    writer = LogWriter()
    for name, args in calls:
        with contextlib.suppress(RemoteStorageError):
            _CALLS[name](writer, *args)
    return writer


@PROPERTY_SETTINGS
@given(st.data())
def test_a_topic_begun_by_the_release_before_and_continued_by_this_one_replays_like_this_ones_alone(
    data: st.DataObject,
) -> None:
    scenario = RecordedScenario(writer=UpgradingWriter())
    writer = scenario.writer
    assert isinstance(writer, UpgradingWriter)
    for _ in range(data.draw(STEPS, label="steps before the upgrade")):
        step(data.draw, scenario)
    writer.legacy = False
    for _ in range(data.draw(STEPS, label="steps after")):
        step(data.draw, scenario)

    log = writer.log
    expected = _todays_writer(scenario.calls).store.digest()
    assert writer.store.digest() == expected
    assert replay(log).digest() == expected
    for keep_tombstones in (False, True):
        rebuilt = replay(compacted(log, keep_tombstones=keep_tombstones))
        assert rebuilt.digest() == expected
        assert_same_answers(scenario, rebuilt)
    cut = data.draw(st.integers(0, len(log)), label="compacted prefix")
    assert replay(log[cut:], replay(compacted(log[:cut]))).digest() == expected


def _legacy_history() -> UpgradingWriter:
    writer = UpgradingWriter()
    writer.add_and_update(segment(TP, 0, 99, {0: 0}), S.COPY_SEGMENT_FINISHED)
    writer.add_and_update(segment(TP, 0, 149, {0: 0, 1: 100}), S.COPY_SEGMENT_FINISHED)  # displaces the first
    writer.add_and_update(segment(TP, 150, 199, {2: 150}), S.COPY_SEGMENT_FINISHED)
    return writer


@pytest.mark.parametrize("stale", [False, True], ids=["checkpointed", "last-checkpoint-stale"])
def test_a_view_written_by_the_release_before_goes_on_from_its_bookkeeping(
    stale: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = _legacy_history()
    before = replay(writer.log)
    # The view as that release left it: format 1, the same content, and its bookkeeping in its own encoding (a
    # digest of the checkpointed lineage; none when its last checkpoint was stale).
    checkpointed = None if stale else _legacy_digest(before.lineages_of(TP))
    entries = sorted([*before.entries(), (vf.PARTITION_META, vf.tp_key_of(TP),
                                          _legacy_meta(TP.topic, checkpointed, len(writer.log) - 1))])
    monkeypatch.setattr(vf, "FORMAT_VERSION", 1)
    old = MetadataView(tmp_path / "view")
    old.load_entries(METADATA_TOPIC, [(family, [key], [value]) for family, key, value in entries],
                     {0: len(writer.log)})
    old.close()
    monkeypatch.undo()
    view = MetadataView(tmp_path / "view")  # opens in place, as this release's format from now on
    try:
        assert view.digest() == before.digest()
        # Upgraded, the writer finishes a segment in epoch 2 only: one checkpoint, of epoch 2.
        writer.legacy = False
        upgraded_at = len(writer.log)
        writer.add_and_update(segment(TP, 200, 249, {2: 200}), S.COPY_SEGMENT_FINISHED)
        new = writer.log[upgraded_at:]
        assert [key for key, _ in new if key.kind == "epochs"] == [epoch_key(TP, 2)]
        apply_records(view, METADATA_TOPIC, [ConsumedRecord(0, upgraded_at + i, key, event)
                                             for i, (key, event) in enumerate(new)], {0: len(writer.log)})
        assert view.digest() == replay(writer.log).digest() == writer.store.digest()
        owed = pending_checkpoint(view, TP, 0, 0)
        # A stale last checkpoint leaves the epochs it described owing one, until the view's next write.
        assert (None if owed is None else [lin.epoch for lin in owed.epochs]) == ([0, 1] if stale else None)
    finally:
        view.close()


def test_bookkeeping_from_the_release_before_says_which_epochs_owe_a_checkpoint() -> None:
    store = replay(_legacy_history().log)
    lineages = list(store.lineages_of(TP))
    for bookkeeping, owed in ((_legacy_digest(lineages), set()), (bytes(32), {0, 1, 2}), (vf.ALL_OWED, {0, 1, 2}),
                              (vf.decode_partition_meta(_legacy_meta(TP.topic, None, 5)).checkpointed, {0, 1, 2}),
                              (vf.encode_owed({1}), {1}), (None, set())):
        store.set_checkpointed_lineage(TP, bookkeeping)
        assert lineage.owed_epochs(store, TP) == owed, bookkeeping


def test_a_view_of_a_format_this_release_does_not_read_is_refused_and_one_it_reads_is_upgraded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    current, newer = vf.FORMAT_VERSION, vf.FORMAT_VERSION + 1
    for version in (1, newer):
        monkeypatch.setattr(vf, "FORMAT_VERSION", version)
        MetadataView(tmp_path / str(version)).close()
        monkeypatch.undo()
    MetadataView(tmp_path / "1").close()
    with pytest.raises(ViewFormatError, match=f"has format {newer}"):
        MetadataView(tmp_path / str(newer))
    # Upgraded once, the view is of this format: a release that reads only format 1 refuses it.
    monkeypatch.setattr(vf, "READABLE_FORMATS", frozenset({1}))
    monkeypatch.setattr(vf, "FORMAT_VERSION", 1)
    with pytest.raises(ViewFormatError, match=f"has format {current}"):
        MetadataView(tmp_path / "1")


def test_partition_bookkeeping_round_trips_with_owed_epochs() -> None:
    for meta in (vf.PartitionMeta("orders", vf.encode_owed({0, 7, 2**31 - 1}), 12),
                 vf.PartitionMeta("orders", vf.ALL_OWED, None), vf.PartitionMeta("o" * 249, None, 0)):
        assert vf.decode_partition_meta(vf.encode_partition_meta(meta)) == meta


# --- a checkpoint puts a segment back into the index only where the entry is free -------------------------

def test_a_checkpoint_puts_a_segment_it_no_longer_calls_displaced_back_into_a_free_index_entry() -> None:
    writer = LogWriter()
    old = writer.add_and_update(segment(TP, 0, 99, {0: 0}), S.COPY_SEGMENT_FINISHED)
    new = writer.add_and_update(segment(TP, 0, 149, {0: 0}), S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED)
    store = writer.store
    assert store.index_get(TP, 0, 0) is None
    lineage.apply_checkpoint(store, EpochCheckpoint(TP, (EpochLineage(0, 149),), 0, 0, whole_partition=False))
    assert store.index_get(TP, 0, 0) == old.remote_log_segment_id.id
    assert new.state is S.DELETE_SEGMENT_STARTED


def test_a_node_that_applied_a_compacted_head_then_reads_a_compacted_rest_keeps_the_newest_upload_indexed() -> None:
    # Uploads of the same range displace each other; the first is deleted meanwhile. Read in two compacted windows
    # (a node restarted after the head, the cleaner having run over the rest), the newest epoch checkpoint comes
    # before the first upload's tombstone, while this node still holds that upload as COPY_SEGMENT_FINISHED: the
    # checkpoint must not put it over the newest upload, whose entry its tombstone would then take away.
    writer = LogWriter()
    first = writer.add_and_update(segment(TP, 0, 9, {0: 0}), S.COPY_SEGMENT_FINISHED)
    head = len(writer.log)
    for _ in range(3):
        writer.add_and_update(segment(TP, 0, 9, {0: 0}), S.COPY_SEGMENT_FINISHED)
    writer.update(update_of(first, S.DELETE_SEGMENT_STARTED))
    newest = writer.add_and_update(segment(TP, 0, 9, {0: 0}), S.COPY_SEGMENT_FINISHED)
    writer.update(update_of(first, S.DELETE_SEGMENT_FINISHED))
    log = writer.log
    node = replay(compacted(log[head:], keep_tombstones=True), replay(compacted(log[:head])))
    assert node.index_get(TP, 0, 0) == newest.remote_log_segment_id.id
    assert node.digest() == replay(log).digest()


def test_a_view_snapshot_taken_by_the_release_before_still_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    writer = _legacy_history()
    before = replay(writer.log)
    entries = sorted([*before.entries(), (vf.PARTITION_META, vf.tp_key_of(TP),
                                          _legacy_meta(TP.topic, _legacy_digest(before.lineages_of(TP)), 7))])
    out = io.BytesIO()
    monkeypatch.setattr(vf, "FORMAT_VERSION", 1)
    write_view_snapshot(out, METADATA_TOPIC, entries, {0: len(writer.log)}, before.digest())
    monkeypatch.undo()
    header, datums = read_snapshot(io.BytesIO(out.getvalue()))
    assert header.view_format == 1
    view = MetadataView(tmp_path / "view")
    try:
        load_into(view, header, datums)
        assert view.digest() == before.digest()
        assert pending_checkpoint(view, TP, 0, 0) is None and view.lineage_position(TP) == 7
    finally:
        view.close()


# --- overwritten segments: a later upload from the same start that ends the epoch below its highest offset --------

def test_a_checkpoint_is_written_as_v3_unless_an_epoch_has_overwritten_segments_then_as_v4_and_both_round_trip(
) -> None:
    plain = EpochCheckpoint(TP, (EpochLineage(4, 149, frozenset({uuid.UUID(int=7)})),), 1, 2, 42,
                            whole_partition=False)
    overwriting = EpochCheckpoint(TP, (EpochLineage(4, 149, frozenset({uuid.UUID(int=7)}),
                                                    frozenset({uuid.UUID(int=8)})),), 1, 2, 42, whole_partition=False)
    v3 = codec.registry().version("epoch_checkpoint_record", 3)
    v4 = codec.registry().current["epoch_checkpoint_record"]
    assert v4.version == 4
    for checkpoint, version in ((plain, v3), (overwriting, v4)):
        value = codec.encode(checkpoint)
        assert value[2:10][::-1] == version.fingerprint
        assert codec.decode(value) == checkpoint
        assert codec.decode_datum(value)[1]["epochs"][0]["epoch"] == 4  # fastavro's reading, resolved to v4
    # The release before overwritten ids reads the v3 one with the v3 schema alone.
    datum: Any = fastavro.schemaless_reader(io.BytesIO(codec.encode(plain)[10:]), v3.schema)
    assert datum["epochs"][0]["displaced_segment_ids"] == [uuid.UUID(int=7)]


def test_a_view_lineage_without_overwritten_ids_keeps_its_bytes_and_one_with_them_round_trips() -> None:
    plain = EpochLineage(3, 149, frozenset({uuid.UUID(int=7), uuid.UUID(int=9)}))
    assert vf.encode_lineage(plain) == (vf.EPOCH.pack(3) + vf.OFFSET.pack(149)
                                        + uuid.UUID(int=7).bytes + uuid.UUID(int=9).bytes)
    for lineage_ in (plain, EpochLineage(3, None), EpochLineage(3, 149, frozenset(), frozenset({uuid.UUID(int=8)})),
                     EpochLineage(3, 149, frozenset({uuid.UUID(int=7)}),
                                  frozenset({uuid.UUID(int=8), uuid.UUID(int=5)}))):
        assert vf.decode_lineage(vf.encode_lineage(lineage_)) == lineage_


def _overwriting_history() -> LogWriter:
    """Epoch 0: X (0-149) finished; Y (0-99) overwrites X's entry (the epoch goes on to 149); W (0-199) displaces Y,
    whose delete then finishes. X stays overwritten: Kafka's epoch listing leaves it out."""
    writer = LogWriter()
    writer.add_and_update(segment(TP, 0, 149, {0: 0}), S.COPY_SEGMENT_FINISHED)
    y = writer.add_and_update(segment(TP, 0, 99, {0: 0}), S.COPY_SEGMENT_FINISHED)
    writer.add_and_update(segment(TP, 0, 199, {0: 0}), S.COPY_SEGMENT_FINISHED)
    writer.update(update_of(y, S.DELETE_SEGMENT_STARTED))
    writer.update(update_of(y, S.DELETE_SEGMENT_FINISHED))
    return writer


def test_a_compacted_replay_keeps_a_segment_overwritten_through_its_epochs_checkpoint() -> None:
    writer = _overwriting_history()
    full = replay(writer.log)
    x = next(md for md in full.segments_of(TP) if md.end_offset == 149)
    assert full.lineage(TP, 0) == EpochLineage(0, 199, frozenset(), frozenset({x.remote_log_segment_id.id}))
    # Compacted, Y is gone and W's upload displaces X instead: only the checkpoint says X is overwritten.
    for log in (compacted(writer.log), compacted(writer.log, keep_tombstones=True)):
        node = replay(log)
        assert node.digest() == full.digest()
        assert list_segments(node, TP, 0) == list_segments(full, TP, 0) == [
            md for md in full.segments_of(TP) if md.end_offset == 199]
        assert list_segments(node, TP) == list_segments(full, TP)


def test_a_view_applies_overwritten_segments_as_the_in_memory_store_and_a_snapshot_carries_them(
        tmp_path: Path) -> None:
    writer = _overwriting_history()
    full = replay(writer.log)
    view = MetadataView(tmp_path / "view")
    try:
        apply_records(view, METADATA_TOPIC, [ConsumedRecord(0, i, key, event)
                                             for i, (key, event) in enumerate(compacted(writer.log))], {0: 99})
        assert view.digest() == full.digest()
        assert view.lineage(TP, 0) == full.lineage(TP, 0)
        assert list_segments(view, TP, 0) == list_segments(full, TP, 0)
        out = io.BytesIO()
        write_view_snapshot(out, METADATA_TOPIC, sorted(view.entries()), {0: 99}, view.digest())
    finally:
        view.close()
    header, datums = read_snapshot(io.BytesIO(out.getvalue()))
    loaded = MetadataView(tmp_path / "loaded")
    try:
        load_into(loaded, header, datums)
        assert loaded.lineage(TP, 0) == full.lineage(TP, 0)
        assert list_segments(loaded, TP, 0) == list_segments(full, TP, 0)
    finally:
        loaded.close()
