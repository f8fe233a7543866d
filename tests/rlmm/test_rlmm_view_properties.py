"""Property tests of the RocksDB view: applied in batches of any size, it holds what the in-memory state holds.

The same random histories as the state properties, replayed into a MetadataView without Kafka.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from rlmm_strategies import PARTITIONS, PROPERTY_SETTINGS, Scenario, assert_same_answers, histories
from rlmm_testkit import LogRecord, compacted, replay

from rlmm import view_format as vf
from rlmm.snapshot import snapshot_entries
from rlmm.view import ConsumedRecord, MetadataView, apply_records

TOPIC = "tierlog-test-metadata"

# Each example opens and closes a RocksDB database (about 0.1 s), so fewer examples than the pure properties.
VIEW_SETTINGS = settings(PROPERTY_SETTINGS, max_examples=20)


def apply_in_batches(view: MetadataView, log: Sequence[LogRecord], cuts: Sequence[int], start: int = 0) -> None:
    """Apply `log[start:]` as consecutive batches ending at `cuts`, each committed with the offsets it reaches."""
    for end in [*sorted(set(cuts)), len(log)]:
        if end <= start:
            continue
        records = [ConsumedRecord(0, offset, key, event) for offset, (key, event) in
                   enumerate(log[start:end], start)]
        apply_records(view, TOPIC, records, {0: end})
        start = end


batch_cuts = st.lists(st.integers(0, 200), max_size=6)


@VIEW_SETTINGS
@given(histories(), batch_cuts)
def test_the_view_applied_in_any_batches_has_the_digest_of_the_in_memory_state(
    scenario: Scenario, cuts: list[int]
) -> None:
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(directory)
        try:
            apply_in_batches(view, scenario.writer.log, cuts)
            assert view.digest() == scenario.writer.store.digest()
        finally:
            view.close()


@VIEW_SETTINGS
@given(histories(), batch_cuts)
def test_the_view_answers_every_query_like_kafka(scenario: Scenario, cuts: list[int]) -> None:
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(directory)
        try:
            apply_in_batches(view, scenario.writer.log, cuts)
            assert_same_answers(scenario, view.batch())  # an empty batch reads the committed view
        finally:
            view.close()


@VIEW_SETTINGS
@given(histories(), st.integers(0, 200))
def test_a_view_reopened_from_disk_resumes_from_its_stored_offset_to_the_same_digest(
    scenario: Scenario, cut: int
) -> None:
    log = scenario.writer.log
    cut = min(cut, len(log))
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(directory)
        apply_in_batches(view, log[:cut], [])
        view.close()
        view = MetadataView.open(directory)
        try:
            resume = view.applied_offsets(TOPIC).get(0, 0)
            assert resume == cut
            apply_in_batches(view, log, [], start=resume)
            assert view.digest() == scenario.writer.store.digest()
        finally:
            view.close()


@VIEW_SETTINGS
@given(histories())
def test_a_view_built_from_the_compacted_log_has_the_digest_of_the_full_replay(scenario: Scenario) -> None:
    log = scenario.writer.log
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(Path(directory))
        try:
            apply_in_batches(view, compacted(log), [])
            assert view.digest() == replay(log).digest()
        finally:
            view.close()


hosting_steps = st.lists(st.tuples(st.sets(st.sampled_from(PARTITIONS)), st.sets(st.sampled_from(PARTITIONS))),
                         min_size=1, max_size=6)


@VIEW_SETTINGS
@given(histories(), batch_cuts, hosting_steps)
def test_a_view_holding_only_hosted_partitions_applies_and_answers_like_one_holding_every_partition(
    scenario: Scenario, cuts: list[int], steps: list[tuple[set, set]]
) -> None:
    """A manager's view keeps in memory only what its node hosts, and applies every other partition's records key by
    key from RocksDB: the same view, whichever partitions it hosts while it applies, and however that changes."""
    log = scenario.writer.log
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(directory)
        try:
            model = view.model
            model.hold_hosted()
            ends = [*sorted({min(cut, len(log)) for cut in cuts}), len(log)]
            start = 0
            for i, end in enumerate(ends):
                hosted, stopped = steps[i % len(steps)]
                model.host(vf.tp_key_of(tp) for tp in hosted)
                model.unhost(vf.tp_key_of(tp) for tp in stopped - hosted)
                for tp in hosted:  # a hosted partition read now is held, and its later batches fold into it
                    view.partition_delete(tp)
                apply_in_batches(view, log[:end], [], start=start)
                start = max(start, end)
                assert model.hosted is not None
                assert set(model.partitions) <= model.hosted, "a partition the node does not host is held"
            assert view.digest() == scenario.writer.store.digest()
            assert_same_answers(scenario, view.batch())  # held partitions from memory, the others from RocksDB
            model.host(vf.tp_key_of(tp) for tp in PARTITIONS)
            for tp in PARTITIONS:
                view.partition_delete(tp)  # every partition now read whole from RocksDB, and held
            assert_same_answers(scenario, view.batch())
        finally:
            view.close()


# Each example also opens the view a second time (as a secondary instance, about a second): fewer examples.
@settings(VIEW_SETTINGS, max_examples=6)
@given(histories(), st.integers(0, 200))
def test_a_point_in_time_of_the_view_holds_what_it_held_then_whatever_is_committed_after(
    scenario: Scenario, cut: int
) -> None:
    """A bootstrap snapshot is written from a live node's view while its applier commits: what it reads is the
    view between two commits, its entries, offsets and digest alike."""
    log = scenario.writer.log
    cut = min(cut, len(log))
    with tempfile.TemporaryDirectory() as directory:
        view = MetadataView.open(directory)
        try:
            apply_in_batches(view, log[:cut], [])
            then = (list(snapshot_entries(view)), view.applied_offsets(TOPIC), view.digest())
            with view.point_in_time() as moment:
                apply_in_batches(view, log, [], start=cut)
                assert view.applied_offsets(TOPIC) == ({0: len(log)} if log else {})
                assert (list(moment.snapshot_entries()), moment.applied_offsets(TOPIC), moment.digest()) == then
        finally:
            view.close()
