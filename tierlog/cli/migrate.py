"""`tierlog migrate`: import the history Kafka's TopicBasedRemoteLogMetadataManager wrote to `__remote_log_metadata`
into tierlog's metadata topic, idempotently and resumably.

A user partition's records all sit in one source partition. Each source partition is read in turn, each of its user
partitions' records replayed under Kafka's rules (the checks tierlog's manager makes of each API call), and the
records that take what tierlog holds of the partition (the import's node's view) to that final state appended with
one idempotent producer: the newest record of each key tierlog's own writer would have left for the same calls, each
reached through valid transitions, then a lineage checkpoint of the partition's epochs once those are acknowledged
(tierlog.migration.records). A progress log in the state dir records, per user partition, the last source record
decided, once the partition's records are acknowledged; a run killed before that finds what it wrote in the view.
Run it before any node writes to tierlog's topic (the runbook's import step): the records assume they are the
partition's newest.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlmm import codec, state
from rlmm.errors import InvalidArgumentError
from rlmm.events import MetadataEvent, RecordKey, key_of, metadata_partition_for
from rlmm.types import (
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemotePartitionDeleteMetadata,
    TopicIdPartition,
)
from tierlog.cli.common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, CommandError, Settings
from tierlog.cli.kafka_metadata import (
    Comparison,
    KafkaRulesReplay,
    TopicDescription,
    describe_topic,
    end_offsets,
    fold_tierlog,
    partition_answers,
    read_source,
    read_source_partitions,
    replay_source,
    require_source,
    store_differences,
)
from tierlog.cli.output import ProgressBar, emit, print_table
from tierlog.migration.records import (
    SourceProblem,
    SourceRecord,
    StateRecord,
    TopicMetadata,
    lineage_checkpoint,
    records_to_reach,
    written_kind,
)

if TYPE_CHECKING:
    from confluent_kafka import KafkaError, Message

log = logging.getLogger(__name__)

PROGRESS_DIR = "migration"
SYNC_EVERY_S = 5.0
REPORT_EVERY_S = 10.0
# Bigger batches than a node's writer (2 ms): the import appends hundreds of thousands of records in a row.
PRODUCER_SETTINGS = {"linger.ms": 50}
# Source partitions read at once: the next are fetched while one is imported; each is held whole, decoded, until then.
PARTITIONS_READ_AHEAD = 3
SHOWN_PROBLEMS = 20
COMPARE_RETRY_S = 1.0
# The newest records of a user partition on the source topic that tierlog may not hold yet when finalize compares the
# stores (writes on their way through a node's import; see compare_in_one_order).
IN_FLIGHT_RECORDS = 8


def record_type(metadata: TopicMetadata) -> str:
    if isinstance(metadata, RemoteLogSegmentMetadata):
        return "segment"
    if isinstance(metadata, RemoteLogSegmentMetadataUpdate):
        return "segment update"
    return "partition delete"


@dataclass
class MigrationReport:
    """What a run read, wrote (or would write), found done already, dropped, and could not migrate."""

    source: str
    dry_run: bool
    read: Counter[str] = field(default_factory=Counter)
    written: Counter[str] = field(default_factory=Counter)
    already: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    problems: list[SourceProblem] = field(default_factory=list)
    seconds: float = 0.0
    started: float = field(default_factory=time.monotonic)

    def as_json(self) -> dict[str, Any]:
        return {
            "source_topic": self.source, "dry_run": self.dry_run, "read": dict(self.read),
            "written" if not self.dry_run else "would_write": dict(self.written), "already_migrated": self.already,
            "dropped_by_kafka_rules": dict(self.dropped), "problems": [p.as_json() for p in self.problems],
            "seconds": round(self.seconds, 3),
            "records_per_s": round(sum(self.read.values()) / self.seconds) if self.seconds else None,
        }


# --- progress ---------------------------------------------------------------------------------------------

def _tp_key(tp: TopicIdPartition) -> tuple[int, int]:
    return tp.topic_id.int, tp.partition


class ProgressLog:
    """The last source offset decided per user partition, as appended lines `<topic id hex> <partition> <offset>`
    after a first line naming the source and target topics (ids included: a recreated topic is another history)."""

    def __init__(self, path: Path, identity: Mapping[str, str]) -> None:
        self.path = path
        self.identity = dict(identity)
        self._done: dict[tuple[int, int], int] = {}
        self._lines: list[str] = []
        self._fd = -1
        self._synced_at = time.monotonic()

    @classmethod
    def read(cls, path: Path, identity: Mapping[str, str]) -> dict[tuple[int, int], int]:
        """The offsets a progress file records, without opening it for appending (a dry run's view)."""
        progress = cls(path, identity)
        if path.exists():
            progress._load()
        return progress._done

    @classmethod
    def open(cls, path: Path, identity: Mapping[str, str]) -> ProgressLog:
        progress = cls(path, identity)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            progress._load()
        else:
            progress._rewrite()
        progress._fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        return progress

    def _load(self) -> None:
        with self.path.open(encoding="ascii") as lines:
            header = next(lines, "")
            try:
                found = json.loads(header)
            except ValueError:
                found = None
            if found != self.identity:
                raise CommandError(
                    f"progress file {self.path} belongs to another migration ({header.strip()!r}, this one is "
                    f"{json.dumps(self.identity)}); move it away to start this one from the beginning", EXIT_USAGE)
            for line in lines:
                fields = line.split()
                # A run killed while appending may leave its last line torn: that decision is made again.
                if len(fields) != 3 or not line.endswith("\n"):
                    continue
                key = (int(fields[0], 16), int(fields[1]))
                self._done[key] = max(self._done.get(key, -1), int(fields[2]))

    def _rewrite(self) -> None:
        """The file with the identity and one line per user partition, swapped in whole."""
        partial = self.path.with_name(self.path.name + ".partial")
        with partial.open("w", encoding="ascii") as out:
            out.write(json.dumps(self.identity) + "\n")
            out.writelines(f"{topic_id:032x} {partition} {offset}\n"
                           for (topic_id, partition), offset in self._done.items())
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, self.path)

    @property
    def done(self) -> Mapping[tuple[int, int], int]:
        """The last source offset decided per user partition (topic id as an int, partition)."""
        return self._done

    def record(self, tp: TopicIdPartition, offset: int) -> None:
        key = _tp_key(tp)
        self._done[key] = offset
        self._lines.append(f"{key[0]:032x} {key[1]} {offset}\n")

    def flush(self) -> None:
        """Hand the recorded lines to the OS: from here a killed process keeps them."""
        if self._lines:
            os.write(self._fd, "".join(self._lines).encode("ascii"))
            self._lines.clear()
        if time.monotonic() - self._synced_at > SYNC_EVERY_S:
            os.fsync(self._fd)
            self._synced_at = time.monotonic()

    def close(self) -> None:
        """Flush, then shrink the file to one line per user partition."""
        if self._fd < 0:
            return
        self.flush()
        os.close(self._fd)
        self._fd = -1
        self._rewrite()


