"""Kafka 4.x's listing of a leader epoch leaves out a finished segment whose offset-index entry a later upload from the
same start took while the epoch went on past that upload (RemoteLogLeaderEpochState: offsetToId.put, the old segment
added to no unreferenced set): the read model's snapshots, folded batch by batch, list as built from scratch and as
the in-memory store does, whether the segment or only the epoch's lineage (a checkpoint) changed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rlmm_testkit import LogRecord, LogWriter, compacted, make_tp, segment, update_of

from rlmm import view_format as vf
from rlmm.events import EpochCheckpoint, EpochLineage, key_of
from rlmm.read_model import snapshot_of
from rlmm.state import InMemoryState, apply_record, list_segments, remote_log_size
from rlmm.types import RemoteLogSegmentState
from rlmm.view import ConsumedRecord, MetadataView, apply_records

S = RemoteLogSegmentState
TP = make_tp("overwritten", 0)
TOPIC = "tierlog-test-metadata"


def _history() -> list[LogRecord]:
    """Epoch 1: X (0-149) finished; Y (0-99) takes X's entry; Z (150-199) goes on; X's delete starts and finishes.
    A two-epoch segment V (200-299, epochs 1 and 2) is overwritten in epoch 1 by U (200-249, epoch 1 only)."""
    writer = LogWriter()
    x = writer.add_and_update(segment(TP, 0, 149, {1: 0}), S.COPY_SEGMENT_FINISHED)
    writer.add_and_update(segment(TP, 0, 99, {1: 0}), S.COPY_SEGMENT_FINISHED)
    writer.add_and_update(segment(TP, 150, 199, {1: 150}), S.COPY_SEGMENT_FINISHED)
    writer.add_and_update(segment(TP, 200, 299, {1: 200, 2: 280}), S.COPY_SEGMENT_FINISHED)
    writer.add_and_update(segment(TP, 200, 249, {1: 200}), S.COPY_SEGMENT_FINISHED)
    writer.update(update_of(x, S.DELETE_SEGMENT_STARTED))
    writer.update(update_of(x, S.DELETE_SEGMENT_FINISHED))
    return writer.log


def _assert_snapshot_lists_as_the_store(view: MetadataView, store: InMemoryState) -> None:
    key = vf.tp_key_of(TP)
    folded = view.model.snapshots[key]
    built = snapshot_of(view.model.get(key))
    assert folded.listings == built.listings and folded.everything == built.everything
    for epoch in (1, 2):
        assert folded.list_segments(epoch) == list_segments(store, TP, epoch)
        assert folded.remote_log_size(epoch) == remote_log_size(store, TP, epoch)
    assert folded.list_segments() == list_segments(store, TP)


@pytest.mark.parametrize("batch", [1, 3])
def test_folded_snapshots_list_each_epoch_as_the_store_through_an_overwrite_and_its_delete(
        tmp_path: Path, batch: int) -> None:
    log = _history()
    # A checkpoint saying epoch 1 overwrote nothing puts the overwritten segments back into its listing, and one
    # saying it overwrote them takes them out again: only the lineage changes.
    store = InMemoryState()
    for key, event in log:
        apply_record(store, key, event)
    current = store.lineage(TP, 1)
    assert current is not None and len(current.overwritten_segment_ids) == 1  # V; X's delete finished
    cleared = EpochLineage(1, current.highest_log_offset, current.displaced_segment_ids)
    log += [(key_of(checkpoint), checkpoint) for checkpoint in (
        EpochCheckpoint(TP, (cleared,), 0, 0, whole_partition=False),
        EpochCheckpoint(TP, (current,), 0, 0, whole_partition=False))]
    view = MetadataView.open(tmp_path)
    reference = InMemoryState()
    try:
        apply_records(view, TOPIC, [ConsumedRecord(0, 0, *log[0])], {0: 1})
        apply_record(reference, *log[0], 0)
        view.model.watch(vf.tp_key_of(TP))
        v_in_epoch_1 = []  # after each batch, whether epoch 1's listing shows V
        for start in range(1, len(log), batch):
            records = [ConsumedRecord(0, at, *log[at]) for at in range(start, min(start + batch, len(log)))]
            apply_records(view, TOPIC, records, {0: records[-1].offset + 1})
            for record in records:
                apply_record(reference, record.key, record.event, record.offset)
            _assert_snapshot_lists_as_the_store(view, reference)
            v_in_epoch_1.append(any(md.segment_leader_epochs.get(2) == 280
                                    for md in view.model.snapshots[vf.tp_key_of(TP)].list_segments(1)))
        if batch == 1:  # out once U overwrote it, back in after the clearing checkpoint, out after the last one
            assert v_in_epoch_1[-3:] == [False, True, False] and True in v_in_epoch_1[:-3]
    finally:
        view.close()


def test_a_compacted_replay_of_the_history_lists_as_the_full_one() -> None:
    log = _history()
    full, node = InMemoryState(), InMemoryState()
    for key, event in log:
        apply_record(full, key, event)
    for key, event in compacted(log):
        apply_record(node, key, event)
    assert node.digest() == full.digest()
    for epoch in (1, 2, None):
        assert list_segments(node, TP, epoch) == list_segments(full, TP, epoch)
