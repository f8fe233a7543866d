"""`tierlog export`: write tierlog's current metadata as Kafka's own records into a fresh `__remote_log_metadata`-style
topic, so that brokers can go back to TopicBasedRemoteLogMetadataManager (TBRLMM).

TBRLMM rebuilds its state by replaying its topic, so the export is a history whose replay under Kafka's rules
answers as tierlog does, checked in memory before anything is written. Per user partition, in this order:
- finished segments that some epoch's offset index no longer holds (a re-upload displaced them there, or took their
  entry and ended the epoch below its highest offset: overwritten) and segments being deleted: add, copy finished
  (and delete started), so the later uploads displace or overwrite them as they did;
- the finished segments every epoch's offset index holds, in each epoch by their start there: add, copy finished;
- segments being copied: add;
- where tierlog's highest offset of an epoch is above what the segments left raise it to (the segments that raised
  it are gone), a stand-in segment of that one offset and no bytes, added, finished and deleted at once: it raises
  the epoch's highest offset as the deleted segments did, and leaves nothing behind;
- the partition's delete state, through each state up to it (a finished delete: TBRLMM forgets the partition).
Each record carries the segment's current broker id, event time and custom metadata.

Where a re-upload displaced or overwrote a finished segment within one leader epoch, the order of the original
uploads matters and tierlog's state does not always tell it: for a partition with overwritten segments a few orders
are tried (`_superseded_orders`), and when the replay of a partition would still answer otherwise than tierlog, the
export names the partitions and writes nothing.
"""

from __future__ import annotations

import argparse
import graphlib
import itertools
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from rlmm import state
from rlmm.kafka_format import encode, metadata_partition
from rlmm.types import (
    RemoteLogSegmentId,
    RemoteLogSegmentMetadata,
    RemoteLogSegmentMetadataUpdate,
    RemoteLogSegmentState,
    RemotePartitionDeleteMetadata,
    RemotePartitionDeleteState,
    TopicIdPartition,
)
from tierlog.cli.common import EXIT_OK, EXIT_PROBLEM, EXIT_USAGE, CommandError, Settings
from tierlog.cli.kafka_metadata import (
    DEFAULT_SOURCE_TOPIC,
    KafkaRulesReplay,
    TopicDescription,
    TopicMetadata,
    describe_topic,
    end_offsets,
    fold_tierlog,
    partition_answers,
    store_differences,
)
from tierlog.cli.output import ProgressBar, emit

S = RemoteLogSegmentState
# TBRLMM's defaults for its topic (remote.log.metadata.topic.num.partitions, .replication.factor, .min.isr).
TBRLMM_PARTITIONS = 50
TBRLMM_REPLICATION_FACTOR = 3
TBRLMM_MIN_ISR = 2
# Stand-in segment ids are derived from the partition and epoch, so an export is the same bytes every time.
_STAND_IN_NAMESPACE = uuid.UUID("6f1d3a52-6c8e-4f0e-9a53-1b0e3c3f5e26")


def _is_referenced(store: state.StateReader, md: RemoteLogSegmentMetadata) -> bool:
    """Whether every epoch's offset index of the segment holds it (no later upload displaced it anywhere)."""
    segment = md.remote_log_segment_id
    return all(store.index_get(segment.topic_id_partition, epoch, start) == segment.id
               for epoch, start in md.segment_leader_epochs.items())


def _was_copied(store: state.StateReader, md: RemoteLogSegmentMetadata) -> bool:
    """Whether a segment being deleted had been copied first: each of its epochs' highest offsets reaches its end
    there. (COPY_SEGMENT_STARTED may go straight to DELETE_SEGMENT_STARTED, and only a copied segment raised them.)"""
    tp = md.topic_id_partition
    return all((found := state.highest_offset_for_epoch(store, tp, epoch)) is not None
               and found >= md.epoch_end_offset(epoch) for epoch in md.segment_leader_epochs)