# --- the import -------------------------------------------------------------------------------------------

class Appender:
    """Appends records to tierlog's metadata topic with one idempotent producer, as tierlog's writer encodes and
    places them, and learns from the acknowledgements the offset of each user partition's newest record."""

    def __init__(self, settings: Settings, topic: str, num_partitions: int) -> None:
        from rlmm.event_log import EventProducer

        self._producer = EventProducer(topic, settings.kafka_client(**PRODUCER_SETTINGS))
        self._topic = topic
        self._num_partitions = num_partitions
        self._timeout_s = settings.timeout_s
        self._errors: list[str] = []
        self.newest: dict[TopicIdPartition, int] = {}
        self._routes: dict[TopicIdPartition, tuple[int, Callable[[KafkaError | None, Message], None]]] = {}

    def append(self, tp: TopicIdPartition, key: RecordKey, event: MetadataEvent | None) -> None:
        route = self._routes.get(tp)
        if route is None:
            route = self._routes[tp] = (metadata_partition_for(tp.topic_id, tp.partition, self._num_partitions),
                                        partial(self._delivered, tp))
        self._producer.append(route[0], key.encode(), None if event is None else codec.encode(event), [], route[1],
                              time.monotonic() + self._timeout_s)

    def _delivered(self, tp: TopicIdPartition, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._errors.append(f"{tp}: {error.str()}")
        else:
            self.newest[tp] = max(self.newest.get(tp, -1), message.offset() or 0)

    def flush(self) -> None:
        """Wait until every record appended is acknowledged; CommandError when one was refused or the deadline
        passed (what was acknowledged is kept: a rerun goes on from there)."""
        left = self._producer.close(self._timeout_s)  # a flush: the producer stays usable
        if left or self._errors:
            raise CommandError(f"writing to {self._topic} failed: "
                               + (f"{left} record(s) not acknowledged within {self._timeout_s:g} s; "
                                  if left else "") + "; ".join(self._errors[:SHOWN_PROBLEMS])
                               + "; what was written is kept, rerun `tierlog migrate` to resume")


def start_write(appender: Appender, event: RemoteLogSegmentMetadata | RemotePartitionDeleteMetadata) -> None:
    """Append one segment or partition-delete record of the import (the records the report counts)."""
    appender.append(event.topic_id_partition, key_of(event), event)


@dataclass
class Importer:
    """Brings each user partition of tierlog to the state Kafka's rules build from its records on the source topic:
    a user partition's records all sit in one source partition, so each source partition is read, replayed and
    written in turn. `held` is what tierlog holds (the import's node's view, or for a dry run tierlog's topic folded);
    `appender` None for a dry run."""

    held: state.StateReader
    done: Mapping[tuple[int, int], int]
    report: MigrationReport
    appender: Appender | None = None
    progress: ProgressLog | None = None
    broker_id: int = 0
    # User partitions whose records are appended, not all acknowledged yet -> their last source offset.
    _unsettled: dict[TopicIdPartition, int] = field(default_factory=dict)

    def source_partition(self, records: list[SourceRecord]) -> None:
        """Import one source partition's records (in their order)."""
        histories: dict[TopicIdPartition, list[SourceRecord]] = {}
        for record in records:
            histories.setdefault(record.metadata.topic_id_partition, []).append(record)
        replay = KafkaRulesReplay()
        for tp, history in histories.items():
            done = self.done.get(_tp_key(tp), -1)
            if history[-1].offset <= done:  # decided by an earlier run
                self.report.already += len(history)
                continue
            undecided = 0
            for record in history:
                dropped = replay.apply(record.metadata)
                if record.offset <= done:
                    self.report.already += 1
                elif dropped is not None:
                    self.report.dropped[dropped] += 1
                    log.info("dropped as Kafka's rules drop it (%s): partition %d offset %d: %s", dropped,
                             record.partition, record.offset, record.metadata)
                else:
                    undecided += 1
            try:
                primaries = records_to_reach(replay.store, self.held, tp)
            except InvalidArgumentError as exc:
                raise CommandError(f"cannot import {tp}: {exc}") from exc
            if not primaries:
                self.report.already += undecided
            for _key, event in primaries:
                if event is not None:
                    self.report.written[written_kind(event)] += 1
            if self.appender is not None:
                self._write(replay.store, tp, primaries, history[-1].offset)
        self._settle()

    def _write(self, final: state.StateReader, tp: TopicIdPartition, primaries: list[StateRecord], last_offset: int
               ) -> None:
        """Append a user partition's records, then, once they are acknowledged (their offsets known), its epochs'
        checkpoint; its progress is recorded once that is acknowledged too (at the next `_settle`)."""
        assert self.appender is not None
        for key, event in primaries:
            if event is None:
                self.appender.append(tp, key, None)
            else:
                start_write(self.appender, event)
        if primaries:
            self._settle()
        known = [o for o in (self.appender.newest.get(tp), self.held.lineage_position(tp)) if o is not None]
        for key, checkpoint in lineage_checkpoint(final, self.held, tp, bool(primaries), max(known, default=None),
                                                  int(time.time() * 1000), self.broker_id):
            self.appender.append(tp, key, checkpoint)
        self._unsettled[tp] = last_offset

    def _settle(self) -> None:
        """Wait for every record appended to be acknowledged, then record the progress of the partitions done."""
        if self.appender is None or self.progress is None:
            return
        self.appender.flush()
        for tp, offset in self._unsettled.items():
            self.progress.record(tp, offset)
        self._unsettled.clear()
        self.progress.flush()


# --- the command ------------------------------------------------------------------------------------------

def _identity(source: TopicDescription, target: TopicDescription) -> dict[str, str]:
    return {"source_topic": source.name, "source_topic_id": source.topic_id, "target_topic": target.name,
            "target_topic_id": target.topic_id}


def progress_path(state_dir: Path, source: str) -> Path:
    return state_dir / PROGRESS_DIR / f"{source}.progress"


def _migrate(settings: Settings, source: TopicDescription, importer: Importer, show: bool | None) -> dict[int, int]:
    """Read the source up to its end offsets now (returned), one partition at a time, importing each."""
    report = importer.report
    ends = end_offsets(settings, source)
    total = sum(ends.values())
    last_report = time.monotonic()
    done = 0
    with ProgressBar("migrating" if not report.dry_run else "replaying", total, show) as bar:
        for _partition, items in read_source_partitions(settings, source, ends, PARTITIONS_READ_AHEAD):
            records: list[SourceRecord] = []
            for item in items:
                if isinstance(item, SourceProblem):
                    report.problems.append(item)
                    log.warning("not migrated: %s", item)
                    continue
                report.read[record_type(item.metadata)] += 1
                records.append(item)
            importer.source_partition(records)
            done += len(items)
            bar.update(done)
            if time.monotonic() - last_report > REPORT_EVERY_S:
                last_report = time.monotonic()
                log.info("imported %d of %d records of %s (%.0f/s), %s", done, total, source.name,
                         done / (last_report - report.started), dict(report.written))
        bar.finish(done)
    report.seconds = time.monotonic() - report.started
    return ends


def _held_by_topic(settings: Settings, target: TopicDescription | None, show: bool | None) -> state.StateReader:
    """What tierlog's metadata topic holds now, folded (a dry run's `held`): nothing when it does not exist yet."""
    if target is None:
        return state.InMemoryState()
    return fold_tierlog(settings, show)


def _caught_up_node(config: Mapping[str, Any], timeout_s: float) -> tuple[str, int]:
    """Start a node on the state dir and wait until its view applied every record on tierlog's topic, for as long
    as it keeps applying some; its topic's name and partition count."""
    from rlmm import RemoteLogMetadataManager
    from rlmm.errors import MetadataTimeoutError

    with RemoteLogMetadataManager(config) as manager:
        while True:
            before = sum(manager.applied_offsets().values())
            try:
                manager.wait_caught_up(timeout_s)
                break
            except MetadataTimeoutError:
                if sum(manager.applied_offsets().values()) == before:
                    raise CommandError(f"the view in the state dir applied nothing of {manager.metadata_topic} for "
                                       f"{timeout_s:g} s (rerun to resume)") from None
                log.info("the view applied %d records of %s so far", sum(manager.applied_offsets().values()),
                         manager.metadata_topic)
        return manager.metadata_topic, manager.num_partitions


def _commit_import_position(settings: Settings, source: TopicDescription, ends: Mapping[int, int],
                            metadata_topic: str) -> None:
    """Record in the migrating nodes' consumer group (tierlog.migration.node) that the source is imported up to
    `ends`, so that nodes started in migration mode go on from there (never moving a committed offset back)."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    from tierlog.migration.node import import_group

    consumer = Consumer(settings.kafka_client(**{"group.id": import_group(metadata_topic),
                                                 "enable.auto.commit": False}))
    try:
        committed = consumer.committed([TopicPartition(source.name, p) for p in ends], timeout=settings.timeout_s)
        already = {tp.partition: tp.offset for tp in committed}
        consumer.commit(offsets=[TopicPartition(source.name, p, max(end, already.get(p, -1)))
                                 for p, end in ends.items()], asynchronous=False)
    except KafkaException as exc:  # nodes in migration mode hold the group: their import carries on by itself
        log.warning("the import position of %s was not recorded for nodes in migration mode (%s); they import "
                    "what is left themselves", source.name, exc)
    finally:
        consumer.close()


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    if args.step == "finalize":
        return cmd_finalize(args, settings)
    source = require_source(settings, args.source_topic)
    report = MigrationReport(source.name, args.dry_run)
    if args.dry_run:
        # A dry run needs no state dir; given one, it counts what an earlier run's progress file says is done.
        given = args.state_dir or settings.get("state.dir")
        target = describe_topic(settings, settings.metadata_topic())
        done = ProgressLog.read(progress_path(Path(given), source.name), _identity(source, target)) \
            if given and target is not None else {}
        _migrate(settings, source, Importer(_held_by_topic(settings, target, args.progress), done, report),
                 args.progress)
    else:
        state_dir = settings.state_dir(args.state_dir)
        config = settings.node_config(state_dir)
        if int(config["broker.id"]) < 0:  # unset: the records' checkpoints need a broker id, and -1 is none
            config["broker.id"] = "0"
        # The view catches up first: it is what the import compares with. While the import appends, no node of
        # this process applies its records one by one beside it; the node started after it takes them in as a
        # backlog (the newest record of each key), which costs a fraction of that.
        metadata_topic, num_partitions = _caught_up_node(config, settings.timeout_s)
        target = describe_topic(settings, metadata_topic)
        assert target is not None, "the manager created or found its topic"
        from rlmm.view import MetadataView

        progress = ProgressLog.open(progress_path(state_dir, source.name), _identity(source, target))
        view = MetadataView.open(state_dir, read_only=True)
        try:
            appender = Appender(settings, metadata_topic, num_partitions)
            importer = Importer(view, progress.done, report, appender, progress, int(config["broker.id"]))
            ends = _migrate(settings, source, importer, args.progress)
        finally:
            view.close()
            progress.close()
        _caught_up_node(config, settings.timeout_s)
        report.seconds = time.monotonic() - report.started
        _commit_import_position(settings, source, ends, metadata_topic)
    _show(args, report)
    if report.problems:
        print(f"tierlog migrate: {len(report.problems)} record(s) of {source.name} could not be migrated (listed "
              "above); everything else was", file=sys.stderr)
        return EXIT_PROBLEM
    return EXIT_OK


def _show(args: argparse.Namespace, report: MigrationReport) -> None:
    def human() -> None:
        verb = "would write" if report.dry_run else "written"
        rows = [{"record": kind, "read": report.read[kind], verb: report.written[kind]}
                for kind in ("segment", "segment update", "partition delete")]
        print_table(rows, ["record", "read", verb])
        print(f"\nalready migrated: {report.already}")
        for reason, count in sorted(report.dropped.items()):
            print(f"dropped as Kafka's rules drop them ({reason}): {count}")
        for problem in report.problems[:SHOWN_PROBLEMS]:
            print(f"not migrated: {problem}")
        if len(report.problems) > SHOWN_PROBLEMS:
            print(f"... and {len(report.problems) - SHOWN_PROBLEMS} more (--json lists every one)")
        print(f"\n{sum(report.read.values())} records in {report.seconds:.1f} s")

    emit(args, report.as_json(), human)


# --- finalize ---------------------------------------------------------------------------------------------

def _cluster_brokers(settings: Settings) -> list[int]:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(settings.kafka_client())  # must outlive its future
    try:
        found = admin.describe_cluster(request_timeout=settings.timeout_s).result(settings.timeout_s)
    except KafkaException as exc:
        raise CommandError(f"cannot list the brokers of {settings.bootstrap()}: {exc}") from exc
    return sorted(node.id for node in found.nodes)


def compare_in_one_order(settings: Settings, source: TopicDescription, show: bool | None) -> Comparison:
    """The stores compared before finalize: as `tierlog verify migration` compares them, but tierlog's topic is read
    first. In migration mode every event reaches tierlog through the import of the source topic, in its order, so each
    user partition's events in tierlog are then a prefix of its records on the source read after. A partition whose
    answers differ still agrees when tierlog answers as Kafka's rules over its source records without at most
    IN_FLIGHT_RECORDS of the newest (writes on their way through an import, under load); any other difference is
    real, and reading again does not make it go away."""
    tierlog = fold_tierlog(settings, show)
    ends = end_offsets(settings, source)
    replay, problems, tbrlmm_writes, read = replay_source(settings, source, ends, show)
    differences = store_differences(replay.store, tierlog, "TBRLMM", "tierlog")
    for tp in _behind_by_writes_in_flight(settings, source, ends, tierlog, set(differences)):
        del differences[tp]
    partitions = len({*replay.store.user_partitions(), *tierlog.user_partitions()})
    return Comparison(read, partitions, differences, problems, tbrlmm_writes)


def _behind_by_writes_in_flight(settings: Settings, source: TopicDescription, ends: Mapping[int, int], tierlog: Any,
                                differing: set[TopicIdPartition]) -> set[TopicIdPartition]:
    """Of the `differing` user partitions, those where tierlog answers as Kafka's rules over the partition's source
    records below `ends` without some of the newest IN_FLIGHT_RECORDS."""
    if not differing:
        return set()
    histories: dict[TopicIdPartition, list[TopicMetadata]] = {tp: [] for tp in differing}
    for batch in read_source(settings, source, ends):
        for item in batch:
            if isinstance(item, SourceRecord) and item.metadata.topic_id_partition in histories:
                histories[item.metadata.topic_id_partition].append(item.metadata)
    behind = set()
    for tp, history in histories.items():
        held = partition_answers(tierlog, tp)
        replay = KafkaRulesReplay()
        for i, metadata in enumerate(history):
            if i >= len(history) - IN_FLIGHT_RECORDS and partition_answers(replay.store, tp) == held:
                behind.add(tp)
                break
            replay.apply(metadata)
    return behind


def finalize_blockers(brokers: list[int], control: Any, tbrlmm_writes: Mapping[int, int], now_ms: int,
                      max_heartbeat_age_ms: int) -> list[str]:
    """What keeps the migration from being finalized: a broker not (or no longer) in migration mode, or a broker that
    wrote to `__remote_log_metadata` as TBRLMM after the last node came up in migration mode."""
    from tierlog.migration.control import DUAL_WRITE

    blockers = []
    for broker in brokers:
        announced = control.nodes.get(broker)
        if announced is None:
            blockers.append(f"broker {broker} never announced migration mode: is it still on "
                            "TopicBasedRemoteLogMetadataManager? Roll it with rlmm.config.migration.mode=dual-write")
        elif announced.state != DUAL_WRITE:
            blockers.append(f"broker {broker} is in state {announced.state}, not {DUAL_WRITE}")
        elif now_ms - announced.heartbeat_ms > max_heartbeat_age_ms:
            age_s = (now_ms - announced.heartbeat_ms) / 1000
            blockers.append(f"broker {broker}'s last migration heartbeat is {age_s:.0f} s old: was it rolled back to "
                            "TopicBasedRemoteLogMetadataManager, or is its agent down?")
    starts = [control.nodes[b].started_ms for b in brokers if b in control.nodes]
    last_start = max(starts, default=now_ms)
    for broker, written_ms in sorted(tbrlmm_writes.items()):
        if written_ms > last_start:
            blockers.append(f"broker {broker} wrote to the source topic as TopicBasedRemoteLogMetadataManager at "
                            f"{written_ms} ms, after the last node started in migration mode ({last_start} ms)")
    return blockers


def cmd_finalize(args: argparse.Namespace, settings: Settings) -> int:
    from confluent_kafka import Producer

    from tierlog.migration.control import (
        DEFAULT_CONTROL_TOPIC,
        FINALIZE_KEY,
        FINALIZED,
        Finalize,
        now_ms,
        read_control,
    )

    source = require_source(settings, args.source_topic)
    control_topic = settings.get("migration.control.topic") or DEFAULT_CONTROL_TOPIC
    if describe_topic(settings, control_topic) is None:
        raise CommandError(f"no migration control topic {control_topic} on {settings.bootstrap()}: no node ever ran "
                           "in migration mode (rlmm.config.migration.mode=dual-write)", EXIT_USAGE)
    client = settings.kafka_client()
    control, _ = read_control(client, control_topic, settings.timeout_s)
    result: dict[str, Any] = {"control_topic": control_topic, "source_topic": source.name}
    if control.finalize is not None:
        finalized_ms = control.finalize.finalized_ms
        result.update(finalized=True, already=True, finalized_ms=finalized_ms)
        emit(args, result, lambda: print(f"the migration was already finalized at {finalized_ms} ms"))
        return EXIT_OK
    brokers = _cluster_brokers(settings)
    comparison = compare_in_one_order(settings, source, args.progress)
    for _ in range(args.attempts - 1):  # an import more than IN_FLIGHT_RECORDS behind catches up in a moment
        if comparison.ok:
            break
        time.sleep(COMPARE_RETRY_S)
        comparison = compare_in_one_order(settings, source, args.progress)
    control, _ = read_control(client, control_topic, settings.timeout_s)
    blockers = finalize_blockers(brokers, control, comparison.tbrlmm_writes, now_ms(), args.max_heartbeat_age_s * 1000)
    blockers += [f"{tp}: {line}" for tp, lines in comparison.differences.items() for line in lines]
    blockers += [f"unreadable: {problem}" for problem in comparison.problems]
    result.update(brokers=brokers, records=comparison.records, partitions=comparison.partitions,
                  nodes={b: control.nodes[b].state for b in brokers if b in control.nodes}, blockers=blockers)
    finalize = not blockers and not args.dry_run
    if finalize:
        producer = Producer(client)
        checked = {"brokers": brokers, "records": comparison.records, "partitions": comparison.partitions}
        producer.produce(control_topic, key=FINALIZE_KEY, value=Finalize(now_ms(), checked).value())
        if producer.flush(settings.timeout_s):
            raise CommandError(f"the finalize record was not acknowledged by {control_topic} within "
                               f"{settings.timeout_s:g} s; run finalize again")
        deadline = time.monotonic() + settings.timeout_s
        while True:  # every node stops its dual writes within a heartbeat, and says so
            control, _ = read_control(client, control_topic, settings.timeout_s)
            lagging = [b for b in brokers if control.nodes[b].state != FINALIZED]
            if not lagging or time.monotonic() > deadline:
                break
            time.sleep(COMPARE_RETRY_S)
        result["not_yet_finalized"] = lagging
    result["finalized"] = finalize

    def human() -> None:
        for line in blockers[:SHOWN_PROBLEMS]:
            print(f"blocks finalize: {line}")
        if len(blockers) > SHOWN_PROBLEMS:
            print(f"... and {len(blockers) - SHOWN_PROBLEMS} more (--json lists every one)")
        print(f"brokers {brokers}; {source.name} and {settings.metadata_topic()} compared over "
              f"{comparison.partitions} user partitions ({comparison.records} records)")
        if finalize:
            print(f"finalized: nodes write to {settings.metadata_topic()} directly, no longer to {source.name}"
                  + (f" (not yet confirmed by brokers {result['not_yet_finalized']})"
                     if result["not_yet_finalized"] else ""))
        elif not blockers:
            print("ready to finalize (--dry-run: nothing written)")

    emit(args, result, human)
    return EXIT_PROBLEM if blockers else EXIT_OK


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """`tierlog migrate`'s arguments (registered by tierlog.cli.main)."""
    from tierlog.cli.kafka_metadata import DEFAULT_SOURCE_TOPIC

    p = sub.add_parser("migrate", parents=[common],
                       help="import Kafka's __remote_log_metadata (TopicBasedRemoteLogMetadataManager) into tierlog's "
                            "metadata topic; rerun to resume")
    p.add_argument("step", nargs="?", choices=("import", "finalize"), default="import",
                   help="import (the default): copy the source's records into tierlog's topic; finalize: check that "
                        "every broker runs tierlog in migration mode and both stores agree, then end the dual writes")
    p.add_argument("--attempts", type=int, default=3,
                   help="with finalize: compare the two stores up to this many times before reporting differences")
    p.add_argument("--max-heartbeat-age-s", type=int, default=30,
                   help="with finalize: a broker whose migration heartbeat is older counts as not migrated")
    p.add_argument("--source-topic", default=DEFAULT_SOURCE_TOPIC,
                   help=f"the topic TBRLMM wrote (default {DEFAULT_SOURCE_TOPIC})")
    p.add_argument("--dry-run", action="store_true", help="count what would be written (with finalize: run the "
                                                          "checks only); write nothing")
    p.add_argument("--state-dir", help="a state dir of its own for the migrating node (default state.dir); it also "
                                       "keeps the progress that lets a rerun resume")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when stderr is a terminal)")
    p.set_defaults(run=cmd_migrate)
