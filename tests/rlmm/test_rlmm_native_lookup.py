"""The fetch path's lookup in C (rlmm/_segment_lookup.c) answers exactly what the read model's snapshot answers for a
readable partition, and hands every other call to the Python method, which checks and raises as before.

The manager-level comparison against the reference model runs with the extension on and off
(test_rlmm_manager_model.py); these pin the extension's own contract on the read model's real objects.
"""

from __future__ import annotations

import gc
import sys
import tempfile
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from rlmm_strategies import PARTITIONS, QUERIED_EPOCHS, Scenario, histories, interesting_offsets
from rlmm_testkit import segment
from test_rlmm_view_properties import VIEW_SETTINGS, apply_in_batches

from rlmm import view_format as vf
from rlmm.manager import _Readable
from rlmm.read_model import EpochFloors, PartitionSnapshot, snapshot_of
from rlmm.types import RemoteLogSegmentMetadata, TopicIdPartition
from rlmm.view import MetadataView

# Built by `pip install -e .` (setup.py) on every machine with a C compiler, CI's among them: a failed build must
# fail here, not pass the suite on the Python path alone.
from rlmm._segment_lookup import ReadableTable, SegmentLookup  # isort: skip

TP = TopicIdPartition(uuid.UUID(int=7), "orders", 3)


@dataclass
class Fallback:
    """Stands in for the manager's Python method: records what it was handed and answers a marker."""

    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)
    answer: object = "answered by the fallback"

    def __call__(self, *args: Any, **kwargs: Any) -> object:
        self.calls.append((args, kwargs))
        return self.answer


def _lookup(snapshots: dict[TopicIdPartition, PartitionSnapshot], halted: dict[int, Exception] | None = None,
            fallback: Callable[..., object] | None = None) -> tuple[SegmentLookup, ReadableTable]:
    readable_now = ReadableTable()
    for metadata_partition, (tp, snapshot) in enumerate(snapshots.items()):
        readable = _Readable(tp.topic, vf.tp_key_of(tp), metadata_partition)
        readable.snapshot = snapshot
        readable_now[(tp.topic_id.int, tp.partition)] = readable
    return SegmentLookup(readable_now, {} if halted is None else halted, TopicIdPartition,
                         fallback or Fallback()), readable_now


def _two_epochs() -> tuple[PartitionSnapshot, RemoteLogSegmentMetadata, RemoteLogSegmentMetadata]:
    first, second = segment(TP, 0, 99, {0: 0}), segment(TP, 100, 199, {1: 100})
    snapshot = PartitionSnapshot(floors={0: EpochFloors.of([0], [first], [99]),
                                         1: EpochFloors.of([100], [second], [199])})
    return snapshot, first, second


@VIEW_SETTINGS
@given(histories())
def test_it_answers_what_the_snapshot_answers_for_every_epoch_and_offset(scenario: Scenario) -> None:
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(directory)
        try:
            apply_in_batches(view, scenario.writer.log, [])
            snapshots = {tp: snapshot_of(view.model.get(vf.tp_key_of(tp))) for tp in PARTITIONS}
        finally:
            view.close()
    fallback = Fallback()
    lookup, _ = _lookup(snapshots, fallback=fallback)
    refused = 0
    for tp, snapshot in snapshots.items():
        for epoch in QUERIED_EPOCHS:
            for offset in interesting_offsets(scenario.added[tp]) | {1 << 62}:
                found = lookup(tp, epoch, offset)
                if snapshot.deleted:  # the method raises what Kafka's manager raises
                    assert found == fallback.answer
                    refused += 1
                else:  # the segment as the snapshot holds it (packed), which the manager unpacks
                    assert found is snapshot.answer_for_offset(epoch, offset), (tp, epoch, offset)
                    unpacked = None if found is None else snapshot.unpack(found)
                    assert unpacked == snapshot.segment_for_offset(epoch, offset), (tp, epoch, offset)
    assert len(fallback.calls) == refused


def test_a_partition_with_several_epochs_is_looked_up_in_the_asked_epochs_floors() -> None:
    snapshot, first, second = _two_epochs()
    lookup, _ = _lookup({TP: snapshot})
    assert lookup(TP, 0, 50) is first
    assert lookup(TP, 1, 150) is second
    assert lookup(TP, 0, 150) is None  # past epoch 0's last floor
    assert lookup(TP, 1, 50) is None  # before epoch 1's first
    assert lookup(TP, 2, 150) is None  # an epoch with no floors


def test_a_partitions_sole_epoch_is_read_from_the_snapshot_itself() -> None:
    only = segment(TP, 10, 19, {4: 10})
    lookup, _ = _lookup({TP: PartitionSnapshot(floors={4: EpochFloors.of([10], [only], [19])})})
    assert [lookup(TP, 4, offset) for offset in (9, 10, 19, 20)] == [None, only, only, None]
    assert lookup(TP, 3, 10) is None