def _lifecycle(md: RemoteLogSegmentMetadata, copied: bool = True) -> Iterator[TopicMetadata]:
    """Add, then each update up to the segment's state (copy finished only if `copied`), all with its current broker
    id, time and custom metadata."""
    yield RemoteLogSegmentMetadata(
        md.remote_log_segment_id, md.start_offset, md.end_offset, md.max_timestamp_ms, md.broker_id,
        md.event_timestamp_ms, md.segment_size_in_bytes, md.segment_leader_epochs, md.custom_metadata,
        S.COPY_SEGMENT_STARTED, md.txn_idx_empty)
    for target in (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED, S.DELETE_SEGMENT_FINISHED):
        if target > md.state:
            return
        if copied or target is not S.COPY_SEGMENT_FINISHED:
            yield RemoteLogSegmentMetadataUpdate(md.remote_log_segment_id, md.event_timestamp_ms, md.custom_metadata,
                                                 target, md.broker_id)


def _upload_order(md: RemoteLogSegmentMetadata) -> tuple[int, int, bytes]:
    """The order uploads usually came in: by end offset; of two ending alike, the one covering more came later."""
    return md.end_offset, -md.start_offset, md.remote_log_segment_id.id.bytes


def _in_key_order(referenced: list[RemoteLogSegmentMetadata]) -> list[RemoteLogSegmentMetadata]:
    """The segments the offset indexes hold, ordered so that in every epoch they finish by ascending start there
    (a later finish with a lower start could displace the others); by start offset where the epochs leave a choice,
    and plainly by start offset if the epochs' orders contradict each other."""
    by_epoch: dict[int, list[tuple[int, int]]] = {}
    for i, md in enumerate(referenced):
        for epoch, start in md.segment_leader_epochs.items():
            by_epoch.setdefault(epoch, []).append((start, i))
    sorter: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter({i: () for i in range(len(referenced))})
    for entries in by_epoch.values():
        entries.sort()
        for (_, before), (_, after) in itertools.pairwise(entries):
            sorter.add(after, before)
    try:
        sorter.prepare()
    except graphlib.CycleError:
        return referenced
    order: list[int] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())  # `referenced` is in listing order: the lowest index starts first
        order.extend(ready)
        sorter.done(*ready)
    return [referenced[i] for i in order]


def partition_history(store: state.StateReader, tp: TopicIdPartition) -> list[TopicMetadata]:
    """The records whose replay under Kafka's rules gives `tp`'s state in `store` (see the module's docstring)."""
    delete = store.partition_delete(tp)
    history: list[TopicMetadata] = []
    if not state.is_deleted(store, tp):
        segments = sorted(store.segments_of(tp), key=state.listing_order)
        referenced = [md for md in segments if md.state is S.COPY_SEGMENT_FINISHED and _is_referenced(store, md)]
        superseded = [md for md in segments
                      if md.state in (S.COPY_SEGMENT_FINISHED, S.DELETE_SEGMENT_STARTED) and md not in referenced]
        orders = _superseded_orders(store, tp)
        for attempt, (order, took) in enumerate(orders, 1):
            history = []
            for md in sorted(superseded, key=order):
                history.extend(_lifecycle(md, md.state is S.COPY_SEGMENT_FINISHED or _was_copied(store, md)))
            in_key_order = _in_key_order(referenced)
            # Stable: those that took an overwritten segment's entry last, once the epoch went on past them.
            for md in (*sorted(in_key_order, key=took), *(md for md in segments if md.state is S.COPY_SEGMENT_STARTED)):
                history.extend(_lifecycle(md))
            history.extend(_stand_ins(store, tp, history))
            if attempt == len(orders) or _replays_to(store, tp, history):
                break
    if delete is not None:
        history.extend(RemotePartitionDeleteMetadata(tp, target, delete.event_timestamp_ms, delete.broker_id)
                       for target in RemotePartitionDeleteState if target <= delete.state)
    return history


Order = Callable[[RemoteLogSegmentMetadata], tuple[Any, ...]]


