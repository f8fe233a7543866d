"""Unit tests of rlmm.lineage, Kafka's RemoteLogLeaderEpochState rules and the epoch checkpoints over a store.

Each test drives the rules directly on an InMemoryState, records at explicit metadata offsets.
"""

from __future__ import annotations

import dataclasses
import uuid

from rlmm_testkit import make_tp, segment

from rlmm import codec, lineage
from rlmm import view_format as vf
from rlmm.events import EpochCheckpoint, EpochLineage, key_of
from rlmm.state import (
    InMemoryState,
    apply_record,
    highest_offset_for_epoch,
    list_segments,
    remote_log_size,
    segment_for_offset,
)
from rlmm.types import RemoteLogSegmentMetadata, RemoteLogSegmentState

S = RemoteLogSegmentState
TP = make_tp("orders", 0)


def _finished(start: int, end: int, epochs: dict[int, int]) -> RemoteLogSegmentMetadata:
    return segment(TP, start, end, epochs, state=S.COPY_SEGMENT_FINISHED)


def _store_with(*finished: RemoteLogSegmentMetadata) -> InMemoryState:
    store = InMemoryState()
    for offset, md in enumerate(finished):
        store.put_segment(md)
        lineage.reference_finished(store, md, offset)
    return store


def _displaced(store: InMemoryState, epoch: int) -> frozenset[uuid.UUID]:
    found = store.lineage(TP, epoch)
    return found.displaced_segment_ids if found else frozenset()


def test_a_finished_segment_is_indexed_at_its_start_in_each_of_its_epochs() -> None:
    md = _finished(0, 149, {0: 0, 1: 100})
    store = _store_with(md)
    assert store.index_get(TP, 0, 0) == md.remote_log_segment_id.id
    assert store.index_get(TP, 1, 100) == md.remote_log_segment_id.id
    assert highest_offset_for_epoch(store, TP, 0) == 99
    assert highest_offset_for_epoch(store, TP, 1) == 149


def test_a_reupload_covering_the_same_or_a_larger_range_displaces_the_older_segment() -> None:
    old, new = _finished(0, 99, {0: 0}), _finished(0, 149, {0: 0, 1: 100})
    store = _store_with(old, new)
    assert store.index_get(TP, 0, 0) == new.remote_log_segment_id.id
    assert _displaced(store, 0) == {old.remote_log_segment_id.id}


def _overwritten(store: InMemoryState, epoch: int) -> frozenset[uuid.UUID]:
    found = store.lineage(TP, epoch)
    return found.overwritten_segment_ids if found else frozenset()


def _listed_ids(store: InMemoryState, epoch: int | None = None) -> list[uuid.UUID]:
    return [md.remote_log_segment_id.id for md in list_segments(store, TP, epoch)]


def test_a_smaller_reupload_below_the_highest_offset_overwrites_the_entry_and_its_epoch_no_longer_lists_the_older(
) -> None:
    # highestLogOffset (149) is above the new segment's end (99): Kafka's loop stops; offsetToId.put replaces the entry
    # and adds the old segment to no set, so listRemoteLogSegments(epoch) and remoteLogSize(epoch) leave it out while
    # the all-epochs listing still has it.
    old, new = _finished(0, 149, {0: 0}), _finished(0, 99, {0: 0})
    store = _store_with(old, new)
    assert store.index_get(TP, 0, 0) == new.remote_log_segment_id.id
    assert _displaced(store, 0) == frozenset()
    assert _overwritten(store, 0) == {old.remote_log_segment_id.id}
    assert highest_offset_for_epoch(store, TP, 0) == 149
    assert _listed_ids(store, 0) == [new.remote_log_segment_id.id]
    assert remote_log_size(store, TP, 0) == new.segment_size_in_bytes
    assert set(_listed_ids(store)) == {old.remote_log_segment_id.id, new.remote_log_segment_id.id}


def test_an_overwritten_segment_is_listed_in_its_epoch_again_once_its_delete_starts_and_gone_once_it_finishes() -> None:
    old, new = _finished(0, 149, {0: 0}), _finished(0, 99, {0: 0})
    store = _store_with(old, new)
    deleting = dataclasses.replace(old, state=S.DELETE_SEGMENT_STARTED)
    assert apply_record(store, key_of(deleting), deleting, 2).applied
    assert _overwritten(store, 0) == frozenset()
    assert store.index_get(TP, 0, 0) == new.remote_log_segment_id.id
    assert _listed_ids(store, 0) == [new.remote_log_segment_id.id, old.remote_log_segment_id.id]
    deleted = dataclasses.replace(old, state=S.DELETE_SEGMENT_FINISHED)
    assert apply_record(store, key_of(deleted), deleted, 3).applied
    assert _listed_ids(store, 0) == _listed_ids(store) == [new.remote_log_segment_id.id]


def test_an_overwritten_segment_stays_out_of_its_epoch_when_a_later_upload_displaces_the_entry_that_took_it() -> None:
    # Kafka's loop moves only offsetToId's entries to the unreferenced ids: the overwritten segment holds none.
    old, new, larger = _finished(0, 149, {0: 0}), _finished(0, 99, {0: 0}), _finished(0, 199, {0: 0})
    store = _store_with(old, new, larger)
    assert _displaced(store, 0) == {new.remote_log_segment_id.id}
    assert _overwritten(store, 0) == {old.remote_log_segment_id.id}
    assert _listed_ids(store, 0) == [new.remote_log_segment_id.id, larger.remote_log_segment_id.id]


