"""`tierlog migrate` against the real broker: a history in Kafka's format on a source topic becomes tierlog's
metadata, answering every query as Kafka's rules over that history do, once however often or however interrupted."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from migrate_testkit import (
    SOURCE_PARTITIONS,
    RecordingScenario,
    assert_answers_as_kafka,
    kafka_histories,
    kafka_model,
    probe_request,
    produce_history,
    produce_raw,
    run_tierlog,
    tierlog_options,
    workload_history,
)
from rlmm_testkit import make_tp, read_topic, segment, update_of
from support.topics import create_topic, unique_topic_name

from rlmm import codec, state
from rlmm.errors import InvalidArgumentError
from rlmm.events import EpochCheckpoint, segment_key
from rlmm.kafka_format import encode, metadata_partition
from rlmm.types import RemoteLogSegmentMetadata, RemoteLogSegmentState, RemotePartitionDeleteMetadata
from rlmm.view import MetadataView
from tierlog.cli.kafka_metadata import KafkaRulesReplay
from tierlog.migration.records import Record, lineage_checkpoint, records_to_reach

REPO = Path(__file__).resolve().parents[2]
S = RemoteLogSegmentState


def _migrate(bootstrap: str, source: str, target: str, state_dir: Path, *extra: str) -> tuple[int, dict]:
    return run_tierlog("migrate", "--source-topic", source, *tierlog_options(bootstrap, target, state_dir), *extra)


def _events_on(bootstrap: str, topic: str) -> int:
    """Segment and partition-delete events on tierlog's topic (checkpoints and tombstones are follow-ups)."""
    return sum(isinstance(codec.decode(r.value), RemoteLogSegmentMetadata | RemotePartitionDeleteMetadata)
               for r in read_topic(bootstrap, topic) if r.value is not None)


def _assert_view_answers_as_kafka(state_dir: Path, history: list) -> None:
    view = MetadataView.open(state_dir, read_only=True)
    try:
        assert_answers_as_kafka(kafka_model(history), view, history)
    finally:
        view.close()


# --- the bulk import's records, applied as a node applies its topic (no Kafka) ---------------------------------

def _import_records(history: list, held: state.InMemoryState, next_offset: int) -> list[list[Record]]:
    """What `tierlog migrate` appends over `held` for `history`, per user partition: its records, then its
    checkpoint, stamped with the offset its last record gets when appended from `next_offset` on."""
    final = KafkaRulesReplay()
    for call in history:
        final.apply(call)
    batches = []
    for tp in sorted({*final.store.user_partitions(), *held.user_partitions()}, key=str):
        records = records_to_reach(final.store, held, tp)
        next_offset += len(records)
        reflects = max(next_offset - 1 if records else -1, held.lineage_position(tp) or -1)
        batches.append([*records, *lineage_checkpoint(final.store, held, tp, bool(records),
                                                      reflects if reflects >= 0 else None, 0, 0)])
        next_offset += len(batches[-1]) - len(records)
    return batches


def _apply_in_order(node: state.InMemoryState, records: list[Record], first_offset: int) -> None:
    """Apply records as a node that reads every record of its topic does (nothing skipped before them)."""
    for offset, (key, event) in enumerate(records, first_offset):
        outcome = state.apply_record(node, key, event, offset, skipped_before=False)
        assert outcome.applied, outcome.reason


