"""A manager's lookups read a partition's snapshot through its `SnapshotSlot`: the model keeps the slot holding the
snapshot it publishes, batch after batch, so a lookup needs one attribute read and no lock; and a slot read while
batches fold in shows the partition as of one whole batch. `EpochFloors` answers like Kafka's floor lookup.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given
from rlmm_strategies import PARTITIONS, Scenario, histories
from rlmm_testkit import make_tp
from test_rlmm_lookup_snapshots import TOPIC, _replacing, fold_while_reading
from test_rlmm_view_properties import VIEW_SETTINGS, apply_in_batches, batch_cuts

from rlmm import packed
from rlmm import view_format as vf
from rlmm.events import key_of
from rlmm.read_model import EpochFloors, PartitionSnapshot, SnapshotSlot
from rlmm.types import RemoteLogSegmentMetadata
from rlmm.view import ConsumedRecord, MetadataView, apply_records


@VIEW_SETTINGS
@given(histories(), batch_cuts)
def test_a_slot_holds_the_snapshot_each_folded_batch_publishes(scenario: Scenario, cuts: list[int]) -> None:
    log = scenario.writer.log
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(directory)
        try:
            model = view.model
            slots = {vf.tp_key_of(tp): SnapshotSlot() for tp in PARTITIONS}
            for key, slot in slots.items():
                assert model.watch(key, slot) is slot.snapshot
            start = 0
            for end in [*sorted(set(cuts)), len(log)]:
                if end > start:
                    apply_in_batches(view, log[:end], [], start)
                    start = end
                for key, slot in slots.items():
                    assert slot.snapshot is model.snapshots[key]
        finally:
            view.close()


class _Commits:
    """Applies one partition's batches to a view, each as one committed batch."""

    def __init__(self, view: MetadataView) -> None:
        self._view = view
        self._offset = 0

    def __call__(self, events: list[RemoteLogSegmentMetadata]) -> None:
        records = [ConsumedRecord(0, self._offset + i, key_of(event), event) for i, event in enumerate(events)]
        self._offset += len(records)
        apply_records(self._view, TOPIC, records, {0: self._offset})


def test_a_slot_given_again_or_unwatched_no_longer_follows_the_partition(tmp_path: Path) -> None:
    view = MetadataView.open(tmp_path)
    tp = make_tp("moved", 0)
    key = vf.tp_key_of(tp)
    commit = _Commits(view)
    try:
        first, events = _replacing(tp, 0, None)
        commit(events)
        old, new = SnapshotSlot(), SnapshotSlot()
        view.model.watch(key, old)
        view.model.watch(key, new)
        second, events = _replacing(tp, 1, first)
        commit(events)
        assert new.snapshot.segment_for_offset(0, 50) == second
        assert old.snapshot.segment_for_offset(0, 50) == first  # the model keeps no reference to a replaced slot

        view.model.unwatch(key)
        _third, events = _replacing(tp, 2, second)
        commit(events)
        assert new.snapshot.segment_for_offset(0, 50) == second
    finally:
        view.close()


def test_lookups_through_a_slot_during_folding_see_each_partition_as_of_one_whole_batch(tmp_path: Path) -> None:
    view = MetadataView.open(tmp_path)
    tp = make_tp("replaced", 0)
    slot = SnapshotSlot()

    def watch() -> None:
        view.model.watch(vf.tp_key_of(tp), slot)

    try:
        fold_while_reading(view, tp, watch, lambda: slot.snapshot)
    finally:
        view.close()


def test_epoch_floors_answer_the_greatest_start_at_or_below_the_offset_up_to_its_end() -> None:
    tp = make_tp("floors", 0)
    first = packed.pack(_replacing(tp, 0, None)[0], tp)
    last = packed.pack(_replacing(tp, 1, None)[0], tp)
    floors = EpochFloors.of([0, 100, 200], [first, None, last], [49, 199, 250])
    assert [floors.floor(offset) for offset in (0, 49, 50, 99, 100, 199, 200, 250, 251)] == [
        first, first, None, None, None, None, last, last, None]
    assert floors.parts() == ([0, 100, 200], [first, None, last], [49, 199, 250])
    assert EpochFloors.of([], [], []).floor(0) is None


def test_a_snapshot_keeps_the_floors_of_its_only_epoch_beside_its_deleted_flag() -> None:
    tp = make_tp("sole", 0)
    md = _replacing(tp, 0, None)[0]
    floors = EpochFloors.of([0], [packed.pack(md, tp)], [99])
    sole = PartitionSnapshot(False, {4: floors}, tp=tp)
    assert (sole.sole_epoch, sole.sole_floors) == (4, floors)
    assert [sole.segment_for_offset(epoch, 50) for epoch in (3, 4, 5)] == [None, md, None]
    several = PartitionSnapshot(False, {4: floors, 6: EpochFloors.of([100], [None], [-1])}, tp=tp)
    assert (several.sole_epoch, several.sole_floors) == (-1, None)
    assert [several.segment_for_offset(epoch, 50) for epoch in (4, 6)] == [md, None]
    assert (PartitionSnapshot().sole_epoch, PartitionSnapshot().sole_floors) == (-1, None)