@pytest.mark.parametrize(("args", "kwargs"), [
    ((TP, True, 5), {}),  # a bool is not a plain int: the method's checks decide
    ((TP, 0.0, 5), {}),
    ((TP, -1, 5), {}),
    ((TP, 0, -1), {}),
    ((TP, 0, 1 << 63), {}),  # past what an offset index holds
    ((TP, 0, "5"), {}),
    ((object(), 0, 5), {}),
    ((TopicIdPartition(TP.topic_id, "other", TP.partition), 0, 5), {}),  # the same id under another topic name
    ((TopicIdPartition(TP.topic_id, TP.topic, TP.partition + 1), 0, 5), {}),  # not readable here
    ((TP, 0), {}),
    ((TP, 0, 5, 6), {}),
    ((TP,), {"leader_epoch": 0, "offset": 5}),
], ids=["bool-epoch", "float-epoch", "negative-epoch", "negative-offset", "huge-offset", "str-offset", "not-a-tp",
        "other-topic-name", "unknown-partition", "too-few", "too-many", "keywords"])
def test_every_call_it_does_not_answer_goes_to_the_fallback_unchanged(args: tuple[Any, ...],
                                                                     kwargs: dict[str, Any]) -> None:
    snapshot, _, _ = _two_epochs()
    fallback = Fallback()
    lookup, _ = _lookup({TP: snapshot}, fallback=fallback)
    assert lookup(*args, **kwargs) == fallback.answer
    assert fallback.calls == [(args, kwargs)]


def test_a_subclass_of_topic_id_partition_goes_to_the_fallback() -> None:
    class Named(TopicIdPartition):
        pass

    snapshot, _, _ = _two_epochs()
    fallback = Fallback()
    lookup, _ = _lookup({TP: snapshot}, fallback=fallback)
    assert lookup(Named(TP.topic_id, TP.topic, TP.partition), 0, 5) == fallback.answer


def test_a_deleted_or_halted_partition_goes_to_the_fallback_as_the_state_changes() -> None:
    snapshot, first, _ = _two_epochs()
    halted: dict[int, Exception] = {}
    fallback = Fallback()
    lookup, readable_now = _lookup({TP: snapshot}, halted=halted, fallback=fallback)
    assert lookup(TP, 0, 5) is first
    halted[0] = RuntimeError("metadata partition 0 halted")  # the applier's dict, changed in place
    assert lookup(TP, 0, 5) == fallback.answer
    halted.clear()
    readable = readable_now[(TP.topic_id.int, TP.partition)]
    readable.snapshot = PartitionSnapshot(deleted=True)  # the read model publishes a new snapshot
    assert lookup(TP, 0, 5) == fallback.answer
    readable_now.clear()  # the manager closed or the partition stopped
    readable.snapshot = snapshot
    assert lookup(TP, 0, 5) == fallback.answer
    assert len(fallback.calls) == 3


def test_an_error_of_the_fallback_reaches_the_caller() -> None:
    def refuse(*args: Any) -> object:
        raise LookupError("refused by the method")

    lookup, _ = _lookup({}, fallback=refuse)
    with pytest.raises(LookupError, match="refused by the method"):
        lookup(TP, 0, 5)


def test_answers_hold_no_extra_references_and_the_lookup_is_collected_with_its_manager() -> None:
    snapshot, first, _ = _two_epochs()
    lookup, _ = _lookup({TP: snapshot}, fallback=lambda *args: None)  # keeps nothing it is handed
    lookup(TP, 0, 5)  # the table keeps the snapshot its flat floors were copied from: one reference, from now on
    before = sys.getrefcount(first), sys.getrefcount(snapshot), sys.getrefcount(TP)
    for _ in range(10_000):
        lookup(TP, 0, 5)
        lookup(TP, 1, 5)
        lookup(TP, 0, -1)
    assert (sys.getrefcount(first), sys.getrefcount(snapshot), sys.getrefcount(TP)) == before

    class Owner:  # the manager's shape: it holds the lookup, whose fallback is bound to it
        def method(self, *args: Any) -> None:
            return None

    owner = Owner()
    owner.lookup = SegmentLookup(ReadableTable(), {}, TopicIdPartition, owner.method)  # type: ignore[attr-defined]
    gone = weakref.ref(owner)
    del owner
    gc.collect()
    assert gone() is None


def test_its_arguments_are_checked() -> None:
    with pytest.raises(TypeError):
        SegmentLookup({}, {}, TopicIdPartition, Fallback())  # type: ignore[arg-type]  # a dict is not the table
    with pytest.raises(TypeError, match="fallback must be callable"):
        SegmentLookup(ReadableTable(), {}, TopicIdPartition, 42)  # type: ignore[arg-type]


