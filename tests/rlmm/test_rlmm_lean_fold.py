"""A fold worker folds the plain records of its share without their events (rlmm.lean_fold), and hands a partition
to the rules (a FreshState) at its first record of another form. Whatever the records, the worker's fold is the
rules' fold: the same outcomes, and table entries equal byte for byte."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rlmm_strategies import PROPERTY_SETTINGS, RacingScenario, Scenario, histories, racing_histories
from rlmm_testkit import make_tp, segment

from rlmm import codec, fresh_load, lean_fold
from rlmm.events import EpochCheckpoint, EpochLineage, MetadataEvent, RecordKey, epoch_key, key_of
from rlmm.lean_fold import LeanFold
from rlmm.types import RemoteLogSegmentState, RemotePartitionDeleteMetadata, RemotePartitionDeleteState
from rlmm.view import FreshState

S = RemoteLogSegmentState


def records_of(log: Sequence[tuple[int, RecordKey, MetadataEvent | None]], skipped: Sequence[bool],
               compact: bool = False) -> list[fresh_load.Record]:
    """A log as a worker's share holds it (one metadata partition), each record with whether older records of its key
    may be missing before it; with `compact`, only the newest record of each key, as the log cleaner leaves them."""
    if compact:
        log = sorted({key.encode(): (offset, key, event) for offset, key, event in log}.values(),
                     key=lambda item: item[0])
    return [(0, offset, key.encode(), None if event is None else codec.encode(event), None,
             skipped[i % len(skipped)] if skipped else False) for i, (offset, key, event) in enumerate(log)]


@contextmanager
def folded_in(language: str) -> Iterator[None]:
    """The lean fold's commonest records folded in C (rlmm/_lean_fold.c, built for the tests) or in Python only."""
    built = lean_fold._lean_fold
    assert built is not None, "rlmm._lean_fold is not built"
    lean_fold._lean_fold = built if language == "C" else None  # type: ignore[assignment]
    try:
        yield
    finally:
        lean_fold._lean_fold = built


def folded_both_ways(records: Sequence[fresh_load.Record], language: str = "C"
                     ) -> tuple[fresh_load.Folded, LeanFold]:
    """The records folded by the rules and by a worker's lean fold, held equal; the lean fold, to look into."""
    rules = FreshState()
    expected = fresh_load.fold(rules, records, ())
    lean = LeanFold(FreshState())
    with folded_in(language):
        got = fresh_load.fold(lean.fresh, records, (), lean)

    def outcomes(folded: fresh_load.Folded) -> list[tuple[int, Any]]:
        return [(index, outcome) for index, _, _, outcome in folded.noted]

    assert outcomes(got) == outcomes(expected)
    assert (got.applied, got.unreadable, got.touched, got.failed) == \
        (expected.applied, expected.unreadable, expected.touched, expected.failed)
    assert sorted(lean.partition_keys()) == sorted(rules.partitions())
    assert list(lean.runs()) == list(rules.runs(rules.partitions()))
    return got, lean


@pytest.mark.parametrize("language", ["C", "Python"])
@PROPERTY_SETTINGS
@given(histories(), st.lists(st.booleans(), max_size=4), st.booleans())
def test_a_writers_log_folded_leanly_is_the_rules_fold(language: str, scenario: Scenario, skipped: list[bool],
                                                       compact: bool) -> None:
    log = [(offset, key, event) for offset, (key, event) in enumerate(scenario.writer.log)]
    folded_both_ways(records_of(log, skipped, compact), language)


@pytest.mark.parametrize("language", ["C", "Python"])
@PROPERTY_SETTINGS
@given(racing_histories(), st.lists(st.booleans(), max_size=4), st.booleans())
def test_a_racing_log_folded_leanly_is_the_rules_fold(language: str, scenario: RacingScenario, skipped: list[bool],
                                                      compact: bool) -> None:
    # Racing writers leave displaced and overwritten segments, dropped records and stale checkpoints.
    folded_both_ways(records_of(scenario.topic, skipped, compact), language)


def finished(tp: Any, start: int, end: int, epochs: dict[int, int], **fields: Any) -> Any:
    return segment(tp, start, end, epochs, state=S.COPY_SEGMENT_FINISHED, **fields)


