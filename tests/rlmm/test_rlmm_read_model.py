"""The view's in-memory read model: folded batch by batch, it is exactly the model loaded from RocksDB.

Lookups read only the model (rlmm.read_model), so a fold that drifted from what the WriteBatch stored would
answer differently before and after a restart; these properties pin that it never does.
"""

from __future__ import annotations

import tempfile
from typing import Any
from unittest.mock import patch

from hypothesis import given
from hypothesis import strategies as st
from rlmm_strategies import (
    PARTITIONS,
    QUERIED_EPOCHS,
    Scenario,
    assert_same_answers,
    histories,
    interesting_offsets,
)
from test_rlmm_view_properties import VIEW_SETTINGS, apply_in_batches, batch_cuts

from rlmm import read_model
from rlmm import view_format as vf
from rlmm.read_model import DECODED_ANSWERS_MAX, PartitionSnapshot, ReadModel, snapshot_of
from rlmm.types import TopicIdPartition
from rlmm.view import MetadataView


def _canonical(model: ReadModel) -> dict[bytes, Any]:
    """Every partition of the scenario as the model holds it (read from RocksDB if not read yet)."""
    found = {}
    for key in (vf.tp_key_of(tp) for tp in PARTITIONS):
        p = model.get(key)
        if p is not None:
            found[key] = (p.tp, p.meta, dict(p.segments), p.delete, dict(p.lineages),
                          {epoch: list(index.items()) for epoch, index in p.index.items() if index})
    return found