def _superseded_orders(store: state.StateReader, tp: TopicIdPartition) -> list[tuple[Order, Order]]:
    """The orders to try: of the finished segments the offset indexes no longer hold and those being deleted, and
    (a stable sort's key) of the segments the indexes hold, after their key order.

    First, segments a later upload displaced or overwrote before the others, each group in upload order. Where some
    epoch calls segments overwritten (a later upload from the same start took their entry and ended the epoch below
    its highest offset), that upload must have come while the epoch went on past it: then also the overwritten
    segments first, longest first, so each is overwritten by the shorter ones after it rather than displacing
    them, and the held segments that took an overwritten one's entry after the others."""
    displaced = {segment for lineage in store.lineages_of(tp) for segment in lineage.displaced_segment_ids}
    overwritten: dict[uuid.UUID, int] = {}
    for lineage in store.lineages_of(tp):
        for segment in lineage.overwritten_segment_ids:
            overwritten[segment] = lineage.epoch
    taken = set()  # (epoch, start) of the entries overwritten segments had
    for segment, epoch in overwritten.items():
        md = store.segment(RemoteLogSegmentId(tp, segment))
        if md is not None and epoch in md.segment_leader_epochs:
            taken.add((epoch, md.segment_leader_epochs[epoch]))

    def replaced_first(md: RemoteLogSegmentMetadata) -> tuple[Any, ...]:
        return (md.remote_log_segment_id.id not in displaced | overwritten.keys(), *_upload_order(md))

    def overwritten_longest_first(md: RemoteLogSegmentMetadata) -> tuple[Any, ...]:
        if md.remote_log_segment_id.id in overwritten:
            return (0, -md.end_offset, md.start_offset, md.remote_log_segment_id.id.bytes)
        return (1 if md.remote_log_segment_id.id in displaced else 2, *_upload_order(md))

    def as_they_are(_md: RemoteLogSegmentMetadata) -> tuple[Any, ...]:
        return ()

    def took_last(md: RemoteLogSegmentMetadata) -> tuple[Any, ...]:
        return (any(entry in taken for entry in md.segment_leader_epochs.items()),)

    first = (replaced_first, as_they_are)
    return [first, (overwritten_longest_first, as_they_are), (overwritten_longest_first, took_last)] if overwritten \
        else [first]


def _replays_to(store: state.StateReader, tp: TopicIdPartition, history: list[TopicMetadata]) -> bool:
    """Whether `history` (a partition's segment records) replays under Kafka's rules to what `store` answers for tp,
    its delete state aside."""
    replay = KafkaRulesReplay()
    for record in history:
        replay.apply(record)
    ours, theirs = partition_answers(store, tp), partition_answers(replay.store, tp)
    return {**ours, "delete_state": None} == {**theirs, "delete_state": None}


def _stand_ins(store: state.StateReader, tp: TopicIdPartition, history: list[TopicMetadata]
               ) -> Iterator[TopicMetadata]:
    replay = KafkaRulesReplay()
    for record in history:
        replay.apply(record)
    for lineage in store.lineages_of(tp):
        wanted = lineage.highest_log_offset
        reached = state.highest_offset_for_epoch(replay.store, tp, lineage.epoch)
        if wanted is not None and (reached is None or reached < wanted):
            segment = uuid.uuid5(_STAND_IN_NAMESPACE, f"{tp.topic_id}:{tp.partition}:{lineage.epoch}")
            stand_in = RemoteLogSegmentMetadata(
                RemoteLogSegmentId(tp, segment), wanted, wanted, -1, 0, 0, 0, {lineage.epoch: wanted}, None,
                S.DELETE_SEGMENT_FINISHED, True)
            yield from _lifecycle(stand_in)


def plan_export(store: state.InMemoryState) -> tuple[list[TopicMetadata], dict[TopicIdPartition, list[str]]]:
    """The export of every user partition of `store`, and, per partition whose replay under Kafka's rules would answer
    otherwise than `store`, how (then nothing may be written: see the module's docstring)."""
    partitions = sorted(store.user_partitions(), key=lambda tp: (tp.topic, tp.partition, tp.topic_id.int))
    history = [record for tp in partitions for record in partition_history(store, tp)]
    replay = KafkaRulesReplay()
    for record in history:
        replay.apply(record)
    return history, store_differences(store, replay.store, "tierlog", "TBRLMM after replay")