def checkpoint(tp: Any, epoch: int, highest: int | None, reflects: int | None,
               displaced: frozenset[uuid.UUID] = frozenset()) -> tuple[RecordKey, EpochCheckpoint]:
    return epoch_key(tp, epoch), EpochCheckpoint(tp, (EpochLineage(epoch, highest, displaced),), 0, 0, reflects,
                                                 whole_partition=False)


def test_the_plain_forms_are_folded_leanly_and_a_partition_goes_to_the_rules_at_its_first_other_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    plain, other = make_tp(), make_tp()
    first, second = finished(plain, 0, 99, {0: 0}), finished(plain, 100, 199, {0: 100, 1: 150})
    started = segment(plain, 200, 299, {1: 200})
    deleted = dataclasses.replace(finished(plain, 300, 399, {1: 300}), state=S.DELETE_SEGMENT_FINISHED)
    log: list[tuple[RecordKey, MetadataEvent | None]] = [
        (key_of(first), first), (key_of(second), second), (key_of(started), started), (key_of(deleted), deleted),
        checkpoint(plain, 1, 199, 1), checkpoint(plain, 0, 149, 0),  # the second is stale: epoch 0 owes one
    ]
    before, after = finished(other, 0, 99, {0: 0}), finished(other, 100, 199, {0: 100})
    inside = finished(other, 50, 149, {0: 50})  # starts before the last one indexed: displaces it, by the rules
    delete = RemotePartitionDeleteMetadata(other, RemotePartitionDeleteState.DELETE_PARTITION_MARKED, 0, 0)
    log += [(key_of(md), md) for md in (before, after, inside)] + [(key_of(delete), delete)]
    third = make_tp()
    upload, shorter = finished(third, 0, 99, {0: 0}), finished(third, 50, 99, {0: 50})
    # The second ends at the epoch's highest offset, which its checkpoint states: no epoch owes one after it.
    log += [(key_of(upload), upload), checkpoint(third, 0, 99, len(log)), (key_of(shorter), shorter)]
    taken: list[bool] = []
    fold_record = LeanFold.fold_record

    def counted(self: LeanFold, *args: Any) -> tuple[int, int] | None:
        folded = fold_record(self, *args)
        taken.append(folded is not None)
        return folded

    fold_run = LeanFold.fold_run

    def counted_run(self: LeanFold, *args: Any) -> tuple[int, int]:
        stopped_at, folded = fold_run(self, *args)  # the record it stops at goes to fold_record
        taken.extend([True] * folded)
        return stopped_at, folded

    monkeypatch.setattr(LeanFold, "fold_record", counted)
    monkeypatch.setattr(LeanFold, "fold_run", counted_run)
    folded, _ = folded_both_ways(records_of([(offset, key, event) for offset, (key, event) in enumerate(log)], [True]))
    assert taken == [True] * 8 + [False, False] + [True] * 3
    assert folded.applied == len(log) - 1  # the partition delete is noted


def test_records_with_values_outside_kafkas_ranges_are_left_to_the_rules() -> None:
    tp = make_tp()
    good = finished(tp, 0, 99, {0: 0})
    version = codec.registry().current["segment_record"]
    _, datum = codec.to_datum(good)
    broken = [
        {**datum, "broker_id": -5},  # Kafka's broker ids are non-negative
        {**datum, "start_offset": 120},  # starts past its end
        {**datum, "segment_leader_epochs": []},
        {**datum, "segment_leader_epochs": [{"epoch": 0, "start_offset": 150}]},  # an epoch starting past the end
        {**datum, "segment_id": "not-a-uuid"},
    ]
    records = [(0, offset, f"segment:{bad['topic_id']}:{bad['partition']}:{bad['segment_id']}".encode(),
                codec.encode_with(version, bad), None, True) for offset, bad in enumerate(broken)]
    # A key that spells the ids otherwise than the record does (the rules compare ids, not texts).
    records.append((0, len(records), key_of(good).encode().upper().replace(b"SEGMENT:", b"segment:"),
                    codec.encode(good), None, True))
    lean = LeanFold(FreshState())
    assert [lean.fold_record(offset, key, value, True) for _, offset, key, value, _, _ in records] == \
        [None] * len(records)
    folded, _ = folded_both_ways(records)
    assert folded.unreadable  # the rules name the first bad record of the metadata partition unreadable
    folded, _ = folded_both_ways(records[-1:])
    assert folded.applied == 1  # the rules apply it
    garbage = codec.MAGIC + version.fingerprint[::-1] + b"\xff" * 5
    assert lean.fold_record(9, key_of(good).encode(), garbage, True) is None