@VIEW_SETTINGS
@given(histories(), batch_cuts)
def test_the_folded_read_model_is_the_one_loaded_from_rocksdb(scenario: Scenario, cuts: list[int]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(directory)
        try:
            apply_in_batches(view, scenario.writer.log, cuts)
            read_before = {key for key, p in view.model.partitions.items() if p is not None}
            folded = _canonical(view.model)
            # Every partition the batches touched was read by the apply path, and so folded, not re-read.
            assert read_before == set(folded)
        finally:
            view.close()
        reopened = MetadataView.open(directory)
        try:
            assert not reopened.model.partitions  # nothing is read before it is asked for
            assert _canonical(reopened.model) == folded
            assert_same_answers(scenario, reopened.batch())  # an empty batch reads the loaded model
        finally:
            reopened.close()


def _assert_read_again_as(directory: str, folded: dict[bytes, Any]) -> None:
    """The view in `directory`, opened again, reads every partition from RocksDB as `folded` holds it."""
    reopened = MetadataView.open(directory)
    try:
        assert _canonical(reopened.model) == folded
    finally:
        reopened.close()


@VIEW_SETTINGS
@given(histories(), batch_cuts, st.lists(st.booleans(), min_size=len(PARTITIONS), max_size=len(PARTITIONS)))
def test_a_partition_read_between_a_batchs_write_and_its_fold_ends_as_if_read_after_it(
    scenario: Scenario, cuts: list[int], reread: list[bool],
) -> None:
    """Another thread may read a partition the model has not read yet after the applier wrote a batch and before
    it folded it: the partition then already holds the batch and the fold must change nothing. A partition still
    unread at the fold is not folded; it is read, batch included, when asked for."""
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(directory)
        model = view.model
        write = view._write

        def write_then_forget(batch: Any) -> None:
            write(batch)
            for tp, again in zip(PARTITIONS, reread, strict=True):
                key = vf.tp_key_of(tp)
                with model.lock:
                    model.partitions.pop(key, None)
                    if again:
                        model.get(key)

        view._write = write_then_forget  # type: ignore[method-assign]
        try:
            apply_in_batches(view, scenario.writer.log, cuts)
            folded = _canonical(model)
        finally:
            view.close()
        _assert_read_again_as(directory, folded)


@VIEW_SETTINGS
@given(histories(), st.lists(st.integers(0, 200), min_size=1, max_size=8), st.data())
def test_a_partition_prepared_while_batches_fold_ends_as_the_model_read_after_them(
    scenario: Scenario, cuts: list[int], data: st.DataObject,
) -> None:
    """`prepare` reads a hosted partition and builds its snapshot without the model's lock, while the applier folds
    batches: one folded at any point of its read, after it or while its snapshot is built must not be lost. Each
    step of prepare's work (every entry read, the end of the read, the snapshot's building) may apply the next
    batch; every partition then ends as the one read from RocksDB after all of them, with its snapshot built from
    it."""
    log = scenario.writer.log
    ends = [*sorted(set(cuts)), len(log)]
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(directory)
        model = view.model
        model.hold_hosted()
        keys = [vf.tp_key_of(tp) for tp in PARTITIONS]
        model.host(keys)
        applied = [0]

        def apply_next() -> None:
            end = ends.pop(0)
            apply_in_batches(view, log[:end], [], applied[0])
            applied[0] = max(applied[0], end)

        def maybe_apply_next() -> None:
            # Only where the applier's thread could fold: not while this thread holds the lock (`prepare`'s reads
            # under it, which a fold waits for).
            if not model.lock._is_owned() and ends and data.draw(st.booleans()):  # type: ignore[attr-defined]
                apply_next()

        read, build = model._read_view, read_model.snapshot_of

        def read_then_maybe_apply(tp_key: bytes, pause: Any) -> Any:
            found = read(tp_key, pause)
            maybe_apply_next()
            return found

        def maybe_apply_then_build(partition: Any) -> PartitionSnapshot:
            maybe_apply_next()
            return build(partition)

        model._read_view = read_then_maybe_apply
        with patch.object(read_model, "PAUSE_EVERY", 1), \
                patch.object(read_model, "snapshot_of", maybe_apply_then_build):
            try:
                maybe_apply_next()
                for key in keys:
                    model.prepare(key, maybe_apply_next)
                while ends:
                    apply_next()
                model._read_view = read
                for key in keys:
                    if key in model.snapshots:
                        _assert_is_snapshot_of(model.snapshots[key], model, key)
                folded = _canonical(model)
            finally:
                view.close()
        _assert_read_again_as(directory, folded)


@VIEW_SETTINGS
@given(histories(), batch_cuts, st.sampled_from([DECODED_ANSWERS_MAX, 0]))
def test_each_folded_batch_publishes_the_snapshot_built_from_the_model(scenario: Scenario, cuts: list[int],
                                                                       decoded_answers_max: int) -> None:
    """With answers decoded (the default bound) and packed (none decoded)."""
    log = scenario.writer.log
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(directory)
        try:
            model = view.model
            model.decoded_answers_max = decoded_answers_max
            keys = [vf.tp_key_of(tp) for tp in PARTITIONS]
            for key in keys:
                model.watch(key)
            start = 0
            for end in [*sorted(set(cuts)), len(log)]:
                if end > start:
                    apply_in_batches(view, log[:end], [], start)
                    start = end
                for key in keys:
                    _assert_is_snapshot_of(model.snapshots[key], model, key)
            for tp, key in zip(PARTITIONS, keys, strict=True):
                if not scenario.model.is_deleted(tp):
                    _assert_answers_like_the_reference(scenario, tp, model.snapshots[key])
        finally:
            view.close()


def _assert_is_snapshot_of(folded: PartitionSnapshot, model: ReadModel, key: bytes) -> None:
    partition = model.get(key)
    if partition is None and folded.deleted:  # forgotten after its delete finished: refused until checked again
        assert folded == PartitionSnapshot(deleted=True)
    else:
        assert folded == snapshot_of(partition)


def _assert_answers_like_the_reference(scenario: Scenario, tp: TopicIdPartition, snapshot: PartitionSnapshot) -> None:
    reference = scenario.model
    assert snapshot.list_segments() == reference.list_remote_log_segments(tp)
    for epoch in QUERIED_EPOCHS:
        assert snapshot.list_segments(epoch) == reference.list_remote_log_segments(tp, epoch)
        assert snapshot.remote_log_size(epoch) == reference.remote_log_size(tp, epoch)
        assert snapshot.highest_offset_for_epoch(epoch) == reference.highest_offset_for_epoch(tp, epoch)
        for offset in interesting_offsets(scenario.added[tp]):
            assert snapshot.segment_for_offset(epoch, offset) == reference.remote_log_segment_metadata(
                tp, epoch, offset), (epoch, offset)
            assert snapshot.next_segment_with_txn_index(epoch, offset) == reference.next_segment_with_txn_index(
                tp, epoch, offset), (epoch, offset)
