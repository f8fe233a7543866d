"""`tierlog migrate` checked against Kafka's real TopicBasedRemoteLogMetadataManager (TBRLMM): TBRLMM
(tests/migrate/TbrlmmProbe.java) writes random broker histories to the dev broker's `__remote_log_metadata`, the
operator's command imports them into a fresh tierlog metadata topic, and a plain tierlog node on that topic answers
every read exactly as TBRLMM does; a rerun writes nothing, a later run imports what TBRLMM wrote since.

`__remote_log_metadata` is shared with other tests (TBRLMM's name is fixed): the command imports every user partition
on it, and these tests look only at their own (fresh topic ids).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from migrate_testkit import (
    DEADLINE_S,
    SOURCE_TOPIC,
    TARGET_PARTITIONS,
    KafkaWrite,
    Tbrlmm,
    assert_answers_as_tbrlmm,
    interleaved,
    run_tierlog,
    tierlog_answer,
)
from rlmm_testkit import make_tp, manager_config, partition_delete, read_topic, segment, update_of
from support.topics import unique_topic_name

from dev.process import wait_until
from rlmm import RemoteLogMetadataManager, codec
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from tierlog.cli.kafka_metadata import KafkaRulesReplay

S = RemoteLogSegmentState
# A seed whose histories end with segments a later copy overwrote: it took an epoch's entry from them and ended the
# epoch below its highest offset, and Kafka's epoch listing leaves them out (of seeds 1-15, 3, 4, 6, 7, 8, 11, 14 and
# 15 end with some; 8 with two).
SEEDS = [8]
LIVE_PARTITIONS = 5
UPLOADS = 14
MORE_UPLOADS = 4  # per live partition, written after the first migration


@dataclass
class BrokerLog:
    """One user partition's remote log as its leaders' RemoteLogManager writes it through TBRLMM: uploads (some fail
    and are retried, their leftovers cleaned up or not), leader changes (clean ones, and unclean ones where the new
    leader's log diverged below the old leader's end and skips the epochs it never saw), retention, late calls of
    fenced leaders that Kafka's rules refuse, and the partition's deletion (its segments deleted between
    DELETE_PARTITION_STARTED and FINISHED)."""

    tp: TopicIdPartition
    rng: random.Random
    epoch: int = 0
    next_offset: int = 0
    carried_epoch: int | None = None  # an unclean leader's log starts with records of this earlier epoch
    copied: list[RemoteLogSegmentMetadata] = field(default_factory=list)  # COPY_SEGMENT_FINISHED, oldest first
    abandoned: list[RemoteLogSegmentMetadata] = field(default_factory=list)  # left in COPY_SEGMENT_STARTED
    deleting: list[RemoteLogSegmentMetadata] = field(default_factory=list)  # left in DELETE_SEGMENT_STARTED
    retired: list[RemoteLogSegmentMetadata] = field(default_factory=list)  # deleted by retention (or deleting)
    refused: int = 0  # writes Kafka's rules refuse

    def uploads(self, count: int) -> list[KafkaWrite]:
        writes: list[KafkaWrite] = []
        for _ in range(count):
            if self.copied and self.rng.random() < 0.25:
                self._leader_change()
            writes += self._upload()
            if len(self.copied) > 4 and self.rng.random() < 0.35:
                writes += self._retention()
            if self.rng.random() < 0.1:
                writes.append(self._fenced_call())
        return writes

    def _fenced_call(self) -> KafkaWrite:
        """A call TBRLMM writes but its consumer drops: a fenced leader finishing a copy retention has since begun
        to delete, or updating a segment whose add never reached the topic."""
        self.refused += 1
        if self.retired and self.rng.random() < 0.6:
            return update_of(self.rng.choice(self.retired), S.COPY_SEGMENT_FINISHED)
        lost = self._segment(self.next_offset, self.next_offset + 5, {self.epoch: self.next_offset})
        return update_of(lost, self.rng.choice((S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED)))

    def _leader_change(self) -> None:
        if self.rng.random() < 0.5:
            self.epoch += 1
            return
        diverged = self.rng.choice(self.copied)
        self.next_offset = self.rng.randint(diverged.start_offset, diverged.end_offset)
        self.carried_epoch = max(e for e, start in diverged.segment_leader_epochs.items() if start <= self.next_offset)
        self.epoch += self.rng.randint(2, 4)

    def _upload(self) -> list[KafkaWrite]:
        start = self.next_offset
        end = start + self.rng.randint(0, 30)
        epochs = {self.epoch: start}
        if self.carried_epoch is not None and end > start:
            epochs = {self.carried_epoch: start, self.epoch: self.rng.randint(start + 1, end)}
        self.carried_epoch = None
        if end > max(epochs.values()) and self.rng.random() < 0.25:  # the leader changes within the segment
            self.epoch += 1
            epochs[self.epoch] = self.rng.randint(max(epochs.values()) + 1, end)
        writes: list[KafkaWrite] = []
        if self.rng.random() < 0.15:  # a failed copy, retried with a new segment id
            failed = self._segment(start, end, epochs)
            writes.append(failed)
            if self.rng.random() < 0.6:
                writes.append(update_of(failed, S.DELETE_SEGMENT_STARTED))
                if self.rng.random() < 0.7:
                    writes.append(update_of(failed, S.DELETE_SEGMENT_FINISHED))
                else:
                    self.deleting.append(failed)
            else:
                self.abandoned.append(failed)
        copy = self._segment(start, end, epochs)
        writes += [copy, update_of(copy, S.COPY_SEGMENT_FINISHED, custom_metadata=self.rng.randbytes(4))]
        self.copied.append(copy)
        self.next_offset = end + 1
        return writes

    def _segment(self, start: int, end: int, epochs: Mapping[int, int]) -> RemoteLogSegmentMetadata:
        return segment(self.tp, start, end, epochs, size=self.rng.randint(1, 10_000),
                       txn_idx_empty=self.rng.random() < 0.5)

    def _retention(self) -> list[KafkaWrite]:
        oldest = self.copied.pop(0)
        self.retired.append(oldest)
        writes: list[KafkaWrite] = [update_of(d, S.DELETE_SEGMENT_FINISHED) for d in self.deleting]
        self.deleting = []
        writes.append(update_of(oldest, S.DELETE_SEGMENT_STARTED))
        if self.rng.random() < 0.8:
            writes.append(update_of(oldest, S.DELETE_SEGMENT_FINISHED))
        else:
            self.deleting.append(oldest)
        return writes

    def deletion(self, finished: bool) -> list[KafkaWrite]:
        """The partition's deletion; unless `finished`, stopped halfway through its segments."""
        writes: list[KafkaWrite] = [partition_delete(self.tp, RemotePartitionDeleteState.DELETE_PARTITION_MARKED),
                                    partition_delete(self.tp, RemotePartitionDeleteState.DELETE_PARTITION_STARTED)]
        doomed = self.copied + self.abandoned
        for md in doomed if finished else doomed[:len(doomed) // 2]:
            writes += [update_of(md, S.DELETE_SEGMENT_STARTED), update_of(md, S.DELETE_SEGMENT_FINISHED)]
        writes += [update_of(md, S.DELETE_SEGMENT_FINISHED) for md in self.deleting]
        if finished:
            writes.append(partition_delete(self.tp, RemotePartitionDeleteState.DELETE_PARTITION_FINISHED))
        return writes


def copied(tp: TopicIdPartition, start: int, end: int, epochs: Mapping[int, int], size: int) -> list[KafkaWrite]:
    added = segment(tp, start, end, epochs, size=size)
    return [added, update_of(added, S.COPY_SEGMENT_FINISHED)]


def same_start_re_uploads() -> dict[str, tuple[TopicIdPartition, list[KafkaWrite]]]:
    """Per case, a partition where a later copy starts an epoch at the same offset as an earlier copy did: one whose
    entry for that epoch ends at or past the epoch's highest offset (Kafka keeps the earlier segment in the epoch's
    listing, unreferenced), and two where it ends below it, the same leader's shorter re-upload and an unclean
    leader's segment carrying the earlier epoch (Kafka's RemoteLogLeaderEpochState.offsetToId.put replaces the
    earlier segment's entry and the epoch's listing and size lose it; the listing of all segments keeps it)."""
    cases = {}
    for name, later in (("superseding", ({0: 10, 2: 25}, 30)), ("shorter", ({0: 10}, 15)),
                        ("unclean", ({0: 10, 2: 12}, 15))):
        tp = make_tp(f"same-start-{name}")
        epochs, end = later
        cases[name] = (tp, copied(tp, 0, 9, {0: 0}, 1) + copied(tp, 10, 20, {0: 10}, 10)
                       + copied(tp, 10, end, epochs, 100))
    return cases


@dataclass
class Migrated:
    """TBRLMM's history of this module's partitions, imported by `tierlog migrate` and read by a plain tierlog node."""

    rng: random.Random
    tbrlmm: Tbrlmm
    logs: dict[TopicIdPartition, BrokerLog]
    writes: dict[TopicIdPartition, list[KafkaWrite]]
    config: Path
    topic: str
    node: RemoteLogMetadataManager
    deleted: TopicIdPartition
    same_start: dict[str, tuple[TopicIdPartition, list[KafkaWrite]]]
    reports: list[dict[str, Any]] = field(default_factory=list)  # the command's, run by run

    def write(self, writes: Mapping[TopicIdPartition, Sequence[KafkaWrite]]) -> None:
        calls = interleaved(self.rng, writes)
        self.tbrlmm.write_all(calls)
        for call in calls:
            self.writes[call.topic_id_partition].append(call)

    def migrate(self) -> dict[str, Any]:
        code, report = run_tierlog("migrate", "--config", str(self.config), "--source-topic", SOURCE_TOPIC)
        assert code == 0 and report["problems"] == [], report
        self.node.wait_caught_up(DEADLINE_S)
        self.reports.append(report)
        return dict(report)

    def events(self, kafka_bootstrap: str) -> int:
        """Segment and partition-delete events of this module's partitions on the tierlog topic."""
        events = (codec.decode(r.value) for r in read_topic(kafka_bootstrap, self.topic) if r.value is not None)
        return sum(isinstance(e, RemoteLogSegmentMetadata | RemotePartitionDeleteMetadata)
                   and e.topic_id_partition in self.writes for e in events)


def _write_config(path: Path, kafka_bootstrap: str, topic: str, state_dir: Path) -> Path:
    """A broker's server.properties as far as `tierlog migrate` reads it: the rlmm's prefixed keys."""
    config = {"bootstrap.servers": kafka_bootstrap, "metadata.topic.name": topic, "state.dir": str(state_dir),
              "metadata.topic.num.partitions": TARGET_PARTITIONS, "metadata.topic.replication.factor": 1,
              "metadata.topic.min.insync.replicas": 1}
    path.write_text("".join(f"rlmm.config.{key}={value}\n" for key, value in config.items()), encoding="utf-8")
    return path


@pytest.fixture(scope="module", params=SEEDS, ids=lambda seed: f"seed={seed}")
def migrated(request: pytest.FixtureRequest, kafka_bootstrap: str, tbrlmm: Tbrlmm,
             tmp_path_factory: pytest.TempPathFactory) -> Iterator[Migrated]:
    """TBRLMM writes a random history of live partitions, one being deleted and one deleted (all registered first:
    Kafka 4.4's TBRLMM loses its consumer thread to a NullPointerException in markInitialized when assigned a
    partition whose deletion has finished), `tierlog migrate` imports it, and a plain tierlog node reads the result."""
    seed: int = request.param
    rng = random.Random(seed)
    tps = [make_tp(f"migrated-{i % 2}", i) for i in range(LIVE_PARTITIONS + 2)]
    logs = {tp: BrokerLog(tp, random.Random(rng.random())) for tp in tps}
    deleting, deleted = tps[-2:]
    history = {tp: log.uploads(UPLOADS) for tp, log in logs.items()}
    history[deleting] += logs[deleting].deletion(finished=False)
    history[deleted] += logs[deleted].deletion(finished=True)
    same_start = same_start_re_uploads()
    tbrlmm.register(tps + [tp for tp, _calls in same_start.values()])
    tbrlmm.write_all([call for _tp, calls in same_start.values() for call in calls])

    workdir = tmp_path_factory.mktemp("migrate-command")
    topic = unique_topic_name("migrated-from-tbrlmm")
    config = _write_config(workdir / "server.properties", kafka_bootstrap, topic, workdir / "migrate-state")
    node = RemoteLogMetadataManager(manager_config(kafka_bootstrap, workdir / "node-state", topic,
                                                   partitions=TARGET_PARTITIONS))
    try:
        found = Migrated(rng, tbrlmm, logs, {tp: [] for tp in tps}, config, topic, node, deleted, same_start)
        found.write(history)
        found.migrate()
        hosted = tps + [tp for tp, _calls in same_start.values()]
        node.on_partition_leadership_changes(hosted, [])
        wait_until(lambda: all(node.is_ready(tp) for tp in hosted), timeout=DEADLINE_S,
                   description=f"the tierlog node ready for {len(hosted)} partitions")
        yield found
    finally:
        node.close()


def test_a_migrated_tbrlmm_history_answers_every_read_as_tbrlmm(migrated: Migrated) -> None:
    """Every read of every partition (listings, lookups and transaction-index lookups at every epoch around every
    segment bound, highest offset and size per epoch), the deleted partition's and a partition neither side knows."""
    refused = sum(log.refused for log in migrated.logs.values())
    assert sum(map(len, migrated.writes.values())) > 250 and refused > 5
    replay = KafkaRulesReplay()  # the seed's histories end with overwritten segments (see SEEDS)
    for call in (call for calls in migrated.writes.values() for call in calls):
        replay.apply(call)
    assert any(lineage.overwritten_segment_ids for tp in migrated.logs for lineage in replay.store.lineages_of(tp))
    assert sum(migrated.reports[0]["dropped_by_kafka_rules"].values()) >= refused, migrated.reports[0]
    assert assert_answers_as_tbrlmm(migrated.node, migrated.tbrlmm, migrated.writes) > 5000
    assert tierlog_answer(migrated.node, migrated.deleted, ("LIST",)) == {"error": "RemoteResourceNotFoundException"}
    assert_answers_as_tbrlmm(migrated.node, migrated.tbrlmm, {make_tp("never-tiered"): []})


def test_a_copy_superseding_an_epochs_segment_from_the_same_start_answers_as_tbrlmm(migrated: Migrated) -> None:
    tp, calls = migrated.same_start["superseding"]
    assert_answers_as_tbrlmm(migrated.node, migrated.tbrlmm, {tp: calls})


@pytest.mark.parametrize("case", ["shorter", "unclean"])
def test_a_copy_ending_an_epoch_earlier_from_the_same_start_drops_the_earlier_segment_from_the_epoch_as_tbrlmm(
        case: str, migrated: Migrated) -> None:
    tp, calls = migrated.same_start[case]
    assert_answers_as_tbrlmm(migrated.node, migrated.tbrlmm, {tp: calls})


def test_a_second_run_writes_nothing_and_the_answers_stay(migrated: Migrated, kafka_bootstrap: str) -> None:
    events = migrated.events(kafka_bootstrap)
    report = migrated.migrate()
    assert report["already_migrated"] >= sum(map(len, migrated.writes.values())), report
    assert migrated.events(kafka_bootstrap) == events
    assert_answers_as_tbrlmm(migrated.node, migrated.tbrlmm, migrated.writes)


def test_verify_migration_finds_no_difference_in_the_migrated_partitions(migrated: Migrated) -> None:
    # Other tests may write to __remote_log_metadata meanwhile: only this module's partitions are looked at.
    code, result = run_tierlog("verify", "migration", "--config", str(migrated.config), "--source-topic",
                               SOURCE_TOPIC)
    assert result is not None, f"tierlog verify migration exited {code} without a result"
    assert result["problems"] == [], result["problems"]
    assert result["partitions"] >= len(migrated.writes)
    assert {str(tp) for tp in migrated.writes} & set(result["differences"]) == set(), result["differences"]


def test_a_later_run_imports_only_what_tbrlmm_wrote_since(migrated: Migrated, kafka_bootstrap: str) -> None:
    events = migrated.events(kafka_bootstrap)
    live = list(migrated.logs)[:LIVE_PARTITIONS]
    more = {tp: migrated.logs[tp].uploads(MORE_UPLOADS) for tp in live}
    migrated.write(more)
    migrated.migrate()
    # Nothing imported before is written again: at most one event per record TBRLMM wrote since.
    assert events < migrated.events(kafka_bootstrap) <= events + sum(map(len, more.values()))
    assert_answers_as_tbrlmm(migrated.node, migrated.tbrlmm, migrated.writes)