def test_a_republished_snapshot_is_answered_from_and_the_one_before_is_let_go() -> None:
    snapshot, first, second = _two_epochs()
    lookup, table = _lookup({TP: snapshot})
    assert lookup(TP, 0, 5) is first
    held = sys.getrefcount(snapshot)
    readable = table[(TP.topic_id.int, TP.partition)]
    moved = segment(TP, 0, 49, {3: 0})
    readable.snapshot = PartitionSnapshot(floors={3: EpochFloors.of([0], [moved], [49])})  # the read model's store
    assert lookup(TP, 0, 5) is None
    assert lookup(TP, 3, 5) is moved
    assert lookup(TP, 3, 50) is None
    assert sys.getrefcount(snapshot) == held - 2  # neither the readable nor the flat copy of its floors holds it
    table[(TP.topic_id.int, TP.partition)] = _Readable(TP.topic, vf.tp_key_of(TP), 0)  # a new entry, as on restart
    table[(TP.topic_id.int, TP.partition)].snapshot = snapshot
    assert lookup(TP, 1, 150) is second


@pytest.mark.parametrize(("field", "value"), [
    ("sole_epoch", 1 << 70), ("sole_epoch", "0"), ("sole_epoch", -5), ("deleted", 0), ("sole_segments", []),
    ("sole_bounds", [0, 99]),
], ids=["epoch-past-int64", "epoch-str", "epoch-below-minus-one", "deleted-not-bool", "segments-list",
        "bounds-list"])
def test_a_snapshot_it_cannot_copy_goes_to_the_fallback(field: str, value: object) -> None:
    snapshot, _, _ = _two_epochs()
    object.__setattr__(snapshot, field, value)  # no read model makes these: the C path must not trust its input
    fallback = Fallback()
    lookup, _ = _lookup({TP: snapshot}, fallback=fallback)
    assert lookup(TP, 0, 5) == fallback.answer
    assert len(fallback.calls) == 1


# --- ReadableTable: the mapping the manager keeps its readable partitions in --------------------------------

def test_the_table_keeps_what_a_dict_keeps_through_growth_removal_and_reuse() -> None:
    import random

    rng = random.Random(11)
    ids = [0, 1, (1 << 64) - 1, 1 << 64, (1 << 128) - 1, *(rng.getrandbits(128) for _ in range(300))]
    keys = [(i, p) for i in ids for p in (0, 1, 2**31 - 1)]
    table, model = ReadableTable(), {}
    for step in range(20_000):
        key = rng.choice(keys)
        action = rng.random()
        if action < 0.5:
            table[key] = model[key] = object()
        elif action < 0.7:
            assert table.pop(key, None) is model.pop(key, None)
        elif action < 0.8 and key in model:
            del table[key], model[key]
        elif action < 0.8001:
            table.clear()
            model.clear()
        assert len(table) == len(model)
        assert (key in table) is (key in model)
        assert table.get(key) is model.get(key), step
    assert all(table[key] is value for key, value in model.items())


@pytest.mark.parametrize(("key", "error"), [
    ((-1, 0), OverflowError), ((1 << 128, 0), OverflowError), (("a", 0), TypeError), ((1.0, 0), TypeError),
    ((1, -1), ValueError), ((1, 1 << 63), ValueError), ((1, "0"), ValueError), ((1,), TypeError),
    ((1, 2, 3), TypeError), ([1, 2], TypeError), (None, TypeError),
], ids=["negative-id", "id-too-big", "str-id", "float-id", "negative-partition", "huge-partition", "str-partition",
        "one-item", "three-items", "list", "none"])
def test_the_table_says_what_is_wrong_with_a_key_it_cannot_hold_and_finds_none(key: Any,
                                                                               error: type[Exception]) -> None:
    table = ReadableTable()
    table[(1, 2)] = "held"
    with pytest.raises(error):
        table[key] = object()
    # As in a dict, such a key is simply absent: the manager's reads ask before anything else is checked.
    assert table.get(key) is None and table.get(key, "default") == "default"
    assert key not in table
    assert table.pop(key, "default") == "default"
    with pytest.raises(KeyError):
        table[key]
    with pytest.raises(KeyError):
        del table[key]
    assert len(table) == 1 and table[(1, 2)] == "held"


def test_the_table_says_which_key_it_lacks_and_is_collected_in_a_cycle() -> None:
    table = ReadableTable()
    with pytest.raises(KeyError, match="12"):
        table[(12, 0)]
    with pytest.raises(KeyError):
        del table[(12, 0)]
    with pytest.raises(KeyError):
        table.pop((12, 0))

    class Entry:
        pass

    entry = Entry()
    entry.table = table  # type: ignore[attr-defined]
    table[(12, 0)] = entry
    gone = weakref.ref(entry)
    del entry, table
    gc.collect()
    assert gone() is None
