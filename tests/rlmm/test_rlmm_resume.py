"""A node closed cleanly keeps its hosted partitions' in-memory state beside its view (rlmm.resume_file), and its
restart serves them from memory as soon as they are ready, exactly as it would have after reading them from the view;
whatever changed since (records applied, a view written by something else, a garbled file) is read from the view."""

from __future__ import annotations

import dataclasses
import logging
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from rlmm_testkit import LogWriter, drive, make_tp, register, wait_ready, workload
from support import wait_until
from test_rlmm_hosted_partitions import answers, held, keys, later_uploads

from rlmm import RemoteLogMetadataManager, codec, read_model, resume_file
from rlmm import manager as manager_module
from rlmm import view_format as vf
from rlmm.archive import to_archived
from rlmm.errors import RemoteResourceNotFoundError
from rlmm.read_model import PartitionSnapshot, read_partition, snapshot_of
from rlmm.snapshot import apply_archived
from rlmm.types import RemoteLogSegmentMetadata, TopicIdPartition
from rlmm.view import MetadataView

MakeManager = Callable[..., RemoteLogMetadataManager]
PARTITIONS = 3
CAUGHT_UP_S = 60.0


def _kept(state_dir: Path) -> Path:
    return state_dir / "view" / resume_file.FILE_NAME


def _served_then_closed(make_manager: MakeManager, state_dir: Path, tps: list[TopicIdPartition], seed: int,
                        **config: object) -> dict[TopicIdPartition, list[object]]:
    """A node that wrote workloads for tps, served them all from memory and closed; what it answered."""
    rng = random.Random(seed)
    node = make_manager(state_dir=state_dir, partitions=PARTITIONS, **config)
    register(node, *tps)
    drive(node, {tp: workload(rng, tp, uploads=12, delete_partition=tp.partition == 3) for tp in tps})
    node.wait_caught_up(CAUGHT_UP_S)
    wait_until(lambda: node.partitions_loading() == 0, timeout=CAUGHT_UP_S, description="every partition in memory")
    answered = {tp: answered_by(node, tp) for tp in tps}
    node.close()
    return answered


def answered_by(node: RemoteLogMetadataManager, tp: TopicIdPartition) -> list[object]:
    """`answers`, or for a partition whose remote data was deleted, the error a read raises."""
    try:
        return answers(node, tp)
    except RemoteResourceNotFoundError as exc:
        return [type(exc)]


@pytest.mark.parametrize("decoded", [0, 30, 10_000], ids=["packed", "some-decoded", "decoded"])
def test_a_restarted_node_holds_what_it_served_at_once_and_answers_as_before(
    make_manager: MakeManager, tmp_path: Path, decoded: int
) -> None:
    state_dir = tmp_path / "node"
    tps = [make_tp("orders", p) for p in range(4)]
    config = {"lookup.decoded.max.segments": decoded}
    before = _served_then_closed(make_manager, state_dir, tps, 51, **config)
    assert _kept(state_dir).exists()

    node = make_manager(state_dir=state_dir, partitions=PARTITIONS, **config)
    assert not _kept(state_dir).exists(), "a kept state is taken once"
    node.on_partition_leadership_changes(set(tps), set())
    # Held as soon as hosted, before the node found them ready (a node reading them from the view holds nothing
    # until then); partition 3 was deleted, its forgotten state is held as nothing.
    assert keys(tps) <= held(node)
    wait_ready(node, *tps)
    assert {tp: answered_by(node, tp) for tp in tps} == before


