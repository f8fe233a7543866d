"""The bucket against the metadata as it stands now, for `tierlog verify --against bucket` and `reconcile`.

The bucket is listed first, then the metadata topic's end offsets are read: every listed object's segment
was announced below them, so a metadata source that reached them knows every listed object.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tierlog.cli.common import CommandError, Settings, open_location, spark_session
from tierlog.cli.inspect import opened_view
from tierlog.cli.output import ProgressBar
from tierlog.pipeline.reconcile import (
    DEFAULT_GRACE_MS,
    SPARK_THRESHOLD_OBJECTS,
    LiveSegment,
    MetadataFreshness,
    ReconcileReport,
    ReconcileRules,
    list_bucket,
    live_segments_frame,
    live_segments_of,
    reconcile_in_process,
    reconcile_on_spark,
    topic_names,
)


@dataclass(frozen=True, slots=True)
class BucketCheck:
    bucket: str
    store: Any
    report: ReconcileReport
    freshness: MetadataFreshness
    deleted_topics: dict[str, str]

    def advice(self) -> list[str]:
        """What each finding means, naming the side that is wrong."""
        lines = []
        if self.freshness.behind:
            lines.append(
                f"the metadata ({self.freshness.source}) is behind the topic by {self.freshness.describe_lag()}: "
                "the METADATA side is stale; let the node catch up or `tierlog rebuild` it, then check again "
                "(orphans listed now may be live segments)"
            )
        if self.report.missing:
            lines.append(
                f"{len(self.report.missing)} objects the metadata references are gone: the BUCKET lost data; "
                "rebuilding a view will not bring them back (restore them from bucket versioning or a backup; "
                "consumers fail at those offsets until then)"
            )
        if self.report.size_mismatches:
            lines.append(f"{len(self.report.size_mismatches)} .log objects differ in size from their segment: "
                         "the BUCKET holds a wrong object (overwritten or truncated)")
        if self.report.orphans:
            lines.append(f"{len(self.report.orphans)} objects older than the grace period are referenced by no "
                         "live segment: the bucket holds garbage; `tierlog reconcile --delete` removes them")
        return lines


def add_bucket_check_options(parser: argparse.ArgumentParser) -> None:
    """The options `verify bucket` and `reconcile` share."""
    parser.add_argument("--bucket", help="s3://BUCKET[/PREFIX] or a directory (default: the rsm config's)")
    parser.add_argument("--hashed-keys", action="store_true", help="objects use storage.hash.prefix=true")
    parser.add_argument(
        "--grace-minutes", type=_non_negative_minutes, default=DEFAULT_GRACE_MS / 60_000, metavar="MINUTES",
        help="objects younger than this are never orphans: their upload may still be under way "
             f"(default {DEFAULT_GRACE_MS // 60_000}; keep it above the longest upload)",
    )
    parser.add_argument("--spark", action="store_true",
                        help=f"run on Spark even below {SPARK_THRESHOLD_OBJECTS} objects")


def _non_negative_minutes(text: str) -> float:
    value = float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"--grace-minutes must be >= 0, got {text}")
    return value


@dataclass(frozen=True, slots=True)
class TopicReader:
    """How to read the metadata topic (tierlog.cli.verify's functions, passed in to keep imports one-way)."""

    end_offsets: Callable[[Settings, str], dict[int, int]]
    fold: Callable[[Settings, str, Mapping[int, int], ProgressBar | None], Any]


def check_bucket(
    args: argparse.Namespace, settings: Settings, topic_reader: TopicReader, state_dir: Path | None = None,
    archive: str | None = None,
) -> BucketCheck:
    """The bucket against a node's view (`state_dir`), the audit archive (`archive`), or else the metadata
    topic folded now."""
    from tierlog.pipeline.cluster_topics import ClusterUnavailableError, deleted_topic_ids

    bucket = settings.bucket_location(args.bucket)
    store = open_location(bucket, settings)
    objects, listed_at_ms = list_bucket(store)
    topic = settings.metadata_topic()
    ends = topic_reader.end_offsets(settings, topic)
    use_spark = bool(getattr(args, "spark", False)) or len(objects) > SPARK_THRESHOLD_OBJECTS
    live: list[LiveSegment] | None = None
    frame = None
    if state_dir is not None:
        with opened_view(state_dir) as view:
            applied = view.applied_offsets(topic)
            live = [LiveSegment.of(md) for md in view.segments()]
        described = f"view {state_dir}"
    elif archive is not None:
        from tierlog.cli.common import archive_errors
        from tierlog.pipeline.archive import end_offsets, read_archive
        from tierlog.pipeline.replay import compacted, fold_by_user_partition

        location = settings.archive_location(archive)
        spark = spark_session(settings, args, bucket, location)
        use_spark = True  # the archive is folded on Spark anyway
        with archive_errors():
            archived = read_archive(spark, location, topic)
            applied = end_offsets(archived)
        frame = live_segments_of(fold_by_user_partition(compacted(archived)))
        described = f"archive {location}"
    else:
        with ProgressBar("reading metadata topic", sum(ends.values())) as bar:
            folded = topic_reader.fold(settings, topic, ends, bar)
        live = [LiveSegment.of(md) for tp in folded.user_partitions() for md in folded.segments_of(tp)]
        applied = dict(ends)
        described = f"metadata topic {topic}"
    freshness = MetadataFreshness(described, applied, ends)
    named = topic_names(objects, live or [])
    try:
        deleted = deleted_topic_ids(settings.kafka_client(), named, settings.timeout_s)
    except ClusterUnavailableError as exc:
        raise CommandError(f"{exc}; is the broker up? (raise --timeout to wait longer)") from exc
    rules = ReconcileRules(listed_at_ms, int(args.grace_minutes * 60_000), frozenset(deleted),
                           hashed_keys=args.hashed_keys)
    if use_spark:
        spark = spark_session(settings, args, bucket)
        if frame is None:
            frame = live_segments_frame(spark, live or [])
        report = reconcile_on_spark(spark, objects, frame, rules)
    else:
        report = reconcile_in_process(objects, live or [], rules)
    return BucketCheck(bucket, store, report, freshness, {i: named[i] for i in sorted(deleted)})