def test_unreferencing_removes_the_index_entry_and_keeps_the_highest_offset() -> None:
    md = _finished(0, 99, {0: 0})
    store = _store_with(md)
    lineage.unreference(store, md, 5)
    assert store.index_get(TP, 0, 0) is None
    assert highest_offset_for_epoch(store, TP, 0) == 99
    assert store.lineage_position(TP) == 5


def test_unreferencing_a_displaced_segment_drops_it_from_the_displaced_set() -> None:
    old, new = _finished(0, 99, {0: 0}), _finished(0, 149, {0: 0})
    store = _store_with(old, new)
    lineage.unreference(store, old, 2)
    assert _displaced(store, 0) == frozenset()
    assert store.index_get(TP, 0, 0) == new.remote_log_segment_id.id


def test_rules_advance_the_lineage_position_to_the_records_offset() -> None:
    store = _store_with(_finished(0, 9, {0: 0}), _finished(10, 19, {0: 10}))
    assert store.lineage_position(TP) == 1


def test_a_checkpoint_that_saw_everything_replaces_the_lineage() -> None:
    old, new = _finished(0, 99, {0: 0}), _finished(0, 149, {0: 0})
    store = _store_with(old, new)
    # It reflects offset 1 (the newer upload) and says the older one is not displaced: it is authoritative.
    restore = EpochCheckpoint(TP, (EpochLineage(0, 149),), 0, 0, reflects_offset=1)
    lineage.apply_checkpoint(store, restore)
    assert _displaced(store, 0) == frozenset()
    # The older one goes back into the index only where the entry is free: the checkpoint does not call the newer
    # one, which holds it, displaced (see test_rlmm_epoch_checkpoints for why).
    assert store.index_get(TP, 0, 0) == new.remote_log_segment_id.id
    assert lineage.pending_checkpoint(store, TP, 0, 0) is None  # its epochs owe no checkpoint any more


def test_a_checkpoint_older_than_the_lineage_never_undoes_a_displacement() -> None:
    old, new = _finished(0, 99, {0: 0}), _finished(0, 149, {0: 0})
    store = _store_with(old, new)
    stale = EpochCheckpoint(TP, (EpochLineage(0, 99),), 0, 0, reflects_offset=0)
    assert lineage.is_stale(store, stale)
    lineage.apply_checkpoint(store, stale)
    assert segment_for_offset(store, TP, 0, 120) == new
    assert _displaced(store, 0) == {old.remote_log_segment_id.id}


def test_a_checkpoint_older_than_the_lineage_still_raises_a_highest_offset() -> None:
    store = _store_with(_finished(0, 99, {0: 0}), _finished(100, 199, {0: 100}))
    stale = EpochCheckpoint(TP, (EpochLineage(0, 500), EpochLineage(3, 7)), 0, 0, reflects_offset=0)
    assert lineage.is_stale(store, stale)
    lineage.apply_checkpoint(store, stale)
    assert highest_offset_for_epoch(store, TP, 0) == 500
    assert highest_offset_for_epoch(store, TP, 3) == 7


def test_after_a_stale_checkpoint_the_writer_owes_a_current_one() -> None:
    old, new = _finished(0, 99, {0: 0}), _finished(0, 149, {0: 0})
    store = _store_with(old, new)
    lineage.apply_checkpoint(store, EpochCheckpoint(TP, (EpochLineage(0, 99),), 0, 0, reflects_offset=0))
    owed = lineage.pending_checkpoint(store, TP, 10, 1)
    assert owed is not None and owed.reflects_offset == 1
    assert owed.epochs == tuple(store.lineages_of(TP))


def test_a_checkpoint_without_a_stamp_is_applied_as_written() -> None:
    # Checkpoints written before tierlog stamped them (schema v1) carry no offset; they keep their old meaning.
    old, new = _finished(0, 99, {0: 0}), _finished(0, 149, {0: 0})
    store = _store_with(old, new)
    legacy = EpochCheckpoint(TP, (EpochLineage(0, 149),), 0, 0)
    assert not lineage.is_stale(store, legacy)


def test_a_replay_without_offsets_applies_every_checkpoint() -> None:
    store = InMemoryState()
    md = _finished(0, 99, {0: 0})
    apply_record(store, key_of(md), md)
    assert store.lineage_position(TP) is None


def test_a_stamped_checkpoint_round_trips_through_the_codec() -> None:
    checkpoint = EpochCheckpoint(TP, (EpochLineage(0, 149, frozenset({uuid.UUID(int=7)})),), 1, 2, 42)
    assert codec.decode(codec.encode(checkpoint)) == checkpoint


def test_a_checkpoint_written_with_schema_v1_decodes_without_a_stamp() -> None:
    checkpoint = EpochCheckpoint(TP, (EpochLineage(0, 149),), 1, 2)
    v1 = next(v for v in codec.registry().by_fingerprint.values()
              if v.name == "epoch_checkpoint_record" and v.version == 1)
    _, datum = codec.to_datum(checkpoint)
    del datum["reflects_offset"]
    assert codec.decode(codec.encode_with(v1, datum)) == checkpoint



def test_partition_bookkeeping_round_trips_in_the_view_format_with_and_without_a_position() -> None:
    digest = bytes(range(32))
    for meta in (vf.PartitionMeta("orders"), vf.PartitionMeta("orders", digest),
                 vf.PartitionMeta("orders", None, 0), vf.PartitionMeta("orders", digest, 2**63 - 1)):
        assert vf.decode_partition_meta(vf.encode_partition_meta(meta)) == meta


def test_partition_bookkeeping_written_before_positions_existed_reads_with_an_unknown_position() -> None:
    legacy = len(b"orders").to_bytes(2, "big") + b"orders" + bytes(range(32))
    assert vf.decode_partition_meta(legacy) == vf.PartitionMeta("orders", bytes(range(32)), None)