@pytest.mark.parametrize("batch", [2000, 4], ids=["applied", "caught-up"])
def test_a_partition_that_records_changed_since_is_read_from_the_view_and_the_others_resumed(
    make_manager: MakeManager, tmp_path: Path, batch: int
) -> None:
    """Whether the restarted node applies the records as they come or, as a backlog (more than a batch), folds them
    into partitions it borrows and gives back (rlmm.read_model.ReadModel.borrow)."""
    state_dir = tmp_path / "node"
    tps = [make_tp("orders", p) for p in range(3)]
    _served_then_closed(make_manager, state_dir, tps, 52)
    # Another broker leads partition 0 meanwhile and uploads more.
    other = make_manager(broker_id=1, partitions=PARTITIONS)
    register(other, tps[0])
    drive(other, {tps[0]: later_uploads(random.Random(53), other, tps[0])})
    other.wait_caught_up(CAUGHT_UP_S)

    node = make_manager(state_dir=state_dir, partitions=PARTITIONS,
                        **{"lookup.warmup": False, "apply.batch.max.records": batch})
    node.wait_caught_up(CAUGHT_UP_S)  # partition 0's new records applied before the node hosts it again
    node.on_partition_leadership_changes(set(tps), set())
    assert held(node) == keys(tps[1:]), "partition 0's kept state is stale: it is read from the view"
    wait_ready(node, *tps)
    register(other, *tps[1:], leader=False)
    assert {tp: answered_by(node, tp) for tp in tps} == {tp: answered_by(other, tp) for tp in tps}


