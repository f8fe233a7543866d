"""The jobs over the audit archive and the bucket: `replay`, `reconcile`, `usage`, `snapshot`.

`replay` and `usage` run in this process on a small archive (no JVM), on Spark otherwise or when asked.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from tierlog.cli.common import (
    EXIT_OK,
    EXIT_PROBLEM,
    EXIT_USAGE,
    CommandError,
    Settings,
    archive_errors,
    spark_session,
)
from tierlog.cli.inspect import topic_states
from tierlog.cli.output import ProgressBar, emit, format_id, human_bytes, print_table


def _small_archive(args: argparse.Namespace, settings: Settings, location: str) -> Any:
    """The archive's store and files when the job should run in this process (a small archive and no
    --spark / --master), else None: Spark it is."""
    from tierlog.cli.common import open_location
    from tierlog.pipeline.replay import SMALL_ARCHIVE_BYTES, archive_files

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
    from tierlog.pipeline.replay import read_archive_datums

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


def cmd_reconcile(args: argparse.Namespace, settings: Settings) -> int:
    from tierlog.cli.bucket import TopicReader, check_bucket
    from tierlog.cli.verify import _end_offsets, fold_topic
    from tierlog.pipeline.reconcile import MetadataBehindError, delete_orphans_of, write_report

    if args.state_dir and args.archive:
        raise CommandError("pass --state-dir or --archive, not both: they are two metadata sources", EXIT_USAGE)
    checked = check_bucket(args, settings, TopicReader(_end_offsets, fold_topic),
                           state_dir=Path(args.state_dir) if args.state_dir else None, archive=args.archive)
    report, source, bucket = checked.report, checked.freshness.source, checked.bucket
    if args.delete:
        try:
            report = delete_orphans_of(report, checked.store, checked.freshness)
        except MetadataBehindError as exc:
            raise CommandError(str(exc), EXIT_PROBLEM) from exc
    paths = write_report(report, Path(args.report_dir)) if args.report_dir else None

    def human() -> None:
        print(f"metadata from {source}; bucket {bucket}")
        print_table([{"objects": report.objects, "live_segments": report.live_segments,
                      "orphans": len(report.orphans), "missing": len(report.missing),
                      "size_mismatches": len(report.size_mismatches), "too_young": len(report.too_young),
                      "deleted": len(report.deleted)}],
                    ["objects", "live_segments", "orphans", "missing", "size_mismatches", "too_young", "deleted"])
        for title, rows, columns in (
            ("orphans (the delete plan)", report.orphans, ["key", "size", "reason"]),
            ("missing objects", report.missing, ["key", "segment_id"]),
            ("size mismatches", report.size_mismatches, ["key", "size", "expected_size"]),
        ):
            if rows:
                print(f"\n{title}:")
                print_table(list(rows), columns)
        if checked.deleted_topics:
            print("\ntopics gone from the cluster: " + ", ".join(
                f"{name} ({topic_id})" for topic_id, name in checked.deleted_topics.items()))
        for line in checked.advice():
            print(f"\n{line}")
        if paths:
            print(f"\nreport: {paths[0]}\ndelete plan: {paths[1]}")
        if report.orphans and not args.delete:
            print("\norphans were NOT deleted; rerun with --delete to delete exactly the delete plan")

    payload = {**report.as_json(), "delete_plan": report.delete_plan(), "bucket": bucket, "source": source,
               "freshness": checked.freshness.as_json(), "deleted_topics": checked.deleted_topics,
               "advice": checked.advice()}
    emit(args, payload, human)
    return EXIT_OK if report.clean or (args.delete and not report.missing and not report.size_mismatches) \
        else EXIT_PROBLEM


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
    in_cluster = topic_states(settings)
    last: list[dict[str, Any]] = [{"topic": name, "remote_bytes": series[-1][1], "segments": series[-1][2],
                                   "topic_state": in_cluster(name)}
            for name, series in topic_totals(table).items()]

    def human() -> None:
        print_table([{**r, "remote": human_bytes(r["remote_bytes"])} for r in last],
                    ["topic", "topic_state", "remote", "segments"])
        print(f"\ntable: {csv_path}\nchart: {png_path}")

    emit(args, {"table": str(csv_path), "chart": str(png_path), "buckets": table.buckets,
                "latest_per_topic": last}, human)
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
