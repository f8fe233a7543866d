"""A node keeps in memory only the partitions it hosts (leads or follows), applies every other partition to disk,
and answers exactly as before when what it hosts changes: leadership moving to it, partitions stopped, a partition
hosted again after it was let go.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from pathlib import Path

from rlmm_testkit import ApiWrite, drive, make_tp, register, wait_digest, workload
from support import wait_until

from rlmm import RemoteLogMetadataManager
from rlmm import view_format as vf
from rlmm.types import RemoteLogSegmentMetadata, TopicIdPartition

MakeManager = Callable[..., RemoteLogMetadataManager]
PARTITIONS = 3
CAUGHT_UP_S = 60.0


def answers(manager: RemoteLogMetadataManager, tp: TopicIdPartition) -> list[object]:
    """What the manager answers for tp: its listings, and per epoch the highest offset, the size and a lookup at
    every offset its segments start or end at."""
    segments = manager.list_remote_log_segments(tp)
    epochs = sorted({epoch for md in segments for epoch in md.segment_leader_epochs} | {0})
    offsets = sorted({o for md in segments for o in (md.start_offset, md.end_offset, md.end_offset + 1)})
    found: list[object] = [segments]
    for epoch in epochs:
        found += [manager.list_remote_log_segments(tp, epoch), manager.highest_offset_for_epoch(tp, epoch),
                  manager.remote_log_size(tp, epoch)]
        found += [manager.remote_log_segment_metadata(tp, epoch, offset) for offset in offsets]
    return found


def held(manager: RemoteLogMetadataManager) -> set[bytes]:
    return set(manager.view.model.partitions)


def keys(tps: Sequence[TopicIdPartition]) -> set[bytes]:
    return {vf.tp_key_of(tp) for tp in tps}


def test_nodes_hosting_different_partitions_hold_equal_views_and_only_their_own_partitions_in_memory(
    make_manager: MakeManager,
) -> None:
    rng = random.Random(25)
    mine = [make_tp("orders", p) for p in range(3)]
    theirs = [make_tp("payments", p) for p in range(3)]
    a = make_manager(broker_id=0, partitions=PARTITIONS)
    b = make_manager(broker_id=1, partitions=PARTITIONS)
    register(a, *mine)
    register(b, *theirs)
    drive(a, {tp: workload(rng, tp, uploads=10) for tp in mine})
    drive(b, {tp: workload(rng, tp, uploads=10) for tp in theirs})
    for manager in (a, b):
        manager.wait_caught_up(CAUGHT_UP_S)
    wait_digest(b, a.view_digest())
    answered = {tp: answers(a, tp) for tp in mine}
    assert held(a) <= keys(mine), "node 0 holds partitions it does not host"
    assert held(b) <= keys(theirs), "node 1 holds partitions it does not host"
    assert not held(a) & keys(theirs)

    # Leadership of node 1's partitions moves to node 0, which stops its own: it answers as node 1 did, from the
    # view it kept on disk, and lets its former partitions go.
    before = {tp: answers(b, tp) for tp in theirs}
    b.on_stop_partitions(theirs)
    register(a, *theirs)
    a.on_stop_partitions(mine)
    assert {tp: answers(a, tp) for tp in theirs} == before
    assert held(a) <= keys(theirs)

    # It goes on writing them, node 1 follows them now: both views stay equal.
    register(b, *theirs, leader=False)
    drive(a, {tp: later_uploads(rng, a, tp) for tp in theirs})
    a.wait_caught_up(CAUGHT_UP_S)
    wait_digest(b, a.view_digest())
    assert {tp: answers(b, tp) for tp in theirs} == {tp: answers(a, tp) for tp in theirs}

    # A partition hosted again after it was let go is read back whole.
    register(a, *mine)
    assert {tp: answers(a, tp) for tp in mine} == answered


def later_uploads(rng: random.Random, manager: RemoteLogMetadataManager, tp: TopicIdPartition) -> list[ApiWrite]:
    """A new leader's writes for tp: a workload moved past the offsets and leader epochs tp already holds."""
    held_segments = manager.list_remote_log_segments(tp)
    by = max((md.end_offset for md in held_segments), default=-1) + 1
    epochs_from = max((e for md in held_segments for e in md.segment_leader_epochs), default=0) + 1
    return [RemoteLogSegmentMetadata(
        write.remote_log_segment_id, write.start_offset + by, write.end_offset + by, write.max_timestamp_ms,
        write.broker_id, write.event_timestamp_ms, write.segment_size_in_bytes,
        {epoch + epochs_from: start + by for epoch, start in write.segment_leader_epochs.items()},
        write.custom_metadata, write.state, write.txn_idx_empty,
    ) if isinstance(write, RemoteLogSegmentMetadata) else write for write in workload(rng, tp, uploads=6)]