def test_a_view_written_since_the_state_was_kept_is_read_from_disk_with_a_log_line(
    make_manager: MakeManager, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state_dir = tmp_path / "node"
    tps = [make_tp("orders", p) for p in range(3)]
    before = _served_then_closed(make_manager, state_dir, tps, 54)
    _write_to(state_dir)  # as a tool writing to the view while the node was down

    with caplog.at_level(logging.INFO, logger="rlmm"):
        node = make_manager(state_dir=state_dir, partitions=PARTITIONS)
        node.on_partition_leadership_changes(set(tps), set())
        assert not held(node)
    assert "was written for the view as it was before" in caplog.text
    assert not _kept(state_dir).exists()
    wait_ready(node, *tps)
    assert {tp: answered_by(node, tp) for tp in tps} == before


def test_a_garbled_partition_is_read_from_disk_and_the_others_resumed(
    make_manager: MakeManager, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    state_dir = tmp_path / "node"
    tps = [make_tp("orders", p) for p in range(3)]
    before = _served_then_closed(make_manager, state_dir, tps, 55)
    kept = _kept(state_dir)
    data = bytearray(kept.read_bytes())
    data[len(b"tierlog hosted state\n") + 40] ^= 0xFF  # inside the first partition's blob
    kept.write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING, logger="rlmm"):
        node = make_manager(state_dir=state_dir, partitions=PARTITIONS)
        node.on_partition_leadership_changes(set(tps), set())
    assert "is not valid (its CRC-32 does not match)" in caplog.text
    assert len(held(node) & keys(tps)) == len(tps) - 1
    wait_ready(node, *tps)
    assert {tp: answered_by(node, tp) for tp in tps} == before


@pytest.mark.parametrize("garbage", [b"", b"not a hosted-state file", b"tierlog hosted state\n\xff\xff\xff"])
def test_a_file_that_is_not_a_kept_state_is_removed_with_a_log_line(
    make_manager: MakeManager, tmp_path: Path, caplog: pytest.LogCaptureFixture, garbage: bytes
) -> None:
    state_dir = tmp_path / "node"
    tps = [make_tp("orders", p) for p in range(2)]
    before = _served_then_closed(make_manager, state_dir, tps, 56)
    _kept(state_dir).write_bytes(garbage)
    with caplog.at_level(logging.WARNING, logger="rlmm"):
        node = make_manager(state_dir=state_dir, partitions=PARTITIONS)
    assert "is not a valid hosted-state file" in caplog.text
    assert not _kept(state_dir).exists()
    register(node, *tps)
    assert {tp: answered_by(node, tp) for tp in tps} == before


@pytest.mark.parametrize("resume", [True, False], ids=["resume", "resume-off"])
def test_a_file_a_crash_left_half_written_is_removed_at_start(
    make_manager: MakeManager, tmp_path: Path, resume: bool
) -> None:
    state_dir = tmp_path / "node"
    tps = [make_tp("orders", p) for p in range(2)]
    _served_then_closed(make_manager, state_dir, tps, 54)
    half_written = _kept(state_dir).with_name(resume_file.FILE_NAME + ".tmp")
    half_written.write_bytes(_kept(state_dir).read_bytes()[:100])
    node = make_manager(state_dir=state_dir, partitions=PARTITIONS, **{"lookup.resume": resume, "lookup.warmup": False})
    assert not half_written.exists()
    register(node, *tps)
    assert (held(node) == keys(tps)) is resume, "the complete file beside it is taken as ever"


def test_partitions_registered_by_a_later_call_within_the_hold_are_resumed_too(
    make_manager: MakeManager, tmp_path: Path
) -> None:
    state_dir = tmp_path / "node"
    tps = [make_tp("orders", p) for p in range(3)]
    before = _served_then_closed(make_manager, state_dir, tps, 56)
    node = make_manager(state_dir=state_dir, partitions=PARTITIONS)
    register(node, tps[0])
    assert held(node) == keys(tps[:1])
    assert node.view.model.resuming(), "the others are held for a later registration"
    node.on_partition_leadership_changes(set(), set(tps[1:]))
    assert held(node) == keys(tps)
    assert not node.view.model.resuming(), "every kept partition is taken: the file is let go"
    wait_ready(node, *tps)
    assert {tp: answered_by(node, tp) for tp in tps} == before


@pytest.mark.parametrize("warmup", [False, True], ids=["asked-for", "warm-up"])
def test_what_a_registration_has_no_time_to_hold_is_taken_from_the_kept_state_later(
    make_manager: MakeManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warmup: bool
) -> None:
    """A registration holds kept partitions for RESUME_AT_ONCE_S at most (the broker's metadata thread waits for it);
    here none: each is taken as it was kept, not read from the view, when a lookup asks for it or the loader's
    warm-up comes to it."""
    state_dir = tmp_path / "node"
    tps = [make_tp("orders", p) for p in range(3)]
    before = _served_then_closed(make_manager, state_dir, tps, 55)
    monkeypatch.setattr(manager_module, "RESUME_AT_ONCE_S", 0.0)
    node = make_manager(state_dir=state_dir, partitions=PARTITIONS, **{"lookup.warmup": warmup})
    register(node, *tps)
    if warmup:
        wait_until(lambda: held(node) == keys(tps), timeout=CAUGHT_UP_S, description="every partition held")
    else:
        assert not held(node)
    assert {tp: answered_by(node, tp) for tp in tps} == before
    assert held(node) == keys(tps)
    assert not node.view.model.resuming(), "each was taken from the kept state"


def _answer_kinds(snapshot: PartitionSnapshot) -> set[type]:
    """The kinds of the answers a snapshot holds: bytes (packed) or RemoteLogSegmentMetadata."""
    return {type(found) for floors in snapshot.floors.values() for found in floors.segments if found is not None}


@pytest.mark.parametrize("at_once", [True, False], ids=["by-the-registration", "when-prepared"])
def test_the_answers_of_a_resumed_partition_granted_that_are_decoded(
    make_manager: MakeManager, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at_once: bool
) -> None:
    """A registration takes every kept partition first, its answers packed (unpacking them took a third of its time
    at 1M hosted segments), then decodes those of the partitions granted decoded answers in the time left; what it
    had no time for is taken and decoded by `prepare` (the loader's). The answers are the same throughout."""
    state_dir = tmp_path / "node"
    tps = [make_tp("orders", p) for p in range(3)]
    before = _served_then_closed(make_manager, state_dir, tps, 62)
    if not at_once:
        monkeypatch.setattr(manager_module, "RESUME_AT_ONCE_S", 0.0)
    node = make_manager(state_dir=state_dir, partitions=PARTITIONS, **{"lookup.warmup": False})
    register(node, *tps)
    model = node.view.model
    if at_once:
        assert held(node) == keys(tps)
    else:
        assert not held(node)
        for tp in tps:
            model.prepare(vf.tp_key_of(tp))
    for tp in tps:
        tp_key = vf.tp_key_of(tp)
        assert _answer_kinds(model.snapshots[tp_key]) == {RemoteLogSegmentMetadata}
        assert model.snapshots[tp_key] == snapshot_of(model.partitions[tp_key])
    assert not model._undecoded
    assert {tp: answered_by(node, tp) for tp in tps} == before


@pytest.mark.parametrize("replaced", [1, read_model.DECODE_TRIES], ids=["once", "every-time"])
def test_a_snapshot_replaced_while_its_answers_are_decoded_is_decoded_again_or_left_packed(
    tmp_path: Path, replaced: int
) -> None:
    """`prepare` decodes a resumed partition's answers without the lock; a fold that replaces its snapshot meanwhile
    wins, and the decoding starts again from the new one, DECODE_TRIES times at most: past that the answers stay
    packed (each lookup unpacks its own)."""
    view, tp_keys = _view_of(tmp_path / "view", 63, 3)
    try:
        read = {tp_key: read_partition(view._cf, tp_key) for tp_key in tp_keys}
        tp_key = next(tp_key for tp_key, partition in read.items() if partition is not None and partition.segments)
        partition = read[tp_key]
        assert partition is not None
        partition.decoded_answers = True
        mark = view.state_mark("meta")
        path = tmp_path / "kept"
        resume_file.write(path, mark, [(tp_key, partition, snapshot_of(partition))])
        model = view.model
        model.hold_hosted()
        model.resume(resume_file.take(path, mark))
        model.host([tp_key], 0.0)  # no time to take it: its first lookup does, its answers packed
        published = model.watch(tp_key)
        assert _answer_kinds(published) == {bytes}
        replacements: list[PartitionSnapshot] = []
        pauses: list[None] = []
        # `pause` is called at each epoch's first answer and every UNPACK_PAUSE_EVERY after: this many times in all.
        per_decoding = sum(-(-len(floors.segments) // read_model.UNPACK_PAUSE_EVERY)
                           for floors in published.floors.values())

        def fold_meanwhile() -> None:  # what a fold does to the snapshot: replaces it whole, under the lock
            pauses.append(None)
            if (len(pauses) - 1) % per_decoding == 0 and len(replacements) < replaced:  # once in a decoding
                with model.lock:
                    replacements.append(dataclasses.replace(model.snapshots[tp_key]))
                    model._publish(tp_key, replacements[-1])

        model.prepare(tp_key, fold_meanwhile)
        assert len(replacements) == replaced
        kinds = _answer_kinds(model.snapshots[tp_key])
        if replaced < read_model.DECODE_TRIES:
            assert kinds == {RemoteLogSegmentMetadata}
            assert model.snapshots[tp_key] == snapshot_of(model.partitions[tp_key])
        else:
            assert kinds == {bytes}
            assert model.snapshots[tp_key] is replacements[-1]
        assert not model._undecoded
    finally:
        view.close()


def test_partitions_not_hosted_within_the_hold_are_let_go(make_manager: MakeManager, tmp_path: Path) -> None:
    state_dir = tmp_path / "node"
    tps = [make_tp("orders", p) for p in range(3)]
    before = _served_then_closed(make_manager, state_dir, tps, 57)
    node = make_manager(state_dir=state_dir, partitions=PARTITIONS, **{"lookup.resume.hold.ms": 200})
    register(node, tps[0])
    assert held(node) == keys(tps[:1])
    wait_until(lambda: not node.view.model.resuming(), timeout=CAUGHT_UP_S, description="the hold has passed")
    # Hosted again later: read from the view.
    register(node, *tps[1:])
    assert {tp: answered_by(node, tp) for tp in tps} == before


def test_with_lookup_resume_off_nothing_is_kept_and_a_kept_state_is_removed(
    make_manager: MakeManager, tmp_path: Path
) -> None:
    state_dir = tmp_path / "node"
    tps = [make_tp("orders", p) for p in range(2)]
    _served_then_closed(make_manager, state_dir, tps, 58, **{"lookup.resume": False})
    assert not _kept(state_dir).exists()
    _served_then_closed(make_manager, state_dir, tps, 59)
    assert _kept(state_dir).exists()
    node = make_manager(state_dir=state_dir, partitions=PARTITIONS, **{"lookup.resume": False})
    assert not _kept(state_dir).exists()
    node.on_partition_leadership_changes(set(tps), set())
    assert not held(node)


# --- the file alone: what it gives back equals what the read model reads from the view --------------------------

def _view_of(path: Path, seed: int, partitions: int) -> tuple[MetadataView, list[bytes]]:
    rng = random.Random(seed)
    writer = LogWriter()
    tps = [make_tp(f"resume-{seed}", number) for number in range(partitions)]
    for tp in tps:
        writer.write(workload(rng, tp, uploads=15, delete_partition=tp.partition == 0))
    view = MetadataView(path)
    apply_archived(view, "meta", [
        to_archived("meta", 0, offset, 0, key.encode(), None if event is None else codec.encode(event))
        for offset, (key, event) in enumerate(writer.log)])
    return view, [vf.tp_key_of(tp) for tp in tps]


@pytest.mark.parametrize("decoded_answers", [False, True])
def test_each_partition_comes_back_equal_to_what_the_view_reads(tmp_path: Path, decoded_answers: bool) -> None:
    view, tp_keys = _view_of(tmp_path / "view", 60, 6)
    try:
        families = view._cf  # the read model's own reader
        read = {tp_key: read_partition(families, tp_key) for tp_key in tp_keys}
        for partition in read.values():
            if partition is not None:
                partition.decoded_answers = decoded_answers
        served = [(tp_key, partition, snapshot_of(partition)) for tp_key, partition in read.items()]
        mark = view.state_mark("meta")
        path = tmp_path / "kept"
        assert resume_file.write(path, mark, served) == len(served)

        assert resume_file.take(path, (mark[0], mark[1] + 1, mark[2])) is None
        assert not path.exists()
        resume_file.write(path, mark, served)
        resumed = resume_file.take(path, mark)
        assert resumed is not None and len(resumed) == len(served)
        for tp_key, partition, _snapshot in served:
            found = resumed.take(tp_key)
            assert found is not None
            again, again_snapshot = found
            assert again == partition
            # The file holds answers packed; the read model decodes them again where it grants that.
            if partition is not None and again is not None:
                again.decoded_answers = False
                partition.decoded_answers = False
            assert again_snapshot == snapshot_of(partition)
        assert resumed.take(tp_keys[0]) is None  # taken once
    finally:
        view.close()


def _write_to(state_dir: Path) -> None:
    view = MetadataView.open(state_dir)
    try:
        view._db.put(b"tierlog.test.written-while-down", b"1")  # any write moves the sequence
    finally:
        view.close()


def test_a_file_another_python_wrote_is_not_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    view, tp_keys = _view_of(tmp_path / "view", 61, 2)
    try:
        partition = read_partition(view._cf, tp_keys[1])
        assert partition is not None
        mark = view.state_mark("meta")
        path = tmp_path / "kept"
        monkeypatch.setattr(resume_file, "_INTERPRETER", (3, 99))  # marshal's format may differ there
        resume_file.write(path, mark, [(tp_keys[1], partition, snapshot_of(partition))])
        monkeypatch.undo()
        with caplog.at_level(logging.WARNING, logger="rlmm"):
            assert resume_file.take(path, mark) is None
        assert "Python (3, 99)" in caplog.text
        assert not path.exists()
    finally:
        view.close()
