"""The bucket against the metadata as it stands now, for `tierlog verify --against bucket` and `reconcile`.

The bucket is listed first, then the metadata topic's end offsets are read: every listed object's segment
was announced below them, so a metadata source that reached them knows every listed object.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlmm.types import TopicIdPartition
from tierlog.cli.common import EXIT_USAGE, CommandError, Settings, open_location, spark_session
from tierlog.cli.inspect import opened_view
from tierlog.cli.output import ProgressBar, human_bytes
from tierlog.pipeline.reconcile import (
    DEFAULT_GRACE_MS,
    SPARK_THRESHOLD_OBJECTS,
    LiveSegment,
    MetadataFreshness,
    ReconcileReport,
    ReconcileRules,
    TopicHoldings,
    deleting_partitions,
    list_bucket,
    live_segments_frame,
    live_segments_of,
    partition_deletes_of,
    partition_deletes_of_entries,
    reconcile_in_process,
    reconcile_on_spark,
)

if TYPE_CHECKING:
    from tierlog.pipeline.cluster_topics import ClusterTopics


@dataclass(frozen=True, slots=True)
class BucketCheck:
    bucket: str
    store: Any
    report: ReconcileReport
    freshness: MetadataFreshness
    # Topics the metadata holds live segments of that the cluster does not list: reported, never deleted.
    unlisted: tuple[TopicHoldings, ...] = ()
    # Partitions of the topics the operator confirmed deleted (--deleted-topic-id), as the metadata names them.
    confirmed_partitions: tuple[TopicIdPartition, ...] = ()

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
        pending = self.report.deletion_pending
        if pending:
            finishable = self.report.pending_to_finish
            lines.append(
                f"deletion pending: {len(pending)} segments ({human_bytes(sum(p['size'] for p in pending))}) in "
                "DELETE_SEGMENT_STARTED, not live (a failed copy's cleanup, or a deletion cut short); "
                + (f"{len(finishable)} of them are older than the grace period: `tierlog reconcile --delete` "
                   "deletes their objects and records DELETE_SEGMENT_FINISHED" if finishable
                   else "all within the grace period (a broker may be deleting them now)")
            )
        for topic in self.unlisted:
            lines.append(
                f"not listed by the cluster: {topic.topic} (id {topic.topic_id}): {topic.segments} segments, "
                f"{human_bytes(topic.bytes)}; kept (a listing is no proof of deletion: this principal may not see "
                f"it, or this is another cluster). If the topic was deleted, pass --deleted-topic-id "
                f"{topic.topic_id} to confirm"
            )
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
    archive: str | None = None, confirmed: frozenset[str] = frozenset(), deleting: bool = False,
) -> BucketCheck:
    """The bucket against a node's view (`state_dir`), the audit archive (`archive`), or else the metadata
    topic folded now. `confirmed`: topic ids the operator says are deleted, checked against the cluster (see
    cluster_topics.check_confirmed_deletions); `deleting`: a delete follows, so a view must belong to this
    cluster's metadata topic."""
    from tierlog.pipeline.cluster_topics import DeletionNotConfirmedError, check_confirmed_deletions

    bucket = settings.bucket_location(args.bucket)
    store = open_location(bucket, settings)
    objects, listed_at_ms = list_bucket(store)
    topic = settings.metadata_topic()
    ends = topic_reader.end_offsets(settings, topic)
    use_spark = bool(getattr(args, "spark", False)) or len(objects) > SPARK_THRESHOLD_OBJECTS
    live: list[LiveSegment] = []
    frame = None
    # The id of the metadata topic the source was built from; None: read from this cluster just now.
    recorded_topic_id: str | None = None
    if state_dir is not None:
        with opened_view(state_dir) as view:
            applied = view.applied_offsets(topic)
            live = [LiveSegment.of(md) for md in view.segments()]
            deletes = partition_deletes_of(view)
            source = view.source(topic)
        # A view always records its source once it applied a record (rlmm.manager); one without is unusable here.
        recorded_topic_id = "" if source is None else source[0]
        described = f"view {state_dir}"
    elif archive is not None:
        if confirmed:
            raise CommandError(
                "--deleted-topic-id needs metadata tied to this cluster: an archive records no metadata topic id; "
                "reconcile against the metadata topic (the default) or a node's --state-dir", EXIT_USAGE)
        from tierlog.cli.common import archive_errors
        from tierlog.pipeline.archive import end_offsets, read_archive
        from tierlog.pipeline.replay import compacted, fold_by_user_partition

        location = settings.archive_location(archive)
        spark = spark_session(settings, args, bucket, location)
        use_spark = True  # the archive is folded on Spark anyway
        with archive_errors():
            archived = read_archive(spark, location, topic)
            applied = end_offsets(archived)
        entries = fold_by_user_partition(compacted(archived))
        frame = live_segments_of(entries)
        deletes = partition_deletes_of_entries(entries)
        described = f"archive {location}"
    else:
        with ProgressBar("reading metadata topic", sum(ends.values())) as bar:
            folded = topic_reader.fold(settings, topic, ends, bar)
        live = [LiveSegment.of(md) for tp in folded.user_partitions() for md in folded.segments_of(tp)]
        deletes = partition_deletes_of(folded)
        applied = dict(ends)
        described = f"metadata topic {topic}"
    freshness = MetadataFreshness(described, applied, ends)
    cluster = _cluster_topics(settings)
    named = {s.topic_id: s.topic for s in live}
    named.update({str(md.topic_id_partition.topic_id): md.topic_id_partition.topic for md in deletes})
    try:
        if confirmed or (deleting and recorded_topic_id is not None):
            check_confirmed_deletions(cluster, topic, recorded_topic_id, confirmed, named)
    except DeletionNotConfirmedError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    rules = ReconcileRules(listed_at_ms, int(args.grace_minutes * 60_000), confirmed, deleting_partitions(deletes),
                           hashed_keys=args.hashed_keys)
    if use_spark:
        spark = spark_session(settings, args, bucket)
        if frame is None:
            frame = live_segments_frame(spark, live)
        report = reconcile_on_spark(spark, objects, frame, rules)
    else:
        report = reconcile_in_process(objects, live, rules)
    confirmed_partitions = {
        TopicIdPartition(uuid.UUID(topic_id), name, partition)
        for topic_id, name, partition in (
            *((s.topic_id, s.topic, s.partition) for s in live),
            *((str(md.topic_id_partition.topic_id), md.topic_id_partition.topic, md.topic_id_partition.partition)
              for md in deletes),
        ) if topic_id in confirmed
    }
    unlisted = tuple(t for t in report.live_topics if not cluster.lists(t.topic_id) and t.topic_id not in confirmed)
    return BucketCheck(bucket, store, report, freshness, unlisted,
                       tuple(sorted(confirmed_partitions, key=lambda tp: (tp.topic, tp.partition))))


def _cluster_topics(settings: Settings) -> ClusterTopics:
    from tierlog.pipeline.cluster_topics import ClusterUnavailableError, cluster_topics

    try:
        return cluster_topics(settings.kafka_client(), settings.timeout_s)
    except ClusterUnavailableError as exc:
        raise CommandError(f"{exc}; is the broker up? (raise --timeout to wait longer)") from exc