def lookups(manager: RemoteLogMetadataManager, tp: TopicIdPartition, segments: list[RemoteLogSegmentMetadata]
            ) -> dict[tuple[int, int], RemoteLogSegmentMetadata | None]:
    epochs = sorted({epoch for md in segments for epoch in md.segment_leader_epochs} | {0})
    offsets = sorted({o for md in segments for o in (md.start_offset, md.end_offset, md.end_offset + 1)})
    return {(epoch, offset): manager.remote_log_segment_metadata(tp, epoch, offset)
            for epoch in epochs for offset in offsets}


def test_the_first_lookups_after_a_restart_are_answered_from_disk_exactly_as_from_memory(
    make_manager: MakeManager, tmp_path: Path,
) -> None:
    """A restarted node does not read a partition whole on the fetch path: its first lookups are answered key by
    key from the view on disk while the partition is read in the background, and answer what it answers after.
    (With the warm-up off, so that no partition is read before its first lookup, and without the state the node
    kept when it closed, which a crash would not have left: tests/rlmm/test_rlmm_resume.py.)"""
    tps, segments, warm = restarted_history(make_manager, tmp_path)
    restarted = make_manager(broker_id=0, partitions=PARTITIONS, state_dir=tmp_path / "node",
                             **{"lookup.warmup": False, "lookup.resume": False})
    register(restarted, *tps)
    assert not held(restarted), "a restart read partitions before any lookup"
    cold = {tp: lookups(restarted, tp, segments[tp]) for tp in tps}
    assert cold == warm
    wait_until(lambda: held(restarted) == keys(tps), timeout=CAUGHT_UP_S,
               description="the partitions read in the background")
    assert {tp: lookups(restarted, tp, segments[tp]) for tp in tps} == warm


def test_a_restarted_node_reads_its_hosted_partitions_in_the_background_without_a_lookup_and_answers_the_same(
    make_manager: MakeManager, tmp_path: Path,
) -> None:
    """The warm-up: once registered and ready, every hosted partition is read into memory on the loader's thread,
    and the partitions the node does not host stay on disk."""
    tps, segments, warm = restarted_history(make_manager, tmp_path)
    hosted, other = tps[:2], tps[2:]
    restarted = make_manager(broker_id=0, partitions=PARTITIONS, state_dir=tmp_path / "node")
    register(restarted, *hosted)
    wait_until(lambda: held(restarted) == keys(hosted), timeout=CAUGHT_UP_S,
               description="the hosted partitions read in the background")
    wait_until(lambda: restarted.partitions_loading() == 0, timeout=CAUGHT_UP_S,
               description="the loader done with the hosted partitions")
    assert {tp: lookups(restarted, tp, segments[tp]) for tp in hosted} == {tp: warm[tp] for tp in hosted}
    assert not held(restarted) & keys(other)

    # A partition stopped is let go; one newly hosted is read in the background too.
    restarted.on_stop_partitions(hosted[:1])
    assert not held(restarted) & keys(hosted[:1])
    register(restarted, *other)
    wait_until(lambda: held(restarted) == keys([*hosted[1:], *other]), timeout=CAUGHT_UP_S,
               description="the newly hosted partition read in the background")
    assert {tp: lookups(restarted, tp, segments[tp]) for tp in other} == {tp: warm[tp] for tp in other}


def restarted_history(make_manager: MakeManager, tmp_path: Path) -> tuple[
        list[TopicIdPartition], dict[TopicIdPartition, list[RemoteLogSegmentMetadata]],
        dict[TopicIdPartition, dict[tuple[int, int], RemoteLogSegmentMetadata | None]]]:
    """Three partitions written by a node at tmp_path/node, then closed: the partitions, their segments, and what
    lookups of them answered before the node closed."""
    tps = [make_tp("orders", p) for p in range(3)]
    first = make_manager(broker_id=0, partitions=PARTITIONS, state_dir=tmp_path / "node")
    register(first, *tps)
    drive(first, {tp: workload(random.Random(tp.partition), tp, uploads=12) for tp in tps})
    first.wait_caught_up(CAUGHT_UP_S)
    segments = {tp: first.list_remote_log_segments(tp) for tp in tps}
    warm = {tp: lookups(first, tp, segments[tp]) for tp in tps}
    first.close()
    return tps, segments, warm