@given(scenario=kafka_histories(), cut=st.floats(0, 1))
@settings(max_examples=30, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
def test_the_imported_records_applied_in_order_answer_as_kafkas_rules_also_after_a_killed_run(
        scenario: RecordingScenario, cut: float) -> None:
    """Random histories (re-uploads across epochs, invalid calls, deleted partitions): a node applying the import's
    records holds Kafka's answers; a run killed after any prefix of them and run again appends exactly the rest."""
    history = scenario.history
    node = state.InMemoryState()
    written = [record for batch in _import_records(history, node, 0) for record in batch]
    kept = written[:round(cut * len(written))]
    _apply_in_order(node, kept, 0)
    rest = [record for batch in _import_records(history, node, len(kept)) for record in batch]
    _apply_in_order(node, rest, len(kept))
    assert_answers_as_kafka(kafka_model(history), node, history)

    def events(records: list[Record]) -> int:
        return sum(not isinstance(event, EpochCheckpoint) and event is not None for _key, event in records)

    assert events(kept) + events(rest) == events(written)
    assert [batch for batch in _import_records(history, node, len(kept) + len(rest)) if batch] == []


def test_an_import_over_a_tierlog_state_the_source_cannot_reach_names_the_segment() -> None:
    """tierlog's topic written by more than the import (a segment already deleting that the source says finished
    copying): nothing is appended over it, the error names the segment."""
    tp = make_tp("topic-0", 0)
    added = segment(tp, 0, 99, {0: 0})
    history = [added, update_of(added, S.COPY_SEGMENT_FINISHED)]
    held = state.InMemoryState()
    _apply_in_order(held, [(segment_key(added.remote_log_segment_id), added),
                           (segment_key(added.remote_log_segment_id),
                            replace(added, state=S.DELETE_SEGMENT_STARTED))], 0)
    final = KafkaRulesReplay()
    for call in history:
        final.apply(call)
    with pytest.raises(InvalidArgumentError, match=str(added.remote_log_segment_id)):
        records_to_reach(final.store, held, tp)


@given(scenario=kafka_histories())
@settings(max_examples=4, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
def test_a_migrated_history_answers_as_kafkas_rules_over_it(scenario: RecordingScenario, kafka_bootstrap: str,
                                                            tmp_path_factory: object) -> None:
    """Random call sequences (invalid ones, re-uploads, deleted partitions included), written as TBRLMM writes them."""
    source = create_topic(kafka_bootstrap, unique_topic_name("migrate-src"), partitions=SOURCE_PARTITIONS)
    produce_history(kafka_bootstrap, source, scenario.history)
    state_dir = tmp_path_factory.mktemp("migrate")  # type: ignore[attr-defined]
    code, report = _migrate(kafka_bootstrap, source, unique_topic_name("migrate-tgt"), state_dir)
    assert code == 0, report
    assert sum(report["read"].values()) == len(scenario.history)
    _assert_view_answers_as_kafka(state_dir, scenario.history)


def test_a_second_run_writes_nothing(kafka_bootstrap: str, create_topic: Callable[..., str], unique_topic: str,
                                     tmp_path: Path) -> None:
    history = workload_history(seed=1)
    source = create_topic(partitions=SOURCE_PARTITIONS)
    produce_history(kafka_bootstrap, source, history)
    code, first = _migrate(kafka_bootstrap, source, unique_topic, tmp_path)
    assert code == 0 and sum(first["written"].values()) > 0, first
    events = _events_on(kafka_bootstrap, unique_topic)

    code, second = _migrate(kafka_bootstrap, source, unique_topic, tmp_path)
    assert code == 0
    assert second["written"] == {}
    assert second["already_migrated"] == len(history)
    assert _events_on(kafka_bootstrap, unique_topic) == events
    _assert_view_answers_as_kafka(tmp_path, history)


def test_a_dry_run_counts_the_writes_and_writes_nothing(kafka_bootstrap: str, create_topic: Callable[..., str],
                                                        unique_topic: str, tmp_path: Path) -> None:
    history = workload_history(seed=2)
    source = create_topic(partitions=SOURCE_PARTITIONS)
    produce_history(kafka_bootstrap, source, history)
    code, planned = _migrate(kafka_bootstrap, source, unique_topic, tmp_path, "--dry-run")
    assert code == 0 and planned["dry_run"]
    assert not (tmp_path / "view").exists()

    code, done = _migrate(kafka_bootstrap, source, unique_topic, tmp_path)
    assert code == 0
    assert done["written"] == planned["would_write"]
    assert done["dropped_by_kafka_rules"] == planned["dropped_by_kafka_rules"]
    assert _events_on(kafka_bootstrap, unique_topic) == sum(planned["would_write"].values())


_KILLED_RUN = textwrap.dedent("""
    import os, sys
    sys.path.insert(0, {repo!r})
    import tierlog.cli.migrate as migrate
    submitted, real_submit = [0], migrate.start_write

    def submit_then_die(manager, metadata):
        # A hard kill (no cleanup, nothing flushed) as the next write is about to start; earlier ones may be in flight.
        submitted[0] += 1
        if submitted[0] > {writes}:
            os._exit(9)
        return real_submit(manager, metadata)

    migrate.start_write = submit_then_die
    from tierlog.cli.main import main
    sys.exit(main(sys.argv[1:]))
""")


def test_a_run_killed_halfway_resumes_to_the_same_state_without_duplicates(
        kafka_bootstrap: str, create_topic: Callable[..., str], unique_topic: str, tmp_path: Path) -> None:
    history = workload_history(seed=3)
    source = create_topic(partitions=SOURCE_PARTITIONS)
    produce_history(kafka_bootstrap, source, history)
    code, planned = _migrate(kafka_bootstrap, source, unique_topic, tmp_path / "dry", "--dry-run")
    writes = sum(planned["would_write"].values())

    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_RUN.format(repo=str(REPO), writes=writes // 2), "migrate", "--source-topic",
         source, *tierlog_options(kafka_bootstrap, unique_topic, tmp_path)],
        capture_output=True, text=True, timeout=120, check=False)
    assert killed.returncode == 9, killed.stderr[-3000:]

    code, resumed = _migrate(kafka_bootstrap, source, unique_topic, tmp_path)
    assert code == 0, resumed
    assert 0 < sum(resumed["written"].values()) < writes
    assert _events_on(kafka_bootstrap, unique_topic) == writes
    _assert_view_answers_as_kafka(tmp_path, history)


def test_a_rerun_after_the_source_grew_imports_what_came_since(
        kafka_bootstrap: str, create_topic: Callable[..., str], unique_topic: str, tmp_path: Path) -> None:
    """TBRLMM goes on writing between two imports (the runbook reruns the import until it writes nothing): copies
    finished and segments deleted since are brought in, and tierlog answers as Kafka's rules over the whole history."""
    history = workload_history(seed=5)
    half = len(history) // 2
    source = create_topic(partitions=SOURCE_PARTITIONS)
    produce_history(kafka_bootstrap, source, history[:half])
    code, first = _migrate(kafka_bootstrap, source, unique_topic, tmp_path)
    assert code == 0, first
    _assert_view_answers_as_kafka(tmp_path, history[:half])

    produce_history(kafka_bootstrap, source, history[half:])
    code, second = _migrate(kafka_bootstrap, source, unique_topic, tmp_path)
    assert code == 0, second
    assert second["already_migrated"] == half and sum(second["written"].values()) > 0
    _assert_view_answers_as_kafka(tmp_path, history)


def test_undecodable_and_misplaced_records_are_reported_with_their_offsets(
        kafka_bootstrap: str, create_topic: Callable[..., str], unique_topic: str, tmp_path: Path) -> None:
    history = workload_history(seed=4, partitions=2, uploads=4)
    source = create_topic(partitions=SOURCE_PARTITIONS)
    produce_history(kafka_bootstrap, source, history)
    home = metadata_partition(history[0].topic_id_partition, SOURCE_PARTITIONS)
    elsewhere = (home + 1) % SOURCE_PARTITIONS
    produce_raw(kafka_bootstrap, source, elsewhere, [b"\x01\x09\x00garbage", encode(history[0])])
    ends = {r.partition: r.offset for r in read_topic(kafka_bootstrap, source)}

    code, report = _migrate(kafka_bootstrap, source, unique_topic, tmp_path)
    assert code == 1
    problems = {(p["topic"], p["partition"], p["offset"]): p["reason"] for p in report["problems"]}
    assert set(problems) == {(source, elsewhere, ends[elsewhere] - 1), (source, elsewhere, ends[elsewhere])}
    assert "unknown apiKey 9" in problems[(source, elsewhere, ends[elsewhere] - 1)]
    assert f"puts in partition {home}" in problems[(source, elsewhere, ends[elsewhere])]
    _assert_view_answers_as_kafka(tmp_path, history)


def test_a_history_kafkas_own_serde_and_partitioner_wrote_migrates(
        kafka_bootstrap: str, create_topic: Callable[..., str], unique_topic: str, tmp_path: Path,
        kafka_probe: Callable[[Sequence[str]], list[str]]) -> None:
    """The source records are the bytes Kafka's RemoteLogMetadataSerde writes, in the partitions Kafka's
    RemoteLogMetadataTopicPartitioner picks (through the Java probe), not this project's encoder."""
    history = workload_history(seed=9)
    values = [bytes.fromhex(v) for v in kafka_probe([probe_request(call) for call in history])]
    placed = kafka_probe([f"P {call.topic_id_partition.topic_id} {call.topic_id_partition.partition} "
                          f"{SOURCE_PARTITIONS}" for call in history])
    source = create_topic(partitions=SOURCE_PARTITIONS)
    for partition in range(SOURCE_PARTITIONS):
        produce_raw(kafka_bootstrap, source, partition,
                    [value for value, p in zip(values, placed, strict=True) if int(p) == partition])
    code, report = _migrate(kafka_bootstrap, source, unique_topic, tmp_path)
    assert code == 0 and report["problems"] == [], report
    _assert_view_answers_as_kafka(tmp_path, history)
