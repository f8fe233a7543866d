"""The jobs over the audit archive and the bucket: `replay`, `reconcile`, `usage`, `snapshot`.

`replay` and `usage` run in this process on a small archive (no JVM), on Spark otherwise or when asked.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tierlog.cli.common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CommandError,
    Settings,
    archive_errors,
    spark_session,
)
from tierlog.cli.inspect import topic_states
from tierlog.cli.output import ProgressBar, emit, format_id, human_bytes, print_table
from tierlog.pipeline.reconcile import DEFAULT_MAX_DELETE_SHARE, DeleteLimit

# check_delete_allowed has passed the plan before anything is deleted.
_NO_LIMIT = DeleteLimit(allow_large=True)


def _small_archive(args: argparse.Namespace, settings: Settings, location: str) -> Any:
    """The archive's store and files when the job should run in this process (a small archive and no
    --spark / --master), else None: Spark it is."""
    from tierlog.cli.common import open_location
    from tierlog.pipeline.archive_files import SMALL_ARCHIVE_BYTES, archive_files

    if args.spark or args.master:
        return None
    store = open_location(location, settings)
    with archive_errors():
        files = archive_files(store, settings.metadata_topic())
    size = sum(f.size for f in files)
    if size > SMALL_ARCHIVE_BYTES:
        print(f"the archive holds {human_bytes(size)}: running on Spark", file=sys.stderr)
        return None
    return store, files


def _read_small_archive(store: Any, files: list[Any]) -> list[dict[str, Any]]:
    from tierlog.pipeline.archive_files import read_archive_datums

    with ProgressBar("reading archive", sum(f.size for f in files)) as bar:
        datums = read_archive_datums(store, files, bar.update)
        bar.finish(sum(f.size for f in files))
    return datums


def cmd_replay(args: argparse.Namespace, settings: Settings) -> int:
    from tierlog.pipeline.replay import replay, replay_in_process

    location = settings.archive_location(args.archive)
    state_dir = Path(args.state_dir) if args.state_dir else None
    if state_dir is not None and not (state_dir / "view").is_dir():
        raise CommandError(f"no metadata view in state dir {state_dir}; pass a node's state.dir")
    small = _small_archive(args, settings, location)
    if small is not None:
        store, files = small
        with ProgressBar("reading archive", sum(f.size for f in files)) as bar:
            report = replay_in_process(store, settings.metadata_topic(), state_dir, progress=bar.update)
    else:
        with archive_errors(), ProgressBar("replaying on Spark", None):
            report = replay(spark_session(settings, args, location), location, settings.metadata_topic(), state_dir)

    def human() -> None:
        print_table([{
            "archived_records": report.archived_records, "replayed_records": report.replayed_records,
            "user_partitions": report.user_partitions, "archive_digest": report.archive_digest[:16],
            "view_digest": (report.view_digest or "")[:16] or None, "matches": report.matches,
        }], ["archived_records", "replayed_records", "user_partitions", "archive_digest", "view_digest",
             "matches"])
        if args.partitions:
            print("\nuser partitions of the replayed state:")
            print_table([{**p, "remote": human_bytes(p["remote_bytes"])} for p in payload["partitions"]],
                        ["topic", "partition", "segments", "remote"])
        if report.differences:
            print(f"\n{report.difference_count} differing entries; the first {len(report.differences)}:")
            print_table(payload["differences"],
                        ["topic_id", "partition", "family", "kind", "entry_key"])

    payload = report.as_json()
    for entry in (*payload["differences"], *payload["partitions"]):
        entry["topic_id"] = format_id(entry["topic_id"], args.uuid_format)
    emit(args, payload, human)
    return EXIT_PROBLEM if report.matches is False else EXIT_OK


def add_reconcile_options(parser: argparse.ArgumentParser) -> None:
    """What `reconcile` may delete, and the checks before it does."""
    parser.add_argument("--delete", action="store_true",
                        help="delete the delete plan: orphans, and the objects of segments whose deletion started "
                             "and never finished (then recorded DELETE_SEGMENT_FINISHED); refused while the metadata "
                             "source is behind, or when the plan is more than --max-delete-share of the live bytes")
    parser.add_argument("--deleted-topic-id", action="append", default=[], metavar="ID",
                        help="a topic deleted from the cluster whose metadata lingers (repeatable; Kafka or hex "
                             "form): with --delete its objects go and its partitions get Kafka's partition-delete "
                             "records. Checked: the metadata names it, the cluster does not list it, and the cluster "
                             "is the one the metadata belongs to. A topic merely missing from a listing is never "
                             "deleted")
    parser.add_argument("--max-delete-share", type=_percent, default=DEFAULT_MAX_DELETE_SHARE * 100,
                        metavar="PERCENT",
                        help="refuse a plan removing more than this share of the bytes the metadata holds live "
                             f"(default {DEFAULT_MAX_DELETE_SHARE * 100:g})")
    parser.add_argument("--allow-large-delete", action="store_true",
                        help="delete a plan above --max-delete-share (check it first with --report-dir)")


def _percent(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentage, got {text!r}") from None
    if not 0 <= value <= 100:
        raise argparse.ArgumentTypeError(f"expected a percentage between 0 and 100, got {text!r}")
    return value


def _topic_ids(given: list[str]) -> frozenset[str]:
    from rlmm.errors import InvalidArgumentError
    from rlmm.types import parse_uuid

    try:
        return frozenset(str(parse_uuid(text)) for text in given)
    except InvalidArgumentError as exc:
        raise CommandError(f"--deleted-topic-id: {exc}", EXIT_USAGE) from exc


def cmd_reconcile(args: argparse.Namespace, settings: Settings) -> int:
    from tierlog.cli.bucket import TopicReader, check_bucket
    from tierlog.cli.verify import _end_offsets, fold_topic
    from tierlog.pipeline.reconcile import (
        DeleteLimit,
        LargeDeleteError,
        MetadataBehindError,
        check_delete_allowed,
        write_report,
    )

    if args.state_dir and args.archive:
        raise CommandError("pass --state-dir or --archive, not both: they are two metadata sources", EXIT_USAGE)
    confirmed = _topic_ids(args.deleted_topic_id)
    checked = check_bucket(args, settings, TopicReader(_end_offsets, fold_topic),
                           state_dir=Path(args.state_dir) if args.state_dir else None, archive=args.archive,
                           confirmed=confirmed, deleting=args.delete)
    report, source, bucket = checked.report, checked.freshness.source, checked.bucket
    if args.delete:
        try:
            check_delete_allowed(report, checked.freshness, DeleteLimit(args.max_delete_share / 100,
                                                                        args.allow_large_delete))
        except (MetadataBehindError, LargeDeleteError) as exc:
            if args.report_dir:
                write_report(report, Path(args.report_dir))
            raise CommandError(str(exc), EXIT_PROBLEM) from exc
        report = _execute(settings, checked)
    paths = write_report(report, Path(args.report_dir)) if args.report_dir else None

    def human() -> None:
        print(f"metadata from {source}; bucket {bucket}")
        print_table([{"objects": report.objects, "live_segments": report.live_segments,
                      "live": human_bytes(report.live_bytes), "deletion_pending": len(report.deletion_pending),
                      "orphans": len(report.orphans), "missing": len(report.missing),
                      "size_mismatches": len(report.size_mismatches), "too_young": len(report.too_young),
                      "deleted": len(report.deleted), "finished": len(report.finished)}],
                    ["objects", "live_segments", "live", "deletion_pending", "orphans", "missing", "size_mismatches",
                     "too_young", "deleted", "finished"])
        for title, rows, columns in (
            ("orphans (the delete plan)", report.orphans, ["key", "size", "reason"]),
            ("deletion pending (DELETE_SEGMENT_STARTED)", report.deletion_pending,
             ["topic", "partition", "segment_id", "size", "age_s", "finishable"]),
            ("missing objects", report.missing, ["key", "segment_id"]),
            ("size mismatches", report.size_mismatches, ["key", "size", "expected_size"]),
        ):
            if rows:
                print(f"\n{title}:")
                print_table(list(rows), columns)
        for line in checked.advice():
            print(f"\n{line}")
        if paths:
            print(f"\nreport: {paths[0]}\ndelete plan: {paths[1]}")
        if report.delete_plan() and not args.delete:
            print(f"\nnothing was deleted; rerun with --delete to delete exactly the delete plan "
                  f"({human_bytes(report.plan_bytes)})")

    payload = {**report.as_json(), "delete_plan": report.delete_plan(), "bucket": bucket, "source": source,
               "freshness": checked.freshness.as_json(),
               "unlisted_topics": [dataclasses.asdict(t) for t in checked.unlisted],
               "confirmed_deleted_partitions": [str(tp) for tp in checked.confirmed_partitions],
               "advice": checked.advice()}
    emit(args, payload, human)
    settled = not report.missing and not report.size_mismatches and not checked.unlisted
    return EXIT_OK if settled and (report.clean or args.delete) else EXIT_PROBLEM


def _execute(settings: Settings, checked: Any) -> Any:
    """Carry out an allowed delete plan. Writes to the metadata (DELETE_SEGMENT_FINISHED for pending deletions,
    Kafka's partition-delete records for confirmed deleted topics) go through a manager on a scratch state dir,
    caught up with the topic first, so each is checked against the whole metadata as a broker's would be."""
    from tierlog.cli.verify import caught_up_node
    from tierlog.pipeline.reconcile import delete_orphans_of, finish_pending_deletions

    report, store = checked.report, checked.store
    if not report.pending_to_finish and not checked.confirmed_partitions:
        return delete_orphans_of(report, store, checked.freshness, _NO_LIMIT)
    with tempfile.TemporaryDirectory(prefix="tierlog-reconcile-") as scratch, \
            caught_up_node(settings, Path(scratch), "reading the metadata to write to it", None,
                           writes=True) as (manager, _):
        _advance_partition_deletes(manager, checked.confirmed_partitions, "DELETE_PARTITION_STARTED", settings)
        report = delete_orphans_of(report, store, checked.freshness, _NO_LIMIT)
        report = finish_pending_deletions(report, store, manager.update_remote_log_segment_metadata,
                                          manager.broker_id, settings.timeout_s)
        _advance_partition_deletes(manager, checked.confirmed_partitions, "DELETE_PARTITION_FINISHED", settings)
    return report


def _advance_partition_deletes(manager: Any, partitions: Any, target: str, settings: Settings) -> None:
    """Move each partition's delete state through Kafka's sequence (MARKED, STARTED, FINISHED) up to `target`."""
    from rlmm.types import RemotePartitionDeleteMetadata, RemotePartitionDeleteState

    order = list(RemotePartitionDeleteState)
    for tp in partitions:
        current = manager.view.partition_delete(tp)
        start = 0 if current is None else order.index(current.state) + 1
        for state in order[start:order.index(RemotePartitionDeleteState[target]) + 1]:
            manager.put_remote_partition_delete_metadata(RemotePartitionDeleteMetadata(
                tp, state, int(time.time() * 1000), manager.broker_id)).result(settings.timeout_s)


def cmd_usage(args: argparse.Namespace, settings: Settings) -> int:
    from tierlog.pipeline.usage import UsageTable, topic_totals, usage_in_process, usage_over_time, write_usage

    location = settings.archive_location(args.archive)
    topic, bucket_ms = settings.metadata_topic(), args.bucket_minutes * 60_000
    small = _small_archive(args, settings, location)
    table: UsageTable
    if small is not None:
        table = usage_in_process(_read_small_archive(*small), topic, bucket_ms=bucket_ms)
    else:
        with archive_errors(), ProgressBar("usage on Spark", None):
            table = usage_over_time(spark_session(settings, args, location), location, topic,
                                    bucket_ms=bucket_ms).collected()
    csv_path, png_path = write_usage(table, Path(args.out))
    in_cluster, unreachable = topic_states(settings)
    last: list[dict[str, Any]] = [{"topic": name, "remote_bytes": series[-1][1], "segments": series[-1][2],
                                   "topic_state": in_cluster(name)}
            for name, series in topic_totals(table).items()]

    def human() -> None:
        print_table([{**r, "remote": human_bytes(r["remote_bytes"])} for r in last],
                    ["topic", "topic_state", "remote", "segments"])
        print(f"\ntable: {csv_path}\nchart: {png_path}")

    emit(args, {"table": str(csv_path), "chart": str(png_path), "buckets": table.buckets,
                "latest_per_topic": last}, human)
    if unreachable is not None:
        raise CommandError(unreachable, EXIT_UNAVAILABLE)
    return EXIT_OK


def _topic_now(settings: Settings, topic: str) -> tuple[str | None, dict[int, int] | None, int]:
    """The metadata topic's id, which the snapshot names so `tierlog rebuild --snapshot` trusts it, its end offsets
    and when they were asked (before the archive is read); (None, None, ...) with a warning when Kafka cannot
    say."""
    from rlmm.errors import RemoteStorageError
    from tierlog.audit.snapshots import metadata_topic_now

    asked_ms = int(time.time() * 1000)
    try:
        topic_id, ends = metadata_topic_now(settings.kafka_client(), topic, settings.timeout_s)
        return topic_id, ends, asked_ms
    except (CommandError, RemoteStorageError) as exc:
        print(f"the snapshot names no topic id ({exc}); `tierlog rebuild --snapshot` will rebuild from the topic "
              "instead of trusting it", file=sys.stderr)
        return None, None, asked_ms


def cmd_snapshot(args: argparse.Namespace, settings: Settings) -> int:
    from tierlog.pipeline.snapshot import build_snapshot

    location = settings.archive_location(args.archive)
    with archive_errors(), ProgressBar("building the snapshot on Spark", None):
        spark = spark_session(settings, args, location)
        topic_id, topic_ends, asked_ms = _topic_now(settings, settings.metadata_topic())
        summary = build_snapshot(spark, location, settings.metadata_topic(), Path(args.out), topic_id, topic_ends,
                                 asked_ms)
    payload = {"path": summary.path, "records": summary.records, "archived_records": summary.archived_records,
               "end_offsets": {str(k): v for k, v in summary.end_offsets.items()}}
    emit(args, payload, lambda: print(
        f"wrote {summary.path}: {summary.records} records (of {summary.archived_records} archived); "
        f"load it with `tierlog rebuild --snapshot {summary.path} --state-dir DIR`"))
    return EXIT_OK