def _target(settings: Settings, args: argparse.Namespace) -> TopicDescription:
    """The target topic: created as TBRLMM creates its own when missing; refused when it holds any record."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    found = describe_topic(settings, args.target_topic)
    if found is None:
        admin = AdminClient(settings.kafka_client())
        config = {"cleanup.policy": "delete", "retention.ms": "-1", "min.insync.replicas": str(args.min_isr)}
        try:
            admin.create_topics([NewTopic(args.target_topic, args.partitions, args.replication_factor, config=config)],
                                request_timeout=settings.timeout_s)[args.target_topic].result(settings.timeout_s)
        except KafkaException as exc:
            raise CommandError(f"cannot create target topic {args.target_topic}: {exc}") from exc
        found = describe_topic(settings, args.target_topic)
        if found is None:
            raise CommandError(f"target topic {args.target_topic} was created but is not described yet; rerun")
        return found
    held = sum(end_offsets(settings, found).values())
    if held:
        raise CommandError(f"target topic {found.name} is not empty ({held} records, counting by end offsets); "
                           "export writes only into a fresh topic: delete it or pass --target-topic NAME",
                           EXIT_USAGE)
    return found


def _produce(settings: Settings, target: TopicDescription, history: list[TopicMetadata], show: bool | None) -> None:
    from confluent_kafka import KafkaError, Producer

    failures: list[str] = []

    def delivered(error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            failures.append(error.str())

    producer = Producer(settings.kafka_client(**{"acks": "all", "enable.idempotence": True, "linger.ms": 20,
                                                 "compression.type": "lz4"}))
    with ProgressBar(f"writing {target.name}", len(history), show) as bar:
        for i, record in enumerate(history):
            partition = metadata_partition(record.topic_id_partition, target.partitions)
            while True:
                try:
                    producer.produce(target.name, value=encode(record), partition=partition, on_delivery=delivered)
                    break
                except BufferError:
                    producer.poll(0.1)
            if i % 10_000 == 0:
                bar.update(i)
        left = producer.flush(settings.timeout_s)
        bar.finish(len(history))
    if left or failures:
        raise CommandError(f"writing {target.name} failed ({left} records undelivered; {failures[:3]}); delete the "
                           "topic and export again")


def cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    folded = fold_tierlog(settings, args.progress)
    history, differences = plan_export(folded)
    partitions = len(folded.user_partitions())
    result: dict[str, Any] = {
        "target_topic": args.target_topic, "partitions": partitions, "records": len(history),
        "differences": {str(tp): lines for tp, lines in differences.items()},
    }
    if not differences:
        target = _target(settings, args)
        _produce(settings, target, history, args.progress)
        result["target_partitions"] = target.partitions

    def human() -> None:
        if differences:
            print("nothing written: a replay of the export would answer differently from tierlog for these "
                  "partitions:")
            for tp, lines in differences.items():
                print(f"  {tp}:")
                for line in lines:
                    print(f"    {line}")
        else:
            print(f"wrote {len(history)} records for {partitions} user partitions to {args.target_topic}; "
                  f"check with `tierlog verify migration --source-topic {args.target_topic}`")

    emit(args, result, human)
    return EXIT_PROBLEM if differences else EXIT_OK


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """`tierlog export`'s arguments (registered by tierlog.cli.main)."""
    p = sub.add_parser("export", parents=[common],
                       help="write tierlog's metadata as Kafka's own records into a fresh __remote_log_metadata-style "
                            "topic (to go back to TopicBasedRemoteLogMetadataManager)")
    p.add_argument("--target-topic", default=DEFAULT_SOURCE_TOPIC,
                   help=f"the topic to write (default {DEFAULT_SOURCE_TOPIC}); refused unless missing or empty")
    p.add_argument("--partitions", type=int, default=TBRLMM_PARTITIONS,
                   help="partitions of a target topic export creates: the brokers' "
                        f"remote.log.metadata.topic.num.partitions (default {TBRLMM_PARTITIONS})")
    p.add_argument("--replication-factor", type=int, default=TBRLMM_REPLICATION_FACTOR,
                   help=f"replication factor of a target topic export creates (default {TBRLMM_REPLICATION_FACTOR})")
    p.add_argument("--min-isr", type=int, default=TBRLMM_MIN_ISR,
                   help=f"min.insync.replicas of a target topic export creates (default {TBRLMM_MIN_ISR})")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show progress bars (default: when stderr is a terminal)")
    p.set_defaults(run=cmd_export)
