"""The real manager against the reference model: one seeded random call sequence, valid and invalid calls,
overlapping uploads across leader epochs, partition deletion; every answer compared after every call.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from rlmm_strategies import interesting_offsets
from rlmm_testkit import ApiWrite, call_error, make_tp, partition_delete, register, segment, submit, update_of
from support.reference_model import ReferenceModel

from rlmm import (
    RemoteLogMetadataManager,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    RemoteStorageError,
    TopicIdPartition,
)
from rlmm._segment_lookup import SegmentLookup
from rlmm.read_model import DECODED_ANSWERS_MAX

S = RemoteLogSegmentState
P = RemotePartitionDeleteState
MakeManager = Callable[..., RemoteLogMetadataManager]
CALLS = 150
_NEXT_DELETE = {None: P.DELETE_PARTITION_MARKED, P.DELETE_PARTITION_MARKED: P.DELETE_PARTITION_STARTED,
                P.DELETE_PARTITION_STARTED: P.DELETE_PARTITION_FINISHED}


def random_write(rng: random.Random, tp: TopicIdPartition, added: list[RemoteLogSegmentMetadata],
                 model: ReferenceModel, deletion: P | None) -> ApiWrite:
    roll = rng.random()
    if not added or roll < 0.35:
        start = rng.choice([0, 10, 20, *[md.start_offset for md in added]])
        end = start + rng.randint(0, 25)
        epochs = {rng.randint(0, 2): start}
        if end > start and rng.random() < 0.4:
            epochs[max(epochs) + 1] = rng.randint(start + 1, end)
        state = S.COPY_SEGMENT_STARTED if rng.random() < 0.9 else rng.choice(list(S))
        md = segment(tp, start, end, epochs, state=state, txn_idx_empty=rng.random() < 0.5,
                     size=rng.randint(1, 1000))
        if state is S.COPY_SEGMENT_STARTED:
            added.append(md)
        return md
    if roll < 0.88:
        md = rng.choice(added)
        current = None if model.is_deleted(tp) else model.segment(tp, md.remote_log_segment_id.id)
        forward = {S.COPY_SEGMENT_STARTED: S.COPY_SEGMENT_FINISHED, S.COPY_SEGMENT_FINISHED: S.DELETE_SEGMENT_STARTED}
        target = forward.get(current.state, S.DELETE_SEGMENT_FINISHED) if current and rng.random() < 0.75 \
            else rng.choice(list(S))
        return update_of(md, target, custom_metadata=rng.randbytes(2))
    delete_target = _NEXT_DELETE.get(deletion, P.DELETE_PARTITION_FINISHED) if rng.random() < 0.7 \
        else rng.choice(list(P))
    return partition_delete(tp, delete_target)


def model_call(model: ReferenceModel, write: ApiWrite) -> Exception | None:
    if isinstance(write, RemoteLogSegmentMetadata):
        return call_error(lambda: model.add_remote_log_segment_metadata(write))
    if isinstance(write, RemoteLogSegmentMetadataUpdate):
        return call_error(lambda: model.update_remote_log_segment_metadata(write))
    return call_error(lambda: model.put_remote_partition_delete_metadata(write))


def answers(reads: Callable[[], object]) -> object:
    """A read's result, or the type of the error it raised."""
    try:
        return reads()
    except Exception as exc:
        return type(exc)


@pytest.mark.parametrize(("native", "decoded"), [(True, DECODED_ANSWERS_MAX), (True, 0), (False, 0)],
                         ids=["lookup-in-c", "lookup-in-c-packed-answers", "lookup-in-python-packed-answers"])
def test_the_manager_answers_like_the_reference_model_through_a_random_call_sequence(
    make_manager: MakeManager, native: bool, decoded: int
) -> None:
    rng = random.Random(2024)
    manager = make_manager(partitions=2, **{"lookup.native": native, "lookup.decoded.max.segments": decoded})
    # The fetch path's lookup is the C one (rlmm/_segment_lookup.c) exactly when asked for; either answers alike.
    assert isinstance(getattr(manager.remote_log_segment_metadata, "__wrapped__", None), SegmentLookup) is native
    model = ReferenceModel()
    tps = [make_tp("orders", 0), make_tp("orders", 1)]
    register(manager, *tps)
    added: dict[TopicIdPartition, list[RemoteLogSegmentMetadata]] = {tp: [] for tp in tps}
    deletion: dict[TopicIdPartition, P | None] = {tp: None for tp in tps}
    for call in range(CALLS):
        tp = rng.choice(tps)
        write = random_write(rng, tp, added[tp], model, deletion[tp])
        was_deleted = model.is_deleted(tp)
        expected_error = model_call(model, write)
        error = call_error(lambda: submit(manager, write))  # noqa: B023 - called at once
        if was_deleted:  # every call is refused; which error wins over an argument invalid anyway is open
            assert isinstance(error, RemoteStorageError), f"call {call} {write} accepted after the deletion"
        else:
            assert type(error) is type(expected_error), (
                f"call {call} {write}: model {expected_error!r}, manager {error!r}")
        if expected_error is None and isinstance(write, RemotePartitionDeleteMetadata):
            deletion[tp] = write.state
        for checked in tps:
            assert answers(lambda: manager.list_remote_log_segments(checked)) == answers(  # noqa: B023
                lambda: model.list_remote_log_segments(checked)), f"after call {call}"  # noqa: B023
            for epoch in range(4):
                assert answers(lambda: manager.highest_offset_for_epoch(checked, epoch)) == answers(  # noqa: B023
                    lambda: model.highest_offset_for_epoch(checked, epoch)), f"after call {call}"  # noqa: B023
                for offset in interesting_offsets(added[checked]):
                    assert answers(lambda: manager.remote_log_segment_metadata(checked, epoch, offset)) == answers(  # noqa: B023
                        lambda: model.remote_log_segment_metadata(checked, epoch, offset)), (  # noqa: B023
                        f"after call {call}: epoch {epoch} offset {offset}")
    assert any(model.is_deleted(tp) for tp in tps), "the seeded sequence should reach a finished partition deletion"
