"""`tierlog export` (tierlog's state as Kafka's records) and `tierlog verify migration` (TBRLMM's topic against
tierlog's, partition by partition)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from hypothesis import given, settings
from migrate_testkit import (
    SOURCE_PARTITIONS,
    RecordingScenario,
    kafka_histories,
    produce_history,
    produce_raw,
    run_tierlog,
    tierlog_options,
    workload_history,
)
from rlmm_testkit import make_tp, read_topic, segment, update_of

from rlmm.kafka_format import RemoteLogSegmentMetadataSnapshot, decode, encode, metadata_partition
from rlmm.state import highest_offset_for_epoch
from rlmm.types import RemoteLogSegmentMetadata, RemoteLogSegmentState
from tierlog.cli.export import plan_export
from tierlog.cli.kafka_metadata import KafkaRulesReplay

S = RemoteLogSegmentState
EXPORT_PARTITIONS = 7


def _replayed(records: list) -> KafkaRulesReplay:
    replay = KafkaRulesReplay()
    for record in records:
        replay.apply(record)
    return replay


@given(kafka_histories())
@settings(max_examples=100, deadline=None)
def test_an_export_replays_under_kafkas_rules_to_tierlogs_answers(scenario: RecordingScenario) -> None:
    """Random histories (re-uploads across epochs, deletions, deleted partitions): tierlog's state, exported and
    replayed as TBRLMM replays its topic, answers every query as tierlog does; only where a re-upload displaced or
    overwrote a segment within an epoch may the upload order be beyond what the state tells, and export then
    refuses."""
    store = scenario.writer.store
    _history, differences = plan_export(store)
    for tp in differences:
        assert any(lineage.displaced_segment_ids or lineage.overwritten_segment_ids
                   for lineage in store.lineages_of(tp)), differences[tp]


def test_segments_a_later_upload_overwrote_in_an_epoch_export_exactly() -> None:
    """Kafka's epoch listing leaves out a finished segment whose entry a later upload from the same start took while
    the epoch went on past it: the export's replay overwrites the same segments, whether a later upload then
    displaced the one that overwrote (long, short, longer) or the overwritten one had displaced another first
    (short, long, shorter)."""
    for ends in ((10, 5, 20), (5, 10, 3), (1, 0, 0)):
        tp = make_tp(f"overwritten-{'-'.join(map(str, ends))}")
        tierlog = KafkaRulesReplay()
        for end in ends:
            md = segment(tp, 0, end, {0: 0}, size=end + 1)
            assert tierlog.apply(md) is None and tierlog.apply(update_of(md, S.COPY_SEGMENT_FINISHED)) is None
        assert any(lineage.overwritten_segment_ids for lineage in tierlog.store.lineages_of(tp)), ends
        exported, differences = plan_export(tierlog.store)
        assert differences == {}, ends
        replayed = _replayed(exported).store
        assert replayed.lineage(tp, 0) == tierlog.store.lineage(tp, 0), ends


def test_brokers_histories_export_exactly() -> None:
    """Uploads across leader epochs, re-uploads by new leaders, retention and a partition delete, as brokers make
    them: every partition exports exactly."""
    for seed in range(30):
        tierlog = _replayed(workload_history(seed=seed))
        _history, differences = plan_export(tierlog.store)
        assert differences == {}, seed


def test_an_epoch_whose_segments_are_gone_keeps_its_highest_offset_through_a_stand_in() -> None:
    tp = make_tp()
    tierlog = KafkaRulesReplay()
    first = segment(tp, 0, 99, {0: 0})
    later = segment(tp, 100, 199, {1: 100})
    for record in (first, update_of(first, S.COPY_SEGMENT_FINISHED), update_of(first, S.DELETE_SEGMENT_STARTED),
                   update_of(first, S.DELETE_SEGMENT_FINISHED), later, update_of(later, S.COPY_SEGMENT_FINISHED)):
        assert tierlog.apply(record) is None
    exported, differences = plan_export(tierlog.store)
    assert differences == {}
    stand_ins = [r for r in exported if isinstance(r, RemoteLogSegmentMetadata) and r.segment_size_in_bytes == 0]
    assert [(r.start_offset, dict(r.segment_leader_epochs)) for r in stand_ins] == [(99, {0: 99})]
    replay = _replayed(exported)
    assert highest_offset_for_epoch(replay.store, tp, 0) == 99
    assert list(replay.store.segments_of(tp)) == [tierlog.store.segment(later.remote_log_segment_id)]


def _migrated(kafka_bootstrap: str, create_topic: Callable[..., str], target: str, state_dir: Path,
              seed: int) -> tuple[str, list[str]]:
    history = workload_history(seed=seed)
    source = create_topic(partitions=SOURCE_PARTITIONS)
    produce_history(kafka_bootstrap, source, history)
    options = tierlog_options(kafka_bootstrap, target, state_dir)
    code, report = run_tierlog("migrate", "--source-topic", source, *options)
    assert code == 0, report
    return source, options


def test_verify_migration_agrees_after_a_migration(kafka_bootstrap: str, create_topic: Callable[..., str],
                                                   unique_topic: str, tmp_path: Path) -> None:
    source, options = _migrated(kafka_bootstrap, create_topic, unique_topic, tmp_path, seed=5)
    code, result = run_tierlog("verify", "migration", "--source-topic", source, *options)
    assert code == 0, result
    assert result["ok"] and result["partitions"] == 6 and result["differences"] == {}


def test_verify_migration_names_what_differs(kafka_bootstrap: str, create_topic: Callable[..., str],
                                             unique_topic: str, tmp_path: Path) -> None:
    source, options = _migrated(kafka_bootstrap, create_topic, unique_topic, tmp_path, seed=6)
    tp = make_tp("late")
    late = segment(tp, 0, 9, {0: 0})
    produce_history(kafka_bootstrap, source, [late])
    code, result = run_tierlog("verify", "migration", "--source-topic", source, *options)
    assert code == 1 and not result["ok"]
    assert result["differences"] == {
        str(tp): [f"segment {late.remote_log_segment_id.id} (COPY_SEGMENT_STARTED): only in TBRLMM",
                  "remote_log_size at epoch 0: TBRLMM 1048576, tierlog None",
                  f"listing at epoch 0: TBRLMM ['{late.remote_log_segment_id.id}'], tierlog None"]}


def test_export_writes_what_tbrlmm_replays_to_tierlogs_state(kafka_bootstrap: str, create_topic: Callable[..., str],
                                                             unique_topic: str, tmp_path: Path) -> None:
    _source, options = _migrated(kafka_bootstrap, create_topic, unique_topic, tmp_path, seed=7)
    target = f"{unique_topic}-export"
    code, result = run_tierlog("export", "--target-topic", target, "--partitions", str(EXPORT_PARTITIONS),
                               "--replication-factor", "1", "--min-isr", "1", *options)
    assert code == 0, result
    written = read_topic(kafka_bootstrap, target)
    assert len(written) == result["records"]
    for record in written:
        metadata = decode(record.value)
        assert not isinstance(metadata, RemoteLogSegmentMetadataSnapshot)
        assert record.key is None
        assert record.partition == metadata_partition(metadata.topic_id_partition, EXPORT_PARTITIONS)
    code, verified = run_tierlog("verify", "migration", "--source-topic", target, *options)
    assert code == 0, verified


def test_export_refuses_a_target_that_holds_records(kafka_bootstrap: str, create_topic: Callable[..., str],
                                                    unique_topic: str, tmp_path: Path) -> None:
    _source, options = _migrated(kafka_bootstrap, create_topic, unique_topic, tmp_path, seed=8)
    target = create_topic(partitions=3)
    produce_raw(kafka_bootstrap, target, 0, [encode(segment(make_tp(), 0, 1, {0: 0}))])
    code, result = run_tierlog("export", "--target-topic", target, *options)
    assert code == 2 and result is None
    assert len(read_topic(kafka_bootstrap, target)) == 1
